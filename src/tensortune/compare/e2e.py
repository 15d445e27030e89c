"""``bench e2e``: a tuned model against what its users would run instead.

For each network, in one process on one machine:

1. the network is tuned for a wall-clock budget (``tune(max_seconds=)``, the recommended
   search) into its own store in the work dir; a rerun keeps what was tuned and does not tune
   again (delete the store to start over; a store whose tuning was interrupted is tuned for
   the budget again on top, and its summary says ``resumed``: its earlier time is unknown);
2. the tuned build (also as shipped: its artifact read back by ``tensortune.load``, and the
   ``torch.compile`` backend on the same store), PyTorch eager, ``torch.compile`` (Inductor),
   ONNX Runtime and OpenVINO (fp32: OpenVINO is told ``INFERENCE_PRECISION_HINT=f32``, else it
   picks bf16 where the CPU has it) are each set up with the same thread count and the same
   inputs;
3. they are timed in turns, ``rounds`` times: in each round every system gives the median of
   ``repeat`` timings (each timing loops calls for at least 50 ms), so drift on a shared
   machine hits all systems alike; medians and spreads over the rounds are reported;
4. then the artifact is loaded by a fresh process of its own (``own_process``), as a user's
   service runs it, and timed in turns with the tuned build alone (``_time_own_process``);
5. each system's outputs are compared with PyTorch eager's (largest absolute difference);
6. the machine's practical peak is measured in the same run: the fastest of 512³, 1024³ and
   2048³ fp32 matrix products on the same threads in PyTorch and in the runtimes among the
   anchors (``peak_gflops``), and each system's GFLOP/s is given as a share of it.

The runtimes are an optional extra (``pip install tensortune[anchors]``); a missing one is named
in the result and skipped, and so is a system that fails to set up (with its error).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from tensortune.compare.own_process import OwnProcess
from tensortune.deploy.compile import build_tuned, output_difference
from tensortune.errors import TensortuneError, about, last_line
from tensortune.files import move_aside, strict_json, write_atomically
from tensortune.hardware import Platform, resolve_platform
from tensortune.hardware.fingerprint import affinity_kept
from tensortune.measure.executable import seconds_per_call
from tensortune.records.sqlite import store_files

DEFAULT_NETWORKS = ("resnet18", "resnet50", "mobilenetv2", "bert-layer", "gpt2-block")
ANCHORS = ("pytorch", "torch.compile", "onnxruntime", "openvino")
TUNED = "tensortune"
# The same tuned kernels reached as users ship them: the artifact ``compile --out`` writes, read
# back with ``tensortune.load`` (also in a process of its own, ``OWN_PROCESS``, timed apart),
# and the ``torch.compile`` backend on the same store.
OWN_PROCESS = "tensortune.load[own process]"
ROUTES = ("tensortune.load", "torch.compile[tensortune]")
# Where a missing runtime comes from.
_INSTALL = {"onnxruntime": "onnxruntime", "openvino": "openvino"}
# What ``tensortune[anchors]`` installs: a failed import of anything else (ours, TVM's, one of
# torch's) is a failure to report, not an install to advise.
ANCHOR_PACKAGES = ("onnx", *_INSTALL.values())


@dataclass
class SystemTiming:
    name: str
    rounds: list[float] = field(default_factory=list)  # seconds per call, one per round
    max_abs_error: float | None = None  # against PyTorch eager's outputs
    setup_s: float = 0.0  # building, exporting, compiling
    missing: str = ""  # why it did not run
    # the tuned build's rounds timed in turns with this system, where they are not the main
    # rounds (the artifact in its own process is timed after the others)
    baseline: list[float] = field(default_factory=list)
    note: str = ""  # e.g. graphs the torch.compile backend left to eager

    @property
    def median(self) -> float | None:
        return statistics.median(self.rounds) if self.rounds else None


@dataclass
class E2EResult:
    network: str
    gflop: float  # Σ weight × FLOP of the tasks, the convolutions counted direct (_direct_gflop)
    threads: int
    cpu: str
    peak_gflops: float
    tune_seconds: float
    trials: int
    systems: dict[str, SystemTiming] = field(default_factory=dict)
    peak_by: str = ""  # the library and size that reached peak_gflops
    # The tuning went on from an interrupted one: its trials are the store's, its seconds the
    # last run's only (the time before is not known).
    resumed: bool = False

    def gflops(self, name: str) -> float | None:
        t = self.systems[name].median
        return self.gflop / t if t else None

    def speedup_over(self, name: str) -> float | None:
        """Median over rounds of that system's time / tuned time, each pair from one round."""
        ratios = self.round_ratios(name)
        return statistics.median(ratios) if ratios else None

    def round_ratios(self, name: str) -> list[float]:
        """That system's time / tuned time in each round (empty: not timed)."""
        other = self.systems[name].rounds
        tuned = self.systems[name].baseline or self.systems[TUNED].rounds
        if not tuned or not other:
            return []
        return [o / t for o, t in zip(other, tuned, strict=True)]

    def fastest_runtime(self) -> str | None:
        """The faster of ONNX Runtime and OpenVINO, by median."""
        timed = [(s.median, n) for n, s in self.systems.items()
                 if n in ("onnxruntime", "openvino") and s.median]  # fmt: skip
        return min(timed)[1] if timed else None

    def to_dict(self) -> dict:
        systems = {n: {**asdict(s), "median": s.median, "gflops": self.gflops(n),
                       "speedup_of_tuned": self.speedup_over(n) if n != TUNED else None}
                   for n, s in self.systems.items()}  # fmt: skip
        return {**asdict(self), "systems": systems, "fastest_runtime": self.fastest_runtime()}


