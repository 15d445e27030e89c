"""The files of a MetaSchedule JSON database, checked line by line before TVM reads them.

TVM's reader trusts the files: a record naming a workload past the end of the workload file, or a
decision for an instruction its trace does not have, is followed into other memory and crashes
the process; a workload whose stated length is huge is allocated.  Databases are shared, so each
line is checked here for the shape TVM writes, and a malformed one is named in one line: file,
line number, what is wrong (a record's trace and arguments: ``trace_checks``).  A workload's IR
graph is checked for references that loop back or nest deeper than TVM's reader can recurse
(``compat.json_graph_problem``); what else the graph holds is TVM's to check, and a crafted
graph that TVM accepts may still crash it later.
"""

from __future__ import annotations

import json
from pathlib import Path

from tensortune.errors import RecordsError, shown
from tensortune.records.schema import positive_seconds
from tensortune.records.trace_checks import args_info_problem, trace_problem
from tensortune.workloads.sources import workload_entry_problem

WORKLOADS, RECORDS = "database_workload.json", "database_tuning_record.json"


class _Malformed(Exception):
    """What is wrong with one line."""


def check_database(directory: str | Path) -> None:
    """Raise a ``RecordsError`` naming the first malformed line (callers say which of their
    parameters named the directory: ``errors.about``)."""
    src = Path(directory)
    missing = [f for f in (WORKLOADS, RECORDS) if not (src / f).is_file()]
    if missing:
        raise RecordsError(f"{src} is not a MetaSchedule database (missing {', '.join(missing)})")
    try:
        workloads = _check_lines(src / WORKLOADS, _check_workload, None)
        _check_lines(src / RECORDS, _check_record, workloads)
    except _Malformed as e:
        raise RecordsError(f"cannot read MetaSchedule database {src}: {e}") from None


def file_lines(path: Path) -> list[str]:
    """The lines of a database file as TVM reads them: split at "\\n" only, every one kept (an
    empty line too: it reads as null, and a null record crashes TVM)."""
    lines = path.read_text().split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines


def read_in_order(directory: str | Path) -> list:
    """A checked database's tuning records in the order of its record file, which is the order
    they were measured in.  TVM's ``JSONDatabase`` returns them sorted fastest first, which a
    reader of "the first K measured" must not see."""
    from tensortune.compat import ms

    src = Path(directory)
    workloads = [ms.database.Workload.from_json(json.loads(line))
                 for line in file_lines(src / WORKLOADS)]  # fmt: skip
    records = []
    for line in file_lines(src / RECORDS):
        index, record = json.loads(line)
        records.append(ms.database.TuningRecord.from_json(record, workloads[index]))
    return records


def _check_lines(path: Path, check, workloads: int | None) -> int:
    """Check each line of ``path``; returns how many there are."""
    try:
        lines = file_lines(path)
    except (OSError, UnicodeDecodeError) as e:
        raise _Malformed(f"{path.name}: {e}") from None
    for lineno, line in enumerate(lines, 1):
        try:
            try:
                entry = json.loads(line)
            except (ValueError, RecursionError):
                raise _Malformed("not JSON" if line.strip() else "an empty line") from None
            check(entry, workloads)
        except _Malformed as e:
            raise _Malformed(f"{path.name}:{lineno}: {e}") from None
    return len(lines)


def _check_workload(entry: object, _: object) -> None:
    problem = workload_entry_problem(entry)
    if problem:
        raise _Malformed(problem)


def _check_record(entry: object, workloads: int | None) -> None:
    """``[workload index, [trace, run_secs, target, args_info]]``."""
    if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list)):
        raise _Malformed("a record is [workload index, [trace, run_secs, target, args_info]]")
    index, record = entry
    assert workloads is not None
    if type(index) is not int or not 0 <= index < workloads:
        raise _Malformed(f"workload index {shown(index)} is not one of the {workloads} workloads")
    if len(record) != 4:
        raise _Malformed("a record is [workload index, [trace, run_secs, target, args_info]]")
    trace, run_secs, target, args_info = record
    problem = trace_problem(trace)
    if problem:
        raise _Malformed(problem)
    if run_secs is not None and not (
        isinstance(run_secs, list) and all(type(s) in (int, float) for s in run_secs)
    ):  # a null among them crashes TVM
        raise _Malformed("run_secs is not a list of numbers")
    if run_secs and not positive_seconds(run_secs):
        # Kept, a zero, negative or NaN time would rank as the fastest schedule of its task.
        raise _Malformed("run_secs holds a time that is not a positive finite number")
    if not (isinstance(target, dict) and type(target.get("kind")) is str):
        raise _Malformed("the target is not an object with a kind")
    problem = args_info_problem(args_info)
    if problem:
        raise _Malformed(problem)
