"""The one module that imports TVM's MetaSchedule.

Everything else in tensortune reaches MetaSchedule through the names re-exported here, so a
future TVM rename (``tvm.meta_schedule`` became ``tvm.s_tir.meta_schedule`` in 0.27) is
handled in one place.

Importing ``tvm.s_tir.tensor_intrin`` parses hundreds of TVMScript intrinsics for every ISA
(15-30 s); MetaSchedule imports it in every ``TuneContext`` and every builder.  We register
empty stand-ins first for the modules no search here can use: the CUDA/ROCm/Hexagon ones, and
the Arm/RISC-V CPU ones unless this host is one (candidates are measured on this host, so a
CPU target is this host's ISA).  That brings the import from ~1.6 s to ~0.25 s (without torch
loaded; about twice both with it).  Set ``TENSORTUNE_GPU_INTRINSICS=1`` to import the GPU ones
(GPU targets), ``TENSORTUNE_CPU_INTRINSICS=1`` to import every CPU ISA's (e.g. to replay
traces recorded on an Arm machine that tensorize with its intrinsics).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import platform
import sys
import types
from collections.abc import Callable, Iterator

_GPU_INTRIN_MODULES = ("cuda", "rocm", "hexagon")
# Tensor intrinsics of each CPU ISA, by the prefixes of ``platform.machine()`` that run it.
_CPU_INTRIN_MODULES = {"arm_cpu": ("arm", "aarch"), "riscv_cpu": ("riscv",)}


def stub_unused_intrinsics() -> None:
    """Make the tensor-intrinsic modules that no search on this host uses cheap no-ops: GPU
    ones unless ``TENSORTUNE_GPU_INTRINSICS=1``, other CPU ISAs' unless
    ``TENSORTUNE_CPU_INTRINSICS=1``."""
    names: list[str] = []
    if os.environ.get("TENSORTUNE_CPU_INTRINSICS") != "1":
        host = platform.machine().lower()
        names += [n for n, isa in _CPU_INTRIN_MODULES.items() if not host.startswith(isa)]
    if os.environ.get("TENSORTUNE_GPU_INTRINSICS") != "1":
        names += _GPU_INTRIN_MODULES
    for name in names:
        full = f"tvm.s_tir.tensor_intrin.{name}"
        sys.modules.setdefault(full, types.ModuleType(full))


def _import_tvm_without_torch() -> None:
    """Import TVM while hiding torch from it.

    tvm_ffi imports torch eagerly when it is installed (+2-4 s per process, and a larger
    ``sys.modules`` that doubles TVMScript parsing time).  We never hand torch tensors to TVM,
    so torch stays hidden during the import and importable normally afterwards.
    """
    if "torch" in sys.modules:
        import tvm

        return
    sys.modules["torch"] = None  # type: ignore[assignment]  # makes `import torch` fail fast
    try:
        import tvm  # noqa: F401
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]


stub_unused_intrinsics()
_import_tvm_without_torch()

import tvm  # noqa: E402
import tvm_ffi  # noqa: E402

# For remote measurement (measure/rpc.py): ``tvm_rpc`` (TVM's RPC client), ``rpc_base`` (the
# tracker's wire protocol) and ``rpc_listen_loop``, the server's accept/serve loop.  That one is
# private: ``rpc.Server`` runs it in a child process that outlives a SIGTERM to its parent
# (keeping the port), so ``tensortune serve`` runs it in its own main thread instead.
from tvm import rpc as tvm_rpc  # noqa: E402
from tvm.ir.utils import derived_object  # noqa: E402
from tvm.rpc import base as rpc_base  # noqa: E402
from tvm.rpc.server import _listen_loop as rpc_listen_loop  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402
from tvm.s_tir.meta_schedule.arg_info import ArgInfo  # noqa: E402
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder  # noqa: E402
from tvm.s_tir.meta_schedule.cost_model import PyCostModel  # noqa: E402
from tvm.s_tir.meta_schedule.database import (  # noqa: E402
    PyDatabase,
    TuningRecord,
    Workload,
)
from tvm.s_tir.meta_schedule.measure_callback import PyMeasureCallback  # noqa: E402
from tvm.s_tir.meta_schedule.runner import (  # noqa: E402
    PyRunner,
    PyRunnerFuture,
    RunnerFuture,
    RunnerInput,
    RunnerResult,
)
from tvm.s_tir.meta_schedule.search_strategy import (  # noqa: E402
    MeasureCandidate,
    PySearchStrategy,
)
from tvm.s_tir.meta_schedule.task_scheduler import PyTaskScheduler  # noqa: E402
from tvm.s_tir.meta_schedule.tune_context import TuneContext  # noqa: E402

TVM_VERSION: str = tvm.__version__


@contextlib.contextmanager
def tvm_logging_guard() -> Iterator[None]:
    """Run MetaSchedule code that (re)configures its loggers.

    TVM rebuilds its logging config from the handlers already on its logger and fails on any
    it did not create itself (pytest's capture, a notebook's), so those step aside meanwhile.
    """
    root = logging.getLogger("tvm.s_tir.meta_schedule")
    foreign = [h for h in root.handlers if not (h.get_name() or "").startswith(root.name)]
    for h in foreign:
        root.removeHandler(h)
    try:
        yield
    finally:
        for h in foreign:
            root.addHandler(h)


def closed_on_exit(cls: type) -> type:
    """A ``derived_object`` class whose objects a ``with`` block closes (``close()``): the
    wrapper ``derived_object`` makes forwards attributes, not the special methods ``with``
    looks up on the type."""
    cls.__enter__ = lambda self: self  # type: ignore[attr-defined]
    cls.__exit__ = lambda self, *exc: self.close()  # type: ignore[attr-defined]
    return cls


def load_tensor_intrinsics() -> None:
    """Pay the one-off import the first ``TuneContext`` of a process triggers, now."""
    import tvm.s_tir.tensor_intrin  # noqa: F401


def mutate(mutator: object, trace: object, seed: int) -> object | None:
    """One mutation of ``trace`` drawn with ``seed`` (None: the mutator found none).
    ``Mutator.apply`` seeds every call from the device's entropy, so two searches with the
    same seed would mutate differently."""
    from tvm.s_tir.meta_schedule import _ffi_api as ms_api

    return ms_api.MutatorApply(mutator, trace, seed)


def structural_hash(mod: tvm.IRModule) -> str:
    """Structural hash as an unsigned decimal string (the form MetaSchedule's JSON files use)."""
    return str(tvm_ffi.structural_hash(mod) & 0xFFFFFFFFFFFFFFFF)


def structural_equal(a: object, b: object) -> bool:
    return bool(tvm_ffi.structural_equal(a, b))


def task_func(mod: tvm.IRModule) -> tvm.tirx.PrimFunc:
    """A task module's PrimFunc: the one called ``main``, or its only function."""
    if "main" in [g.name_hint for g in mod.get_global_vars()]:
        return mod["main"]
    funcs = list(mod.functions.values())
    if len(funcs) != 1:
        raise ValueError("a task module has one function, or one called 'main'")
    return funcs[0]


# TVM 0.27 exposes no TIR visitor to Python: walk the node fields that can hold statements or
# expressions.  Anything else (buffers, ranges, annotations) holds no block and no call.
_CHILDREN = ("body", "block", "init", "seq", "then_case", "else_case", "value", "a", "b",
             "args", "condition", "true_value", "false_value", "indices", "source")  # fmt: skip


def walk_tir(node: object, visit: Callable[[object], None]) -> None:
    """Call ``visit`` on ``node`` and every statement and expression under it, parents first."""
    visit(node)
    for name in _CHILDREN:
        child = getattr(node, name, None)
        if child is None or isinstance(child, str | int | float):
            continue
        if isinstance(child, list | tuple) or type(child).__name__ == "Array":
            for c in child:
                if not isinstance(c, str | int | float):
                    walk_tir(c, visit)
        else:
            walk_tir(child, visit)


def sblocks(body: object) -> list:
    """The blocks under ``body``, in program order (outer blocks before inner ones)."""
    found: list = []
    walk_tir(body, lambda n: found.append(n) if isinstance(n, tvm.s_tir.SBlock) else None)
    return found


# tvm-ffi's JSON graph writes fields of these static types inline (None, int, bool, float,
# dtype); a field of any other type holds the index of another node.
_INLINE_FIELDS = frozenset({0, 1, 2, 3, 5})
_CONTAINERS = frozenset({"ffi.Array", "ffi.List", "ffi.Map", "ffi.Dict"})


@functools.cache
def _reference_fields(type_key: str) -> frozenset[str]:
    """The fields of ``type_key``'s objects (its ancestors' included) that refer to nodes."""
    if tvm_ffi.core._object_type_key_to_index(type_key) is None:
        return frozenset()  # an unknown type: TVM refuses it in one line
    info = tvm_ffi.core._lookup_or_register_type_info_from_type_key(type_key)
    names = set()
    while info is not None:
        names.update(f.name for f in info.fields if f.field_static_type_index not in _INLINE_FIELDS)
        info = info.parent_type_info
    return frozenset(names)


# How many levels of references TVM's JSON graph reader may follow (about two a level of IR
# nesting): it decodes them depth first, recursively.  On an 8 MiB stack 2,015 read and
# 2,815 crashed; the deepest workload of the shipped datasets is 54, a concatenation of 600
# tensors 1,214.  Records stores refuse to store a deeper module (``workload_id``).
MAX_GRAPH_DEPTH = 1500


def json_graph_problem(graph: object) -> str | None:
    """Why ``graph`` (TVM's JSON graph of an object, parsed) cannot be handed to TVM, or None.

    TVM writes every node after the nodes it refers to; its reader follows references
    recursively, so a node that refers to itself or to a later one (a cycle, in a file that
    was damaged or made by hand) recurses until the process dies of a segfault; so does a
    chain of backward references deeper than its stack (``MAX_GRAPH_DEPTH``)."""
    nodes = graph.get("nodes") if isinstance(graph, dict) else None
    root = graph.get("root_index") if isinstance(graph, dict) else None
    if not (isinstance(nodes, list) and type(root) is int and 0 <= root < len(nodes)):
        return "not TVM's JSON graph of an object"
    depth = [1] * len(nodes)  # a node's, counted along its references (all to earlier nodes)
    for i, node in enumerate(nodes):
        kind = node.get("type") if isinstance(node, dict) else None
        if type(kind) is not str:
            return f"node {i} has no type"
        data = node.get("data")
        if kind in _CONTAINERS and isinstance(data, list):
            refs = data
        elif isinstance(data, dict):
            refs = [data[name] for name in _reference_fields(kind) if name in data]
        else:
            continue
        if any(type(r) is int and r >= i for r in refs):
            return f"node {i} refers to a node that is not written before it (a cycle)"
        depth[i] = 1 + max((depth[r] for r in refs if type(r) is int and r >= 0), default=0)
        if depth[i] > MAX_GRAPH_DEPTH:
            return f"its references nest deeper than {MAX_GRAPH_DEPTH} levels"
    return None


def load_ir_json(text: str) -> object:
    """``tvm.ir.load_json(text)`` for text read from a file: a graph TVM's reader would die on
    is refused with ``ValueError`` (TVM's own errors for other damage pass through)."""
    try:
        graph = json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError("not JSON") from None
    problem = json_graph_problem(graph)
    if problem:
        raise ValueError(problem)
    return tvm.ir.load_json(text)


def block_names(mod: tvm.IRModule) -> list[str]:
    """The names of a task's blocks but ``root``, in program order: what traces refer to."""
    return [b.name_hint for b in sblocks(task_func(mod).body) if b.name_hint != "root"]


def build_ready(mod: tvm.IRModule) -> tvm.IRModule:
    """A scheduled module as MetaSchedule's default builder prepares it: candidates whose
    weights were laid out anew (RewriteLayout) take the rewritten weights directly."""
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)


