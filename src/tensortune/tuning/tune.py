"""``tensortune.tune``: tune workloads or a model, through our measurement and records store.

Resuming is the default: records already in the store count toward the budget.  Everything the
user names is checked first (``plan_tune``), before the store is opened or anything measured.
"""

from __future__ import annotations

import math
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from tensortune.errors import (
    TensortuneError,
    about,
    check_flags,
    check_seed,
    check_writable,
    interruptible,
    last_line,
)
from tensortune.hardware import Platform, resolve_platform
from tensortune.records import DEFAULT_URL, Record, RecordStore, records_from
from tensortune.workloads.resolve import check_sources, resolve_tasks
from tensortune.workloads.task import Task

if TYPE_CHECKING:
    from tensortune.measure.runner import TimingConfig
    from tensortune.measure.session import MeasureSession

# Our search is the default: on the search benchmark (benchmarks/RESULTS.md, "pretrained" arm U)
# draft-then-verify with the model shipped for the target, adapted online, reached MetaSchedule's
# final latency 5.38x sooner than MetaSchedule's default (evolutionary + XGBModel) over nine runs.
DEFAULT_STRATEGY = "draft-verify"
# Transferred schedules timed per task before a warm-started search: its first population
# starts from the best of them (MetaSchedule's strategies draw part of it from the store).
WARM_PER_KERNEL = 4
# With a time budget and no trial budget, tuning goes on until the time is up; MetaSchedule's
# task scheduler still needs a number, and this many trials per task stands in for "no limit".
OPEN_TRIALS_PER_TASK = 100_000
# Candidates per round under a time budget: a round in flight finishes after the deadline, and
# every task's first round comes before the scheduler weighs tasks, so rounds stay short.
TIMED_TRIALS_PER_ROUND = 32


@dataclass
class TaskResult:
    name: str
    weight: int
    flop: float
    trials: int
    ok: int
    best_seconds: float | None
    error: str = ""  # why its search stopped early, when it broke
    failure: str = ""  # when none of its programs ran: the most common reason

    @property
    def gflops(self) -> float | None:
        if not self.best_seconds or not self.flop:
            return None
        return self.flop / self.best_seconds / 1e9


@dataclass
class TuneResult:
    """What ``tune`` did: per task (``tasks``) its trials and best latency in the store after
    this run, what searched, and the run's time and budget."""

    run_id: str
    records_url: str
    target: dict
    hardware_id: str
    trials_requested: int | None  # None: a time budget only
    trials_before: int  # what the store held of these tasks before this run
    tasks: list[TaskResult] = field(default_factory=list)
    # What searched: see ``TunePlan.strategy_name`` and ``cost_model_name``.
    strategy: str = ""
    cost_model: str = ""
    # This run's wall time (model loading included), its time budget (None: none) and
    # whether that budget stopped it.
    seconds: float = 0.0
    max_seconds: float | None = None
    out_of_time: bool = False
    # ALT's validity filter, where the strategy ran one: what it did this run (``search/alt.py``
    # says what each count means); None when nothing was left to measure.
    validity: dict[str, int] | None = None
    # Transferred schedules this run timed before its search (``warm_start``).
    trials_warm_start: int = 0

    @property
    def trials_total(self) -> int:
        return sum(t.trials for t in self.tasks)

    def weighted_seconds(self, *, partial: bool = False) -> float | None:
        """Σ weight x best latency over the tasks: a model's latency estimate from its
        kernels alone.  None while a task has no best time, unless ``partial`` (the sum over
        the tasks that have one)."""
        if not partial and any(t.best_seconds is None for t in self.tasks):
            return None
        return sum(t.weight * t.best_seconds for t in self.tasks if t.best_seconds is not None)

    def to_dict(self) -> dict:
        tasks = [{**asdict(t), "gflops": t.gflops} for t in self.tasks]
        return {**asdict(self), "tasks": tasks, "trials_total": self.trials_total,
                "weighted_seconds": self.weighted_seconds()}  # fmt: skip


class TuneProgress:
    """What ``tune`` reports while it works; override the methods you need."""

    def start(self, tasks: list[Task], trials: int, done: int) -> None:
        """Before the search: the tasks, the budget and the trials the store holds, a warm
        start's included (``trials`` is the trial budget, or the stand-in for none under a
        time budget)."""

    def known(self, results: list[TaskResult]) -> None:
        """Right after ``start``: each task's summary from what the store already holds."""

    def batch(self, index: int, task: Task, records: list[Record], result: TaskResult) -> None:
        """After each measured batch: the task's index and its summary so far."""


