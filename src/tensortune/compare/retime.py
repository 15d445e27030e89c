"""One clock for a seed's methods: the programs their curves read, timed again side by side.

``bench tune`` runs its methods one after another, each timing its own programs, and a kernel's
timing can move between two runs on one machine by more than the methods differ.  On a shared
2-core Zen 4 guest the same 16 Winograd programs timed a median 1.07-1.46x slower in one
method's run than in another's of the same seed, and a method "reached" the default's final
latency or not by that alone (``benchmarks/RESULTS.md``, stops 67 and 68).

A method's curve reads only its record-breakers: the programs that were, when measured, the
fastest of their task so far in its run.  After a seed's methods have run, every method's
record-breakers are built once and timed again in ``rounds`` rounds, each round timing all of
them in a shuffled order, in one session; each curve is then recomputed from the fastest of
those timings, a task's latency at each point being its fastest re-timed record-breaker found
by then.  Methods are then compared on one clock; the curves as measured in the runs are kept.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path

from tensortune.hardware import Platform
from tensortune.measure.status import run_seconds
from tensortune.workloads.task import Task

Curve = list[tuple[float, int, float | None]]


def record_breakers(store_path: Path) -> list[tuple[int, str, str]]:
    """``(position, task name, trace)`` of each record of a method's store that was faster
    than every earlier record of its task; ``position`` counts the store's records (failed
    ones too) in the order they were measured, from 0."""
    from tensortune.records.sqlite import SQLiteStore

    store = SQLiteStore(str(store_path), create=False)
    try:
        names = {w.id: w.name for w in store.workloads()}
        records = sorted(store.query(), key=lambda r: r.id or 0)
    finally:
        store.close()
    best: dict[str, float] = {}
    out = []
    for position, r in enumerate(records):
        name = names[r.workload_id]
        if r.ok and r.cost < best.get(name, float("inf")):
            best[name] = r.cost
            out.append((position, name, r.trace))
    return out


def records_in(store_path: Path) -> int:
    """How many measurements a method's store holds, failed ones too."""
    from tensortune.records.sqlite import SQLiteStore

    store = SQLiteStore(str(store_path), create=False)
    try:
        return store.count()
    finally:
        store.close()


def retimed_curve(curve: Curve, breakers: Sequence[tuple[int, str, float | None]],
                  weights: dict[str, float]) -> Curve:  # fmt: skip
    """``curve`` with each point's latency recomputed from re-timed record-breakers
    ``(position, task, seconds or None when it failed now)``: Σ weight x the fastest of each
    task's record-breakers among the point's trials; None while a task has none."""
    out: Curve = []
    for wall, trials, _ in curve:
        best: dict[str, float] = {}
        for position, task, seconds in breakers:
            if position < trials and seconds is not None and task in weights:
                best[task] = min(seconds, best.get(task, float("inf")))
        latency = (sum(w * best[t] for t, w in weights.items()) if len(best) == len(weights)
                   else None)  # fmt: skip
        out.append((wall, trials, latency))
    return out


def retime_methods(stores: dict[str, Path], tasks: Sequence[Task], platform: Platform,
                   rounds: int, log_dir: Path | None = None,
                   ) -> dict[str, list[tuple[int, str, float | None]]]:  # fmt: skip
    """Each method's record-breakers (``stores``: its records file) with their re-timed
    seconds, all methods timed in one session (see the module docstring)."""
    from tensortune.compat import BuilderInput, RunnerInput
    from tensortune.measure.session import MeasureSession

    by_name = {t.name: t for t in tasks}
    breakers = {m: [b for b in record_breakers(p) if b[1] in by_name]
                for m, p in stores.items()}  # fmt: skip
    index: dict[tuple[str, str], int] = {}  # one build of a program two methods both found
    cands: list = []  # None: the trace no longer replays on its task (not counted)
    for rows in breakers.values():
        for _, task, trace in rows:
            if (task, trace) not in index:
                index[task, trace] = len(cands)
                cands.append(_replayed(by_name[task].mod, trace))
    seconds: list[list[float]] = [[] for _ in cands]
    with MeasureSession(platform, log_dir=log_dir) as session:
        todo = [i for i, c in enumerate(cands) if c is not None]
        built = session.builder.build([BuilderInput(cands[i].sch.mod, platform.tvm_target)
                                       for i in todo])  # fmt: skip
        # A program that does not build now is not counted; it built in its run.
        artifacts = {i: b.artifact_path for i, b in zip(todo, built, strict=True)
                     if b.error_msg is None}  # fmt: skip
        rng = random.Random(0)
        for _ in range(rounds):
            order = rng.sample(sorted(artifacts), len(artifacts))
            inputs = [
                RunnerInput(artifacts[i], platform.device_type, cands[i].args_info) for i in order
            ]
            for i, future in zip(order, session.runner.run(inputs), strict=True):
                result = future.result()
                # a failed round, or one whose timer read 0, is skipped
                if result.error_msg is None and math.isfinite(s := run_seconds(result.run_secs)):
                    seconds[i].append(s)
    # The fastest round: what moves a timing here only ever slows it (another tenant's load,
    # a thread left on a busy core), so the least slowed round is the least wrong.
    timed = [min(s) if s else None for s in seconds]
    return {m: [(pos, task, timed[index[task, trace]]) for pos, task, trace in rows]
            for m, rows in breakers.items()}  # fmt: skip


def _replayed(mod: object, trace: str) -> object | None:
    """The candidate of ``trace`` on ``mod``, or None where it no longer replays (another
    version of TVM, say)."""
    from tensortune.records.convert import candidate_from_trace

    try:
        return candidate_from_trace(mod, trace)
    except Exception:  # TVM raises its own errors, of many kinds, for a trace that misfits
        return None
