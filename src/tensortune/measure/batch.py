"""Build and run a batch of candidates outside MetaSchedule's task scheduler."""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

from tensortune.compat import BuilderInput, RunnerInput, RunnerResult

if TYPE_CHECKING:
    from tensortune.hardware import Platform


def measure_batch(builder, runner, candidates: list, platform: Platform) -> tuple[list, list]:
    """Builder and runner results for each candidate, like MetaSchedule's tuning loop makes.

    Candidates that fail to build are not run; their runner result carries no run time.
    """
    built = builder.build([BuilderInput(c.sch.mod, platform.tvm_target) for c in candidates])
    to_run = [(b, c) for b, c in zip(built, candidates, strict=True) if b.error_msg is None]
    futures = iter(runner.run([RunnerInput(b.artifact_path, platform.device_type, c.args_info)
                               for b, c in to_run]))  # fmt: skip
    ran = []
    for b in built:
        ran.append(RunnerResult(None, None) if b.error_msg else next(futures).result())
    for b in built:
        if b.artifact_path:
            shutil.rmtree(os.path.dirname(b.artifact_path), ignore_errors=True)
    return built, ran
