"""Tuning with a pre-trained cost model against MetaSchedule's default, on a held-out network.

Method: a cost model is trained on the shipped dataset with every task of the held-out network
removed (the by-network split), for one hardware configuration.  Then, for the K tasks of that
network with the most weighted FLOPs, each method tunes the task from an empty store with the
same budget, batch size, measurement and search (MetaSchedule's evolutionary search):
  default   MetaSchedule's XGBModel, learning online (random until it has 100 samples)
  frozen    our pre-trained model, never updated
  online    our pre-trained model, refined with every measured batch
For each task and method: best latency after each batch.  "Trials to reach" is the first trial
count at which a method's best latency is at most the default's final best; the ratio is the
default's budget divided by it (">" when it never got there).

Run:  .venv/bin/python benchmarks/pretrained_tuning.py [--network resnet18] [--tasks 3]
      [--trials 96] [--config avx512-2c] [--model xgb]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from tensortune.datasets.shipped import DATASET_DIR
from tensortune.hardware import get_config, resolve_platform
from tensortune.train.trainer import train
from tensortune.tuning.tune import tune
from tensortune.workloads.models import load_model


def _curve(task, target, trials, per_round, cost_model, online, work) -> tuple[list, float]:
    curve: list[tuple[int, float]] = []

    def progress(_i, _task, _batch, result) -> None:
        if result.best_seconds is not None:
            curve.append((result.trials, result.best_seconds))

    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    tune([task], trials=trials, records=f"sqlite:///{work / 'r.db'}", work_dir=work,
         target=target, strategy="evolutionary", cost_model=cost_model, online_cost_model=online,
         trials_per_round=per_round, check_correctness=False, progress=progress)  # fmt: skip
    return curve, time.perf_counter() - start


def _trials_to_reach(curve: list[tuple[int, float]], latency: float) -> int | None:
    return next((t for t, best in curve if best <= latency), None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default=str(DATASET_DIR))
    ap.add_argument("--network", default="resnet18")
    ap.add_argument("--tasks", type=int, default=3)
    ap.add_argument("--trials", type=int, default=96)
    ap.add_argument("--per-round", type=int, default=16)
    ap.add_argument("--config", default="avx512-2c")
    ap.add_argument("--model", default="xgb")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from tensortune.hardware import current_hardware

    print(f"CPU: {current_hardware().cpu_model}", flush=True)  # beside every figure below
    config = get_config(args.config)
    target = config.target
    with tempfile.TemporaryDirectory() as tmp:
        model_path = str(Path(tmp) / "pretrained.ttm")
        trained = train(args.dataset, cost_model=args.model, split=f"by-network:{args.network}",
                        out=model_path)  # fmt: skip
        print(f"{args.model} trained without {args.network}: {trained.train_programs} programs, "
              f"offline PCA on {args.network} {trained.metrics['pca']:.3f}, "
              f"top-1 {trained.metrics['top1_score']:.3f}")  # fmt: skip
        tasks = load_model(args.network, target=resolve_platform(target).tvm_target).tasks
        tasks = sorted(tasks, key=lambda t: -t.flop * t.weight)[: args.tasks]
        # MetaSchedule's XGBModel always learns online: frozen applies to our models alone
        methods = {"default": ("xgb", True), "frozen": (model_path, False),
                   "online": (model_path, True)}  # fmt: skip
        report = []
        for i, task in enumerate(tasks):
            row = {"task": task.name}
            for name, (cost_model, online) in methods.items():
                work = Path(tmp) / f"{i}-{name}"
                curve, wall = _curve(task, target, args.trials, args.per_round, cost_model,
                                     online, work)  # fmt: skip
                row[name] = {"curve": curve, "wall_s": wall, "final": curve[-1][1]}
            goal = row["default"]["final"]
            for name in methods:
                reach = _trials_to_reach(row[name]["curve"], goal)
                row[name]["trials_to_reach_default"] = reach
                row[name]["ratio"] = args.trials / reach if reach else None
            report.append(row)
            print(f"\n{task.name} (target {config.name}, {args.trials} trials, rounds of "
                  f"{args.per_round}); default's final best {goal * 1e6:.1f} µs")  # fmt: skip
            for name in methods:
                r = row[name]
                reach = r["trials_to_reach_default"]
                at = str(reach) if reach else f">{args.trials}"
                print(
                    f"  {name:8s} final {r['final'] * 1e6:9.1f} µs  reaches default's final"
                    f" at {at:>5} trials ({r['ratio'] or 0:.2f}x)  wall {r['wall_s']:.0f} s"
                )
        for name in ("frozen", "online"):
            ratios = [r[name]["ratio"] for r in report if r[name]["ratio"]]
            reached = len(ratios)
            mean = statistics.mean(ratios) if ratios else 0.0
            print(f"\n{name}: reached the default's final latency on {reached}/{len(report)} "
                  f"tasks; mean trials ratio over those {mean:.2f}x")  # fmt: skip
        if args.json:
            print(json.dumps(report))


if __name__ == "__main__":
    main()
