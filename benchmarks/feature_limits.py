"""What holds a cost model's accuracy on held-out networks: the measurements, the loss, or the
features?

Three checks on one dataset, each on the by-network split (every network in turn held out
with all its tasks on every hardware; TenSet's metrics weighted as `bench splits` weights
them, mean over the folds):

1. The measurement ceiling (`compare.splits.measurement_ceiling`): each program's first
   timing repeat ranked against the median of its other repeats.  A model trained on these
   labels cannot be credited with more.
2. The loss: the shipped `xgb` (pack-sum regression over per-block rows, MetaSchedule's)
   against XGBoost on one row per program (the sum and the maximum of its blocks' features,
   with the workload and hardware vectors), fitted by squared error or by a pairwise ranking
   loss within each task (`rank:pairwise`, TenSet's PCA is a pairwise measure).
3. The features: the same program-level models with the draft analyzer's symbols added
   (log of its roofline latency, work, parallel and vector extents, bytes from L2 and from
   memory, thread launches, unroll), and the analyzer alone, untrained.  The analyzer
   models every row's target as it would run on *this* host (its roofline needs a machine;
   the dataset's other machines are not here), so its symbols are exact and its latency a
   proxy.
4. Two model families at once: the shipped `xgb` and `mlp`, their ranks within each task
   averaged.

Run:  .venv/bin/python benchmarks/feature_limits.py [--dataset ttset-cpu-v3] [--seeds 1]
      (about 10 minutes on 2 cores: 1.5 to replay every trace for the analyzer)
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import defaultdict

import numpy as np

from tensortune.compare.splits import measurement_ceiling, split_specs
from tensortune.costmodel.data import ProgramSet
from tensortune.costmodel.registry import new_model
from tensortune.train.metrics import RANK_METRICS, score_predictions
from tensortune.train.trainer import (
    card_networks,
    dataset_columns,
    scored_rows,
    split_masks,
)

ANALYZER_WIDTH = 8


def analyzer_symbols(dataset: str, columns: dict) -> np.ndarray:
    """One row of analyzer symbols per dataset row (NaN where the trace does not replay)."""
    from tensortune.compat import tvm
    from tensortune.datasets.build import load_workloads
    from tensortune.datasets.shipped import dataset_path
    from tensortune.hardware import Platform, current_hardware
    from tensortune.search.analyzer.machine import machine_for
    from tensortune.search.analyzer.roofline import block_latency, block_traffic
    from tensortune.search.analyzer.symbols import program_symbols

    modules = load_workloads(dataset_path(dataset))
    machines: dict[str, object] = {}
    structure: dict[int, dict] = defaultdict(dict)
    out = np.full((len(columns["trace"]), ANALYZER_WIDTH), np.nan, np.float32)
    for i, (task, target, trace) in enumerate(
            zip(columns["task_id"], columns["target"], columns["trace"], strict=True)):  # fmt: skip
        if target not in machines:
            machines[target] = machine_for(Platform(json.loads(target), current_hardware()))
        m = machines[target]
        sch = tvm.s_tir.Schedule(modules[task])
        try:
            tvm.s_tir.Trace.apply_json_to_schedule(json.loads(trace), sch)
            blocks = program_symbols(sch.mod, structure[task])
        except Exception:  # a trace this TVM cannot replay keeps NaN
            continue
        if not blocks:
            continue
        from_l2, from_mem = np.sum([block_traffic(b, m) for b in blocks], axis=0)
        out[i] = np.log([
            sum(block_latency(b, m) for b in blocks), 1 + sum(b.work for b in blocks),
            max(b.parallel for b in blocks), max(b.vector for b in blocks),
            1 + from_l2, 1 + from_mem,
            1 + sum(b.launches for b in blocks), 1 + max(b.unroll for b in blocks)])  # fmt: skip
    return out


def program_rows(columns: dict, symbols: np.ndarray | None) -> np.ndarray:
    """One feature row per program: sum and max of its blocks, workload, hardware[, symbols].
    A row without per-store features gets zeros for them (the caller leaves it out)."""
    width = next(len(p[0]) for p in columns["per_store"] if p is not None and len(p))
    parts = []
    for i, blocks in enumerate(columns["per_store"]):
        if blocks is None or not len(blocks):
            blocks = [[0.0] * width]
        b = np.asarray(blocks, np.float32).reshape(len(blocks), -1)
        row = [b.sum(0), b.max(0), [len(b)], columns["workload_embedding"][i],
               columns["hardware_vector"][i]]  # fmt: skip
        if symbols is not None:
            row.append(symbols[i])
        parts.append(np.concatenate([np.asarray(r, np.float32) for r in row]))
    return np.stack(parts)


def fit_predict(objective: str, x: np.ndarray, columns: dict, train: np.ndarray,
                test: np.ndarray, seed: int) -> np.ndarray:  # fmt: skip
    import xgboost as xgb

    label = np.asarray(columns["label"], dtype=float)
    keys = list(zip(columns["task_id"], columns["hardware"], strict=True))
    codes = {k: j for j, k in enumerate(dict.fromkeys(keys))}
    group = np.array([codes[k] for k in keys])
    rows = np.flatnonzero(train)
    params = {"objective": objective, "max_depth": 6, "eta": 0.1, "min_child_weight": 2.0,
              "seed": seed, "verbosity": 0}  # fmt: skip
    if objective == "rank:pairwise":
        rows = rows[np.argsort(group[rows], kind="stable")]  # XGBoost wants groups contiguous
        matrix = xgb.DMatrix(x[rows], label=label[rows], qid=group[rows])
        params |= {"lambdarank_pair_method": "mean", "lambdarank_num_pair_per_sample": 8}
    else:  # weighted toward fast programs, as the pack-sum objective is
        matrix = xgb.DMatrix(x[rows], label=label[rows], weight=label[rows] + 0.05)
    booster = xgb.train(params, matrix, 300)
    return booster.predict(xgb.DMatrix(x[np.flatnonzero(test)]))


def ranks_within(pred: np.ndarray, rows: dict) -> np.ndarray:
    """Each prediction's rank among its task's (on its hardware), scaled to (0, 1]: two
    models' scores on different scales then add up as a vote."""
    keys = np.char.add(rows["task_id"].astype(str), np.char.add("@", rows["hardware"].astype(str)))
    out = np.empty(len(pred))
    for key in np.unique(keys):
        mask = keys == key
        p = pred[mask]
        rank = np.empty(len(p))
        rank[np.argsort(p, kind="stable")] = np.arange(1, len(p) + 1)
        _, tie, count = np.unique(p, return_inverse=True, return_counts=True)
        out[mask] = np.bincount(tie, weights=rank)[tie] / count[tie] / len(p)  # ties share
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="ttset-cpu-v3")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from tensortune.hardware import current_hardware

    print(f"CPU: {current_hardware().cpu_model}", flush=True)  # beside every figure below
    columns, card = dataset_columns(args.dataset)
    if any(p is None for p in columns["per_store"]):
        raise SystemExit("this study needs every row's features (rebuild the dataset)")
    networks = card_networks(card)
    folds = split_specs(columns, card, "by-network", 0)
    print(f"{args.dataset}: {len(columns['label'])} programs; by-network folds: "
          f"{', '.join(f for f, _ in folds)}; seeds {args.seeds}")  # fmt: skip
    ceiling = measurement_ceiling(columns, card)
    start = time.perf_counter()
    symbols = analyzer_symbols(args.dataset, columns)
    print(f"analyzer symbols of {len(symbols)} programs in {time.perf_counter() - start:.0f} s "
          f"({int(np.isnan(symbols[:, 0]).sum())} traces did not replay)")  # fmt: skip
    latency = np.nan_to_num(symbols[:, 0], nan=math.inf)
    x_plain, x_symbols = program_rows(columns, None), program_rows(columns, symbols)
    arms = {
        "xgb (shipped: pack-sum over blocks)": None,
        "program rows, squared error": ("reg:squarederror", x_plain),
        "program rows, pairwise rank": ("rank:pairwise", x_plain),
        "program rows + analyzer, squared error": ("reg:squarederror", x_symbols),
        "program rows + analyzer, pairwise rank": ("rank:pairwise", x_symbols),
        "analyzer alone (untrained)": "analyzer",
        "xgb and mlp, ranks averaged within each task": "ensemble",
    }
    learned: dict[tuple[str, int, str], np.ndarray] = {}

    def predicted_by(kind: str, seed: int, fold: str, train: np.ndarray,
                     test: np.ndarray) -> np.ndarray:  # fmt: skip
        if (kind, seed, fold) not in learned:
            model = new_model(kind, seed, {}).fit(ProgramSet.from_columns(columns, train))
            learned[kind, seed, fold] = model.predict(ProgramSet.from_columns(columns, test))
        return learned[kind, seed, fold]

    report: dict[str, dict] = {}
    for name, arm in arms.items():
        scores = []
        for seed in range(args.seeds if arm != "analyzer" else 1):
            for fold, spec in folds:
                train, test = split_masks(columns, spec)
                rows = scored_rows(columns, test)
                if arm is None:
                    pred = predicted_by("xgb", seed, fold, train, test)
                elif arm == "analyzer":
                    pred = -latency[test]
                elif arm == "ensemble":
                    pred = sum(ranks_within(predicted_by(k, seed, fold, train, test), rows)
                               for k in ("xgb", "mlp"))  # fmt: skip
                else:
                    pred = fit_predict(*arm, columns, train, test, seed)
                s = score_predictions(rows, pred, networks=networks)
                scores.append([s[m] for m in RANK_METRICS])
        mean, sd = np.mean(scores, axis=0), np.std(scores, axis=0)
        report[name] = {m: float(v) for m, v in zip(RANK_METRICS, mean, strict=True)}
        report[name]["pca_sd"] = float(sd[0])
        print(f"  {name:42s} PCA {mean[0]:.3f} ± {sd[0]:.3f}  top-1 {mean[1]:.3f}  "
              f"top-5 {mean[2]:.3f}", flush=True)  # fmt: skip
    if ceiling:
        print(f"  {'measurement ceiling (one repeat vs the rest)':42s} PCA {ceiling['pca']:.3f}"
              f"          top-1 {ceiling['top1_score']:.3f}  top-5 "
              f"{ceiling['top5_score']:.3f}")  # fmt: skip
    if args.json:
        print(json.dumps({"dataset": args.dataset, "seeds": args.seeds, "arms": report,
                          "measurement_ceiling": ceiling}))  # fmt: skip


if __name__ == "__main__":
    main()
