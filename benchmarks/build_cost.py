"""Why one search method spends longer building than another: the programs, or the batches?

Reads the stores a ``tensortune bench tune`` run left in its work directory, draws the same
number of measured programs from each method at random, and builds them again with the
``PersistentBuilder`` (2 workers) in batches of 16 (draft-then-verify's round) and of 64
(MetaSchedule's default round), methods and batch sizes in rotating order, ``--repeats`` times.
Reports the median wall seconds per program for each method and batch size.

Run:  .venv/bin/python benchmarks/build_cost.py WORK_DIR [--methods default,draft]
      [--programs 64] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from tensortune.compat import BuilderInput, tvm
from tensortune.measure.builder import PersistentBuilder
from tensortune.records.convert import candidate_from_trace
from tensortune.records.sqlite import SQLiteStore

BATCHES = (16, 64)


def _programs(store_path: Path, count: int, rng: random.Random) -> list[BuilderInput]:
    store = SQLiteStore(str(store_path), create=False)
    try:
        records = list(store.query(ok_only=True))
        inputs = []
        for r in rng.sample(records, min(count, len(records))):
            cand = candidate_from_trace(store.workload(r.workload_id).mod(), r.trace)
            inputs.append(BuilderInput(cand.sch.mod, tvm.target.Target(json.loads(r.target))))
        return inputs
    finally:
        store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work_dir", type=Path)
    ap.add_argument("--methods", default="default,draft")
    ap.add_argument("--programs", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    rng = random.Random(args.seed)
    methods = args.methods.split(",")
    programs = {m: _programs(args.work_dir / m / "records.db", args.programs, rng) for m in methods}
    builder = PersistentBuilder(max_workers=2)
    builder.build(programs[methods[0]][:2])  # workers warm, as in a tuning run
    per_program: dict[tuple[str, int], list[float]] = {}
    combos = [(m, b) for m in methods for b in BATCHES]
    try:
        for rep in range(args.repeats):
            for m, batch in combos[rep % len(combos) :] + combos[: rep % len(combos)]:
                todo = programs[m]
                start = time.perf_counter()
                for i in range(0, len(todo), batch):
                    builder.build(todo[i : i + batch])
                per_program.setdefault((m, batch), []).append(
                    (time.perf_counter() - start) / len(todo)
                )
    finally:
        builder.close()
    print(f"{args.work_dir}: {args.programs} random measured programs per method, "
          f"PersistentBuilder(2 workers), median of {args.repeats} rotating repeats")  # fmt: skip
    print(f"{'method':12s} " + " ".join(f"{f'batch {b}':>12s}" for b in BATCHES))
    for m in methods:
        cells = [f"{statistics.median(per_program[m, b]):10.3f} s" for b in BATCHES]
        print(f"{m:12s} " + " ".join(cells))


if __name__ == "__main__":
    main()
