"""Offline comparison of every cost model on the shipped dataset, with TenSet's metrics.

Method: leave-one-network-out (the by-network split): for each network of the dataset, every
task of that network (on both hardware configurations) is the test set and the tasks of the other
networks train the model.  Metrics are TenSet's (PCA, top-1/top-5 score weighted by the tasks'
occurrences in the held-out network, a-peak@k), averaged over the folds.  Fit time and prediction
throughput (programs/s) are measured in the same run, one model at a time.

Run:  .venv/bin/python benchmarks/cost_models.py [--dataset DIR] [--models ms-xgb,xgb,...]
      [--tlp-epochs 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics

from tensortune.datasets.build import read_card
from tensortune.datasets.shipped import DATASET_DIR, dataset_path
from tensortune.train.trainer import train

KEYS = ("pca", "top1_score", "top5_score", "a_peak@1", "a_peak@5")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default=str(DATASET_DIR))
    ap.add_argument("--models", default="ms-xgb,xgb,lgbm,mlp,tlp")
    ap.add_argument("--networks", default="", help="comma list (default: all in the dataset)")
    ap.add_argument("--tlp-epochs", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from tensortune.hardware import current_hardware

    print(f"CPU: {current_hardware().cpu_model}", flush=True)  # beside every figure below
    card = read_card(dataset_path(args.dataset)).data  # a shipped name (pool) or a directory
    networks = [n for n in args.networks.split(",") if n] or card["networks"]
    print(f"dataset {args.dataset}: {card['programs']} programs, {card['tasks']} tasks, "
          f"hardware {', '.join(card['hardware'])}; leave-one-network-out over "
          f"{', '.join(networks)}")  # fmt: skip
    report: dict = {}
    for kind in args.models.split(","):
        params = {"epochs": args.tlp_epochs} if kind == "tlp" else None
        folds = []
        for net in networks:
            r = train(args.dataset, cost_model=kind, split=f"by-network:{net}", params=params)
            folds.append({**{k: r.metrics[k] for k in KEYS}, "fit_s": r.fit_seconds,
                          "pred_per_s": r.predict_per_second, "network": net})  # fmt: skip
            print(f"  {kind:7s} held out {net:14s} " + " ".join(
                f"{k} {r.metrics[k]:.3f}" for k in KEYS) + f"  fit {r.fit_seconds:.1f} s",
                flush=True)  # fmt: skip
        mean = {k: statistics.mean(f[k] for f in folds) for k in (*KEYS, "fit_s", "pred_per_s")}
        report[kind] = {"mean": mean, "folds": folds}
    print("\nmean over held-out networks")
    print(f"  {'model':7s} " + " ".join(f"{k:>10s}" for k in KEYS) + "     fit s  programs/s")
    for kind, r in report.items():
        m = r["mean"]
        print(f"  {kind:7s} " + " ".join(f"{m[k]:10.3f}" for k in KEYS)
              + f" {m['fit_s']:9.1f} {m['pred_per_s']:11.0f}")  # fmt: skip
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
