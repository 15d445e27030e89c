"""Our cost models inside MetaSchedule's search, as a ``PyCostModel``."""

from __future__ import annotations

import dataclasses
import weakref

import numpy as np

from tensortune import features as F
from tensortune.compat import PyCostModel, derived_object, ms, structural_hash
from tensortune.costmodel.base import CostModel
from tensortune.costmodel.data import ProgramSet, concat_programs
from tensortune.costmodel.registry import load_cost_model
from tensortune.errors import TensortuneError
from tensortune.features.lowered import lowered_features_batch
from tensortune.hardware import Platform, resolve_platform, usable_cores
from tensortune.measure.pool import WorkerPool
from tensortune.measure.status import run_seconds
from tensortune.records.convert import to_plain

_MEMO_SIZE = 50_000  # programs whose features are kept (about 10 KB each)
_LOWER_WORKERS = 8  # each holds its own TVM (hundreds of MB)
# Candidates a screen passes on: four rounds' worth of draft-then-verify's 16 measured a round.
SHORTLIST = 64


def candidate_features(context, candidates, *, workload: np.ndarray, hardware: np.ndarray,
                       tokens: bool = True, lowered_for: dict | None = None,
                       lower_pool: WorkerPool | None = None) -> ProgramSet:  # fmt: skip
    """Features of MetaSchedule candidates, computed as ``dataset build`` computes them.

    ``workload`` and ``hardware`` are the task's vectors; trace tokens are skipped (left
    empty) when the model does not read them; ``lowered_for``: the target to compute the
    lowered-loop features for (None: the model does not read them), lowered in
    ``lower_pool``'s workers under their time limit.
    """
    extractor = ms.feature_extractor.PerStoreFeature()
    per_store = [f.numpy().astype(np.float32) for f in extractor.extract_from(context, candidates)]
    seqs = [F.trace_tokens(to_plain(c.sch.trace.as_json(remove_postproc=False))) if tokens
            else np.zeros((0, F.TOKEN_WIDTH), np.float32) for c in candidates]  # fmt: skip
    n = len(candidates)
    lowered = None
    if lowered_for is not None:
        lowered = np.stack(candidate_lowered(candidates, lowered_for, lower_pool))
    return ProgramSet(per_store, seqs, np.tile(workload, (n, 1)), np.tile(hardware, (n, 1)),
                      np.zeros(n, dtype=np.int64), lowered=lowered)  # fmt: skip


def candidate_lowered(candidates, target: dict, lower_pool: WorkerPool | None) -> list[np.ndarray]:
    """The candidates' lowered-loop features for ``target``, lowered in ``lower_pool``."""
    if lower_pool is None:
        raise TensortuneError("lowered-loop features need a worker pool to lower in")
    return lowered_features_batch([(c.sch.mod, target) for c in candidates], lower_pool)


