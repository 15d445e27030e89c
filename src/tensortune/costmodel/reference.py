"""MetaSchedule's own ``XGBModel`` trained on our data: the reference our models must beat.

It runs MetaSchedule's training code unchanged (its pack-sum objective, its ``XGBConfig``
defaults and early stopping) on the per-store features alone, as MetaSchedule does: no workload
or hardware vector.
"""

from __future__ import annotations

import numpy as np

from tensortune.costmodel.base import CostModel
from tensortune.costmodel.data import ProgramSet, one_program


class MetaScheduleXGB(CostModel):
    kind = "ms-xgb"

    def __init__(self, early_stopping_rounds: int = 50) -> None:
        self.early_stopping_rounds = early_stopping_rounds

    def _model(self):
        from tensortune.compat import ms

        return ms.cost_model.XGBModel(num_warmup_samples=0, verbose_eval=10**9,
                                      early_stopping_rounds=self.early_stopping_rounds)  # fmt: skip

    def fit(self, data: ProgramSet) -> MetaScheduleXGB:
        labels = data.require_labels()
        model = self._model()
        model._train([x.astype(np.float32) for x in data.per_store], labels.astype(np.float32))
        self.booster_ = model.booster
        return self

    def predict(self, data: ProgramSet) -> np.ndarray:
        self._require_fitted()
        if not len(data):  # MetaSchedule's concatenates the programs' rows: none is an error
            return np.zeros(0)
        model = self._model()
        model.booster = self.booster_
        return np.asarray(model._predict([x.astype(np.float32) for x in data.per_store]),
                          dtype=np.float64)  # fmt: skip

    def _state(self) -> bytes:
        return bytes(self.booster_.save_raw("ubj"))

    def _restore(self, state: bytes) -> None:
        from tensortune.costmodel.trees import xgboost_booster

        # MetaSchedule's model reads the per-store features alone.
        self.booster_ = xgboost_booster(state, one_program().per_store[0].shape[1])