def peak_gflops(threads: int, work: Path, libraries: tuple[str, ...] = ("pytorch",),
                sizes: tuple[int, ...] = (512, 1024, 2048),
                repeat: int = 5) -> tuple[float, str]:  # fmt: skip
    """The practical fp32 peak: the best GFLOP/s of n×n×n matrix products (best of ``repeat``
    per size) on ``threads`` threads, in each of ``libraries`` that is installed (``pytorch``,
    ``onnxruntime``, ``openvino``; their ONNX files go to ``work``), and where it was reached.

    Several sizes, because which one runs fastest depends on the CPU's caches; several
    libraries, because one BLAS may not use all of a CPU's vector width: on an AMD Zen 5
    PyTorch's reached 213 GFLOP/s where OpenVINO ran a whole BERT layer at 412."""
    import torch

    torch.set_num_threads(threads)
    best, where = 0.0, ""
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        for library in libraries:
            try:
                call = _matmul(library, a, b, threads, work)
                call()
            except Exception:
                # a missing or broken runtime is named where the networks are set up; the
                # peak is the best of those that run
                continue
            gflops = 2 * n**3 / min(seconds_per_call(call) for _ in range(repeat)) / 1e9
            if gflops > best:
                best, where = gflops, f"{library}, {n}³"
    return best, where


def _matmul(library: str, a, b, threads: int, work: Path) -> Callable[[], object]:
    """``a @ b`` in ``library``, ready to call."""
    import torch

    if library == "pytorch":
        return lambda: torch.mm(a, b)

    class MatMul(torch.nn.Module):
        def forward(self, a, b):
            return a @ b

    path = _onnx(MatMul(), (a, b), work / f"matmul-{a.shape[0]}.onnx")
    make = _ort_runner if library == "onnxruntime" else _ov_runner
    return make(path, [a.numpy(), b.numpy()], threads)


