"""A user's view: wall time of ``tensortune.tune`` against stock MetaSchedule (``ms.tune_tir``
with its own builder and runner) to reach the same latency on one task.

Configurations, each from a cold start in a process and work directory of its own, on the same
task, target and trial budget:
  stock          ms.tune_tir defaults: LocalBuilder, LocalRunner, XGBModel, evolutionary search,
                 64 candidates per round.  Capped at --stock-cap seconds: on a machine with torch
                 installed its builder workers re-import the GPU tensor intrinsics for every batch
                 and time out (tvm027.md §3.2), so it may measure nothing at all.
  stock-fixed    the same with LocalBuilder(initializer=stub_unused_intrinsics), the one-line fix a
                 user who found the cause would apply.
  tensortune     tensortune.tune(strategy="evolutionary"): the same search, our builder/runner.
  draft-verify   tensortune.tune(strategy="draft-verify").

Every time a configuration's best program improves, its trace is kept with the wall time.  At
the end every kept program is re-timed by one runner (ours: 5 repeats of >= 10 ms, median), so
all curves are on one scale: the stock runner's own figures (3 runs of >= 100 ms, one repeat)
never enter a comparison.  "Reach" is the first wall time at which a configuration's re-timed
best is within 1% of stock-fixed's final re-timed best; the speedup is stock-fixed's tuning
time over it, both on the child's clock (from the start of its tuning, after the imports, to
its last measurement): the process's wall time would add the interpreter's start and TVM's
import to stock-fixed's side alone.

Run:  .venv/bin/python benchmarks/user_view.py [--workload SPEC] [--trials 128]
      [--stock-cap 300] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = ("stock", "stock-fixed", "tensortune", "draft-verify")


def _child(config: str, spec: str, trials: int, target: dict, out: Path, work: Path) -> None:
    """Tune with one configuration, appending (time, trials, best, trace) lines to ``out``."""
    from tensortune.workloads.sources import task_from_spec

    task = task_from_spec(spec)
    start = time.perf_counter()
    state = {"trials": 0, "best": float("inf")}

    def log(n: int, costs_traces: list[tuple[float, str]]) -> None:
        state["trials"] += n
        line: dict = {"t": time.perf_counter() - start, "trials": state["trials"]}
        better = [(c, tr) for c, tr in costs_traces if c < state["best"]]
        if better:
            state["best"], line["trace"] = min(better)
            line["best"] = state["best"]
        with out.open("a") as f:
            f.write(json.dumps(line) + "\n")

    if config.startswith("stock"):
        _stock(config, task.mod, trials, target, work, log)
    else:
        from tensortune.tuning.tune import tune

        def progress(_i, _task, batch, _result) -> None:
            log(len(batch), [(r.cost, r.trace) for r in batch if r.ok])

        strategy = "draft-verify" if config == "draft-verify" else "evolutionary"
        tune([task], trials=trials, records=f"sqlite:///{work / 'records.db'}",
             work_dir=work, target=target, strategy=strategy, check_correctness=False,
             progress=progress)  # fmt: skip


def _stock(config: str, mod, trials: int, target: dict, work: Path, log) -> None:
    from tensortune.compat import PyMeasureCallback, derived_object, ms, stub_unused_intrinsics, tvm
    from tensortune.records.convert import trace_text

    @derived_object
    class Curve(PyMeasureCallback):
        def apply(self, task_scheduler, task_id, candidates, builder_results, runner_results):
            pairs = [(statistics.median(float(s) for s in r.run_secs), trace_text(c.sch.trace))
                     for c, r in zip(candidates, runner_results, strict=True)
                     if r.error_msg is None and r.run_secs]  # fmt: skip
            log(len(candidates), pairs)

    builder = "local"
    if config == "stock-fixed":
        builder = ms.builder.LocalBuilder(initializer=stub_unused_intrinsics)
    ms.tune_tir(mod, tvm.target.Target(target), str(work), max_trials_global=trials,
                builder=builder, measure_callbacks=[*ms.MeasureCallback.create("default"),
                                                    Curve()])  # fmt: skip


def _retime(spec: str, target: dict, traces: list[str], repeats: int) -> list[float]:
    """Median cost of each trace over ``repeats`` builds and runs in one runner."""
    from tensortune.hardware import resolve_platform
    from tensortune.measure.batch import measure_batch
    from tensortune.measure.builder import PersistentBuilder
    from tensortune.measure.runner import PersistentRunner
    from tensortune.records.convert import candidate_from_trace
    from tensortune.workloads.sources import task_from_spec

    platform = resolve_platform(target)
    mod = task_from_spec(spec).mod
    cands = [candidate_from_trace(mod, text) for text in traces]
    builder = PersistentBuilder()
    runner = PersistentRunner(num_threads=platform.threads)
    costs: list[list[float]] = [[] for _ in cands]
    try:
        for _ in range(repeats):
            _, ran = measure_batch(builder, runner, cands, platform)
            for i, r in enumerate(ran):
                if r.run_secs:
                    costs[i].append(statistics.median(float(s) for s in r.run_secs))
    finally:
        builder.close()
        runner.close()
    return [statistics.median(c) if c else float("inf") for c in costs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="conv2d_nchw_bias_relu:1,28,28,128,128,3")
    ap.add_argument("--trials", type=int, default=128)
    ap.add_argument("--target", default=None, help="target JSON (default: this CPU)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--stock-cap", type=float, default=300.0)
    ap.add_argument("--cap", type=float, default=1800.0, help="seconds for the other configs")
    ap.add_argument("--retime-repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="directory for curves and the JSON summary")
    ap.add_argument("--child", nargs=3, metavar=("CONFIG", "OUT", "WORK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    from tensortune.hardware import current_hardware

    print(f"CPU: {current_hardware().cpu_model}", flush=True)  # beside every figure below

    from tensortune.hardware import parse_target

    target = parse_target(args.target)
    if args.child:
        config, out, work = args.child
        _child(config, args.workload, args.trials, target, Path(out), Path(work))
        return

    root = Path(args.out or tempfile.mkdtemp(prefix="tt-user-view-"))
    root.mkdir(parents=True, exist_ok=True)
    threads = os.environ.get("TVM_NUM_THREADS", "unset")
    print(f"task {args.workload}, {args.trials} trials, target {json.dumps(target)}, "
          f"TVM_NUM_THREADS={threads}; work in {root}")  # fmt: skip
    runs: dict[str, dict] = {}
    for config in args.configs.split(","):
        curve_path, work = root / f"{config}.jsonl", root / config
        curve_path.unlink(missing_ok=True)
        work.mkdir(exist_ok=True)
        cap = args.stock_cap if config == "stock" else args.cap
        cmd = [sys.executable, __file__, "--workload", args.workload,
               "--trials", str(args.trials), "--target", json.dumps(target),
               "--child", config, str(curve_path), str(work)]  # fmt: skip
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, timeout=cap, capture_output=True, text=True)
            status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
            tail = proc.stderr.strip().splitlines()[-1:] if proc.returncode else []
        except subprocess.TimeoutExpired:
            status, tail = f"stopped at the {cap:.0f} s cap", []
        wall = time.perf_counter() - start
        lines = (
            [json.loads(x) for x in curve_path.read_text().splitlines()]
            if curve_path.exists()
            else []
        )
        runs[config] = {"wall_s": wall, "status": status,
                        "trials": lines[-1]["trials"] if lines else 0,
                        "tuning_s": lines[-1]["t"] if lines else None,
                        "improvements": [x for x in lines if "trace" in x]}  # fmt: skip
        print(
            f"{config:13s} {status:22s} wall {wall:7.1f} s, {runs[config]['trials']} measured, "
            f"{len(runs[config]['improvements'])} improvements {' '.join(tail)}",
            flush=True,
        )

    traces = [(c, i) for c, r in runs.items() for i in range(len(r["improvements"]))]
    costs = _retime(
        args.workload,
        target,
        [runs[c]["improvements"][i]["trace"] for c, i in traces],
        args.retime_repeats,
    )
    for (c, i), cost in zip(traces, costs, strict=True):
        runs[c]["improvements"][i]["retimed"] = cost
    for r in runs.values():  # best so far on the common scale
        best = float("inf")
        for imp in r["improvements"]:
            best = min(best, imp["retimed"])
            imp["retimed_best"] = best
        r["final_retimed"] = best if r["improvements"] else None

    ref = runs.get("stock-fixed", {})
    goal = ref.get("final_retimed")
    print(
        f"\nre-timed in one runner ({args.retime_repeats} builds x 5 repeats, median); "
        f"reach = within 1% of stock-fixed's final"
    )
    print(f"{'config':13s} {'wall s':>8s} {'final us':>9s} {'reach s':>8s} {'speedup':>8s}")
    for name, r in runs.items():
        reach = None
        if goal is not None:
            reach = next((imp["t"] for imp in r["improvements"]
                          if imp["retimed_best"] <= goal * 1.01), None)  # fmt: skip
        r["reach_s"] = reach
        r["speedup"] = ref["tuning_s"] / reach if reach and ref.get("tuning_s") else None
        final = f"{r['final_retimed'] * 1e6:9.1f}" if r["final_retimed"] else f"{'-':>9s}"
        print(
            f"{name:13s} {r['wall_s']:8.1f} {final} {reach or float('nan'):8.1f} "
            f"{r['speedup'] or float('nan'):8.2f}"
        )
    for r in runs.values():
        for imp in r["improvements"]:
            imp.pop("trace")
    summary = {"workload": args.workload, "trials": args.trials, "target": target, "runs": runs}
    (root / "user_view.json").write_text(json.dumps(summary, indent=1))
    print(f"summary: {root / 'user_view.json'}")


if __name__ == "__main__":
    main()