class _BatchCallback(TuneProgress):
    def __init__(self, fn: Callable[[int, Task, list[Record], TaskResult], None]) -> None:
        self.fn = fn

    def batch(self, index: int, task: Task, records: list[Record], result: TaskResult) -> None:
        self.fn(index, task, records, result)


@dataclass
class TunePlan:
    """What ``tune`` will do, every input resolved and checked: the platform, the tasks, the
    strategy (a prototype each task clones) and the cost model."""

    platform: Platform
    tasks: list[Task]
    trials: int | None  # None: as many as ``max_seconds`` allows
    strategy: object
    cost_model: object
    max_trials_per_task: int | None = None
    trials_per_round: int | None = None
    # The schedules that seed the search, by kernel class (``transfer.sources``); None: a
    # cold start.
    warm_start: dict | None = None
    warm_per_kernel: int = WARM_PER_KERNEL
    max_seconds: float | None = None

    @property
    def strategy_name(self) -> str:
        """The strategy's class, with the settings of ours that differ from the defaults:
        ``DraftThenVerify(seeds=0)``."""
        name = type(self.strategy).__name__
        if not hasattr(self.strategy, "settings"):
            return name
        from tensortune.search.draft_verify import option_defaults

        defaults = option_defaults()  # compared, not checked: None is a valid per_round
        changed = [f"{k}={v}" for k, v in self.strategy.settings().items() if v != defaults[k]]
        return f"{name}({', '.join(changed)})" if changed else name

    def __repr__(self) -> str:
        budget = f"trials={self.trials}" if self.trials is not None else ""
        if self.max_seconds is not None:
            budget += f"{', ' if budget else ''}max_seconds={self.max_seconds:g}"
        return (
            f"TunePlan({len(self.tasks)} tasks, {budget}, target={self.platform.target}, "
            f"strategy={self.strategy_name}, cost_model={self.cost_model_name})"
        )

    @property
    def cost_model_name(self) -> str:
        """The cost model's class, or for ours the model's kind and how it learns while tuning:
        ``pacm (MoA)``, ``xgb (online)``, ``pacm (frozen)``, ``pacm (MoA, pacm screening)``."""
        from tensortune.costmodel.moa import MomentumAdapted
        from tensortune.costmodel.ms_adapter import LearnedCostModel

        if not isinstance(self.cost_model, LearnedCostModel):
            return type(self.cost_model).__name__
        inner = self.cost_model.model
        screen = self.cost_model.screen
        screened = "" if screen is None else f", {screen.kind} screening"
        if isinstance(inner, MomentumAdapted):
            return f"{inner.model.kind} (MoA{screened})"
        return f"{inner.kind} ({'online' if self.cost_model.online else 'frozen'}{screened})"


# More trials than a tuner could measure in years; TVM's scheduler takes a 32-bit count.
MAX_TRIALS = 10**9


