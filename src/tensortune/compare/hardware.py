"""The held-out-hardware study (``tensortune bench hardware``): how well a cost model trained on
other machines ranks the programs of a machine it never saw, and how many of that machine's
measurements it takes to catch up (Verma et al.'s transfer; ``algorithms.md`` §5, §13).

One hardware ``H`` of the dataset is the new machine; for each fold, the tasks of the fold's
held-out networks are the test set, on ``H`` only, and no arm trains on any of those tasks on
any machine (so every figure is on unseen networks too).  Per fold and seed, the same model kind:

- ``full``: trained on all of ``H``'s other rows: the reference a transferred model is held to;
- ``zero-shot``: trained on the other machines' rows, never a row of ``H``'s machine in any
  configuration (the fingerprint after ``@`` names the machine);
- ``finetune-k``: the zero-shot model fine-tuned on ``k`` of ``H``'s training rows
  (``train/finetune.py``: whole tasks in a seeded order, up to 16 programs each);
- ``scratch-k``: a new model trained on the same ``k`` rows alone;
- ``moa-k``: the zero-shot model adapted by MoA (``costmodel/moa.py``), the ``k`` rows arriving
  16 at a time as they would while tuning, a retrain after each; only for ``k`` above 16: MoA's
  gate judges an adaptation on the batch after it, so from one batch it keeps the zero-shot
  model, and the arm would be that model under another name.

Scored with TenSet's metrics on the test rows; ``summary`` gives each arm's mean and standard
deviation over folds and seeds.
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tensortune.compare.summary import mean_and_sd, study_args
from tensortune.costmodel.base import CostModel
from tensortune.costmodel.data import ProgramSet
from tensortune.costmodel.registry import model_class, new_model
from tensortune.errors import TensortuneError, about, check_writable
from tensortune.train.finetune import (
    PER_TASK,
    adapt,
    check_refinable,
    on_hardware,
    same_cpu,
    sample_rows,
    sample_set,
)
from tensortune.train.metrics import RANK_METRICS as METRICS

KS = (16, 64, 256)
Progress = Callable[[str], None]


@dataclass
class HardwareStudy:
    rows: list[dict] = field(default_factory=list)
    setup: dict = field(default_factory=dict)

    def summary(self) -> list[dict]:
        """Mean and standard deviation over folds and seeds, per model and arm."""
        return mean_and_sd(self.rows, ("model", "arm"), METRICS)


def _held_out_rows(columns: dict, held_out: str) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``held_out``, and those of every other machine: its other configurations
    are the same CPU, so no arm counts them as another machine's, nor as its own (another
    thread count or ISA is not this configuration)."""
    on = on_hardware(columns, held_out)
    if not on.any():
        known = ", ".join(sorted(set(columns["hardware"])))
        raise TensortuneError(f"no row of the dataset was measured on '{held_out}'; it has: "
                              f"{known}", param="hardware")  # fmt: skip
    elsewhere = ~same_cpu(columns, on)
    if not elsewhere.any():
        raise TensortuneError(f"every row was measured on the CPU of '{held_out}': no other "
                              "hardware to transfer from", param="hardware")  # fmt: skip
    return on, elsewhere


