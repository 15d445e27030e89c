"""Mean and spread of a study's runs: what every offline study (``bench al``, ``bench prune``,
``bench hardware``, ``bench splits``) reports per arm, over its seeds and folds."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np


def mean_and_sd(rows: Sequence[dict], by: Sequence[str], metrics: Sequence[str]) -> list[dict]:
    """One entry per distinct value of the ``by`` keys, in order of first appearance: those
    keys, ``runs``, and each metric's mean and standard deviation (``{metric}_std``; NaN runs
    left out, as a metric undefined on a fold is)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[tuple(r[k] for k in by)].append(r)
    out = []
    for key, runs in groups.items():
        entry: dict = {**dict(zip(by, key, strict=True)), "runs": len(runs)}
        for m in metrics:
            vals = np.array([r[m] for r in runs], dtype=float)
            kept = vals[~np.isnan(vals)]
            entry[m] = float(kept.mean()) if len(kept) else float("nan")
            entry[f"{m}_std"] = float(kept.std()) if len(kept) else float("nan")
        out.append(entry)
    return out
