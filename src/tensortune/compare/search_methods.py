"""``tensortune bench tune``: search methods compared on the same tasks, trial budget per task,
builder and runner, so that only the search differs.

Methods:

- ``default``: MetaSchedule's own search as ``tune_tasks`` runs it (evolutionary + ``XGBModel``);
- ``draft``: draft-then-verify with a verifier learned online from scratch;
- ``pretrained``: draft-then-verify, verifier pre-trained on this hardware, adapted online as
  MoA adapts (a neural model; other kinds are refined after every round);
- ``moa``: draft-then-verify, a neural verifier pre-trained on *other* hardware, adapted online
  with momentum (MoA), trusted only once it ranks new measurements better than before
  (``costmodel/moa.py``'s gate);
- ``frozen`` and ``moa-ungated`` (not run unless asked): the baselines of MoA's gate, the
  ``--pretrained`` verifier never updated, and MoA's source adapted and always trusted;
- ``alt`` (not run unless asked): ``pretrained`` with ALT's validity filter and
  uncertainty/score ping-pong (``search/alt.py``); its run keeps what the filter did;
  ``alt-adaptive``: the same, exploring only after a round that did not improve the task.

Each method tunes into a store of its own; each seed runs them in another order, every two
seeds every pair of methods in both orders (``run_order``).  The curve is the network
latency estimate (Σ task weight x best latency) after every measured batch, against wall
time and trials; the
search-time speedup of a method is the default's total time over the time the method needed
to reach the default's final latency (algorithms.md §1.6).  After the methods ran, every
program a curve reads is timed again side by side and the speedups are given on that one
clock too (``compare.retime``): a timing can move between two runs by more than the methods
differ.  Finished methods are kept in
``results.json`` in the work directory: a rerun skips them unless it asks for other
draft-then-verify options or verifier, or they were saved with other tasks, budget, target,
seed or fast-math setting or by another version of this benchmark; the runs it measures again
(an interrupted method restarts) are first moved, with a copy of the file, into a new
``replaced-N`` directory.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tensortune.errors import TensortuneError, about, check_count, check_flags, last_line
from tensortune.files import move_aside, write_atomically
from tensortune.hardware import Platform, resolve_platform
from tensortune.workloads.resolve import resolve_tasks
from tensortune.workloads.task import Task

METHODS = ("default", "draft", "pretrained", "moa", "alt", "frozen", "moa-ungated",
           "alt-adaptive")  # fmt: skip
DEFAULT_METHODS = METHODS[:4]
# ALT's methods: the validity filter on, and which ping-pong (``search/alt.py``).
ALT_PINGPONG = {"alt": 1, "alt-adaptive": 2}
# The model file each method's verifier comes from: --pretrained's or --moa-source's.
_FROM_SOURCE = ("moa", "moa-ungated")
# Saved runs of another version are measured again: 2 starts each clock after the one-off
# process costs and drafts a task's first candidates without evolution; 3 adapts the
# pre-trained verifier as MoA does; 4 gates MoA; 5 measures register-blocked seeds first; 6
# seeds TVM apart (``search.space.tvm_seed``: seeds 0 and 1 drew alike) and relabels online
# measurements by each task's best.
RESULTS_VERSION = 6


@dataclass
class MethodRun:
    method: str
    wall_s: float = 0.0
    trials: int = 0  # measured, over all tasks
    final_latency: float | None = None
    # (seconds since start, trials so far, network latency estimate or None while a task has
    # no valid measurement yet)
    curve: list[tuple[float, int, float | None]] = field(default_factory=list)
    breakdown: dict[str, float] = field(default_factory=dict)  # seconds per activity
    draft_options: dict[str, float] | None = None  # draft-then-verify's; None: the default run
    verifier: str | None = None  # the model file given for pretrained/moa; None: the shipped one
    alt_stats: dict[str, int] = field(default_factory=dict)  # the alt method's filter counts
    # The curve with the seed's record-breakers timed again side by side (``compare.retime``);
    # empty until they are.
    retimed: list[tuple[float, int, float | None]] = field(default_factory=list)

    def final(self, retimed: bool = False) -> float | None:
        """The last latency of the curve as measured in the run, or as re-timed."""
        if not retimed:
            return self.final_latency
        return next((p[2] for p in reversed(self.retimed) if p[2] is not None), None)

    def time_to_reach(self, latency: float, retimed: bool = False) -> float | None:
        return self._first(latency, 0, retimed)

    def trials_to_reach(self, latency: float, retimed: bool = False) -> int | None:
        return self._first(latency, 1, retimed)

    def _first(self, latency: float, which: int, retimed: bool):
        """Time (0) or trials (1) of the first curve point at or below ``latency``."""
        for point in self.retimed if retimed else self.curve:
            if point[2] is not None and point[2] <= latency * (1 + 1e-9):
                return point[which]
        return None


@dataclass
class BenchResult:
    """One seed of ``bench_tune``: each method's run (``runs``: its curve, time and final
    latency) on the same tasks and budget, and their speedups over MetaSchedule's default, as
    measured and re-timed on one clock."""

    tasks: list[str]
    trials_per_task: int
    target: dict
    runs: dict[str, MethodRun] = field(default_factory=dict)
    seed: int = 0
    # Whether the tasks' float32 exp/tanh/erf were approximated (``resolve_tasks``): it keeps
    # their names, so a saved run is reused only with the same setting.
    fast_math: bool = True

    @property
    def speedup(self) -> dict[str, float | None]:
        """Search-time speedup over the default: its total time over the time each method
        took to reach the default's final latency (None: never reached it)."""
        return self.speedup_within(0.0)

    def speedup_within(self, tolerance: float, retimed: bool = False) -> dict[str, float | None]:
        """The speedup to come within ``tolerance`` (0.01: 1%) of the default's final
        latency: a run that ends 0.1% above it never "reaches" it, yet got as far.  Over the
        default's own time to come as close (the default scores 1): an easier goal is easier
        for it too, and over its whole run it credited itself 1.07x within 1% (stop 75).  At 0,
        over its whole run (``speedup``): its final latency is known when its run ends.  With
        ``retimed``, on the curves re-timed side by side (empty if they were not)."""

        def total(base: MethodRun, goal: float) -> float | None:
            return base.wall_s if tolerance == 0 else base.time_to_reach(goal, retimed)

        return self._over_default(total, MethodRun.time_to_reach, tolerance, retimed)

    @property
    def trial_ratio(self) -> dict[str, float | None]:
        """The default's trials over the trials each method needed to reach its latency."""
        return self.trials_over_default()

    def trials_over_default(self, retimed: bool = False) -> dict[str, float | None]:
        """``trial_ratio``, or with ``retimed`` the same on the re-timed curves: counted in
        trials, on one clock, what is left of a comparison is the search's."""
        return self._over_default(lambda base, _: base.trials, MethodRun.trials_to_reach, 0.0,
                                  retimed)  # fmt: skip

    @property
    def retimed(self) -> bool:
        """Whether every run's curve was re-timed with the others (``compare.retime``)."""
        return bool(self.runs) and all(r.retimed for r in self.runs.values())

    def _over_default(self, total, reach, tolerance: float = 0.0,
                      retimed: bool = False) -> dict[str, float | None]:  # fmt: skip
        base = self.runs.get("default")
        if base is None or base.final(retimed) is None or (retimed and not self.retimed):
            return {}
        goal = base.final(retimed) * (1 + tolerance)  # type: ignore[operator]
        out: dict[str, float | None] = {}
        for name, run in self.runs.items():
            needed, default = reach(run, goal, retimed), total(base, goal)
            out[name] = default / needed if needed and default else None
        return out

    def to_dict(self) -> dict:
        out = {
            "version": RESULTS_VERSION, "tasks": self.tasks,
            "trials_per_task": self.trials_per_task, "target": self.target, "seed": self.seed,
            "fast_math": self.fast_math,
            "methods": {k: asdict(v) for k, v in self.runs.items()},
            "final_latency": {k: v.final_latency for k, v in self.runs.items()},
            "speedup": self.speedup, "trial_ratio": self.trial_ratio,
        }  # fmt: skip
        if self.retimed:
            out["retimed"] = {"final_latency": {k: v.final(True) for k, v in self.runs.items()},
                              "speedup": self.speedup_within(0.0, retimed=True),
                              "trial_ratio": self.trials_over_default(retimed=True)}  # fmt: skip
        return out


