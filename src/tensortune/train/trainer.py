"""``tensortune train`` / ``evaluate``: fit a cost model on a dataset split and score it with
TenSet's metrics."""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensortune.costmodel.base import CostModel, load_model
from tensortune.costmodel.data import ProgramSet
from tensortune.costmodel.registry import model_class
from tensortune.errors import TensortuneError
from tensortune.train import metrics, splits

SPLITS = ("within-task", "by-task", "by-network:NET[,NET...]", "by-hardware:HW[,HW...]")


@dataclass
class TrainResult:
    model: CostModel
    metrics: dict
    train_programs: int
    test_programs: int
    fit_seconds: float
    predict_per_second: float


def split_masks(columns: dict, spec: str) -> tuple[np.ndarray, np.ndarray]:
    """Train and test masks over a dataset's rows for a split spec (see ``SPLITS``)."""
    name, _, arg = spec.partition(":")
    held = [a for a in arg.split(",") if a]
    try:
        if name == "within-task":
            return splits.within_task(columns["task_id"], columns["program_id"],
                                      hardware=columns["hardware"])  # fmt: skip
        if name == "by-task":
            return splits.by_task(columns["task_id"])
        if name == "by-network" and held:
            return splits.by_network(columns["networks"], held, task_id=columns["task_id"])
        if name == "by-hardware" and held:
            return splits.by_hardware(columns["hardware"], held)
    except ValueError as e:
        raise TensortuneError(f"split {spec!r}: {e}") from None
    raise TensortuneError(f"unknown split {spec!r}; use one of: {', '.join(SPLITS)}")


def _columns(dataset: str | Path) -> tuple[dict, dict]:
    from tensortune.datasets.build import load_table, read_card

    card = read_card(dataset).data
    return load_table(dataset).to_pydict(), card


def _networks(card: dict) -> dict[str, dict[int, int]] | None:
    weights = card.get("task_weights") or {}
    return {n: {int(t): int(w) for t, w in ws.items()} for n, ws in weights.items()} or None


def _score(model: CostModel, columns: dict, test: np.ndarray, card: dict,
           plot: str | Path | None = None) -> tuple[dict, float]:  # fmt: skip
    data = ProgramSet.from_columns(columns, test)
    kept = np.flatnonzero(test)
    kept = np.array([i for i in kept if columns["per_store"][i] is not None], dtype=int)
    start = time.perf_counter()
    pred = model.predict(data)
    per_second = len(data) / max(time.perf_counter() - start, 1e-9)
    rows = {
        "task_id": np.asarray(columns["task_id"])[kept],
        "hardware": np.asarray(columns["hardware"])[kept],
        "label": np.asarray(columns["label"], dtype=float)[kept],
        "cost": np.array([np.inf if c is None else c for c in np.asarray(columns["cost"],
                                                                          dtype=object)[kept]]),
    }  # fmt: skip
    networks = _networks(card)
    if networks is not None:
        present = set(rows["task_id"].tolist())
        networks = {n: w for n, w in networks.items() if present & set(w)} or None
    if plot is not None:
        from tensortune.train.plots import plot_predictions

        plot_predictions(rows["task_id"], rows["label"], pred, plot, title=model.kind)
    return metrics.evaluate(rows, pred, networks=networks), per_second


def train(
    dataset: str | Path,
    *,
    model: str | CostModel = "xgb",
    split: str = "within-task",
    out: str | Path | None = None,
    params: dict | None = None,
) -> TrainResult:
    """Fit ``model`` (a kind or an unfitted model) on the split's training rows, score it on
    its test rows, and save it to ``out`` when given."""
    columns, card = _columns(dataset)
    train_mask, test_mask = split_masks(columns, split)
    estimator = model_class(model)(**(params or {})) if isinstance(model, str) else model
    train_set = ProgramSet.from_columns(columns, train_mask)
    start = time.perf_counter()
    estimator.fit(train_set)
    fit_seconds = time.perf_counter() - start
    estimator.provenance_ = {"dataset": card.get("name"), "split": split,
                             "train_programs": len(train_set)}  # fmt: skip
    scores, per_second = _score(estimator, columns, test_mask, card)
    if out is not None:
        estimator.save(out)
    return TrainResult(estimator, scores, len(train_set), int(test_mask.sum()), fit_seconds,
                       per_second)  # fmt: skip


def evaluate(
    model: str | Path | CostModel,
    *,
    dataset: str | Path | None = None,
    split: str | None = None,
    test_records: str | Path | None = None,
    plot: str | Path | None = None,
) -> dict:
    """TenSet's metrics of a model on a dataset split's test rows (default: the split it was
    trained with) or on a MetaSchedule JSON database measured elsewhere."""
    estimator = load_model(model) if not isinstance(model, CostModel) else model
    if test_records is not None:
        return _evaluate_records(estimator, test_records, plot)
    if dataset is None:
        raise TensortuneError("evaluate needs --dataset (with --split) or --test-records")
    columns, card = _columns(dataset)
    split = split or getattr(estimator, "provenance_", {}).get("split")
    if split is None:
        raise TensortuneError("give --split: the model file does not say how it was trained")
    _, test = split_masks(columns, split)
    scores, _ = _score(estimator, columns, test, card, plot)
    return scores


def _evaluate_records(estimator: CostModel, directory: str | Path, plot=None) -> dict:
    from tensortune.datasets.build import build_dataset
    from tensortune.records.interop import import_records
    from tensortune.records.storage import open_records

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'records.db'}"
        with open_records(url) as store:
            import_records(store, directory)
            card = build_dataset(store, Path(tmp) / "dataset").data
        columns, _ = _columns(Path(tmp) / "dataset")
        everything = np.ones(len(columns["task_id"]), bool)
        scores, _ = _score(estimator, columns, everything, card, plot)
    return scores


def format_metrics(scores: dict) -> str:
    return json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in scores.items()})
