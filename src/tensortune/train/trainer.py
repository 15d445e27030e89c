"""``tensortune train`` / ``evaluate``: fit a cost model on a dataset split and score it with
TenSet's metrics."""

from __future__ import annotations

import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensortune.costmodel.base import CostModel
from tensortune.costmodel.data import ProgramSet
from tensortune.costmodel.registry import check_settings, load_cost_model, model_class
from tensortune.errors import TensortuneError, about, check_flags, check_writable
from tensortune.train import metrics, splits

SPLITS = ("within-task", "by-task[:SEED]", "by-network:NET[,NET...]", "by-hardware:HW[,HW...]")
Progress = Callable[[str, int, int], None]  # stage, done, total


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
        if name == "within-task" and not arg:
            return splits.within_task(columns["task_id"], columns["program_id"],
                                      hardware=columns["hardware"])  # fmt: skip
        if name == "by-task" and len(held) <= 1 and all(h.isdigit() for h in held):
            return splits.by_task(columns["task_id"], seed=int(held[0]) if held else 0)
        if name == "by-network" and held:
            return splits.by_network(columns["networks"], held, task_id=columns["task_id"])
        if name == "by-hardware" and held:
            return splits.by_hardware(columns["hardware"], held)
    except ValueError as e:
        raise TensortuneError(f"split {spec!r}: {e}") from None
    raise TensortuneError(f"unknown split {spec!r}; use one of: {', '.join(SPLITS)}")


def dataset_columns(dataset: str | Path, *, param: str = "dataset") -> tuple[dict, dict]:
    """The table's columns and the card of a dataset directory or shipped dataset's name;
    ``lowered`` too (an array) when the dataset has current lowered-loop features.  Errors
    say they are about the option ``param`` (the one that named the dataset)."""
    from tensortune.datasets.build import load_table, read_card, table_columns
    from tensortune.datasets.lowered import read_lowered
    from tensortune.datasets.shipped import dataset_path

    with about(param):
        directory = dataset_path(dataset)
        card = read_card(directory).data
        columns = table_columns(load_table(directory))
        lowered = read_lowered(directory, columns["program_id"])
        if lowered is not None:
            columns["lowered"] = lowered
        return columns, card


def card_networks(card: dict) -> dict[str, dict[int, int]] | None:
    weights = card.get("task_weights") or {}
    return {n: {int(t): int(w) for t, w in ws.items()} for n, ws in weights.items()} or None


def scored_rows(columns: dict, mask: np.ndarray) -> dict[str, np.ndarray]:
    """What ``score_predictions`` reads (task, hardware, label, cost; a failed program's cost
    is inf) of the rows under ``mask`` that have features: the rows, in the order, that
    ``ProgramSet.from_columns(columns, mask)`` holds and a model's predictions follow."""
    kept = np.array([i for i in np.flatnonzero(mask) if columns["per_store"][i] is not None],
                    dtype=int)  # fmt: skip
    costs = np.asarray(columns["cost"], dtype=object)[kept]
    return {
        "task_id": np.asarray(columns["task_id"])[kept],
        "hardware": np.asarray(columns["hardware"])[kept],
        "label": np.asarray(columns["label"], dtype=float)[kept],
        "cost": np.array([np.inf if c is None else float(c) for c in costs]),
    }


def split_networks(split: str) -> list[str] | None:
    """The networks a ``by-network`` split spec holds out (``None`` for other splits)."""
    name, _, arg = split.partition(":")
    if name != "by-network":
        return None
    return [a for a in arg.split(",") if a] or None


