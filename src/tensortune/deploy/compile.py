"""Apply tuned records to a model, build it, and compare its latency with the alternatives."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tensortune.errors import (
    TensortuneError,
    about,
    check_count,
    check_flags,
    check_writable,
    interruptible,
)
from tensortune.hardware import Platform, check_runs_here, resolve_platform
from tensortune.measure.executable import MIN_REPEAT_S, seconds_per_call, timing_repeats
from tensortune.measure.pool import WorkerPool
from tensortune.measure.worker import output_tolerance
from tensortune.records import DEFAULT_URL, RecordStore, records_from
from tensortune.records.schema import origin_kind


@dataclass
class TaskStatus:
    name: str
    weight: int
    tuned: bool  # a record was found (whatever its origin)
    best_seconds: float | None
    # With ``retime``: the chosen record re-timed, and its rank among the stored (0 = best).
    retimed_seconds: float | None = None
    retime_rank: int | None = None
    # Where the schedule built came from (``Record.origin``'s kind, ``origin_kind``): ""
    # tuned, "transfer", or what transfer-tuning times beside them, "untuned" and "fallback".
    origin: str = ""

    @property
    def kind(self) -> str:
        """ "none" (no record), "tuned", or the record's origin kind."""
        if not self.tuned:
            return "none"
        return self.origin or "tuned"


@dataclass
class CompileReport:
    """What ``compile_model`` built and timed: the tuned build's latency (a median over
    rounds) against the untuned build's and PyTorch eager's, how far its outputs stray from the
    untuned build's, and per task which record (or none) it was built with."""

    model: str
    target: dict
    records_url: str
    tuned_seconds: float
    untuned_seconds: float
    torch_seconds: float | None
    max_abs_error: float  # tuned vs untuned floating-point outputs (``_stray``)
    tasks: list[TaskStatus] = field(default_factory=list)
    threads: int = 1  # of TVM's runtime and of PyTorch alike
    # Tuned build and PyTorch eager, timed alternately (one pair per round): medians above.
    tuned_rounds: list[float] = field(default_factory=list)
    torch_rounds: list[float] = field(default_factory=list)
    artifact: str | None = None  # where ``out`` wrote the tuned build

    @property
    def speedup_over_untuned(self) -> float:
        return self.untuned_seconds / self.tuned_seconds

    @property
    def speedup_over_torch(self) -> float | None:
        """Median over rounds of eager / tuned: each ratio compares timings taken side by side,
        which a shared machine's drift between rounds does not bias."""
        if self.torch_seconds is None:
            return None
        pairs = zip(self.torch_rounds, self.tuned_rounds, strict=True)
        ratios = [e / t for e, t in pairs] or [self.torch_seconds / self.tuned_seconds]
        return statistics.median(ratios)


def compile_model(
    model: object,
    *,
    records: str | RecordStore = DEFAULT_URL,
    target: dict | str | Platform | None = None,
    repeat: int = 10,
    rounds: int = 3,
    retime: int = 0,
    fast_math: bool = True,
    winograd: bool = True,
    out: str | os.PathLike | None = None,
    input_shapes: dict[str, list[int]] | None = None,
) -> CompileReport:
    """Build ``model`` (a zoo name, an ``.onnx`` path or a loaded ``Model``) with this machine's
    best records for ``target``, and time it.

    Tasks with no successful record on this hardware get an unmeasured program, the one the
    analyzer ranks first (``apply_tuned``; TVM 0.27's CPU pipeline would run their bare
    loops).  The untuned build and PyTorch eager (for torch models) are timed too, all with
    the target's ``num-cores`` threads.  TVM sizes its thread pool once per process, from
    ``TVM_NUM_THREADS`` (and on x86 takes half the CPUs without it), so the TVM builds are
    timed in a worker process started with that variable set.  The tuned build and eager
    PyTorch take turns, ``rounds`` times, each timing ``repeat`` calls.

    ``retime`` > 1 times each task's ``retime`` best records again, side by side, and builds
    with the fastest of them (see ``tensortune.deploy.retime``) instead of the stored best.
    ``fast_math`` and ``winograd`` must be what the model was tuned with: they change the
    tasks, and records only apply to the tasks they were measured on.
    ``out`` writes the tuned build as an artifact to ship (``tensortune.load`` calls it).
    ``input_shapes`` fixes an ONNX model's dynamic input dimensions, as ``tune`` was given.
    """
    check_writable(out, "out", parents=True)
    for name, value, least in (("repeat", repeat, 1), ("rounds", rounds, 1), ("retime", retime, 0)):
        check_count(value, name, least)
    if retime == 1:  # was taken, and did nothing
        raise TensortuneError("1 record re-timed has nothing to be compared with: give 2 or "
                              "more, or 0 for the stored best", param="retime")  # fmt: skip
    check_flags(fast_math=fast_math, winograd=winograd)
    from tensortune.workloads.models import Model, load_model

    with about("target"):
        platform = resolve_platform(target)
        check_runs_here(platform.target)  # the build is timed here, whatever hardware it names
    tvm_target = platform.tvm_target
    # The store first: a mistyped URL is said before a model import of seconds to minutes.
    with interruptible(), records_from(records, create=False) as store:
        with about("model"):
            if isinstance(model, Model):
                m = model
            else:
                m = load_model(model, target=tvm_target, fast_math=fast_math,
                               winograd=winograd, input_shapes=input_shapes)  # fmt: skip
        return _build_and_time(m, store, platform, repeat, rounds, retime, out)