def bench_e2e(
    networks: list[str] | None = None,
    *,
    max_seconds: float = 1200.0,
    work_dir: str | Path = "bench-e2e",
    target: dict | str | Platform | None = None,
    rounds: int = 3,
    repeat: int = 10,
    anchors: tuple[str, ...] = ANCHORS,
    progress: Callable[[str], None] | None = None,
) -> list[E2EResult]:
    """Tune each network for ``max_seconds`` and time it against ``anchors`` (see above).

    TVM's thread pool is sized once per process: this sets ``TVM_NUM_THREADS`` to the target's
    threads before TVM first runs anything, and refuses to go on if TVM runs with another
    count."""
    from tensortune.tuning.tune import tune
    from tensortune.workloads.models import load_model
    from tensortune.workloads.networks import check_source

    for name, value in (("rounds", rounds), ("repeat", repeat)):
        if value < 1:
            raise TensortuneError(f"must be at least 1, not {value}", param=name)
    with about("network"):  # a typo found before the peak is timed, not after
        for net in networks or DEFAULT_NETWORKS:
            check_source(net)
    platform = resolve_platform(target)
    threads = platform.threads
    os.environ.setdefault("TVM_NUM_THREADS", str(threads))
    unknown = sorted(set(anchors) - set(ANCHORS))
    if unknown:
        raise TensortuneError(f"unknown anchor {unknown[0]!r} (known: {', '.join(ANCHORS)})",
                              param="anchors")  # fmt: skip
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda text: None)
    say(f"peak: {threads}-thread fp32 matrix products")
    libraries = ("pytorch", *(a for a in anchors if a in _INSTALL))
    peak, peak_by = peak_gflops(threads, work, libraries)
    out = []
    for net in networks or DEFAULT_NETWORKS:
        model = load_model(net, target=platform.tvm_target)
        store = work / f"{net}.db"
        tuned_info = work / f"{net}-tune.json"
        info = _tuned_before(tuned_info) if store.exists() else None
        if info is not None and not _tuned_for(info, store, platform):
            # tuned for another target: its records would not apply, and the "tuned" build
            # would be the untuned one under the tuned name
            move_aside(work, [*store_files(store), tuned_info, work / f"{net}-e2e.json"],
                       f"{net} was tuned for another target (or its store cannot be "
                       "read)")  # fmt: skip
            info = None
        if info is not None:
            say(f"{net}: tuned before ({info['trials']} trials in {info['seconds']:.0f} s)")
        else:
            # The store decides: deleted, it is tuned anew; there without its summary, its
            # tuning was interrupted and goes on, and the time before is not known.
            resumed = store.exists()
            # A summary left by an earlier tuning of a store since deleted would, if this one
            # is interrupted, pass it for finished: gone until this tuning ends.
            tuned_info.unlink(missing_ok=True)
            say(f"{net}: tuning for {max_seconds:.0f} s"
                + (" more (resuming an interrupted tuning)" if resumed else ""))  # fmt: skip
            r = tune(model=model, max_seconds=max_seconds, records=f"sqlite:///{store}",
                     target=platform, work_dir=work / "work")  # fmt: skip
            info = {"trials": r.trials_total, "seconds": r.seconds, "resumed": resumed,
                    "target": platform.key}  # fmt: skip
            write_atomically(tuned_info, json.dumps(info))
        systems = _set_up(model, store, platform, anchors, work, say)
        say(f"{net}: timing {', '.join(n for n, s in systems.items() if not s[1].missing)} "
            f"in turns, {rounds} rounds")  # fmt: skip
        _time_in_turns(systems, rounds, repeat)
        say(f"{net}: timing {OWN_PROCESS} in turns with {TUNED}, {rounds} rounds")
        own = _time_own_process(systems, model, threads, work, rounds, repeat)
        if own.missing:
            say(f"{net}: {OWN_PROCESS} {own.missing}")
        timings: dict[str, SystemTiming] = {}
        for name, (_, timing) in systems.items():
            timings[name] = timing
            if name == "tensortune.load":  # the two loads side by side in the table
                timings[OWN_PROCESS] = own
        gflop = _direct_gflop(model, platform, net)
        result = E2EResult(net, gflop, threads, platform.hardware.cpu_model, peak,
                           info["seconds"], info["trials"],
                           timings, peak_by, bool(info.get("resumed")))  # fmt: skip
        write_atomically(work / f"{net}-e2e.json", strict_json(result.to_dict()))
        out.append(result)
    return out


