"""Persistent worker processes with a per-request deadline.

A request that overruns its deadline, or whose worker dies (a kernel that segfaults), costs that
one worker: it is killed and a fresh one is started, and the other requests carry on.

A pool made with ``reuse=True`` (the tuner's builders and runner) leaves its healthy workers,
when closed, to the next such pool of this process with the same environment (unless made
with ``keep=False`` too: ``compile``'s timing, which only takes one): a worker takes ~1 s to
start and import TVM, and each ``tune()`` call used to pay that three times over (a notebook
tuning task after task, a benchmark's seeds, a test suite).  Idle workers wait until the
process exits (:func:`close_idle_workers` ends them sooner).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

_START_TIMEOUT_S = 120.0  # a cold TVM import on a loaded 2-core machine can take half a minute
_ADOPT_TIMEOUT_S = 10.0  # an idle worker answers at once; one that does not is replaced
# Fresh workers in a row that die before taking a job: then the cause is not a kernel (a broken
# environment, the OOM killer during the TVM import), and replacing them again would spin.
_START_FAILURES = 3


@dataclass(frozen=True)
class Outcome:
    """How one request ended: ``kind`` is "ok", "error", "timeout" or "crash"."""

    kind: str
    value: Any = None
    message: str = ""
    seconds: float = 0.0


class _Worker:
    """One worker process (``python -m tensortune.measure.worker``) and its duplex connection.

    A plain subprocess rather than multiprocessing's spawn: spawn re-imports the parent's
    ``__main__``, which breaks user scripts that lack an ``if __name__ == "__main__"`` guard.
    """

    def __init__(self, env: dict[str, str], log_path: str | None) -> None:
        self.key = _env_key(env)
        # Linux ends a worker with the thread that started it (``worker.tie_to_parent``): only
        # the main thread's outlive the pool that started them.
        self.lasting = threading.current_thread() is threading.main_thread()
        self.busy = False  # a request is out: its answer, unread, would go to the wrong job
        parent, child = socket.socketpair()
        # A crashing kernel makes TVM print a native backtrace: into the log, not the terminal.
        log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tensortune.measure.worker", str(child.fileno())],
                pass_fds=(child.fileno(),),
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        finally:
            if log_path:
                log.close()  # type: ignore[union-attr]
        child.close()
        self.conn = Connection(parent.detach())
        self.started = time.monotonic()
        self.ready = False
        self.jobs = 0  # answered so far

    def wait_ready(self) -> None:
        if self.ready:
            return
        if not self.conn.poll(_START_TIMEOUT_S):
            self.kill()
            raise RuntimeError("measurement worker did not start")
        try:
            self.conn.recv()
        except EOFError:
            raise RuntimeError(
                f"measurement worker died while starting ({_exit_text(self.process.wait())})"
            ) from None
        self.ready = True

    def exit_code(self) -> int | None:
        try:
            return self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.exit_code()
        self.conn.close()


# Jobs a worker answers before a fresh process takes its place.  Every kernel a runner loads
# leaves memory mappings behind even once released: after about 14,600 kernels one runner hit
# Linux's limit of 65,530 mappings and every later load failed ("failed to map segment from
# shared object"), which recorded 2,199 good programs as run errors in a long collection.
MAX_JOBS = 2000


class WorkerPool:
    """``size`` persistent workers that share the same environment (e.g. ``TVM_NUM_THREADS``),
    each replaced by a fresh one after ``max_jobs`` jobs (counted over its life).  With
    ``reuse``, workers come from, and go back to when closed, this process's idle ones; with
    ``keep`` false as well, they still come from there but end with the pool."""

    def __init__(
        self,
        size: int,
        env: dict[str, str] | None = None,
        log_path: str | None = None,
        max_jobs: int = MAX_JOBS,
        *,
        reuse: bool = False,
        keep: bool = True,
    ) -> None:
        self.size = max(1, size)
        self.env = dict(env or {})
        self.log_path = log_path
        self.max_jobs = max_jobs
        self.reuse = reuse
        self.keep = keep
        self._workers: list[_Worker] = []
        self.restarts = 0

    def start(self) -> None:
        """Launch the workers without waiting: their TVM import overlaps the caller's work."""
        while len(self._workers) < self.size:
            idle = _IDLE.take(self.env, self.log_path) if self.reuse else None
            self._workers.append(idle or _Worker(self.env, self.log_path))

    def wait_ready(self) -> list[_Worker]:
        """Start any missing worker and wait until every one has imported TVM; one that dies
        starting (the OOM killer during its import) is replaced, ``_START_FAILURES`` times in
        a row at most."""
        self.start()
        for w in list(self._workers):
            failures = 0
            while not w.ready:
                try:
                    w.wait_ready()
                except RuntimeError:
                    failures += 1
                    w = self._replace(w)  # the pool stays whole, whatever is raised
                    if failures >= _START_FAILURES:
                        raise
        return self._workers

    def _retire(self, w: _Worker) -> _Worker:
        """A fresh worker in place of one that has done its share, which exits when told."""
        with contextlib.suppress(OSError):
            w.conn.send(None)
        return self._replace(w)

    def _replace(self, w: _Worker) -> _Worker:
        w.kill()
        fresh = _Worker(self.env, self.log_path)
        self._workers[self._workers.index(w)] = fresh
        self.restarts += 1
        return fresh

    def map(self, name: str, jobs: Sequence[tuple], timeout_s: float) -> list[Outcome]:
        """Run ``worker.<name>(*job)`` for every job, at most ``size`` at a time, in order.

        A worker still importing TVM (fresh in place of one that crashed, timed out or did its
        share) gets a job once it says it is ready; meanwhile the others' answers are read
        and their deadlines kept, so its start costs no other job time."""
        results: list[Outcome | None] = [None] * len(jobs)
        pending = list(range(len(jobs)))[::-1]
        busy: dict[Connection, tuple[_Worker, int, float]] = {}
        starting: dict[Connection, _Worker] = {}
        # Not waited for here: one that died starting is replaced below, as one that died idle.
        self.start()
        # A worker still owing an answer (a map that an interrupt ended, which TVM may turn
        # into an error that the run survives) would give it to this map's first job.
        idle = [self._replace(w) if w.busy else w for w in self._workers]
        fresh: set[int] = set()  # workers this map started in place of dead ones
        failed_starts = 0

        def lost(w: _Worker, e: BaseException) -> None:
            """``w`` died before taking a job (while idle, or starting): a fresh one in its
            place, unless fresh ones keep dying (then the cause is not a kernel)."""
            nonlocal failed_starts
            failed_starts += id(w) in fresh  # an old idle one says nothing of starts
            if failed_starts >= _START_FAILURES:
                w.kill()
                self._workers.remove(w)  # the next map starts one anew
                raise RuntimeError(f"{failed_starts} measurement workers in a row died "
                                   f"before taking a job (last: {e})") from None  # fmt: skip
            replacement = self._replace(w)
            fresh.add(id(replacement))
            idle.append(replacement)

        while pending or busy:
            while pending and idle:
                w = idle.pop()
                with contextlib.suppress(OSError):  # closed: wait_ready below says so
                    if not w.ready and not w.conn.poll(0):  # importing TVM: not waited on
                        starting[w.conn] = w
                        continue
                i = pending.pop()
                try:
                    w.wait_ready()  # at once: it has answered, or it is known to be ready
                    w.busy = True
                    w.conn.send((name, jobs[i]))
                except (OSError, EOFError, RuntimeError) as e:  # died while idle (OOM killer...)
                    pending.append(i)
                    lost(w, e)
                    continue
                failed_starts = 0
                busy[w.conn] = (w, i, time.monotonic())
            now = time.monotonic()
            deadlines = [start + timeout_s for _, _, start in busy.values()]
            deadlines += [w.started + _START_TIMEOUT_S for w in starting.values()]
            for conn in wait([*busy, *starting], timeout=max(0.0, min(deadlines) - now)):
                if conn in starting:  # its "ready" (or its end) is read as it takes a job
                    idle.append(starting.pop(conn))  # type: ignore[arg-type]
                    continue
                w, i, start = busy.pop(conn)  # type: ignore[arg-type]
                elapsed = time.monotonic() - start
                try:
                    kind, value = conn.recv()  # type: ignore[union-attr]
                except (EOFError, OSError):
                    message = _exit_text(w.exit_code())
                    results[i] = Outcome("crash", message=message, seconds=elapsed)
                    idle.append(self._replace(w))
                    continue
                w.busy = False
                if kind == "ok":
                    results[i] = Outcome("ok", value=value, seconds=elapsed)
                else:
                    results[i] = Outcome("error", message=str(value), seconds=elapsed)
                w.jobs += 1
                idle.append(w if w.jobs < self.max_jobs else self._retire(w))
            now = time.monotonic()
            for conn, (w, i, start) in list(busy.items()):
                if now - start >= timeout_s:
                    busy.pop(conn)
                    results[i] = Outcome(
                        "timeout", message=f"no answer in {timeout_s:g} s", seconds=now - start
                    )
                    idle.append(self._replace(w))
            for conn, w in list(starting.items()):
                if now - w.started >= _START_TIMEOUT_S:
                    starting.pop(conn)
                    lost(w, RuntimeError("measurement worker did not start"))
        return [r for r in results if r is not None]  # workers still starting: the next map's

    def close(self) -> None:
        ending = []
        while self._workers:  # each leaves the pool before it is kept: never in both places
            w = self._workers.pop()
            if not (self.reuse and self.keep and _IDLE.keep(w, self.max_jobs)):
                ending.append(w)
        _stop(ending)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stop(workers: Sequence[_Worker]) -> None:
    for w in workers:  # told first, so that they exit together
        with contextlib.suppress(OSError):
            w.conn.send(None)
    for w in workers:
        w.kill()


