"""How much a candidate will cost to build, learned from the builds of the task so far.

On CPUs the auto-unroll step MetaSchedule samples (0, 16, 64 or 512) decides most of a
program's build time: LLVM gets the unrolled code.  On our benchmark tasks step-512 programs
built 1.4-4.7x slower than the same task's others, and were no more often the best
(benchmarks/RESULTS.md, "Why MoA lags").  So a search can pay for builds with the measurements
it gives up, and should know the price: ``BuildCosts`` keeps the seconds the builder reported
for one task's programs, per unroll step, and says how much dearer each candidate is expected
to be than the cheapest step seen.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np


def unroll_step(trace: object) -> int | None:
    """The auto-unroll step a MetaSchedule trace samples (``None`` when it samples none)."""
    sampled: dict[object, int] = {}
    for inst in trace.insts:
        kind = inst.kind.name
        if kind == "SampleCategorical":
            decision = trace.get_decision(inst)
            if decision is not None:
                sampled[inst.outputs[0]] = int(inst.attrs[0][int(decision)])
        elif kind == "Annotate" and "unroll" in str(inst.attrs[0]):
            for var, value in sampled.items():
                if var.same_as(inst.inputs[1]):
                    return value
    return None


class BuildCosts:
    """Build seconds of one task's programs by unroll step; unseen steps cost the cheapest's."""

    def __init__(self) -> None:
        self.seconds: dict[int | None, list[float]] = {}

    def observe(self, step: int | None, seconds: float) -> None:
        self.seconds.setdefault(step, []).append(float(seconds))

    def ratios(self, steps: Sequence[int | None]) -> np.ndarray:
        """Each step's expected build time over the cheapest observed step's (1 when unknown)."""
        means = {s: statistics.fmean(v) for s, v in self.seconds.items() if v}
        cheapest = min(means.values(), default=0.0)
        if cheapest <= 0.0:
            return np.ones(len(steps))
        return np.array([means.get(s, cheapest) / cheapest for s in steps], dtype=np.float64)


def cost_aware_order(order: Sequence[int], ratios: np.ndarray, weight: float) -> list[int]:
    """``order`` (best first) sorted again by rank x ratio**weight: a candidate expected to
    build r times slower than the cheapest moves back as if ranked r times lower."""
    effective = np.arange(1, len(order) + 1) * np.asarray(ratios, np.float64) ** weight
    return [order[i] for i in np.argsort(effective, kind="stable")]
