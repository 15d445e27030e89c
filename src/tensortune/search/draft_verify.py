"""Draft-then-verify search (Pruner's idea) as a MetaSchedule ``PySearchStrategy``.

Each draft, MetaSchedule's own evolutionary search (C++, all cores) evolves a population scored
only by the cheap analyzer and hands back its ``draft_size`` best unmeasured programs: the draft
cache (a task's first draft only ranks its initial population, random samples plus any
measured records of the task: evolving it delayed the first measurement by seconds).  Each
round, the learned cost model (the verifier: whatever model the tuner was given) scores the
cache plus one generation of mutants of the cache's verified best, and the top of that, with
ε-greedy exploration, is measured.  The verifier therefore sees a few hundred programs per
round instead of the thousands MetaSchedule's default scores.

A task not measured before starts with register-blocked seeds (``search/seeds.py``): its
sketches with their tiles set by rule join the first cache, and half a round of them is
measured first (``seeds=0``: not): the one the analyzer ranks first, as ``deploy/unrecorded.py``
picks a program for a kernel without a record, then the verifier's best.  After five minutes of
tuning (4-5 trials a task) resnet18 ran no faster than built from an empty store with those
picks (benchmarks/RESULTS.md): a verifier's choice of seeds alone can miss the analyzer's.

With ``blend`` on, the picks rank by both scorers: a weighted mean of the analyzer's and the
verifier's rank orders, the verifier's weight following how well each has ordered the task's
measured programs so far (``search/blend.py``).  It is off by default (the verifier alone
picks once it tells programs apart, as in Pruner): on our benchmark it helped MoA on resnet50
and hurt it on BERT and MobileNetV2 (benchmarks/RESULTS.md).

With ``build_cost_weight`` w > 0 and the builder's timings, the greedy picks also weigh what a
program costs to build: a candidate's verifier rank is multiplied by r**w, r being how much
longer its unroll step has built so far on this task than the cheapest step
(``search/build_cost.py``); at w = 1 a program that builds 3x slower is measured only if the
verifier ranks it in the top third of the picks.  It is off by default: on our benchmark it cut
build time but reached the default's latency later (benchmarks/RESULTS.md).

Defaults are for CPUs, not Pruner's GPU setting (population 1536, cache 512, 10 measured per
round): here one candidate's mutation and postprocessing costs milliseconds of the same two
cores that build and run, so the population is smaller and more is measured per round.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import time
import warnings
from collections.abc import Mapping

import numpy as np

from tensortune.compat import (
    PySearchStrategy,
    derived_object,
    ms,
    mutate,
    structural_hash,
)
from tensortune.costmodel.timed import TimedCostModel
from tensortune.errors import TensortuneError, check_flags, last_line
from tensortune.hardware import Platform, current_hardware, target_key
from tensortune.measure.status import run_seconds
from tensortune.search.alt import STAT_KEYS, AltPolicy, measured_keys
from tensortune.search.analyzer.cost_model import AnalyzerCostModel
from tensortune.search.analyzer.machine import machine_for
from tensortune.search.analyzer.roofline import Analyzer
from tensortune.search.blend import TrustBlend
from tensortune.search.build_cost import BuildCosts, cost_aware_order, unroll_step
from tensortune.search.seeds import seed_candidates
from tensortune.search.space import RandomSchedules, replayed

# Fresh drafts a round may ask for when ALT's filter leaves fewer candidates than it measures.
REFILLS = 3

# The settings of DraftThenVerify a user may change by name (the CLI's ``--draft-option k=v``),
# with their smallest and largest values; type and default are the constructor's.
OPTION_RANGES: dict[str, tuple[float, float]] = {
    "population": (2, math.inf), "draft_generations": (0, math.inf),
    "first_draft_generations": (0, math.inf), "draft_size": (1, math.inf),
    "redraft_every": (1, math.inf), "verify_mutants": (0, math.inf), "per_round": (1, math.inf),
    "eps": (0.0, 1.0), "init_measured_ratio": (0.0, 1.0), "build_cost_weight": (0.0, math.inf),
    "blend": (0, 1), "validity": (0, 1), "pingpong": (0, 2), "audit": (0.0, 1.0),
    "seeds": (0, 1), "threads": (0, math.inf),
}  # fmt: skip


def option_defaults() -> dict[str, object]:
    """Each setting's default, as the constructor declares it."""
    params = inspect.signature(DraftThenVerify).parameters
    return {name: params[name].default for name in OPTION_RANGES}


