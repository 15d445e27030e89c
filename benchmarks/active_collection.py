"""Online active collection against random collection at 20x the budget (issue 20, item 4).

Method, all on one hardware configuration the shipped dataset does not hold (default
``avx2-2c``) and in one records store per arm, so nothing is shared between them:
  test     the held-out networks' heaviest tasks, ``--test-per-task`` programs each
           (``dataset collect``: random programs, then evolved ones), measured first;
  active   the pool networks' heaviest tasks (held-out networks' kernels excluded), ``--budget``
           programs each, chosen by ``--selector`` in ``--rounds`` rounds
           (``dataset collect --sampler``);
  random   the same tasks, ``--ratio`` x ``--budget`` random programs each (TenSet's sampling).
Each arm's records become a dataset; an XGBoost model is trained on each (``--seeds`` seeds)
and scored on the test rows with TenSet's metrics (PCA, top-1, top-5 score).  With ``--prior
DATASET`` (e.g. ``default``) each arm's model also learns from that dataset's rows of other
CPUs (this CPU's, and every held-out network's task, left out: ``prior_rows``), as a user
with a new CPU would train; a row ``prior`` scores those rows alone.  The selector still
judges with a model of its own picks.  Every
measurement is timed with nothing else running; the script prints what it measured, the
time each arm took and the scores (mean ± sd over seeds).

Run:  .venv/bin/python benchmarks/active_collection.py --work ac [--config avx2-2c]
      [--budget 8] [--ratio 20] [--selector balto] [--prior default]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

POOL = ["resnet18", "mobilenetv2", "vit-tiny", "bert-base-s64"]
HELD_OUT = ["resnet50", "gpt2-block"]


def _timed(what: str, fn) -> float:
    start = time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    print(f"{what}: {seconds / 60:.1f} min", flush=True)
    return seconds


def main() -> None:
    from tensortune.collect import collect
    from tensortune.collect.active import collect_active
    from tensortune.compare.active_learning import load_study_data
    from tensortune.costmodel.data import concat_programs
    from tensortune.costmodel.registry import new_model
    from tensortune.datasets.build import build_dataset
    from tensortune.hardware.fingerprint import current_hardware
    from tensortune.train import metrics

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--config", default="avx2-2c")
    ap.add_argument("--selector", default="balto")
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--ratio", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--heaviest", type=int, default=6)
    ap.add_argument("--test-heaviest", type=int, default=8)
    ap.add_argument("--test-per-task", type=int, default=64)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument(
        "--prior",
        default=None,
        help="a dataset whose other CPUs' rows every arm's model learns from too (e.g. default)",
    )
    args = ap.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    print(f"CPU: {current_hardware().cpu_model}; config {args.config}; pool {POOL}, "
          f"held out {HELD_OUT}")  # fmt: skip
    stores = {arm: f"sqlite:///{work / (arm + '.db')}" for arm in ("test", "active", "random")}
    seconds = {
        "test": _timed("test rows", lambda: collect(
            HELD_OUT, configs=[args.config], programs_per_task=args.test_per_task,
            evolved_share=0.25, records=stores["test"], work_dir=work / "w",
            heaviest=args.test_heaviest)),
        "active": _timed(f"{args.selector} collection", lambda: collect_active(
            POOL, config=args.config, selector=args.selector, budget=args.budget,
            rounds=args.rounds, records=stores["active"], work_dir=work / "w",
            heaviest=args.heaviest, exclude=[*HELD_OUT, "bert-base"])),
        "random": _timed("random collection", lambda: collect(
            POOL, configs=[args.config], programs_per_task=args.ratio * args.budget,
            evolved_share=0.0, records=stores["random"], work_dir=work / "w",
            heaviest=args.heaviest, exclude=[*HELD_OUT, "bert-base"])),
    }  # fmt: skip
    for arm, url in stores.items():
        build_dataset(
            url, work / f"ds-{arm}", held_out=HELD_OUT if arm == "test" else None, overwrite=True
        )  # a rerun of the benchmark rebuilds its own
    report = {"config": args.config, "selector": args.selector, "budget": args.budget,
              "ratio": args.ratio, "prior": args.prior, "seconds": seconds, "arms": {}}  # fmt: skip
    for arm in ("prior", "active", "random") if args.prior else ("active", "random"):
        data = load_study_data(work / f"ds-{'active' if arm == 'prior' else arm}", HELD_OUT,
                               test_dataset=work / "ds-test", prior=args.prior)  # fmt: skip
        parts = [] if arm == "prior" else [data.pool.labelled(range(len(data.pool)))]
        train = concat_programs([data.prior, *parts]) if args.prior else parts[0]
        runs = []
        for seed in range(args.seeds):
            model = new_model("xgb", seed).fit(train)
            s = metrics.score_predictions(data.test_rows, model.predict(data.test),
                                          networks=data.networks)  # fmt: skip
            runs.append({k: s[k] for k in ("pca", "top1_score", "top5_score")})
        summary = {k: (statistics.mean(r[k] for r in runs),
                       statistics.pstdev(r[k] for r in runs)) for k in runs[0]}  # fmt: skip
        measured = 0 if arm == "prior" else len(data.pool)
        report["arms"][arm] = {"programs": measured, "prior_programs": len(train) - measured,
                               "runs": runs, "summary": summary}  # fmt: skip
        print(f"{arm:7s} {measured:6d} programs (+{len(train) - measured} prior)  " + "  ".join(
            f"{k} {m:.3f} ± {sd:.3f}" for k, (m, sd) in summary.items()), flush=True)  # fmt: skip
    (work / "report.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
