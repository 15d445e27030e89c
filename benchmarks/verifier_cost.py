"""Where a verifier's time goes inside one draft-then-verify search.

Tunes a network's heaviest task (this machine's target, a fresh records store) with the
default strategy and the given verifier (the shipped model, or a `.ttm` file; one that reads
lowered-loop features is screened by the shipped model, as `tune` does), and splits the
verifier's seconds into: MetaSchedule's per-store feature extraction, lowering candidates for
the lowered-loop features, the screen's and the model's predictions, and the programs'
structural hashes (the feature memo's keys).  Counts the distinct programs scored and how many
were lowered.  One search per call: compare arms in one session, several seeds, nothing else
running (benchmarks/RESULTS.md, stop 54).

Run:  .venv/bin/python benchmarks/verifier_cost.py [--model resnet18] [--trials 128]
          [--verifier default|FILE.ttm] [--seed 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict


def measure(model: str, trials: int, verifier: str, seed: int) -> dict:
    import tensortune.costmodel.ms_adapter as adapter
    from tensortune.costmodel.factory import cost_model_from
    from tensortune.costmodel.timed import TimedCostModel
    from tensortune.hardware import resolve_platform
    from tensortune.search.draft_verify import DraftThenVerify
    from tensortune.tuning.tune import tune
    from tensortune.workloads.resolve import resolve_tasks

    platform = resolve_platform(None)
    tasks = [t for t in resolve_tasks(model=model, platform=platform) if t.flop > 0]
    task = max(tasks, key=lambda t: t.flop * t.weight)
    seconds: dict[str, float] = defaultdict(float)

    def timed(owner: object, name: str, key: str) -> None:
        inner = getattr(owner, name)

        def call(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                seconds[key] += time.perf_counter() - start

        setattr(owner, name, call)

    # The adapter's module-level helpers and its models' predict: patched for this process.
    timed(adapter, "candidate_features", "per-store features")
    timed(adapter, "candidate_lowered", "lowering")
    timed(adapter, "structural_hash", "structural hashes")
    learned = cost_model_from(verifier, platform, online="auto")
    inner = learned._inst
    timed(inner.model, "predict", "model predictions")
    if inner.screen is not None:
        timed(inner.screen, "predict", "screen predictions")
    clock = TimedCostModel(learned)
    with tempfile.TemporaryDirectory() as work:
        start = time.perf_counter()
        tune([task], trials=trials, records=f"sqlite:///{work}/r.db", work_dir=f"{work}/w",
             target=platform, strategy=DraftThenVerify(), cost_model=clock,
             check_correctness=False, seed=seed)  # fmt: skip
        wall = time.perf_counter() - start
    return {
        "task": task.name, "trials": trials, "verifier": verifier, "seed": seed,
        "target": platform.target, "wall_s": wall, "predict_s": clock._inst.predict_s,
        "update_s": clock._inst.update_s, "split_s": dict(seconds),
        "programs": len(inner._memo),
        "lowered": sum(entry[2] is not None for entry in inner._memo.values()),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--trials", type=int, default=128)
    parser.add_argument("--verifier", default="default")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from tensortune.hardware import current_hardware

    out = {**measure(args.model, args.trials, args.verifier, args.seed),
           "cpu": current_hardware().cpu_model}  # fmt: skip
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{out['task']} ({args.model}'s heaviest task), {out['trials']} trials, seed "
          f"{out['seed']}, verifier {out['verifier']}, target {out['target']}, CPU "
          f"{out['cpu']}")  # fmt: skip
    print(f"wall {out['wall_s']:.1f} s; verifier predict {out['predict_s']:.2f} s, update "
          f"{out['update_s']:.2f} s; {out['programs']} programs scored, "
          f"{out['lowered']} lowered")  # fmt: skip
    for key, value in sorted(out["split_s"].items(), key=lambda kv: -kv[1]):
        print(f"  {key:20s} {value:7.2f} s")


if __name__ == "__main__":
    main()