def _tuned_for(info: dict, store: Path, platform: Platform) -> bool:
    """Whether a finished tuning (its summary ``info``, its ``store``) was for ``platform``'s
    target: as the summary says, or (one written before summaries said) as the store's
    records do."""
    from tensortune.records import open_records

    if "target" in info:
        return info["target"] == platform.key
    try:
        with open_records(f"sqlite:///{store}", create=False) as records:
            return records.count(target=platform.key) > 0
    except TensortuneError:  # not a store, or a damaged one: tuned anew, the file kept
        return False


def _tuned_before(path: Path) -> dict | None:
    """The summary a finished tuning left (trials, seconds, whether it resumed); None when
    there is none or it does not read as one (a tuning that did not finish: it goes on)."""
    try:
        info = json.loads(path.read_text())
        if isinstance(info, dict) and all(
            isinstance(info.get(k), int | float) for k in ("trials", "seconds")
        ):
            return info
    except (OSError, ValueError, RecursionError):
        pass
    return None


def _direct_gflop(model, platform: Platform, source: object, **load: object) -> float:
    """The work of ``model`` (loaded from ``source``, with ``load``'s other arguments) with
    every convolution counted direct: Winograd's tasks do fewer operations, and counting those
    would rate every system's GFLOP/s (the runtimes', which compute the convolutions their own
    way, too) on work that varies with our rewrite."""
    from tensortune.workloads.models import load_model

    if any("winograd" in t.name for t in model.tasks):
        model = load_model(source, target=platform.tvm_target, winograd=False, **load)
    return sum(t.flop * t.weight for t in model.tasks) / 1e9


Runner = Callable[[], list[np.ndarray]]
Systems = dict[str, tuple[Runner | None, SystemTiming]]


def _set_up(model, store: Path, platform: Platform, anchors: tuple[str, ...], work: Path,
            say: Callable[[str], None]) -> Systems:  # fmt: skip
    """Each system ready to call on the model's inputs, its outputs checked against eager."""
    import torch

    threads = platform.threads
    torch.set_num_threads(threads)
    module, args = model.torch_module, model.torch_inputs
    reference = _eager_outputs(model)
    built: dict = {}  # the tuned executable, for the artifact
    makers = {
        TUNED: lambda: _tvm_runner(model, store, platform, built),
        "tensortune.load": lambda: _artifact_runner(built.get("executable"), model, platform, work),
    }
    if model.torch_module is not None:
        options = {"records": f"sqlite:///{store}", "target": platform.target}
        makers["torch.compile[tensortune]"] = lambda: _torch_runner(
            torch.compile(module, backend="tensortune", options=options), args
        )
    if "pytorch" in anchors:
        makers["pytorch"] = lambda: _torch_runner(module, args)
    if "torch.compile" in anchors:
        makers["torch.compile"] = lambda: _torch_runner(torch.compile(module), args)
    onnx_path = work / f"{model.name}.onnx"
    if "onnxruntime" in anchors:
        makers["onnxruntime"] = lambda: _ort_runner(_onnx(module, args, onnx_path), model.inputs,
                                                    threads)  # fmt: skip
    if "openvino" in anchors:
        makers["openvino"] = lambda: _ov_runner(_onnx(module, args, onnx_path), model.inputs,
                                                threads)  # fmt: skip
    systems: Systems = {}
    for name, make in makers.items():
        say(f"{model.name}: setting up {name}")
        systems[name] = _start(name, make, reference)
        if systems[name][1].missing.startswith("failed"):
            say(f"{model.name}: {name} {systems[name][1].missing}")
    return systems


def _eager_outputs(model) -> list[np.ndarray]:
    import torch

    with torch.no_grad():
        return _flat(model.torch_module(*model.torch_inputs))


def _absent_package(error: Exception) -> str | None:
    """The anchor package ``error`` says cannot be imported; ``None`` for any other error."""
    if not isinstance(error, ImportError) or not error.name:
        return None
    root = error.name.split(".")[0]
    return root if root in ANCHOR_PACKAGES else None


