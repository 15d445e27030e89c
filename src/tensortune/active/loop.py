"""The active-learning loop on a labelled pool: grow a "measured" set round by round, the
selector choosing with an acquisition model refitted on what it has measured so far.  The
offline study (``compare/active_learning.py``) and ``dataset select`` (``train/selection.py``)
both run it through the same sizes (``study_sizes``), so a selection written as a dataset is
the one the study scored at that fraction (with the study's default fractions)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from tensortune.active.pool import Pool
from tensortune.active.selectors import make_selector
from tensortune.costmodel.base import CostModel

# Refits of the acquisition model between two sizes (the batch is split this many ways).
ROUNDS_PER_STEP = 2
# The fractions of the pool the offline study scores by default (``bench al --fractions``).
FRACTIONS = (0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 1.0)


def study_sizes(fractions: Sequence[float], n: int) -> list[int]:
    """The labelled-set sizes ``grow`` passes through to reach each of ``fractions`` below 1
    of a pool of ``n`` (the whole pool is no selection).  The picks at a size depend on every
    size before it (each is a step of ``ROUNDS_PER_STEP`` rounds)."""
    return [max(1, round(f * n)) for f in sorted(set(fractions)) if f < 1]


def grow(selector_name: str, pool: Pool, sizes: Sequence[int], *, seed: int,
         acquisition: Callable[[], CostModel], rounds_per_step: int = ROUNDS_PER_STEP,
         on_size: Callable[[int, np.ndarray], None] | None = None) -> np.ndarray:  # fmt: skip
    """Grow a labelled set with ``selector_name`` through ``sizes`` (increasing counts), in
    ``rounds_per_step`` selections per step, refitting ``acquisition()`` on the labels
    "measured" so far before each; ``on_size(i, labelled)`` when ``sizes[i]`` is reached."""
    selector = make_selector(selector_name)
    labelled = np.zeros(0, dtype=int)
    round_ = 0
    for i, size in enumerate(sizes):
        size = min(size, len(pool))
        steps = max(1, min(rounds_per_step, size - len(labelled)))
        for step in range(steps):
            want = len(labelled) + math.ceil((size - len(labelled)) / (steps - step))
            model = None
            if selector.uses_score or selector.uses_spread:
                data = pool.labelled(labelled) if len(labelled) else None
                if data is not None and np.any(data.labels > 0):
                    model = acquisition().fit(data)
            picked = selector.select(pool, labelled, model, want - len(labelled),
                                     seed=seed, round=round_)  # fmt: skip
            labelled = np.concatenate([labelled, picked])
            round_ += 1
        if on_size is not None:
            on_size(i, labelled)
    return labelled
