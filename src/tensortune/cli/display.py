"""Rich rendering of tuning progress and result tables (kept apart from the commands)."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from tensortune.tuning.tune import TaskResult, TuneResult

# No markup: task names, file names and op docs contain brackets that Rich would eat.
console = Console(highlight=False, markup=False)
errors = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def fmt_gflops(g: float | None) -> str:
    return "-" if g is None else f"{g:.1f}"


def progress_line(index: int, total: int, batch_size: int, failed: int, r: TaskResult) -> str:
    fail = f", {failed} failed" if failed else ""
    return (
        f"[{index + 1}/{total}] {r.name}: {r.trials} trials (+{batch_size}{fail}), "
        f"best {fmt_seconds(r.best_seconds)}, {fmt_gflops(r.gflops)} GFLOP/s"
    )


def result_table(result: TuneResult) -> Table:
    t = Table(title=f"tensortune: {result.trials_total} trials in {result.records_url}")
    for col in ("task", "weight", "trials", "ok", "best latency", "GFLOP/s"):
        t.add_column(col, justify="left" if col == "task" else "right")
    total = 0.0
    complete = True
    for r in result.tasks:
        t.add_row(r.name, str(r.weight), str(r.trials), str(r.ok), fmt_seconds(r.best_seconds),
                  fmt_gflops(r.gflops))  # fmt: skip
        if r.best_seconds is None:
            complete = False
        else:
            total += r.weight * r.best_seconds
    if len(result.tasks) > 1:
        t.add_section()
        t.add_row("weighted total", "", str(result.trials_total), "",
                  fmt_seconds(total) + ("" if complete else " (partial)"), "")  # fmt: skip
    t.caption = f"target {json.dumps(result.target)} · hardware {result.hardware_id}"
    return t
