"""``tensortune bench tune``: search methods compared on the same tasks, trial budget, builder
and runner, so that only the search differs.

Methods:

- ``default``: MetaSchedule's own search as ``tune_tasks`` runs it (evolutionary + ``XGBModel``);
- ``draft``: draft-then-verify with a verifier learned online from scratch;
- ``pretrained``: draft-then-verify, verifier pre-trained on this hardware, adapted online as
  MoA adapts (a neural model; other kinds are refined after every round);
- ``moa``: draft-then-verify, a neural verifier pre-trained on *other* hardware, adapted online
  with momentum (MoA).

Each method tunes into a store of its own.  The curve is the network latency estimate
(Σ task weight x best latency) after every measured batch, against wall time and trials; the
search-time speedup of a method is the default's total time over the time the method needed
to reach the default's final latency (algorithms.md §1.6).  Finished methods are kept in
``results.json`` in the work directory: a rerun skips them unless it asks for other
draft-then-verify options or they were saved by another version of this benchmark (an
interrupted method restarts).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tensortune.errors import TensortuneError
from tensortune.hardware import parse_target
from tensortune.workloads.task import Task

METHODS = ("default", "draft", "pretrained", "moa")
# Saved runs of another version are measured again: 2 starts each clock after the one-off
# process costs and drafts a task's first candidates without evolution; 3 adapts the
# pre-trained verifier as MoA does.
RESULTS_VERSION = 3


@dataclass
class MethodRun:
    method: str
    wall_s: float = 0.0
    trials: int = 0
    final_latency: float | None = None
    # (seconds since start, trials so far, network latency estimate or None while a task has
    # no valid measurement yet)
    curve: list[tuple[float, int, float | None]] = field(default_factory=list)
    breakdown: dict[str, float] = field(default_factory=dict)  # seconds per activity
    draft_options: dict[str, float] | None = None  # draft-then-verify's; None: the default run
    verifier: str | None = None  # the model file given for pretrained/moa; None: the shipped one

    def time_to_reach(self, latency: float) -> float | None:
        return self._first(latency, 0)

    def trials_to_reach(self, latency: float) -> int | None:
        return self._first(latency, 1)

    def _first(self, latency: float, which: int):
        """Time (0) or trials (1) of the first curve point at or below ``latency``."""
        for point in self.curve:
            if point[2] is not None and point[2] <= latency * (1 + 1e-9):
                return point[which]
        return None


@dataclass
class BenchResult:
    tasks: list[str]
    trials: int
    target: dict
    runs: dict[str, MethodRun] = field(default_factory=dict)
    seed: int = 0

    @property
    def speedup(self) -> dict[str, float | None]:
        """Search-time speedup over the default: its total time over the time each method
        took to reach the default's final latency (None: never reached it)."""
        return self._over_default(lambda base: base.wall_s, MethodRun.time_to_reach)

    @property
    def trial_ratio(self) -> dict[str, float | None]:
        """The default's trials over the trials each method needed to reach its latency."""
        return self._over_default(lambda base: base.trials, MethodRun.trials_to_reach)

    def _over_default(self, total, reach) -> dict[str, float | None]:
        base = self.runs.get("default")
        if base is None or base.final_latency is None:
            return {}
        out: dict[str, float | None] = {}
        for name, run in self.runs.items():
            needed = reach(run, base.final_latency)
            out[name] = total(base) / needed if needed else None
        return out

    def to_dict(self) -> dict:
        return {
            "version": RESULTS_VERSION, "tasks": self.tasks, "trials": self.trials,
            "target": self.target, "seed": self.seed,
            "methods": {k: asdict(v) for k, v in self.runs.items()},
            "final_latency": {k: v.final_latency for k, v in self.runs.items()},
            "speedup": self.speedup, "trial_ratio": self.trial_ratio,
        }  # fmt: skip


