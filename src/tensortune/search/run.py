"""One search over a set of tasks: MetaSchedule's task scheduler drives the strategy, the
session's builder and runner measure, and every measured batch goes to the records store.

Tuning and dataset collection both search this way; what differs is which tasks, budget,
strategy and cost model they hand over.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tensortune.errors import TensortuneError, interrupted
from tensortune.records.schema import Record
from tensortune.search.factory import strategy_for_task

if TYPE_CHECKING:
    from tensortune.hardware import Platform
    from tensortune.measure.session import MeasureSession
    from tensortune.records.storage import RecordStore
    from tensortune.search.leases import SharedBudget
    from tensortune.workloads.task import Task

# (index of the task in the list handed over, the batch's records)
OnBatch = Callable[[int, list[Record]], None]
# MetaSchedule's task schedulers by name ("gradient" is ours, committing first rounds at once)
TASK_SCHEDULERS = ("gradient", "round-robin")


def check_task_scheduler(task_scheduler: object) -> None:
    """A one-line error for what MetaSchedule cannot schedule tasks with; it would say so only
    after the store is opened and warm-start schedules timed."""
    from tensortune.compat import ms

    if isinstance(task_scheduler, str):
        if task_scheduler in TASK_SCHEDULERS:
            return
    elif isinstance(task_scheduler, ms.task_scheduler.TaskScheduler):
        return
    raise TensortuneError(f"{task_scheduler!r}: expected {' or '.join(TASK_SCHEDULERS)}, or a "
                          "MetaSchedule TaskScheduler", param="task_scheduler")  # fmt: skip


def run_search(
    store: RecordStore,
    tasks: list[Task],
    workload_ids: list[int],
    platform: Platform,
    session: MeasureSession,
    *,
    trials: int,
    max_trials_per_task: int,
    strategy: object,
    cost_model: object,
    work_dir: Path,
    trials_per_round: int,
    task_scheduler: object = "gradient",
    seed: int = 0,
    run_id: str = "",
    on_batch: OnBatch | None = None,
    budget: SharedBudget | None = None,
) -> None:
    """Measure up to ``trials`` candidates of ``tasks`` (at most ``max_trials_per_task`` each)
    into ``store``; ``strategy`` is a prototype each task gets a clone of, ``cost_model`` a
    MetaSchedule cost model shared by all.  MetaSchedule's logs go to ``work_dir/logs``.
    With ``budget``, the workers sharing ``store`` split it, no candidate measured twice."""
    from tensortune.compat import ms
    from tensortune.records.ms_callback import RecordToStore
    from tensortune.records.ms_database import StoreDatabase
    from tensortune.search.leases import Leased
    from tensortune.search.scheduler import GradientScheduler
    from tensortune.search.space import tune_context

    database = StoreDatabase(store, target=platform, run_id=run_id)

    def task_strategy(wid: int) -> object:
        own = strategy_for_task(strategy, session.builder, database, cost_model)
        return own if budget is None else Leased(own, budget, wid, database=database)

    with _task_loggers(work_dir, [t.name for t in tasks]) as loggers:
        contexts = [
            tune_context(t.mod, platform, seed=seed + i, task_name=t.name, logger=lg,
                         strategy=task_strategy(wid))
            for i, (t, wid, lg) in enumerate(zip(tasks, workload_ids, loggers, strict=True))
        ]  # fmt: skip
        callbacks = [
            RecordToStore(store, workload_ids=workload_ids, hardware_id=platform.hardware.id,
                          target=platform.key, run_id=run_id, on_batch=on_batch),
            ms.measure_callback.RemoveBuildArtifact(),
            ms.measure_callback.UpdateCostModel(),
        ]  # fmt: skip
        if task_scheduler == "gradient":  # MetaSchedule's rule, each first round committed at once
            task_scheduler = GradientScheduler(seed=seed)
        if isinstance(task_scheduler, GradientScheduler):  # given as an object too: it must listen
            callbacks.append(task_scheduler.callback())
        try:
            ms.tune_tasks(
                tasks=contexts,
                task_weights=[float(t.weight) for t in tasks],
                work_dir=str(work_dir),
                max_trials_global=trials,
                max_trials_per_task=max_trials_per_task,
                num_trials_per_iter=trials_per_round,
                builder=session.builder,
                runner=session.runner,
                database=database,
                cost_model=cost_model,
                measure_callbacks=callbacks,
                task_scheduler=task_scheduler,
            )

        except Exception:
            if interrupted():  # Ctrl-C, which TVM hands back as a RuntimeError
                raise KeyboardInterrupt from None
            # An error of ours inside a callback reached here as TVM's RuntimeError: raise ours.
            ours = (callbacks[0].error or (budget.error if budget is not None else None)
                    or database.error)  # fmt: skip
            if ours is not None:
                raise ours from None
            raise


@contextlib.contextmanager
def _task_loggers(work: Path, names: list[str]) -> Iterator[list[logging.Logger]]:
    """MetaSchedule's per-task file loggers under ``work/logs``, named and written as its own
    ``get_loggers_from_work_dir`` names and writes them (file names with only letters, digits,
    ``.``, ``-`` and ``_``), and its scheduler's log beside them; console copies only of
    warnings (our own progress lines say the rest).

    Made here, not by MetaSchedule's function: that one runs ``logging.config.dictConfig``,
    which closes every handler of the process (a notebook's log file opened with mode "w"
    lost every line after the first tune), and its files stayed open after the run.  Within
    the block the handlers exist; after it they are removed and closed, and the loggers'
    settings restored."""
    log_dir = work / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter("%(asctime)s [%(levelname)s] %(message)s", "%Y-%m-%d %H:%M:%S")
    base = "tvm.s_tir.meta_schedule.logging"  # MetaSchedule's module, its loggers' prefix
    width = len(str(len(names) - 1))
    added: list[tuple[logging.Logger, logging.Handler]] = []
    saved: list[tuple[logging.Logger, int, bool]] = []

    def own(logger: logging.Logger, *handlers: logging.Handler) -> logging.Logger:
        saved.append((logger, logger.level, logger.propagate))
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        for h in handlers:
            h.setFormatter(fmt)
            logger.addHandler(h)
            added.append((logger, h))
        return logger

    top = logging.getLogger("tvm.s_tir.meta_schedule")
    console = logging.StreamHandler(sys.stderr)  # stdout is for results (``--json``)
    console.setLevel(logging.WARNING)
    own(top, console, logging.FileHandler(log_dir / f"{base}.task_scheduler.log"))
    try:
        loggers = []
        for i, name in enumerate(names):
            logger_name = f"{base}.task_{i:0{width}d}_{file_safe(name)[:100]}"
            loggers.append(own(logging.getLogger(logger_name),
                               logging.FileHandler(log_dir / f"{logger_name}.log")))  # fmt: skip
        yield loggers
    finally:
        for logger, handler in added:
            logger.removeHandler(handler)
            handler.close()
        for logger, level, propagate in reversed(saved):
            logger.setLevel(level)
            logger.propagate = propagate


def file_safe(name: str) -> str:
    """``name`` with every character but letters, digits, ``.``, ``-`` and ``_`` replaced by
    ``_`` (``matmul:64,64,64`` → ``matmul_64_64_64``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)
