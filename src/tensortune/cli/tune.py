"""``tensortune tune``: a thin layer over ``tensortune.tune``."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from tensortune.cli.display import (
    console,
    fmt_duration,
    fmt_gflops,
    fmt_seconds,
    print_json,
    print_table,
    table,
)
from tensortune.cli.options import (
    DraftOptionOpt,
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
    key_values,
    parse_duration,
    rename_options,
)
from tensortune.cli.progress import Reporter
from tensortune.errors import TensortuneError
from tensortune.records import DEFAULT_URL
from tensortune.tuning.tune import DEFAULT_STRATEGY, WARM_PER_KERNEL, TuneProgress, TuneResult

DEFAULT_TRIALS = 64  # with neither --trials nor --time


def tune(
    workload: WorkloadOpt = None,
    model: ModelOpt = None,
    input_shape: InputShapeOpt = None,
    workloads_from: WorkloadsFromOpt = None,
    trials: Annotated[
        int | None,
        typer.Option(
            "--trials",
            "-n",
            metavar="N",
            help="Total budget of measured candidates over all tasks (trials already "
            "in the store for them count; default 64, or no limit with --time).",
        ),
    ] = None,
    time_budget: Annotated[
        str | None,
        typer.Option(
            "--time",
            metavar="DURATION",
            help="Wall-clock budget of this run, e.g. 20m, 90s, 1h30m: it stops cleanly "
            "when the time is up (the round in flight finishes, and a task with nothing "
            "measured yet gets a few candidates within a tenth of the budget more); with "
            "--trials, whichever comes first.",
        ),
    ] = None,
    trials_per_task: Annotated[
        int | None,
        typer.Option(
            "--trials-per-task",
            metavar="N",
            help="At most N trials for any one task (default: no limit).",
        ),
    ] = None,
    records: RecordsOpt = DEFAULT_URL,
    work_dir: WorkDirOpt = Path("tensortune-work"),
    target: TargetOpt = None,
    strategy: Annotated[
        str,
        typer.Option(
            metavar="NAME",
            help="draft-verify (ours: the analyzer drafts, the cost model verifies) | alt "
            "(draft-verify with ALT's validity filter and uncertainty/score ping-pong) | "
            "evolutionary (MetaSchedule's; with --cost-model left out, with its "
            "XGBModel) | replay-trace | replay-func.",
        ),
    ] = DEFAULT_STRATEGY,
    draft_option: DraftOptionOpt = None,
    cost_model: Annotated[
        str,
        typer.Option(
            "--cost-model",
            metavar="MODEL",
            help="default (the pre-trained model shipped for the target) | a .ttm file "
            "from `tensortune train` | MetaSchedule's xgb, random, mlp | auto (default "
            "for draft-verify, xgb for MetaSchedule's strategies).",
        ),
    ] = "auto",
    online: Annotated[
        bool | None,
        typer.Option(
            "--online/--frozen",
            help="Refine a tensortune cost model after every measured batch, or keep "
            "it as it is (default: MoA for a neural model, refined otherwise).",
        ),
    ] = None,
    moa: Annotated[
        bool,
        typer.Option(
            "--moa",
            help="Adapt a neural pre-trained cost model with momentum online "
            "adaptation (MoA), e.g. with a .ttm trained on other hardware.",
        ),
    ] = False,
    trials_per_round: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            help="Candidates a round may measure (default: 64, 32 under --time, fewer so "
            "that each task gets a round); draft-verify measures its per_round (16, "
            "--draft-option per_round=N) up to this.",
        ),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check/--no-check",
            help="Compare each candidate's output with an unscheduled build (the local "
            "runner; a farm's servers do not).",
        ),
    ] = True,
    fast_math: FastMathOpt = True,
    winograd: WinogradOpt = True,
    cold_weights: Annotated[
        bool,
        typer.Option(
            "--cold-weights/--hot-weights",
            help="Time kernels whose arguments after the first (weights, outputs) outgrow "
            "the L2 caches with them evicted first, as they run inside a model (the "
            "default), or time every kernel hot, "
            "called again and again on the same arguments.",
        ),
    ] = True,
    warm_start: Annotated[
        list[str] | None,
        typer.Option(
            "--warm-start",
            metavar="URL",
            help="Records store tuned for other models or shapes; repeatable.  Each task "
            f"the store holds nothing of yet first times up to {WARM_PER_KERNEL} schedules "
            "of same-class kernels from these stores (as `tensortune transfer` does), and "
            "its search starts from the best of them.  These transferred measurements count "
            "toward --trials (at most half of it).",
        ),
    ] = None,
    runner: Annotated[
        str,
        typer.Option(
            "--runner",
            metavar="URL",
            help="local (default) | rpc://HOST:PORT/KEY: measure on the servers a TVM RPC "
            "tracker has under KEY",
        ),
    ] = "local",
    seed: Annotated[
        int,
        typer.Option(
            metavar="N",
            help="Random seed of the search (its draws repeat "
            "with --draft-option threads=1; on more threads they depend "
            "on which thread takes which sample).",
        ),
    ] = 0,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run", help="Check everything and show the tasks and search, measure nothing."
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Tune operators, a TVMScript workload, a model or a database's workloads.

    Records go to the store as they are measured; running the same command again resumes and
    stops when the store holds --trials measurements of these tasks on this hardware and
    target.

    Example: tensortune tune -w matmul:512,512,512 --trials 64 --records sqlite:///r.db
    """
    from tensortune.measure import names_a_farm
    from tensortune.measure.timing import TimingConfig
    from tensortune.tuning.tune import plan_tune, tune

    if moa and online is not None:
        flag = "--online" if online else "--frozen"
        raise TensortuneError(f"contradicts {flag}: give one of them", param="moa")
    online_mode: bool | str = "moa" if moa else "auto" if online is None else online
    online_flag = "--moa" if moa else "--online/--frozen"
    rename_options({"online": online_flag, "online_cost_model": online_flag,
                    "max_seconds": "--time"})  # fmt: skip
    max_seconds = None if time_budget is None else parse_duration(time_budget, "max_seconds")
    if trials is None and max_seconds is None:
        trials = DEFAULT_TRIALS
    api = {"model": model, "workloads_from": workloads_from, "trials": trials,
           "max_seconds": max_seconds,
           "target": target, "strategy": strategy, "cost_model": cost_model,
           "draft_options": key_values(draft_option or [], "draft_options"),
           "online_cost_model": online_mode, "trials_per_round": trials_per_round,
           "max_trials_per_task": trials_per_task, "fast_math": fast_math,
           "winograd": winograd, "warm_start": warm_start or None,
           "input_shapes": input_shapes(input_shape)}  # fmt: skip
    remote = names_a_farm(runner)
    if dry_run:
        plan = plan_tune(
            workload,
            records=records,
            work_dir=work_dir,
            seed=seed,
            farm=runner if remote else None,
            **api,
        )  # type: ignore[arg-type]
        _print_plan(plan, as_json)
        return
    with Reporter(console, quiet=as_json) as reporter:
        result = tune(
            workload,
            records=records,
            work_dir=work_dir,
            check_correctness=check,
            seed=seed,
            progress=_Progress(reporter, max_seconds),
            runner=runner if remote else None,
            timing=None if cold_weights else TimingConfig(),
            **api,
        )  # type: ignore[arg-type]
    if as_json:
        print_json(result.to_dict())
        return
    if trials is not None and result.trials_before >= trials:
        console.print(f"the store already holds {result.trials_before} trials of these tasks "
                      f"(budget {trials}): nothing to do")  # fmt: skip
    print_table(result_table(result))
    for r in result.tasks:
        if r.error:
            console.print(f"{r.name}: its search broke and stopped: {r.error}", style="yellow")
        elif r.failure:
            console.print(f"{r.name}: none of its programs ran ({r.failure})", style="yellow")
    if result.out_of_time:
        console.print(f"stopped: the time budget ({time_budget}) is spent after "
                      f"{fmt_duration(result.seconds)}; run again to go on")  # fmt: skip
    console.print(f"search: {result.strategy} with {result.cost_model}; "
                  f"logs per task: {work_dir / 'logs'}")  # fmt: skip
    if result.validity and result.validity["measured"]:
        v = result.validity
        console.print(f"validity filter: {v['measured_failed']} of {v['measured']} measurements "
                      f"failed; about {v['displaced']} measurements saved (best-scored candidates "
                      f"it turned away); {v['audited_valid']} of {v['audited']} audited drops "
                      f"ran")  # fmt: skip


