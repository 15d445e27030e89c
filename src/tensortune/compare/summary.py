"""Mean and spread of a study's runs: what every offline study (``bench al``, ``bench prune``,
``bench hardware``, ``bench splits``) reports per arm, over its seeds and folds."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from tensortune.errors import TensortuneError


def study_args(seeds: Sequence[int], **names: Sequence[str]) -> tuple[list[int], ...]:
    """A study's seeds and lists of names, checked before anything is fitted, each without
    repeats (a name given twice would run twice and count as two seeds): one or more seeds,
    none negative; at least one of each list (the keyword is the parameter it came from)."""
    seeds = list(dict.fromkeys(seeds))
    if not seeds:
        raise TensortuneError("must name at least one seed", param="seeds")
    if min(seeds) < 0:
        raise TensortuneError(f"must not be negative, not {min(seeds)}", param="seeds")
    out: list[list] = [seeds]
    for param, given in names.items():
        unique = list(dict.fromkeys(given))
        if not unique:
            raise TensortuneError(f"name at least one of {param}", param=param)
        out.append(unique)
    return tuple(out)


def mean_and_sd(rows: Sequence[dict], by: Sequence[str], metrics: Sequence[str]) -> list[dict]:
    """One entry per distinct value of the ``by`` keys, in order of first appearance: those
    keys, ``runs``, ``distinct`` and each metric's mean and sample standard deviation
    (``{metric}_std``, NaN for fewer than two values; NaN runs left out, as a metric undefined
    on a fold is).

    Where every fold of an entry gave the very same figures for each seed, each fold counts
    once in the mean and spread (``distinct`` says how many runs were left): a model whose seed
    changes nothing (trees without subsampling) on folds the seed does not draw gives one
    result however many seeds ran, and its copies would shrink the spread of the folds'
    results.  A fold is a run's keys other than the seed and the metrics.  Where any fold's
    seeds differ, every run counts, so that folds keep equal weights."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[tuple(r[k] for k in by)].append(r)
    out = []
    for key, runs in groups.items():
        results = [_keys(r, exclude={"seed"}) for r in runs]
        folds: dict[tuple, set[tuple]] = defaultdict(set)
        for r, result in zip(runs, results, strict=True):
            folds[_keys(r, exclude={"seed", *metrics})].add(result)
        same = all(len(found) == 1 for found in folds.values())
        unique = list(dict(zip(results, runs, strict=True)).values()) if same else runs
        entry: dict = {**dict(zip(by, key, strict=True)), "runs": len(runs),
                       "distinct": len(unique)}  # fmt: skip
        for m in metrics:
            vals = np.array([r[m] for r in unique], dtype=float)
            kept = vals[~np.isnan(vals)]
            entry[m] = float(kept.mean()) if len(kept) else float("nan")
            entry[f"{m}_std"] = float(kept.std(ddof=1)) if len(kept) > 1 else float("nan")
        out.append(entry)
    return out


def _keys(row: dict, *, exclude: set[str]) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in row.items() if k not in exclude))
