"""Dataset pruning: keep the share of a dataset's programs that teaches a cost model what the
whole does (Verma et al. 2023 prune ~45% of TenSet without losing PCA; issue 21).

Every method keeps ``keep`` of the programs of each comparable group (a task on one hardware;
at least one each), except ``shape-dedup``, which first drops whole tasks:

- ``random``: uniform within each group; the baseline every method must beat.
- ``cluster``: redundancy clustering in feature space: greedy k-center over the programs'
  pooled per-store features (``active/pool.py``), so each kept program stands for the dropped
  ones nearest to it.
- ``cluster-global``: the same greedy k-center, but with one coverage radius for all groups
  instead of one quota each: every group is ordered by k-center, each pick remembering its
  distance to the nearest program picked before it, and the picks farthest from what was
  already kept are kept across all groups.  A group of near-duplicates then keeps few
  programs, a diverse one many (each keeps at least its first).
- ``low-perf``: low-performance redundancy (BALTO's observation that random sampling measures
  mostly slow programs, which teach little about the top a tuner needs): the fastest
  ``FAST_SHARE`` of the quota is kept, the rest by k-center starting from them, so slow
  programs in dense regions go first and slow ones in regions nothing else covers stay.
- ``shape-dedup``: shape-variant deduplication: tasks of one family (the same operator chain:
  the task name with its numbering stripped, ``fused_conv2d8_add4`` → ``fused_conv2d_add``) on
  one hardware are shape variants of each other; the variant closest to another remaining one
  (workload embedding, standardised) is dropped, then the next, while the family has two or
  more and the target is not reached; if the variants run out first, the rest is random.

``AUTO`` is the method the study (``bench prune``, benchmarks/RESULTS.md) found best: on the
dense pool, ``cluster`` kept the whole pool's PCA at 60% and lost 0.7 points at 45%, where
random lost 1.2 and 2.1 and ``low-perf`` 1.6 and 3.1.  ``cluster-global`` lost 0.4 at 45%
but 1.7 at 40% (4 seeds; ``cluster`` 0.9 at both): better only around half, and less steady.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tensortune.active import Pool, pool_from_programs
from tensortune.active.selectors import TaskView, k_center, tied_argmax
from tensortune.costmodel.data import ProgramSet
from tensortune.errors import TensortuneError, about

METHODS = ("random", "cluster", "cluster-global", "low-perf", "shape-dedup")
AUTO = "cluster"
FAST_SHARE = 0.5  # of each group's quota, kept for speed alone by low-perf


def task_family(name: str) -> str:
    """``fused_conv2d8_add4_add61`` → ``fused_conv2d_add_add``: the numbers TVM appends to
    tell tasks apart are dropped, the operators' own (``conv2d``) are not."""
    return re.sub(r"(?<=[A-Za-z])\d+(?=_|$)", "", name)


def _check(keep: float, seed: int) -> None:
    if not 0 < keep <= 1:  # NaN fails too
        raise TensortuneError(f"must lie in (0, 1], not {keep}", param="keep")
    if seed < 0:
        raise TensortuneError(f"must not be negative, not {seed}", param="seed")


def prune(pool: Pool, method: str, keep: float, *, seed: int = 0,
          families: Sequence[str] | None = None) -> np.ndarray:  # fmt: skip
    """Sorted pool indices of the programs ``method`` keeps (module docstring).  ``pool``'s
    labels are the dataset's; ``families`` (one per program) is what ``shape-dedup`` groups
    tasks by."""
    method = resolve_method(method)
    _check(keep, seed)
    rng = np.random.default_rng(seed)
    if keep == 1 or not len(pool):
        return np.arange(len(pool))
    if method == "shape-dedup":
        if families is None or len(families) != len(pool):
            raise TensortuneError("shape-dedup needs each program's task family")
        return _shape_dedup(pool, keep, np.asarray(families), rng)
    if method == "cluster-global":
        return _cluster_global(pool, max(1, round(keep * len(pool))), rng)
    kept = []
    for task in np.unique(pool.task):
        members = np.flatnonzero(pool.task == task)
        quota = max(1, round(keep * len(members)))
        kept.append(members[_keep_in_group(pool, members, quota, method, rng)])
    return np.sort(np.concatenate(kept))


def resolve_method(method: str) -> str:
    if method == "auto":
        return AUTO
    if method not in METHODS:
        raise TensortuneError(f"unknown pruning method '{method}'; known: "
                              f"{', '.join(METHODS)}, auto", param="method")  # fmt: skip
    return method


def _keep_in_group(pool: Pool, members: np.ndarray, quota: int, method: str,
                   rng: np.random.Generator) -> np.ndarray:  # fmt: skip
    """``quota`` positions in ``members`` (one group's pool indices)."""
    if method == "random":
        return rng.choice(len(members), quota, replace=False)
    if method == "cluster":
        view = TaskView(members, np.zeros(0, dtype=int), pool.vectors, None, None)
        return k_center(view, np.arange(len(members)), quota, rng)
    labels = np.nan_to_num(pool.labels[members], nan=0.0)
    order = np.argsort(-labels, kind="stable")
    n_fast = math.ceil(FAST_SHARE * quota)
    fast, rest = order[:n_fast], order[n_fast:]
    view = TaskView(members[rest], members[fast], pool.vectors, None, None)
    return np.concatenate([fast, rest[k_center(view, np.arange(len(rest)), quota - n_fast, rng)]])


