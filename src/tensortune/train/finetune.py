"""``tensortune finetune``: adapt a trained cost model to new hardware from a few measurements.

A model trained on other machines ranks a new machine's programs from what it learned there
(zero-shot); ``k`` programs measured on the new machine teach it what differs (few-shot).  A
neural model keeps its input scaling and trains further on the sample for a number of
optimizer steps: only the modules it names ``adapted`` (``hwattn``: its hardware branch, the
rest being what all machines share), else every weight.  A GBDT adds boosting rounds fitted to
the sample (its ``refine_rounds``).

Why only the hardware branch: on ttset-cpu-v2, holding out the EPYC machine (``avx512-1c``)
and one network at a time (resnet18, bert-base, vit-tiny; 3 samples each), fine-tuning every
weight of ``hwattn`` on 16 or 64 programs lowered PCA by 1.7-2.1 points below zero-shot (and
more with more steps); the hardware branch alone moved it by -0.5 to +0.4 points.

How long to fine-tune is checked on the sample itself, since more steps are not always
better: on every machine held out so far (ttset-cpu-v3 to v5) fine-tuning ``hwattn`` on 16 or
64 programs of other tasks ranked the test network 1 to 5 points *below* the zero-shot model.
So ``adapt`` holds out part of the sample (whole tasks when it has two or more, else half the
programs of its one task), fine-tunes a copy on the rest for each length of ``LENGTHS``
(``0`` leaves the model as it came), scores each on what was held out by pairwise accuracy
within tasks, and trains on the whole sample for the best length; a longer one must beat a
shorter one by ``MARGIN``.
This is plain model selection by cross-validation.  A neural model's lengths are nested, so
each fold trains once, to the longest, and is scored at each length on the way (a GBDT
refines once per fold); seconds on a sample of 256.

Which ``k`` programs: the first ``k`` successful ones in measurement order (the default:
what a user who has just tuned a few tasks has), or, with a seed, whole tasks in a seeded
order, up to ``PER_TASK`` programs of each.  Rankings are learned from pairs of programs of
one task, so ``k`` programs spread over ``k`` tasks would teach a ranking model nothing.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensortune.costmodel.base import CostModel
from tensortune.costmodel.data import ProgramSet
from tensortune.costmodel.nn import _RankModel
from tensortune.datasets.build import cpu_of
from tensortune.errors import TensortuneError, check_flags, check_seed, check_writable

PER_TASK = 16
# Fine-tuning a neural model: optimizer steps, not passes, so that k = 16 (one step a pass)
# moves the weights as much as k = 256 (four steps a pass).
STEPS = 100
# The lengths the validation tries for a neural model, as shares of ``steps``.
LENGTHS = (0.0, 0.25, 1.0)
# How much better on held-out pairs a longer training must score than a shorter one to be
# chosen: smaller gains are within the noise of a sample's few hundred pairs.
MARGIN = 0.005
# Folds of the validation, at most: a sample of 16 tasks is scored four tasks at a time.
FOLDS = 4


@dataclass
class FinetuneResult:
    model: CostModel
    samples: int  # programs the model was fine-tuned on
    tasks: int  # tasks they came from
    steps: int  # the length the validation chose (0: the model is unchanged)
    validation: dict[int, float]  # held-out pairwise accuracy of each length tried ({}: none)
    # ``evaluate``'s figures on ``test_records`` before and after (None: no test records)
    before: dict | None = None
    after: dict | None = None


def on_hardware(columns: dict, hardware: str) -> np.ndarray:
    """Which rows were measured on ``hardware``: a dataset's hardware name
    (``avx512-1c@37ba0302``) or its configuration, the part before ``@``, when one machine
    alone has that configuration (a name that several CPUs share would mix them)."""
    names = np.asarray(columns["hardware"]).astype(str)
    exact = names == hardware
    if exact.any():
        return exact
    by_config = np.char.partition(names, "@")[:, 0] == hardware
    machines = sorted(set(names[by_config].tolist()))
    if len(machines) > 1:
        raise TensortuneError(f"'{hardware}' names a configuration of {len(machines)} machines "
                              f"here ({', '.join(machines)}): give one of them",
                              param="hardware")  # fmt: skip
    return by_config


def same_cpu(columns: dict, rows: np.ndarray) -> np.ndarray:
    """Rows measured on the CPU of any row under ``rows``, in whatever configuration: what a
    model said never to have seen that machine must not learn from."""
    cpus = np.array([cpu_of(h) for h in np.asarray(columns["hardware"]).astype(str)])
    return np.isin(cpus, np.unique(cpus[rows]))


def sample_rows(columns: dict, k: int, seed: int | None = None, hardware: str | None = None,
                among: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Indices of ``k`` successful rows of a dataset's columns (see the module's docstring),
    of ``hardware`` only when given (a name, or its prefix before ``@``), and of the rows
    ``among`` marks when given (a boolean mask)."""
    if k < 2:
        raise TensortuneError(f"fine-tuning needs at least 2 programs, not {k}", param="samples")
    label = np.asarray(columns["label"], dtype=float)
    ok = (label > 0) & np.array([p is not None for p in columns["per_store"]])
    if among is not None:
        ok &= among
    if hardware is not None:
        ok &= on_hardware(columns, hardware)
        if not ok.any():
            known = ", ".join(sorted(set(columns["hardware"])))
            raise TensortuneError(f"no successful program measured on '{hardware}'; the "
                                  f"records hold: {known}", param="hardware")  # fmt: skip
    rows = np.flatnonzero(ok)
    rows = rows[np.argsort(np.asarray(columns["program_id"])[rows], kind="stable")]
    if len(rows) < 2:
        raise TensortuneError(f"the records hold {len(rows)} successful program"
                              f"{'' if len(rows) == 1 else 's'}"
                              f"{f' on {hardware}' if hardware else ''}; fine-tuning needs at "
                              "least 2")  # fmt: skip
    if seed is None:
        return rows[:k]
    rng = np.random.default_rng(seed)
    tasks = np.asarray(columns["task_id"])[rows]
    picked: list[np.ndarray] = []
    left = k
    for task in rng.permutation(np.unique(tasks)):
        picked.append(rng.permutation(rows[tasks == task])[: min(PER_TASK, left)])
        left -= len(picked[-1])
        if left == 0:
            break
    return np.sort(np.concatenate(picked))


