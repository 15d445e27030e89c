"""Rich rendering of a compile report."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from tensortune.cli.display import fmt_seconds
from tensortune.deploy.compile import CompileReport


def print_report(r: CompileReport, console: Console) -> None:
    t = Table(title=f"{r.model}: end-to-end latency (median, {r.threads} threads)")
    t.add_column("build")
    t.add_column("latency", justify="right")
    t.add_column("tuned is faster by", justify="right")
    t.add_row("tensortune (tuned records)", fmt_seconds(r.tuned_seconds), "")
    t.add_row("TVM untuned (TIR as legalized)", fmt_seconds(r.untuned_seconds),
              f"{r.speedup_over_untuned:.2f}×")  # fmt: skip
    if r.torch_seconds is not None:
        t.add_row("PyTorch eager", fmt_seconds(r.torch_seconds), f"{r.speedup_over_torch:.2f}×")
    console.print(t)
    if len(r.torch_rounds) > 1:
        ratios = sorted(e / x for e, x in zip(r.torch_rounds, r.tuned_rounds, strict=True))
        shown = ", ".join(f"{x:.2f}" for x in ratios)
        console.print(f"tuned and PyTorch eager timed in turn, {len(ratios)} rounds: "
                      f"eager / tuned per round {shown} (median shown)")  # fmt: skip
    tasks = Table(title="tasks")
    retimed = any(s.retimed_seconds is not None for s in r.tasks)
    cols = ["task", "weight", "schedule", "best record"]
    cols += ["built with (re-timed)"] if retimed else []
    for col in cols:
        tasks.add_column(col, justify="left" if col in ("task", "schedule") else "right")
    for s in r.tasks:
        row = [s.name, str(s.weight), "tuned" if s.tuned else "fallback (untuned)",
               fmt_seconds(s.best_seconds)]  # fmt: skip
        if retimed:
            rank = "" if s.retime_rank is None else f" (#{s.retime_rank + 1})"
            row.append(fmt_seconds(s.retimed_seconds) + rank)
        tasks.add_row(*row)
    console.print(tasks)
    n_tuned = sum(s.tuned for s in r.tasks)
    console.print(f"{n_tuned}/{len(r.tasks)} tasks tuned; tuned vs untuned outputs differ by at "
                  f"most {r.max_abs_error:.2e}; records {r.records_url}")  # fmt: skip
