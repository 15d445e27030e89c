"""Re-measure a sample of a records store and compare with what it holds.

For every workload with successful records for the target: its best record and ``--others``
random ones are rebuilt from their traces and timed again (``PersistentRunner`` with
``--threads`` threads, 3 repeats of >= 10 ms, as ``dataset collect`` times).  Ratio = stored
cost / re-measured cost.  A healthy store sits around 1 within the machine's noise; a tail of
large ratios means timings inflated while they were collected (e.g. another process holding a
core that a multi-threaded kernel waits for).

Run:  .venv/bin/python benchmarks/recheck_records.py /work/data/collect.db
      --target '{"kind":"llvm","mcpu":"skylake-avx512","num-cores":2}' [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

from tensortune.hardware import resolve_platform
from tensortune.measure.batch import measure_batch
from tensortune.measure.builder import PersistentBuilder
from tensortune.measure.runner import PersistentRunner, TimingConfig
from tensortune.records.convert import candidate_from_trace
from tensortune.records.sqlite import SQLiteStore


def _sample(store: SQLiteStore, tkey: str, others: int, rng: random.Random) -> list[tuple]:
    picked = []
    for w in store.workloads():
        records = sorted(store.query(workload_id=w.id, target=tkey, ok_only=True),
                         key=lambda r: r.cost)  # fmt: skip
        if not records:
            continue
        for r in [records[0], *rng.sample(records[1:], min(others, len(records) - 1))]:
            picked.append((w.name, r.cost, candidate_from_trace(w.mod(), r.trace)))
    return picked


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--target", required=True)
    ap.add_argument("--threads", type=int, default=None, help="default: the target's num-cores")
    ap.add_argument(
        "--others", type=int, default=1, help="random records per task besides the best"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show", type=int, default=10, help="largest ratios to list")
    args = ap.parse_args()
    from tensortune.hardware import current_hardware

    print(f"CPU: {current_hardware().cpu_model}", flush=True)  # beside every figure below

    platform = resolve_platform(args.target)
    threads = args.threads or platform.threads
    store = SQLiteStore(args.store, create=False)
    picked = _sample(store, platform.key, args.others, random.Random(args.seed))
    store.close()
    builder = PersistentBuilder()
    runner = PersistentRunner(TimingConfig(repeat=3), num_threads=threads)
    rows = []
    try:
        for i in range(0, len(picked), 32):
            chunk = picked[i : i + 32]
            _, ran = measure_batch(builder, runner, [c for _, _, c in chunk], platform)
            for (name, stored, _), r in zip(chunk, ran, strict=True):
                if r.run_secs:
                    now = statistics.median(float(s) for s in r.run_secs)
                    rows.append((stored / now, name, stored, now))
    finally:
        builder.close()
        runner.close()
    if not rows:
        raise SystemExit("no record of this target could be re-measured")
    rows.sort()
    ratios = [r[0] for r in rows]
    q = statistics.quantiles(ratios, n=10)
    print(f"{args.store}, target {json.dumps(platform.target)}, {threads} thread(s): "
          f"{len(rows)} records re-measured (each task's best + {args.others} random)")  # fmt: skip
    print(f"stored / re-measured: median {statistics.median(ratios):.2f}, 10th {q[0]:.2f}, "
          f"90th {q[-1]:.2f}; > 2: {sum(x > 2 for x in ratios)}, "
          f"< 0.5: {sum(x < 0.5 for x in ratios)}")  # fmt: skip
    for ratio, name, stored, now in reversed(rows[-args.show :]):
        print(f"  {ratio:8.1f}  {name:45s} stored {stored * 1e6:10.1f} us, now {now * 1e6:9.1f} us")


if __name__ == "__main__":
    main()
