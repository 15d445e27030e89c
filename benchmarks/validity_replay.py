"""ALT's validity filter replayed offline on measured runs (issue 20, item 5).

A run of ``benchmarks/validity_filter.py`` leaves one records store per task, seed and mode
(``WORK/s{seed}-t{task}-{mode}/records.db``).  This script takes the programs a run measured,
in the order it measured them, and replays the filter batch by batch: before each batch, a
``ValidityFilter`` with the given settings is fitted on the batches before it and judges the
batch.  Nothing is measured again, so settings can be compared on the very same programs (a
paired comparison, in seconds), and on runs that chose nothing.  The shares it prints are those
the benchmark's shadow mode measures: failures the filter would have removed (of all, and of
those it judged) and programs that ran it would have dropped.

Replayed on the shadow runs of seeds 4 and 5, the present settings give the figures the live
shadow runs measured (69% of the failures removed, 2.9% of the programs that ran dropped).

Run:  .venv/bin/python benchmarks/validity_replay.py --work vf [--mode plain] [--batch 16]
      [--first 96] [--setting 'max_depth=4,eta=0.3,rounds=40,min_child_weight=1' ...]
(``--first``: the benchmark's ``--trials``, so that a warm run's records, which it adds to the
same store, are left out.)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

THRESHOLDS = (0.03, 0.05, 0.1, 0.2)
# The filter's settings before stop 64, for comparison with today's (the class defaults).
BEFORE = "max_depth=4,eta=0.3,rounds=40,min_child_weight=1"


def _programs(store_path: Path, first: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Per-store features and outcomes of a store's first ``first`` records, in measured order
    (a warm run resumed on the store adds its records after them)."""
    from tensortune.features import per_store_features
    from tensortune.hardware.target import resolve_platform
    from tensortune.records import open_records

    with open_records(f"sqlite:///{store_path}", create=False) as store:
        (workload,) = store.workloads()
        records = list(store.query(workload_id=workload.id))[:first]
        mod = workload.mod()
    feats = per_store_features(mod, resolve_platform(None), [r.trace_json() for r in records])
    kept = [i for i, f in enumerate(feats) if f is not None]
    if len(kept) < len(records):  # the batches then no longer line up with the live run's
        print(f"{store_path}: {len(records) - len(kept)} of {len(records)} traces no longer "
              f"replay and are left out")  # fmt: skip
    return [feats[i] for i in kept], np.array([records[i].ok for i in kept], dtype=bool)


def _parse(setting: str) -> dict[str, int | float]:
    """``k=v,...`` as ``ValidityFilter`` settings, each of its default's type."""
    import inspect

    from tensortune.active.validity import ValidityFilter

    defaults = {k: p.default for k, p in inspect.signature(ValidityFilter).parameters.items()}
    out: dict[str, int | float] = {}
    for item in filter(None, setting.split(",")):
        key, _, value = (part.strip() for part in item.partition("="))
        if key == "threshold":
            raise ValueError("the thresholds are the script's own (THRESHOLDS)")
        if key not in defaults:
            raise ValueError(f"unknown setting {key!r}; ValidityFilter takes "
                             f"{', '.join(k for k in defaults if k != 'threshold')}")  # fmt: skip
        out[key] = type(defaults[key])(value)
    return out


def replay(runs: list[tuple[list[np.ndarray], np.ndarray]], setting: dict, batch: int) -> dict:
    """Counts over all runs, per threshold: failures, those judged and removed; programs that
    ran, those judged and dropped."""
    from tensortune.active.validity import ValidityFilter

    counts = {th: dict.fromkeys(("failed", "failed_judged", "removed", "ran", "ran_judged",
                                 "dropped"), 0) for th in THRESHOLDS}  # fmt: skip
    for feats, ok in runs:
        for start in range(0, len(ok), batch):
            now = slice(start, start + batch)
            for c in counts.values():
                c["failed"] += int((~ok[now]).sum())
                c["ran"] += int(ok[now].sum())
            f = ValidityFilter(**setting).fit(feats[:start], ok[:start]) if start else None
            if f is None or not f.active:
                continue
            p = f.p_valid(feats[now])
            for th, c in counts.items():
                drop = p < th
                c["failed_judged"] += int((~ok[now]).sum())
                c["ran_judged"] += int(ok[now].sum())
                c["removed"] += int((drop & ~ok[now]).sum())
                c["dropped"] += int((drop & ok[now]).sum())
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument(
        "--mode",
        default="shadow",
        choices=["plain", "shadow"],
        help="whose stores (a filter run's lack the programs it dropped)",
    )
    ap.add_argument("--batch", type=int, default=16, help="programs a round (the benchmark's)")
    ap.add_argument("--first", type=int, default=96, help="records of each store to replay")
    ap.add_argument(
        "--setting",
        action="append",
        default=None,
        help=f"ValidityFilter settings, k=v,...; default: today's and '{BEFORE}'",
    )
    args = ap.parse_args()
    try:
        settings = {s or "today's": _parse(s) for s in args.setting or ["", BEFORE]}
    except ValueError as e:
        ap.error(f"--setting: {e}")
    stores = sorted(args.work.glob(f"s*-t*-{args.mode}/records.db"))
    if not stores:
        ap.error(f"no {args.mode} runs' stores under {args.work}")
    runs = [_programs(p, args.first) for p in stores]
    print(f"{len(runs)} runs of {args.mode} under {args.work}: "
          f"{sum(len(ok) for _, ok in runs)} programs, "
          f"{sum(int((~ok).sum()) for _, ok in runs)} failed; batches of {args.batch}")  # fmt: skip
    out = {}
    for name, setting in settings.items():
        counts = replay(runs, setting, args.batch)
        out[name] = counts
        for th, c in counts.items():
            print(f"{name:48s} threshold {th:.2f}: removes "
                  f"{c['removed'] / max(c['failed'], 1):.3f} of all failures "
                  f"({c['removed'] / max(c['failed_judged'], 1):.3f} of those judged), drops "
                  f"{c['dropped'] / max(c['ran'], 1):.3f} of the programs that ran")  # fmt: skip
    (args.work / f"replay-{args.mode}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
