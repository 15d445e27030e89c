"""Why one search method spends longer building than another: the programs, or the batches?

Reads the stores a ``tensortune bench tune`` run left in its work directory, draws the same
number of measured programs from each method at random, and builds them again with the
``PersistentBuilder`` (2 workers) in batches of 16 (draft-then-verify's round) and of 64
(MetaSchedule's default round), methods and batch sizes in rotating order, ``--repeats`` times.
Reports the median wall seconds per program for each method and batch size.

``--by-unroll`` asks the next question: pooling the methods' programs, does a program's
explicit auto-unroll step (MetaSchedule samples 0, 16, 64 or 512) set its build time?  It
draws ``--programs`` of each step and builds them in batches of 16, steps in rotating order.

Run:  .venv/bin/python benchmarks/build_cost.py WORK_DIR [--methods default,draft]
      [--programs 64] [--repeats 3] [--by-unroll]
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


def unroll_step(trace_json: str) -> int | None:
    """The auto-unroll step a trace annotates (its ``SampleCategorical`` decision), if any."""
    insts, decisions = json.loads(trace_json)
    decided = {int(i): d for i, d in decisions}
    sampled: dict[str, tuple[list, int | None]] = {}
    for i, (kind, inputs, attrs, outputs, *_) in enumerate(insts):
        if kind == "SampleCategorical":
            sampled[outputs[0]] = (attrs[0], decided.get(i))
        elif kind == "Annotate" and attrs and "unroll_explicit" in str(attrs[0]):
            choices, pick = sampled.get(inputs[1], (None, None))
            return None if pick is None else int(choices[pick])
    return None


def _inputs(store: SQLiteStore, records: list) -> list[BuilderInput]:
    out = []
    for r in records:
        cand = candidate_from_trace(store.workload(r.workload_id).mod(), r.trace)
        out.append(BuilderInput(cand.sch.mod, tvm.target.Target(json.loads(r.target))))
    return out


def _programs(store_path: Path, count: int, rng: random.Random) -> list[BuilderInput]:
    store = SQLiteStore(str(store_path), create=False)
    try:
        records = list(store.query(ok_only=True))
        return _inputs(store, rng.sample(records, min(count, len(records))))
    finally:
        store.close()


def _by_unroll(work_dir: Path, methods: list[str], count: int, rng: random.Random
               ) -> dict[str, list[BuilderInput]]:  # fmt: skip
    stores = [SQLiteStore(str(work_dir / m / "records.db"), create=False) for m in methods]
    try:
        by_step: dict[int, list[tuple[SQLiteStore, object]]] = {}
        for store in stores:
            for r in store.query(ok_only=True):
                step = unroll_step(r.trace)
                if step is not None:
                    by_step.setdefault(step, []).append((store, r))
        groups = {}
        for step in sorted(by_step):
            picked = rng.sample(by_step[step], min(count, len(by_step[step])))
            groups[f"unroll {step}"] = [_inputs(store, [r])[0] for store, r in picked]
        return groups
    finally:
        for store in stores:
            store.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("work_dir", type=Path)
    ap.add_argument("--methods", default="default,draft")
    ap.add_argument("--programs", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)  # a median of two is their mean
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--by-unroll", action="store_true")
    args = ap.parse_args()
    from tensortune.hardware import current_hardware

    print(f"CPU: {current_hardware().cpu_model}", flush=True)  # beside every figure below

    rng = random.Random(args.seed)
    methods = args.methods.split(",")
    if args.by_unroll:
        programs = _by_unroll(args.work_dir, methods, args.programs, rng)
        batches: tuple[int, ...] = (16,)
    else:
        programs = {m: _programs(args.work_dir / m / "records.db", args.programs, rng)
                    for m in methods}  # fmt: skip
        batches = BATCHES
    groups = list(programs)
    builder = PersistentBuilder(max_workers=2)
    builder.build(programs[groups[0]][:2])  # workers warm, as in a tuning run
    per_program: dict[tuple[str, int], list[float]] = {}
    combos = [(g, b) for g in groups for b in batches]
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
    what = f"per auto-unroll step, pooled over {args.methods}" if args.by_unroll else "per method"
    print(f"{args.work_dir}: up to {args.programs} random measured programs {what}, "
          f"PersistentBuilder(2 workers), median of {args.repeats} rotating repeats, "
          "seconds of wall time per program")  # fmt: skip
    print(f"{'programs':16s} " + " ".join(f"{f'batch {b}':>12s}" for b in batches))
    for g in groups:
        cells = [f"{statistics.median(per_program[g, b]):10.3f} s" for b in batches]
        print(f"{g + f' ({len(programs[g])})':16s} " + " ".join(cells))


if __name__ == "__main__":
    main()