def hardware_study(
    dataset: str | Path = "default",
    *,
    hardware: str,
    folds: Sequence[Sequence[str]],
    models: Sequence[str] = ("hwattn",),
    ks: Sequence[int] = KS,
    seeds: Sequence[int] = (0, 1, 2),
    params: dict[str, dict] | None = None,
    progress: Progress | None = None,
    checkpoint: str | os.PathLike | None = None,
) -> HardwareStudy:
    """Every arm of the module docstring for each fold (a list of held-out networks), model
    and seed.  ``checkpoint``: a file that keeps each finished fold, model and seed
    (``compare.checkpoint``)."""
    from tensortune.compare.checkpoint import Checkpoint, dataset_identity
    from tensortune.train.trainer import dataset_columns

    tell = progress or (lambda _: None)
    seeds, models, ks = study_args(seeds, models=models, ks=ks)
    with about("models"):
        for kind in models:  # every arm but two fine-tunes: refused before any fit
            check_refinable(model_class(kind))
    if min(ks) < 2:
        raise TensortuneError(f"fine-tuning needs at least 2 programs, not {min(ks)}",
                              param="ks")  # fmt: skip
    if not folds:
        raise TensortuneError("name at least one fold of held-out networks", param="folds")
    check_writable(checkpoint, "checkpoint")  # before the dataset's seconds of reading
    columns, card = dataset_columns(dataset)
    on_h, elsewhere = _held_out_rows(columns, hardware)
    task = np.asarray(columns["task"])
    result = HardwareStudy(setup={"dataset": card.get("name"), "hardware": hardware,
                                  "folds": [list(f) for f in folds], "models": list(models),
                                  "ks": list(ks), "seeds": list(seeds)})  # fmt: skip
    saved = Checkpoint(checkpoint, lambda: {
        "study": "hardware", "dataset": dataset_identity(dataset), "hardware": hardware,
        "ks": list(ks), "params": params or {}})  # fmt: skip
    for fold in folds:
        unknown = [n for n in fold if n not in card["networks"]]
        if unknown or not fold:
            raise TensortuneError(f"fold {list(fold)}: {unknown[0] if unknown else 'empty'} is "
                                  f"not a network of the dataset", param="folds")  # fmt: skip
        of_fold = np.array([bool(set(ns) & set(fold)) for ns in columns["networks"]])
        # A kernel a held-out network shares with another network is held out with it.
        held_tasks = set(task[of_fold].tolist())
        held = np.isin(task, list(held_tasks))
        test = on_h & held
        if not test.any():
            raise TensortuneError(f"fold {list(fold)} has no row on {hardware}", param="folds")
        target_train, other_train = on_h & ~held, elsewhere & ~held
        for kind in models:
            for seed in seeds:
                run = _Run(columns, card, test, "+".join(fold), kind, seed, result, tell,
                           list(fold))  # fmt: skip
                settings = (params or {}).get(kind, {})
                arms = functools.partial(run.arms, target_train, other_train, ks, settings)
                if saved.unit(result.rows, ("+".join(fold), kind, seed), arms):
                    tell(f"{run.fold} {kind} seed {seed}: finished before")
    return result


@dataclass
class _Run:
    """One fold, model kind and seed: fits each arm and scores it on the test rows."""

    columns: dict
    card: dict
    test: np.ndarray
    fold: str
    kind: str
    seed: int
    result: HardwareStudy
    tell: Progress
    networks: Sequence[str]  # the fold's held-out networks, scored

    def scored(self, arm: str, model: CostModel, k: int | None = None) -> None:
        from tensortune.train.trainer import score_model

        scores, _ = score_model(model, self.columns, self.test, self.card,
                                held_out=self.networks)  # fmt: skip
        row = {"fold": self.fold, "model": self.kind, "seed": self.seed, "arm": arm, "k": k}
        self.result.rows.append(row | {m: scores[m] for m in METRICS})
        self.tell(f"{self.fold} {self.kind} seed {self.seed}: {arm} PCA {scores['pca']:.3f} "
                  f"top-1 {scores['top1_score']:.3f}")  # fmt: skip

    def arms(self, target_train: np.ndarray, other_train: np.ndarray, ks: Sequence[int],
             settings: dict) -> None:  # fmt: skip
        from tensortune.costmodel.moa import MomentumAdapted, can_adapt

        columns, kind, seed = self.columns, self.kind, self.seed
        full = new_model(kind, seed, settings).fit(ProgramSet.from_columns(columns, target_train))
        self.scored("full", full)
        zero = new_model(kind, seed, settings).fit(ProgramSet.from_columns(columns, other_train))
        self.scored("zero-shot", zero)
        for k in ks:
            rows = sample_rows(columns, k, seed, among=target_train)
            sample = sample_set(columns, rows)
            self.scored(f"finetune-{k}", adapt(copy.deepcopy(zero), sample), k)
            self.scored(f"scratch-{k}", new_model(kind, seed, settings).fit(sample), k)
            if can_adapt(zero) and len(rows) > PER_TASK:
                moa = MomentumAdapted(copy.deepcopy(zero), every=1)
                for start in range(0, len(rows), PER_TASK):
                    stop = min(start + PER_TASK, len(rows))
                    # all rows so far as one set: a task a batch boundary cuts stays one group
                    moa.update(sample.subset(np.arange(start, stop)),
                               seen=sample.subset(np.arange(stop)))  # fmt: skip
                self.scored(f"moa-{k}", moa, k)
