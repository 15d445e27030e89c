"""Several workers, one budget: tuners and collectors that share a records store split its
budget and never measure the same candidate twice.

Resuming already counts what the store holds; leases (``RecordStore.claim``) add what the other
workers are measuring right now.  Before a batch is measured, :class:`Leased` claims its
candidates and keeps only those it got, up to what the shared budget still allows; the
transaction that commits their records ends the leases.  A worker that dies leaves leases that
expire by the database's clock after ``seconds`` or ``LEASE_SECONDS_PER_CANDIDATE`` per
candidate of their batch, whichever is longer; on its own machine a rerun frees them at once
(the process that held them is gone), so a killed run loses at most the batch it had in flight
(with ``search/scheduler.py``'s task scheduler, which commits each round as soon as it is timed).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tensortune.compat import PySearchStrategy, derived_object
from tensortune.errors import RecordsError, TensortuneError, interrupted, last_line
from tensortune.hardware.fingerprint import pid_scope
from tensortune.records.convert import trace_text
from tensortune.records.schema import trace_hash
from tensortune.records.storage import ClaimBudget, RecordStore
from tensortune.search.factory import copy_of

_log = logging.getLogger(__name__)

# How long a claim lasts: longer than its batch takes to build and run (each candidate at
# most the builder's and the runner's time limits), short enough that the budget a dead worker
# on another machine held comes back in well under an hour (16 candidates: 27 minutes).
LEASE_SECONDS = 600.0
LEASE_SECONDS_PER_CANDIDATE = 100.0
# How often a worker looks for holders on this machine that have died (a query and a process
# lookup per holder).
SWEEP_SECONDS = 5.0
# How many times its own budget a wrapped strategy may draw, batches that others had measured
# included.
RETRY_SLACK = 16
INT32_MAX = 2**31 - 1  # MetaSchedule counts a task's trials in a 32-bit integer
# Under a time budget, while some tasks have no measurement yet, a round takes no more than its
# task's share of what half the time left affords: a task left out runs untuned code in the
# model, tens of times slower than any tuned program (resnet18 after 5 minutes on a 2-core Xeon
# that measures half as fast as the Zen 5: 2 of 19 tasks left out, the model 4x slower than
# PyTorch eager; shares of all the time left still left one out, the later tasks' candidates
# taking 2-4x the average's time to build; benchmarks/RESULTS.md, stop 56).  A share never
# falls below MIN_FIRST_ROUND candidates, and a task with none measured may still take that
# many for FIRST_ROUND_GRACE of the budget past its end.
FIRST_PASS_SHARE = 0.5
MIN_FIRST_ROUND = 4
FIRST_ROUND_GRACE = 0.1


def past_grace(deadline: float, span: float, now: float) -> bool:
    """Whether ``now`` is past ``deadline`` by more than ``FIRST_ROUND_GRACE`` of the time
    budget ``span``: not even a first round is started then."""
    return now >= deadline + FIRST_ROUND_GRACE * span


# How often a worker whose task has nothing left only because others hold leases looks again
# (at first; then less and less often), and how long it may wait in all, over its run.
WAIT_POLL_SECONDS = 1.0
WAIT_POLL_MAX_SECONDS = 10.0
MAX_WAIT_SECONDS = 600.0


def candidate_hash(candidate) -> str:
    """The name leases give a measure candidate: its trace's hash, as its record will have."""
    return trace_hash(trace_text(candidate.sch.trace))


def lease_seconds(candidates: int, at_least: float = LEASE_SECONDS) -> float:
    """How long a lease of a batch of ``candidates`` lasts: long enough for the batch at its
    slowest, for an expired lease lets another worker measure the same candidates again."""
    return max(at_least, candidates * LEASE_SECONDS_PER_CANDIDATE)


def worker_name() -> str:
    """This process, as leases name it: machine, pid and the process's start time (a pid is
    reused; a pid with its start time is not).  The last field says the start is in ticks
    since boot: earlier versions' names have four fields, their start in ms since the epoch,
    and each version reads the other's as alive (a mix on one machine must not free each
    other's leases at every sweep)."""
    return f"{_machine()}/{os.getpid()}/{_started(os.getpid())}/{uuid.uuid4().hex[:6]}/t"