def bench_tune(
    workloads: Sequence[str | Task] | None = None,
    *,
    model: object | None = None,
    workloads_from: str | os.PathLike | None = None,
    trials_per_task: int,
    work_dir: str | os.PathLike,
    target: dict | str | Platform | None = None,
    methods: Sequence[str] = DEFAULT_METHODS,
    pretrained: str | None = None,
    moa_source: str | None = None,
    max_tasks: int | None = None,
    seed: int = 0,
    draft_options: Mapping[str, object] | None = None,
    fast_math: bool = True,
    retime: int = 5,
    progress: Callable[[str, MethodRun, int], None] | None = None,
) -> BenchResult:
    """Run each method on the same tasks with the same budget per task; see the module
    docstring.

    ``pretrained``: the verifier of ``pretrained``, ``alt``, ``alt-adaptive`` and ``frozen``
    (default: the model shipped for the target);
    ``moa_source``: the neural model MoA adapts (default: the shipped one trained on the most
    configurations other than the target's); a saved run of either with another model file is
    run again.
    ``max_tasks`` keeps the heaviest tasks (by FLOPs x weight).
    ``draft_options``: ``DraftThenVerify`` arguments for the draft-then-verify methods (e.g.
    ``{"build_cost_weight": 1}``); a requested method saved with other options is run again
    (the saved runs of methods not requested are kept).
    ``fast_math``: approximate float32 ``exp``/``tanh``/``erf`` (see ``resolve_tasks``).
    ``retime``: after the methods ran, time every method's record-breakers again in this many
    rounds, side by side, and keep each curve so re-timed (``compare.retime``); 0: not.
    ``progress(method, run, trials)`` hears each measured batch: the run so far and the trials
    it will measure in all.
    """
    from tensortune.costmodel.registry import load_cost_model
    from tensortune.search.draft_verify import check_options

    methods = [methods] if isinstance(methods, str) else list(methods)  # not its letters
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        raise TensortuneError(f"unknown method(s) {unknown or '(none)'}; known: "
                              f"{', '.join(METHODS)}", param="methods")  # fmt: skip
    for name, value in (("trials_per_task", trials_per_task), ("max_tasks", max_tasks)):
        if value is not None:
            check_count(value, name)
    if type(retime) is not int or retime < 0:
        raise TensortuneError(f"must be a whole number of rounds, 0 or more, not {retime!r}",
                              param="retime")  # fmt: skip
    check_flags(fast_math=fast_math)
    options = check_options(draft_options or {})
    with about("target"):
        platform = resolve_platform(target)
    given = {name: moa_source if name in _FROM_SOURCE else pretrained
             for name in METHODS if name not in ("default", "draft")}  # fmt: skip
    files = {name: given[name] or _shipped(platform, other=name in _FROM_SOURCE)
             for name in sorted(set(given) & set(methods))}  # fmt: skip
    for name, path in files.items():  # a broken file fails now, not after the default's minutes
        with about("moa_source" if name in _FROM_SOURCE else "pretrained"):
            load_cost_model(path)
    tasks = resolve_tasks(workloads, model=model, workloads_from=workloads_from,
                          platform=platform, fast_math=fast_math)  # fmt: skip
    tasks = [t for t in tasks if t.flop > 0] or tasks  # zero-FLOP tasks move data only
    if max_tasks:
        tasks = sorted(tasks, key=lambda t: -t.flop * t.weight)[:max_tasks]
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    saved = work / "results.json"
    result = BenchResult([t.name for t in tasks], trials_per_task, platform.target, seed=seed,
                         fast_math=fast_math)  # fmt: skip
    listed: list[str] = []
    if saved.is_file():
        old = _read_results(saved)
        listed = list(old["methods"])
        result.runs = _saved_runs(old, result)
    # What this call measures again is moved aside first, with the file that lists it: saved
    # runs of another configuration (all of them) or with other options, and the directories
    # of runs that did not finish.  A rerun deletes nothing.
    stale = [name for name in listed if name not in result.runs] + [
        name for name, done in result.runs.items()
        if name in methods and not _reusable(name, done, options, given.get(name))
    ]  # fmt: skip
    for name in stale:
        result.runs.pop(name, None)
    unfinished = [m for m in methods if m not in result.runs and m not in stale
                  and (work / m).exists()]  # fmt: skip
    if stale or unfinished:
        said = [f"the saved run(s) of {', '.join(stale)} do not match this call's"] * bool(stale)
        said += [f"{', '.join(unfinished)} did not finish"] * bool(unfinished)
        # (a name a hand-edited file gave is no directory of ours)
        move_aside(work, [saved, *(work / m for m in [*stale, *unfinished] if m in METHODS)],
                   "; ".join(said))  # fmt: skip
        write_atomically(saved, json.dumps(result.to_dict(), indent=1))  # lists what is here
    ran = False
    for name in run_order(methods, seed):
        done = result.runs.get(name)
        if done is not None:
            continue
        run = _run_method(name, tasks, trials_per_task, work, platform, files.get(name), seed,
                          options, progress)  # fmt: skip
        run.verifier = given.get(name)
        result.runs[name] = run
        ran = True
        write_atomically(saved, json.dumps(result.to_dict(), indent=1))
    if ran:  # re-timed with runs that are gone: not on this clock
        for run in result.runs.values():
            run.retimed = []
    if retime and (ran or not result.retimed):
        _retime(result, tasks, work, platform, retime)
    write_atomically(saved, json.dumps(result.to_dict(), indent=1))
    result.runs = {**{m: result.runs[m] for m in methods if m in result.runs}, **result.runs}
    return result


