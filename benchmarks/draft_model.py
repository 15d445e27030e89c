"""The draft model against the learned model: cost per candidate, and draft quality.

Cost: for each workload, 64 random candidates; in the same run and in rotating order, 5 times
each, (a) the analyzer (TIR walk + roofline) and (b) what the learned model needs per candidate
(MetaSchedule's PerStoreFeature extraction + the shipped model's prediction).  Reports median
milliseconds per candidate and their ratio.

Quality: Pruner's draft check on the shipped dataset (every task and hardware with 48+
programs): recall of each task's true top-1/5/20 programs inside the analyzer's top 25%.

Run:  .venv/bin/python benchmarks/draft_model.py [--dataset DIR] [--share 0.25] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from tensortune.datasets.shipped import DATASET_DIR

WORKLOADS = ("conv2d_nhwc:1,28,28,32,32,3", "matmul:128,128,128", "dense_bias_relu:128,3072,768")
TARGET = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}


def cost_per_candidate(repeats: int = 5) -> dict:
    from tensortune.compat import TuneContext
    from tensortune.costmodel.ms_adapter import LearnedCostModel
    from tensortune.costmodel.shipped import shipped_model
    from tensortune.hardware import resolve_platform
    from tensortune.search.analyzer.machine import machine_for
    from tensortune.search.analyzer.roofline import Analyzer
    from tensortune.search.space import sample_candidates
    from tensortune.workloads.sources import task_from_spec

    platform = resolve_platform(TARGET)
    machine = machine_for(platform)
    learned = LearnedCostModel(shipped_model(platform), platform)
    out = {}
    for spec in WORKLOADS:
        mod = task_from_spec(spec).mod
        cands = sample_candidates(mod, platform, 64, seed=0)
        ctx = TuneContext(mod, target=platform.tvm_target, num_threads=2)
        draft = Analyzer(machine)  # one per task, as the strategy uses it
        learned.predict(ctx, cands[:2])  # per-task caches, as in a tuning run
        times: dict[str, list[float]] = {"analyzer": [], "learned": []}
        for r in range(repeats):
            order = ["analyzer", "learned"] if r % 2 == 0 else ["learned", "analyzer"]
            for which in order:
                t0 = time.perf_counter()
                if which == "analyzer":
                    draft.structure.clear()  # first sight of the sketch's structure too
                    draft.scores([c.sch.mod for c in cands])
                else:
                    learned._memo.clear()  # first sight of each program, as in a search
                    learned.predict(ctx, cands)
                times[which].append((time.perf_counter() - t0) / len(cands) * 1e3)
        a, lm = statistics.median(times["analyzer"]), statistics.median(times["learned"])
        out[spec] = {"analyzer_ms": a, "learned_ms": lm, "ratio": lm / a}
        print(f"  {spec:32s} analyzer {a:6.2f} ms  features+model {lm:6.2f} ms  "
              f"ratio {lm / a:5.1f}x", flush=True)  # fmt: skip
    return out


def main() -> None:
    from tensortune.search.analyzer.quality import draft_quality

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default=str(DATASET_DIR))
    ap.add_argument("--share", type=float, default=0.25)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from tensortune.hardware import current_hardware

    print(f"CPU: {current_hardware().cpu_model}", flush=True)  # beside every figure below
    print("cost per candidate (median of 5, 64 random candidates, 2 threads for features)")
    cost = cost_per_candidate()
    print(f"draft quality on {args.dataset} (analyzer's top {args.share:.0%} of each task)")
    q = draft_quality(args.dataset, share=args.share).to_dict()
    print(f"  {q['groups']} task x hardware groups, {q['programs']} programs")
    print("  recall of the true " + ", ".join(f"{k} {v:.3f}" for k, v in q["recall"].items())
          + f" (random drafting: {q['random_recall']:.3f}); best label inside the draft "
          f"{q['best_in_draft']:.3f}")  # fmt: skip
    if args.json:
        print(json.dumps({"cost": cost, "quality": q}))


if __name__ == "__main__":
    main()
