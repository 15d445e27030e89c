"""ALT inside draft-then-verify: the validity filter, and the uncertainty/score ping-pong.

- **Validity** (``validity=1``): after the verifier has scored a round's pool, the candidates
  that ``ValidityFilter`` rates likely to fail (build errors, crashes, timeouts) are dropped
  from the round and from the cache.  An ``audit`` share of them, drawn at random, stays
  eligible: the dropped programs are never measured, so the audits a round picks are what
  says how many the filter drops wrongly (a rough count: a round picks by score, so they
  lean toward the verifier's favourites).  An audit is one fit's verdict; the next fit
  judges the program anew.
  The filter is refitted after every measured batch on everything the task has measured,
  earlier runs' records in the store included.
- **Ping-pong** (``pingpong=1``): rounds alternate.  Even rounds pick as draft-then-verify
  always does (the verifier's best, the score predictor's turn); odd rounds pick by
  uncertainty: a bootstrap ensemble of a small GBDT fitted on the task's measurements, and its
  most disputed candidates kept apart in feature space (the ``alt`` selector's exploring
  round, ``active/selectors.py``).  ``pingpong=2`` adapts the mix to what the last batch
  bought instead: a round explores only after a verifier's round that did not improve the
  task's best latency (and never twice in a row).  Fixed alternation spent half of a short
  budget on exploring and reached MetaSchedule's final latency later than the verifier alone
  on three networks (benchmarks/RESULTS.md, "ALT's ping-pong in bench tune").

``stats`` (shared by every task's clone, like the strategy's timings) counts what the filter
did: ``dropped`` (candidates it turned away, each once per fit: an upper bound of the
measurements it saved, since most would never have been picked), ``displaced`` (of each round's
``n`` best-scored candidates, those it turned away: an estimate of the measurements saved,
neither bound, since a round also picks some at random or by uncertainty, a candidate turned
away while ranked lower might have been picked later, and a wrong drop counts too), ``audited``
and ``audited_valid`` (audits measured while the fit that dropped them held, and how many
of them ran), the measured
programs that failed (and of those, ``failed_unfiltered``: picked before the filter had seen
enough of both kinds to judge), and ``earlier``: the records store's measurements of earlier
runs the filter and the ensemble started from (``warm_start``; failures included, which
MetaSchedule's database queries omit); ``explored``: the rounds the uncertainty ensemble picked.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tensortune import features as F
from tensortune.active import ValidityFilter, make_selector, pool_from_programs
from tensortune.compat import MeasureCandidate, ms, structural_hash, tvm
from tensortune.costmodel.data import ProgramSet, concat_programs
from tensortune.measure.status import run_seconds

STAT_KEYS = ("dropped", "displaced", "audited", "audited_valid", "measured", "measured_failed",
             "failed_unfiltered", "earlier", "explored")  # fmt: skip
# Programs whose features are kept (a few KB each); the cache holds a few hundred at a time.
MEMO_SIZE = 5000
# Fewest measured programs (and successes) before the uncertainty ensemble is fitted.
MIN_LABELLED = 8


class AltPolicy:
    """One task's ALT state: features of its candidates, outcomes of its measurements."""

    def __init__(self, *, validity: bool, pingpong: int, audit: float, stats: dict[str, int],
                 seed: int, log: list[tuple[float, bool, int]] | None = None,
                 extract: Callable[..., list[np.ndarray]] | None = None) -> None:  # fmt: skip
        self.filter = ValidityFilter(seed=seed) if validity else None
        # ``extract(context, candidates, keys)``: per-store features from where they are kept
        # already (the verifier's memo, ``LearnedCostModel.per_store_features``); None: ours.
        self.extract = extract
        # Of each measured program the filter judged: P(valid) then, whether it ran, and the
        # fewer of the successes and failures the filter had been fitted on (benchmarks).
        self.log = log
        self.pingpong = pingpong
        self.audit = audit
        self.stats = stats
        self.seed = seed
        self._extractor = ms.feature_extractor.PerStoreFeature()
        # By program (structural hash): MetaSchedule hands measured candidates back as new
        # Python objects, so identity cannot tie them to the ones picked.
        self._memo: dict[str, np.ndarray] = {}
        self._audited: set[str] = set()
        self._decided: dict[str, bool] = {}  # by program: measure it? (this fit's verdicts)
        self._p_valid: dict[str, float] = {}  # by program: the filter's rating when judged
        self._fewest = 0
        self._measured: list[np.ndarray] = []
        self._costs: list[float] = []
        self._explored = False  # the last round picked by uncertainty
        self._stalled = False  # the last measured batch did not improve the task's best

    def features(self, context, cands, keys: list[str] | None = None) -> list[np.ndarray]:
        """Per-store features of each candidate, computed once (while the memo has room), by
        ``extract`` where given: the verifier has just scored these candidates.  ``keys``: the
        candidates' ``_key``s where the caller has them (hashing a program is not free)."""
        cands = list(cands)
        keys = [_key(c) for c in cands] if keys is None else keys
        todo = {k: c for k, c in zip(keys, cands, strict=True) if k not in self._memo}
        if len(self._memo) + len(todo) > MEMO_SIZE:
            self._memo.clear()
            todo = dict(zip(keys, cands, strict=True))
        if todo:
            new = list(todo.values())
            if self.extract is not None:
                found = self.extract(context, new, list(todo))
            else:
                found = [f.numpy().astype(np.float32)
                         for f in self._extractor.extract_from(context, new)]  # fmt: skip
            self._memo.update(zip(todo, found, strict=True))
        return [self._memo[k] for k in keys]

    def allowed(self, context, pool: list, rng: np.random.Generator) -> np.ndarray:
        """Which candidates of ``pool`` may be measured this round.  A program is judged once
        per fit of the filter (a round that asks again, with fresh drafts, gets the same
        answer for the ones it had, and they are counted once)."""
        if self.filter is None or not self.filter.active:
            return np.ones(len(pool), dtype=bool)
        keys = [_key(c) for c in pool]
        todo = [i for i, k in enumerate(keys) if k not in self._decided]
        if todo:
            p = self.filter.p_valid(self.features(context, [pool[i] for i in todo],
                                                  [keys[i] for i in todo]))  # fmt: skip
            keep = p >= self.filter.threshold
            audit = ~keep & (rng.uniform(size=len(todo)) < self.audit)
            for i, kept, audited, p_i in zip(todo, keep, audit, p, strict=True):
                self._decided[keys[i]] = bool(kept or audited)
                self._p_valid[keys[i]] = float(p_i)
                if audited:
                    self._audited.add(keys[i])
            self.stats["dropped"] += int((~keep & ~audit).sum())
        return np.array([self._decided[k] for k in keys], dtype=bool)

    def count_displaced(self, scores: np.ndarray, allowed: np.ndarray, n: int) -> None:
        """Count the round's ``n`` best-scored candidates the filter turned away: an estimate of
        the measurements it saved (``dropped`` counts every candidate it turned away)."""
        best = np.argsort(-scores, kind="stable")[:n]
        self.stats["displaced"] += int((~allowed[best]).sum())

    def likeliest(self, context, pool: list, n: int) -> np.ndarray:
        """When the filter rejects a whole round: the ``n`` programs it rates likeliest to
        run, measured as audits (their outcomes are what corrects a filter that is wrong)."""
        keys = [_key(c) for c in pool]
        p = self.filter.p_valid(self.features(context, pool, keys))
        out = np.zeros(len(pool), dtype=bool)
        out[np.argsort(-p, kind="stable")[:n]] = True
        for i in np.flatnonzero(out):
            key = keys[i]
            if not self._decided.get(key, True) and key not in self._audited:
                self._audited.add(key)
                self.stats["dropped"] -= 1
            self._decided[key] = True
        return out

    def explore(self, context, pool: list, allowed: np.ndarray, n: int,
                round_: int) -> list[int] | None:  # fmt: skip
        """An uncertainty round's picks (indices of ``pool``), or ``None``: the verifier picks
        (an even round, or too few measurements to fit an ensemble on)."""
        from tensortune.costmodel.gbdt import XGBoostModel

        explored_last, self._explored = self._explored, False
        if not self.pingpong or (self.pingpong == 1 and round_ % 2 == 0):
            return None
        if self.pingpong == 2 and (explored_last or not self._stalled):
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
        # an odd round is the selector's exploring one (``round_`` itself in fixed alternation)
        picks = make_selector("alt").select(merged, labelled, model, n, seed=self.seed,
                                            round=round_ | 1)  # fmt: skip
        self._explored = True
        self.stats["explored"] += 1
        return [int(where[p - len(known)]) for p in picks]

    def warm_start(self, context, earlier: list[tuple[object, bool]]) -> set[str]:
        """Learn from the records store's earlier measurements of this task (MetaSchedule
        tuning records, with whether each ran): a task that failed before is filtered from its
        first round.  Traces that no longer replay are skipped.  Returns the programs' keys
        (what the search must not draft again: they are measured)."""
        cands, ran = replay_earlier(context, earlier)
        if not cands:
            return set()
        keys = [_key(c) for c in cands]
        self._measured.extend(self.features(context, cands, keys))
        self._costs.extend(ran)
        self.stats["earlier"] += len(cands)
        self._refit()
        return set(keys)

    def observe(self, context, cands: list, results: list) -> None:
        """Learn from a measured batch: its outcomes train the filter and the ensemble."""
        cands, results = list(cands), list(results)
        if not cands:  # a batch another tuner had measured already: nothing learned
            return
        keys = [_key(c) for c in cands]
        feats = self.features(context, cands, keys)
        best_before = min(self._costs, default=np.inf)  # failures are inf
        best_now = np.inf
        learning = self.filter is not None and not self.filter.active  # it kept all of these
        for key, f, res in zip(keys, feats, results, strict=True):
            cost = run_seconds(res.run_secs)
            ran = bool(np.isfinite(cost)) and not res.error_msg
            self._measured.append(f)
            self._costs.append(cost if ran else np.inf)
            best_now = min(best_now, self._costs[-1])
            self.stats["measured"] += 1
            self.stats["measured_failed"] += int(not ran)
            self.stats["failed_unfiltered"] += int(not ran and learning)
            p_valid = self._p_valid.pop(key, None)
            if self.log is not None and p_valid is not None:
                self.log.append((p_valid, ran, self._fewest))
            if key in self._audited:
                self._audited.discard(key)
                self.stats["audited"] += 1
                self.stats["audited_valid"] += int(ran)
        self._stalled = best_now >= best_before
        self._refit()

    def _refit(self) -> None:
        if self.filter is not None:
            ran = np.isfinite(np.array(self._costs))
            self._fewest = int(min(ran.sum(), (~ran).sum()))
            self.filter.fit(self._measured, ran)
            # New verdicts from the new fit: an audit is one fit's drop, re-judged by the next.
            self._decided.clear()
            self._p_valid.clear()
            self._audited.clear()