class _Progress(TuneProgress):
    """A line per batch, with the model's estimated latency (the tasks' weighted best times)
    once every task has one, and a bar over the trials or, with --time, over the time."""

    def __init__(self, reporter: Reporter, max_seconds: float | None = None) -> None:
        self.reporter = reporter
        self.max_seconds = max_seconds
        self.began = time.monotonic()  # the time budget counts from the command's start
        self.bar = None
        self.n_tasks = 0
        self.latency: dict[str, float | None] = {}
        self.weights: dict[str, int] = {}

    def start(self, tasks, trials: int, done: int) -> None:
        self.n_tasks = len(tasks)
        if self.max_seconds is None:
            budget = f"{trials} trials"
            self.bar = self.reporter.bar("measuring", total=max(trials - done, 0))
        else:
            budget = f"for {fmt_duration(self.max_seconds)}"
            self.bar = self.reporter.bar("measuring", total=self.max_seconds,
                                         completed=time.monotonic() - self.began)  # fmt: skip
        self.reporter.line(f"tuning {len(tasks)} task(s), {budget} "
                           f"({done} trials already in the store)")  # fmt: skip

    def known(self, results) -> None:
        for r in results:
            self.latency[r.name], self.weights[r.name] = r.best_seconds, r.weight

    def estimate(self) -> float | None:
        """Σ weight × best time, once every task has a best time."""
        if not self.latency or any(v is None for v in self.latency.values()):
            return None
        return sum(self.weights[n] * v for n, v in self.latency.items())  # type: ignore[operator]

    def batch(self, index: int, task, records, result) -> None:
        self.latency[result.name], self.weights[result.name] = result.best_seconds, result.weight
        failed = sum(not r.ok for r in records)
        fail = f", {failed} failed" if failed else ""
        whole = self.estimate()
        model = f"; model ≈ {fmt_seconds(whole)}" if whole is not None and self.n_tasks > 1 else ""
        left = ""
        if self.max_seconds is not None:
            rest = max(0.0, self.max_seconds - (time.monotonic() - self.began))
            left = f"; {fmt_duration(rest)} left"
        self.reporter.line(
            f"[{index + 1}/{self.n_tasks}] {result.name}: {result.trials} trials "
            f"(+{len(records)}{fail}), best {fmt_seconds(result.best_seconds)}, "
            f"{fmt_gflops(result.gflops)} GFLOP/s{model}{left}"
        )
        if self.max_seconds is None:
            self.reporter.update(self.bar, advance=len(records), description=result.name)
        else:
            spent = min(self.max_seconds, time.monotonic() - self.began)
            self.reporter.update(self.bar, completed=spent, description=result.name)


