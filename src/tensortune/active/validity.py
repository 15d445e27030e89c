"""ALT's validity filter: will a candidate build and run within its limits?

A binary classifier over the same per-store features the cost models read (pooled per program:
mean and max over blocks, log-scaled), trained on measured programs: 1 = it ran, 0 = it failed
to build, crashed or timed out.  Before measurement, candidates it rates below ``threshold``
are dropped, so a search whose space is full of failures (large unrolls, tight timeouts, odd
shapes) stops spending measurements on them.  Gradient-boosted trees (XGBoost's logistic
objective), because failures follow thresholds on a few features (an unroll factor, a tile
size that overflows a cache or a time limit), which trees find from a handful of examples.
Shallow trees, a slow learning rate and leaves that may rest on one example (XGBoost's
``min_child_weight`` at 0.1, not 1): online, the filter learns from a few dozen programs, and
with the default a leaf of a logistic tree needs at least four examples the model is unsure
of, so early fits barely split.  Replayed on six plain runs' measurements
(``benchmarks/validity_replay.py``: the benchmark's three tasks, seeds 2 and 3; every batch
judged by a filter fitted on the batches before it), this setting removed 66% of the failures
at 2.2% of the programs that ran wrongly dropped, against 52% at 0.7% for depth 4, rate 0.3,
40 rounds and the default leaf weight; on seeds 4 and 5, which chose nothing, 69% at 2.9%
against 59% at 1.1% (benchmarks/RESULTS.md, stop 64).

Until it has seen ``min_each`` programs of each kind it keeps everything: a filter that has
never seen a failure cannot know what one looks like.
"""

from __future__ import annotations

import numpy as np

from tensortune.active.pool import pooled
from tensortune.errors import TensortuneError

# Drop a program only when the filter is fairly sure it fails.  Chosen on seed 0's shadow
# runs of benchmarks/validity_filter.py (every verdict checked by measuring), with the earlier
# trees: a cut at 0.5 dropped 18% of the programs that ran, at 0.1 2.6%.  With the present
# trees, on seeds 4 and 5 (which chose nothing): at 0.1 it removed 81% of the failures it
# judged and dropped 3.5% of the judged programs that ran; at 0.2, 85% and 6.1%.
THRESHOLD = 0.1


class ValidityFilter:
    """Predicts P(a program builds and runs) from its per-store features (module docstring).

    Settings in ``__init__``; ``fit`` learns ``booster_`` (``None`` while either kind has fewer
    than ``min_each`` examples).
    """

    def __init__(self, threshold: float = THRESHOLD, min_each: int = 3, rounds: int = 100,
                 max_depth: int = 2, eta: float = 0.1, min_child_weight: float = 0.1,
                 seed: int = 0) -> None:  # fmt: skip
        self.threshold = threshold
        self.min_each = min_each
        self.rounds = rounds
        self.max_depth = max_depth
        self.eta = eta
        self.min_child_weight = min_child_weight
        self.seed = seed

    def fit(self, per_store: list[np.ndarray], ok: np.ndarray) -> ValidityFilter:
        ok = np.asarray(ok, dtype=bool)
        if len(ok) != len(per_store):
            raise TensortuneError(f"{len(per_store)} programs but {len(ok)} outcomes")
        self.booster_ = None
        if min(int(ok.sum()), int((~ok).sum())) < self.min_each:
            return self  # XGBoost is not even imported (0.3 s) until failures are seen
        import xgboost as xgb

        params = {"objective": "binary:logistic", "max_depth": self.max_depth, "eta": self.eta,
                  "min_child_weight": self.min_child_weight, "seed": self.seed, "nthread": 1,
                  "verbosity": 0}  # fmt: skip
        self.booster_ = xgb.train(params, xgb.DMatrix(pooled(per_store), label=ok.astype(float)),
                                  num_boost_round=self.rounds)  # fmt: skip
        return self

    @property
    def active(self) -> bool:
        return getattr(self, "booster_", None) is not None

    def p_valid(self, per_store: list[np.ndarray]) -> np.ndarray:
        """P(valid) per program; 1 for every program while the filter is not active."""
        if not self.active or not per_store:
            return np.ones(len(per_store))
        import xgboost as xgb

        return self.booster_.predict(xgb.DMatrix(pooled(per_store))).astype(np.float64)

    def keep(self, per_store: list[np.ndarray]) -> np.ndarray:
        """Which programs to measure: those rated at least ``threshold``."""
        return self.p_valid(per_store) >= self.threshold
