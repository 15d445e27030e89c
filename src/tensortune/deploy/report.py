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
    tasks = Table(title="tasks")
    for col in ("task", "weight", "schedule", "best record"):
        tasks.add_column(col, justify="right" if col in ("weight", "best record") else "left")
    for s in r.tasks:
        tasks.add_row(s.name, str(s.weight), "tuned" if s.tuned else "fallback (untuned)",
                      fmt_seconds(s.best_seconds))  # fmt: skip
    console.print(tasks)
    n_tuned = sum(s.tuned for s in r.tasks)
    console.print(f"{n_tuned}/{len(r.tasks)} tasks tuned; tuned vs untuned outputs differ by at "
                  f"most {r.max_abs_error:.2e}; records {r.records_url}")  # fmt: skip