def check_options(options: Mapping[str, object]) -> dict[str, float]:
    """``options`` as numbers of their setting's type, those equal to the default dropped (so
    equal settings compare equal); a one-line error for an unknown name or a bad value.
    Values may be numbers or their text (as the command line gives them), not booleans."""
    if not isinstance(options, Mapping):  # a string would be read as its letters
        raise TensortuneError(f"a mapping of option names to values, not {options!r:.60}",
                              param="draft_options")  # fmt: skip
    unknown = sorted(set(options) - set(OPTION_RANGES))
    if unknown:
        known = ", ".join(OPTION_RANGES)
        raise TensortuneError(f"unknown draft-then-verify option(s) {unknown}; known: {known}",
                              param="draft_options")  # fmt: skip
    defaults = option_defaults()
    out: dict[str, float] = {}
    for key, raw in options.items():
        default = defaults[key]
        kind = type(default)
        low, high = OPTION_RANGES[key]
        try:
            if isinstance(raw, bool):  # True would be 1
                raise TypeError
            value = float(raw)  # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):
            raise TensortuneError(f"{key}={raw!r:.40}: not a number",
                                  param="draft_options") from None  # fmt: skip
        if (
            not low <= value <= high
            or not math.isfinite(value)
            or (kind is int and not value.is_integer())
        ):
            kind_name = "a whole number" if kind is int else "a number"
            raise TensortuneError(f"{key}={raw!r}: expected {kind_name} from {low:g} to "
                                  f"{high:g}", param="draft_options")  # fmt: skip
        if value != default:
            out[key] = kind(value)
    return out


