"""Design spaces and random candidates of a workload, via MetaSchedule's space generator."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensortune.compat import MeasureCandidate, TuneContext, ms, tvm

if TYPE_CHECKING:
    from tensortune.hardware import Platform


def tune_context(
    mod: tvm.IRModule,
    platform: Platform,
    *,
    seed: int = 0,
    task_name: str = "main",
    strategy: object = None,
    logger: object = None,
) -> TuneContext:
    """A TuneContext with the target's default schedule rules, postprocessors and mutators."""
    return TuneContext(
        mod,
        target=platform.tvm_target,
        space_generator="post-order-apply",
        search_strategy=strategy,
        task_name=task_name,
        rand_state=seed,
        num_threads="physical",
        logger=logger,
    )  # fmt: skip


def sample_candidates(
    mod: tvm.IRModule, platform: Platform, count: int, *, seed: int = 0
) -> list[MeasureCandidate]:
    """``count`` distinct random schedules of ``mod`` drawn from its design space."""
    ctx = tune_context(mod, platform, seed=seed, strategy=ms.search_strategy.ReplayTrace())
    spaces = ctx.space_generator.generate_design_space(ctx.mod)
    strategy = ctx.search_strategy
    strategy.pre_tuning(count, count, spaces, None, None)
    out: list[MeasureCandidate] = []
    while len(out) < count:
        batch = strategy.generate_measure_candidates()
        if not batch:
            break
        out.extend(batch)
        strategy.notify_runner_results(batch, [ms.runner.RunnerResult([1.0], None)] * len(batch))
    strategy.post_tuning()
    return out[:count]
