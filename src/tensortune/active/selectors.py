"""Selectors: which programs of a pool to measure next, so that a cost model learns the most
from each measurement.

Every selector answers one question the same way: given a ``Pool``, the indices already
labelled, the current model (fitted on them, or ``None`` before any measurement) and a batch
size, which pool indices to measure next.  The batch is shared among tasks in proportion to
what each has left unmeasured (a pre-trained model must rank every task), and each selector
chooses within a task, where distances and scores compare.

The papers' exact formulas are not public (``shared/research/algorithms.md`` §3, §4); these
are the reconstructions chosen, and why:

- ``random``: uniform draws, TenSet's baseline.
- ``diversity``: k-center greedy in feature space (the core-set selector): each pick is the
  program farthest from everything measured or picked.  This is BALTO's "brute-force"
  diversity, which it shows overestimates: most of a design space is slow, so the spread-out
  picks are mostly slow programs and the model never sees the fast corner it must rank.
- ``balto``: biased diversity, candidate-then-diversify: a share ``EXPLORE`` of the quota is
  drawn uniformly (so a region the model wrongly rates slow still gets measured); for the
  rest, the top ``ALPHA`` x that many programs by the model's score, then k-center greedy
  among them.
- ``balto-weighted``: biased diversity as one objective: the next pick maximises
  ``r(x) ** BETA * d(x)``, ``r`` the program's score percentile in its task, ``d`` its
  distance to the nearest program measured or picked; same exploration share.
- ``uncertainty``: a bootstrap ensemble of the model's kind (``MEMBERS`` refits on resampled
  labelled programs); picks the programs whose score percentile the members disagree on most.
- ``alt``: ALT's ping-pong, alternating by round: even rounds exploit (``balto``'s
  candidate-then-diversify, no random share), odd rounds explore (uncertainty-weighted
  k-center: the max-uncertainty programs, kept apart from each other and from what is known).

Before any measurement there is no model: every selector but ``diversity`` then draws at
random, the small random seed set BALTO's loop starts from.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from tensortune.active.pool import Pool
from tensortune.costmodel.base import CostModel
from tensortune.errors import TensortuneError

ALPHA = 4  # candidates per pick in candidate-then-diversify
BETA = 2.0  # how strongly the score bends score-weighted k-center
EXPLORE = 0.1  # share of each biased batch drawn uniformly
MEMBERS = 4  # bootstrap ensemble size for uncertainty


@dataclass
class TaskView:
    """One task's part of a selection: its unmeasured programs (pool indices), its measured
    ones, and per candidate the model's score percentile and the ensemble's disagreement
    (``None`` when there is no model)."""

    candidates: np.ndarray
    known: np.ndarray
    vectors: np.ndarray  # the whole pool's
    score: np.ndarray | None
    spread: np.ndarray | None


class Selector(abc.ABC):
    """Chooses up to ``batch`` unmeasured programs of a pool; see the module docstring."""

    name: ClassVar[str]
    uses_score: ClassVar[bool] = False
    uses_spread: ClassVar[bool] = False

    def select(self, pool: Pool, labelled: np.ndarray, model: CostModel | None, batch: int,
               *, seed: int = 0, round: int = 0) -> np.ndarray:  # fmt: skip
        """Pool indices to measure next: distinct, none of ``labelled``, ``min(batch, left)``
        of them.  ``model`` is fitted on ``labelled`` (or ``None``); ``round`` counts the
        selections made so far (ALT alternates on it)."""
        labelled = np.unique(pool.indices(labelled))
        if batch < 0 or seed < 0:
            raise TensortuneError(f"batch and seed must not be negative, not {batch}, {seed}")
        if len(labelled) and (labelled.min() < 0 or labelled.max() >= len(pool)):
            raise TensortuneError("labelled indices fall outside the pool")
        free = np.ones(len(pool), dtype=bool)
        free[labelled] = False
        if batch == 0 or not free.any():
            return np.zeros(0, dtype=int)
        rng = np.random.default_rng([seed, round])
        ready = model is not None and model.fitted
        uses_score, uses_spread = self._needs(round)
        score = _percentiles(model.predict(pool.programs), pool.task) if (
            ready and uses_score) else None  # fmt: skip
        spread = _ensemble_spread(pool, labelled, model, rng) if (
            ready and uses_spread) else None  # fmt: skip
        picks = []
        for task, quota in _quotas(pool.task, free, batch, rng).items():
            in_task = pool.task == task
            cands = np.flatnonzero(free & in_task)
            view = TaskView(cands, np.flatnonzero(~free & in_task), pool.vectors,
                            None if score is None else score[cands],
                            None if spread is None else spread[cands])  # fmt: skip
            local = self._pick(view, quota, rng, round)
            picks.append(cands[np.asarray(local, dtype=int)])
        return np.concatenate(picks)

    def _needs(self, round: int) -> tuple[bool, bool]:
        """Whether this round's picks read the model's scores, and the ensemble's spread."""
        return self.uses_score, self.uses_spread

    @abc.abstractmethod
    def _pick(self, view: TaskView, quota: int, rng: np.random.Generator,
              round: int) -> np.ndarray:  # fmt: skip
        """``quota`` distinct positions in ``view.candidates`` (``quota`` ≤ their number)."""


