"""What runs inside a measurement worker process.

A worker imports TVM once and then serves build or run requests until it is told to stop, so no
request pays the 1-30 s of process start and TVM import that MetaSchedule's ``LocalBuilder``
pays per batch.  This module must not import TVM at module level: the parent imports it to
spawn the worker, and the worker sets its environment (thread count, torch blocking) first.
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

Signature = list[tuple[str, list[int]]]  # (dtype, shape) of each argument, in order


def serve(conn: Any) -> None:
    """Serve requests: receive ``(name, args)``, reply ``("ok", value)`` or ``("error", text)``."""
    leave_stops_to_parent()
    import tensortune.compat  # noqa: F401  (TVM without torch; paid before the first request)

    conn.send(("ready", os.getpid()))
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        name, args = request
        try:
            conn.send(("ok", _HANDLERS[name](*args)))
        except Exception as e:
            conn.send(("error", _describe(e)))


def tie_to_parent() -> None:
    """Die with the process that started this worker, and leave Ctrl-C to it.

    A terminal's Ctrl-C reaches the whole process group: the parent stops its run and closes
    its workers; a worker killed by the same signal first made that a broken pipe.  A parent
    killed outright (``kill -9``) would leave a worker timing a hanging kernel for ever: Linux
    sends this one SIGKILL when it goes (``PR_SET_PDEATHSIG``; it follows the thread that
    started the worker, which outlives every pool its tuning run opens)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent went before the request was made
        os._exit(1)


def leave_stops_to_parent() -> None:
    """:func:`tie_to_parent`, and leave the parent SIGHUP and SIGTERM too.

    A closed terminal's SIGHUP and a service manager's SIGTERM reach the whole process group
    (or control group): the parent finishes the batch in flight, then ends its workers itself
    (a None request, or SIGKILL).  A worker killed by them first had its program recorded as a
    failure ("worker killed by SIGHUP"), for good."""
    import signal

    tie_to_parent()
    for sig in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)


def _describe(e: BaseException) -> str:
    from tensortune.errors import last_line

    return f"{type(e).__name__}: {last_line(e)}"


def build(mod: Any, target: dict, out_path: str) -> str:
    """Compile a scheduled module and link it into a shared library, ready to ``dlopen``.

    Linking here (in parallel workers) rather than in the runner keeps the serial run phase
    short; ``export_library`` also forces LLVM code generation, which TVM otherwise defers to
    the first call.
    """
    _compile(mod, target).export_library(out_path, fcompile=_link)
    return out_path


def assembly(mod: Any, target: dict) -> str:
    """The assembly LLVM generates for a scheduled module; nothing is linked or run."""
    return _compile(mod, target).mod.inspect_source("asm")


def lower(mod: Any, target: dict, read: Callable[[Any, dict], Any] | None = None) -> Any:
    """The module as TVM lowers it for ``target``, just before LLVM, less TVM's unrolling
    (``features.lowered`` replays that), or what ``read(lowered, target)`` makes of it: the
    caller's reading of the module, done here so that a few numbers travel back instead of
    the module (~100 KB pickled).  In a worker because TVM may crash or hang on an odd
    schedule."""
    from tensortune.compat import lower_for_codegen

    lowered = lower_for_codegen(mod, target, unroll=False)
    return lowered if read is None else read(lowered, target)


def _compile(mod: Any, target: dict) -> Any:
    from tensortune.compat import build_ready, tvm

    return tvm.compile(build_ready(mod), target=tvm.target.Target(target))


