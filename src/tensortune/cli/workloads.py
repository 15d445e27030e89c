"""``tensortune workloads``: the operator zoo and the network zoo."""

from __future__ import annotations

from typing import Annotated

import typer

from tensortune.cli.display import console, print_table, table
from tensortune.cli.options import TargetOpt


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
) -> None:
    """List the operator zoo (with its spec grammar) and the network zoo.

    Networks show their task counts once counted (--tasks), for the target's platform.

    Example: tensortune workloads --tasks
    """
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
        return {}
    with about("target"):
        platform = resolve_platform(target, measurable=False)
    if not count:
        return task_counts(names, platform, cached_only=True)
    with console.status("importing networks to count their tasks..."):
        return task_counts(names, platform)