class RandomSelector(Selector):
    name = "random"

    def _pick(self, view, quota, rng, round):
        return _uniform(view, quota, rng)


class DiversitySelector(Selector):
    name = "diversity"

    def _pick(self, view, quota, rng, round):
        return k_center(view, np.arange(len(view.candidates)), quota, rng)


class BaltoSelector(Selector):
    """Candidate-then-diversify (``balto``)."""

    name = "balto"
    uses_score = True
    explore = EXPLORE

    def _pick(self, view, quota, rng, round):
        if view.score is None:
            return _uniform(view, quota, rng)
        n_random = _share(quota, self.explore, rng)
        # Best first; ties in random order, not the pool's.
        order = np.lexsort((rng.uniform(size=len(view.score)), -view.score))
        top = order[: max(ALPHA * (quota - n_random), quota - n_random)]
        chosen = k_center(view, top, quota - n_random, rng)
        return _plus_random(chosen, len(view.candidates), n_random, rng)


class WeightedBaltoSelector(Selector):
    """Score-weighted k-center (``balto-weighted``)."""

    name = "balto-weighted"
    uses_score = True

    def _pick(self, view, quota, rng, round):
        everyone = np.arange(len(view.candidates))
        if view.score is None:
            return _uniform(view, quota, rng)
        n_random = _share(quota, EXPLORE, rng)
        chosen = k_center(view, everyone, quota - n_random, rng, weight=view.score**BETA)
        return _plus_random(chosen, len(view.candidates), n_random, rng)


class UncertaintySelector(Selector):
    name = "uncertainty"
    uses_spread = True

    def _pick(self, view, quota, rng, round):
        if view.spread is None:
            return _uniform(view, quota, rng)
        # Ties (e.g. all members agree) broken at random, not by pool order.
        noise = rng.uniform(0, 1e-9, len(view.spread))
        return np.argsort(-(view.spread + noise), kind="stable")[:quota]


class AltSelector(BaltoSelector):
    """ALT's ping-pong: exploit with diversity on even rounds, explore by uncertainty on odd."""

    name = "alt"
    uses_spread = True
    explore = 0.0

    def _needs(self, round: int) -> tuple[bool, bool]:
        return round % 2 == 0, round % 2 == 1

    def _pick(self, view, quota, rng, round):
        if round % 2 == 0 or view.spread is None:
            return super()._pick(view, quota, rng, round)
        return k_center(view, np.arange(len(view.candidates)), quota, rng,
                        weight=view.spread + 1e-6)  # fmt: skip


_ALL = (RandomSelector, DiversitySelector, BaltoSelector, WeightedBaltoSelector,
        UncertaintySelector, AltSelector)  # fmt: skip
SELECTORS: dict[str, type[Selector]] = {s.name: s for s in _ALL}


def make_selector(name: str) -> Selector:
    if name not in SELECTORS:
        raise TensortuneError(f"unknown selector '{name}'; known: {', '.join(SELECTORS)}")
    return SELECTORS[name]()