def bench_tune(
    workloads: Sequence[str | Task] | None = None,
    *,
    model: object | None = None,
    workloads_from: str | os.PathLike | None = None,
    trials: int,
    work_dir: str | os.PathLike,
    target: dict | str | None = None,
    methods: Sequence[str] = METHODS,
    pretrained: str | None = None,
    moa_source: str | None = None,
    max_tasks: int | None = None,
    seed: int = 0,
    draft_options: Mapping[str, object] | None = None,
    progress: Callable[[str, MethodRun], None] | None = None,
) -> BenchResult:
    """Run each method on the same tasks with the same budget; see the module docstring.

    ``pretrained``: the verifier of ``pretrained`` (default: the model shipped for the target);
    ``moa_source``: the neural model MoA adapts (default: the shipped one trained on the most
    configurations other than the target's); a saved run of either with another model file is
    run again.
    ``max_tasks`` keeps the heaviest tasks (by FLOPs x weight).
    ``draft_options``: ``DraftThenVerify`` arguments for the draft-then-verify methods (e.g.
    ``{"build_cost_weight": 1}``); a requested method saved with other options is run again
    (the saved runs of methods not requested are kept).
    """
    from tensortune.costmodel.base import load_model
    from tensortune.tuning.tune import resolve_tasks

    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise TensortuneError(f"unknown method(s) {unknown}; known: {', '.join(METHODS)}")
    if trials <= 0:
        raise TensortuneError("trials must be positive")
    from tensortune.search.draft_verify import check_options

    options = check_options(draft_options or {})
    tgt = parse_target(target)
    given = {"pretrained": pretrained, "moa": moa_source}
    files = {name: given[name] or _shipped(tgt, other=name == "moa")
             for name in sorted(set(given) & set(methods))}  # fmt: skip
    for path in files.values():  # a broken file fails now, not after the default's minutes
        load_model(path)
    tasks = resolve_tasks(workloads, model=model, workloads_from=workloads_from, target=tgt)
    tasks = [t for t in tasks if t.flop > 0] or tasks  # zero-FLOP tasks move data only
    if max_tasks:
        tasks = sorted(tasks, key=lambda t: -t.flop * t.weight)[:max_tasks]
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    saved = work / "results.json"
    result = BenchResult([t.name for t in tasks], trials, tgt, seed=seed)
    if saved.is_file():
        old = json.loads(saved.read_text())
        same = (old.get("version"), old.get("tasks"), old.get("trials"), old.get("target"),
                old.get("seed", 0))  # fmt: skip
        known = set(MethodRun.__dataclass_fields__)  # a file from another version may hold more
        if same == (RESULTS_VERSION, result.tasks, trials, tgt, seed):
            for name, run in old.get("methods", {}).items():
                run["curve"] = [tuple(p) for p in run["curve"]]
                run.setdefault("draft_options", None if name == "default" else {})
                result.runs[name] = MethodRun(**{k: v for k, v in run.items() if k in known})
    for name in methods:
        done = result.runs.get(name)
        if done is not None and (
            name == "default"
            or (done.draft_options == options and done.verifier == given.get(name))
        ):
            continue
        run = _run_method(name, tasks, trials, work, tgt, files.get(name), seed, options,
                          progress)  # fmt: skip
        run.verifier = given.get(name)
        result.runs[name] = run
        saved.write_text(json.dumps(result.to_dict(), indent=1))
    return result


def summarize_seeds(results: Sequence[BenchResult]) -> dict:
    """Per method, the speedup and trial ratio of every seed and their medians.

    A seed where the method never reached the default's final latency is ``None`` in the
    per-seed list and counts as 0 in the median (slower than any speedup); a median of 0 is
    reported as ``None``: most seeds never got there."""
    import statistics

    out: dict[str, dict] = {}
    for key in ("speedup", "trial_ratio"):
        per_method: dict[str, list[float | None]] = {}
        for r in results:
            for method, value in getattr(r, key).items():
                per_method.setdefault(method, []).append(value)
        out[key] = {m: {"seeds": v, "median": statistics.median(x or 0.0 for x in v) or None}
                    for m, v in per_method.items()}  # fmt: skip
    out["final_latency"] = {
        m: [r.runs[m].final_latency for r in results if m in r.runs]
        for m in dict.fromkeys(m for r in results for m in r.runs)
    }
    out["seeds"] = [r.seed for r in results]
    return out