@derived_object
class LearnedCostModel(PyCostModel):
    """Scores MetaSchedule candidates with one of our cost models.

    ``platform`` (a ``Platform``, or a target for this machine) gives the hardware vector the
    model reads.  Frozen by default; with ``online=True`` every measured batch refines the model
    (more trees for the GBDTs, a few epochs for the networks), each program labelled by the
    task's fastest run so far over its own run time (0 for a failure).

    ``screen``: a cheaper fitted model that scores every candidate first and passes only its
    best ``shortlist`` on to ``model``.  It pays where ``model`` reads lowered-loop features:
    lowering every candidate of a round made a search 6-26% longer (benchmarks/RESULTS.md,
    stop 52), and only the few the search will measure need them.  Candidates the screen
    holds back score below every one it passed, in the screen's order.
    """

    def __init__(self, model: CostModel | str, platform: Platform | dict | str | None = None, *,
                 online: bool = False, screen: CostModel | str | None = None,
                 shortlist: int = SHORTLIST) -> None:  # fmt: skip
        super().__init__()
        self.model = load_cost_model(model) if isinstance(model, str) else model
        self.screen = load_cost_model(screen) if isinstance(screen, str) else screen
        if self.screen is not None:
            if not self.screen.fitted:
                raise TensortuneError(f"the screening {self.screen.kind} model has not been "
                                      "fitted", param="screen")  # fmt: skip
            if self.screen.uses_lowered:
                raise TensortuneError("a screen must read the cheap features only, not "
                                      "lowered-loop features", param="screen")  # fmt: skip
        if shortlist < 1:
            raise TensortuneError(f"a shortlist holds at least 1 candidate, not {shortlist}",
                                  param="shortlist")  # fmt: skip
        self.shortlist = shortlist
        self.platform = resolve_platform(platform, measurable=False)
        self.online = online
        self._best: dict[str, float] = {}  # per task: the fastest run measured so far
        # Per measured batch: its task, its programs' features and run times (inf: failed).
        self._measured: list[tuple[str, ProgramSet, np.ndarray]] = []
        self._workload: dict[str, np.ndarray] = {}
        self._hardware = F.hardware_vector(self.platform)
        self._memo: dict[str, list] = {}  # per program: per-store, tokens, lowered (or None)
        self._tokens = self.model.uses_tokens or bool(self.screen and self.screen.uses_tokens)
        self._lower_pool: WorkerPool | None = None
        self.screened = 0  # candidates the screen held back from the model, over the search
        if self.model.uses_lowered:  # the workers import TVM while the tuner sets up
            self._lowering().start()

    def _lowering(self) -> WorkerPool:
        """Workers that lower candidates for a model reading lowered-loop features: TVM may
        crash or hang on an odd schedule, which must cost a search a time limit, not the run.
        One per usable core: the search waits on them (candidates are scored between measured
        batches), and lowering is most of the features' cost."""
        if self._lower_pool is None:
            self._lower_pool = WorkerPool(min(usable_cores(), _LOWER_WORKERS), reuse=True)
            weakref.finalize(self, self._lower_pool.close)
        return self._lower_pool

    def _features(self, context, candidates, *, lowered: bool,
                  keys: list[str] | None = None) -> ProgramSet:  # fmt: skip
        """Features of the candidates, extracted once per distinct program: search strategies
        re-score the same programs round after round (a draft cache, an elite population).
        ``lowered``: with the lowered-loop features, lowered now where not yet; ``keys``: the
        candidates' structural hashes, when the caller has them."""
        from tensortune.workloads.sources import estimate_flop

        key = structural_hash(context.mod)
        if key not in self._workload:  # once per task, not once per generation
            self._workload[key] = F.workload_embedding(context.mod, estimate_flop(context.mod))
        keys = keys if keys is not None else [structural_hash(c.sch.mod) for c in candidates]
        missing = {k: c for k, c in zip(keys, candidates, strict=True) if k not in self._memo}
        if missing:
            fresh = candidate_features(context, list(missing.values()),
                                       workload=self._workload[key], hardware=self._hardware,
                                       tokens=self._tokens)  # fmt: skip
            if len(self._memo) + len(missing) > _MEMO_SIZE:
                wanted = set(keys)
                self._memo = {k: v for k, v in self._memo.items() if k in wanted}
            for k, p, t in zip(missing, fresh.per_store, fresh.tokens, strict=True):
                self._memo[k] = [p, t, None]
        if lowered:
            unlowered = {k: c for k, c in zip(keys, candidates, strict=True)
                         if self._memo[k][2] is None}  # fmt: skip
            if unlowered:
                got = candidate_lowered(list(unlowered.values()), self.platform.target,
                                        self._lowering())  # fmt: skip
                for k, w in zip(unlowered, got, strict=True):
                    self._memo[k][2] = w
        n = len(candidates)
        low = np.stack([self._memo[k][2] for k in keys]) if lowered else None
        return ProgramSet([self._memo[k][0] for k in keys], [self._memo[k][1] for k in keys],
                          np.tile(self._workload[key], (n, 1)), np.tile(self._hardware, (n, 1)),
                          np.zeros(n, dtype=np.int64), lowered=low)  # fmt: skip

    def per_store_features(self, context, candidates,
                           keys: list[str] | None = None) -> list[np.ndarray]:  # fmt: skip
        """The candidates' per-store features (MetaSchedule's ``PerStoreFeature``), from the
        memo where this model has scored them, else extracted and kept there as scoring them
        would (trace tokens too, where the model reads them).  ALT's filter and ensemble read
        the programs the verifier has just scored: extracting them again was most of ALT's
        time."""
        return self._features(context, candidates, lowered=False, keys=keys).per_store

    def predict(self, context, candidates) -> np.ndarray:
        if not candidates or not self.model.fitted:  # a cold online model knows nothing yet
            return np.zeros(len(candidates))
        if self.screen is None or len(candidates) <= self.shortlist:
            data = self._features(context, candidates, lowered=self.model.uses_lowered)
            return np.asarray(self.model.predict(data), np.float64)
        keys = [structural_hash(c.sch.mod) for c in candidates]
        data = self._features(context, candidates, lowered=False, keys=keys)
        cheap = np.asarray(self.screen.predict(data), np.float64)
        passed = np.argsort(-cheap, kind="stable")[: self.shortlist]
        data = self._features(context, [candidates[i] for i in passed],
                              keys=[keys[i] for i in passed],
                              lowered=self.model.uses_lowered)  # fmt: skip
        scores = np.asarray(self.model.predict(data), np.float64)
        self.screened += len(candidates) - len(passed)
        return held_back_below(scores, passed, cheap)

    def update(self, context, candidates, results) -> None:
        if not self.online or not candidates:
            return
        costs = np.array([run_seconds(r.run_secs) for r in results])
        key = structural_hash(context.mod)
        ran = costs[np.isfinite(costs)]
        best = min(self._best.get(key, np.inf), ran.min() if len(ran) else np.inf)
        self._best[key] = best
        self._measured.append(
            (key, self._features(context, candidates, lowered=self.model.uses_lowered), costs)
        )
        if not np.isfinite(best):  # nothing of the task has run yet: no scale to label on
            return
        batches = self._labelled()
        self.model.update(batches[-1], seen=concat_programs(batches))

    def _labelled(self) -> list[ProgramSet]:
        """Every measured program labelled by its task's best run so far (``best / cost``, 0
        for a failure) and grouped by task, as MetaSchedule's XGBModel relabels at every
        update.  Labelled once, when measured, a batch kept its task's best of that moment,
        and one faster program later left the earlier ones rated above it; grouped by batch,
        a ranking loss never compared programs of two rounds.  Tasks with nothing that ran
        are left out (no scale to label on); the batch measured last comes last."""
        tasks = {key: i for i, key in enumerate(dict.fromkeys(k for k, _, _ in self._measured))}
        return [
            dataclasses.replace(data, groups=np.full(len(data), tasks[key], np.int64),
                                labels=np.where(np.isfinite(costs), self._best[key] / costs, 0.0))
            for key, data, costs in self._measured if np.isfinite(self._best[key])
        ]  # fmt: skip

    def save(self, path: str) -> None:
        self.model.save(path)

    def load(self, path: str) -> None:
        model = load_cost_model(path)
        # What the programs measured so far carry: tokens where the model or the screen read
        # them, lowered-loop features where the model did.
        lacking = (model.uses_tokens and not self._tokens) or (
            model.uses_lowered and not self.model.uses_lowered)  # fmt: skip
        if self._measured and lacking:
            raise TensortuneError(f"{path}: its {model.kind} model reads features that the "
                                  "programs measured so far lack")  # fmt: skip
        self.model = model
        self._tokens = model.uses_tokens or bool(self.screen and self.screen.uses_tokens)
        self._memo.clear()  # cached without the tokens or lowered features it may read
        if model.uses_lowered:
            self._lowering().start()


def held_back_below(scores: np.ndarray, passed: np.ndarray, cheap: np.ndarray) -> np.ndarray:
    """Scores for all candidates: ``scores`` for the ``passed`` ones, and for the others
    values below every passed one, ordered by their ``cheap`` scores.  Kept non-negative
    where the passed ones are (MetaSchedule's evolution samples parents by score)."""
    out = np.empty(len(cheap))
    out[passed] = scores
    rest = np.setdiff1d(np.arange(len(cheap)), passed)
    order = np.argsort(np.argsort(cheap[rest], kind="stable"), kind="stable")  # 0: the worst
    fraction = (order + 1) / (len(rest) + 1)  # in (0, 1), the screen's order kept
    finite = scores[np.isfinite(scores)]
    floor = finite.min() if len(finite) else 0.0
    out[rest] = floor * fraction if floor > 0 else floor - 1 + fraction
    return out
