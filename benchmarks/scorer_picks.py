"""How well each scorer would have picked among programs measured on this machine.

Reads the stores ``tensortune bench tune`` runs left in their work directories (each method's
``records.db``, one target each), replays every task's measured programs, and scores them with
the draft model (the analyzer) and with each shipped pre-trained model, as the draft-then-verify
strategy would before measuring them. Per scorer, averaged over the tasks of every store of the
chosen methods: Spearman's rank correlation with the measured speed, how many of a task's true 8
fastest are in the scorer's top 16, and how close the best of that top 16 is to the task's best
(1.0: the scorer's top 16 holds the fastest program); and the same for an even blend of the
analyzer's ranks with each model's. ``--per-task`` also prints each task pool's Spearman.
The ``default`` method's stores hold MetaSchedule's first random round plus evolved programs;
a draft-then-verify method's hold programs the verifier already favoured, a harder pool to
order.

Run:  .venv/bin/python benchmarks/scorer_picks.py WORK_DIR [WORK_DIR ...]
      [--methods default,moa] [--target JSON] [--per-task] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from tensortune.compat import TuneContext
from tensortune.costmodel.ms_adapter import LearnedCostModel
from tensortune.costmodel.shipped import SHIPPED_DIR
from tensortune.hardware import Platform, resolve_platform
from tensortune.records.convert import candidate_from_trace
from tensortune.records.sqlite import SQLiteStore
from tensortune.search.analyzer.machine import machine_for
from tensortune.search.analyzer.roofline import Analyzer
from tensortune.search.blend import rank_share

TARGET = '{"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}'
TOP = 16


def task_pools(store_path: Path, platform: Platform, models: dict) -> list[dict]:
    """Per task of one store: measured latencies and every scorer's scores of those programs."""
    store = SQLiteStore(str(store_path), create=False)
    pools = []
    try:
        for wl in store.workloads():
            mod = wl.mod()
            cands, lat = [], []
            for r in store.query(workload_id=wl.id, ok_only=True):
                try:
                    cands.append(candidate_from_trace(mod, r.trace))
                except Exception:  # a trace this TVM cannot replay
                    continue
                lat.append(r.cost)
            if len(cands) < 2 * TOP:
                continue
            ctx = TuneContext(mod, target=platform.tvm_target, num_threads=2)
            analyzer = Analyzer(machine_for(platform))
            scores = {"analyzer": analyzer.scores([c.sch.mod for c in cands])}
            for name, model in models.items():
                scores[name] = np.asarray(model.predict(ctx, cands), np.float64)
            pools.append({"store": store_path.resolve().parent.parent.name, "task": wl.name,
                          "latency": np.array(lat), "scores": scores})  # fmt: skip
    finally:
        store.close()
    return pools


def pick_quality(scores: np.ndarray, latency: np.ndarray) -> tuple[float, float, float]:
    """(Spearman, share of the true 8 fastest in the top 16, best of the top 16 / best); the
    Spearman of a scorer that scores every program alike is NaN."""
    top = np.argsort(-scores, kind="stable")[:TOP]
    fastest = set(np.argsort(latency, kind="stable")[: TOP // 2].tolist())
    rho = np.corrcoef(rank_share(scores), rank_share(-latency))[0, 1]
    recall = len(fastest & set(top.tolist())) / len(fastest)
    return float(rho), recall, float(latency.min() / latency[top].min())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("work_dirs", nargs="+", type=Path)
    ap.add_argument("--methods", default="default,moa")
    ap.add_argument("--target", default=TARGET)
    ap.add_argument("--per-task", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    platform = resolve_platform(args.target)
    target = platform.target
    models = {p.stem: LearnedCostModel(str(p), platform) for p in sorted(SHIPPED_DIR.glob("*.ttm"))}
    report: dict[str, dict] = {}
    for method in args.methods.split(","):
        pools = []
        for work in args.work_dirs:
            path = work / method / "records.db"
            if path.is_file():
                pools += task_pools(path, platform, models)
        if not pools:
            continue
        scorers = {name: lambda p, n=name: p["scores"][n] for name in pools[0]["scores"]}
        for name in models:
            scorers[f"analyzer+{name}"] = lambda p, n=name: (
                rank_share(p["scores"]["analyzer"]) + rank_share(p["scores"][n])
            )
        rows = {}
        for name, score in scorers.items():
            q = np.nanmean([pick_quality(score(p), p["latency"]) for p in pools], axis=0)
            rows[name] = {"spearman": q[0], "top8_in_top16": q[1], "best_of_top16": q[2]}
        per_task = [
            {"work_dir": p["store"], "task": p["task"],
             **{n: pick_quality(p["scores"][n], p["latency"])[0] for n in p["scores"]}}
            for p in pools
        ]  # fmt: skip
        report[method] = {"tasks": len(pools), "scorers": rows, "per_task_spearman": per_task}
        if not args.json:
            print(f"{method}: {len(pools)} task pools (Spearman, true top 8 in top 16, "
                  "best of top 16 / best)")  # fmt: skip
            for name, r in rows.items():
                print(f"  {name:20s} {r['spearman']:6.3f} {r['top8_in_top16']:6.3f} "
                      f"{r['best_of_top16']:6.3f}")  # fmt: skip
            if args.per_task:
                for t in per_task:
                    cells = " ".join(f"{k} {v:6.3f}" for k, v in t.items() if k not in
                                     ("work_dir", "task"))  # fmt: skip
                    print(f"    {t['work_dir']:24s} {t['task'][:28]:28s} {cells}")
    if args.json:
        # Standard JSON: a NaN Spearman becomes null.
        text = json.dumps({"target": target, "methods": report}, indent=1)
        print(json.dumps(json.loads(text, parse_constant=lambda _: None), indent=1))


if __name__ == "__main__":
    main()