def _run_method(name: str, tasks: list[Task], trials: int, work: Path, target: dict,
                verifier: str | None, seed: int, options: dict[str, float],
                progress) -> MethodRun:  # fmt: skip
    from tensortune.compat import load_tensor_intrinsics
    from tensortune.costmodel.gbdt import XGBoostModel
    from tensortune.hardware import runtime_threads
    from tensortune.measure.builder import PersistentBuilder
    from tensortune.measure.runner import PersistentRunner
    from tensortune.search.draft_verify import DraftThenVerify
    from tensortune.tuning.timed import TimedCostModel
    from tensortune.tuning.tune import _cost_model, tune

    method_dir = work / name
    shutil.rmtree(method_dir, ignore_errors=True)  # a half-done method starts over
    method_dir.mkdir(parents=True)
    timings: dict[str, float] = {}
    if name == "default":
        strategy: object = "evolutionary"
        model = _cost_model("xgb", target, False)
    else:
        strategy = DraftThenVerify(timings=timings, **options)  # tune() hands it build times
        if name == "draft":
            model = _cost_model(XGBoostModel(), target, True)
        elif name == "pretrained":
            model = _pretrained_verifier(verifier, target)
        else:
            model = _cost_model(verifier, target, "moa")
    timed = TimedCostModel(model)
    builder = PersistentBuilder(log_path=str(method_dir / "builder-workers.log"))
    runner = PersistentRunner(num_threads=runtime_threads(target),
                              log_path=str(method_dir / "runner-worker.log"))  # fmt: skip
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
            progress(name, run)

    try:
        # One-off process costs (workers importing TVM, the tensor intrinsics' import) are paid
        # before the clock starts: whichever method runs first in a process would pay them alone.
        load_tensor_intrinsics()
        builder.wait_ready()
        runner.wait_ready()
        start = time.perf_counter()
        tune(tasks, trials=trials * len(tasks), max_trials_per_task=trials,
             records=f"sqlite:///{method_dir / 'records.db'}", work_dir=method_dir,
             target=target, strategy=strategy, cost_model=timed, builder=builder,
             runner=runner, check_correctness=False, seed=seed, progress=on_batch)  # fmt: skip
    finally:
        builder.close()
        runner.close()
    run.wall_s = time.perf_counter() - start
    finals = [lat for _, _, lat in run.curve if lat is not None]
    run.final_latency = finals[-1] if finals else None
    run.breakdown = {"build": builder.seconds, "run": runner.seconds,
                     "model_predict": timed.predict_s, "model_update": timed.update_s,
                     **timings}  # fmt: skip
    known = sum(v for k, v in run.breakdown.items() if k != "verify")
    run.breakdown["other_search"] = max(run.wall_s - known, 0.0)
    return run


def _pretrained_verifier(path: str, target: dict) -> object:
    """The pre-trained verifier, adapted online with MoA's periodic retrain from a momentum
    copy when it is a neural model: refining it after every round, on a few dozen
    measurements, reached the default's latency later (benchmarks/RESULTS.md, ninth session)."""
    from tensortune.costmodel.base import load_model
    from tensortune.costmodel.nn import _RankModel
    from tensortune.tuning.tune import _cost_model

    model = load_model(path)
    return _cost_model(model, target, "moa" if isinstance(model, _RankModel) else True)


def _shipped(target: dict, *, other: bool = False) -> str:
    """The model shipped for ``target``, or (``other``) the one MoA starts from."""
    from tensortune.costmodel.shipped import shipped_model, shipped_source

    return shipped_source(target) if other else shipped_model(target)


def format_latency(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    return f"{seconds * 1e3:.3f} ms"


def plot_curves(result: BenchResult, out: str | Path) -> None:
    """Best network latency of each method against wall time and against trials."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_time, by_trials) = plt.subplots(1, 2, figsize=(10, 4.2))
    for name, run in result.runs.items():
        points = [(t, n, lat * 1e3) for t, n, lat in run.curve if lat is not None]
        if not points:
            continue
        by_time.step([p[0] for p in points], [p[2] for p in points], where="post", label=name)
        by_trials.step([p[1] for p in points], [p[2] for p in points], where="post", label=name)
    base = result.runs.get("default")
    for ax, xlabel in ((by_time, "search time (s)"), (by_trials, "trials measured")):
        if base is not None and base.final_latency:
            ax.axhline(base.final_latency * 1e3, color="grey", lw=0.8, ls="--")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("estimated latency (ms): Σ weight × best")
        ax.set_yscale("log")
        ax.legend()
    fig.suptitle(f"{len(result.tasks)} task(s), {result.trials} trials each")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
