"""Pick each task's schedule by timing its best few records again, side by side.

A store's best record is the minimum over many noisy timings taken at different moments of a
shared machine, so it is biased low, and the program behind it is not always the fastest: on
this 2-core machine the best stored ResNet-18 stem convolution re-timed at 5.9 ms while the
third best re-timed at 3.8 ms.  Timing the top few together, now, ranks them on one scale.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tensortune.hardware import runtime_threads, target_key
from tensortune.records.schema import Record
from tensortune.records.storage import RecordStore
from tensortune.workloads.task import Task


@dataclass
class Retimed:
    """``chosen`` (the fastest now) among a task's ``candidates`` best stored records."""

    chosen: Record
    rank: int  # of the chosen record in the store's order, 0 = the stored best
    seconds: float  # the chosen record, re-timed
    best_stored_seconds: float | None  # the stored best, re-timed (None: it failed now)
    candidates: int


def retime_best(
    store: RecordStore,
    tasks: list[Task],
    target: dict,
    hardware_id: str,
    top_k: int,
    *,
    builder: object | None = None,
    runner: object | None = None,
) -> dict[int, Retimed]:
    """Re-time the ``top_k`` best successful records of every task that has two or more, in one
    batch per task; returns the fastest of each, by workload id."""
    from tensortune.measure.batch import measure_batch
    from tensortune.measure.builder import PersistentBuilder
    from tensortune.measure.runner import PersistentRunner
    from tensortune.records.convert import candidate_from_trace

    tkey = target_key(target)
    own = []
    if builder is None:
        builder = PersistentBuilder()
        own.append(builder)
    if runner is None:
        runner = PersistentRunner(num_threads=runtime_threads(target))
        own.append(runner)
    chosen: dict[int, Retimed] = {}
    try:
        for task in tasks:
            wid = store.workload_id(task.mod, task.name, create=False)
            if wid is None:
                continue
            records = list(store.query(workload_id=wid, hardware_id=hardware_id, target=tkey,
                                       ok_only=True, best_first=True, limit=top_k))  # fmt: skip
            if len(records) < 2:
                continue
            cands = [candidate_from_trace(task.mod, r.trace) for r in records]
            _, ran = measure_batch(builder, runner, cands, target)
            secs = [statistics.median(float(s) for s in r.run_secs) if r.run_secs else None
                    for r in ran]  # fmt: skip
            timed = [(s, i) for i, s in enumerate(secs) if s is not None]
            if not timed:
                continue
            seconds, rank = min(timed)
            chosen[wid] = Retimed(records[rank], rank, seconds, secs[0], len(records))
    finally:
        for worker in own:
            worker.close()
    return chosen
