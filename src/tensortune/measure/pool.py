"""Persistent worker processes with a per-request deadline.

A request that overruns its deadline, or whose worker dies (a kernel that segfaults), costs that
one worker: it is killed and a fresh one is started, and the other requests carry on.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

_START_TIMEOUT_S = 120.0  # a cold TVM import on a loaded 2-core machine can take half a minute


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
    each replaced by a fresh one after ``max_jobs`` jobs."""

    def __init__(
        self,
        size: int,
        env: dict[str, str] | None = None,
        log_path: str | None = None,
        max_jobs: int = MAX_JOBS,
    ) -> None:
        self.size = max(1, size)
        self.env = dict(env or {})
        self.log_path = log_path
        self.max_jobs = max_jobs
        self._workers: list[_Worker] = []
        self.restarts = 0

    def start(self) -> None:
        """Launch the workers without waiting: their TVM import overlaps the caller's work."""
        while len(self._workers) < self.size:
            self._workers.append(_Worker(self.env, self.log_path))

    def wait_ready(self) -> list[_Worker]:
        """Start any missing worker and wait until every one has imported TVM."""
        self.start()
        for w in self._workers:
            w.wait_ready()
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
        """Run ``worker.<name>(*job)`` for every job, at most ``size`` at a time, in order."""
        results: list[Outcome | None] = [None] * len(jobs)
        pending = list(range(len(jobs)))[::-1]
        busy: dict[Connection, tuple[_Worker, int, float]] = {}
        idle = list(self.wait_ready())
        while pending or busy:
            while pending and idle:
                w = idle.pop()
                i = pending.pop()
                try:
                    if not w.ready:
                        w.wait_ready()
                    w.conn.send((name, jobs[i]))
                except (OSError, EOFError, RuntimeError):  # it died while idle (OOM killer...)
                    pending.append(i)
                    idle.append(self._replace(w))
                    continue
                busy[w.conn] = (w, i, time.monotonic())
            now = time.monotonic()
            next_deadline = min(start + timeout_s for _, _, start in busy.values())
            for conn in wait(list(busy), timeout=max(0.0, next_deadline - now)):
                w, i, start = busy.pop(conn)  # type: ignore[arg-type]
                elapsed = time.monotonic() - start
                try:
                    kind, value = conn.recv()  # type: ignore[union-attr]
                except (EOFError, OSError):
                    message = _exit_text(w.exit_code())
                    results[i] = Outcome("crash", message=message, seconds=elapsed)
                    idle.append(self._replace(w))
                    continue
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
        return [r for r in results if r is not None]

    def close(self) -> None:
        for w in self._workers:
            with contextlib.suppress(OSError):
                w.conn.send(None)
        for w in self._workers:
            w.kill()
        self._workers.clear()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        import signal

        try:
            return f"worker killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"worker killed by signal {-code}"
    return f"worker exited with code {code}"
