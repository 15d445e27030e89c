"""``tensortune.transfer``: tune a model's kernels with schedules tuned for other models.

Transfer-tuning (Gibson & Cano, PACT 2022) in place of search: every kernel of the target takes
the best schedules of same-class kernels from other records stores (``transfer.sources``),
replayed on its own shapes (``transfer.apply``).  The candidates are ranked by the cost model
shipped for the target (the paper times every pair; a budget of ``per_kernel`` keeps the time
bounded for kernels with many same-class sources), built and timed standalone with the
project's measurement, and written to the records store with where each came from
(``Record.origin``).  The untuned kernel is timed too, and the program ``compile`` would build
a kernel with no record from (``deploy.unrecorded``, origin ``fallback``): ``compile`` then
takes each kernel's fastest record, so a kernel that no transferred schedule fits or speeds up
is built as without transfer, not from its bare loops.

Resuming is the default: a candidate whose trace the store already holds for the kernel is not
measured again, and the summary is read back from the store.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tensortune.errors import (
    about,
    check_count,
    check_flags,
    interrupted,
    interruptible,
)
from tensortune.hardware import Platform, resolve_platform
from tensortune.records import DEFAULT_URL, RecordStore, records_from
from tensortune.records.schema import origin_of, trace_hash
from tensortune.transfer.apply import EXACT, INVALID, REFIT, transfer_trace
from tensortune.transfer.classes import KernelClass, epilogue_blocks, kernel_class
from tensortune.transfer.sources import SourceSchedule, SourceStores, source_schedules

if TYPE_CHECKING:
    from tensortune.measure.runner import TimingConfig
    from tensortune.measure.session import MeasureSession
    from tensortune.workloads.task import Task

DEFAULT_PER_KERNEL = 8
UNTUNED_ORIGIN = json.dumps({"kind": "untuned"})
FALLBACK_ORIGIN = json.dumps({"kind": "fallback"})


@dataclass
class KernelTransfer:
    """What transfer did for one kernel: its class, how its same-class sources replayed, what
    was measured, and the untuned, fallback and best transferred standalone latencies."""

    name: str
    weight: int
    kernel_class: str
    sources: int = 0  # same-class source schedules found
    exact: int = 0  # replayed unchanged
    refit: int = 0  # replayed with re-fitted tiles or re-drawn compute locations
    invalid: int = 0  # did not replay, or a postprocessor refused the result
    measured: int = 0  # transferred candidates timed (this run and earlier ones)
    failed: int = 0  # of those, the ones that did not build, run or compute the right output
    untuned_seconds: float | None = None
    best_seconds: float | None = None  # the fastest transferred candidate
    source: str | None = None  # the source workload of that candidate
    source_store: str | None = None
    # Sources of the same core but a shorter epilogue, tried where same-class ones gave fewer
    # than ``per_kernel`` candidates (the target's extra epilogue blocks inlined first).
    relaxed: int = 0
    # The program a kernel with no record is built from (deploy.unrecorded), where that is not
    # the bare loops.
    fallback_seconds: float | None = None
    # The fastest record of another origin (a tuner's, an import's): the store may be the one
    # ``tune`` writes, and ``compile`` takes whichever record is fastest.
    tuned_seconds: float | None = None

    @property
    def chosen_seconds(self) -> float | None:
        """What ``compile`` builds with: the fastest of the untuned, fallback, tuned and best
        transferred programs."""
        options = [s for s in (self.untuned_seconds, self.fallback_seconds, self.tuned_seconds,
                               self.best_seconds) if s is not None]  # fmt: skip
        return min(options) if options else None

    @property
    def took_transferred(self) -> bool:
        """Whether ``compile`` builds the kernel with a transferred schedule."""
        return self.best_seconds is not None and self.chosen_seconds == self.best_seconds

    @property
    def taken_from(self) -> str:
        """Where the program ``compile`` builds the kernel with comes from: the source workload
        of a transferred schedule, ``tuned``, ``fallback`` or ``untuned`` (``-``: none timed)."""
        if self.chosen_seconds is None:
            return "-"
        if self.took_transferred:
            return self.source or "-"
        if self.chosen_seconds == self.tuned_seconds:
            return "tuned"
        return "fallback" if self.chosen_seconds == self.fallback_seconds else "untuned"

    @property
    def speedup(self) -> float | None:
        if self.untuned_seconds is None or self.chosen_seconds is None:
            return None
        return self.untuned_seconds / self.chosen_seconds


@dataclass
class TransferResult:
    """What ``transfer`` did: per kernel (``tasks``) what replayed and what ``compile`` will
    build it with, why candidates did not replay, and with a model its end-to-end latency
    untuned and with the store's best schedules."""

    records_url: str
    target: dict
    hardware_id: str
    per_kernel: int
    search_seconds: float  # wall time of replay + build + timing in this run
    tasks: list[KernelTransfer] = field(default_factory=list)
    invalid_reasons: dict[str, int] = field(default_factory=dict)
    # With a model: its end-to-end latency untuned and with the store's best schedules.
    model: str | None = None
    untuned_e2e: float | None = None
    transferred_e2e: float | None = None

    @property
    def e2e_speedup(self) -> float | None:
        if self.untuned_e2e is None or not self.transferred_e2e:
            return None
        return self.untuned_e2e / self.transferred_e2e

    def weighted_seconds(self, *, partial: bool = False) -> tuple[float | None, float | None]:
        """Σ weight x latency over the kernels, untuned and as ``compile`` builds them
        (``chosen_seconds``): standalone kernels' estimate of the model's latency.  None while
        a kernel lacks either time, unless ``partial``: then both sums run over the kernels
        that have both, so that they compare."""
        both = [k for k in self.tasks
                if k.untuned_seconds is not None and k.chosen_seconds is not None]  # fmt: skip
        if len(both) < len(self.tasks) and not partial:
            return None, None
        return (
            sum(k.weight * k.untuned_seconds for k in both),  # type: ignore[operator]
            sum(k.weight * k.chosen_seconds for k in both),
        )  # type: ignore[operator]

    def outcomes(self) -> dict[str, int]:
        """Replays by outcome, and how many came from a shorter-epilogue class."""
        return {k: sum(getattr(t, k) for t in self.tasks)
                for k in (EXACT, REFIT, INVALID, "relaxed")}  # fmt: skip

    def to_dict(self) -> dict:
        tasks = [{**dataclasses.asdict(t), "chosen_seconds": t.chosen_seconds,
                  "speedup": t.speedup, "taken_from": t.taken_from}
                 for t in self.tasks]  # fmt: skip
        untuned, chosen = self.weighted_seconds()
        return {**dataclasses.asdict(self), "tasks": tasks, "outcomes": self.outcomes(),
                "e2e_speedup": self.e2e_speedup, "weighted_untuned_seconds": untuned,
                "weighted_chosen_seconds": chosen}  # fmt: skip


