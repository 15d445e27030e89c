"""From what a user names (operator specs, TVMScript files, a model, a MetaSchedule database) to
the list of tasks a flow works on."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from tensortune.errors import TensortuneError, about, check_flags
from tensortune.workloads.task import Task

if TYPE_CHECKING:
    from tensortune.hardware import Platform


def resolve_tasks(
    workloads: Sequence[str | Task] | None = None,
    *,
    model: object | None = None,
    workloads_from: str | os.PathLike | None = None,
    platform: Platform,
    fast_math: bool = True,
    winograd: bool = True,
    input_shapes: dict[str, list[int]] | None = None,
) -> list[Task]:
    """The tasks of operator specs / TVMScript files, of a model (a zoo name, an ``.onnx``
    path or a loaded ``Model``), or of a MetaSchedule database directory: exactly one of them.
    A model is cut into tasks for ``platform``'s target; ``input_shapes`` fixes an ONNX
    model's dynamic input dimensions (``{"input": [1, 3, 224, 224]}``).

    With ``fast_math`` (the default), float32 ``exp``/``tanh``/``erf`` are approximated so they
    vectorize (``workloads.fast_math``; a model gets it on its graph, ``models.load_model``),
    and each changed task keeps its exact module to check outputs against. ``winograd``
    applies to a model (``models.load_model``). A loaded ``Model`` keeps what it was loaded
    with."""
    check_flags(fast_math=fast_math, winograd=winograd)
    workloads = check_sources(workloads, model=model, workloads_from=workloads_from,
                              input_shapes=input_shapes)  # fmt: skip
    if model is not None:
        from tensortune.workloads.models import Model, load_model

        if isinstance(model, Model):
            return model.tasks
        with about("model"):
            return load_model(model, target=platform.tvm_target, fast_math=fast_math,
                              winograd=winograd, input_shapes=input_shapes).tasks  # fmt: skip
    if workloads:
        from tensortune.workloads.sources import task_from_spec

        with about("workloads"):
            tasks = [w if isinstance(w, Task) else task_from_spec(w) for w in workloads]
    else:
        from tensortune.workloads.sources import tasks_from_database

        with about("workloads_from"):
            tasks = tasks_from_database(workloads_from)  # type: ignore[arg-type]
    if fast_math:
        from tensortune.workloads.fast_math import with_fast_math

        tasks = [with_fast_math(t) for t in tasks]
    # After fast math: an exact module and its approximated twin (a database's workloads
    # tuned with and without it) are then one workload.
    return _distinct(tasks)


def check_sources(
    workloads: Sequence[str | Task] | None = None,
    *,
    model: object | None = None,
    workloads_from: str | os.PathLike | None = None,
    input_shapes: dict[str, list[int]] | None = None,
) -> list[str | Task] | None:
    """Refuse what can be refused before TVM and torch are imported (seconds of a command's
    start): not exactly one source, an operator spec that does not parse, a name that is
    neither a file nor a zoo network, input shapes for what has fixed shapes.  Returns
    ``workloads`` as a list, path objects as text."""
    if isinstance(workloads, str | os.PathLike):  # one spec, not a sequence of one-letter ones
        workloads = [workloads]
    if workloads is not None:  # a TVMScript file given as a path object
        items = list(workloads) if isinstance(workloads, Iterable) else None
        if items is None or not all(isinstance(w, str | os.PathLike | Task) for w in items):
            raise TensortuneError(f"operator specs, TVMScript files or tasks, not "
                                  f"{workloads!r:.60}", param="workloads")  # fmt: skip
        workloads = [os.fspath(w) if isinstance(w, os.PathLike) else w for w in items]
    sources = (("workloads", workloads), ("model", model), ("workloads_from", workloads_from))
    given = [name for name, x in sources if x is not None and x != []]
    if len(given) != 1:
        raise TensortuneError("give exactly one of: workloads, a model, or a workloads directory",
                              param=given[1] if len(given) > 1 else "workloads")  # fmt: skip
    if isinstance(model, str | os.PathLike):
        from tensortune.workloads.networks import check_source

        with about("model"):
            check_source(model)
    elif model is None and input_shapes:  # operators and databases have their shapes
        what = "operators" if given[0] == "workloads" else "database's workloads"
        raise TensortuneError(f"input shapes fix an ONNX model's dynamic dimensions; the "
                              f"{what} have fixed shapes", param="input_shapes")  # fmt: skip
    from tensortune.workloads.ops import parse_spec
    from tensortune.workloads.sources import names_tvmscript

    for w in workloads or []:
        if isinstance(w, str) and not names_tvmscript(w):
            with about("workloads"):
                parse_spec(w)  # what ``task_from_spec`` will read it as
    return workloads


def _distinct(tasks: list[Task]) -> list[Task]:
    """The first of each set of tasks with equal modules: a spec given twice, or spelled two
    ways (``matmul:64, 64,64``; a conv2d with its default stride written out), or a workload a
    MetaSchedule database holds twice, is one workload in the records store, and as two tasks
    its trials would count twice."""
    from tensortune.compat import structural_equal, structural_hash

    kept: list[Task] = []
    by_hash: dict[str, list[Task]] = {}
    for task in tasks:
        same = by_hash.setdefault(structural_hash(task.mod), [])
        if not any(structural_equal(task.mod, other.mod) for other in same):
            same.append(task)
            kept.append(task)
    return kept