def result_table(result: TuneResult):
    columns = {"task": "left", "weight": "right", "trials": "right", "ok": "right",
               "best latency": "right", "GFLOP/s": "right"}  # fmt: skip
    caption = f"target {json.dumps(result.target)} · hardware {result.hardware_id}"
    t = table(f"tensortune: {result.trials_total} trials in {result.records_url}", columns,
              caption=caption)  # fmt: skip
    for r in result.tasks:
        t.add_row(r.name, str(r.weight), str(r.trials), str(r.ok), fmt_seconds(r.best_seconds),
                  fmt_gflops(r.gflops))  # fmt: skip
    if len(result.tasks) > 1:
        partial = "" if result.weighted_seconds() is not None else " (partial)"
        t.add_section()
        t.add_row("weighted total", "", str(result.trials_total), "",
                  fmt_seconds(result.weighted_seconds(partial=True)) + partial, "")  # fmt: skip
    return t


def _print_plan(plan, as_json: bool) -> None:
    tasks = [{"name": t.name, "weight": t.weight, "gflop": t.flop / 1e9,
              "fast_math": t.exact is not None} for t in plan.tasks]  # fmt: skip
    described = {"target": plan.platform.target, "hardware": plan.platform.hardware.id,
                 "strategy": plan.strategy_name, "cost_model": plan.cost_model_name,
                 "trials": plan.trials, "tasks": tasks}  # fmt: skip
    if as_json:
        print_json(described)
        return
    budget = [f"{plan.trials} trials"] if plan.trials is not None else []
    if plan.max_seconds is not None:
        budget.append(f"for at most {fmt_duration(plan.max_seconds)}")
    t = table(f"would tune {len(tasks)} task(s), {' '.join(budget)}",
              {"task": "left", "weight": "right", "GFLOP": "right", "fast math": "left"},
              caption=f"target {json.dumps(plan.platform.target)}")  # fmt: skip
    for task in tasks:
        approximated = "yes" if task["fast_math"] else ""
        t.add_row(task["name"], str(task["weight"]), f"{task['gflop']:.3f}", approximated)
    print_table(t)
    console.print(f"search: {described['strategy']} with {described['cost_model']}; "
                  "nothing measured (--dry-run)")  # fmt: skip
