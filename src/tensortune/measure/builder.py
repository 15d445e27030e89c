"""A MetaSchedule ``Builder`` backed by persistent worker processes."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import weakref
from pathlib import Path

from tensortune.compat import (
    BuilderInput,
    BuilderResult,
    PyBuilder,
    closed_on_exit,
    derived_object,
    structural_hash,
)
from tensortune.errors import check_count, check_seconds, check_writable
from tensortune.hardware import usable_cores
from tensortune.hardware.fingerprint import pid_scope
from tensortune.measure.pool import WorkerPool
from tensortune.measure.status import Status, tagged

_PREFIX = "tensortune-build-"


def _pid_scope() -> str:
    """``hardware.pid_scope`` as a part of a directory name: a container sharing /tmp sees the
    host's pids (and another container's) as gone, and swept a live builder's directory."""
    return "n" + (pid_scope() or "").replace(":", "")


def _remove_orphans() -> None:
    """Delete the build directories of builders whose process has died (killed before it
    could clean up: ``kill -9``, the OOM killer); their names carry the pid and where it
    means something (``_pid_scope``): another scope's, or an older name without one, stay."""
    scope = _pid_scope()
    for path in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*-*"):
        pid, _, rest = path.name[len(_PREFIX) :].partition("-")
        if not pid.isdigit() or int(pid) == os.getpid() or rest.split("-")[0] != scope:
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:  # another user's process: alive
            continue


@closed_on_exit
@derived_object
class PersistentBuilder(PyBuilder):
    """Builds candidates in parallel in ``max_workers`` long-lived processes.

    Each artifact is a shared library in a directory of its own (MetaSchedule's
    RemoveBuildArtifact callback deletes the artifact's directory after the run).
    ``build_times``, once a search strategy that weighs build costs asks for it
    (``collect_build_times``), maps each successfully built module's structural hash to the
    seconds its build took; the strategy pops what it reads.
    """

    def __init__(
        self, max_workers: int | None = None, timeout_s: float = 60.0, log_path: str | None = None
    ) -> None:
        super().__init__()
        # Checked before a worker starts: a zero or NaN limit recorded every candidate as a
        # timeout (or none ever), and the trials were spent on nothing.
        self.max_workers = usable_cores() if max_workers is None else check_count(
            max_workers, "max_workers")  # fmt: skip
        self.timeout_s = check_seconds(timeout_s, "timeout_s")
        check_writable(log_path, "log_path", parents=True)
        self._pool = WorkerPool(self.max_workers, log_path=log_path, reuse=True)
        self._pool.start()
        _remove_orphans()
        self._root = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-{_pid_scope()}-")
        # Removed by close(), or when the builder is collected or the process exits unclosed.
        self._remove_root = weakref.finalize(self, shutil.rmtree, self._root, True)
        self.seconds = 0.0  # wall time spent building, for benchmarks' breakdowns
        self.build_times: dict[str, float] | None = None

    def collect_build_times(self) -> dict[str, float]:
        """Record from now on what each build takes; returns the (shared) record."""
        if self.build_times is None:
            self.build_times = {}
        return self.build_times

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        start = time.perf_counter()
        jobs = []
        for bi in build_inputs:
            out_dir = tempfile.mkdtemp(dir=self._root)
            jobs.append((bi.mod, dict(bi.target.export()), os.path.join(out_dir, "kernel.so")))
        results = []
        for (mod, _, path), outcome in zip(
            jobs, self._pool.map("build", jobs, self.timeout_s), strict=True
        ):
            if outcome.kind == "ok":
                if self.build_times is not None:
                    self.build_times[structural_hash(mod)] = outcome.seconds
                results.append(BuilderResult(outcome.value, None))
                continue
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)
            status = Status.TIMEOUT if outcome.kind == "timeout" else Status.BUILD_ERROR
            results.append(BuilderResult(None, tagged(status, f"build: {outcome.message}")))
        self.seconds += time.perf_counter() - start
        return results

    def wait_ready(self) -> None:
        """Block until the workers are up (benchmarks start their clocks after this)."""
        self._pool.wait_ready()

    def close(self) -> None:
        self._pool.close()
        self._remove_root()
