"""``tensortune compile``: build a model with its tuned records and time it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tensortune.cli.display import console, fmt_seconds, print_table, table
from tensortune.cli.options import (
    FastMathOpt,
    InputShapeOpt,
    RecordsOpt,
    TargetOpt,
    WinogradOpt,
    input_shapes,
    rename_options,
)
from tensortune.records import DEFAULT_URL

if TYPE_CHECKING:  # the deploy layer loads TVM: imported where a command runs
    from tensortune.deploy.compile import TaskStatus


def compile_(
    model: Annotated[
        str, typer.Argument(metavar="NET", help="Zoo network, e.g. resnet18, or an .onnx file.")
    ],
    records: RecordsOpt = DEFAULT_URL,
    target: TargetOpt = None,
    input_shape: InputShapeOpt = None,
    repeat: Annotated[
        int,
        typer.Option(
            metavar="N", help="Timed repeats of each build (fewer if they would take over 30 s)."
        ),
    ] = 10,
    rounds: Annotated[
        int,
        typer.Option(
            metavar="N", help="Rounds in which the tuned build and PyTorch eager take turns."
        ),
    ] = 3,
    retime: Annotated[
        int,
        typer.Option(
            metavar="K",
            help="Time each task's best K records (2 or more) again, side by side, and build "
            "with the fastest (0: the stored best).",
        ),
    ] = 0,
    fast_math: FastMathOpt = True,
    winograd: WinogradOpt = True,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            metavar="FILE",
            help="Also write the tuned build to FILE, one file to ship: "
            "tensortune.load(FILE) returns a callable taking NumPy arrays or PyTorch tensors.",
        ),
    ] = None,
) -> None:
    """Build a model with the tuned schedules and compare its latency with the untuned build
    and PyTorch eager.

    Example: tensortune compile resnet18 --records sqlite:///r.db --retime 5
    """
    from tensortune.deploy.compile import compile_model

    rename_options({"model": "NET"})
    with console.status("building and timing..."):
        report = compile_model(model, records=records, target=target, repeat=repeat,
                               rounds=rounds, retime=retime, fast_math=fast_math,
                               winograd=winograd, out=out,
                               input_shapes=input_shapes(input_shape))  # fmt: skip
    print_report(report)
    if report.artifact is not None:
        console.print(f"wrote {report.artifact}: tensortune.load({report.artifact!r}) calls it")


# What a task's schedule is, by its record's origin (``TaskStatus.kind``).  Transfer-tuning
# also stores the untuned program and the one ``compile`` builds a kernel without records from,
# each timed: when one of them is the fastest, the kernel was not tuned.
SCHEDULE_LABELS = {"tuned": "tuned", "transfer": "transferred", "untuned": "untuned (timed)",
                   "fallback": "fallback (timed)", "none": "fallback (no record)"}  # fmt: skip


def schedule_label(s: TaskStatus) -> str:
    return SCHEDULE_LABELS.get(s.kind, s.kind)


def print_report(r) -> None:
    """A compile report: latencies side by side, then each task's schedule."""
    t = table(f"{r.model}: end-to-end latency (median, {r.threads} threads)",
              {"build": "left", "latency": "right", "tuned is faster by": "right"})  # fmt: skip
    t.add_row("tensortune (tuned records)", fmt_seconds(r.tuned_seconds), "")
    t.add_row("TVM untuned (TIR as legalized)", fmt_seconds(r.untuned_seconds),
              f"{r.speedup_over_untuned:.2f}×")  # fmt: skip
    if r.torch_seconds is not None:
        t.add_row("PyTorch eager", fmt_seconds(r.torch_seconds), f"{r.speedup_over_torch:.2f}×")
    print_table(t)
    if len(r.torch_rounds) > 1:
        ratios = sorted(e / x for e, x in zip(r.torch_rounds, r.tuned_rounds, strict=True))
        shown = ", ".join(f"{x:.2f}" for x in ratios)
        console.print(f"tuned and PyTorch eager timed in turn, {len(ratios)} rounds: "
                      f"eager / tuned per round {shown} (median shown)")  # fmt: skip
    retimed = any(s.retimed_seconds is not None for s in r.tasks)
    columns = {"task": "left", "weight": "right", "schedule": "left", "best record": "right"}
    if retimed:
        columns["built with (re-timed)"] = "right"
    tasks = table("tasks", columns)
    for s in r.tasks:
        row = [s.name, str(s.weight), schedule_label(s), fmt_seconds(s.best_seconds)]
        if retimed:
            rank = "" if s.retime_rank is None else f" (#{s.retime_rank + 1})"
            row.append(fmt_seconds(s.retimed_seconds) + rank)
        tasks.add_row(*row)
    print_table(tasks)
    kinds = Counter(s.kind for s in r.tasks)
    words = {**SCHEDULE_LABELS, "none": "without a record"}
    others = "".join(f", {n} {words.get(k, k)}" for k, n in sorted(kinds.items())
                     if k != "tuned")  # fmt: skip
    console.print(f"{kinds['tuned']}/{len(r.tasks)} tasks tuned{others}; tuned vs untuned "
                  f"outputs differ by at most {r.max_abs_error:.2e}; "
                  f"records {r.records_url}")  # fmt: skip