OnKernel = Callable[[int, KernelTransfer], None]


def transfer(
    sources: SourceStores,
    workloads: Sequence[str | Task] | None = None,
    *,
    model: object | None = None,
    workloads_from: str | os.PathLike | None = None,
    records: str | RecordStore = DEFAULT_URL,
    target: dict | str | Platform | None = None,
    per_kernel: int = DEFAULT_PER_KERNEL,
    work_dir: str | os.PathLike = "tensortune-work",
    timing: TimingConfig | None = None,
    fast_math: bool = True,
    winograd: bool = True,
    input_shapes: dict[str, list[int]] | None = None,
    end_to_end: bool = True,
    rounds: int = 3,
    progress: OnKernel | None = None,
) -> TransferResult:
    """Transfer-tune the kernels of ``model`` (or of ``workloads`` / ``workloads_from``) with
    the best schedules of same-class kernels in the ``sources`` records stores (URLs or open
    stores), at most ``per_kernel`` timed per kernel, into ``records``.  A model is loaded as
    ``tune`` loads it (``fast_math``, ``winograd``, ``input_shapes``): its tasks are those
    ``tune`` and ``compile`` work on with the same settings.

    With a model and ``end_to_end``, the model is then built with each kernel's fastest record
    and timed against its untuned build (``compile_model``, ``rounds`` rounds).
    ``progress(index, kernel)`` is called after each kernel.
    """
    # Checked now, not after every kernel was measured (``rounds`` is compile_model's).
    check_count(per_kernel, "per_kernel")
    check_count(rounds, "rounds")
    check_flags(fast_math=fast_math, winograd=winograd, end_to_end=end_to_end)
    from tensortune.workloads.resolve import resolve_tasks

    with about("target"):  # a CPU that cannot run it: refused before the model loads
        platform = resolve_platform(target)
        platform.check_runs_here()
    with about("sources"):  # before the model, which takes seconds to load
        by_class = source_schedules(sources, platform)
    loaded = model
    if model is not None and not hasattr(model, "tasks"):
        from tensortune.workloads.models import load_model

        with about("model"):
            loaded = load_model(model, target=platform.tvm_target, fast_math=fast_math,
                                winograd=winograd, input_shapes=input_shapes)  # fmt: skip
    tasks = resolve_tasks(workloads, model=loaded, workloads_from=workloads_from,
                          platform=platform, fast_math=fast_math, winograd=winograd,
                          input_shapes=None if loaded is not None else input_shapes)  # fmt: skip
    with records_from(records) as store:
        from tensortune.measure.session import MeasureSession
        from tensortune.measure.timing import model_timing

        start = time.perf_counter()
        # Timed as tune times them: the records land in the store the tuned build reads.
        # The first Ctrl-C lets the kernel being timed finish and be recorded.
        with interruptible(graceful=True), \
                MeasureSession(platform, log_dir=Path(work_dir) / "logs",
                               timing=timing or model_timing(platform),
                               check_correctness=True) as session:  # fmt: skip
            kernels, reasons = transfer_tasks(store, tasks, platform, session, by_class,
                                              per_kernel=per_kernel, progress=progress)  # fmt: skip
        result = TransferResult(store.url, platform.target, platform.hardware.id, per_kernel,
                                time.perf_counter() - start, kernels, reasons)  # fmt: skip
        if loaded is not None and end_to_end:
            from tensortune.deploy.compile import compile_model

            report = compile_model(loaded, records=store, target=platform, rounds=rounds,
                                   fast_math=fast_math)  # fmt: skip
            result.model = report.model
            result.untuned_e2e, result.transferred_e2e = (report.untuned_seconds,
                                                          report.tuned_seconds)  # fmt: skip
    return result


