"""A cost model wrapper that counts the seconds spent predicting and learning."""

from __future__ import annotations

import time

import numpy as np

from tensortune.compat import PyCostModel, derived_object


@derived_object
class TimedCostModel(PyCostModel):
    """Delegates to ``inner`` (any MetaSchedule cost model, ours or TVM's)."""

    def __init__(self, inner) -> None:
        super().__init__()
        self.inner = inner
        self.predict_s = 0.0
        self.update_s = 0.0

    def predict(self, context, candidates) -> np.ndarray:
        start = time.perf_counter()
        out = np.asarray(self.inner.predict(context, candidates), dtype=np.float64)
        self.predict_s += time.perf_counter() - start
        return out

    def update(self, context, candidates, results) -> None:
        start = time.perf_counter()
        self.inner.update(context, candidates, results)
        self.update_s += time.perf_counter() - start

    def save(self, path: str) -> None:
        self.inner.save(path)

    def load(self, path: str) -> None:
        self.inner.load(path)