def plan_tune(
    workloads: Sequence[str | Task] | None = None,
    *,
    model: object | None = None,
    workloads_from: str | os.PathLike | None = None,
    trials: int | None = None,
    max_seconds: float | None = None,
    target: dict | str | Platform | None = None,
    strategy: object = DEFAULT_STRATEGY,
    draft_options: Mapping[str, object] | None = None,
    cost_model: object = "auto",
    online_cost_model: bool | str = "auto",
    trials_per_round: int | None = None,
    max_trials_per_task: int | None = None,
    fast_math: bool = True,
    winograd: bool = True,
    warm_start: object = None,
    warm_per_kernel: int = WARM_PER_KERNEL,
    input_shapes: dict[str, list[int]] | None = None,
    records: str | RecordStore | None = None,
    work_dir: str | os.PathLike | None = None,
    seed: int = 0,
    runs_elsewhere: bool = False,
    farm: str | None = None,
) -> TunePlan:
    """Resolve and check what ``tune`` is given, cheapest first; writes no records store (the
    ``warm_start`` stores are read, for their schedules).  ``records`` and ``work_dir``, when
    given, are checked for their form only: nothing is opened or created.  ``runs_elsewhere``:
    a device farm runs the code, so the target is not checked against this machine's CPU.
    ``farm``: the ``rpc://HOST:PORT/KEY`` runner ``tune`` would be given; its tracker is asked
    for the servers' hardware (no runner starts), the plan is for that hardware and the target
    is checked against the servers' CPU."""
    from tensortune.costmodel.factory import cost_model_from
    from tensortune.records import check_url
    from tensortune.search.factory import default_verifier, strategy_from

    check_seed(seed)
    check_flags(fast_math=fast_math, winograd=winograd, runs_elsewhere=runs_elsewhere)
    check_sources(workloads, model=model, workloads_from=workloads_from,
                  input_shapes=input_shapes)  # fmt: skip
    for name, value in (("trials", trials), ("trials_per_round", trials_per_round),
                        ("max_trials_per_task", max_trials_per_task),
                        ("warm_per_kernel", warm_per_kernel)):  # fmt: skip
        if value is not None and type(value) is not int:
            raise TensortuneError(f"must be a whole number, not {value!r}", param=name)
        if value is not None and not 0 < value <= MAX_TRIALS:
            raise TensortuneError(f"must be positive and at most {MAX_TRIALS}, not {value}",
                                  param=name)  # fmt: skip
    if isinstance(records, str | os.PathLike):
        with about("records"):
            check_url(records)
    if work_dir is not None:
        check_writable(work_dir, "work_dir", directory=True)
    if trials is None and max_seconds is None:
        raise TensortuneError("give a trial budget, a time budget (max_seconds) or both",
                              param="trials")  # fmt: skip
    if max_seconds is not None and (isinstance(max_seconds, bool) or not isinstance(
            max_seconds, int | float) or not 0 < max_seconds < math.inf):  # fmt: skip
        raise TensortuneError(f"must be positive, in seconds, not {max_seconds!r}",
                              param="max_seconds")  # fmt: skip
    with about("target"):
        platform = resolve_platform(target)
    if farm is not None:
        from tensortune.measure.rpc import farm_servers, parse_runner_url, remote_platform

        with about("runner"):
            servers = parse_runner_url(farm)
            platform = remote_platform(platform, servers, farm_servers(servers))
    if farm is not None or not runs_elsewhere:  # else checked when the farm is reached (rpc.py)
        with about("target"):
            platform.check_runs_here()
    prototype = strategy_from(strategy, draft_options)
    if cost_model == "auto":
        cost_model = default_verifier(prototype, platform)
    try:
        verifier = cost_model_from(cost_model, platform, online=online_cost_model)
    except TensortuneError as e:
        if e.param == "online":  # this function's name for it
            e.param = "online_cost_model"
        raise
    by_class = None
    if warm_start is not None:  # read now: a bad URL is refused before anything is written
        from tensortune.transfer.sources import source_schedules

        with about("warm_start"):  # a store still empty (the first run of a loop) is no error
            by_class = source_schedules(warm_start, platform, param="warm_start", required=False)
        if not by_class:
            import warnings

            warnings.warn("tensortune: the warm-start stores hold no schedule for this target: "
                          "the search starts cold", stacklevel=2)  # fmt: skip
    tasks = resolve_tasks(workloads, model=model, workloads_from=workloads_from,
                          platform=platform, fast_math=fast_math, winograd=winograd,
                          input_shapes=input_shapes)  # fmt: skip
    return TunePlan(platform, tasks, trials, prototype, verifier, max_trials_per_task,
                    trials_per_round, by_class, warm_per_kernel, max_seconds)  # fmt: skip