def _build_and_time(m, store: RecordStore, platform: Platform, repeat: int, rounds: int,
                    retime: int, out: str | os.PathLike | None) -> CompileReport:  # fmt: skip
    from tensortune.compat import tvm
    from tensortune.records.ms_database import StoreDatabase

    tvm_target = platform.tvm_target
    db = StoreDatabase(store, target=platform)
    retimed = {}
    if retime > 1:
        from tensortune.deploy.retime import retime_best

        retimed = retime_best(store, m.tasks, platform, retime)
    statuses = []
    for task in m.tasks:
        rec = db.chosen_record(task.mod, tvm_target)
        best = statistics.median(float(s) for s in rec.run_secs) if rec is not None else None
        again = retimed.get(store.workload_id(task.mod, create=False))
        # the origin of what the build takes: the re-timed pick where there is one
        built = again.chosen if again is not None else rec
        status = TaskStatus(task.name, task.weight, rec is not None, best,
                            origin=origin_kind(built))  # fmt: skip
        if again is not None:
            status.retimed_seconds, status.retime_rank = again.seconds, again.rank
        statuses.append(status)
    db.pinned = {wid: r.chosen for wid, r in retimed.items()}

    threads = platform.threads
    builds = {
        "untuned": tvm.compile(m.mod, target=tvm_target),
        "tuned": build_tuned(db, m.mod, platform),
    }
    torch_rounds: list[float] = []

    def between_rounds() -> None:
        t = _time_torch(m, repeat, threads)
        if t is not None:
            torch_rounds.append(t)

    # Without an eager model to take turns with, one round says all there is.
    rounds = rounds if m.torch_module is not None else 1
    with tempfile.TemporaryDirectory() as tmp:
        libraries = {name: Path(tmp) / f"{name}.so" for name in builds}
        timed = _time_in_worker(builds, libraries, m.inputs, repeat, threads, rounds,
                                between_rounds)  # fmt: skip
        report = _report(m, store, platform, statuses, timed, torch_rounds)
        if out is not None:
            # A wrong program in the store (imported, unmeasured, a kernel whose check was
            # off) must not ship: the untuned build is TVM's own lowering of the same model.
            stray, allowed = _stray(timed[1][0], timed[0][0])
            if stray > allowed:
                raise TensortuneError(
                    f"the tuned build's outputs differ from the untuned build's by {stray:.3g} "
                    f"(allowed {allowed:.3g}): no artifact written; a record in the store "
                    "gives a wrong program",
                    param="out",
                )
            from tensortune.deploy.artifact import save_artifact
            from tensortune.records import redact

            extra = {"records": redact(store.url), "tuned_seconds": report.tuned_seconds,
                     "tasks_tuned": sum(s.kind in ("tuned", "transfer") for s in statuses),
                     "tasks": len(statuses)}  # fmt: skip
            # the library just timed: LLVM writing a tuned build's object code again took
            # resnet18 35-40 s
            report.artifact = str(save_artifact(
                builds["tuned"], out, model=m, target=platform.target, threads=threads,
                extra=extra, library=libraries["tuned"]))  # fmt: skip
    return report


