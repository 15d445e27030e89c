"""``tensortune.tune``: tune workloads or a model with MetaSchedule, through our measurement and
records store.  Resuming is the default: records already in the store count toward the budget.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tensortune.errors import TensortuneError
from tensortune.hardware import current_hardware, parse_target, runtime_threads, target_key
from tensortune.records.schema import Record
from tensortune.records.storage import DEFAULT_URL, RecordStore, open_records
from tensortune.workloads.task import Task

if TYPE_CHECKING:
    from tensortune.measure.runner import TimingConfig


@dataclass
class TaskResult:
    name: str
    weight: int
    flop: float
    trials: int
    ok: int
    best_seconds: float | None

    @property
    def gflops(self) -> float | None:
        if not self.best_seconds or not self.flop:
            return None
        return self.flop / self.best_seconds / 1e9


@dataclass
class TuneResult:
    run_id: str
    records_url: str
    target: dict
    hardware_id: str
    trials_requested: int
    trials_before: int
    tasks: list[TaskResult] = field(default_factory=list)

    @property
    def trials_total(self) -> int:
        return sum(t.trials for t in self.tasks)


ProgressFn = Callable[[int, Task, list[Record], "TaskResult"], None]


def resolve_tasks(
    workloads: Sequence[str | Task] | None = None,
    *,
    model: object | None = None,
    workloads_from: str | os.PathLike | None = None,
    target: dict | None = None,
) -> list[Task]:
    """The tasks named by operator specs / TVMScript files, a model, or a MetaSchedule database."""
    from tensortune.workloads.sources import task_from_spec, tasks_from_database

    given = sum(x is not None and x != [] for x in (workloads, model, workloads_from))
    if given != 1:
        raise TensortuneError("give exactly one of: workloads, a model, or a workloads directory")
    if workloads:
        return [w if isinstance(w, Task) else task_from_spec(w) for w in workloads]
    if workloads_from is not None:
        return tasks_from_database(workloads_from)
    from tensortune.workloads.models import Model, load_model

    if isinstance(model, Model):
        return model.tasks
    return load_model(model, target=_tvm_target(target or parse_target(None))).tasks


def _tvm_target(target: dict):
    from tensortune.compat import tvm

    return tvm.target.Target(target)


def tune(
    workloads: Sequence[str | Task] | None = None,
    *,
    model: object | None = None,
    workloads_from: str | os.PathLike | None = None,
    trials: int,
    records: str | RecordStore = DEFAULT_URL,
    work_dir: str | os.PathLike = "tensortune-work",
    target: dict | str | None = None,
    strategy: object = "evolutionary",
    cost_model: object = "xgb",
    task_scheduler: object = "gradient",
    trials_per_round: int | None = None,
    max_trials_per_task: int | None = None,
    builder: object | None = None,
    runner: object | None = None,
    timing: TimingConfig | None = None,
    check_correctness: bool = True,
    seed: int = 0,
    progress: ProgressFn | None = None,
    online_cost_model: bool | str = False,
) -> TuneResult:
    """Tune until the store holds ``trials`` measurements of these tasks on this hardware/target.

    ``strategy``, ``cost_model`` and ``task_scheduler`` take MetaSchedule's names or objects
    (ours or TVM's); ``strategy="draft-verify"`` is our draft-then-verify search.
    ``cost_model`` also takes one of our model files, ``"default"`` (the pre-trained model
    shipped for this target) or a fitted ``CostModel``, frozen unless ``online_cost_model``
    (``True``: refined with every measured batch; ``"moa"``: momentum online adaptation of a
    neural model pre-trained on other hardware).  ``builder``/``runner`` default to
    tensortune's persistent-worker ones.
    ``trials_per_round`` defaults to 64, lowered (down to 8) so that each task gets a round.
    """
    if trials <= 0:
        raise TensortuneError("trials must be positive")
    target = parse_target(target)
    if cost_model == "default":  # fail before any work when nothing is shipped for the target
        from tensortune.costmodel.shipped import shipped_model

        cost_model = shipped_model(target)
    tasks = resolve_tasks(workloads, model=model, workloads_from=workloads_from, target=target)
    with contextlib.ExitStack() as cleanup:
        if isinstance(records, str):
            store = open_records(records)
            cleanup.callback(store.close)
        else:
            store = records
        opts = _Options(strategy, cost_model, task_scheduler, trials_per_round,
                        max_trials_per_task, builder, runner, timing, check_correctness, seed,
                        progress, online_cost_model)  # fmt: skip
        return _search(store, tasks, target, trials, Path(work_dir), opts, cleanup)


@dataclass(frozen=True)
class _Options:
    strategy: object
    cost_model: object
    task_scheduler: object
    trials_per_round: int | None
    max_trials_per_task: int | None
    builder: object | None
    runner: object | None
    timing: TimingConfig | None
    check_correctness: bool
    seed: int
    progress: ProgressFn | None
    online: bool | str


def _search(store: RecordStore, tasks: list[Task], target: dict, trials: int, work: Path,
            opts: _Options, cleanup: contextlib.ExitStack) -> TuneResult:  # fmt: skip
    """Measure what the budget still allows, then summarise every task from the store."""
    from tensortune.compat import ms
    from tensortune.measure.builder import PersistentBuilder
    from tensortune.measure.runner import PersistentRunner, signature_of
    from tensortune.records.ms_database import StoreDatabase
    from tensortune.search.space import tune_context
    from tensortune.tuning.callback import RecordToStore

    hardware = current_hardware()
    hw_id = store.register_hardware(hardware)
    tkey = target_key(target)
    run_id = uuid.uuid4().hex[:12]
    wids = [store.workload_id(t.mod, t.name) for t in tasks]
    done = [store.count(workload_id=w, hardware_id=hw_id, target=tkey) for w in wids]
    result = TuneResult(run_id, store.url, target, hw_id, trials, sum(done))

    cap = opts.max_trials_per_task or trials
    remaining = trials - sum(done)
    todo = [i for i, d in enumerate(done) if d < cap]
    if remaining > 0 and todo:
        logs = work / "logs"
        work.mkdir(parents=True, exist_ok=True)
        loggers = _task_loggers(work, [tasks[i].name for i in todo])
        builder, runner = opts.builder, opts.runner
        if builder is None:
            builder = PersistentBuilder(log_path=str(logs / "builder-workers.log"))
            cleanup.callback(builder.close)
        contexts = [
            tune_context(tasks[i].mod, target, seed=opts.seed + i, task_name=tasks[i].name,
                         strategy=_strategy(opts.strategy, builder), logger=lg)
            for i, lg in zip(todo, loggers, strict=True)
        ]  # fmt: skip
        if runner is None:
            runner = PersistentRunner(opts.timing, num_threads=runtime_threads(target),
                                      check_correctness=opts.check_correctness,
                                      log_path=str(logs / "runner-worker.log"))  # fmt: skip
            cleanup.callback(runner.close)
            if opts.check_correctness:
                _add_references(builder, runner, [tasks[i] for i in todo], target, signature_of)

        def on_batch(k: int, batch: list[Record]) -> None:
            if opts.progress is not None:
                i = todo[k]
                opts.progress(i, tasks[i], batch,
                              _task_result(store, tasks[i], wids[i], hw_id, tkey))  # fmt: skip

        callbacks = [
            RecordToStore(store, workload_ids=[wids[i] for i in todo], hardware_id=hw_id,
                          target=tkey, run_id=run_id, on_batch=on_batch),
            ms.measure_callback.RemoveBuildArtifact(),
            ms.measure_callback.UpdateCostModel(),
        ]  # fmt: skip
        ms.tune_tasks(
            tasks=contexts,
            task_weights=[float(tasks[i].weight) for i in todo],
            work_dir=str(work),
            max_trials_global=remaining,
            max_trials_per_task=cap,
            num_trials_per_iter=_per_round(opts.trials_per_round, remaining, len(todo)),
            builder=builder,
            runner=runner,
            database=StoreDatabase(store, hardware=hardware, target=target, run_id=run_id),
            cost_model=_cost_model(opts.cost_model, target, opts.online),
            measure_callbacks=callbacks,
            task_scheduler=opts.task_scheduler,
        )
    result.tasks = [
        _task_result(store, t, w, hw_id, tkey) for t, w in zip(tasks, wids, strict=True)
    ]
    return result


def _per_round(requested: int | None, remaining: int, n_tasks: int) -> int:
    """Candidates per round: as asked, else 64 (MetaSchedule's default) but small enough that
    every task gets a round within the budget (a round never goes below 8 candidates)."""
    per_round = requested or max(8, min(64, remaining // n_tasks))
    return max(1, min(per_round, remaining))


def _task_result(store: RecordStore, task: Task, wid: int, hw_id: str, tkey: str) -> TaskResult:
    where = {"workload_id": wid, "hardware_id": hw_id, "target": tkey}
    best = next(store.query(**where, ok_only=True, best_first=True, limit=1), None)
    return TaskResult(task.name, task.weight, task.flop, store.count(**where),
                      store.count(**where, ok_only=True), best.cost if best else None)  # fmt: skip


def _task_loggers(work: Path, names: list[str]) -> list[logging.Logger]:
    """MetaSchedule's per-task file loggers under ``work/logs``.

    Console copies are turned down to warnings: our own progress lines say the same.
    """
    from tensortune.compat import ms, tvm_logging_guard

    logging.getLogger("tvm.s_tir.meta_schedule").addFilter(_not_log_dir_notice)
    with tvm_logging_guard():
        loggers = ms.logging.get_loggers_from_work_dir(str(work), names)
    _quiet_console()
    return loggers


def _not_log_dir_notice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Logging directory")


def _quiet_console() -> None:
    """MetaSchedule logs every round to stdout as well as to the work dir; keep only the files
    (and warnings) so our own progress lines stay readable."""
    for name, lg in [("", logging.getLogger()), *logging.Logger.manager.loggerDict.items()]:
        if not name.startswith("tvm") or not isinstance(lg, logging.Logger):
            continue
        for h in lg.handlers:
            if type(h) is logging.StreamHandler:
                h.setLevel(logging.WARNING)


def _strategy(strategy: object, builder: object = None) -> object:
    """A fresh strategy for one task; ours may watch what ``builder``'s builds take."""
    from tensortune.compat import ms

    if strategy == "draft-verify":
        from tensortune.search.draft_verify import DraftThenVerify

        return DraftThenVerify()
    if isinstance(strategy, str):
        return ms.search_strategy.SearchStrategy.create(strategy)
    if hasattr(strategy, "watch_builder"):
        strategy.watch_builder(builder)
    return strategy.clone() if hasattr(strategy, "clone") else strategy


def _cost_model(cost_model: object, target: dict, online: bool | str) -> object:
    """MetaSchedule's models by name; ours from a model file, ``default`` (the one shipped for
    this target) or a fitted ``CostModel`` object."""
    from tensortune.compat import ms
    from tensortune.costmodel.base import CostModel

    if isinstance(cost_model, CostModel) or (
        isinstance(cost_model, str) and (cost_model == "default" or Path(cost_model).is_file())
    ):
        from tensortune.costmodel.ms_adapter import LearnedCostModel
        from tensortune.costmodel.shipped import shipped_model

        model = shipped_model(target) if cost_model == "default" else cost_model
        if online == "moa":
            from tensortune.costmodel.moa import MomentumAdapted

            return LearnedCostModel(MomentumAdapted(model), target=target, online=True)
        return LearnedCostModel(model, target=target, online=bool(online))
    if isinstance(cost_model, str):
        if cost_model == "xgb":
            return ms.cost_model.XGBModel(num_tuning_cores=len(os.sched_getaffinity(0)))
        return ms.cost_model.CostModel.create(cost_model)
    return cost_model


def _add_references(builder, runner, tasks: list[Task], target: dict, signature_of) -> None:
    """Build each workload unscheduled once, so the runner can check candidates' outputs."""
    from tensortune.compat import ArgInfo, BuilderInput

    tvm_target = _tvm_target(target)
    built = builder.build([BuilderInput(t.mod, tvm_target) for t in tasks])
    for task, b in zip(tasks, built, strict=True):
        if b.artifact_path:
            runner.add_reference(signature_of(ArgInfo.from_prim_func(task.mod["main"])),
                                 b.artifact_path)  # fmt: skip
