"""The pruning study (``tensortune bench prune``): how much of a dataset each pruning method
(``train/pruning.py``) can drop before a cost model trained on the rest ranks held-out networks
worse.

The pool is the dataset's rows on one hardware whose tasks occur in no held-out network, as in
the active-learning study (``compare/active_learning.py``, whose loading, scoring and plot this
reuses: a method plays the part of a selector and the share kept that of the fraction
measured).  For each seed, method and share kept, the models are fitted on what the method
keeps (labels against the best program kept of each task) and scored on the held-out networks
with TenSet's metrics; share 1 is the unpruned pool.  Verma et al.'s test: a pruned dataset is
as good as the whole when its PCA is within 0.5 points.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tensortune.compare.active_learning import (
    OVERESTIMATION_K,
    Progress,
    StudyResult,
    load_study_data,
    score_selection,
    study_setup,
)
from tensortune.compare.summary import study_args
from tensortune.costmodel.registry import model_class
from tensortune.errors import TensortuneError, about, check_writable
from tensortune.train.pruning import METHODS, prune, resolve_method, task_family

KEEPS = (0.2, 0.35, 0.45, 0.6, 0.8, 1.0)


def prune_study(
    dataset: str | Path = "default",
    *,
    held_out: Sequence[str],
    methods: Sequence[str] = METHODS,
    keeps: Sequence[float] = KEEPS,
    models: Sequence[str] = ("xgb",),
    seeds: Sequence[int] = (0, 1, 2),
    hardware: str | None = None,
    params: dict[str, dict] | None = None,
    progress: Progress | None = None,
    checkpoint: str | os.PathLike | None = None,
) -> StudyResult:
    """Each method's pruned pool at each share kept, each model fitted on it and scored on the
    held-out networks, for each seed (module docstring).  ``checkpoint``: a file that keeps
    each finished method, share and seed (``compare.checkpoint``)."""
    from tensortune.compare.checkpoint import Checkpoint

    tell = progress or (lambda _: None)
    seeds, models = study_args(seeds, models=models)
    with about("methods"):
        names = list(dict.fromkeys(resolve_method(m) for m in methods))
    with about("models"):
        for kind in models:
            model_class(kind)
    with about("keeps"):
        shares = sorted({float(k) for k in keeps})
        if not shares or not all(0 < k <= 1 for k in shares):  # NaN fails too
            raise TensortuneError(f"shares kept must lie in (0, 1], not {list(keeps)}")
    if not names:
        raise TensortuneError("name at least one method", param="methods")
    check_writable(checkpoint, "checkpoint")  # before the dataset's seconds of reading
    data = load_study_data(dataset, held_out, hardware=hardware)
    families = [f"{task_family(n)}|{data.hardware}" for n in data.task_names]
    pool = data.pool
    result = StudyResult(setup={
        "pool_programs": len(pool), "pool_tasks": len(np.unique(pool.task)),
        "test_programs": len(data.test), "test_tasks": len(np.unique(data.test_rows["task_id"])),
        "held_out": data.held_out, "hardware": data.hardware, "methods": names,
        "overestimation_k": OVERESTIMATION_K, "models": list(models), "seeds": list(seeds),
        "keeps": shares,
    })  # fmt: skip
    saved = Checkpoint(
        checkpoint,
        lambda: study_setup(
            "prune", result, data, params or {}, [dataset], ["seeds", "methods", "keeps"]
        ),
    )
    for seed in seeds:
        for share in shares:
            for name in names if share < 1 else ["all"]:

                def work(name: str = name, share: float = share, seed: int = seed) -> None:
                    kept = (np.arange(len(pool)) if name == "all" else
                            prune(pool, name, share, seed=seed, families=families))  # fmt: skip
                    score_selection(data, kept, result, selector=name, fraction=share,
                                    seed=seed, models=models, params=params or {},
                                    tell=tell)  # fmt: skip

                if saved.unit(result.rows, (name, share, seed), work):
                    tell(f"{name} {share:g} seed {seed}: finished before")
    return result
