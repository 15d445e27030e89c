"""The split study (``tensortune bench splits``): one model, trained and scored under each way
of splitting a dataset, to show how much a record-level split overstates what a model knows
about networks and machines it has never seen (Verma et al.; ``algorithms.md`` §2.2, §5).

- ``within-task``: TenSet's default: each task's programs split 90/10, every task on both
  sides (one fold; seeds vary only the model);
- ``by-task``: whole tasks, seeded, 90% of the rows train (one fold per seed);
- ``by-network``: each network in turn is held out with every task it has (one fold each);
- ``by-hardware``: each machine in turn is held out, every configuration of its CPU (one fold
  each: a model trained on another configuration of a machine has seen it).

Every fold is scored with TenSet's metrics on its test rows; ``summary`` gives each split's
mean and standard deviation over folds and seeds, and how far its PCA lies above by-network's.
``measurement_ceiling`` scores the measurements themselves the same way: what a model could
at best be credited with, given how much a program's timing repeats disagree.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tensortune.compare.summary import mean_and_sd, study_args
from tensortune.costmodel.data import ProgramSet
from tensortune.costmodel.registry import model_class, new_model
from tensortune.datasets.build import cpu_of
from tensortune.errors import about, check_writable
from tensortune.train.metrics import RANK_METRICS as METRICS

SPLIT_KINDS = ("within-task", "by-task", "by-network", "by-hardware")
Progress = Callable[[str], None]


@dataclass
class SplitStudy:
    rows: list[dict] = field(default_factory=list)
    setup: dict = field(default_factory=dict)

    def summary(self) -> list[dict]:
        """Per model and split: mean and standard deviation over folds and seeds, and the PCA
        above by-network's (what a record-level figure overstates for an unseen network)."""
        out = mean_and_sd(self.rows, ("model", "split"), METRICS)
        for e in out:
            e["folds"] = len({r["fold"] for r in self.rows
                              if (r["model"], r["split"]) == (e["model"], e["split"])})  # fmt: skip
            ref = next((o for o in out if o["model"] == e["model"] and o["split"] == "by-network"),
                       None)  # fmt: skip
            e["pca_over_by_network"] = None if ref is None else e["pca"] - ref["pca"]
        order = {s: i for i, s in enumerate(SPLIT_KINDS)}
        return sorted(out, key=lambda e: (e["model"], order[e["split"]]))


def measurement_ceiling(columns: dict, card: dict) -> dict | None:
    """TenSet's metrics of a "model" that knows each successful program's first timing repeat,
    scored against labels taken from its other repeats alone (best of the task / median of
    the rest): how well a second measurement agrees with the first.  A cost model trained
    on these labels cannot be expected to rank programs better.  None when no row has two
    repeats."""
    from tensortune.measure.status import Status
    from tensortune.train.metrics import score_predictions
    from tensortune.train.trainer import card_networks

    rows = [i for i, (secs, status) in enumerate(zip(columns["run_secs"], columns["status"],
                                                     strict=True))
            if status == Status.OK and secs is not None and len(secs) >= 2]  # fmt: skip
    if not rows:
        return None
    first = np.array([columns["run_secs"][i][0] for i in rows])
    rest = np.array([float(np.median(columns["run_secs"][i][1:])) for i in rows])
    keys = [(columns["task_id"][i], columns["hardware"][i]) for i in rows]
    best: dict[tuple, float] = {}
    for key, cost in zip(keys, rest, strict=True):
        best[key] = min(best.get(key, np.inf), cost)
    test = {"task_id": np.array([k[0] for k in keys]), "hardware": np.array([k[1] for k in keys]),
            "label": np.array([best[k] for k in keys]) / rest, "cost": rest}  # fmt: skip
    scores = score_predictions(test, 1.0 / first, networks=card_networks(card))
    return {m: scores[m] for m in (*METRICS, "programs")}