def _started(pid: int) -> int:
    """When ``pid`` started, on a clock the wall clock's steps do not move: Linux's clock
    ticks since boot.  psutil's start time is those ticks plus the boot time, which it derives
    from the wall clock each time: after an NTP step or a VM's resume, every live worker
    looked like another process, and its leases were freed every sweep."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            raise psutil.NoSuchProcess(pid) from None
        return int(psutil.Process(pid).create_time() * 1000)  # no procfs: not Linux
    return _start_field(stat)


def _start_field(stat: str) -> int:
    """Field 22 of a ``/proc/PID/stat`` line, the start in ticks since boot; the command name
    before it, in parentheses, may hold spaces and parentheses of its own."""
    return int(stat.rsplit(")", 1)[1].split()[19])


@functools.cache
def _machine() -> str:
    """Where this process's pids mean something: the host name, and (on Linux) the boot and
    the pid namespace.  Two containers or VMs may share a host name; each sees the other's
    pids as gone, and must not free the leases of a tuner that still measures."""
    host = socket.gethostname().replace("/", "_")
    scope = pid_scope()
    return host if scope is None else f"{host}:{scope}"


def _gone(worker: str) -> bool:
    """True when ``worker`` ran where this process runs (``_machine``) and no longer runs."""
    parts = worker.split("/")
    if len(parts) != 5 or parts[4] != "t" or parts[0] != _machine():
        return False  # elsewhere, or named by an earlier version: only its expiry frees it
    try:
        pid, started = int(parts[1]), int(parts[2])
        return _started(pid) != started
    except (ValueError, psutil.NoSuchProcess):
        return True
    except (psutil.Error, OSError):  # not ours to inspect: assume it lives
        return False


def release_the_dead(store: RecordStore, worker: str) -> None:
    """Free the leases of holders on this machine other than ``worker`` that have died (a
    tuner or collector killed before): theirs would hold candidates until they expire."""
    for other in store.lease_holders():
        if other != worker and _gone(other):
            store.release(other)


@dataclass
class SharedBudget:
    """``total`` measurements of ``workload_ids`` on one hardware/target, at most ``per_task``
    of any one, counted over every worker of ``store``."""

    store: RecordStore
    workload_ids: Sequence[int]
    hardware_id: str
    target: str
    total: int
    per_task: int
    worker: str = field(default_factory=worker_name)
    seconds: float = LEASE_SECONDS
    # ``time.monotonic()`` after which nothing more may be drawn: a time budget (None: none).
    deadline: float | None = None
    # The time budget's length in seconds, of which the grace is a share (None: from this
    # budget's making to the deadline; a tuner makes it after its warm start has spent some).
    span: float | None = None
    # Seconds this worker may wait, over its run, for leases others hold (``wait_for_others``).
    max_wait_s: float = MAX_WAIT_SECONDS

    def __post_init__(self) -> None:
        # What stopped a lease (the store's error), for the caller to re-raise: TVM turns an
        # exception raised inside a search strategy into a plain RuntimeError.
        self.error: Exception | None = None
        # Tasks whose search broke (workload id → the error's line): they stop, the others go on.
        self.failed: dict[int, str] = {}
        self._swept = -math.inf
        self._sweep()
        # Tasks whose search ended (broke, or its strategy had nothing more): none waits on them.
        self.ended: set[int] = set()
        # This worker's pace (seconds per candidate measured, drafting and building included),
        # clocked from its first draw: setting up the session is not measuring.
        self._created, self._started, self._measured = time.monotonic(), None, 0
        self._wait_left = self.max_wait_s  # of the run's allowance for ``wait_for_others``
        # Checked again as each claim is made: ``left`` was read before the round was drafted.
        self._caps = ClaimBudget(tuple(self.workload_ids), self.total, self.per_task)

    def _sweep(self) -> None:
        """Free the leases of holders on this machine that have died: a tuner killed beside
        this one would otherwise hold its share of the budget until its leases expire."""
        now = time.monotonic()
        if now - self._swept < SWEEP_SECONDS:
            return
        self._swept = now
        release_the_dead(self.store, self.worker)

    @property
    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def _in_grace(self) -> bool:
        """Past the deadline by no more than ``FIRST_ROUND_GRACE`` of the budget."""
        assert self.deadline is not None
        span = self.span if self.span is not None else self.deadline - self._created
        return not past_grace(self.deadline, span, time.monotonic())

    def left(self, workload_id: int) -> int:
        """How many more of ``workload_id`` this worker may measure now."""
        if self._started is None:
            self._started = time.monotonic()
        if self.expired and not self._in_grace():
            return 0
        self._sweep()
        key = {"hardware_id": self.hardware_id, "target": self.target}
        done = self.store.counts(self.workload_ids, **key)
        # Every live lease, ours included: under a scheduler that collects rounds late
        # (MetaSchedule's gradient scheduler in its first pass, a remote runner's pending
        # futures) this worker holds other tasks' rounds, measured but not yet committed.
        held = self.store.leased(self.workload_ids, **key)
        overall = self.total - sum(done.values()) - sum(held.values())
        task = self.per_task - done.get(workload_id, 0) - held.get(workload_id, 0)
        if self.expired:  # in the grace: only a task with nothing measured, a minimal round
            if done.get(workload_id) or held.get(workload_id):
                return 0
            task = min(task, MIN_FIRST_ROUND)
        return max(0, min(overall, task, self._time_share(workload_id, done, held)))

    def wait_for_others(self, workload_id: int, poll_s: float = WAIT_POLL_SECONDS) -> None:
        """Wait while the run's budget has nothing left for ``workload_id`` only because other
        workers hold leases: measured, those spend it; handed back (that worker was stopped),
        they come back to this one, whose task would otherwise have ended for good.

        Not when the task's own cap is what holds it back (other tasks may have budget: the
        task ends and the worker goes on), nor while this worker holds leases itself (its own
        late rounds: two workers could wait on each other), past the deadline or once
        interrupted; and ``max_wait_s`` in all over the run (a worker that died on another
        machine holds its leases until they expire: hours for a large batch)."""
        noticed = False
        while self._wait_left > 0 and not interrupted():
            start = time.monotonic()
            held = self._held_back_by_others(workload_id)
            if not held:
                return
            if not noticed:
                _log.warning("waiting for %d candidates that other workers have leased (the "
                             "budget they spend, or hand back if stopped); %.0f s at most",
                             held, self._wait_left)  # fmt: skip
                noticed = True
            time.sleep(min(poll_s, self._wait_left))
            poll_s = min(poll_s * 1.5, WAIT_POLL_MAX_SECONDS)  # a shared database: fewer polls
            self._wait_left -= time.monotonic() - start

    def _held_back_by_others(self, workload_id: int) -> int:
        """The candidates other workers hold that alone keep ``workload_id`` from the budget
        (0: not so)."""
        if self.expired:
            return 0
        self._sweep()
        key = {"hardware_id": self.hardware_id, "target": self.target}
        others = self.store.leased(self.workload_ids, worker=self.worker, **key)
        if not others or self.store.leased(self.workload_ids, **key) != others:
            return 0
        done = self.store.counts(self.workload_ids, **key)
        # the run's budget all leased, and this task's cap not all measured: when only the
        # task's cap is leased, other tasks have budget left, and this task ends
        free = self.total - sum(done.values())
        held = sum(others.values())
        return held if 0 < free <= held and self.per_task > done.get(workload_id, 0) else 0

    def measured(self, count: int) -> None:
        """``count`` more candidates measured by this worker: its pace."""
        self._measured += count

    def _time_share(self, workload_id: int, done: dict[int, int], held: dict[int, int]) -> int:
        """Under a deadline, while tasks wait for their first measurement: this task's even
        share, with theirs, of the candidates ``FIRST_PASS_SHARE`` of the time left affords at
        this worker's pace so far (``MIN_FIRST_ROUND`` at least); otherwise no limit."""
        waiting = {w for w in self.workload_ids
                   if not done.get(w) and not held.get(w) and w not in self.ended}  # fmt: skip
        if self.deadline is None or not self._measured or not waiting - {workload_id}:
            return self.total
        now = time.monotonic()
        assert self._started is not None
        pace = max(now - self._started, 1e-3) / self._measured  # a coarse clock: not 0
        affords = FIRST_PASS_SHARE * max(0.0, self.deadline - now) / pace
        return max(MIN_FIRST_ROUND, int(affords / len(waiting | {workload_id})))

    def claim(self, workload_id: int, hashes: Sequence[str], limit: int) -> set[str]:
        """Lease up to ``limit`` of ``hashes``, in their order; the ones leased."""
        held: set[str] = set()
        pos = 0
        while len(held) < limit and pos < len(hashes):
            take = list(hashes[pos : pos + limit - len(held)])
            pos += len(take)
            seconds = lease_seconds(len(take), self.seconds)
            held.update(self.store.claim(workload_id, self.hardware_id, self.target, take,
                                         worker=self.worker, seconds=seconds,
                                         budget=self._caps))  # fmt: skip
        return held

    def close(self) -> None:
        """End the leases left (candidates drawn but never measured).  Where the store cannot
        take the write (the error that stopped the run, say) they expire by themselves."""
        with contextlib.suppress(RecordsError):
            self.store.release(self.worker)


