"""Do features of the code LLVM generates rank held-out networks' programs better?

`feature_limits.py` (issue 21) found that every learned model sits ~24 points of PCA below
the measurement ceiling on held-out networks, that neither the loss nor the draft analyzer's
roofline symbols close it, and named one candidate left untested: what per-store features do
not encode, the machine code LLVM generates from a schedule.  Two programs with the same loop
nest can differ there: whether the innermost loop was vectorized, how many accumulators stay
in registers (a register-blocked micro-kernel) or spill to the stack, how many loads feed each
FMA, whether a shuffle or a gather sits in the hot loop.

This study builds the rows of a dataset for their own target and summarises the assembly
(`tensortune.features.code`), then trains the program-level XGBoost of `feature_limits.py`
(sum and max of the per-store features, the workload and hardware vectors; squared error
weighted toward fast programs) with and without these features and scores both on held-out
networks with TenSet's metrics (mean ± sd over seeds and folds).  A share of the training
rows is built (`--train-share`); every test row is.

`--features lowered` compares `tensortune.features.lowered` instead: the hot loop of TVM's
lowered TIR, read before LLVM runs (no build; ~65 ms a program on average), from the dataset's
`lowered.parquet` (computed first where missing, as `tensortune dataset lower` does); `both`
trains every combination.

Run:  .venv/bin/python benchmarks/code_features.py [--dataset pool] [--seeds 3]
          [--train-share 0.2] [--fractions 0.25,1] [--cache F.npz] [--json F]
          [--features code|lowered|both]
      (a pool program takes ~0.3 s to build: 20% of the pool and its test rows, ~14 minutes on
      2 cores; the features are cached, so a second run only trains)
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from tensortune.features.code import CODE_WIDTH, code_features_batch


def extract(dataset: str, columns: dict, needed: np.ndarray, cache: str | None,
            workers: int) -> np.ndarray:  # fmt: skip
    """Code features of the rows `needed` (NaN elsewhere, and where a build failed or took
    over two minutes), from the cache where it holds them."""
    from tensortune.compat import tvm
    from tensortune.datasets.build import load_workloads
    from tensortune.datasets.shipped import dataset_path

    ids = np.asarray(columns["program_id"])
    out = np.full((len(ids), CODE_WIDTH), np.nan, np.float32)
    known: dict[int, np.ndarray] = {}
    if cache and os.path.exists(cache):
        with np.load(cache) as saved:
            if saved["features"].shape[1] == CODE_WIDTH:
                known = dict(zip(saved["program_id"].tolist(), saved["features"], strict=True))
    todo, first = [], {}
    for i, pid in enumerate(ids.tolist()):
        # A program measured on several machines with one target is built once.
        key = (columns["task_id"][i], columns["target"][i], columns["trace"][i])
        if pid in known and not np.isnan(known[pid][0]):
            out[i] = known[pid]
            first.setdefault(key, i)
        elif needed[i] and key not in first:
            first[key] = i
            todo.append(i)
    modules = load_workloads(dataset_path(dataset))

    def replayed():
        for i in todo:
            sch = tvm.s_tir.Schedule(modules[columns["task_id"][i]])
            try:
                tvm.s_tir.Trace.apply_json_to_schedule(json.loads(columns["trace"][i]), sch)
                mod = sch.mod
            except Exception:  # a trace this TVM cannot replay: its build fails, NaN stays
                mod = None
            yield mod, json.loads(columns["target"][i])

    start = time.perf_counter()
    for n, (i, row) in enumerate(zip(todo, code_features_batch(replayed(), workers),
                                     strict=True)):  # fmt: skip
        if row is not None:
            out[i] = row
        if (n + 1) % 1000 == 0 or n + 1 == len(todo):
            print(f"  built {n + 1} of {len(todo)} ({time.perf_counter() - start:.0f} s)",
                  flush=True)  # fmt: skip
            if cache:  # an interrupted study resumes from here
                np.savez_compressed(cache, program_id=ids, features=out)
    for i in np.flatnonzero(needed & np.isnan(out[:, 0])):
        key = (columns["task_id"][i], columns["target"][i], columns["trace"][i])
        out[i] = out[first[key]] if key in first else out[i]
    if cache and todo:
        np.savez_compressed(cache, program_id=ids, features=out)
    return out


def extract_lowered(dataset: str, columns: dict, workers: int) -> np.ndarray:
    """Lowered-loop features (`tensortune.features.lowered`) of every row: the dataset's
    `lowered.parquet`, computed first where it lacks some (`tensortune dataset lower`;
    ~65 ms a program on average, in the measurement pool's workers, no LLVM)."""
    from tensortune.datasets.lowered import lower_dataset, read_lowered

    start = time.perf_counter()
    report = lower_dataset(dataset, workers=workers)
    print(f"  lowered {report['lowered_now']} programs in {time.perf_counter() - start:.0f} s "
          f"({report['failed']} could not be)", flush=True)  # fmt: skip
    return read_lowered(dataset, columns["program_id"])


def per_task_share(mask: np.ndarray, tasks: np.ndarray, share: float, seed: int) -> np.ndarray:
    """A seeded random `share` of each task's rows in `mask` (at least 2 of each)."""
    if share >= 1:
        return mask.copy()
    rng = np.random.default_rng(seed)
    keep = np.zeros_like(mask)
    for t in np.unique(tasks[mask]):
        idx = np.flatnonzero(mask & (tasks == t))
        keep[rng.choice(idx, min(max(2, round(share * len(idx))), len(idx)), replace=False)] = True
    return keep


def main() -> None:
    from feature_limits import fit_predict, program_rows

    from tensortune.compare.splits import split_specs
    from tensortune.train.metrics import RANK_METRICS, score_predictions
    from tensortune.train.trainer import card_networks, dataset_columns, scored_rows, split_masks

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="pool")
    ap.add_argument(
        "--split",
        default="by-network:resnet50,gpt2-block",
        help="a `train --split` spec, or `by-network` for every network in turn",
    )
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument(
        "--train-share",
        type=float,
        default=0.2,
        help="the random share of each training task's rows that is built (a pool "
        "program takes ~0.3 s to build: all 19,201 take ~50 min on 2 cores)",
    )
    ap.add_argument(
        "--fractions",
        default="0.25,1",
        help="random shares of the built training rows (per task) to fit on",
    )
    ap.add_argument("--cache", default=None, help="an .npz to keep the code features in")
    ap.add_argument(
        "--features",
        choices=("code", "lowered", "both"),
        default="code",
        help="code: the assembly's summary (a build each); lowered: the hot loop of TVM's "
        "lowered TIR (no LLVM, ~65 ms a program on average); both",
    )
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from tensortune.hardware import current_hardware

    print(f"CPU: {current_hardware().cpu_model}", flush=True)  # beside every figure below
    columns, card = dataset_columns(args.dataset)
    networks = card_networks(card)
    tasks = np.asarray(columns["task_id"])
    folds = (split_specs(columns, card, "by-network", 0) if args.split == "by-network"
             else [(args.split, args.split)])  # fmt: skip
    masks = {}
    for fold, spec in folds:
        train, test = split_masks(columns, spec)
        masks[fold] = per_task_share(train, tasks, args.train_share, seed=1234), test
    needed = np.logical_or.reduce([a | b for a, b in masks.values()])
    print(f"{args.dataset}: {len(tasks)} programs; folds: {', '.join(masks)}; "
          f"{int(needed.sum())} to build", flush=True)  # fmt: skip
    extra = {}
    if args.features in ("code", "both"):
        extra["code"] = extract(args.dataset, columns, needed, args.cache, args.workers)
    if args.features in ("lowered", "both"):
        extra["lowered"] = extract_lowered(args.dataset, columns, args.workers)
    # Rows without per-store features (a trace their extraction could not replay) and rows
    # that did not build are left out of every arm, so that all arms see the same rows.
    no_store = np.array([p is None for p in columns["per_store"]])
    failed = np.logical_or.reduce([np.isnan(f[:, 0]) for f in extra.values()])
    missing = failed | no_store
    print(f"{int((needed & failed).sum())} programs did not build, "
          f"{int(no_store.sum())} have no per-store features; both are left out of every arm",
          flush=True)  # fmt: skip
    x_plain = program_rows(columns, None)
    logged = {k: np.log1p(np.maximum(np.nan_to_num(f), 0.0)) for k, f in extra.items()}
    workload = np.asarray(columns["workload_embedding"], np.float32)
    arms = {"program rows": x_plain}
    for k, f in logged.items():
        arms[f"program rows + {k}"] = np.concatenate([x_plain, f], axis=1)
        arms[f"{k} + workload only"] = np.concatenate([f, workload], axis=1)
    if len(logged) > 1:
        arms["program rows + " + " + ".join(logged)] = np.concatenate([x_plain, *logged.values()],
                                                                      axis=1)  # fmt: skip
    report: dict = {
        "dataset": args.dataset,
        "split": args.split,
        "folds": list(masks),
        "train_share": args.train_share,
        "features": args.features,
        "seeds": args.seeds,
        "arms": {},
    }
    for fraction in [float(f) for f in args.fractions.split(",")]:
        for name, x in arms.items():
            scores = []
            for seed in range(args.seeds):
                for train_all, test in masks.values():
                    train = per_task_share(train_all & ~missing, tasks, fraction, seed)
                    pred = fit_predict("reg:squarederror", x, columns, train, test & ~missing,
                                       seed)  # fmt: skip
                    s = score_predictions(scored_rows(columns, test & ~missing), pred,
                                          networks=networks)  # fmt: skip
                    scores.append([s[m] for m in RANK_METRICS])
            mean, sd = np.mean(scores, axis=0), np.std(scores, axis=0)
            report["arms"][f"{name} @ {fraction:g}"] = {
                **{m: float(v) for m, v in zip(RANK_METRICS, mean, strict=True)},
                **{f"{m}_sd": float(v) for m, v in zip(RANK_METRICS, sd, strict=True)},
            }
            print(f"  {fraction:>5g}  {name:22s} PCA {mean[0]:.3f} ± {sd[0]:.3f}  top-1 "
                  f"{mean[1]:.3f} ± {sd[1]:.3f}  top-5 {mean[2]:.3f}", flush=True)  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
