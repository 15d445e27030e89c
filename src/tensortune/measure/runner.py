"""A MetaSchedule ``Runner`` that times candidates one at a time in a persistent process."""

from __future__ import annotations

import logging
import time

from tensortune.compat import (
    PyRunner,
    RunnerFuture,
    RunnerInput,
    closed_on_exit,
    derived_object,
    ms,
)
from tensortune.errors import (
    TensortuneError,
    check_count,
    check_flags,
    check_seconds,
    check_writable,
)
from tensortune.hardware import usable_cores
from tensortune.measure.pool import WorkerPool
from tensortune.measure.status import Status, tagged
from tensortune.measure.timing import TimingConfig
from tensortune.measure.worker import Signature

_log = logging.getLogger("tensortune.measure")
# Retries of a contended timing end by this share of the time limit: a candidate that only
# met a busy machine keeps its fastest timing rather than being killed as a timeout.
RETRY_SHARE = 0.5


# What a ``RunnerInput``'s ``device_type`` says of this machine's CPU: MetaSchedule's task
# scheduler passes the target's kind ("llvm"), tensortune's own flows "cpu".
CPU_DEVICES = ("cpu", "llvm")


def signature_of(args_info: list) -> Signature:
    return [(str(a.dtype), [int(d) for d in a.shape]) for a in args_info]


@closed_on_exit
@derived_object
class PersistentRunner(PyRunner):
    """Runs candidates serially: two kernels timed at once on two cores corrupt both timings.

    The worker's TVM thread pool is sized by ``num_threads`` (``TVM_NUM_THREADS``), which must
    match the target's ``num-cores``.  With ``check_correctness``, each candidate's output is
    compared with a reference build of its workload registered by :meth:`add_reference`.

    It times on this machine's CPU only: a batch for another device (a GPU target's
    ``device_type``) is refused whole, not timed on the CPU; such targets take a runner of
    their device (MetaSchedule's ``RPCRunner`` plugs in the same way).
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
        if timing is not None and not isinstance(timing, TimingConfig):
            raise TensortuneError(f"a TimingConfig, not {timing!r:.60}", param="timing")
        self.timing = timing or TimingConfig()
        self.num_threads = usable_cores() if num_threads is None else check_count(
            num_threads, "num_threads")  # fmt: skip
        self.timeout_s = check_seconds(timeout_s, "timeout_s")
        check_writable(log_path, "log_path", parents=True)
        check_flags(check_correctness=check_correctness)
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
        other = {str(ri.device_type) for ri in runner_inputs} - set(CPU_DEVICES)
        if other:
            raise TensortuneError(f"PersistentRunner times on this machine's CPU, not on "
                                  f"device {sorted(other)[0]!r}: give the target's device a "
                                  "runner of its own")  # fmt: skip
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