def transfer_tasks(
    store: RecordStore,
    tasks: Sequence[Task],
    platform: Platform,
    session: MeasureSession,
    by_class: dict[str, list[SourceSchedule]],
    *,
    per_kernel: int,
    untuned: bool = True,
    progress: OnKernel | None = None,
    seed: int = 0,
    deadline: float | None = None,
) -> tuple[list[KernelTransfer], dict[str, int]]:
    """Replay, rank, time and record the transferred candidates of each task (and, with
    ``untuned``, the task's untuned program and the fallback ``compile`` would build it from).
    Returns each task's summary and how often each reason made a transfer invalid.  Past
    ``deadline`` (``time.monotonic()``) no further task is started."""
    from tensortune.deploy.unrecorded import unrecorded_candidate
    from tensortune.search.space import tune_context

    run_id = f"transfer-{uuid.uuid4().hex[:8]}"
    hw_id = store.register_hardware(platform.hardware)
    ranker = _ranker(platform)
    reasons: Counter[str] = Counter()
    by_core: dict[str, list[SourceSchedule]] = {}
    for srcs in by_class.values():
        for src in srcs:
            if src.kclass.core is not None:
                by_core.setdefault(src.kclass.core, []).append(src)
    out = []
    session.add_references(list(tasks))
    for index, task in enumerate(tasks):
        if deadline is not None and time.monotonic() >= deadline:
            break
        if interrupted():  # a graceful Ctrl-C: every kernel timed so far is recorded
            raise KeyboardInterrupt
        wid = store.workload_id(task.mod, task.name)
        where = {"workload_id": wid, "hardware_id": hw_id, "target": platform.key}
        kclass = kernel_class(task.mod)
        summary = KernelTransfer(task.name, task.weight, str(kclass))
        context = tune_context(task.mod, platform, seed=seed, task_name=task.name)
        postprocs = list(context.space_generator.postprocs)
        exact = [(src, []) for src in by_class.get(kclass.key, [])]
        made = _replay(exact, task, postprocs, seed, summary, reasons)
        if len(_distinct(made)) < per_kernel:
            relaxed = _relaxed_sources(kclass, by_core)
            if relaxed:
                epilogue = epilogue_blocks(task.mod)
                fits = [(src, epilogue[: kclass.epilogue - src.kclass.epilogue])
                        for src in relaxed]  # fmt: skip
                summary.relaxed += len(fits)
                made += _replay(fits, task, postprocs, seed, summary, reasons)
        chosen = _distinct(made)
        if ranker is not None and len(chosen) > per_kernel:
            scores = ranker.predict(context, [c for c, _ in chosen])
            order = sorted(range(len(chosen)), key=lambda i: -float(scores[i]))
            chosen = [chosen[i] for i in order]
        todo = chosen[:per_kernel]
        if untuned:
            fallback = unrecorded_candidate(task.mod, platform)
            if fallback is not None:
                todo.insert(0, (fallback, FALLBACK_ORIGIN))
            todo.insert(0, (_untuned(task), UNTUNED_ORIGIN))
        _measure_new(store, session, todo, where, run_id)
        _summarize(store, where, summary)
        out.append(summary)
        if progress is not None:
            progress(index, summary)
    return out, dict(reasons.most_common())


