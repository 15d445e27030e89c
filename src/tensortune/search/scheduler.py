"""MetaSchedule's gradient task scheduler, collecting each task's first round at once.

Which task gets the next round is decided as MetaSchedule's ``GradientBased`` decides it
(Ansor's rule, as TVM 0.27 implements it): every task gets one round, then the task whose
weighted gradient of its best latency is largest, ``alpha`` · (improvement over the last
``window_size`` rounds, per round) + (1 − ``alpha``) · (best latency / rounds so far), times
the task's weight; a task with no valid latency yet gets −1e9; ties are drawn at random.

Two things differ.  A task whose rounds have all failed (every candidate timed out, or did not
build) gets up to ``UNJUDGED_ROUNDS`` rounds before that −1e9 leaves it behind: MetaSchedule
gives it none after its first, while any other task is alive, so one unlucky first round
(large unrolls on a tight timeout, ALT's validity filter not yet trained) left the task
untuned for the whole run.

The other is when a round is collected.  MetaSchedule's version collects no round of its
first pass before every task has had one, so a run killed in that pass (for a network of
dozens of tasks, minutes of measurement) loses all of it, and the budget of several tuners
sharing a store is judged without it.  Here each round of the first pass is collected as soon
as it is measured (``TouchTask``: at once with our runner, which returns finished futures;
a remote runner's pending futures are left to finish as before), so its records are committed
before the next task is drafted (benchmarks/RESULTS.md, stop 54).
"""

from __future__ import annotations

import math

import numpy as np

from tensortune.compat import PyMeasureCallback, PyTaskScheduler, derived_object
from tensortune.measure.status import run_seconds

INVALID_MS = 1e9  # MetaSchedule's latency for a failed candidate
# Rounds a task gets while every one of them failed, before it is left behind (module docstring).
UNJUDGED_ROUNDS = 3


def pick_task(history: list[list[float]], weights: list[float], alive: list[int], *,
              alpha: float, window: int, rng: np.random.Generator) -> int:  # fmt: skip
    """The task to tune next among ``alive``, from each task's best latency after each of its
    rounds (``history``, in ms): one whose rounds have all failed while it has had fewer than
    ``UNJUDGED_ROUNDS``, else the largest weighted gradient; a random one on a tie."""
    grads = []
    for i in alive:
        best = history[i]
        n = len(best)
        if n and best[-1] < INVALID_MS:
            g1 = (best[-1 - window] - best[-1]) / window if n >= 1 + window else 0.0
            g2 = best[-1] / n
            grads.append((alpha * g1 + (1 - alpha) * g2) * weights[i])
        elif 0 < n < UNJUDGED_ROUNDS:  # only failures so far: another round, first
            grads.append(math.inf)
        else:  # nothing valid in its rounds: the task cannot be judged
            grads.append(-1e9)
    top = max(grads)
    best = [i for i, g in zip(alive, grads, strict=True) if g == top]
    return best[int(rng.integers(len(best)))] if len(best) > 1 else best[0]


@derived_object
class GradientScheduler(PyTaskScheduler):
    """``GradientBased`` (module docstring), with the first pass's rounds collected at once.

    Give ``ms.tune_tasks`` its ``callback()`` among the measure callbacks: that is how it
    learns each round's latencies (MetaSchedule keeps them where Python cannot read them)."""

    def __init__(self, alpha: float = 0.2, window_size: int = 3, seed: int = 0) -> None:
        super().__init__()
        self.alpha = alpha
        self.window_size = window_size
        self.seed = seed
        self._start()

    def _start(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.history: list[list[float]] = []  # per task: its best latency after each round
        self._first_pass = 0  # tasks handed their first round so far

    def callback(self) -> object:
        """The measure callback of one run, which starts the scheduler afresh: one object may
        serve several runs (``tune(task_scheduler=...)``), each numbering its tasks from 0,
        and the last run's history would steer this one.  (Overriding ``tune`` cannot do it:
        TVM 0.27 then never reaches its own loop.)"""
        self._start()
        return _Latencies(self)

    def _grow(self, n: int) -> None:
        self.history += [[] for _ in range(n - len(self.history))]

    def observe(self, task_id: int, latencies_ms: list[float]) -> None:
        """One collected round of ``task_id``: what the gradient reads."""
        self._grow(task_id + 1)
        if latencies_ms:
            best = self.history[task_id]
            best.append(min(best[-1] if best else INVALID_MS, *latencies_ms))

    def next_task_id(self) -> int:
        outer = self._outer()
        tasks = list(outer.tasks_)  # live views: their fields follow the scheduler's state
        n = len(tasks)
        self._grow(n)
        if self._first_pass < n:
            if self._first_pass:  # the previous task's round, measured: commit it now
                outer.touch_task(self._first_pass - 1)
            self._first_pass += 1
            return self._first_pass - 1
        if self._first_pass == n:
            for i, task in enumerate(tasks):
                if task.runner_futures is not None:
                    outer.join_running_task(i)
            self._first_pass += 1
        alive = []
        for i, task in enumerate(tasks):
            outer.touch_task(i)
            if not task.is_terminated:
                alive.append(i)
        if not alive:
            return -1
        weights = [float(t.task_weight) for t in tasks]
        task_id = pick_task(self.history, weights, alive, alpha=self.alpha,
                            window=self.window_size, rng=self.rng)  # fmt: skip
        if tasks[task_id].runner_futures is not None:
            outer.join_running_task(task_id)
        return task_id


@derived_object
class _Latencies(PyMeasureCallback):
    """Hands each collected round's latencies to its ``GradientScheduler``, in ms as
    MetaSchedule counts them (the median of the repeats; a build or run error: 1e9)."""

    def __init__(self, scheduler: object) -> None:
        super().__init__()
        self.scheduler = scheduler

    def apply(self, task_scheduler, task_id: int, measure_candidates, builder_results,
              runner_results) -> None:  # fmt: skip
        latencies = []
        for built, ran in zip(builder_results, runner_results, strict=True):
            # A time of 0 is no measurement (the store keeps it as a failure): as a task's
            # best it would score the task below every other, never to be picked again.
            cost = run_seconds(ran.run_secs) if built.error_msg is None and (
                ran.error_msg is None) else math.inf  # fmt: skip
            latencies.append(cost * 1e3 if math.isfinite(cost) else INVALID_MS)
        self.scheduler.observe(int(task_id), latencies)