def _start(name: str, make: Callable[[], Runner], reference: list[np.ndarray]) -> tuple[
        Runner | None, SystemTiming]:  # fmt: skip
    """``make()`` a system and call it once (the warm-up: first calls pay one-off costs),
    its outputs checked against ``reference``; a system that cannot start is named with why."""
    from tensortune.deploy.torch_backend import stats as backend_stats

    timing = SystemTiming(name)
    start = time.perf_counter()
    eager_before = backend_stats.eager
    run = None
    try:
        run = make()
        outputs = run()
    except Exception as e:  # one system failing must not cost the others' figures
        if isinstance(run, OwnProcess):
            run.close()
        absent = _absent_package(e)
        timing.missing = (f"not installed ({absent}): pip install tensortune[anchors]" if absent
                          else f"failed: {type(e).__name__}: {last_line(e)}")  # fmt: skip
        return None, timing
    timing.setup_s = time.perf_counter() - start
    if backend_stats.eager > eager_before:
        timing.note = f"{backend_stats.eager - eager_before} graph(s) ran eagerly"
    if len(outputs) != len(reference):
        raise TensortuneError(f"{name} gave {len(outputs)} outputs, eager {len(reference)}")
    timing.max_abs_error = max((output_difference(o, r)
                                for o, r in zip(outputs, reference, strict=True)),
                               default=0.0)  # fmt: skip
    return run, timing


def _time_own_process(systems: Systems, model, threads: int, work: Path, rounds: int,
                      repeat: int) -> SystemTiming:  # fmt: skip
    """The artifact in a process of its own, timed after the other systems, in turns with the
    tuned build only (its rounds are the pair's ``baseline``).

    Not beside the others: in two runs on an AMD Zen 5 with the child alive throughout, ONNX
    Runtime and PyTorch (both with thread pools that spin while they wait) had bursts of
    rounds 3-4x slower than their others; the two runs without it there had none."""
    tuned, shipped = systems[TUNED][0], systems.get("tensortune.load", (None, None))[0]
    if tuned is None or shipped is None:
        return SystemTiming(OWN_PROCESS, missing="failed: there is no artifact to load")
    artifact = work / f"{model.name}.tt"
    run, timing = _start(OWN_PROCESS,
                         lambda: OwnProcess(artifact, model.inputs, threads, work),
                         _eager_outputs(model))  # fmt: skip
    if run is None:
        return timing
    beside = SystemTiming(TUNED)
    pair: Systems = {TUNED: (tuned, beside), OWN_PROCESS: (run, timing)}
    try:
        _time_in_turns(pair, rounds, repeat)
    finally:
        _close(pair)
    timing.baseline = beside.rounds if timing.rounds else []
    timing.note = f"timed apart, in turns with {TUNED}"
    return timing


def _time_in_turns(systems: Systems, rounds: int, repeat: int) -> None:
    for _ in range(rounds):
        for name, (run, timing) in systems.items():
            if isinstance(run, OwnProcess):  # it times itself, where it runs
                try:
                    timing.rounds.append(run.median_of(repeat))
                except TensortuneError as e:  # a crashed child costs only its own figures
                    timing.rounds, timing.missing = [], f"failed while timed: {e}"
                    systems[name] = (None, timing)
            elif run is not None:
                times = [seconds_per_call(run) for _ in range(repeat)]
                timing.rounds.append(statistics.median(times))


def _close(systems: Systems) -> None:
    """End the processes of systems that run in one of their own."""
    for run, _ in systems.values():
        if isinstance(run, OwnProcess):
            run.close()


def _flat(value) -> list[np.ndarray]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value.detach().numpy()]
    if hasattr(value, "numpy"):
        return [np.asarray(value.numpy())]
    if isinstance(value, np.ndarray):
        return [value]
    return [a for v in value for a in _flat(v)]


