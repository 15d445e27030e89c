"""ALT's validity filter on tasks whose candidates fail (issue 20, item 5).

Failures are made the way users meet them: a tight run timeout (``--timeout``, seconds per
candidate, TVM's time evaluator included) turns every slow program into a timeout, and odd
shapes (prime sizes) make slow programs common.  Each seed tunes every task three times with
draft-then-verify and an online XGBoost verifier, nothing else changed:
  plain   no filter: how many measurements fail;
  shadow  the filter judges but drops nothing (``audit=1``), so the search measures what a plain
          run measures and the verdict on every program measured is checked: of the failures,
          the share it would have removed; of the programs that ran, the share it would have
          dropped wrongly (candidates it judged that no round picked are never measured);
  filter  the filter drops what it rates a failure, measuring 10% of those to count wrong drops
          (``audit=0.1``): the share of its measurements that failed (against plain's), the
          measurements it saved (``displaced``, an estimate: of each round's best-scored, those
          it turned away; ``dropped``, all it turned away, bounds it above) and the best
          latency found.
The shadow runs also log the filter's rating of every program it judged, and so give the
shares removed and wrongly dropped at other thresholds than the filter's.
Then ``warm``: the filter run again on the ``filter`` run's records store, so the earlier
run's failures train the filter before the first round (``StoreDatabase.outcomes``); and
``warm-shadow``: the shadow run again on the ``shadow`` run's store, which checks every
decision of a filter warm-started that way.

Run:  .venv/bin/python benchmarks/validity_filter.py --work vf [--timeout 0.3] [--trials 96]
      [--seeds 3] [--first-seed 0] [-w matmul:509,1021,263 ...] [--mode plain ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

WORKLOADS = ["matmul:509,1021,263", "conv2d_nchw:1,58,58,61,127,3", "batch_matmul:8,509,257,263"]
THRESHOLDS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5)
MIN_EACH = (3, 8, 16)
MODES = {"plain": {}, "shadow": {"validity": 1, "audit": 1.0}, "filter": {"validity": 1}}
# Runs resumed on an earlier mode's store, with that mode's options.
WARM = {"warm": "filter", "warm-shadow": "shadow"}


def _tune(workload: str, mode: str, seed: int, args, records: Path) -> dict:
    from tensortune.hardware.target import resolve_platform
    from tensortune.measure.runner import PersistentRunner
    from tensortune.search.draft_verify import DraftThenVerify
    from tensortune.tuning.tune import tune

    platform = resolve_platform(None)
    options = MODES[WARM.get(mode, mode)]
    log: list[tuple[float, bool, int]] = []
    strategy = DraftThenVerify(**options, alt_log=log)
    runner = PersistentRunner(num_threads=platform.threads, timeout_s=args.timeout)
    try:
        runner.wait_ready()
        start, began = time.perf_counter(), time.time()
        # Resuming is tune's default: the warm run's store already holds the filter run's.
        trials = args.trials * (2 if mode in WARM else 1)
        result = tune([workload], trials=trials, records=f"sqlite:///{records}",
                      work_dir=records.parent / "w", target=platform, strategy=strategy,
                      cost_model="xgb", runner=runner, check_correctness=False,
                      seed=seed)  # fmt: skip
        wall = time.perf_counter() - start
    finally:
        runner.close()
    task = result.tasks[0]
    stats = dict(strategy.alt_stats) if options else {}
    # This run's own measurements (the warm run's store holds the filter run's too).
    trials = stats["measured"] if stats else task.trials
    ok = trials - stats["measured_failed"] if stats else task.ok
    best = task.best_seconds
    if mode in WARM:  # the best of its own measurements, not of the store's two runs
        from tensortune.records import open_records

        with open_records(f"sqlite:///{records}", create=False) as store:
            best = min((r.cost for r in store.query(ok_only=True) if r.created_at >= began),
                       default=None)  # fmt: skip
    return {"workload": workload, "mode": mode, "seed": seed, "trials": trials,
            "ok": ok, "failed": trials - ok, "best_s": best,
            "wall_s": wall, "stats": stats, "log": log}  # fmt: skip


def _share(a: float, b: float) -> float | None:
    return a / b if b else None


def _summary(runs: list[dict]) -> dict:
    """Per mode, summed over workloads and seeds (module docstring for each figure)."""
    out: dict[str, dict] = {}
    for mode in [*MODES, *WARM]:
        rs = [r for r in runs if r["mode"] == mode]
        if not rs:
            continue
        total = {k: sum(r[k] for r in rs) for k in ("trials", "ok", "failed")}
        st = {k: sum(r["stats"].get(k, 0) for r in rs) for k in
              ("dropped", "displaced", "audited", "audited_valid", "measured_failed",
               "failed_unfiltered", "earlier")}  # fmt: skip
        row: dict = {**total, **st, "failed_share": _share(total["failed"], total["trials"])}
        if mode in ("shadow", "warm-shadow"):
            would_remove = st["audited"] - st["audited_valid"]
            row["removed_share"] = _share(would_remove, st["measured_failed"])
            learned = st["measured_failed"] - st["failed_unfiltered"]
            row["removed_share_once_learned"] = _share(would_remove, learned)
            row["wrongly_dropped_share"] = _share(st["audited_valid"], total["ok"])
            row["wrong_among_dropped"] = _share(st["audited_valid"], st["audited"])
        out[mode] = row
    return out


def _thresholds(runs: list[dict], mode: str = "shadow") -> list[dict]:
    """From the ``mode`` runs' ratings (shadow runs: every judged program was measured): for
    each threshold and each least number of both outcomes seen before the filter acts
    (``min_each``), the share of the judged failures it would have removed and of the judged
    programs that ran it would have dropped."""
    rows = [e for r in runs if r["mode"] == mode for e in r["log"]]
    if not rows:
        return []
    p, ran, fewest = (np.array(c) for c in zip(*rows, strict=True))
    ran = ran.astype(bool)
    out = []
    for least in MIN_EACH:
        for th in THRESHOLDS:
            drop = (p < th) & (fewest >= least)
            out.append({"min_each": least, "threshold": th, "judged": len(p),
                        "failed": int((~ran).sum()),
                        "removed_share": _share(int((drop & ~ran).sum()), int((~ran).sum())),
                        "wrongly_dropped_share": _share(int((drop & ran).sum()),
                                                        int(ran.sum()))})  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("-w", "--workload", action="append", default=None)
    ap.add_argument("--timeout", type=float, default=0.3)
    ap.add_argument("--trials", type=int, default=96)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument(
        "--first-seed", type=int, default=0, help="seeds run: first-seed .. first-seed + seeds - 1"
    )
    ap.add_argument("--mode", action="append", choices=[*MODES, *WARM], default=None)
    args = ap.parse_args()
    if args.seeds < 1:
        ap.error("--seeds must be at least 1")
    workloads = args.workload or WORKLOADS
    args.work.mkdir(parents=True, exist_ok=True)
    saved = args.work / "runs.json"
    runs: list[dict] = json.loads(saved.read_text()) if saved.is_file() else []
    done = {(r["workload"], r["mode"], r["seed"]) for r in runs}
    from tensortune.hardware.fingerprint import current_hardware

    seeds = range(args.first_seed, args.first_seed + args.seeds)
    print(f"CPU: {current_hardware().cpu_model}; run timeout {args.timeout} s; "
          f"{args.trials} trials per task; seeds {seeds[0]}-{seeds[-1]}; {workloads}",
          flush=True)  # fmt: skip
    for seed in seeds:
        for i, workload in enumerate(workloads):
            for mode in args.mode or [*MODES, *WARM]:
                if (workload, mode, seed) in done:
                    continue
                where = args.work / f"s{seed}-t{i}-{WARM.get(mode, mode)}"
                if mode not in WARM:
                    shutil.rmtree(where, ignore_errors=True)
                where.mkdir(parents=True, exist_ok=True)
                run = _tune(workload, mode, seed, args, where / "records.db")
                runs.append(run)
                saved.write_text(json.dumps(runs, indent=1))
                print(f"seed {seed} {workload} {mode:6s}: {run['failed']}/{run['trials']} "
                      f"failed, best {run['best_s'] * 1e3 if run['best_s'] else float('nan'):.2f}"
                      f" ms, {run['wall_s']:.0f} s, {run['stats']}", flush=True)  # fmt: skip
    summary = _summary(runs)
    for mode, row in summary.items():
        print(f"{mode:6s} " + "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                        for k, v in row.items()))  # fmt: skip
    # Best latencies paired by task and seed; the shadow runs measure what plain ones do.
    best = {(r["mode"], r["workload"], r["seed"]): r["best_s"] or float("inf") for r in runs}
    for mode in ("filter", "warm"):
        for base in ("plain", "shadow"):
            ratios = [b / best[base, w, seed] for (m, w, seed), b in best.items()
                      if m == mode and (base, w, seed) in best]  # fmt: skip
            if ratios:
                print(f"{mode} best latency / {base}'s, same task and seed: median "
                      f"{statistics.median(ratios):.3f} over {len(ratios)} runs")  # fmt: skip
    for mode in ("shadow", "warm-shadow"):
        curve = _thresholds(runs, mode)
        for row in curve:
            print(f"{mode}, min_each {row['min_each']}, threshold {row['threshold']:.2f}: "
                  f"removes {row['removed_share']:.3f} of {row['failed']} judged failures, "
                  f"drops {row['wrongly_dropped_share']:.3f} of "
                  f"{row['judged'] - row['failed']} judged programs that ran")  # fmt: skip
        summary["thresholds" if mode == "shadow" else "thresholds_warm"] = curve
    (args.work / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
