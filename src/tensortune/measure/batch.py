"""Build and run a batch of candidates outside MetaSchedule's task scheduler."""

from __future__ import annotations

from tensortune.compat import BuilderInput, RunnerInput, RunnerResult, tvm


def measure_batch(builder, runner, candidates: list, target: dict) -> tuple[list, list]:
    """Builder and runner results for each candidate, like MetaSchedule's tuning loop makes.

    Candidates that fail to build are not run; their runner result carries no run time.
    """
    tvm_target = tvm.target.Target(target)
    built = builder.build([BuilderInput(c.sch.mod, tvm_target) for c in candidates])
    to_run = [(b, c) for b, c in zip(built, candidates, strict=True) if b.error_msg is None]
    futures = iter(runner.run([RunnerInput(b.artifact_path, "cpu", c.args_info)
                               for b, c in to_run]))  # fmt: skip
    ran = []
    for b in built:
        ran.append(RunnerResult(None, None) if b.error_msg else next(futures).result())
    for b in built:
        if b.artifact_path:
            _remove_artifact(b.artifact_path)
    return built, ran


def _remove_artifact(path: str) -> None:
    import os
    import shutil

    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