def _ranker(platform: Platform) -> object | None:
    """The model shipped for the target, frozen; ``None`` where none is shipped (candidates
    then keep the order of their sources: a store's best workloads first)."""
    from tensortune.costmodel.ms_adapter import LearnedCostModel
    from tensortune.costmodel.shipped import NoShippedModel, shipped_model

    try:
        return LearnedCostModel(shipped_model(platform), platform)
    except NoShippedModel:
        return None


def _replay(sources: list[tuple[SourceSchedule, list[str]]], task: Task, postprocs: list,
            seed: int, summary: KernelTransfer,
            reasons: Counter[str]) -> list[tuple[object, str]]:  # fmt: skip
    """Each source's schedule replayed on ``task`` (the target blocks named beside it inlined
    first): the candidates with their origins; outcomes counted in ``summary``."""
    made = []
    for src, inline in sources:
        summary.sources += 1
        moved = transfer_trace(src.mod, src.record.trace, task.mod, postprocs, seed=seed,
                               inline=inline)  # fmt: skip
        setattr(summary, moved.outcome, getattr(summary, moved.outcome) + 1)
        if moved.candidate is None:
            reasons[_reason(moved.error)] += 1
        else:
            made.append((moved.candidate, src.origin(inlined=len(inline))))
    return made


def _relaxed_sources(kclass: KernelClass,
                     by_core: dict[str, list[SourceSchedule]]) -> list[SourceSchedule]:  # fmt: skip
    """Sources of another class with the same core and an epilogue no longer than the
    target's, but not empty (a kernel's output block cannot be inlined away): the closest
    epilogues first."""
    if kclass.core is None:
        return []
    found = [s for s in by_core.get(kclass.core, []) if s.kclass.key != kclass.key
             and 1 <= s.kclass.epilogue <= kclass.epilogue]  # fmt: skip
    return sorted(found, key=lambda s: kclass.epilogue - s.kclass.epilogue)


def _distinct(made: list[tuple[object, str]]) -> list[tuple[object, str]]:
    """One candidate per distinct program: sources of one shape family often re-fit to the
    same tiles.  The first source to give a program keeps it."""
    from tensortune.records.convert import trace_text

    seen: set[str] = set()
    out = []
    for cand, src in made:
        key = trace_text(cand.sch.trace)
        if key not in seen:
            seen.add(key)
            out.append((cand, src))
    return out


def _untuned(task: Task) -> object:
    from tensortune.compat import ArgInfo, MeasureCandidate, tvm

    sch = tvm.s_tir.Schedule(task.mod)
    return MeasureCandidate(sch, ArgInfo.from_entry_func(sch.mod, remove_preproc=True))


def _measure_new(store: RecordStore, session: MeasureSession, todo: list, where: dict,
                 run_id: str) -> None:  # fmt: skip
    """Time the candidates the store does not hold yet and record them with their origins."""
    from tensortune.records.convert import measured_records, trace_text

    have = {trace_hash(r.trace) for r in store.query(**where)}
    fresh = [(c, o) for c, o in todo if trace_hash(trace_text(c.sch.trace)) not in have]
    if not fresh:
        return
    cands = [c for c, _ in fresh]
    built, ran = session.measure(cands)
    recs = measured_records(cands, built, ran, workload_id=where["workload_id"],
                            hardware_id=where["hardware_id"], target=where["target"],
                            run_id=run_id)  # fmt: skip
    store.add(dataclasses.replace(r, origin=o) for r, (_, o) in zip(recs, fresh, strict=True))


def _summarize(store: RecordStore, where: dict, summary: KernelTransfer) -> None:
    for rec in store.query(**where):
        origin = origin_of(rec)
        kind = origin.get("kind")
        if kind in ("untuned", "fallback"):
            attr = f"{kind}_seconds"
            if rec.ok:
                setattr(summary, attr, min(rec.cost, getattr(summary, attr) or rec.cost))
        elif kind == "transfer":
            summary.measured += 1
            if not rec.ok:
                summary.failed += 1
            elif summary.best_seconds is None or rec.cost < summary.best_seconds:
                summary.best_seconds = rec.cost
                summary.source = origin.get("workload")
                summary.source_store = origin.get("from")
        elif rec.ok:
            summary.tuned_seconds = min(rec.cost, summary.tuned_seconds or rec.cost)


def _reason(error: str | None) -> str:
    """An invalid transfer's reason without the names and numbers that differ every time."""
    text = (error or "unknown").split(":")[0:2]
    return ":".join(text)[:80]