def _tvm_runner(model, store: Path, platform: Platform, built: dict) -> Runner:
    from tensortune.compat import tvm
    from tensortune.measure.executable import as_arrays
    from tensortune.records import open_records
    from tensortune.records.ms_database import StoreDatabase

    with open_records(f"sqlite:///{store}", create=False) as records:
        db = StoreDatabase(records, target=platform)
        executable = build_tuned(db, model.mod, platform)
    built["executable"] = executable
    dev = tvm.cpu()
    vm = tvm.relax.VirtualMachine(executable, dev)
    inputs = [tvm.runtime.tensor(x, dev) for x in model.inputs]
    main = vm["main"]

    def run() -> list[np.ndarray]:
        with affinity_kept():  # else the anchors timed next would share TVM's one core
            return as_arrays(main(*inputs))

    run()
    with affinity_kept():
        pool = int(tvm.get_global_func("runtime.NumThreads")())
    want = platform.threads
    if pool != want:
        raise TensortuneError(f"TVM runs {pool} threads in this process, not {want}: "
                              f"set TVM_NUM_THREADS={want}")  # fmt: skip
    return run


def _artifact_runner(executable, model, platform: Platform, work: Path) -> Runner:
    from tensortune.deploy.artifact import load, save_artifact

    if executable is None:
        raise TensortuneError("there is no tuned build to ship: it failed to set up")
    path = save_artifact(executable, work / f"{model.name}.tt", model=model,
                         target=platform.target, threads=platform.threads)  # fmt: skip
    compiled = load(path)

    def run() -> list[np.ndarray]:
        return _flat(compiled(*model.inputs))

    return run


def _torch_runner(module, args: tuple) -> Runner:
    import torch

    def run() -> list[np.ndarray]:
        with torch.no_grad():
            return _flat(module(*args))

    return run


def _onnx(module, args: tuple, path: Path) -> Path:
    """The model as ONNX (the legacy exporter: the default one needs onnxscript)."""
    if not path.exists():
        import torch

        partial = path.with_suffix(".partial.onnx")
        torch.onnx.export(module, args, str(partial), dynamo=False, opset_version=17)
        partial.replace(path)
    return path


def _ort_runner(path: Path, inputs: list[np.ndarray], threads: int) -> Runner:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = {i.name: x for i, x in zip(session.get_inputs(), inputs, strict=True)}

    def run() -> list[np.ndarray]:
        return session.run(None, feed)

    return run


def _ov_runner(path: Path, inputs: list[np.ndarray], threads: int) -> Runner:
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(path)), "CPU", {
        "INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "f32",
        "PERFORMANCE_HINT": "LATENCY"})  # fmt: skip
    request = compiled.create_infer_request()

    def run() -> list[np.ndarray]:
        result = request.infer(inputs)
        return [np.asarray(result[o]) for o in compiled.outputs]

    return run


def plot_e2e(results: list[E2EResult], out: str | Path) -> None:
    """Per network: each system's median latency relative to the tuned build's (lower is
    faster), with the spread over rounds as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [TUNED, *[n for n in ANCHORS if any(n in r.systems for r in results)]]
    # the routes run the tuned kernels: they belong in the table, not in this comparison
    fig, ax = plt.subplots(figsize=(3.2 + 1.5 * len(results), 3.8))
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        xs, ys, lo, hi = [], [], [], []
        for i, r in enumerate(results):
            # the table's figure: the median of each round's ratio, its range the bar's
            ratios = r.round_ratios(name) if name in r.systems else []
            if not ratios:
                continue
            mid = statistics.median(ratios)
            xs.append(i + (k - (len(names) - 1) / 2) * width)
            ys.append(mid)
            lo.append(mid - min(ratios))
            hi.append(max(ratios) - mid)
        ax.bar(xs, ys, width, yerr=[lo, hi], label=name, capsize=2)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xticks(range(len(results)), [r.network for r in results])
    ax.set_ylabel("latency / tensortune's (median of rounds)")
    ax.set_title(f"{results[0].cpu}, {results[0].threads} threads" if results else "",
                 fontsize=9)  # fmt: skip
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # off the bars
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