def _key(cand) -> str:
    return structural_hash(cand.sch.mod)


def replay_earlier(context, earlier: list[tuple[object, bool]]) -> tuple[list, list[float]]:
    """Candidates of a task's earlier measurements (tuning records, with whether each ran)
    and their run seconds (inf: failed); traces that no longer replay are skipped."""
    cands, ran = [], []
    for record, ok in earlier:
        sch = tvm.s_tir.Schedule(context.mod)
        try:
            record.trace.apply_to_schedule(sch, remove_postproc=False)
        except Exception:  # a trace from another TVM or another version of the workload
            continue
        cands.append(MeasureCandidate(sch, record.args_info))
        ran.append(run_seconds(record.run_secs) if ok else np.inf)
    return cands, ran


def measured_keys(context, earlier: list[tuple[object, bool]]) -> set[str]:
    """The keys of the programs of a task's earlier measurements: what a resumed search must
    not pick again."""
    return {_key(c) for c in replay_earlier(context, earlier)[0]}


def _programs(per_store: list[np.ndarray], labels: np.ndarray | None) -> ProgramSet:
    """One task's programs for a per-task model: its workload and hardware are constants."""
    n = len(per_store)
    return ProgramSet(list(per_store), [np.zeros((0, F.TOKEN_WIDTH), np.float32)] * n,
                      np.zeros((n, F.WORKLOAD_WIDTH), np.float32),
                      np.zeros((n, F.HARDWARE_WIDTH), np.float32), np.zeros(n, np.int64),
                      labels)  # fmt: skip
