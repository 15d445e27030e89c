"""Whom to believe when the analyzer and the verifier disagree: the one that has ranked this
task's measured programs better so far.

A verifier pre-trained on other hardware (MoA's starting point), or one still learning online,
can rank a task's programs worse than the analyzer: on the programs our benchmark measured on a
Zen 4 host, the analyzer's top 16 of a task held a program within 0.961 of the task's best on
average, the model pre-trained on the other configuration's rows within 0.853
(benchmarks/RESULTS.md, "Believing the analyzer until the verifier earns it").  Pruner lets the
verifier alone pick.  ``TrustBlend`` instead ranks by a weighted mean of the two rank orders; the
weight follows how often each scorer, with the scores it gave *before* the measurement, put
two measured programs of the task in the right order.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from tensortune.costmodel.base import pair_accuracy


def rank_share(x: np.ndarray) -> np.ndarray:
    """Each value's rank over the number of values, in (0, 1]; ties share their mean rank, and
    NaN ranks lowest."""
    x = np.asarray(x, np.float64)
    x = np.where(np.isnan(x), -np.inf, x)
    ranks = np.empty(len(x))
    ranks[np.argsort(x, kind="stable")] = np.arange(1, len(x) + 1)
    _, group = np.unique(x, return_inverse=True)
    return (np.bincount(group, ranks) / np.bincount(group))[group] / max(len(x), 1)


class TrustBlend:
    """The verifier's share ``weight`` in a blend of its ranks with the analyzer's, for one task.

    ``sharpness``: how fast the share moves with the difference of the two pair accuracies
    (0.1 of accuracy moves it from 0.5 to about 0.73 at 10); before any measurement it is 0.5.
    Only the ``window`` latest measurements count: an online verifier changes as it learns
    (its scores from before and after a retrain are still compared with each other).
    """

    def __init__(self, sharpness: float = 10.0, window: int = 64) -> None:
        if window < 2:
            raise ValueError("a pair accuracy needs a window of at least 2 measurements")
        self.sharpness = sharpness
        # (analyzer score, verifier score, latency) of the latest measured programs
        self.measured: deque[tuple[float, float, float]] = deque(maxlen=window)

    def observe(self, analyzer: float, verifier: float | None, latency: float) -> None:
        """One measured program: both scores it had when picked, and its latency."""
        if verifier is None or not math.isfinite(latency):
            return
        self.measured.append((analyzer, verifier, latency))

    @property
    def latencies(self) -> list[float]:
        return [lat for _, _, lat in self.measured]

    @property
    def weight(self) -> float:
        if len(self.measured) < 2:
            return 0.5
        analyzer, verifier, lat = np.array(self.measured).T
        edge = pair_accuracy(verifier, lat) - pair_accuracy(analyzer, lat)
        return 1.0 / (1.0 + math.exp(-self.sharpness * edge))

    def blend(self, analyzer: np.ndarray, verifier: np.ndarray | None) -> np.ndarray:
        """Blended scores (higher is better): the analyzer's alone when the verifier has none."""
        a = rank_share(analyzer)
        if verifier is None:
            return a
        w = self.weight
        return (1.0 - w) * a + w * rank_share(verifier)