def tune(
    workloads: Sequence[str | Task] | None = None,
    *,
    model: object | None = None,
    workloads_from: str | os.PathLike | None = None,
    trials: int | None = None,
    max_seconds: float | None = None,
    records: str | RecordStore = DEFAULT_URL,
    work_dir: str | os.PathLike = "tensortune-work",
    target: dict | str | Platform | None = None,
    strategy: object = DEFAULT_STRATEGY,
    draft_options: Mapping[str, object] | None = None,
    cost_model: object = "auto",
    online_cost_model: bool | str = "auto",
    task_scheduler: object = "gradient",
    trials_per_round: int | None = None,
    max_trials_per_task: int | None = None,
    fast_math: bool = True,
    winograd: bool = True,
    warm_start: object = None,
    warm_per_kernel: int = WARM_PER_KERNEL,
    input_shapes: dict[str, list[int]] | None = None,
    builder: object | None = None,
    runner: object | str | None = None,
    timing: TimingConfig | None = None,
    check_correctness: bool = True,
    seed: int = 0,
    progress: TuneProgress | Callable | None = None,
) -> TuneResult:
    """Tune until the store holds ``trials`` measurements of these tasks on this hardware/target,
    or until ``max_seconds`` of wall time are spent (a round in flight finishes), whichever
    comes first; give either or both.  Under a time budget MetaSchedule's gradient task
    scheduler still picks each round's task by the end-to-end latency it stands to gain, once
    every task has had a first round: those share half the time left while some wait, and a
    task with nothing measured at the end still gets a few candidates within a tenth of the
    budget past it (an untuned kernel would run tens of times slower in the model;
    ``search.leases``).

    ``strategy`` takes MetaSchedule's names (``evolutionary``, ``replay-trace``,
    ``replay-func``), ``draft-verify`` (ours, the default), ``alt`` (draft-verify with ALT's
    validity filter and ping-pong, ``search.alt``) or a strategy object.
    ``draft_options`` sets draft-then-verify's (and ``alt``'s) settings by name, e.g.
    ``{"seeds": 0, "population": 256}`` (``search.draft_verify.OPTION_RANGES``).
    ``cost_model`` takes MetaSchedule's names (``xgb``, ``random``, ``mlp``), ``default`` (the
    pre-trained model shipped for the target), one of our model files, a fitted ``CostModel``
    or any MetaSchedule cost model; ``auto`` gives each strategy the verifier it works best
    with (``search.factory.default_verifier``).  ``online_cost_model``: how one of our models
    learns while it tunes (``True``: refined after every batch; ``"moa"``: momentum online
    adaptation of a neural model; ``False``: frozen; ``"auto"``: MoA for a neural model,
    refined otherwise).  ``builder``/``runner`` default to tensortune's persistent-worker ones;
    ``runner="rpc://HOST:PORT/KEY"`` measures on the servers a TVM RPC tracker has under KEY
    (``tensortune serve``), recording under their hardware.
    ``task_scheduler``: which task each round goes to; ``gradient`` (MetaSchedule's rule, by
    the end-to-end latency a task stands to gain), ``round-robin`` or a MetaSchedule
    ``TaskScheduler``.
    ``trials_per_round`` defaults to 64 (32 under a time budget), lowered so that each task
    gets a round (down to 8, or below with fewer than 8 trials a task); draft-verify measures
    its own ``per_round`` (16) up to it.
    ``fast_math`` approximates float32 ``exp``/``tanh``/``erf`` so they vectorize; our local
    runner then checks an operator spec's, a TVMScript file's or a database's kernels against
    the exact workload (``tensortune.workloads.fast_math``), and a model's against their
    unscheduled build, whose graph is approximated already; a farm or a runner of the
    caller's checks nothing, and a warning says so.
    ``winograd`` runs a model's eligible 3×3 convolutions as Winograd F(4×4, 3×3) or F(2×2, 3×3)
    (``tensortune.workloads.winograd``).  A loaded ``Model`` keeps what it was loaded with.
    ``input_shapes`` fixes an ONNX model's dynamic input dimensions
    (``{"input": [1, 3, 224, 224]}``).
    ``timing`` says how candidates are timed; by default hot (the kernel called again and
    again on the same arguments), except kernels whose arguments after the first (weights
    and outputs) outgrow the L2 caches, which are timed with them evicted
    (``measure.timing.model_timing``), as they run in a model.
    ``TimingConfig()`` times every kernel hot.
    ``warm_start`` (records store URLs or stores) seeds the search with schedules tuned for
    other kernels: before searching, each task not yet tuned times up to ``warm_per_kernel``
    transferred schedules (``tensortune.transfer``; they count toward ``trials``), and the
    search's first population starts from the best of them.
    """
    from tensortune.measure import names_a_farm

    start = time.monotonic()
    check_flags(check_correctness=check_correctness)
    plan = plan_tune(workloads, model=model, workloads_from=workloads_from, trials=trials,
                     max_seconds=max_seconds, target=target, strategy=strategy,
                     draft_options=draft_options, cost_model=cost_model,
                     online_cost_model=online_cost_model, trials_per_round=trials_per_round,
                     max_trials_per_task=max_trials_per_task, fast_math=fast_math,
                     winograd=winograd, warm_start=warm_start,
                     warm_per_kernel=warm_per_kernel, input_shapes=input_shapes,
                     records=records, work_dir=work_dir, seed=seed,
                     runs_elsewhere=names_a_farm(runner))  # fmt: skip
    from tensortune.search.run import check_task_scheduler

    check_task_scheduler(task_scheduler)
    if progress is not None and not isinstance(progress, TuneProgress):
        if not callable(progress):
            raise TensortuneError(f"{progress!r}: expected a TuneProgress, or a function called "
                                  "with (index, task, records, result) after each batch",
                                  param="progress")  # fmt: skip
        progress = _BatchCallback(progress)
    farm = None
    if isinstance(runner, str):
        from tensortune.measure.rpc import runner_from

        # The farm's servers time the candidates: records carry their hardware, not ours.
        with about("runner"):
            farm, plan.platform = runner_from(runner, plan.platform, timing)
        runner = farm
    try:
        with interruptible(graceful=True), records_from(records) as store:
            from tensortune.measure.session import MeasureSession
            from tensortune.measure.timing import model_timing

            session = partial(MeasureSession, plan.platform, log_dir=Path(work_dir) / "logs",
                              timing=timing or model_timing(plan.platform),
                              check_correctness=check_correctness,
                              builder=builder, runner=runner)  # fmt: skip
            deadline = None if max_seconds is None else start + max_seconds
            result = _search(store, plan, session, Path(work_dir), task_scheduler, seed,
                             progress, deadline)  # fmt: skip
            result.seconds = time.monotonic() - start
            return result
    finally:
        if farm is not None:
            farm.close()


