"""``tensortune transfer``: a thin layer over ``tensortune.transfer.run.transfer``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from tensortune.cli.display import console, fmt_seconds, print_json, print_table, table
from tensortune.cli.options import (
    FastMathOpt,
    InputShapeOpt,
    JsonOpt,
    ModelOpt,
    RecordsOpt,
    TargetOpt,
    WinogradOpt,
    WorkDirOpt,
    WorkloadOpt,
    WorkloadsFromOpt,
    input_shapes,
)
from tensortune.cli.progress import Reporter
from tensortune.records import DEFAULT_URL
from tensortune.transfer.run import DEFAULT_PER_KERNEL, KernelTransfer, TransferResult
from tensortune.transfer.run import transfer as run_transfer

if TYPE_CHECKING:
    from rich.table import Table


def transfer(
    sources: Annotated[
        list[str],
        typer.Option(
            "--from",
            metavar="URL",
            help="Records store tuned for other models or shapes, whose best schedules are "
            "tried on same-class kernels; repeatable.",
        ),
    ],
    workload: WorkloadOpt = None,
    model: ModelOpt = None,
    workloads_from: WorkloadsFromOpt = None,
    records: RecordsOpt = DEFAULT_URL,
    per_kernel: Annotated[
        int,
        typer.Option(
            "--per-kernel",
            metavar="N",
            help="At most N transferred schedules timed per kernel; where a kernel has more, "
            "the cost model shipped for the target picks which.",
        ),
    ] = DEFAULT_PER_KERNEL,
    target: TargetOpt = None,
    work_dir: WorkDirOpt = Path("tensortune-work"),
    fast_math: FastMathOpt = True,
    winograd: WinogradOpt = True,
    input_shape: InputShapeOpt = None,
    end_to_end: Annotated[
        bool,
        typer.Option(
            "--e2e/--no-e2e",
            help="With --model, time the model end to end, untuned and with each kernel's "
            "fastest record, after transferring.",
        ),
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    """Tune kernels with schedules tuned for other kernels of the same class, without a search.

    Each kernel's same-class schedules in the --from stores are replayed on its shapes (tiles
    re-fitted), timed with its untuned program and with the program compile would build it from
    without a record (its fallback), and recorded with where they came from; compile builds
    each kernel with the fastest of them.  Running the same command again measures only what
    is missing.

    Example: tensortune transfer --from sqlite:///resnet50.db --model resnet18 --records
    sqlite:///resnet18.db
    """
    then = ", then the model is timed end to end" if model is not None and end_to_end else ""
    intro = (f"transferring from {len(sources)} store(s), at most {per_kernel} schedule(s) per "
             f"kernel{then}")  # fmt: skip
    with Reporter(console, quiet=as_json) as reporter:
        result = run_transfer(
            sources,
            workload,
            model=model,
            workloads_from=workloads_from,
            records=records,
            target=target,
            per_kernel=per_kernel,
            work_dir=work_dir,
            fast_math=fast_math,
            winograd=winograd,
            input_shapes=input_shapes(input_shape),
            end_to_end=end_to_end,
            progress=_Progress(reporter, intro),
        )
    if as_json:
        print_json(result.to_dict())
        return
    print_table(result_table(result), keep_tail=("class",))
    for line in summary_lines(result):
        console.print(line)


class _Progress:
    """A line per kernel, and a spinner meanwhile: the API says nothing before the first
    kernel is done, so there is no total for a bar.  The first line waits for the first
    kernel too: bad input must leave stdout empty."""

    def __init__(self, reporter: Reporter, intro: str) -> None:
        self.reporter = reporter
        self.intro: str | None = intro
        self.bar = reporter.bar("transferring", total=None)

    def __call__(self, index: int, k: KernelTransfer) -> None:
        if self.intro is not None:
            self.reporter.line(self.intro)
            self.intro = None
        untuned = f"untuned {fmt_seconds(k.untuned_seconds)}"
        if k.fallback_seconds is not None:
            untuned += f", fallback {fmt_seconds(k.fallback_seconds)}"
        if k.sources:
            found = (f"{_count(k.sources, 'source')} ({k.exact} exact, {k.refit} refit, "
                     f"{k.invalid} invalid), {untuned}, best transferred "
                     f"{fmt_seconds(k.best_seconds)}")  # fmt: skip
        else:
            found = f"no source of its class, {untuned}"
        self.reporter.line(f"[{index + 1}] {k.name} ({k.kernel_class}): {found}")
        self.reporter.update(self.bar, advance=1, description=f"{_count(index + 1, 'kernel')} done")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _speedup(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def result_table(result: TransferResult) -> Table:
    # One column for the sources and their outcomes, so nine columns fit 120 characters.
    columns = {"task": "left", "weight": "right", "class": "left", "sources e/r/i": "right",
               "from": "left", "untuned": "right", "chosen": "right",
               "speedup": "right"}  # fmt: skip
    caption = (f"sources e/r/i: same-class schedules found, replayed exactly / with re-fitted "
               f"tiles / invalid\ntarget {json.dumps(result.target)} · hardware "
               f"{result.hardware_id}")  # fmt: skip
    t = table(f"tensortune transfer: {_count(len(result.tasks), 'kernel')} in "
              f"{result.records_url}", columns, caption=caption)  # fmt: skip
    for k in result.tasks:
        outcomes = f" ({k.exact}/{k.refit}/{k.invalid})" if k.sources else ""
        t.add_row(k.name, str(k.weight), k.kernel_class, f"{k.sources}{outcomes}", k.taken_from,
                  fmt_seconds(k.untuned_seconds), fmt_seconds(k.chosen_seconds),
                  _speedup(k.speedup))  # fmt: skip
    if len(result.tasks) > 1:
        whole = result.weighted_seconds() != (None, None)
        untuned, chosen = result.weighted_seconds(partial=True)
        ratio = untuned / chosen if whole and untuned is not None and chosen else None
        partial = "" if whole else " (partial)"
        t.add_section()
        t.add_row("weighted total", "", "", "", "", fmt_seconds(untuned) + partial,
                  fmt_seconds(chosen) + partial, _speedup(ratio))  # fmt: skip
    return t


def summary_lines(result: TransferResult) -> list[str]:
    outcomes = result.outcomes()
    relaxed = outcomes.pop("relaxed", 0)
    line = ", ".join(f"{n} {name}" for name, n in outcomes.items())
    if relaxed:
        line += f" ({relaxed} of them from kernels with a shorter epilogue)"
    if result.invalid_reasons:
        reasons = "; ".join(f"{n}x {why}" for why, n in result.invalid_reasons.items())
        line += f" (invalid: {reasons})"
    lines = [f"transferred schedules: {line}"]
    if not any(k.sources for k in result.tasks):
        lines.append("the --from stores hold no schedule of these kernels' classes "
                     "(see tensortune workloads --classes)")  # fmt: skip
    lines.append(f"search: {result.search_seconds:.1f} s replaying, building and timing, at "
                 f"most {result.per_kernel} transferred per kernel")  # fmt: skip
    if result.model is not None:
        lines.append(f"end to end ({result.model}): untuned {fmt_seconds(result.untuned_e2e)}, "
                     f"transferred {fmt_seconds(result.transferred_e2e)}, "
                     f"{_speedup(result.e2e_speedup)}")  # fmt: skip
    return lines
