"""A MetaSchedule ``Runner`` that times candidates one at a time in a persistent process."""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass

from tensortune.compat import (
    PyRunner,
    RunnerFuture,
    RunnerInput,
    closed_on_exit,
    derived_object,
    ms,
    tvm,
)
from tensortune.errors import TensortuneError
from tensortune.hardware import Platform
from tensortune.measure.pool import WorkerPool
from tensortune.measure.status import Status, tagged
from tensortune.measure.worker import Signature

_log = logging.getLogger("tensortune.measure")
# Retries of a contended timing end by this share of the time limit: a candidate that only
# met a busy machine keeps its fastest timing rather than being killed as a timeout.
RETRY_SHARE = 0.5


@dataclass(frozen=True)
class TimingConfig:
    """How each candidate is timed by TVM's time evaluator.

    ``repeat`` timings are kept (all of them are stored; reports use their median).  Each
    timing runs the kernel ``number`` times, raised until one timing lasts ``min_repeat_ms``.
    ``cache_flush`` evicts the arguments from the CPU caches before each timing.
    ``cold_bytes``: a kernel whose arguments after the first (its weights, in a network) take
    more bytes than this is timed cold, one call per timing after evicting them, however
    ``cache_flush`` is set.  Inside a model such weights arrive from memory, not from the
    cache the previous call left them in, and which schedule streams them best changes with
    that (resnet18's 3x3x512x512 convolutions ran 27% faster in the model when tuned cold;
    ``model_timing`` is what tuning uses).  MetaSchedule's RPC runner, which times on a
    farm, applies ``cache_flush`` to every kernel and ignores this.
    A candidate timed while runnable tasks waited for a CPU more than ``max_wait_share`` of
    the time (another process competing with the kernel's threads) is timed again, up to
    ``retries`` times, after a short pause; the clean timing is kept, else the fastest.
    """

    number: int = 1
    repeat: int = 5
    min_repeat_ms: int = 10
    cache_flush: bool = False
    max_wait_share: float = 0.1
    retries: int = 3
    cold_bytes: int | None = None
    cold_repeat: int = 10

    def __post_init__(self) -> None:
        # A repeat of 0 would record every candidate as failed, and count it toward the budget.
        for name, least in (("number", 1), ("repeat", 1), ("min_repeat_ms", 0), ("retries", 0),
                            ("cold_repeat", 1), ("cold_bytes", 0)):  # fmt: skip
            value = getattr(self, name)
            if value is None and name == "cold_bytes":
                continue
            if type(value) is not int or value < least:
                raise TensortuneError(f"TimingConfig.{name} must be a whole number of at least "
                                      f"{least}, not {value!r}", param="timing")  # fmt: skip
        if not 0 <= self.max_wait_share <= 1:
            raise TensortuneError(f"TimingConfig.max_wait_share must be from 0 to 1, not "
                                  f"{self.max_wait_share!r}", param="timing")  # fmt: skip

    def for_signature(self, signature: Signature) -> tuple[int, int, int, bool]:
        """``number``, ``repeat``, ``min_repeat_ms`` and ``cache_flush`` for one kernel."""
        if self.cold_bytes is not None and weight_bytes(signature) > self.cold_bytes:
            return 1, max(self.repeat, self.cold_repeat), 0, True
        return self.number, self.repeat, self.min_repeat_ms, self.cache_flush


def model_timing(platform: Platform) -> TimingConfig:
    """How tuning times candidates unless told otherwise: hot, except kernels whose arguments
    after the first (weights, and outputs too: a large output counts, even with no weight)
    outgrow the L2 caches of the cores they run on (1 MiB a core where the machine does not
    say), which inside a model read and write them in memory."""
    return TimingConfig(cold_bytes=platform.hardware.caches.get("L2", 1 << 20) * platform.threads)


def signature_of(args_info: list) -> Signature:
    return [(str(a.dtype), [int(d) for d in a.shape]) for a in args_info]


def weight_bytes(signature: Signature) -> int:
    """Bytes of a kernel's arguments after the first: what a cold timing evicts."""
    return sum(math.prod(shape) * tvm.DataType(dtype).itemsize for dtype, shape in signature[1:])


@closed_on_exit
@derived_object
class PersistentRunner(PyRunner):
    """Runs candidates serially: two kernels timed at once on two cores corrupt both timings.

    The worker's TVM thread pool is sized by ``num_threads`` (``TVM_NUM_THREADS``), which must
    match the target's ``num-cores``.  With ``check_correctness``, each candidate's output is
    compared with a reference build of its workload registered by :meth:`add_reference`.
    """

    def __init__(
        self,
        timing: TimingConfig | None = None,
        *,
        num_threads: int | None = None,
        timeout_s: float = 30.0,
        check_correctness: bool = False,
        log_path: str | None = None,
    ) -> None:
        super().__init__()
        self.timing = timing or TimingConfig()
        self.num_threads = num_threads or len(os.sched_getaffinity(0))
        self.timeout_s = timeout_s
        self.check_correctness = check_correctness
        self._pool = WorkerPool(1, {"TVM_NUM_THREADS": str(self.num_threads)}, log_path, reuse=True)
        self._pool.start()
        self._references: dict[str, str | None] = {}  # signature text -> library (None: ambiguous)
        self.seconds = 0.0  # wall time spent running, for benchmarks' breakdowns
        self.contended = 0  # candidates whose every timing competed for the CPU
        self.last_contended: list[bool] = []  # per input of the latest ``run``

    def add_reference(self, signature: Signature, library: str) -> None:
        """Register an unscheduled build of a workload as the reference for its signature.

        Two workloads with the same argument signature make the check ambiguous, so it is
        skipped for that signature rather than compared against the wrong reference.
        """
        key = repr(signature)
        self._references[key] = library if key not in self._references else None

    def run(self, runner_inputs: list[RunnerInput]) -> list[RunnerFuture]:
        t = self.timing
        jobs = []
        for ri in runner_inputs:
            sig = signature_of(ri.args_info)
            ref = self._references.get(repr(sig)) if self.check_correctness else None
            jobs.append((ri.artifact_path, sig, *t.for_signature(sig), ref, t.max_wait_share,
                         t.retries, RETRY_SHARE * self.timeout_s))  # fmt: skip
        start = time.perf_counter()
        outcomes = self._pool.map("run", jobs, self.timeout_s)
        self.seconds += time.perf_counter() - start
        self.last_contended = [o.kind == "ok" and bool(o.value.get("contended"))
                               for o in outcomes]  # fmt: skip
        contended = sum(self.last_contended)
        if contended:
            self.contended += contended
            _log.warning("%d of %d candidates were timed while tasks waited for a CPU (another "
                         "process, or more threads than cores) even after %d retries; their "
                         "costs may be inflated", contended, len(outcomes), t.retries)  # fmt: skip
        return [_future(outcome) for outcome in outcomes]

    def wait_ready(self) -> None:
        """Block until the workers are up (benchmarks start their clocks after this)."""
        self._pool.wait_ready()

    def close(self) -> None:
        self._pool.close()


def _future(outcome) -> RunnerFuture:
    done = ms.runner.local_runner.LocalRunnerFuture
    if outcome.kind == "ok":
        if outcome.value["mismatch"]:
            return done(error_message=tagged(Status.WRONG_RESULT, outcome.value["mismatch"]))
        return done(res=outcome.value["costs"])
    if outcome.kind == "timeout":
        return done(error_message=tagged(Status.TIMEOUT, f"run: {outcome.message}"))
    return done(error_message=tagged(Status.RUN_ERROR, f"run: {outcome.message}"))