@derived_object
class Leased(PySearchStrategy):
    """``inner``'s candidates, less those measured or leased by other workers, and no more
    than ``budget`` allows; ``inner`` is asked again (``tries`` times) when none is left."""

    def __init__(self, inner: object, budget: SharedBudget, workload_id: int,
                 tries: int = 16, database: object | None = None) -> None:  # fmt: skip
        super().__init__()
        self.inner = inner
        self.budget = budget
        self.workload_id = workload_id
        self.tries = tries
        self.database = database  # a StoreDatabase: its store's errors end the run

    @property
    def sampling_threads(self) -> int | str:
        """The threads ``inner`` samples on (``space.tune_context`` reads them)."""
        return getattr(self.inner, "sampling_threads", "physical")

    def _initialize_with_tune_context(self, context) -> None:
        self.inner._initialize_with_tune_context(context)

    def pre_tuning(self, max_trials: int, num_trials_per_iter: int, design_spaces, database=None,
                   cost_model=None) -> None:  # fmt: skip
        # MetaSchedule's strategies count a batch we dropped (others measured it) as trials
        # spent; the task's own limit is kept here, the inner one only bounds the retries.
        self.max_trials, self.trials = max_trials, 0
        self.inner.pre_tuning(min(max_trials * RETRY_SLACK, INT32_MAX), num_trials_per_iter,
                              design_spaces, database, cost_model)  # fmt: skip

    def post_tuning(self) -> None:
        self.inner.post_tuning()

    def generate_measure_candidates(self):
        try:
            return self._generate()
        except Exception as e:
            self.budget.error = e
            raise

    def _generate(self):
        cands = self._draw()
        if cands is None:  # MetaSchedule ends this task's search for good
            self.budget.ended.add(self.workload_id)
        return cands

    def _draw(self):
        if interrupted():  # Ctrl-C: no more candidates; the batch in flight is recorded
            return None
        for _ in range(self.tries):
            left = min(self.budget.left(self.workload_id), self.max_trials - self.trials)
            if left <= 0 and self.max_trials > self.trials:
                self.budget.wait_for_others(self.workload_id)
                left = min(self.budget.left(self.workload_id), self.max_trials - self.trials)
            if left <= 0:
                return None
            if hasattr(self.inner, "limit_round"):  # ours: picks no more than it may keep
                self.inner.limit_round(left)
            try:
                cands = self.inner.generate_measure_candidates()
            except TensortuneError:
                raise
            except Exception as e:
                if interrupted():  # Ctrl-C, which TVM hands back as a RuntimeError
                    raise KeyboardInterrupt from None
                broken = getattr(self.database, "error", None)
                if broken is not None:  # the store failed under the search: every task would
                    raise broken from None
                # TVM's search failing on one task (a schedule rule meeting a kernel it
                # mishandles) must not end a run of many: that task stops, with its error.
                self.budget.failed[self.workload_id] = f"{type(e).__name__}: {last_line(e)}"
                return None
            if cands is None:
                return None
            hashes = [candidate_hash(c) for c in cands]
            held = self.budget.claim(self.workload_id, hashes, left)
            picked, seen = [], set()
            for c, h in zip(cands, hashes, strict=True):
                if h in held and h not in seen:
                    seen.add(h)
                    picked.append(c)
            if picked:
                return picked
            self.inner.notify_runner_results([], [])  # that whole batch was someone else's
        return None

    def notify_runner_results(self, measure_candidates, results) -> None:
        self.trials += len(results)
        self.budget.measured(len(results))
        self.inner.notify_runner_results(measure_candidates, results)

    def copy(self) -> Leased:
        """See ``DraftThenVerify.copy``."""
        return Leased(copy_of(self.inner), self.budget, self.workload_id, self.tries,
                      self.database)  # fmt: skip

    def clone(self) -> Leased:
        return self.copy()