@derived_object
class DraftThenVerify(PySearchStrategy):
    """Draft with the analyzer, verify with the learned model, measure a few per round.

    ``population``/``draft_generations``: the analyzer-scored evolution;
    ``first_draft_generations``: its generations in a task's first draft, which starts from
    random samples (0: the analyzer only ranks them; each generation delays the task's first
    measurement by seconds); ``draft_size``: the
    evolution's best programs kept as the cache; ``redraft_every``: rounds between drafts;
    ``verify_mutants``: how many of the verified best get one mutation each;
    ``per_round``: programs measured per round (None: the tuner's per-round count, which also
    bounds it);
    ``eps``: share of them picked at random from the round's pool (the cache and its
    mutants).  ``timings`` (seconds spent
    drafting, in the analyzer and verifying) is shared by every clone, i.e. summed over tasks.
    ``build_cost_weight``: the exponent on a candidate's expected build cost ratio in its
    effective rank (0: the verifier's rank alone); the build times come from the builder
    ``watch_builder`` was given (shared by every clone as ``build_times``).
    ``blend``: 1 ranks the picks by the analyzer's and the verifier's ranks, weighted by how
    well each ranked the task's measurements; 0 by the verifier's alone.
    ``seeds``: 1 adds a task's register-blocked tilings (``search/seeds.py``) to its first
    cache and measures the verifier's best half-round of them first; 0 leaves it to chance.
    ``verifier_screens``: the verifier shortlists candidates with a screen before scoring
    them (set by ``watch_verifier``), so each round's mutants are scored with the cache.
    ``threads``: the threads the drafter's evolution (and ALT's random drafts) sample on; 0,
    every physical core.  Only one makes a search a function of its seed: on two, which
    thread took which draw decided up to 7 of a task's first 16 picks, so two runs of one
    seed differed, and so did two methods a benchmark compares with one seed.  One costs
    time: a round of a 3x3 conv2d took 1.7x as long on one thread as on two (stop 67).
    """

    def __init__(self, population: int = 512, draft_generations: int = 2, draft_size: int = 256,
                 redraft_every: int = 2, verify_mutants: int = 32, per_round: int | None = 16,
                 eps: float = 0.1, init_measured_ratio: float = 0.1,
                 timings: dict[str, float] | None = None,
                 build_times: dict[str, float] | None = None, build_cost_weight: float = 0.0,
                 first_draft_generations: int = 0, blend: int = 0, validity: int = 0,
                 pingpong: int = 0, audit: float = 0.1, seeds: int = 1,
                 alt_stats: dict[str, int] | None = None,
                 alt_log: list[tuple[float, bool, int]] | None = None,
                 records: object | None = None, verifier_screens: bool = False,
                 threads: int = 0, warming: object | None = None,
                 features_from: object | None = None) -> None:  # fmt: skip
        super().__init__()
        check_flags(verifier_screens=verifier_screens)
        self.population = population
        self.draft_generations = draft_generations
        self.first_draft_generations = first_draft_generations
        self.draft_size = draft_size
        self.redraft_every = redraft_every
        self.verify_mutants = verify_mutants
        self.per_round = per_round
        self.eps = eps
        self.init_measured_ratio = init_measured_ratio
        self.timings = timings if timings is not None else {}
        for key in ("draft", "analyzer", "verify", "alt"):
            self.timings.setdefault(key, 0.0)
        self.build_times = build_times
        self.build_cost_weight = build_cost_weight
        self.blend = blend
        self.validity = validity
        self.pingpong = pingpong
        self.audit = audit
        self.seeds = seeds
        self.alt_stats = alt_stats if alt_stats is not None else {}
        for key in STAT_KEYS:
            self.alt_stats.setdefault(key, 0)
        self.alt_log = alt_log  # benchmarks' record of the filter's ratings (``AltPolicy.log``)
        self.records = records
        self.verifier_screens = verifier_screens
        # The verifier's Python object when it has a warm-up (``watch_verifier``, ``_warming_up``)
        self.warming = warming
        # The verifier's Python object when it keeps its candidates' per-store features
        # (``watch_verifier``): ALT reads them there rather than extracting them again.
        self.features_from = features_from
        self.threads = threads
        # Settings out of range reach TVM as they are (eps=2 returned 83 candidates for a
        # round of 8): checked here, as the command line checks --draft-option.
        # per_round=None (the tuner's count) is the one setting that is not a number
        given = {k: v for k, v in self.settings().items() if k != "per_round" or v is not None}
        checked, defaults = check_options(given), option_defaults()
        for name, value in given.items():  # per_round=16.0 (JSON) slices as 16, not a float
            setattr(self, name, checked.get(name, type(defaults[name])(value)))

    @property
    def sampling_threads(self) -> int | str:
        """The threads a task's context samples on (``space.tune_context`` reads them)."""
        return self.threads or "physical"

    def settings(self) -> dict[str, object]:
        """The settings (``OPTION_RANGES``' names) this strategy was made with."""
        return {name: getattr(self, name) for name in OPTION_RANGES}

    def copy(self) -> DraftThenVerify:
        """A fresh strategy with these settings and shared counters.  Unlike ``clone``, whose
        result comes back through TVM as its bare C++ object, it keeps our Python attributes
        (``limit_round``, ``sampling_threads``) reachable (``factory.copy_of``)."""
        return DraftThenVerify(**self.settings(), timings=self.timings,
                               build_times=self.build_times, alt_stats=self.alt_stats,
                               alt_log=self.alt_log, records=self.records,
                               verifier_screens=self.verifier_screens,
                               warming=self.warming,
                               features_from=self.features_from)  # fmt: skip

    def clone(self) -> DraftThenVerify:
        return self.copy()

    def read_records(self, database: object) -> None:
        """Where ALT's filter finds earlier runs' outcomes of a task, failures included: our
        ``StoreDatabase`` (``tune`` calls this before it clones the strategy for each task;
        the database MetaSchedule hands ``pre_tuning`` is its C++ view, without our methods)."""
        self.records = database

    def watch_verifier(self, verifier: object) -> None:
        """Note whether the cost model screens candidates (``LearnedCostModel(screen=...)``,
        maybe inside wrappers), and keep it where it has a warm-up (MetaSchedule's XGBoost)
        or keeps its candidates' per-store features (``LearnedCostModel``, for ALT):
        MetaSchedule hands ``pre_tuning`` its C++ view, which says none of this (``tune``
        calls this before it clones the strategy for each task)."""
        model, self.verifier_screens, self.warming = verifier, False, None
        self.features_from = None
        for _ in range(4):  # e.g. a TimedCostModel around a LearnedCostModel
            if getattr(model, "screen", None) is not None:
                self.verifier_screens = True
            if self.features_from is None and callable(getattr(model, "per_store_features",
                                                               None)):  # fmt: skip
                self.features_from = model
            if self.warming is None and isinstance(getattr(model, "num_warmup_samples", None),
                                                   int):  # fmt: skip
                self.warming = model
            model = getattr(model, "inner", None)

    def watch_builder(self, builder: object) -> None:
        """Learn what builds cost from ``builder``'s timings when they weigh in the picks
        (``tune`` calls this before it clones the strategy for each task)."""
        if self.build_cost_weight > 0 and hasattr(builder, "collect_build_times"):
            self.build_times = builder.collect_build_times()

    def _initialize_with_tune_context(self, context) -> None:
        self.context = context
        seed = max(int(context.rand_state), 0)
        self.rng = np.random.default_rng(seed)
        # ALT draws from a stream of its own: with the filter idle (nothing failed) and no
        # exploring round yet, an ALT search picks what plain draft-then-verify with the same
        # seed picks, so a benchmark compares the two on the same programs until they differ.
        self.alt_rng = np.random.default_rng([seed, 1])
        platform = Platform(json.loads(target_key(context.target)), current_hardware())
        self.platform = platform
        self.analyzer = TimedCostModel(AnalyzerCostModel(Analyzer(machine_for(platform))))
        self.drafter = self._evolution(context, self.draft_generations)
        self.first_drafter = None
        gen = context.space_generator
        self.postprocs = list(gen.postprocs)
        probs = {m: float(p) for m, p in dict(gen.mutator_probs).items()}
        self.mutators = list(probs)
        total = sum(probs.values()) or 1.0
        self.mutator_p = np.array([probs[m] / total for m in self.mutators])

    def _fresh(self) -> int:
        """Unmeasured programs a draft's first population holds at least."""
        return max(self.population // 4, 16)

    def _measured_ratio(self) -> float:
        """``init_measured_ratio``, at most what leaves ``_fresh()`` programs to sample:
        MetaSchedule samples the population less the measured programs it takes and stops
        ("Cannot sample enough initial population") when that is fewer; at a ratio near 1,
        every draft of a task with enough records failed."""
        return max(0.0, min(self.init_measured_ratio, 1 - self._fresh() / self.population))

    def _evolution(self, context, generations: int):
        evolution = ms.search_strategy.EvolutionarySearch(
            population_size=self.population, init_measured_ratio=self._measured_ratio(),
            init_min_unmeasured=self._fresh(), genetic_num_iters=generations, eps_greedy=0.0,
        )  # fmt: skip
        evolution._initialize_with_tune_context(context)
        return evolution

    def pre_tuning(self, max_trials: int, num_trials_per_iter: int, design_spaces, database=None,
                   cost_model=None) -> None:  # fmt: skip
        self.max_trials = max_trials
        self.round_limit = 1 << 30  # none until ``limit_round``
        self.sampler = None  # random drafts, made when a filtered round first needs them
        # The tuner's round size bounds ours: it splits a small budget between its tasks.
        self.n_round = min(self.per_round or num_trials_per_iter, num_trials_per_iter)
        self.verifier = cost_model
        self.trials = 0
        self.rounds = 0
        self.cache: list = []
        self.seen: set[str] = set()
        self.build_costs = BuildCosts()
        self.trust = TrustBlend()
        self.picked_scores: list[tuple[float, float | None]] = []
        self.analyzer_memo: dict[int, tuple[object, float]] = {}
        self.alt = (AltPolicy(validity=bool(self.validity), pingpong=int(self.pingpong),
                              audit=self.audit, stats=self.alt_stats,
                              seed=int(self.alt_rng.integers(1 << 30)), log=self.alt_log,
                              extract=getattr(self.features_from, "per_store_features", None))
                    if self.validity or self.pingpong else None)  # fmt: skip
        earlier = getattr(self.records, "outcomes", None)
        if self.alt is not None and callable(earlier):
            self.seen |= self.alt.warm_start(self.context, earlier(self.context.mod))
        else:  # a resumed task's first draft starts from the store's best: measured already
            self.seen |= measured_keys(self.context, self._stored_best(database))
        self.seeded = self._seeds(design_spaces, database)  # after what ``seen`` knows
        # the seed a kernel without a record is built from: measured in the first round
        with self._clock("draft"):  # the analyzer's share goes to "analyzer", as elsewhere
            self.analyzer_seed = (self.seeded[int(np.argmax(self._analyze(self.seeded)))]
                                  if self.seeded else None)  # fmt: skip
        # The drafter never stops on its own: we count trials, it hands out drafts.
        if self.first_draft_generations != self.draft_generations:
            self.first_drafter = self._evolution(self.context, self.first_draft_generations)
        for drafter in (self.drafter, self.first_drafter):
            if drafter is not None:
                drafter.pre_tuning(1 << 30, self.draft_size, design_spaces, database, self.analyzer)

    def _stored_best(self, database) -> list[tuple[object, bool]]:
        """The measured programs a first draft starts from (``init_measured_ratio`` of its
        population), as ``(record, ran)``: what the verifier would rank first and pick again."""
        mod = self.context.mod
        if database is None or not database.has_workload(mod):
            return []
        k = math.ceil(self.population * self._measured_ratio())
        return [(r, True) for r in database.get_top_k(database.commit_workload(mod), k)]

    def _seeds(self, design_spaces, database) -> list:
        """Register-blocked seeds (``search/seeds.py``) for a task without records: one that
        has some (a resumed run, a warm start) is under way, and likely measured them."""
        if not self.seeds:
            return []
        mod = self.context.mod
        if database is not None and database.has_workload(mod) and \
                database.get_top_k(database.commit_workload(mod), 1):  # fmt: skip
            return []
        with self._clock("draft"):
            try:
                found = seed_candidates(mod, list(design_spaces), self.postprocs, self.platform)
            except Exception as e:  # TVM raises its own kinds
                # Seeds are a head start, not the search: a workload they cannot handle is
                # tuned without them rather than ending the run (and every other task's).
                name = getattr(self.context, "task_name", None) or "a task"
                warnings.warn(f"tensortune: {name}: no register-blocked seeds ({last_line(e)}); "
                              "tuning it without them", stacklevel=2)  # fmt: skip
                return []
        return [c for c in found if self._new(c)]

    def post_tuning(self) -> None:
        self.drafter.post_tuning()
        self._retire_first_drafter()
        if self.sampler is not None:
            self.sampler.close()
            self.sampler = None

    def _random_drafts(self) -> list:
        """Random programs of the design space, for rounds whose drafts ALT's filter
        rejected.  Seeded apart from the task: with its seed they would be the very programs
        the drafter's first population was sampled as."""
        if self.sampler is None:
            self.sampler = RandomSchedules(self.context.mod, self.platform,
                                           max(self.draft_size // 4, 1),
                                           seed=int(self.alt_rng.integers(1, 1 << 30)),
                                           threads=self.sampling_threads)  # fmt: skip
        return self.sampler.draw()

    def _retire_first_drafter(self) -> None:
        if self.first_drafter is not None:
            self.first_drafter.post_tuning()
            self.first_drafter = None

    def limit_round(self, count: int) -> None:
        """Pick at most ``count`` programs in the next round: ``Leased`` passes on what the
        shared budget allows, which would otherwise drop picks already taken from the cache
        (and with them ε's exploring share, always last)."""
        self.round_limit = count

    def generate_measure_candidates(self):
        n = min(self.n_round, self.max_trials - self.trials, self.round_limit)
        self.round_limit = 1 << 30
        if n <= 0:
            return None
        # A filter that drops most of a round's pool gets fresh drafts to choose from: a
        # short round would end the task's search before its budget (MetaSchedule stops a
        # task whose strategy hands out nothing).
        pool: list = []
        seeds: dict[int, object] = {}  # this round's seeds by id, each kept alive here
        for refill in range(REFILLS + 1):
            if refill or not self.cache or self.rounds % self.redraft_every == 0:
                with self._clock("draft"):
                    drafter = self.drafter if self.first_drafter is None else self.first_drafter
                    fresh = drafter.generate_measure_candidates() or []
                    self._retire_first_drafter()
                    if self.seeded:
                        seeds, self.seeded = {id(c): c for c in self.seeded}, []
                        self.cache = list(seeds.values()) + self.cache
                    kept = [c for c in self.cache if seeds.get(id(c)) is c]  # never pushed out
                    older = [c for c in self.cache if seeds.get(id(c)) is not c]
                    fresh = [c for c in fresh if self._new(c)]
                    if refill:
                        # What the filter allowed stays; the analyzer-steered drafter keeps
                        # drafting what it turned away, so random drafts come next.
                        drawn = [c for c in self._random_drafts() if self._new(c)]
                        rest = older + drawn + fresh
                    else:  # a redraft's programs go first
                        rest = fresh + older
                    self.cache = kept + rest[: self.draft_size]
            if not self.cache:  # the drafter had nothing new: random drafts next
                continue
            with self._clock("verify"):
                pool, by_analyzer, by_verifier = self._verify(self.cache)
                scores = self._rank(by_analyzer, by_verifier)
            allowed, uncertain = np.ones(len(pool), dtype=bool), None
            if self.alt is None:
                break
            with self._clock("alt"):
                allowed = self.alt.allowed(self.context, pool, self.alt_rng)
                if refill == 0:  # refills' pools hold what replaced the turned-away ones
                    self.alt.count_displaced(scores, allowed, n)
                # What it allowed stays for a refill to add to, its mutants too.  An idle
                # filter (allowing all) leaves the cache as plain draft-then-verify does.
                if not allowed.all():
                    self.cache = [pool[i] for i in np.flatnonzero(allowed)]
            if allowed.sum() >= n:
                break
        if not pool:  # the design space is spent
            return None
        if self.alt is not None:
            with self._clock("alt"):
                if not allowed.any():
                    allowed = self.alt.likeliest(self.context, pool, n)
                uncertain = self.alt.explore(self.context, pool, allowed, n, self.rounds)
        order = [i for i in np.argsort(-scores, kind="stable") if allowed[i]]
        if uncertain is not None:  # ALT's exploring round: the ensemble's picks
            greedy = uncertain
        else:
            greedy = self._cheap_first(pool, order)[: n - round(n * self.eps)]
        if seeds:  # measured in the first round, the best-ranked of them if they are many
            ranked = [i for i in order if seeds.get(id(pool[i])) is pool[i]]
            ranked.sort(key=lambda i: pool[i] is not self.analyzer_seed)  # stable: it goes first
            first = ranked[: max(n // 2, 1)]
            chosen_first = set(first)
            greedy = (first + [i for i in greedy if i not in chosen_first])[
                : max(len(greedy), len(first))
            ]  # ε's exploring picks keep their share
        taken = set(greedy)
        rest = [i for i in order if i not in taken]
        explore = list(self.rng.permutation(rest)[: n - len(greedy)]) if rest else []
        picked = [pool[i] for i in greedy + explore]
        if by_analyzer is not None:  # what the trust in each scorer is learned from
            self.picked_scores = [
                (float(by_analyzer[i]), None if by_verifier is None else float(by_verifier[i]))
                for i in greedy + explore
            ]
        chosen = {id(c) for c in picked}
        self.cache = [c for c in self.cache if id(c) not in chosen]
        self.rounds += 1
        return picked

    @contextlib.contextmanager
    def _clock(self, key: str):
        """Seconds spent inside go to ``timings[key]``, the analyzer's share of them to
        ``timings["analyzer"]``."""
        t0, a0 = time.perf_counter(), self.analyzer.predict_s
        yield
        spent = self.analyzer.predict_s - a0
        self.timings["analyzer"] += spent
        self.timings[key] += time.perf_counter() - t0 - spent

    def _cheap_first(self, pool: list, order: list) -> list:
        """The verifier's order, each rank stretched by the candidate's expected build cost."""
        if self.build_times is None or self.build_cost_weight <= 0 or not self.build_costs.seconds:
            return order
        ratios = self.build_costs.ratios([unroll_step(pool[i].sch.trace) for i in order])
        return cost_aware_order(order, ratios, self.build_cost_weight)

    def _new(self, cand) -> bool:
        key = structural_hash(cand.sch.mod)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True

    def _verify(self, cache: list) -> tuple[list, np.ndarray | None, np.ndarray | None]:
        """The cache plus one mutated generation of its best, with the analyzer's scores (None:
        not needed) and the verifier's (None: it tells nothing yet)."""
        keep = {id(c) for c in cache}
        self.analyzer_memo = {k: v for k, v in self.analyzer_memo.items() if k in keep}
        by_verifier = self._predict(cache)
        if by_verifier is not None and np.ptp(by_verifier) <= 0:
            by_verifier = None  # a cold online model predicts one constant
        by_analyzer = self._analyze(cache) if self.blend or by_verifier is None else None
        ranked = np.argsort(-self._rank(by_analyzer, by_verifier))
        best = [cache[i] for i in ranked[: self.verify_mutants]]
        mutants = [m for m in (self._mutate(c) for c in best) if m is not None and self._new(m)]
        if mutants:
            cache = cache + mutants
            if by_verifier is not None and self.verifier_screens:
                # Scored with the cache, in one call, the mutants are weighed against it by
                # the screen and only those in its shortlist are lowered; scored alone, all
                # of them were (benchmarks/RESULTS.md, stop 54).  Our adapter memoizes the
                # cache's features, so this costs one more pass of the models over them.
                by_verifier = self._predict(cache)
            else:
                more = None if by_verifier is None else self._predict(mutants)
                if by_verifier is not None and more is None:  # none of them scored: last
                    more = np.full(len(mutants), by_verifier.min() - 1.0)
                by_verifier = None if more is None else np.concatenate([by_verifier, more])
            if self.blend or by_verifier is None:
                by_analyzer = self._analyze(cache)  # the cache's are remembered
        return cache, by_analyzer, by_verifier

    def _analyze(self, cands: list) -> np.ndarray:
        """Analyzer scores, remembered while the programs stay in the cache."""
        out = np.empty(len(cands))
        todo = []
        for i, c in enumerate(cands):
            seen = self.analyzer_memo.get(id(c))
            if seen is not None and seen[0] is c:
                out[i] = seen[1]
            else:
                todo.append(i)
        if todo:
            out[todo] = self.analyzer.predict(self.context, [cands[i] for i in todo])
            for i in todo:
                self.analyzer_memo[id(cands[i])] = (cands[i], float(out[i]))
        return out

    def _predict(self, cands: list) -> np.ndarray | None:
        """The verifier's scores of ``cands``; None where they tell nothing: no verifier, or
        one still warming up.  A score that is not a finite number ranks its program last."""
        if self.verifier is None or _warming_up(self.warming or self.verifier):
            return None
        pred = np.asarray(self.verifier.predict(self.context, cands), np.float64)
        bad = ~np.isfinite(pred)
        if len(pred) != len(cands) or bad.all():
            return None
        # One program the model cannot score (a NaN) leaves the others' scores standing.
        return np.where(bad, pred[~bad].min() - 1.0, pred) if bad.any() else pred

    def _rank(self, by_analyzer: np.ndarray | None, by_verifier: np.ndarray | None) -> np.ndarray:
        """What the picks rank by: the blend, or the verifier's scores where it tells something
        and the analyzer's where not (a cold online model, or noise before its warm-up)."""
        if self.blend:
            return self.trust.blend(by_analyzer, by_verifier)
        return by_analyzer if by_verifier is None else by_verifier  # type: ignore[return-value]

    def _mutate(self, cand):
        """One random mutation of a candidate's trace, replayed and post-processed."""
        if not self.mutators:  # a space generator may define none
            return None
        mutator = self.mutators[int(self.rng.choice(len(self.mutators), p=self.mutator_p))]
        trace = mutate(mutator, cand.sch.trace, int(self.rng.integers(1, 1 << 30)))
        if trace is None:
            return None
        return replayed(self.context.mod, trace, self.postprocs,
                        seed=int(self.rng.integers(1, 1 << 30)))  # fmt: skip

    def notify_runner_results(self, measure_candidates, results) -> None:
        self.trials += len(results)
        if len(self.picked_scores) == len(results):  # the scores of these very picks
            for (a, v), res in zip(self.picked_scores, results, strict=True):
                self.trust.observe(a, v, run_seconds(res.run_secs))
        self.picked_scores = []
        if self.build_times is not None:
            for cand in measure_candidates:
                seconds = self.build_times.pop(structural_hash(cand.sch.mod), None)
                if seconds is not None:
                    self.build_costs.observe(unroll_step(cand.sch.trace), seconds)
        if self.alt is not None:
            with self._clock("alt"):
                self.alt.observe(self.context, measure_candidates, results)
        self.drafter.notify_runner_results(measure_candidates, results)


def _warming_up(model: object) -> bool:
    """Whether ``model`` is MetaSchedule's XGBoost model before its warm-up: until it has
    ``num_warmup_samples`` measurements (100), it predicts uniform random numbers, which would
    pass for a ranking (a cold model of ours predicts one constant, which ``_verify`` sees)."""
    warmup = getattr(model, "num_warmup_samples", None)
    size = getattr(model, "data_size", None)
    if not isinstance(warmup, int) or not isinstance(size, int):
        return False
    return size < warmup or getattr(model, "booster", None) is None