def _cluster_global(pool: Pool, target: int, rng: np.random.Generator) -> np.ndarray:
    """``target`` pool indices (at least one a group): each group's greedy k-center order, cut
    at one radius."""
    index, radius = [], []
    for task in np.unique(pool.task):
        members = np.flatnonzero(pool.task == task)
        order, r = cover_order(pool.vectors[members], rng)
        index.append(members[order])
        radius.append(r)
    index_all, radius_all = np.concatenate(index), np.concatenate(radius)
    # Largest radius first (each group's first pick has an infinite one); ties at random.
    ranked = np.lexsort((rng.uniform(size=len(index_all)), -radius_all))
    return np.sort(index_all[ranked[: max(target, len(index))]])


def cover_order(x: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """All rows of ``x`` in greedy k-center order from a random first one, and each one's
    distance to the nearest row before it (``inf`` for the first): how much of the space it
    covers that the ones before it did not."""
    x = np.asarray(x, np.float64)
    nearest = np.full(len(x), np.inf)
    taken = np.zeros(len(x), dtype=bool)
    order = np.empty(len(x), dtype=int)
    radius = np.empty(len(x))
    j = int(rng.integers(len(x)))
    for step in range(len(x)):
        order[step], radius[step] = j, nearest[j]
        taken[j] = True
        nearest = np.minimum(nearest, np.sqrt(((x - x[j]) ** 2).sum(axis=1)))
        if step + 1 < len(x):
            j = tied_argmax(np.where(taken, -np.inf, nearest), rng)
    return order, radius


def _shape_dedup(pool: Pool, keep: float, families: np.ndarray,
                 rng: np.random.Generator) -> np.ndarray:  # fmt: skip
    target = max(1, round(keep * len(pool)))
    tasks, first, sizes = np.unique(pool.task, return_index=True, return_counts=True)
    family = families[first]
    emb = pool.programs.workload[first].astype(np.float64)
    spread = emb.std(axis=0)
    emb = np.where(spread > 1e-9, (emb - emb.mean(axis=0)) / np.where(spread > 1e-9, spread, 1),
                   0.0)  # fmt: skip
    alive = np.ones(len(tasks), dtype=bool)
    left = len(pool)
    while left > target:
        best, best_key = -1, (np.inf, 0.0)
        for i in np.flatnonzero(alive):
            peers = np.flatnonzero(alive & (family == family[i]))
            peers = peers[peers != i]
            if not len(peers):
                continue
            key = (float(np.min(np.linalg.norm(emb[peers] - emb[i], axis=1))), -float(sizes[i]))
            if key < best_key:
                best, best_key = i, key
        if best < 0:  # every family is down to one task
            break
        alive[best] = False
        left -= int(sizes[best])
    kept_tasks = set(tasks[alive].tolist())
    kept = np.flatnonzero(np.isin(pool.task, list(kept_tasks)))
    if len(kept) > target:  # the variants ran out: the rest uniformly, group by group
        share = target / len(kept)
        picks = []
        for task in kept_tasks:
            members = np.flatnonzero(pool.task == task)
            picks.append(rng.choice(members, max(1, round(share * len(members))), replace=False))
        kept = np.concatenate(picks)
    return np.sort(kept)


def prune_dataset(dataset: str | Path, method: str, keep: float, out: str | Path, *,
                  seed: int = 0, overwrite: bool = False) -> dict:  # fmt: skip
    """Write the programs ``method`` keeps of every group of ``dataset`` (all its hardware) to
    ``out`` as a dataset ``train`` reads; returns its card.  Rows without features (failed
    builds) are kept out, as training leaves them out.  The rows of the networks the card
    holds out (the pool's test networks) are kept whole, labels and all: they are what a model
    of the pruned dataset is scored on, not what it learns from; ``keep`` is a share of the
    others.  A dataset already in ``out`` is replaced only with ``overwrite``."""
    from tensortune.datasets.build import check_out_dir
    from tensortune.datasets.shipped import dataset_path
    from tensortune.datasets.subset import write_subset
    from tensortune.train.trainer import dataset_columns

    with about("method"):
        method = resolve_method(method)
    _check(keep, seed)  # before the dataset loads (seconds), not after
    source = dataset_path(dataset)
    if Path(out).resolve() == source.resolve():
        raise TensortuneError("pruning would overwrite its own dataset: give another directory",
                              param="out")  # fmt: skip
    check_out_dir(out, overwrite=overwrite)  # before the pruning, not after
    columns, card = dataset_columns(dataset)
    held = set(card.get("held_out") or [])
    scored = np.array([bool(held & set(n)) for n in columns["networks"]], dtype=bool)
    rows = np.array([i for i, p in enumerate(columns["per_store"]) if p is not None and
                     not scored[i]], dtype=int)  # fmt: skip
    if not len(rows):
        raise TensortuneError(f"{card.get('name')} has no programs with features to prune")
    pool = pool_from_programs(ProgramSet.from_columns(columns, rows))
    families = [task_family(columns["task_name"][i]) + "|" + columns["hardware"][i] for i in rows]
    chosen = rows[prune(pool, method, keep, seed=seed, families=families)]
    provenance = {"pruning": {"source": card.get("name"), "method": method, "keep": keep,
                              "seed": seed, "programs": len(chosen), "of": len(rows),
                              "held_out_kept": int(scored.sum())}}  # fmt: skip
    note = (f"{len(chosen)} of the {len(rows)} programs of {card.get('name')}, kept by "
            f"`tensortune dataset prune --method {method} --keep {keep:g} --seed {seed}`; "
            "labels are against the best program kept of each task.")  # fmt: skip
    if scored.any():
        note += (f" The {int(scored.sum())} rows of its held-out networks "
                 f"({', '.join(sorted(held))}) are kept whole.")  # fmt: skip
    chosen = np.sort(np.concatenate([chosen, np.flatnonzero(scored)]))
    return write_subset(
        source, chosen, out, description=note, extra=provenance, overwrite=overwrite
    ).data