def lower_for_codegen(mod: tvm.IRModule, target: dict, *, unroll: bool = True) -> tvm.IRModule:
    """``mod`` lowered by TVM's default TIR pipeline for ``target``: loops unrolled and
    vectorized as LLVM will receive them, before host/device split and code generation.
    The same steps as ``tvm.tirx.build`` up to its pipeline (BindTarget first: the passes
    read the target from the functions).  ``unroll=False`` leaves out the pipeline's
    ``UnrollLoop``: the loops it would copy out stay loops under their unroll pragmas, and the
    simplifiers after it run on one body instead of hundreds of copies (several times faster:
    benchmarks/RESULTS.md, stop 51)."""
    t = tvm.target.Target(target)
    t = t.with_host(t.host or t)
    mod = tvm.tirx.transform.BindTarget(t)(build_ready(mod))
    pipeline, _, _ = tvm.tirx.get_default_tir_pipeline(t)
    if unroll:
        return pipeline(mod)
    # The caller's context, less the one pass.  Its instruments stay out: entered again here,
    # they would be exited here too, and a PassTimingInstrument around would lose its profile.
    ctx = tvm.transform.PassContext.current()
    without = tvm.transform.PassContext(
        opt_level=ctx.opt_level, required_pass=list(ctx.required_pass),
        disabled_pass=[*ctx.disabled_pass, "tirx.UnrollLoop"], config=dict(ctx.config),
    )  # fmt: skip
    with without:
        return pipeline(mod)


__all__ = [
    "TVM_VERSION",
    "ArgInfo",
    "BuilderInput",
    "BuilderResult",
    "MeasureCandidate",
    "PyBuilder",
    "PyCostModel",
    "PyDatabase",
    "PyMeasureCallback",
    "PyRunner",
    "PyRunnerFuture",
    "PySearchStrategy",
    "PyTaskScheduler",
    "RunnerFuture",
    "RunnerInput",
    "RunnerResult",
    "TuneContext",
    "TuningRecord",
    "Workload",
    "block_names",
    "build_ready",
    "closed_on_exit",
    "derived_object",
    "json_graph_problem",
    "load_ir_json",
    "load_tensor_intrinsics",
    "lower_for_codegen",
    "ms",
    "mutate",
    "rpc_base",
    "rpc_listen_loop",
    "sblocks",
    "structural_equal",
    "structural_hash",
    "task_func",
    "tvm",
    "tvm_ffi",
    "tvm_logging_guard",
    "tvm_rpc",
    "walk_tir",
]
