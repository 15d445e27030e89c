"""Pick each task's schedule by timing its best few records again, side by side.

A store's best record is the minimum over many noisy timings taken at different moments of a
shared machine, so it is biased low, and the program behind it is not always the fastest: on
this 2-core machine the best stored ResNet-18 stem convolution re-timed at 5.9 ms while the
third best re-timed at 3.8 ms.  Timing the top few together, now, ranks them on one scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tensortune.hardware import Platform
from tensortune.measure.status import run_seconds
from tensortune.records import Record, RecordStore
from tensortune.workloads.task import Task


@dataclass
class Retimed:
    """``chosen`` (the fastest now) among a task's ``candidates`` best stored records."""

    chosen: Record
    rank: int  # of the chosen record in the store's order, 0 = the stored best (that replays)
    seconds: float  # the chosen record, re-timed
    best_stored_seconds: float | None  # the stored best, re-timed (None: it failed now)
    candidates: int


def retime_best(
    store: RecordStore,
    tasks: list[Task],
    platform: Platform,
    top_k: int,
    *,
    builder: object | None = None,
    runner: object | None = None,
) -> dict[int, Retimed]:
    """Re-time the ``top_k`` best successful records (on the platform's hardware and target) of
    every task that has two or more, in one batch per task; returns the fastest of each, by
    workload id."""
    from tensortune.compat import block_names
    from tensortune.measure.session import MeasureSession
    from tensortune.measure.timing import model_timing
    from tensortune.records.convert import block_renames, candidate_from_trace, renamed_blocks

    chosen: dict[int, Retimed] = {}
    where = {"hardware_id": platform.hardware.id, "target": platform.key}
    # Timed as tuning timed them: kernels whose weights and outputs outgrow L2 cold.
    with MeasureSession(platform, builder=builder, runner=runner,
                        timing=model_timing(platform)) as session:  # fmt: skip
        for task in tasks:
            wid = store.workload_id(task.mod, task.name, create=False)
            if wid is None:
                continue
            stored = list(store.query(workload_id=wid, **where, ok_only=True, best_first=True,
                                      limit=top_k))  # fmt: skip
            if len(stored) < 2:
                continue
            # The stored twin may name its blocks otherwise (another graph of the same model).
            names = block_renames(block_names(store.workload(wid).mod()), block_names(task.mod))
            records, cands = [], []
            for r in stored:
                try:
                    cands.append(candidate_from_trace(task.mod, renamed_blocks(
                        r.trace_json(), names) if names else r.trace))  # fmt: skip
                except Exception:  # no longer replays: the build passes it over too
                    continue
                records.append(r)
            if len(records) < 2:
                continue
            _, ran = session.measure(cands)
            # None for a failed run, and for a time that is not a positive number (a timer
            # that read 0 measured nothing, and would be the fastest)
            secs = [None if r.error_msg is not None or math.isinf(s := run_seconds(r.run_secs))
                    else s for r in ran]  # fmt: skip
            timed = [(s, i) for i, s in enumerate(secs) if s is not None]
            if not timed:
                continue
            seconds, rank = min(timed)
            chosen[wid] = Retimed(records[rank], rank, seconds, secs[0], len(records))
    return chosen
