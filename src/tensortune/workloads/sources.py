"""Turn what the user names (operator specs, TVMScript files, MetaSchedule databases) into tasks."""

from __future__ import annotations

import base64
import binascii
import json
import runpy
import struct
from pathlib import Path

from tensortune.errors import WorkloadError, last_line
from tensortune.workloads.ops import check_arguments, parse_spec
from tensortune.workloads.task import Task


def names_tvmscript(spec: str) -> bool:
    """Whether a workload the user named is a TVMScript file rather than an operator spec."""
    return spec.endswith(".py") or Path(spec).is_file()


def task_from_spec(spec: str) -> Task:
    """A task for ``op:shape`` or for a TVMScript ``.py`` file holding one PrimFunc or IRModule."""
    if names_tvmscript(spec):
        return _task_from_tvmscript(Path(spec))
    op = parse_spec(spec)
    mod = op.to_module()
    _check_intermediates(mod, spec)
    return Task(name=str(op), mod=mod, weight=1, flop=op.flop, source=str(op))


def _check_intermediates(mod, spec: str) -> None:
    """Refuse an operator whose intermediate buffers (a padded input) outgrow TVM's 32-bit
    indices, as its arguments' sizes already are."""
    from tensortune.compat import sblocks, task_func
    from tensortune.workloads.ops import INT32_MAX

    for block in sblocks(task_func(mod).body):
        for buf in block.alloc_buffers:
            size = 1
            for d in buf.shape:
                size *= int(d)
            if size > INT32_MAX:
                raise WorkloadError(f"'{spec}': its {buf.name} buffer would hold {size:,} "
                                    f"elements, over TVM's {INT32_MAX:,} (int32)")  # fmt: skip


def _task_from_tvmscript(path: Path) -> Task:
    from tensortune.compat import tvm

    if not path.is_file():
        raise WorkloadError(f"workload file not found: {path}")
    # A TVMScript file is Python, and is run; any other file is not run (runpy would run the
    # __main__.py of a zip, such as a compiled artifact given here by mistake).
    if path.suffix != ".py":
        raise WorkloadError(f"{path} is not a TVMScript .py file (a model file goes to --model, "
                            "a MetaSchedule database to --workloads-from)")  # fmt: skip
    try:
        namespace = runpy.run_path(str(path), run_name="__tensortune_workload__")
    except SystemExit as e:  # a script's own argument parsing, or a sys.exit() at top level
        raise WorkloadError(f"cannot read TVMScript file {path}: it called sys.exit({e.code!r})"
                            ) from None  # fmt: skip
    except Exception as e:
        raise WorkloadError(f"cannot read TVMScript file {path}: {last_line(e)}") from None
    found = [
        (name, value)
        for name, value in namespace.items()
        if isinstance(value, tvm.IRModule | tvm.tirx.PrimFunc) and not name.startswith("_")
    ]
    if len(found) != 1:
        names = ", ".join(n for n, _ in found) or "none"
        raise WorkloadError(
            f"{path} must define exactly one PrimFunc or IRModule at top level (found: {names})"
        )
    name, value = found[0]
    mod = _with_main(
        value if isinstance(value, tvm.IRModule) else tvm.IRModule({name: value}), path
    )
    check_arguments(mod, str(path))
    _check_schedulable(mod, path)
    return Task(name=f"{path.stem}.{name}", mod=mod, flop=estimate_flop(mod), source=str(path))


def _check_schedulable(mod, path: Path) -> None:
    """Refuse, when the file is read, a PrimFunc that a run could only fail on: a scalar
    parameter (MetaSchedule makes arguments for buffers only: the run crashed), or no
    blocks (TVMScript written without ``s_tir=True``: every search broke on it)."""
    from tensortune.compat import tvm

    func = mod["main"]
    scalars = [p.name for p in func.params if getattr(p.ty, "shape", None) is None]
    if scalars:
        raise WorkloadError(f"{path}: parameter {scalars[0]} is a scalar; a workload to tune "
                            "takes buffers only (pass it as a buffer of shape (1,))")  # fmt: skip
    try:
        tvm.s_tir.Schedule(mod).get_sblock("root")
    except Exception:  # TVM's ScheduleError
        raise WorkloadError(f"{path}: the PrimFunc has no blocks to schedule; write it with "
                            "@T.prim_func(s_tir=True) and T.sblock (examples/ has one)"
                            ) from None  # fmt: skip