def score_model(model: CostModel, columns: dict, test: np.ndarray, card: dict,
                plot: str | Path | None = None, *,
                held_out: Sequence[str] | None = None) -> tuple[dict, float]:  # fmt: skip
    """TenSet's metrics of ``model`` on the rows under ``test``, and its predictions a second.
    The top-k scores are over the networks with a task there, or over ``held_out`` alone
    when the test rows are held-out networks' (a network that shares one kernel with them
    would otherwise count as a network of one kernel)."""
    data = ProgramSet.from_columns(columns, test)
    if not len(data):
        raise TensortuneError("no test rows with features to score the model on")
    start = time.perf_counter()
    pred = model.predict(data)
    per_second = len(data) / max(time.perf_counter() - start, 1e-9)
    if np.isnan(pred).any():  # e.g. weights damaged in a shared model file
        raise TensortuneError(f"the {model.kind} model predicts NaN for "
                              f"{int(np.isnan(pred).sum())} of {len(pred)} programs")  # fmt: skip
    rows = scored_rows(columns, test)
    networks = card_networks(card)
    if networks is not None:
        present = set(rows["task_id"].tolist())
        networks = {n: w for n, w in networks.items() if present & set(w)
                    and (held_out is None or n in held_out)} or None  # fmt: skip
    if plot is not None:
        from tensortune.train.plots import plot_predictions

        plot_predictions(rows["task_id"], rows["label"], pred, plot, title=model.kind,
                         hardware=rows["hardware"])  # fmt: skip
    return metrics.score_predictions(rows, pred, networks=networks), per_second


def train(
    dataset: str | Path,
    *,
    cost_model: str | CostModel = "xgb",
    split: str = "within-task",
    out: str | Path | None = None,
    params: dict | None = None,
    progress: Progress | None = None,
) -> TrainResult:
    """Fit ``cost_model`` (a kind, see ``costmodel.registry``, or an unfitted model) on the
    split's training rows of ``dataset`` (a directory, or ``default`` for the shipped one),
    score it on its test rows, and save it to ``out`` when given.

    ``progress(stage, done, total)`` hears the stages (``read``, ``fit``, ``score``) and the
    training steps of the fit.
    """
    check_writable(out, "out")
    from tensortune.costmodel.progress import training_progress

    tell = progress or (lambda stage, done, total: None)
    with about("cost_model"):
        if isinstance(cost_model, str):
            kind = model_class(cost_model)
            with about("params"):
                settings = check_settings(cost_model, params or {})
            estimator = kind(**settings)
        else:
            estimator = cost_model
    tell("read", 0, 1)
    columns, card = dataset_columns(dataset)
    with about("split"):
        train_mask, test_mask = split_masks(columns, split)
    train_set = ProgramSet.from_columns(columns, train_mask)
    start = time.perf_counter()
    with training_progress(lambda done, total: tell("fit", done, total)):
        estimator.fit(train_set)
    fit_seconds = time.perf_counter() - start
    estimator.provenance_ = {"dataset": card.get("name"), "split": split,
                             "train_programs": len(train_set)}  # fmt: skip
    tell("score", 0, 1)
    scores, per_second = score_model(estimator, columns, test_mask, card,
                                     held_out=split_networks(split))  # fmt: skip
    if out is not None:
        estimator.save(out)
    # The programs scored (rows without features are left out of both sets alike).
    return TrainResult(estimator, scores, len(train_set), int(scores["programs"]), fit_seconds,
                       per_second)  # fmt: skip


def evaluate(
    cost_model: str | Path | CostModel,
    *,
    dataset: str | Path | None = None,
    split: str | None = None,
    test_records: str | Path | None = None,
    plot: str | Path | None = None,
    target: dict | str | None = None,
    measured_here: bool = False,
) -> dict:
    """TenSet's metrics of a model on a dataset split's test rows (default: the split it was
    trained with) or on a MetaSchedule JSON database measured elsewhere (``test_records``).

    ``cost_model`` is a model file, a ``CostModel`` or ``default``: the model shipped for
    ``target`` (default: this CPU), as ``tune --cost-model default`` picks it.
    ``measured_here``: ``test_records`` were measured on this machine, so their rows carry its
    hardware vector (as ``finetune`` reads a database); otherwise a database, which does not
    say what it ran on, gets a stand-in machine's, which a hardware-aware model reads too.
    """
    check_writable(plot, "plot")
    check_flags(measured_here=measured_here)
    with about("cost_model"):
        estimator = _model(cost_model, target)
    if test_records is not None:
        if dataset is not None or split is not None:
            raise TensortuneError("scores a model on test records or on a dataset's split, "
                                  "not both", param="test_records")  # fmt: skip
        with about("test_records"):
            return _evaluate_records(estimator, test_records, plot, measured_here)
    if measured_here:
        raise TensortuneError("says where test records were measured: a dataset's rows name "
                              "their machine", param="measured_here")  # fmt: skip
    if dataset is None:
        raise TensortuneError("give a dataset (with its split) or test records", param="dataset")
    columns, card = dataset_columns(dataset)
    provenance = getattr(estimator, "provenance_", None) or {}
    split = split or provenance.get("split")
    warning = other_dataset(provenance, card, split)
    if warning:
        warnings.warn(f"tensortune: {warning}", stacklevel=2)
    if split is None:
        raise TensortuneError("the model file does not say how it was trained: give the split",
                              param="split")  # fmt: skip
    with about("split"):
        _, test = split_masks(columns, split)
    scores, _ = score_model(estimator, columns, test, card, plot,
                            held_out=split_networks(split))  # fmt: skip
    return scores


