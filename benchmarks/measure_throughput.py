"""Candidates measured per second: tensortune's persistent builder/runner against MetaSchedule's
LocalBuilder (with the initializer that skips the intrinsics of GPUs and other CPU ISAs, so that
it works at all) and LocalRunner, on the same candidates, in the same run.

Method: for each workload, draw N random schedules from its design space once.  Each repetition
measures all of them with every configuration, in rotating order, each configuration starting
its workers from scratch (a tuning run pays that once too).  Throughput = candidates / wall
seconds for build + run; the ratio is taken per repetition and its median reported.

Configurations:
  tvm-local      LocalBuilder(initializer=stub unused intrinsics, 2 workers) + LocalRunner()
                 (EvaluatorConfig defaults: number=3, repeat=1, min_repeat_ms=100)
  tensortune     PersistentBuilder(2 workers) + PersistentRunner() (repeat=5, min_repeat_ms=10)
  tensortune-eq  the same, timing candidates with LocalRunner's evaluator settings, so that only
                 the infrastructure differs

Run:  .venv/bin/python benchmarks/measure_throughput.py [--candidates 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from tensortune.compat import ms, stub_unused_intrinsics
from tensortune.hardware import current_hardware, resolve_platform
from tensortune.measure.batch import measure_batch
from tensortune.measure.builder import PersistentBuilder
from tensortune.measure.runner import PersistentRunner, TimingConfig
from tensortune.search.space import sample_candidates
from tensortune.workloads.ops import parse_spec

WORKLOADS = ("matmul:128,128,128", "conv2d_nhwc:1,28,28,32,32,3")
BATCH = 16  # candidates per build/run call, as in a tuning round


def _measure(make, cands, platform) -> tuple[float, list[float | None]]:
    """Wall seconds to build and run every candidate (batches of BATCH), and each median cost."""
    start = time.perf_counter()
    builder, runner = make()
    costs: list[float | None] = []
    try:
        for i in range(0, len(cands), BATCH):
            built, ran = measure_batch(builder, runner, cands[i : i + BATCH], platform)
            for b, r in zip(built, ran, strict=True):
                ok = b.error_msg is None and r.error_msg is None and r.run_secs
                costs.append(statistics.median(float(s) for s in r.run_secs) if ok else None)
    finally:
        for part in (builder, runner):
            if hasattr(part, "close"):
                part.close()
    return time.perf_counter() - start, costs


def _spearman(a: list[float], b: list[float]) -> float:
    def ranks(v: list[float]) -> list[int]:
        order = sorted(range(len(v)), key=v.__getitem__)
        out = [0] * len(v)
        for rank, i in enumerate(order):
            out[i] = rank
        return out

    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb, strict=True)) / (n * (n * n - 1))


CONFIGS = {
    "tvm-local": lambda: (
        ms.builder.LocalBuilder(max_workers=2, initializer=stub_unused_intrinsics),
        ms.runner.LocalRunner(),
    ),
    "tensortune": lambda: (PersistentBuilder(max_workers=2), PersistentRunner()),
    "tensortune-eq": lambda: (
        PersistentBuilder(max_workers=2),
        PersistentRunner(TimingConfig(number=3, repeat=1, min_repeat_ms=100)),
    ),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidates", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    platform = resolve_platform(None)
    print(f"target {json.dumps(platform.target)}; hardware {current_hardware().cpu_model}, "
          f"{current_hardware().cores} cores; {args.candidates} candidates per workload, "
          f"batches of {BATCH}, {args.repeats} repetitions")  # fmt: skip
    report: dict = {}
    for spec in WORKLOADS:
        cands = sample_candidates(parse_spec(spec).to_module(), platform, args.candidates)
        walls: dict[str, list[float]] = {name: [] for name in CONFIGS}
        costs: dict[str, list] = {}
        names = list(CONFIGS)
        for rep in range(args.repeats):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                wall, c = _measure(CONFIGS[name], cands, platform)
                walls[name].append(wall)
                costs[name] = c
        base = walls["tvm-local"]
        row = {}
        for name in CONFIGS:
            ratios = [b / w for b, w in zip(base, walls[name], strict=True)]
            row[name] = {
                "wall_s": walls[name],
                "candidates_per_s": len(cands) / statistics.median(walls[name]),
                "speedup_vs_tvm_local": statistics.median(ratios),
                "failed": sum(x is None for x in costs[name]),
            }
        both = [(a, b) for a, b in zip(costs["tvm-local"], costs["tensortune"], strict=True)
                if a is not None and b is not None]  # fmt: skip
        row["rank_agreement_spearman"] = _spearman([a for a, _ in both], [b for _, b in both])
        report[spec] = row
        print(f"\n{spec} ({len(cands)} candidates)")
        for name in CONFIGS:
            r = row[name]
            walls_text = ", ".join(f"{w:.1f}" for w in r["wall_s"])
            print(f"  {name:14s} {r['candidates_per_s']:6.2f} cand/s  wall [{walls_text}] s  "
                  f"median ratio vs tvm-local {r['speedup_vs_tvm_local']:.2f}x  "
                  f"failed {r['failed']}")  # fmt: skip
        print(f"  rank agreement of measured costs, tensortune vs tvm-local (Spearman): "
              f"{row['rank_agreement_spearman']:.3f}")  # fmt: skip
    overall = statistics.median(
        report[s]["tensortune"]["speedup_vs_tvm_local"] for s in WORKLOADS
    )  # fmt: skip
    print(f"\nmedian over the {len(WORKLOADS)} workloads (of two, their mean) of the ratio "
          f"tensortune vs tvm-local: {overall:.2f}x")  # fmt: skip
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