# How far a shipped build's output may stray from the untuned build's: relative to that
# output's largest value, with the candidates' relative tolerance (``output_tolerance``: 1e-3,
# or 8 epsilons of a float16 or bfloat16 output), since tuned kernels reorder float32 sums
# (1e-6 to 7e-5 seen on the zoo's networks, benchmarks/RESULTS.md) and a wrong program is off
# by the output's size; plus ``OUTPUT_FLOOR`` absolute (the candidates' absolute tolerance
# for a float32 output within ±1), where sums of large terms cancel into a small output.
# The floor was 1e-3, under which every value of a 50,257-way softmax (each near 2e-5)
# could be wrong, a uniform 1/V included.
OUTPUT_FLOOR = 1e-4


def _stray(tuned: list, untuned: list) -> tuple[float, float]:
    """How far the tuned build's floating-point outputs stray from the untuned build's, and
    how far they may: of the output that strays most for its size, its largest difference and
    ``output_tolerance`` of its type times its largest finite magnitude, plus
    ``OUTPUT_FLOOR``.  Each output against its own size: one tolerance over all let logits
    near 5,000 hide wrong probabilities.  Equal infinities agree (log-probabilities, masked
    scores); a NaN on one side only strays without bound.  Integer outputs (an argmax, say)
    may flip on a near tie: not judged."""
    worst: tuple[float, float] | None = None  # ties: the first output judged
    for a, b in zip(tuned, untuned, strict=True):
        # bfloat16 and the float8s (ml_dtypes) are kind "V" to NumPy, floats all the same.
        floating = b.dtype.kind == "f" or b.dtype.name.startswith(("bfloat", "float"))
        if not (floating and b.size):
            continue
        stray = output_difference(a, b)
        relative = output_tolerance(b.dtype)
        b = np.asarray(b, np.float64)
        finite = np.abs(b[np.isfinite(b)])
        largest = float(finite.max()) if finite.size else 0.0
        allowed = relative * largest + OUTPUT_FLOOR
        if worst is None or stray / allowed > worst[0] / worst[1]:
            worst = (stray, allowed)
    return worst or (0.0, OUTPUT_FLOOR)


def output_difference(got: np.ndarray, want: np.ndarray) -> float:
    """The largest absolute difference of two outputs of one shape: equal infinities (and two
    NaNs) agree, a NaN on one side only differs without bound (a bare ``max`` of NaNs is NaN,
    or is dropped by Python's ``max`` over outputs, by their order)."""
    a, b = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if not b.size:
        return 0.0
    agree = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore"):  # inf - inf where they agree, masked next
        diff = np.where(agree, 0.0, np.abs(a - b))
    return float(np.nan_to_num(diff, nan=np.inf, posinf=np.inf).max())


def _report(m, store: RecordStore, platform: Platform, statuses: list[TaskStatus],
            timed: list, torch_rounds: list[float]) -> CompileReport:  # fmt: skip
    threads = platform.threads
    (out_untuned, t_untuned, _), (out_tuned, _, tvm_threads) = timed[:2]
    if tvm_threads != threads:
        raise TensortuneError(f"TVM ran with {tvm_threads} threads instead of {threads}")
    # Boolean and empty outputs, and equal infinities, are no error (a - b would raise or
    # give NaN); a NaN on one side only is an infinite one.
    error = max(
        (_stray([a], [b])[0] for a, b in zip(out_tuned, out_untuned, strict=True)), default=0.0
    )  # the largest over all outputs, whatever their sizes
    tuned_rounds = [t for _, t, _ in timed[1:]]
    return CompileReport(
        m.name, platform.target, store.url, statistics.median(tuned_rounds), t_untuned,
        statistics.median(torch_rounds) if torch_rounds else None, error, statuses, tvm_threads,
        tuned_rounds if torch_rounds else [], torch_rounds,
    )  # fmt: skip


def apply_tuned(database: object, mod: object, platform: Platform) -> object:
    """``mod`` (a model's Relax module, weights bound) fused, with ``database``'s schedules
    applied and the weights laid out for them; ``build_tuned`` lowers and builds the result.

    The tuned part of MetaSchedule's ``compile_relax``, with two differences.  A tuned kernel
    that rewrote a weight's layout carries that rewrite as a block run at every call; here it
    is split off (``SplitLayoutRewritePreproc``) and folded into the constant weight, so it
    runs once, now.  And on CPUs a kernel with no record is not left as its unscheduled TIR
    (one core, no vectors): it gets the program the analyzer ranks first among its
    register-blocked seeds (a few random programs of its design space where it has none),
    unmeasured (``deploy.unrecorded``).  On GPUs, which cannot run unscheduled TIR, such kernels get
    DLight's default schedules.
    """
    from tensortune.compat import tvm
    from tensortune.deploy.unrecorded import seed_unrecorded
    from tensortune.workloads.models import fuse

    relax = tvm.relax
    target = platform.tvm_target
    with target, database, tvm.transform.PassContext(opt_level=3):
        mod = fuse(mod, target)
        mod = relax.transform.MetaScheduleApplyDatabase()(mod)
        mod = seed_unrecorded(mod, platform)
        mod = relax.transform.SplitLayoutRewritePreproc()(mod)
        mod = relax.transform.FoldConstant()(mod)
        mod = relax.transform.DeadCodeElimination()(mod)  # the folded layout rewrites
        if relax.pipeline.BackendDispatcher.is_gpu_target(target):
            from tvm.s_tir import dlight as dl

            rules = (dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                     dl.gpu.GeneralReduction(), dl.gpu.Fallback())  # fmt: skip
            mod = dl.ApplyDefaultSchedule(*rules)(mod)
    return mod