def sample_set(columns: dict, rows: np.ndarray) -> ProgramSet:
    """The programs of ``rows`` (from ``sample_rows``), labelled against the best of each task
    among them: what a user who measured only these knows, not the whole dataset's best."""
    data = ProgramSet.from_columns(columns, rows)
    cost = np.array([columns["cost"][i] for i in rows], dtype=float)
    best = {g: cost[data.groups == g].min() for g in np.unique(data.groups)}
    data.labels = np.array([best[g] for g in data.groups]) / cost
    return data


def check_refinable(kind: type[CostModel]) -> None:
    """Refuse a model kind without its own refinement: "fine-tuned", it would be a new model
    of the sample alone (``CostModel._refine`` refits from scratch)."""
    if kind._refine is CostModel._refine:
        raise TensortuneError(f"a {kind.kind} model cannot be fine-tuned, only trained anew; "
                              "fine-tune a neural model or xgb/lgbm")  # fmt: skip


def adapt(model: CostModel, data: ProgramSet, steps: int = STEPS, *,
          validate: bool = True) -> CostModel:  # fmt: skip
    """Train a fitted ``model`` further on ``data`` (in place; returned): a neural model for
    about ``steps`` optimizer steps, a GBDT for its ``refine_rounds``.  With ``validate``, for
    the length among ``LENGTHS`` that the held-out part of ``data`` scores best (see the
    module's docstring); the choice is kept in ``model.finetune_``."""
    if not model.fitted:
        raise TensortuneError("fine-tuning starts from a trained model; this one is not fitted")
    check_refinable(type(model))
    data.require_labels()
    scores: dict[int, float] = {}
    if validate:
        scores = validate_lengths(model, data, steps)
        steps = 0
        for length, score in sorted(scores.items()):
            if score >= scores[steps] + MARGIN:
                steps = length
    model.finetune_ = {"steps": steps, "validation": scores}
    return _train_for(model, data, steps)


