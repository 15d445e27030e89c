"""Design spaces and random candidates of a workload, via MetaSchedule's space generator."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tensortune.compat import ArgInfo, MeasureCandidate, TuneContext, ms, tvm

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
    threads: int | str | None = None,
) -> TuneContext:
    """A TuneContext with the target's default schedule rules, postprocessors and mutators;
    it samples on ``threads`` threads (one makes the draws a function of ``seed`` alone;
    None: the strategy's ``sampling_threads`` where it names them, else every physical core,
    as MetaSchedule does)."""
    if threads is None:
        threads = getattr(strategy, "sampling_threads", "physical")
    return TuneContext(
        mod,
        target=platform.tvm_target,
        space_generator="post-order-apply",
        search_strategy=strategy,
        task_name=task_name,
        rand_state=tvm_seed(seed),
        num_threads=threads,
        logger=logger,
    )  # fmt: skip


def tvm_seed(seed: int) -> int:
    """``seed`` (0 or more, any size) as a seed TVM's random engine keeps apart: it reduces a
    seed modulo 2**31 - 1 and turns 0 into 1, so seeds 0 and 1 drew the same schedules (and
    so did a seed-0 run's first two tasks, seeded 0 and 1), and a 64-bit seed did not fit."""
    return 1 + seed % (2**31 - 2)


class RandomSchedules:
    """Random schedules of ``mod`` drawn from its design space (MetaSchedule's ``ReplayTrace``),
    ``batch`` per ``draw``, up to ``limit`` in all; ``close`` when done.  On more than one
    thread the draws depend on which thread takes which sample, not on ``seed`` alone."""

    def __init__(self, mod: tvm.IRModule, platform: Platform, batch: int, *, seed: int = 0,
                 limit: int = 1 << 30, threads: int | str = "physical") -> None:  # fmt: skip
        self.context = tune_context(mod, platform, seed=seed, threads=threads,
                                    strategy=ms.search_strategy.ReplayTrace())  # fmt: skip
        self._strategy = self.context.search_strategy
        self.design_spaces = self.context.space_generator.generate_design_space(self.context.mod)
        self._strategy.pre_tuning(limit, batch, self.design_spaces, None, None)

    def draw(self) -> list[MeasureCandidate]:
        batch = list(self._strategy.generate_measure_candidates() or [])
        # It counts reported results toward its limit; nobody measures these through it.
        self._strategy.notify_runner_results(
            batch, [ms.runner.RunnerResult([1.0], None)] * len(batch)
        )
        return batch

    def take(self, count: int) -> list[MeasureCandidate]:
        """Up to ``count`` schedules, fewer where the space or the limit runs out."""
        out: list[MeasureCandidate] = []
        while len(out) < count:
            batch = self.draw()
            if not batch:
                break
            out.extend(batch)
        return out[:count]

    def close(self) -> None:
        self._strategy.post_tuning()


def sample_candidates(
    mod: tvm.IRModule, platform: Platform, count: int, *, seed: int = 0
) -> list[MeasureCandidate]:
    """``count`` random schedules of ``mod`` drawn from its design space, the same ones for
    the same ``seed`` (drawn on one thread).  A small space can repeat a schedule: callers
    that need distinct ones remove repeats (``select/samplers.py``)."""
    sampler = RandomSchedules(mod, platform, count, seed=seed, limit=count, threads=1)
    out = sampler.take(count)
    sampler.close()
    return out


def replayed(mod: tvm.IRModule, trace: object, postprocs: list,
             seed: int | None = None) -> MeasureCandidate | None:  # fmt: skip
    """``trace`` (decisions set, postprocessors removed) replayed on ``mod`` and
    post-processed, as a candidate; None where a primitive or a postprocessor refuses it (as
    MetaSchedule drops such programs)."""
    sch = tvm.s_tir.Schedule(mod, seed=seed)
    try:
        trace.apply_to_schedule(sch, remove_postproc=True)
        sch.enter_postproc()
        if not all(p.apply(sch) for p in postprocs):
            return None
    except Exception:
        return None
    return MeasureCandidate(sch, ArgInfo.from_entry_func(sch.mod, remove_preproc=True))
