"""Conversions between MetaSchedule's objects and our records."""

from __future__ import annotations

import json
import time

from tensortune.compat import TVM_VERSION, ArgInfo, MeasureCandidate, TuningRecord, Workload, tvm
from tensortune.errors import RecordsError
from tensortune.measure.status import FAILED_COST, Status, classify
from tensortune.records.schema import Record, positive_seconds
from tensortune.records.trace_checks import args_info_problem, parsed, trace_problem


def to_plain(value: object) -> object:
    """MetaSchedule JSON (which may hold IntImm/FloatImm/containers) → plain Python for json."""
    if isinstance(value, tvm.tirx.IntImm | tvm.tirx.FloatImm):
        return value.value
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if hasattr(value, "items"):
        return {str(k): to_plain(v) for k, v in value.items()}
    if hasattr(value, "__iter__"):
        return [to_plain(v) for v in value]
    return value


def trace_text(trace) -> str:
    return json.dumps(to_plain(trace.as_json(remove_postproc=False)))


def replay_trace(trace: list | str, sch: object) -> None:
    """A stored trace (JSON, or its text) applied to the schedule ``sch``: the one door through
    which a trace from a shared file reaches TVM's reader, checked first (``trace_checks``: a
    null that TVM would read through kills the process).  Raises ``ValueError`` for a damaged
    trace, and whatever TVM raises for one that does not fit the schedule's module."""
    try:  # text that is not JSON raises json's own error, which names what is wrong
        trace = json.loads(trace) if isinstance(trace, str) else trace
    except RecursionError:
        raise ValueError("the trace nests too deep") from None
    problem = trace_problem(trace)
    if problem:
        raise ValueError(problem)
    tvm.s_tir.Trace.apply_json_to_schedule(trace, sch)


def candidate_from_trace(mod, trace: list | str) -> MeasureCandidate:
    """A stored trace (JSON, or its text) replayed on ``mod``, ready to build, run or featurize.

    Raises whatever the replay raises when the trace does not fit the module (``replay_trace``)."""
    sch = tvm.s_tir.Schedule(mod)
    replay_trace(trace, sch)
    return MeasureCandidate(sch, ArgInfo.from_entry_func(sch.mod, remove_preproc=True))


def args_info_text(args_info) -> str:
    return json.dumps([to_plain(a.as_json()) for a in args_info])


def renamed_blocks(trace: list, names: dict[str, str]) -> list:
    """A trace's JSON with the blocks it fetches by name renamed (``names``: old → new).

    Blocks the schedule itself made are named after the block they came from (``rfactor``
    makes ``lv35_sum_rf`` of ``lv35_sum``): they follow their origin's new name."""
    origins = sorted(names, key=len, reverse=True)  # the longest origin a name starts with

    def rename(name: str) -> str:
        if name in names:
            return names[name]
        origin = next((o for o in origins if name.startswith(o + "_")), None)
        return name if origin is None else names[origin] + name[len(origin) :]

    insts, decisions = trace
    renamed = [[kind, inputs, [rename(attrs[0]), *attrs[1:]], outputs]
               if kind == "GetSBlock" else [kind, inputs, attrs, outputs]
               for kind, inputs, attrs, outputs in insts]  # fmt: skip
    return [renamed, decisions]


def block_renames(stored: list[str], asked: list[str]) -> dict[str, str] | None:
    """How to rename the blocks of traces recorded on a module whose blocks are ``stored``
    (``compat.block_names``) to replay them on a structurally equal one whose blocks are
    ``asked``; ``None`` when nothing needs renaming.

    Structural equality ignores block names, and TOPI names some after the graph variable
    they read (``lv35_sum``): the same layer norm cut from another graph of the same model
    finds the records tuned on the first, whose traces fetch blocks by the first's names.
    Blocks pair up in program order."""
    differ = stored != asked and len(stored) == len(asked)
    return dict(zip(stored, asked, strict=True)) if differ else None


def to_tuning_record(record: Record, workload: Workload,
                     names: dict[str, str] | None = None) -> TuningRecord:  # fmt: skip
    """``record`` as MetaSchedule's record of ``workload``; ``names`` renames its blocks
    (``renamed_blocks``) for a workload that names them differently from the record's."""
    trace, args_info = parsed(record.trace), parsed(record.args_info)
    problem = trace_problem(trace) or args_info_problem(args_info)
    if problem:  # TVM's reader would follow a null into memory that is not there
        raise RecordsError(f"record {record.id} is damaged: {problem}")
    payload = [
        renamed_blocks(trace, names) if names else trace,
        list(record.run_secs) if record.ok else [FAILED_COST],
        json.loads(record.target),
        args_info,
    ]
    return TuningRecord.from_json(payload, workload)


def measured_records(
    candidates, builder_results, runner_results, *, workload_id: int, hardware_id: str,
    target: str, run_id: str,
) -> list[Record]:  # fmt: skip
    """One record per measured candidate, with its status and error message."""
    now = time.time()
    records = []
    for cand, built, ran in zip(candidates, builder_results, runner_results, strict=True):
        status = classify(built.error_msg, ran.error_msg)
        secs = tuple(float(s) for s in ran.run_secs or []) if status is Status.OK else ()
        error = None if status is Status.OK else (built.error_msg or ran.error_msg)
        if status is Status.OK and not positive_seconds(secs):
            status, secs, error = Status.RUN_ERROR, (), f"the timer returned {list(secs)!r:.80}"
        records.append(
            Record(
                workload_id=workload_id,
                hardware_id=hardware_id,
                target=target,
                trace=trace_text(cand.sch.trace),
                args_info=args_info_text(cand.args_info),
                run_secs=secs,
                status=status.value,
                error=error,
                run_id=run_id,
                tvm_version=TVM_VERSION,
                created_at=now,
            )
        )
    return records