def build_tuned(database: object, mod: object, platform: Platform) -> object:
    """``mod`` built with ``database``'s schedules (see ``apply_tuned``): a Relax VM
    executable."""
    from tensortune.compat import tvm

    relax = tvm.relax
    target = platform.tvm_target
    applied = apply_tuned(database, mod, platform)
    with target, tvm.transform.PassContext(opt_level=3):
        return relax.build(applied, target=target,
                           relax_pipeline=tvm.transform.Sequential(_lowering(target)))  # fmt: skip


def _lowering(target: object) -> list:
    """The target's Relax passes after fusion: dataflow lowering, then finalization."""
    from tensortune.compat import tvm

    pipeline = tvm.relax.pipeline
    try:
        return [*pipeline.dataflow_lower_passes(target), *pipeline.finalize_passes(target)]
    except AttributeError:
        if target.kind.name != "llvm":
            raise
        # TVM 0.27's CPU backend package leaves its dataflow lowering out of its exports
        from tvm.relax.backend.cpu_generic import pipeline as cpu

        return [*cpu.dataflow_lower_passes(target), *cpu.finalize_passes(target)]
    except ValueError as e:
        raise TensortuneError(f"TVM has no Relax pipeline for target {target}: {e}") from e


_WORKER_TIMEOUT_S = 3600.0  # an untuned BERT-base call alone takes 85 s here


def _time_in_worker(
    builds: dict,
    libraries: dict[str, Path],
    inputs: list[np.ndarray],
    repeat: int,
    threads: int,
    rounds: int,
    between_rounds: Callable[[], None],
) -> list[tuple[list[np.ndarray], float, int]]:
    """(outputs, median seconds, TVM threads) of each build, in the order of ``builds``, then of
    the last build again for each further round; ``between_rounds`` runs after each round.
    Each build is exported to its path in ``libraries`` and timed from there."""
    # An idle worker of this process with these threads (a tune's runner) times the builds if
    # there is one: a fresh one imports TVM first.  It is not kept afterwards: one that timed
    # vgg11 stayed at 2.5 GB resident, and dropping the library and clearing the VM memory
    # manager freed none of it (measured).
    with WorkerPool(1, {"TVM_NUM_THREADS": str(threads)}, reuse=True, keep=False) as pool:
        pool.start()  # its TVM import overlaps the exports
        jobs = []
        for name, executable in builds.items():
            path = str(libraries[name])
            executable.export_library(path)
            jobs.append((name, (path, inputs, repeat)))
        results = []
        for r in range(rounds):
            todo = jobs if r == 0 else jobs[-1:]
            outcomes = pool.map("time_model", [j for _, j in todo], timeout_s=_WORKER_TIMEOUT_S)
            for (name, _), o in zip(todo, outcomes, strict=True):
                if o.kind != "ok":
                    raise TensortuneError(f"timing the {name} build failed: {o.message or o.kind}")
                results.append(o.value)
            between_rounds()
    return results


def _time_torch(m, repeat: int, threads: int) -> float | None:
    if m.torch_module is None:
        return None
    import torch

    caller_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    module, args = m.torch_module, m.torch_inputs
    times = []
    try:
        with torch.no_grad():
            start = time.perf_counter()
            module(*args)  # warm-up: allocator, lazy init
            first = max(time.perf_counter() - start, MIN_REPEAT_S)
            for _ in range(timing_repeats(first, repeat)):
                times.append(seconds_per_call(lambda: module(*args), MIN_REPEAT_S))
    finally:
        torch.set_num_threads(caller_threads)  # the caller's process, as it was
    return statistics.median(times)