@functools.cache
def _linker() -> tuple[str, str] | None:
    """``ld`` and the C compiler's runtime library, when both are there.

    TVM links each kernel through ``g++`` (~45 ms, a tenth of a build); ``ld`` alone takes
    ~5 ms.  Naming libgcc and libm resolves the same helper and math symbols as the driver.
    """
    ld, cc = shutil.which("ld"), shutil.which("gcc") or shutil.which("cc")
    if ld is None or cc is None:
        return None
    try:
        found = subprocess.run([cc, "-print-libgcc-file-name"], capture_output=True, text=True,
                               check=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    libgcc = found.stdout.strip()
    return (ld, libgcc) if os.path.isfile(libgcc) else None


def _link(output: str, objects: list[str], options: list[str] | None = None, **_: Any) -> None:
    tools = _linker()
    if tools is not None and not options:
        ld, libgcc = tools
        cmd = [ld, "-shared", "-o", output, *objects, libgcc, "-lm", "-lc"]
        if subprocess.run(cmd, capture_output=True).returncode == 0:
            return
    from tvm.support import cc

    cc.create_shared(output, objects, options=options)


_loaded: dict[str, Any] = {}


def _load(path: str) -> Any:
    import tvm

    if path not in _loaded:
        if len(_loaded) > 64:  # references stay; candidates are loaded once each anyway
            _loaded.clear()
        _loaded[path] = tvm.runtime.load_module(path)
    return _loaded[path]


def _arguments(signature: Signature, seed: int) -> list:
    import numpy as np
    import tvm

    rng = np.random.default_rng(seed)
    dev = tvm.cpu()
    out = []
    for dtype, shape in signature:
        if dtype.startswith(("int", "uint")):
            data = rng.integers(0, 8, size=shape).astype(dtype)
        elif dtype == "bool":
            data = rng.integers(0, 2, size=shape).astype(bool)
        else:
            data = rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
        out.append(tvm.runtime.tensor(data, dev))
    return out


_outputs: dict[tuple[str, str], Any] = {}
# Reference outputs kept for the next candidate of the same kernel, up to this many bytes.
KEEP_OUTPUT_BYTES = 1 << 28


def _expected(reference: str, signature: Signature) -> list[tuple[int, Any]]:
    """The reference build's outputs on the arguments every candidate gets, as (argument
    index, values): every argument the build writes, wherever it stands in the signature
    (the last one, when none changed).  Computed once per kernel, not per candidate (an
    unscheduled build's loops can take longer than the candidate itself, inside its time
    limit)."""
    import numpy as np

    key = (reference, repr(signature))
    if key not in _outputs:
        expected = _arguments(signature, seed=0)
        before = [a.numpy() for a in expected]
        _load(reference)(*expected)
        after = [a.numpy() for a in expected]
        written = [i for i, (b, a) in enumerate(zip(before, after, strict=True))
                   if not np.array_equal(b, a)] or [len(after) - 1]  # fmt: skip
        if sum(a.nbytes for kept in _outputs.values() for _, a in kept) > KEEP_OUTPUT_BYTES:
            _outputs.clear()
        _outputs[key] = [(i, after[i]) for i in written]
    return _outputs[key]


def output_tolerance(dtype: Any) -> float:
    """Relative tolerance of an output check: 1e-3, or 8 units in the last place of a coarser
    float (float16, bfloat16: a sum taken in another order lands a few units away).  The
    candidate's check here and ``compile``'s check of a whole tuned build share it."""
    import ml_dtypes

    try:
        return max(1e-3, 8 * float(ml_dtypes.finfo(dtype).eps))
    except ValueError:  # integers and bools
        return 1e-3


def _mismatch(got: Any, want: Any) -> str | None:
    """What is wrong with one output (None: within tolerance of the reference's)."""
    import numpy as np

    if got.shape != want.shape:
        return f"output shape {got.shape} differs from the reference's {want.shape}"
    tol = output_tolerance(want.dtype)
    # as float64: a mask's bools cannot be subtracted, nor bfloat16 compared
    got, want = got.astype(np.float64), want.astype(np.float64)
    scale = float(np.abs(want).max()) if want.size else 0.0
    if np.allclose(got, want, rtol=tol, atol=tol / 10 * max(1.0, scale), equal_nan=True):
        return None
    return f"output differs from the reference (max error {float(np.abs(got - want).max()):.3g})"


def run(
    path: str,
    signature: Signature,
    number: int,
    repeat: int,
    min_repeat_ms: int,
    cache_flush: bool,
    reference: str | None,
    max_wait_share: float = 1.0,
    retries: int = 0,
    retry_until_s: float = math.inf,
) -> dict:
    """Time a built kernel; with a reference library, also compare outputs first.

    A timing during which runnable tasks waited for a CPU more than ``max_wait_share`` of the
    time is repeated (``retries`` times at most, pausing in between, and none that would end
    past ``retry_until_s`` seconds after the call began: the caller's time limit would kill a
    candidate that only met a busy machine); the result says whether even the kept timing was
    ``contended``.
    """
    import statistics
    import time

    import tvm

    from tensortune.measure.affinity import keep_caller_off_pool_cores
    from tensortune.measure.contention import CpuWatch

    began = time.monotonic()
    keep_caller_off_pool_cores()
    module = _load(path)
    args = _arguments(signature, seed=0)
    if reference is not None:
        module(*args)
        for i, want in _expected(reference, signature):
            message = _mismatch(args[i].numpy(), want)
            if message is not None:
                return {"costs": [], "mismatch": message}
    evaluator = module.time_evaluator(
        module.entry_name,
        tvm.cpu(),
        number=number,
        repeat=repeat,
        min_repeat_ms=min_repeat_ms,
        # TVM's flush evicts every argument but the first (the input being streamed) from cache.
        f_preproc="cache_flush_cpu_non_first_arg" if cache_flush else "",
    )
    contended: list[list[float]] = []
    took = 0.0  # the last timing's seconds: the next one takes about as long
    for attempt in range(retries + 1):
        if attempt:
            pause = 0.2 * 2 ** (attempt - 1)
            if time.monotonic() + pause + took > began + retry_until_s:
                break
            time.sleep(pause)
        watch, start = CpuWatch(), time.monotonic()
        costs = [float(c) for c in evaluator(*args).results]
        took = time.monotonic() - start
        share = watch.share()
        if share is None or share <= max_wait_share:
            return {"costs": costs, "mismatch": None, "contended": False}
        contended.append(costs)
    # Contention only slows a kernel down: the fastest contended timing is the least wrong.
    return {"costs": min(contended, key=statistics.median), "mismatch": None, "contended": True}


def time_model(path: str, inputs: list, repeat: int) -> tuple[list, float, int]:
    """Outputs, median latency and thread count of an exported Relax executable's ``main``
    (see ``tensortune.deploy.compile``), timed here so that TVM's pool has the worker's size."""
    import tvm

    from tensortune.measure.affinity import keep_caller_off_pool_cores
    from tensortune.measure.executable import time_vm

    keep_caller_off_pool_cores()
    dev = tvm.cpu()
    vm = tvm.relax.VirtualMachine(_load(path), dev)
    outputs, seconds = time_vm(vm, [tvm.runtime.tensor(x, dev) for x in inputs], repeat)
    return outputs, seconds, int(tvm.get_global_func("runtime.NumThreads")())


def _ping() -> int:
    return os.getpid()


def adopt(cwd: str | None, log_path: str | None) -> int:
    """Take up the working directory and log of the pool that takes this (idle) worker over,
    as if it had been started there, forgetting the kernels it loaded for the last one (a
    path of theirs, removed, may name another file now) and the cores its timings kept it
    off."""
    from tensortune.measure.affinity import release_caller

    _loaded.clear()
    release_caller()
    if cwd is not None:
        try:
            here = os.getcwd()
        except OSError:  # removed under it
            here = None
        if sys.path and sys.path[0] == here:  # where ``python -m`` looks first: follow it
            sys.path[0] = cwd
        os.chdir(cwd)
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log_path or os.devnull, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    return os.getpid()


_HANDLERS = {
    "build": build,
    "assembly": assembly,
    "lower": lower,
    "run": run,
    "time_model": time_model,
    "ping": _ping,
    "adopt": adopt,
}


if __name__ == "__main__":
    from multiprocessing.connection import Connection

    serve(Connection(int(sys.argv[1])))
