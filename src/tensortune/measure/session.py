"""The builder and runner of one job, set up in one place for every flow that measures.

Tuning, dataset collection, re-timing and the search benchmark all need the same pair: a
``PersistentBuilder`` and a ``PersistentRunner`` whose thread pool has the target's size, with
their workers' logs in the job's log directory.  A builder or runner given by the caller (any
MetaSchedule one) is used as it is and left to the caller to close.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tensortune.errors import check_flags
from tensortune.measure.batch import measure_batch
from tensortune.measure.builder import PersistentBuilder
from tensortune.measure.runner import PersistentRunner, TimingConfig, signature_of

if TYPE_CHECKING:
    from tensortune.hardware import Platform
    from tensortune.workloads.task import Task


class MeasureSession:
    """A builder and a runner for ``platform``'s programs, closed together.

    ``check_correctness`` makes the runner compare each candidate's output with an unscheduled
    build of its task (:meth:`add_references`), when the runner is the session's own.
    """

    def __init__(
        self,
        platform: Platform,
        *,
        log_dir: str | Path | None = None,
        timing: TimingConfig | None = None,
        check_correctness: bool = False,
        builder: object | None = None,
        runner: object | None = None,
    ) -> None:
        check_flags(check_correctness=check_correctness)
        platform.check_measurable()
        platform.check_runs_here()
        self.platform = platform
        logs = Path(log_dir) if log_dir is not None else None
        if logs is not None:
            logs.mkdir(parents=True, exist_ok=True)
        self._owned: list = []
        if builder is None:
            builder = PersistentBuilder(log_path=_log(logs, "builder-workers.log"))
            self._owned.append(builder)
        self.builder = builder
        if runner is None:
            try:
                runner = PersistentRunner(timing, num_threads=platform.threads,
                                          check_correctness=check_correctness,
                                          log_path=_log(logs, "runner-worker.log"))  # fmt: skip
            except BaseException:  # a bad ``timing``: the builder's workers go with the error
                self.close()
                raise
            self._owned.append(runner)
        self.runner = runner
        self.checks = check_correctness and runner in self._owned
        if check_correctness and not self.checks:
            # A farm's or a caller's runner times what it is given and compares nothing:
            # said, not left for a wrong program to become the stored best unnoticed.
            warnings.warn(f"tensortune: outputs are not checked against the workload: the "
                          f"runner ({type(runner).__name__}) is not tensortune's local one",
                          stacklevel=2)  # fmt: skip

    def wait_ready(self) -> None:
        """Block until the session's own workers have started (clocks start after this)."""
        for worker in self._owned:
            worker.wait_ready()

    def add_references(self, tasks: Sequence[Task]) -> None:
        """Build each task unscheduled once, so the runner can check candidates' outputs
        against it (a task's ``exact`` module when approximations were applied to it)."""
        if not self.checks:
            return
        from tensortune.compat import ArgInfo, BuilderInput

        target = self.platform.tvm_target
        built = self.builder.build([BuilderInput(t.reference, target) for t in tasks])
        for task, b in zip(tasks, built, strict=True):
            if b.artifact_path:
                args = ArgInfo.from_prim_func(task.mod["main"])
                self.runner.add_reference(signature_of(args), b.artifact_path)

    def measure(self, candidates: list) -> tuple[list, list]:
        """Build and run ``candidates``: builder and runner results, one each per candidate."""
        return measure_batch(self.builder, self.runner, candidates, self.platform)

    def close(self) -> None:
        for worker in self._owned:
            worker.close()
        self._owned.clear()

    def __enter__(self) -> MeasureSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _log(logs: Path | None, name: str) -> str | None:
    return None if logs is None else str(logs / name)
