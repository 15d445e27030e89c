"""ALT inside draft-then-verify: the validity filter, and the uncertainty/score ping-pong.

- **Validity** (``validity=1``): after the verifier has scored a round's pool, the candidates
  that ``ValidityFilter`` rates likely to fail (build errors, crashes, timeouts) are dropped
  from the round and from the cache.  An ``audit`` share of them is measured anyway: the
  dropped programs are never measured, so only these say how many the filter drops wrongly.
  The filter is refitted after every measured batch on everything the task has measured.
- **Ping-pong** (``pingpong=1``): rounds alternate.  Even rounds pick as draft-then-verify
  always does (the verifier's best, the score predictor's turn); odd rounds pick by
  uncertainty: a bootstrap ensemble of a small GBDT fitted on the task's measurements, and its
  most disputed candidates kept apart in feature space (the ``alt`` selector's exploring
  round, ``active/selectors.py``).

``stats`` (shared by every task's clone, like the strategy's timings) counts what the filter
did: ``dropped`` (measurements saved), ``audited`` and ``audited_valid`` (dropped programs
measured anyway, and how many of them ran), and the measured programs that failed.
"""

from __future__ import annotations

import numpy as np

from tensortune import features as F
from tensortune.active import ValidityFilter, make_selector, pool_from_programs
from tensortune.compat import ms, structural_hash
from tensortune.costmodel.data import ProgramSet, concat_programs
from tensortune.measure.status import run_seconds

STAT_KEYS = ("dropped", "audited", "audited_valid", "measured", "measured_failed")
# Programs whose features are kept (a few KB each); the cache holds a few hundred at a time.
MEMO_SIZE = 5000
# Fewest measured programs (and successes) before the uncertainty ensemble is fitted.
MIN_LABELLED = 8


class AltPolicy:
    """One task's ALT state: features of its candidates, outcomes of its measurements."""

    def __init__(self, *, validity: bool, pingpong: bool, audit: float, stats: dict[str, int],
                 seed: int) -> None:  # fmt: skip
        self.filter = ValidityFilter(seed=seed) if validity else None
        self.pingpong = pingpong
        self.audit = audit
        self.stats = stats
        self.seed = seed
        self._extractor = ms.feature_extractor.PerStoreFeature()
        # By program (structural hash): MetaSchedule hands measured candidates back as new
        # Python objects, so identity cannot tie them to the ones picked.
        self._memo: dict[int, np.ndarray] = {}
        self._audited: set[int] = set()
        self._measured: list[np.ndarray] = []
        self._costs: list[float] = []

    def features(self, context, cands) -> list[np.ndarray]:
        """Per-store features of each candidate, extracted once (while the memo has room)."""
        cands = list(cands)
        keys = [_key(c) for c in cands]
        todo = {k: c for k, c in zip(keys, cands, strict=True) if k not in self._memo}
        if len(self._memo) + len(todo) > MEMO_SIZE:
            self._memo.clear()
            todo = dict(zip(keys, cands, strict=True))
        if todo:
            found = self._extractor.extract_from(context, list(todo.values()))
            for k, f in zip(todo, found, strict=True):
                self._memo[k] = f.numpy().astype(np.float32)
        return [self._memo[k] for k in keys]

    def allowed(self, context, pool: list, rng: np.random.Generator) -> np.ndarray:
        """Which candidates of ``pool`` may be measured this round."""
        ok = np.ones(len(pool), dtype=bool)
        if self.filter is None or not self.filter.active:
            return ok
        ok = self.filter.keep(self.features(context, pool))
        audit = ~ok & (rng.uniform(size=len(pool)) < self.audit)
        self._audited |= {_key(pool[i]) for i in np.flatnonzero(audit)}
        self.stats["dropped"] += int((~ok & ~audit).sum())
        return ok | audit

    def explore(self, context, pool: list, allowed: np.ndarray, n: int,
                round_: int) -> list[int] | None:  # fmt: skip
        """An uncertainty round's picks (indices of ``pool``), or ``None``: the verifier picks
        (an even round, or too few measurements to fit an ensemble on)."""
        from tensortune.costmodel.gbdt import XGBoostModel

        if not self.pingpong or round_ % 2 == 0:
            return None
        costs = np.array(self._costs)
        if len(costs) < MIN_LABELLED or np.isfinite(costs).sum() < MIN_LABELLED // 2:
            return None
        where = np.flatnonzero(allowed)
        best = costs[np.isfinite(costs)].min()
        labels = np.where(np.isfinite(costs), best / costs, 0.0)
        known = _programs(self._measured, labels)
        cands = _programs(self.features(context, [pool[i] for i in where]), None)
        data = concat_programs([known, cands])
        data.labels = np.concatenate([labels, np.full(len(cands), np.nan)])
        merged = pool_from_programs(data)
        merged.task[:] = 0
        labelled = np.arange(len(known))
        model = XGBoostModel(n_rounds=60, threads=1, seed=self.seed).fit(merged.labelled(labelled))
        picks = make_selector("alt").select(merged, labelled, model, n, seed=self.seed,
                                            round=round_)  # fmt: skip
        return [int(where[p - len(known)]) for p in picks]

    def observe(self, context, cands: list, results: list) -> None:
        """Learn from a measured batch: its outcomes train the filter and the ensemble."""
        cands, results = list(cands), list(results)
        feats = self.features(context, cands)
        for c, f, res in zip(cands, feats, results, strict=True):
            cost = run_seconds(res.run_secs)
            ran = bool(np.isfinite(cost)) and not res.error_msg
            self._measured.append(f)
            self._costs.append(cost if ran else np.inf)
            self.stats["measured"] += 1
            self.stats["measured_failed"] += int(not ran)
            if _key(c) in self._audited:
                self._audited.discard(_key(c))
                self.stats["audited"] += 1
                self.stats["audited_valid"] += int(ran)
        if self.filter is not None:
            self.filter.fit(self._measured, np.isfinite(np.array(self._costs)))


def _key(cand) -> int:
    return structural_hash(cand.sch.mod)


def _programs(per_store: list[np.ndarray], labels: np.ndarray | None) -> ProgramSet:
    """One task's programs for a per-task model: its workload and hardware are constants."""
    n = len(per_store)
    return ProgramSet(list(per_store), [np.zeros((0, F.TOKEN_WIDTH), np.float32)] * n,
                      np.zeros((n, F.WORKLOAD_WIDTH), np.float32),
                      np.zeros((n, F.HARDWARE_WIDTH), np.float32), np.zeros(n, np.int64),
                      labels)  # fmt: skip
