"""The offline active-learning study (``tensortune bench al``): measurement simulated on a
labelled pool.

Each selector grows a labelled set from nothing to each fraction of the pool in a few rounds;
between rounds an acquisition model (GBDT by default) is refitted on what was "measured" and
the selector picks the next batch with it.  At each fraction the models under study are fitted
on the selection and scored on the held-out networks with TenSet's metrics
(``train/metrics.py``): PCA, top-1 and top-5 score.  Fraction 1 (the whole pool) is the same
for every selector and is fitted once per seed.

With a ``prior`` dataset the study asks BALTO's question for a CPU new to a dataset: the
models learn from the prior's rows of other CPUs (never the pool's CPU, never a held-out
network's task) plus the picks; the selector still judges with a model of the picks alone
(what is uncertain about this CPU, at the cost of small fits).  A row ``prior`` at fraction 0
scores the prior alone, so the table shows what each measurement on the new CPU added.

The overestimation diagnostic (BALTO's failure of plain diversity): per held-out task, the
share of the model's top-``k`` predicted programs whose true speed is in the task's slow
half (label below the task's median) or that failed, averaged over tasks.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tensortune.active import (
    FRACTIONS,
    ROUNDS_PER_STEP,
    Pool,
    grow,
    make_selector,
    pool_from_programs,
    study_sizes,
)
from tensortune.compare.summary import mean_and_sd, study_args
from tensortune.costmodel.base import CostModel
from tensortune.costmodel.data import ProgramSet, concat_programs
from tensortune.costmodel.registry import model_class, new_model
from tensortune.datasets.build import cpu_of
from tensortune.errors import TensortuneError, about, check_writable
from tensortune.train import metrics
from tensortune.train.selection import pool_mask

SELECTOR_NAMES = ("random", "diversity", "balto", "balto-weighted", "uncertainty", "alt")
OVERESTIMATION_K = 5
_SCORES = ("pca", "top1_score", "top5_score", "overestimation")
Progress = Callable[[str], None]


@dataclass
class StudyData:
    """A pool to select from and the held-out rows to score on (one hardware)."""

    pool: Pool
    test: ProgramSet
    test_rows: dict[str, np.ndarray]
    networks: dict[str, dict[int, int]] | None
    pool_rows: np.ndarray  # the dataset rows of the pool's programs, in pool order
    hardware: str
    held_out: list[str]
    task_names: list[str] = field(default_factory=list)  # of the pool's programs
    prior: ProgramSet | None = None  # other CPUs' rows every model also learns from
    prior_source: str | None = None  # the dataset they come from


@dataclass
class StudyResult:
    rows: list[dict] = field(default_factory=list)
    setup: dict = field(default_factory=dict)

    def summary(self) -> list[dict]:
        """Mean and standard deviation over seeds per selector, model and fraction."""
        by, metrics = ("selector", "model", "fraction"), (*_SCORES, "measured")

        def key(row: dict) -> tuple:
            return tuple(row[k] for k in by)

        # the means, spreads and run counts are of the scored rows; a selection of which
        # nothing ran is counted beside them, and one no seed scored keeps its NaN figures
        scored = [r for r in self.rows if not r.get("unscored")]
        out = mean_and_sd(scored, by, metrics)
        unscored = Counter(key(r) for r in self.rows if r.get("unscored"))
        seen = {key(e) for e in out}
        alone = [r for r in self.rows if r.get("unscored") and key(r) not in seen]
        out += [{**e, "runs": 0, "distinct": 0} for e in mean_and_sd(alone, by, metrics)]
        for e in out:
            e["unscored"] = unscored[key(e)]
            e["seeds"] = e.pop("runs")  # those the metrics average over
            e["measured"] = int(e["measured"])
            del e["measured_std"]
        return sorted(out, key=lambda e: (e["model"], e["selector"], e["fraction"]))


def load_study_data(dataset: str | Path, held_out: Sequence[str], *,
                    test_dataset: str | Path | None = None, hardware: str | None = None,
                    prior: str | Path | None = None) -> StudyData:  # fmt: skip
    """The pool (rows of ``dataset`` on one hardware whose tasks occur in no held-out network),
    the test rows (held-out networks' rows of ``test_dataset``, default the same dataset, on
    the same hardware configuration; with ``prior``, on the pool's CPU alone) and, with
    ``prior``, that dataset's rows of other CPUs (``prior_programs``)."""
    from tensortune.train.trainer import card_networks, dataset_columns, scored_rows

    held = [n for n in held_out if n]
    if not held:
        raise TensortuneError("name the held-out networks to score on", param="held_out")
    columns, card = dataset_columns(dataset)
    test_columns, test_card = (columns, card) if test_dataset is None else dataset_columns(
        test_dataset, param="test_dataset")  # fmt: skip
    unknown = [n for n in held if n not in test_card["networks"]]
    if unknown:
        raise TensortuneError(f"{unknown[0]} is not a network of the test dataset; it has: "
                              f"{', '.join(test_card['networks'])}", param="held_out")  # fmt: skip
    pool_rows, hardware = pool_mask(columns, held, hardware)
    config = hardware.split("@")[0]
    test_hw = np.array([h.split("@")[0] == config for h in test_columns["hardware"]])
    where = config
    if prior is not None:  # the prior learned the other CPUs: what it adds shows on this one
        test_hw &= np.array([cpu_of(h) == cpu_of(hardware) for h in test_columns["hardware"]])
        where = hardware
    is_test = test_hw & np.array([bool(set(ns) & set(held)) for ns in test_columns["networks"]])
    if not is_test.any():
        raise TensortuneError(f"the held-out networks have no rows on {where}", param="held_out")
    # A kernel of a held-out network that the pool holds too would leak its labels.
    banned = {test_columns["task"][i] for i in np.flatnonzero(is_test)}
    pool_rows = np.array([i for i in pool_rows if columns["task"][i] not in banned], dtype=int)
    if not len(pool_rows):
        raise TensortuneError("no pool left: every task of it is a held-out network's")
    pool = pool_from_programs(ProgramSet.from_columns(columns, pool_rows))
    networks = card_networks(test_card)
    rows = scored_rows(test_columns, is_test)
    if networks is not None:
        present = set(rows["task_id"].tolist())
        networks = {n: w for n, w in networks.items() if n in held and present & set(w)} or None
    known = None if prior is None else prior_programs(
        prior, hardware, held, banned, first_group=int(pool.task.max()) + 1,
        columns=columns if str(prior) == str(dataset) else None)  # fmt: skip
    return StudyData(pool, ProgramSet.from_columns(test_columns, is_test), rows, networks,
                     pool_rows, hardware, held, [columns["task_name"][i] for i in pool_rows],
                     known, None if prior is None else str(prior))  # fmt: skip


def prior_programs(dataset: str | Path, hardware: str, held_out: Sequence[str],
                   banned_tasks: set, *, first_group: int,
                   columns: dict | None = None) -> ProgramSet:  # fmt: skip
    """``dataset``'s ``prior_rows`` (read from ``columns`` when it has been read already),
    their groups numbered from ``first_group`` on (apart from the pool's)."""
    from tensortune.train.trainer import dataset_columns

    columns = columns if columns is not None else dataset_columns(dataset, param="prior")[0]
    keep = prior_rows(columns, hardware, held_out, banned_tasks)
    if not len(keep):
        raise TensortuneError(f"{dataset} has no rows of another CPU than {hardware} outside "
                              "the held-out networks", param="prior")  # fmt: skip
    programs = ProgramSet.from_columns(columns, keep)
    programs.groups = programs.groups + first_group
    return programs


def prior_rows(columns: dict, hardware: str, held_out: Sequence[str],
               banned_tasks: set) -> np.ndarray:  # fmt: skip
    """The rows with features on CPUs other than ``hardware``'s (its fingerprint, after ``@``:
    the configurations derived from one CPU share it) whose task is in no held-out network and
    not among ``banned_tasks``."""
    cpu, held = cpu_of(hardware), set(held_out)
    return np.array([
        i for i, (hw, task, nets) in enumerate(zip(columns["hardware"], columns["task"],
                                                   columns["networks"], strict=True))
        if cpu_of(hw) != cpu and task not in banned_tasks and not held & set(nets)
        and columns["per_store"][i] is not None
    ], dtype=int)  # fmt: skip


def overestimation(pred: np.ndarray, rows: dict[str, np.ndarray],
                   k: int = OVERESTIMATION_K) -> float:  # fmt: skip
    """Mean over test tasks of the share of the top-``k`` predicted programs that are in the
    task's slow half (see the module docstring)."""
    shares = []
    keys = np.array([f"{h}|{t}" for h, t in zip(rows["hardware"], rows["task_id"], strict=True)])
    for key in np.unique(keys):
        idx = np.flatnonzero(keys == key)
        if len(idx) < 2 * k:
            continue
        label = rows["label"][idx]
        top = idx[metrics._picks(pred[idx], label)[:k]]  # ties worst-first, as every metric
        slow = (rows["label"][top] < np.median(label)) | (rows["label"][top] <= 0)
        shares.append(float(np.mean(slow)))
    return float(np.mean(shares)) if shares else math.nan


def score_selection(data: StudyData, labelled: np.ndarray, result: StudyResult, *,
                    selector: str, fraction: float, seed: int, models: Sequence[str],
                    params: dict[str, dict], tell: Progress) -> None:  # fmt: skip
    """Fit each of ``models`` on the pool programs at ``labelled`` (labels against the best
    of each task among them), score it on the held-out rows and add a row to ``result``.

    A selection of which no program ran teaches nothing to fit: its rows carry NaN metrics
    and the reason (``unscored``), so the summary says how many seeds it averages over
    instead of averaging over fewer without a word."""
    train = data.pool.labelled(labelled)
    if data.prior is not None:
        train = concat_programs([data.prior, train])
    if not np.any(train.labels > 0):
        why = f"none of the {len(labelled)} programs picked ran"
        for kind in models:
            result.rows.append({
                "selector": selector, "model": kind, "fraction": fraction, "seed": seed,
                "measured": len(labelled), **dict.fromkeys(_SCORES, float("nan")),
                "unscored": why,
            })  # fmt: skip
        tell(f"{selector} seed {seed} {fraction:g}: not scored, {why}")
        return
    for kind in models:
        model = new_model(kind, seed, params.get(kind)).fit(train)
        pred = model.predict(data.test)
        if np.isnan(pred).any():  # e.g. a network diverged under the settings given
            raise TensortuneError(f"the {kind} model trained on {selector}'s picks predicts "
                                  f"NaN for {int(np.isnan(pred).sum())} programs")  # fmt: skip
        scores = metrics.score_predictions(data.test_rows, pred, networks=data.networks)
        result.rows.append({
            "selector": selector, "model": kind, "fraction": fraction, "seed": seed,
            "measured": len(labelled), "pca": scores["pca"],
            "top1_score": scores["top1_score"], "top5_score": scores["top5_score"],
            "overestimation": overestimation(pred, data.test_rows),
        })  # fmt: skip
        tell(f"{selector} seed {seed} {fraction:g} ({len(labelled)} programs) {kind}: "
             f"PCA {scores['pca']:.3f} top-1 {scores['top1_score']:.3f}")  # fmt: skip


def study(
    dataset: str | Path = "pool",
    *,
    held_out: Sequence[str],
    selectors: Sequence[str] = SELECTOR_NAMES,
    fractions: Sequence[float] = FRACTIONS,
    models: Sequence[str] = ("xgb", "mlp"),
    seeds: Sequence[int] = (0, 1, 2),
    acquisition: str = "xgb",
    test_dataset: str | Path | None = None,
    hardware: str | None = None,
    params: dict[str, dict] | None = None,
    progress: Progress | None = None,
    data: StudyData | None = None,
    prior: str | Path | None = None,
    checkpoint: str | os.PathLike | None = None,
) -> StudyResult:
    """Each selector's picks at each fraction of the pool, each model fitted on them (and on
    ``prior``'s rows of other CPUs, when given) and scored on the held-out networks, for each
    seed (see the module docstring).  ``params`` maps a model kind to its settings (the
    acquisition model's too).  ``checkpoint``: a file that keeps each selector's finished
    seeds; a rerun with the same settings runs only the ones it does not hold
    (``compare.checkpoint``)."""
    from tensortune.compare.checkpoint import Checkpoint

    tell = progress or (lambda _: None)
    seeds, selectors, models = study_args(seeds, selectors=selectors, models=models)
    with about("selectors"):
        for s in selectors:
            make_selector(s)
    with about("models"):
        for kind in {*models, acquisition}:
            model_class(kind)
    with about("fractions"):
        fracs = sorted({float(f) for f in fractions})
        if not fracs or not all(0 < f <= 1 for f in fracs):  # NaN fails too
            raise TensortuneError(f"fractions must lie in (0, 1], not {list(fractions)}")
    params = params or {}
    check_writable(checkpoint, "checkpoint")  # before the dataset's seconds of reading
    data = data or load_study_data(dataset, held_out, test_dataset=test_dataset,
                                   hardware=hardware, prior=prior)  # fmt: skip
    pool = data.pool
    result = StudyResult(setup={
        "pool_programs": len(pool), "pool_tasks": len(np.unique(pool.task)),
        "test_programs": len(data.test), "test_tasks": len(np.unique(data.test_rows["task_id"])),
        "held_out": data.held_out, "hardware": data.hardware, "acquisition": acquisition,
        "rounds_per_step": ROUNDS_PER_STEP, "overestimation_k": OVERESTIMATION_K,
        "models": list(models), "seeds": list(seeds), "fractions": fracs,
        "prior": None if data.prior is None else {"dataset": data.prior_source,
                                                  "programs": len(data.prior)},
    })  # fmt: skip

    def make(kind: str, seed: int) -> CostModel:
        return new_model(kind, seed, params.get(kind))

    def score(selector: str, seed: int, labelled: np.ndarray, fraction: float) -> None:
        score_selection(data, labelled, result, selector=selector, fraction=fraction,
                        seed=seed, models=models, params=params, tell=tell)  # fmt: skip

    partial = [f for f in fracs if f < 1]
    sizes = study_sizes(fracs, len(pool))
    saved = Checkpoint(
        checkpoint,
        lambda: study_setup("al", result, data, params, [dataset, test_dataset, prior], ["seeds"]),
    )

    def unit(name: str, seed: int, run: Callable[[], None]) -> None:
        if saved.unit(result.rows, (name, seed), run):
            tell(f"{name} seed {seed}: finished before")

    for seed in seeds:
        if data.prior is not None:
            unit("prior", seed, lambda seed=seed: score("prior", seed, np.zeros(0, dtype=int),
                                                        0.0))  # fmt: skip
        if fracs[-1] == 1:
            unit("all", seed, lambda seed=seed: score("all", seed, np.arange(len(pool)), 1.0))
        for name in selectors:
            unit(name, seed, lambda name=name, seed=seed: grow(
                name, pool, sizes, seed=seed, acquisition=lambda: make(acquisition, seed),
                on_size=lambda i, lab: score(name, seed, lab, partial[i])))  # fmt: skip
    return result


def study_setup(study: str, result: StudyResult, data: StudyData, params: dict,
                datasets: Sequence[str | Path | None], keys: Sequence[str]) -> dict:  # fmt: skip
    """What a study's units depend on besides their own key (``keys`` of ``result.setup``
    are parts of it): its settings, the ``datasets`` it read (``dataset_identity``), and the
    pool, test rows and prior as their rows, tasks and labels or costs say
    (``compare.checkpoint``)."""
    from tensortune.compare.checkpoint import dataset_identity

    return {
        "study": study, "params": params,
        "datasets": [dataset_identity(d) for d in datasets],
        "setup": {k: v for k, v in result.setup.items() if k not in keys},
        "pool": _digest(data.pool_rows, data.pool.task, data.pool.labels),
        "test": _digest(data.test_rows["task_id"], data.test_rows["cost"]),
        "prior_rows": None if data.prior is None else _digest(data.prior.groups,
                                                              data.prior.labels),
    }  # fmt: skip


def _digest(*arrays: object) -> str:
    """A checksum of arrays' values: what a checkpoint's rows were computed from."""
    import hashlib

    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(np.asarray(a, dtype=np.float64)).tobytes())
    return h.hexdigest()[:32]


