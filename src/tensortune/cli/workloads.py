"""``tensortune workloads``: the operator zoo and the network zoo."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated

import typer

from tensortune.cli.display import console, print_table, table
from tensortune.cli.options import (
    FastMathOpt,
    InputShapeOpt,
    ModelOpt,
    TargetOpt,
    WorkloadOpt,
    WorkloadsFromOpt,
    input_shapes,
)
from tensortune.errors import TensortuneError


def workloads(
    count_tasks: Annotated[
        bool,
        typer.Option(
            "--tasks/--no-tasks",
            help="Import the networks not counted yet to count their tuning tasks "
            "(about a minute for the whole zoo; the counts are cached).",
        ),
    ] = False,
    target: TargetOpt = None,
    workload: WorkloadOpt = None,
    model: ModelOpt = None,
    input_shape: InputShapeOpt = None,
    workloads_from: WorkloadsFromOpt = None,
    classes: Annotated[
        bool,
        typer.Option(
            "--classes",
            help="With --model, --workload or --workloads-from: each task's kernel class and "
            "how many tasks each class has (tasks of one class can share schedules: "
            "`tensortune transfer`).",
        ),
    ] = False,
    fast_math: FastMathOpt = True,
) -> None:
    """List the operator zoo (with its spec grammar) and the network zoo, or the tasks of a
    model or of workloads.

    Networks show their task counts once counted (--tasks), for the target's platform.  With
    --model (or --workload, --workloads-from) the tasks are listed instead, with --classes
    their kernel classes too.

    Example: tensortune workloads --model resnet18 --classes
    """
    if workload or model is not None or workloads_from is not None:
        _list_tasks(workload, model, workloads_from, target, classes, fast_math,
                    input_shapes(input_shape))  # fmt: skip
        return
    if classes:
        raise TensortuneError("give the tasks to classify: --model, --workload or "
                              "--workloads-from", param="classes")  # fmt: skip
    from tensortune.workloads.networks import NETWORKS
    from tensortune.workloads.ops import OPS

    ops = table("operators: --workload OP:PARAMS", {"op": "left", "parameters": "left"})
    for d in OPS.values():
        ops.add_row(d.name, d.doc)
    print_table(ops)
    columns = {"network": "left", "tasks": "right", "occurrences": "right", "description": "left"}
    nets = table("networks: --model NAME", columns)
    counts = _task_counts(list(NETWORKS), target, count_tasks)
    for name, d in NETWORKS.items():
        tasks, total = counts.get(name, ("-", "-"))
        nets.add_row(name, str(tasks), str(total), d.description)
    print_table(nets)
    if not count_tasks and len(counts) < len(NETWORKS):
        console.print("tasks of networks not counted yet: tensortune workloads --tasks")


def _task_counts(names: list[str], target: str | None, count: bool) -> dict:
    from tensortune.errors import about
    from tensortune.hardware import resolve_platform
    from tensortune.workloads.catalog import cache_exists, task_counts

    if not count and not cache_exists():  # nothing to show: do not even start TVM
        if target is not None:
            from tensortune.hardware.target import target_dict

            with about("target"):
                target_dict(target)  # its form, at least
        return {}
    with about("target"):
        platform = resolve_platform(target, measurable=False)
    if not count:
        return task_counts(names, platform, cached_only=True)
    with console.status("importing networks to count their tasks..."):
        return task_counts(names, platform)


def _list_tasks(workload: list[str] | None, model: str | None, workloads_from: Path | None,
                target: str | None, classes: bool, fast_math: bool,
                input_shapes: dict[str, list[int]] | None) -> None:  # fmt: skip
    from tensortune.errors import about
    from tensortune.hardware import resolve_platform
    from tensortune.transfer.classes import kernel_class
    from tensortune.workloads.resolve import resolve_tasks

    with about("target"):
        platform = resolve_platform(target, measurable=False)
    with console.status("importing the model..." if model is not None else "reading tasks..."):
        tasks = resolve_tasks(workload, model=model, workloads_from=workloads_from,
                              platform=platform, fast_math=fast_math,
                              input_shapes=input_shapes)  # fmt: skip
    columns = {"task": "left", "weight": "right", "GFLOP": "right"}
    if classes:
        columns["class"] = "left"
    t = table(f"tasks of {model}" if model is not None else "tasks", columns)
    of_task = [str(kernel_class(task.mod)) for task in tasks] if classes else []
    for i, task in enumerate(tasks):
        cells = [task.name, str(task.weight), f"{task.flop / 1e9:.3f}"]
        t.add_row(*cells, *of_task[i : i + 1])
    print_table(t, keep_tail=("class",))
    if classes:
        _print_classes(tasks, of_task)


def _print_classes(tasks: list, of_task: list[str]) -> None:
    count = Counter(of_task)
    weight: Counter[str] = Counter()
    for task, kclass in zip(tasks, of_task, strict=True):
        weight[kclass] += task.weight
    t = table("kernel classes", {"class": "left", "tasks": "right", "occurrences": "right"})
    for kclass, n in count.most_common():  # ties keep the order of first appearance
        t.add_row(kclass, str(n), str(weight[kclass]))
    print_table(t, keep_tail=("class",))
    shared = sum(n > 1 for n in count.values())
    console.print(f"{_many(len(tasks), 'task', 'tasks')} in "
                  f"{_many(len(count), 'class', 'classes')}; {shared} with several tasks, "
                  "which can share schedules (tensortune transfer)")  # fmt: skip


def _many(n: int, one: str, several: str) -> str:
    return f"{n} {one if n == 1 else several}"