def _search(store: RecordStore, plan: TunePlan, session: Callable[[], MeasureSession],
            work: Path, task_scheduler: object, seed: int, progress: TuneProgress | None,
            deadline: float | None = None) -> TuneResult:  # fmt: skip
    """Measure what the budget still allows, then summarise every task from the store."""
    from tensortune.search.leases import past_grace
    from tensortune.search.run import run_search

    tasks, platform = plan.tasks, plan.platform
    hw_id = store.register_hardware(platform.hardware)
    run_id = uuid.uuid4().hex[:12]
    wids = [store.workload_id(t.mod, t.name) for t in tasks]
    where = [{"workload_id": w, "hardware_id": hw_id, "target": platform.key} for w in wids]
    done = [store.count(**w) for w in where]
    trials = plan.trials
    if trials is None:
        trials = sum(done) + OPEN_TRIALS_PER_TASK * len(tasks)
    before = sum(done)  # what earlier runs measured; this run's warm start is its own work
    if plan.warm_start is not None:
        _warm_start(store, plan, session, done, trials, deadline)
        done = [store.count(**w) for w in where]
    result = TuneResult(run_id, store.url, platform.target, hw_id, plan.trials, before,
                        strategy=plan.strategy_name, cost_model=plan.cost_model_name,
                        max_seconds=plan.max_seconds,
                        trials_warm_start=sum(done) - before)  # fmt: skip
    if progress is not None:
        progress.start(tasks, trials, sum(done))
        progress.known([_task_result(store, t, w) for t, w in zip(tasks, where, strict=True)])
    cap = plan.max_trials_per_task or trials
    remaining = trials - sum(done)
    # The scheduler's first pass goes in this order, and a budget that cannot give every task
    # a round ends inside it: the kernels that weigh most in the model first (the warm start's
    # order too), not the first ones extracted.
    todo = sorted((i for i, d in enumerate(done) if d < cap), key=lambda i: _work(tasks[i]),
                  reverse=True)  # fmt: skip
    failed: dict[int, str] = {}  # workload id → why its search broke
    # Loading a model or the warm start may spend the whole time budget: then nothing is set
    # up (references built, design spaces and drafts made for every task) to measure nothing.
    expired = deadline is not None and past_grace(deadline, plan.max_seconds or 0.0,
                                                  time.monotonic())  # fmt: skip
    if remaining > 0 and todo and not expired:
        from tensortune.search.leases import SharedBudget

        def on_batch(k: int, batch: list[Record]) -> None:
            if progress is not None:
                i = todo[k]
                progress.batch(i, tasks[i], batch, _task_result(store, tasks[i], where[i]))

        # Other processes may tune the same tasks into the same store: the budget is theirs too.
        budget = SharedBudget(store, wids, hw_id, platform.key, trials, cap, deadline=deadline,
                              span=plan.max_seconds)  # fmt: skip
        # ALT's validity filter counts into the strategy's dict, which outlives this call
        filter_counts = getattr(plan.strategy, "alt_stats", None)
        counts_before = dict(filter_counts or {})
        try:
            with session() as measure:
                measure.add_references([tasks[i] for i in todo])
                run_search(store, [tasks[i] for i in todo], [wids[i] for i in todo], platform,
                           measure, trials=remaining, max_trials_per_task=min(cap, remaining),
                           strategy=plan.strategy, cost_model=plan.cost_model, work_dir=work,
                           trials_per_round=_per_round(plan.trials_per_round, remaining, len(todo),
                                                        timed=deadline is not None),
                           task_scheduler=task_scheduler, seed=seed, run_id=run_id,
                           on_batch=on_batch, budget=budget)  # fmt: skip
        finally:
            budget.close()
        failed, expired = budget.failed, budget.expired
        if getattr(plan.strategy, "validity", 0) and filter_counts is not None:
            result.validity = {k: v - counts_before.get(k, 0) for k, v in filter_counts.items()}
    result.tasks = [_task_result(store, t, w) for t, w in zip(tasks, where, strict=True)]
    # Time ran out only where trials were left (a last round that crossed the deadline may
    # have spent the trial budget), and not for a task whose search broke: its error stopped
    # it, not the clock.
    counts = [t.trials for t in result.tasks]
    result.out_of_time = expired and sum(counts) < trials and any(
        c < cap for c, w in zip(counts, wids, strict=True) if w not in failed)  # fmt: skip
    for r, wid, w in zip(result.tasks, wids, where, strict=True):
        r.error = failed.get(wid, "")
        if r.trials and not r.ok:  # a task whose every program failed says why
            r.failure = _failure(store, w)
    return result