def run_order(methods: Sequence[str], seed: int) -> list[str]:
    """The order in which seed ``seed`` runs ``methods``: an even seed rotates them by half the
    seed, the odd seed after it runs that order backwards.

    Methods run one after another in one process, and later ones ran slower: in stop 45's
    eight seeds the third draft-then-verify method spent longer in its draft step than the
    first in 7 of 8, by up to 18%, for as many trials (``benchmarks/RESULTS.md``, stop 46);
    in stop 69, whichever of two methods ran second reached a latency with the same programs
    later in 9 of 11 pairs, by up to 13%.
    So every two seeds run every pair of methods in both orders (a rotation alone left the
    second and third of three methods in one order in seeds 0 and 1), and six seeds run
    three methods in all six orders."""
    if not methods:
        return []
    k = (seed // 2) % len(methods)
    order = [*methods[k:], *methods[:k]]
    return order[::-1] if seed % 2 else order


def _reusable(name: str, done: MethodRun, options: dict[str, float],
              verifier: str | None) -> bool:  # fmt: skip
    """Whether a saved run stands for this call's run of method ``name``."""
    return name == "default" or (done.draft_options == options and done.verifier == verifier)


def _read_results(path: Path) -> dict:
    """A saved ``results.json``; a file that is not one is refused, not written over."""
    try:
        old = json.loads(path.read_text())
        if not isinstance(old, dict) or not isinstance(old.get("methods"), dict):
            raise ValueError("not the object bench tune writes")
        return old
    except (OSError, ValueError, RecursionError) as e:
        raise TensortuneError(f"{path} is not a bench tune results file ({last_line(e)}): "
                              "move it away or give another directory",
                              param="work_dir") from None  # fmt: skip


def _saved_runs(old: dict, result: BenchResult) -> dict[str, MethodRun]:
    """The runs of a saved ``results.json`` made with the same version, tasks, budget, target,
    seed and fast-math setting (none otherwise)."""
    per_task = old.get("trials_per_task", old.get("trials"))  # "trials" before the rename
    same = (old.get("version"), old.get("tasks"), per_task, old.get("target"),
            old.get("seed", 0), old.get("fast_math"))  # fmt: skip
    if same != (RESULTS_VERSION, result.tasks, result.trials_per_task, result.target,
                result.seed, result.fast_math):  # fmt: skip
        return {}
    known = set(MethodRun.__dataclass_fields__)  # a file from another version may hold more
    runs = {}
    try:
        for name, run in old["methods"].items():
            run["curve"] = [tuple(p) for p in run["curve"]]
            run["retimed"] = [tuple(p) for p in run.get("retimed", [])]
            run.setdefault("draft_options", None if name == "default" else {})
            runs[name] = MethodRun(**{k: v for k, v in run.items() if k in known})
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise TensortuneError(f"a run saved in results.json is damaged ({type(e).__name__}: "
                              f"{e}): move the file away or give another directory",
                              param="work_dir") from None  # fmt: skip
    return runs


def _method(name: str, platform: Platform, verifier: str | None, options: dict[str, float],
            timings: dict[str, float]) -> tuple[object, object]:  # fmt: skip
    """The strategy and cost model a method searches with."""
    from tensortune.costmodel.factory import cost_model_from
    from tensortune.costmodel.gbdt import XGBoostModel
    from tensortune.costmodel.moa import MomentumAdapted
    from tensortune.search.draft_verify import DraftThenVerify
    from tensortune.search.factory import strategy_from

    if name == "default":
        return strategy_from("evolutionary"), cost_model_from("xgb", platform)
    if name in ALT_PINGPONG:
        options = {**options, "validity": 1, "pingpong": ALT_PINGPONG[name]}
    strategy = DraftThenVerify(timings=timings, **options)  # tune() hands it build times
    if name == "draft":
        return strategy, cost_model_from(XGBoostModel(), platform, online=True)
    if name == "frozen":
        return strategy, cost_model_from(verifier, platform, online=False)
    if name == "moa-ungated":
        return strategy, cost_model_from(MomentumAdapted(verifier, gate=False), platform,
                                         online=True)  # fmt: skip
    # pretrained: adapted as MoA adapts when it is a neural model ("auto": refining it after
    # every round fell behind, benchmarks/RESULTS.md, ninth session); moa: MoA, always.
    return strategy, cost_model_from(verifier, platform, online="moa" if name == "moa"
                                     else "auto")  # fmt: skip


def _run_method(name: str, tasks: list[Task], trials_per_task: int, work: Path,
                platform: Platform, verifier: str | None, seed: int, options: dict[str, float],
                progress) -> MethodRun:  # fmt: skip
    from tensortune.compat import load_tensor_intrinsics
    from tensortune.costmodel.timed import TimedCostModel
    from tensortune.measure.session import MeasureSession
    from tensortune.tuning.tune import tune

    method_dir = work / name
    method_dir.mkdir(parents=True)  # a half-done method's was moved aside (``move_aside``)
    timings: dict[str, float] = {}
    strategy, model = _method(name, platform, verifier, options, timings)
    timed = TimedCostModel(model)
    session = MeasureSession(platform, log_dir=method_dir)
    run = MethodRun(name, draft_options=None if name == "default" else options)
    best: dict[str, float] = {}
    weights = {t.name: t.weight for t in tasks}
    start = 0.0

    def on_batch(i, task, batch, task_result) -> None:
        if task_result.best_seconds:
            best[task.name] = task_result.best_seconds
        run.trials += len(batch)
        latency = (sum(weights[n] * best[n] for n in weights) if len(best) == len(weights)
                   else None)  # fmt: skip
        run.curve.append((time.perf_counter() - start, run.trials, latency))
        if progress is not None:
            progress(name, run, trials_per_task * len(tasks))

    with session:
        # One-off process costs (workers importing TVM, the tensor intrinsics' import) are paid
        # before the clock starts: whichever method runs first in a process would pay them alone.
        load_tensor_intrinsics()
        session.wait_ready()
        start = time.perf_counter()
        tune(tasks, trials=trials_per_task * len(tasks), max_trials_per_task=trials_per_task,
             records=f"sqlite:///{method_dir / 'records.db'}", work_dir=method_dir,
             target=platform, strategy=strategy, cost_model=timed, builder=session.builder,
             runner=session.runner, check_correctness=False, seed=seed,
             progress=on_batch)  # fmt: skip
    run.wall_s = time.perf_counter() - start
    finals = [lat for _, _, lat in run.curve if lat is not None]
    run.final_latency = finals[-1] if finals else None
    run.breakdown = {"build": session.builder.seconds, "run": session.runner.seconds,
                     "model_predict": timed.predict_s, "model_update": timed.update_s,
                     **timings}  # fmt: skip
    known = sum(v for k, v in run.breakdown.items() if k != "verify")
    run.breakdown["other_search"] = max(run.wall_s - known, 0.0)
    if name in ALT_PINGPONG:
        run.alt_stats = dict(strategy.alt_stats)
    return run


def _retime(result: BenchResult, tasks: list[Task], work: Path, platform: Platform,
            rounds: int) -> None:  # fmt: skip
    """Every run's curve re-timed on one clock (``compare.retime``), but a run whose store
    (in its method's directory) is gone or holds other measurements than the run counted, or
    whose final best program of a task does not replay, build or run now (its curve would end
    on a slower one, the default's making every goal easier): that one is named in a
    warning, and the seed has no re-timed verdict."""
    from tensortune.compare.retime import records_in, retime_methods, retimed_curve

    for run in result.runs.values():  # a curve of an earlier session is on another clock
        run.retimed = []
    stores = {}
    for name, run in result.runs.items():
        path = work / name / "records.db"
        try:
            held = records_in(path) if path.is_file() else None
        except TensortuneError:  # damaged
            held = None
        if held == run.trials:
            stores[name] = path
        else:
            warnings.warn(f"tensortune: {path} does not hold the {run.trials} measurements "
                          f"of {name}'s saved run: its curve is not re-timed",
                          stacklevel=3)  # fmt: skip
    timed = retime_methods(stores, tasks, platform, rounds, log_dir=work / "retime")
    weights = {t.name: t.weight for t in tasks}
    for name, rows in timed.items():
        last = {task: seconds for _, task, seconds in rows}  # rows run in measured order
        lost = sorted(task for task, seconds in last.items() if seconds is None)
        if lost:
            warnings.warn(f"tensortune: {name}'s best program of {lost[0]} no longer builds or "
                          "runs: its curve is not re-timed", stacklevel=3)  # fmt: skip
            continue
        run = result.runs[name]
        run.retimed = retimed_curve(run.curve, rows, weights)


def _shipped(platform: Platform, *, other: bool = False) -> str:
    """The model shipped for the platform, or (``other``) the one MoA starts from."""
    from tensortune.costmodel.shipped import shipped_model, shipped_source

    return shipped_source(platform) if other else shipped_model(platform)