def k_center(view: TaskView, among: np.ndarray, count: int, rng: np.random.Generator,
             weight: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """``count`` positions of ``among`` (positions in ``view.candidates``) by greedy k-center:
    each next pick maximises ``weight * distance to the nearest measured or picked program``.
    With nothing measured yet the first pick is the heaviest (or a random one)."""
    among = np.asarray(among, dtype=int)
    count = min(count, len(among))
    if count <= 0:
        return np.zeros(0, dtype=int)
    x = view.vectors[view.candidates[among]].astype(np.float64)
    w = np.ones(len(among)) if weight is None else np.asarray(weight, np.float64)[among]
    nearest = np.full(len(among), np.inf)
    for start in range(0, len(view.known), 512):  # bounded memory for large tasks
        nearest = np.minimum(nearest, _distances(x, view.vectors[view.known[start : start + 512]]))
    chosen: list[int] = []
    taken = np.zeros(len(among), dtype=bool)
    for _ in range(count):
        if np.isinf(nearest[~taken]).all():  # nothing known or picked yet
            key = w + rng.uniform(0, 1e-9, len(w)) if weight is not None else rng.uniform(
                size=len(w))  # fmt: skip
        else:
            key = w * nearest
        j = tied_argmax(np.where(taken, -np.inf, key), rng)
        chosen.append(j)
        taken[j] = True
        nearest = np.minimum(nearest, _distances(x, x[j : j + 1]))
    return among[np.asarray(chosen, dtype=int)]


def tied_argmax(key: np.ndarray, rng: np.random.Generator) -> int:
    """The position of ``key``'s largest value, exact ties broken at random: ``argmax`` alone
    took the first of programs whose features are identical, whatever the seed.  A NaN key
    (from NaN features) ranks below every number but above -inf (what was taken already)."""
    key = np.where(np.isnan(key), -np.finfo(np.float64).max, key)
    return int(rng.choice(np.flatnonzero(key == key.max())))


def _distances(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """For each row of ``x``, the Euclidean distance to its nearest row of ``y``."""
    y = np.asarray(y, dtype=np.float64)
    sq = (x**2).sum(1)[:, None] + (y**2).sum(1)[None, :] - 2 * x @ y.T
    return np.sqrt(np.maximum(sq, 0).min(axis=1))


def _quotas(task: np.ndarray, free: np.ndarray, batch: int,
            rng: np.random.Generator) -> dict[int, int]:  # fmt: skip
    """``batch`` shared among tasks in proportion to their unmeasured programs (largest
    remainder; ties at random), never more than a task has."""
    tasks, left = np.unique(task[free], return_counts=True)
    batch = min(batch, int(left.sum()))
    exact = batch * left / left.sum()
    share = np.minimum(np.floor(exact).astype(int), left)
    rest = batch - int(share.sum())
    if rest > 0:
        order = np.lexsort((rng.uniform(size=len(tasks)), -(exact - share)))
        for i in order:
            if rest == 0:
                break
            if share[i] < left[i]:
                share[i] += 1
                rest -= 1
    return {int(t): int(s) for t, s in zip(tasks, share, strict=True) if s > 0}


def _percentiles(pred: np.ndarray, task: np.ndarray) -> np.ndarray:
    """Each prediction's rank within its task, scaled to (0, 1]: scores of ranking models are
    only comparable within a task, and their scale differs from model to model.  Tied
    predictions share their mean rank: a model fitted on a few programs predicts many ties,
    and ranking them by pool order would favour the rows stored last (a collection's evolved
    programs, in a dataset)."""
    out = np.zeros(len(pred))
    pred = np.nan_to_num(np.asarray(pred, np.float64), nan=-np.inf)  # NaN: rated slowest
    for t in np.unique(task):
        idx = np.flatnonzero(task == t)
        _, where, counts = np.unique(pred[idx], return_inverse=True, return_counts=True)
        below = np.cumsum(counts) - counts  # programs rated lower than each distinct value
        out[idx] = (below + (counts + 1) / 2)[where.ravel()] / len(idx)
    return out


def _ensemble_spread(pool: Pool, labelled: np.ndarray, model: CostModel,
                     rng: np.random.Generator) -> np.ndarray:  # fmt: skip
    """The standard deviation, over ``MEMBERS`` refits of ``model``'s kind on bootstrap
    resamples of the labelled programs, of each pool program's score percentile."""
    params = model.get_params()
    runs = []
    for k in range(MEMBERS):
        sample = rng.choice(labelled, size=len(labelled), replace=True)
        data = pool.labelled(sample)
        if not np.any(data.labels > 0):
            continue
        # each member its own seed, and other members for another model seed (the run's)
        seeded = {**params, "seed": params["seed"] * MEMBERS + k} if "seed" in params else params
        member = type(model)(**seeded)
        runs.append(_percentiles(member.fit(data).predict(pool.programs), pool.task))
    return np.std(runs, axis=0) if len(runs) > 1 else np.zeros(len(pool))


def _uniform(view: TaskView, quota: int, rng: np.random.Generator) -> np.ndarray:
    return rng.choice(len(view.candidates), size=quota, replace=False)


def _share(quota: int, share: float, rng: np.random.Generator) -> int:
    """``share`` of ``quota``, rounded at random so small quotas get it on average."""
    exact = quota * share
    return min(quota, int(exact) + int(rng.uniform() < exact - int(exact)))


def _plus_random(chosen: np.ndarray, n: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """``chosen`` and ``count`` more positions of ``range(n)`` drawn uniformly from the rest."""
    rest = np.setdiff1d(np.arange(n), chosen)
    extra = rng.choice(rest, size=min(count, len(rest)), replace=False)
    return np.concatenate([chosen, extra]).astype(int)
