"""The analyzer as a MetaSchedule cost model, so that any search can score with it."""

from __future__ import annotations

import numpy as np

from tensortune.compat import PyCostModel, derived_object
from tensortune.search.analyzer.roofline import Analyzer


@derived_object
class AnalyzerCostModel(PyCostModel):
    """Scores with the analyzer (one per task: it caches the task's structure); never learns."""

    def __init__(self, analyzer: Analyzer) -> None:
        super().__init__()
        self.analyzer = analyzer

    def predict(self, context, candidates) -> np.ndarray:
        return self.analyzer.scores([c.sch.mod for c in candidates])

    def update(self, context, candidates, results) -> None:
        pass

    def save(self, path: str) -> None:
        pass

    def load(self, path: str) -> None:
        pass