def _with_main(mod, path: Path):
    from tensortune.compat import tvm

    funcs = [(gv, f) for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    if len(funcs) != 1:
        raise WorkloadError(f"{path}: the IRModule must hold exactly one PrimFunc to tune")
    gv, func = funcs[0]
    if gv.name_hint == "main" and func.attrs.get("global_symbol", "main") == "main":
        return mod
    # Named like every other workload, so equal computations share records.
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


# Workload names that ``records export`` writes beside a MetaSchedule database (TVM ignores the
# file): {"names": {structural hash: name}}.
NAMES_FILE = "tensortune-workload-names.json"


def workload_names(directory: str | Path) -> dict[str, str]:
    """The names written beside a MetaSchedule database (structural hash → name); none when
    there is no such file or it cannot be read (nested past the parser's depth too)."""
    try:
        names = json.loads((Path(directory) / NAMES_FILE).read_text()).get("names", {})
    except (OSError, ValueError, AttributeError, RecursionError):
        return {}
    return {str(k): str(v) for k, v in names.items()} if isinstance(names, dict) else {}


def workload_entry_problem(entry: object) -> str | None:
    """Why a line of a MetaSchedule database's workload file cannot be handed to TVM, or None.
    A line is ``[structural hash, base64 of (8-byte length, TVM's JSON graph of the module)]``;
    TVM allocates the stated length before reading, and follows the graph's references."""
    from tensortune.compat import json_graph_problem

    if not (isinstance(entry, list) and len(entry) == 2 and all(type(x) is str for x in entry)):
        return "a workload is [structural hash, base64 text]"
    try:
        blob = base64.b64decode(entry[1], validate=True)
    except (binascii.Error, ValueError):
        return "the workload is not base64"
    if len(blob) < 8 or struct.unpack("<Q", blob[:8])[0] != len(blob) - 8:
        return "the workload's stated length does not match its bytes"
    try:
        graph = json.loads(blob[8:])
    except (ValueError, RecursionError):
        return "the workload is not TVM's JSON graph of a module"
    problem = json_graph_problem(graph)
    return f"the workload's module graph: {problem}" if problem else None


def tasks_from_database(directory: str | Path) -> list[Task]:
    """Every workload of a MetaSchedule JSON database directory, as a task (named as the export
    that wrote it named it, else ``DIRNAME.wN``)."""
    from tensortune.compat import ms

    path = Path(directory) / "database_workload.json"
    if not path.is_file():
        raise WorkloadError(f"{directory} is not a MetaSchedule database: no {path.name}")
    names = workload_names(directory)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise WorkloadError(f"cannot read {path}: {last_line(e)}") from None
    tasks = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            entry = None
        problem = workload_entry_problem(entry) if entry is not None else "not JSON"
        if problem:
            raise WorkloadError(f"{path}:{lineno}: unreadable workload: {problem}")
        try:
            workload = ms.database.Workload.from_json(entry)
        except Exception as e:
            raise WorkloadError(f"{path}:{lineno}: unreadable workload: {last_line(e)}") from None
        # written by any tuner: a dynamic model's symbolic shapes, sizes nothing can allocate
        check_arguments(workload.mod, f"{path}:{lineno}")
        default = f"{Path(directory).name}.w{len(tasks)}"
        tasks.append(
            Task(
                name=names.get(str(entry[0]), default),
                mod=workload.mod,
                flop=estimate_flop(workload.mod),
                source=str(directory),
            )
        )
    if not tasks:
        raise WorkloadError(f"{path} holds no workloads")
    return tasks


def workload_flop(name: str, mod) -> float:
    """The FLOPs of a stored workload: its operator spec's formula when its name is one (TVM's
    estimate would also count the polynomial that fast math put in place of ``exp``), else
    TVM's estimate."""
    try:
        return parse_spec(name).flop
    except WorkloadError:
        return estimate_flop(mod)


def estimate_flop(mod) -> float:
    """TVM's static FLOP estimate of a TIR module (0.0 when it cannot tell)."""
    from tensortune.compat import tvm

    try:
        return float(tvm.s_tir.analysis.estimate_tir_flops(mod))
    except Exception:
        return 0.0