# Variables that concern only the parent: how to lay out its output (the terminal's size), the
# test it is in (pytest), where it caches (tensortune's catalog and native log; TVM's kernels
# read it only for GPU program caches, after TVM_CACHE_DIR).  Another value of one of these
# does not make an idle worker unfit.
_PARENTS_OWN = frozenset({"COLUMNS", "LINES", "PYTEST_CURRENT_TEST", "XDG_CACHE_HOME"})


def _env_key(env: dict[str, str]) -> tuple:
    """What a worker started now with ``env`` would run with, as a key for reusing it: the
    environment and the CPUs it may use (a process that ran TVM in-process may have been
    pinned to one core by TVM's thread pool; its workers inherit that)."""
    full = {**os.environ, **env}
    cpus = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()
    return (cpus, tuple(sorted((k, v) for k, v in full.items() if k not in _PARENTS_OWN)))


class _IdleWorkers:
    """Ready workers that reusing pools left behind, newest last, at most ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._workers: list[_Worker] = []
        # Reentrant: a pool's owner collected (and closed) by the garbage collector, which
        # may run inside the lock, closes it here.
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._closed = False

    def _forget_if_forked(self) -> None:
        """In a forked child (the lock held): the workers kept are its parent's, not its own."""
        if os.getpid() != self._pid:
            self._workers, self._pid = [], os.getpid()

    def take(self, env: dict[str, str], log_path: str | None) -> _Worker | None:
        """An idle worker of ``env``'s environment, now in this process's working directory
        and writing to ``log_path``; None if there is none."""
        key = _env_key(env)
        while True:
            with self._lock:
                self._forget_if_forked()
                w = next((w for w in reversed(self._workers) if w.key == key), None)
                if w is None:
                    return None
                self._workers.remove(w)
            if _adopted(w, log_path):
                return w
            w.kill()  # died while idle, or stuck

    def keep(self, w: _Worker, max_jobs: int) -> bool:
        """Keep ``w`` for a later pool if it is fit to serve one (else the caller ends it)."""
        if (self._closed or os.getpid() != self._pid or not w.lasting or not w.ready or w.busy
                or w.jobs >= max_jobs or w.process.poll() is not None):  # fmt: skip
            return False
        try:
            if w.conn.poll():  # something nobody asked for: not a clean state
                return False
        except OSError:
            return False
        # Idle, it holds nothing of its last caller's open (a log in a directory being removed)
        if not _adopted(w, None, "/"):
            return False
        with self._lock:
            self._workers.append(w)
            evicted, self._workers = self._workers[: -self.limit], self._workers[-self.limit :]
        _stop(evicted)
        return True

    def close(self, *, final: bool = False) -> None:
        """End the idle workers; ``final``: and any that pools close from now on.  A forked
        child's exit (its atexit) leaves them: they are its parent's."""
        with self._lock:
            self._forget_if_forked()
            workers, self._workers = self._workers, []
            self._closed = self._closed or final
        _stop(workers)


def _adopted(w: _Worker, log_path: str | None, cwd: str | None = None) -> bool:
    """Whether ``w`` now works in ``cwd`` (default: this process's) and writes to
    ``log_path``."""
    if cwd is None:
        try:
            cwd = os.getcwd()
        except OSError:  # the caller's directory was removed
            cwd = None
    try:
        w.conn.send(("adopt", (cwd, log_path)))
        if not w.conn.poll(_ADOPT_TIMEOUT_S):
            return False
        kind, _ = w.conn.recv()
    except (OSError, EOFError):
        return False
    return kind == "ok"


# A tuning run's builders, runner and feature workers, twice over; an idle worker that has
# built and run kernels is ~200-230 MB resident (a Xeon, 2 cores: matmul tuning).
_IDLE = _IdleWorkers(limit=8)
atexit.register(_IDLE.close, final=True)


def close_idle_workers() -> None:
    """End the idle workers that reusing pools left (they otherwise wait for this process to
    exit); later pools start fresh ones."""
    _IDLE.close()


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        import signal

        try:
            return f"worker killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"worker killed by signal {-code}"
    return f"worker exited with code {code}"
