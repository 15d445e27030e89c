"""The programs an active learner may choose from: what a cost model reads, plus one vector per
program to measure distances with (diversity), and the task each belongs to.

Distances use TenSet's per-store features pooled over a program's blocks (mean and max), each
log-scaled (``sign(x) * log1p(|x|)``: loop extents and byte counts span orders of magnitude,
and raw ones would let the largest feature decide every distance) and standardised over the
pool, as the BALTO reconstruction in ``shared/research/algorithms.md`` §3 proposes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tensortune.costmodel.data import ProgramSet
from tensortune.errors import TensortuneError


@dataclass
class Pool:
    """``n`` programs: ``programs`` for models, ``vectors`` (n, d) for distances, ``task`` (n,)
    the comparable group each belongs to (a task on one hardware), ``labels`` (n,) TenSet's
    normalised throughput where measured (NaN where not: an online pool)."""

    programs: ProgramSet
    vectors: np.ndarray
    task: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return len(self.task)

    def indices(self, chosen: np.ndarray) -> np.ndarray:
        """``chosen`` as pool indices: a boolean mask over the pool (as ``ProgramSet.subset``
        takes) or indices; cast to int, a mask would read as indices 0 and 1."""
        chosen = np.asarray(chosen)
        if chosen.dtype != bool:
            return chosen.astype(int)
        if len(chosen) != len(self):
            raise TensortuneError(f"a mask of {len(chosen)} for a pool of {len(self)} programs")
        return np.flatnonzero(chosen)

    def labelled(self, index: np.ndarray) -> ProgramSet:
        """The programs at ``index`` with labels a learner could know having measured only
        them: each task's best among them is 1.  A dataset's labels divide by the best of all
        the task's programs, which a learner that measured a few has not seen."""
        index = self.indices(index)
        y = self.labels[index].astype(np.float64)
        if np.isnan(y).any():
            raise TensortuneError("some chosen programs have not been measured")
        out = self.programs.subset(index)
        best = np.zeros(int(self.task.max()) + 1 if len(self) else 0)
        np.maximum.at(best, self.task[index], y)
        scale = best[self.task[index]]
        out.labels = np.divide(y, scale, out=np.zeros_like(y), where=scale > 0)
        return out


def pooled(per_store: list[np.ndarray]) -> np.ndarray:
    """(n, 2 * width): each program's log-scaled per-store features, mean and max over its
    blocks."""
    if not per_store:
        return np.zeros((0, 0), np.float32)
    width = per_store[0].shape[1]
    rows = []
    for p in per_store:
        x = np.sign(p) * np.log1p(np.abs(p))
        rows.append(np.concatenate([x.mean(axis=0), x.max(axis=0)]) if len(x)
                    else np.zeros(2 * width, np.float32))  # fmt: skip
    return np.stack(rows).astype(np.float32)


def program_vectors(per_store: list[np.ndarray]) -> np.ndarray:
    """``pooled`` features standardised per column over these programs (constant columns
    become 0): the space distances are measured in."""
    x = pooled(per_store).astype(np.float64)
    if not len(x):
        return x.astype(np.float32)
    spread = x.std(axis=0)
    out = np.zeros_like(x)
    varying = spread > 1e-9
    out[:, varying] = (x[:, varying] - x[:, varying].mean(axis=0)) / spread[varying]
    return out.astype(np.float32)


def pool_from_programs(programs: ProgramSet) -> Pool:
    labels = (np.full(len(programs), np.nan) if programs.labels is None
              else np.asarray(programs.labels, dtype=np.float64))  # fmt: skip
    return Pool(programs, program_vectors(programs.per_store), np.asarray(programs.groups), labels)