def split_specs(columns: dict, card: dict, kind: str, seed: int) -> list[tuple[str, str]]:
    """``(fold name, split spec)`` of one split kind (``train/trainer.split_masks`` specs)."""
    if kind == "within-task":
        return [("all tasks", "within-task")]
    if kind == "by-task":
        return [(f"seed {seed}", f"by-task:{seed}")]
    if kind == "by-network":
        return [(n, f"by-network:{n}") for n in card["networks"]]
    # One fold per machine, all of its configurations held out together: a model that trained
    # on another configuration of the same CPU has seen that machine.
    machines: dict[str, list[str]] = {}
    for h in sorted(set(columns["hardware"])):
        machines.setdefault(cpu_of(h), []).append(h)
    return [("+".join(names), "by-hardware:" + ",".join(names)) for names in machines.values()]


def split_study(
    dataset: str | Path = "default",
    *,
    splits: Sequence[str] = SPLIT_KINDS,
    models: Sequence[str] = ("xgb",),
    seeds: Sequence[int] = (0, 1, 2),
    params: dict[str, dict] | None = None,
    progress: Progress | None = None,
    checkpoint: str | os.PathLike | None = None,
) -> SplitStudy:
    """Each model under each split kind's folds, for each seed (module docstring).
    ``checkpoint``: a file that keeps each finished fold; a rerun with the same dataset and
    ``params`` fits only the folds it does not hold (``compare.checkpoint``)."""
    from tensortune.compare.checkpoint import Checkpoint, dataset_identity
    from tensortune.errors import TensortuneError
    from tensortune.train.trainer import (
        dataset_columns,
        score_model,
        split_masks,
        split_networks,
    )

    tell = progress or (lambda _: None)
    seeds, splits, models = study_args(seeds, splits=splits, models=models)
    with about("splits"):
        unknown = [s for s in splits if s not in SPLIT_KINDS]
        if unknown or not splits:
            raise TensortuneError(f"unknown split {unknown[0] if unknown else '(none)'}; "
                                  f"known: {', '.join(SPLIT_KINDS)}")  # fmt: skip
    with about("models"):
        for kind in models:
            model_class(kind)
    check_writable(checkpoint, "checkpoint")  # before the dataset's seconds of reading
    columns, card = dataset_columns(dataset)
    result = SplitStudy(setup={"dataset": card.get("name"), "programs": card.get("programs"),
                               "splits": list(splits), "models": list(models),
                               "seeds": list(seeds),
                               "measurement_ceiling": measurement_ceiling(columns,
                                                                          card)})  # fmt: skip
    # Every fold made before the first fit: a split this dataset cannot make (by-hardware
    # on one CPU's data, by-network on one network's) is left out with a note, not found
    # after the other splits' hours of fitting, their results lost with it.
    folds, skipped = [], {}
    for split in splits:
        try:
            folds += [(split, seed, fold, spec, split_masks(columns, spec)) for seed in seeds
                      for fold, spec in split_specs(columns, card, split, seed)]  # fmt: skip
        except TensortuneError as e:
            skipped[split] = e.message
            tell(f"{split}: left out, {e.message}")
    if not folds:
        raise TensortuneError(f"this dataset makes none of these splits: {skipped}",
                              param="splits")  # fmt: skip
    result.setup["skipped"] = skipped
    saved = Checkpoint(checkpoint, lambda: {"study": "splits", "params": params or {},
                                            "dataset": dataset_identity(dataset)})  # fmt: skip
    for kind in models:
        for split, seed, fold, spec, (train, test) in folds:

            def fit(kind: str = kind, split: str = split, seed: int = seed, fold: str = fold,
                    spec: str = spec, train: np.ndarray = train,
                    test: np.ndarray = test) -> None:  # fmt: skip
                model = new_model(kind, seed, (params or {}).get(kind, {}))
                model.fit(ProgramSet.from_columns(columns, train))
                scores, _ = score_model(model, columns, test, card,
                                        held_out=split_networks(spec))  # fmt: skip
                result.rows.append({"model": kind, "split": split, "fold": fold, "seed": seed,
                                    **{m: scores[m] for m in METRICS}})  # fmt: skip

            before = saved.unit(result.rows, (kind, split, seed, fold), fit)
            row = result.rows[-1]
            tell(
                f"{kind} {split} {fold} seed {seed}: PCA {row['pca']:.3f} "
                f"top-1 {row['top1_score']:.3f}{' (finished before)' if before else ''}"
            )
    return result
