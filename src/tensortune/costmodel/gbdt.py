"""Gradient-boosted trees with the pack-sum objective of MetaSchedule/TenSet.

Each block (buffer store) of a program is one row; the program's score is the sum of its rows'
outputs, and the squared error is taken on that sum, weighted toward fast programs.
With ``lowered=1`` each program gets one more row, carrying its lowered-loop features
(``features.lowered``: the register tile LLVM will receive; ``ProgramSet.blocks``), and
candidates in a search pay ~13 ms each (mean) to lower.
"""

from __future__ import annotations

import numpy as np

from tensortune.costmodel.base import CostModel
from tensortune.costmodel.data import ProgramSet, one_program
from tensortune.costmodel.progress import report
from tensortune.costmodel.trees import lightgbm_booster, xgboost_booster
from tensortune.errors import TensortuneError


def _pack_sum_objective(program_of_row: np.ndarray, labels: np.ndarray):
    # Fast programs matter most to a tuner (MetaSchedule weights its loss by y); the floor
    # keeps failed programs (y = 0) from being ignored entirely.
    weights = labels + 0.05

    def objective(row_pred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        program_pred = np.bincount(program_of_row, weights=row_pred, minlength=len(labels))
        grad = 2 * weights * (program_pred - labels)
        hess = 2 * weights
        return grad[program_of_row], hess[program_of_row]

    return objective


class XGBoostModel(CostModel):
    kind = "xgb"

    def __init__(self, n_rounds: int = 300, max_depth: int = 6, eta: float = 0.2,
                 min_child_weight: float = 2.0, gamma: float = 0.003, seed: int = 0,
                 threads: int = 0, refine_rounds: int = 50, lowered: int = 0) -> None:  # fmt: skip
        self.n_rounds = n_rounds
        self.lowered = lowered
        self.refine_rounds = refine_rounds
        self.max_depth = max_depth
        self.eta = eta
        self.min_child_weight = min_child_weight
        self.gamma = gamma
        self.seed = seed
        self.threads = threads

    def fit(self, data: ProgramSet) -> XGBoostModel:
        return self._boost(data, self.n_rounds, None)

    def _boost(self, data: ProgramSet, rounds: int, start) -> XGBoostModel:
        import xgboost as xgb

        labels = data.require_labels()
        rows, program_of_row = data.blocks(self.uses_lowered)
        objective = _pack_sum_objective(program_of_row, labels)
        params = {"max_depth": self.max_depth, "eta": self.eta, "gamma": self.gamma,
                  "min_child_weight": self.min_child_weight, "seed": self.seed,
                  "nthread": self.threads or None, "verbosity": 0}  # fmt: skip

        class Reported(xgb.callback.TrainingCallback):
            def after_iteration(self, model, epoch: int, evals_log) -> bool:
                report(epoch + 1, rounds)
                return False  # keep going

        self.booster_ = xgb.train(
            {k: v for k, v in params.items() if v is not None},
            xgb.DMatrix(rows),
            num_boost_round=rounds,
            obj=lambda pred, _: objective(pred),
            xgb_model=start,
            callbacks=[Reported()],
        )
        return self

    def _refine(self, data: ProgramSet) -> XGBoostModel:
        """More trees on top of the trained ones, fitted to ``data``: all ``update`` kept."""
        return self._boost(data, self.refine_rounds, self.booster_)

    def predict(self, data: ProgramSet) -> np.ndarray:
        import xgboost as xgb

        self._require_fitted()
        rows, program_of_row = data.blocks(self.uses_lowered)
        row_pred = self.booster_.predict(xgb.DMatrix(rows))
        return np.bincount(program_of_row, weights=row_pred, minlength=len(data))

    def _state(self) -> bytes:
        return bytes(self.booster_.save_raw("ubj"))

    def _restore(self, state: bytes) -> None:
        self.booster_ = xgboost_booster(state, one_program().blocks(self.uses_lowered)[0].shape[1])


class LightGBMModel(CostModel):
    kind = "lgbm"

    def __init__(self, n_rounds: int = 300, num_leaves: int = 63, learning_rate: float = 0.1,
                 min_data_in_leaf: int = 20, seed: int = 0, threads: int = 0,
                 refine_rounds: int = 50, lowered: int = 0) -> None:  # fmt: skip
        self.n_rounds = n_rounds
        self.lowered = lowered
        self.refine_rounds = refine_rounds
        self.num_leaves = num_leaves
        self.learning_rate = learning_rate
        self.min_data_in_leaf = min_data_in_leaf
        self.seed = seed
        self.threads = threads

    def fit(self, data: ProgramSet) -> LightGBMModel:
        return self._boost(data, self.n_rounds, None)

    def _refine(self, data: ProgramSet) -> LightGBMModel:
        """More trees on top of the trained ones, fitted to ``data``: all ``update`` kept."""
        return self._boost(data, self.refine_rounds, self.booster_)

    def _boost(self, data: ProgramSet, rounds: int, start) -> LightGBMModel:
        import lightgbm as lgb

        if start is not None and rounds == 0:  # refine_rounds=0: XGBoost adds no tree,
            return self  # LightGBM refuses zero rounds
        labels = data.require_labels()
        rows, program_of_row = data.blocks(self.uses_lowered)
        objective = _pack_sum_objective(program_of_row, labels)
        # LightGBM drops every feature it cannot split with ``min_data_in_leaf`` rows a side and
        # then refuses to train: a few-shot fine-tuning or a search's first batch (16 programs)
        # has fewer rows than that, so small data gets leaves of a quarter of its rows.
        leaf = max(1, min(self.min_data_in_leaf, len(rows) // 4))
        params = {"objective": lambda pred, _: objective(pred), "num_leaves": self.num_leaves,
                  "learning_rate": self.learning_rate, "min_data_in_leaf": leaf,
                  "min_data_in_bin": min(3, leaf), "seed": self.seed,
                  "num_threads": self.threads, "verbosity": -1}  # fmt: skip

        def reported(env) -> None:
            report(env.iteration - env.begin_iteration + 1, rounds)

        try:
            self.booster_ = lgb.train(params, lgb.Dataset(rows), num_boost_round=rounds,
                                      init_model=start, callbacks=[reported])  # fmt: skip
        except lgb.basic.LightGBMError as e:
            if "num_features" not in str(e):  # not "no feature it can split on"
                raise
            if start is not None:
                return self  # a refinement on these rows learns nothing: keep the trees
            raise TensortuneError(f"LightGBM finds nothing to split on in these {len(rows)} "
                                  "blocks' rows: too few, or too much alike") from None  # fmt: skip
        return self

    def predict(self, data: ProgramSet) -> np.ndarray:
        self._require_fitted()
        rows, program_of_row = data.blocks(self.uses_lowered)
        row_pred = self.booster_.predict(rows, raw_score=True)
        return np.bincount(program_of_row, weights=row_pred, minlength=len(data))

    def _state(self) -> bytes:
        return self.booster_.model_to_string().encode()

    def _restore(self, state: bytes) -> None:
        self.booster_ = lightgbm_booster(state, one_program().blocks(self.uses_lowered)[0].shape[1])