def _warm_start(store: RecordStore, plan: TunePlan, session: Callable[[], MeasureSession],
                done: list[int], trials: int, deadline: float | None) -> None:  # fmt: skip
    """Time transferred schedules of the tasks the store holds nothing of yet, within half of
    the budget and before the ``deadline``, so the search starts from them."""
    from tensortune.transfer.run import transfer_tasks

    # The kernels that weigh most in the model first: the deadline, or the room, may end it.
    cold = sorted((t for t, d in zip(plan.tasks, done, strict=True) if d == 0), key=_work,
                  reverse=True)  # fmt: skip
    room = (trials - sum(done)) // 2
    if not cold or room < 1:
        return
    if room < len(cold):  # not one schedule each
        import warnings

        warnings.warn(f"tensortune: the warm start times transferred schedules for {room} of "
                      f"the {len(cold)} tasks not tuned yet (half of the trials left), those "
                      "that weigh most; more trials would start them all",
                      stacklevel=2)  # fmt: skip
        cold = cold[:room]
    per_kernel = min(plan.warm_per_kernel, room // len(cold), plan.max_trials_per_task or room)
    if deadline is not None:  # half of the time too: under --time alone, trials hold nothing
        deadline = time.monotonic() + max(0.0, deadline - time.monotonic()) / 2
    with session() as measure:
        transfer_tasks(store, cold, plan.platform, measure, plan.warm_start,
                       per_kernel=per_kernel, untuned=False, deadline=deadline)  # fmt: skip


def _work(task: Task) -> tuple[float, int]:
    """How much a task weighs in its model: its operations times its occurrences, then its
    occurrences (a task whose operations TVM cannot count has 0 of them)."""
    return task.weight * (task.flop or 0.0), task.weight


def _per_round(requested: int | None, remaining: int, n_tasks: int, timed: bool = False) -> int:
    """Candidates per round: as asked, else 64 (MetaSchedule's default; under a time budget
    ``TIMED_TRIALS_PER_ROUND``) but small enough that every task gets a round within the
    trial budget: not below 8 candidates unless the budget is under 8 a task (the scheduler
    hands out first rounds in task order, so rounds of 8 left the last tasks nothing)."""
    largest = TIMED_TRIALS_PER_ROUND if timed else 64
    fair = remaining // n_tasks
    per_round = requested or (min(largest, fair) if fair >= 8 else max(1, fair))
    return max(1, min(per_round, remaining))


def _task_result(store: RecordStore, task: Task, where: dict) -> TaskResult:
    best = next(store.query(**where, ok_only=True, best_first=True, limit=1), None)
    return TaskResult(task.name, task.weight, task.flop, store.count(**where),
                      store.count(**where, ok_only=True), best.cost if best else None)  # fmt: skip


def _failure(store: RecordStore, where: dict) -> str:
    """The most common reason a task's measurements failed, with how many it stopped, as
    ``"3 of 8: [build_error] ..."``."""
    reasons = Counter(last_line(r.error or r.status) for r in store.query(**where))
    if not reasons:
        return ""
    (reason, n), total = reasons.most_common(1)[0], sum(reasons.values())
    return f"{n} of {total}: {reason}"