def other_dataset(provenance: dict, card: dict, split: object) -> str | None:
    """What is wrong with scoring a model trained on one dataset on a random split
    (within-task, by-task) of another: that is another set of test rows, some of which the
    model may have learned; None where nothing is (splits by network or hardware pick their
    rows by name, in any version of a dataset)."""
    trained_on, name = provenance.get("dataset"), card.get("name")
    if not (trained_on and name and trained_on != name):
        return None
    if not str(split).startswith(("within-task", "by-task")):
        return None
    return (f"the model was trained on {trained_on}, not on {name}: programs both hold may "
            "be in its training rows and in these test rows")  # fmt: skip


def _model(cost_model: str | Path | CostModel, target: dict | str | None) -> CostModel:
    if isinstance(cost_model, CostModel):
        if not cost_model.fitted:
            raise TensortuneError(f"this {cost_model.kind} model has not been fitted")
        return cost_model
    if str(cost_model) == "default":
        from tensortune.costmodel.shipped import shipped_model
        from tensortune.hardware import resolve_platform

        with about("target"):
            platform = resolve_platform(target, measurable=False)
        return load_cost_model(shipped_model(platform))
    return load_cost_model(cost_model)


def records_columns(directory: str | Path, *, measured_here: bool = False,
                    lowered: bool = False) -> tuple[dict, dict]:  # fmt: skip
    """A MetaSchedule JSON database's records as a dataset's columns and card (built in a
    temporary directory); ``measured_here`` takes them as this machine's measurements, so
    their hardware vector is this machine's; ``lowered``: with the programs' lowered-loop
    features (``dataset lower``'s, one worker per usable core), for a model that reads them."""
    from tensortune.datasets.build import build_dataset
    from tensortune.datasets.lowered import lower_dataset
    from tensortune.hardware import usable_cores
    from tensortune.records import open_records
    from tensortune.records.interop import import_records

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'records.db'}"
        with open_records(url) as store:
            if not import_records(store, directory, measured_here=measured_here).records:
                raise TensortuneError(f"{directory} holds no tuning records")
            card = build_dataset(store, Path(tmp) / "dataset").data
        if lowered:
            lower_dataset(Path(tmp) / "dataset", workers=usable_cores())
        try:
            columns, _ = dataset_columns(Path(tmp) / "dataset")
        except TensortuneError as e:  # about the records given, not a temporary directory
            why = e.message.replace(f"{Path(tmp) / 'dataset'}/", "")
            raise TensortuneError(f"{directory}: its records make no usable dataset "
                                  f"({why})") from None  # fmt: skip
    return columns, card


def _evaluate_records(estimator: CostModel, directory: str | Path, plot=None,
                      measured_here: bool = False) -> dict:  # fmt: skip
    columns, card = records_columns(directory, measured_here=measured_here,
                                    lowered=estimator.uses_lowered)  # fmt: skip
    everything = np.ones(len(columns["task_id"]), bool)
    scores, _ = score_model(estimator, columns, everything, card, plot)
    return scores