def plot_study(result: StudyResult, out: str | Path, *, counted: str = "measured") -> None:
    """PCA, top-1 score and the overestimation diagnostic against programs measured, one line
    per selector (mean ± standard deviation over seeds), one row of panels per model; the
    whole-pool model as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    summary = result.summary()
    kinds = sorted({e["model"] for e in summary})
    panels = (("pca", "PCA"), ("top1_score", "top-1 score"), ("overestimation",
              f"top-{OVERESTIMATION_K} predicted in slow half"))  # fmt: skip
    fig, axes = plt.subplots(len(kinds), len(panels), figsize=(4.2 * len(panels),
                             3.4 * len(kinds)), squeeze=False)  # fmt: skip
    for row, kind in zip(axes, kinds, strict=True):
        mine = [e for e in summary if e["model"] == kind]
        for ax, (key, title) in zip(row, panels, strict=True):
            picked = [e["selector"] for e in mine if e["selector"] not in ("all", "prior")]
            for sel in dict.fromkeys(picked):
                pts = sorted((e for e in mine if e["selector"] == sel), key=lambda e: e["measured"])
                ax.errorbar([e["measured"] for e in pts], [e[key] for e in pts],
                            yerr=[e[f"{key}_std"] for e in pts], label=sel, marker="o",
                            ms=3, capsize=2)  # fmt: skip
            full = [e for e in mine if e["selector"] == "all"]
            alone = [e for e in mine if e["selector"] == "prior"]
            if full:
                ax.axhline(full[0][key], color="grey", ls="--", lw=1,
                           label="whole pool" + (" and prior" if alone else ""))  # fmt: skip
            if alone:  # nothing measured: no place on a log axis
                ax.axhline(alone[0][key], color="black", ls=":", lw=1, label="prior alone")
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # 2x10^2, 3x10^2... overlap
            ax.set_xlabel(f"programs {counted}")
            ax.set_title(f"{kind}: {title}", fontsize=10)
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1))
    setup = result.setup
    prior = setup.get("prior")
    fig.suptitle(
        f"held out: {', '.join(setup.get('held_out', []))}; pool "
        f"{setup.get('pool_programs')} programs of {setup.get('pool_tasks')} tasks on "
        f"{setup.get('hardware')}; {len(setup.get('seeds', []))} seeds"
        + (f"; prior: {prior['programs']} programs of other CPUs" if prior else ""),
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=120, bbox_inches="tight")
    plt.close(fig)