def validate_lengths(model: CostModel, data: ProgramSet, steps: int = STEPS) -> dict[int, float]:
    """Pairwise accuracy within tasks, on held-out parts of ``data``, of ``model`` fine-tuned
    on the rest of it for each length of ``LENGTHS`` (as shares of ``steps``)."""
    from tensortune.train.metrics import pairwise_accuracy, ranks_anything

    shares = LENGTHS if isinstance(model, _RankModel) else (0.0, 1.0)  # a GBDT refines or not
    lengths = sorted({round(share * steps) for share in shares})
    correct = dict.fromkeys(lengths, 0.0)
    pairs = 0
    for held in _folds(data):
        rest = data.subset(np.setdiff1d(np.arange(len(data)), held))
        test = data.subset(held)
        tasks = {g: test.groups == g for g in np.unique(test.groups)}
        tasks = {g: mine for g, mine in tasks.items() if ranks_anything(test.labels[mine])}
        sizes = {g: int(mine.sum()) for g, mine in tasks.items()}
        weight = {g: n * (n - 1) // 2 for g, n in sizes.items()}  # pairs of each task
        pairs += sum(weight.values())
        for length, tuned in _trained_to(model, rest, lengths):
            pred = tuned.predict(test)
            for g, mine in tasks.items():
                correct[length] += pairwise_accuracy(pred[mine], test.labels[mine]) * weight[g]
    # No pair to compare (tasks of one program): NaN, and ``adapt`` keeps the model as it came.
    return {length: correct[length] / pairs if pairs else math.nan for length in lengths}


def _folds(data: ProgramSet) -> list[np.ndarray]:
    """The rows each validation fold holds out: whole tasks, ``FOLDS`` groups of them at
    most; a sample of one task, alternate programs of it (two folds)."""
    tasks = np.unique(data.groups)
    if len(tasks) == 1:
        return [np.arange(0, len(data), 2), np.arange(1, len(data), 2)]
    parts = np.array_split(tasks, min(FOLDS, len(tasks)))
    return [np.flatnonzero(np.isin(data.groups, part)) for part in parts]


def _trained_to(model: CostModel, data: ProgramSet,
                lengths: list[int]) -> Iterator[tuple[int, CostModel]]:  # fmt: skip
    """``(length, model trained on data for length steps)`` for each of ``lengths`` (ascending),
    the model itself at length 0.  A neural model's lengths are nested: one copy trains to the
    longest and is scored on the way, as ``_train_for`` would have made each."""
    if not isinstance(model, _RankModel):
        for length in lengths:
            yield length, _train_for(copy.deepcopy(model), data, length) if length else model
        return
    if lengths and lengths[0] <= 0:
        yield lengths[0], model
    tuned = copy.deepcopy(model)
    by_epochs: dict[int, list[int]] = {}  # lengths shorter than an epoch round up to one
    for n in lengths:
        if n > 0:
            by_epochs.setdefault(_epochs_for(tuned, data, n), []).append(n)
    with _only_adapted_trainable(tuned):
        for stage in tuned._train_stages(data, list(by_epochs)):
            for length in by_epochs[stage]:
                yield length, tuned


def _epochs_for(model: _RankModel, data: ProgramSet, steps: int) -> int:
    return max(1, math.ceil(steps / _steps_per_epoch(model, data)))


def _train_for(model: CostModel, data: ProgramSet, steps: int) -> CostModel:
    if steps <= 0:
        return model
    if isinstance(model, _RankModel):
        with _only_adapted_trainable(model):
            return model._train(data, _epochs_for(model, data, steps))
    return model._refine(data)


@contextmanager
def _only_adapted_trainable(model: _RankModel) -> Iterator[None]:
    """Freeze every weight outside the model's ``adapted`` modules (all train when it names
    none) while the block runs."""
    frozen = [p for net in model._nets() for name, p in net.named_parameters()
              if model.adapted and name.split(".")[0] not in model.adapted
              and p.requires_grad]  # fmt: skip
    for p in frozen:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in frozen:
            p.requires_grad_(True)


def _steps_per_epoch(model: _RankModel, data: ProgramSet) -> int:
    """Optimizer steps in one pass of ``model`` over ``data`` (``_RankModel._epoch``)."""
    sizes = np.unique(data.groups, return_counts=True)[1]
    chunks = int(np.ceil(sizes / model.chunk).sum())
    return max(1, math.ceil(chunks / model.batch_chunks))


def finetune(
    model: str | Path | CostModel,
    records: str | Path,
    *,
    samples: int,
    seed: int | None = None,
    hardware: str | None = None,
    steps: int = STEPS,
    validate: bool = True,
    out: str | Path | None = None,
    test_records: str | Path | None = None,
) -> FinetuneResult:
    """Fine-tune ``model`` (a model file or a fitted ``CostModel``) on ``samples`` programs of
    ``records``: a MetaSchedule JSON database directory (taken as measured on this machine) or
    a dataset (a directory, or a shipped dataset's name; ``hardware`` picks one of its
    machines).  ``validate``: choose how long to train on held-out parts of the sample (the
    module's docstring); without it, train ``steps`` steps.  Saves to ``out`` when given; the
    model file remembers what it was tuned on.  ``test_records``: a MetaSchedule JSON database
    measured on this machine that the model is scored on before and after (``evaluate``'s
    figures in ``before`` and ``after``), once every argument has been checked."""
    from tensortune.costmodel.registry import load_cost_model
    from tensortune.errors import about
    from tensortune.train.trainer import dataset_columns, records_columns, score_model

    check_writable(out, "out")
    check_flags(validate=validate)
    if seed is not None:
        check_seed(seed)
    # before the records are read: a database can take minutes to lower
    if type(samples) is not int or samples < 2:
        raise TensortuneError(f"fine-tuning needs at least 2 programs, not {samples}",
                              param="samples")  # fmt: skip
    if type(steps) is not int or steps < 1:
        raise TensortuneError(f"must be at least 1, not {steps}", param="steps")
    if test_records is not None:
        from tensortune.records.ms_json import check_database

        with about("test_records"):
            check_database(test_records)

    with about("model"):
        # A model object is the caller's: fine-tuned as a copy (to compare before and after).
        estimator = copy.deepcopy(model) if isinstance(model, CostModel) else load_cost_model(model)
        check_refinable(type(estimator))  # before the records are read (and lowered)
    with about("records"):
        if _is_metaschedule_database(records):
            columns, _ = records_columns(records, measured_here=True,
                                         lowered=estimator.uses_lowered)  # fmt: skip
        else:
            columns, _ = dataset_columns(records, param="records")
            machines = sorted(set(columns["hardware"]))
            # A sample drawn from several machines would adapt the model to none of them.
            if hardware is None and len(machines) > 1:
                raise TensortuneError(f"the dataset holds {len(machines)} machines' rows "
                                      f"({', '.join(machines)}): name the one to fine-tune "
                                      "for", param="hardware")  # fmt: skip
    rows = sample_rows(columns, samples, seed, hardware)
    data = sample_set(columns, rows)
    if test_records is not None:  # read (and lowered) once, scored before and after
        with about("test_records"):
            test, card = records_columns(test_records, measured_here=True,
                                         lowered=estimator.uses_lowered)  # fmt: skip
        every = np.ones(len(test["task_id"]), dtype=bool)
        before = score_model(estimator, test, every, card)[0]
    adapt(estimator, data, steps, validate=validate)
    chosen = estimator.finetune_
    estimator.provenance_ = {
        "finetuned_from": getattr(estimator, "provenance_", None),
        "records": str(records), "samples": len(rows), "seed": seed, "hardware": hardware,
        "steps": chosen["steps"],
    }  # fmt: skip
    if out is not None:
        estimator.save(out)
    result = FinetuneResult(estimator, len(rows), len(np.unique(data.groups)),
                            chosen["steps"], chosen["validation"])  # fmt: skip
    if test_records is not None:
        result.before, result.after = before, score_model(estimator, test, every, card)[0]
    return result


def _is_metaschedule_database(path: str | Path) -> bool:
    return (Path(path) / "database_tuning_record.json").is_file()
