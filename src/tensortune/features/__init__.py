"""Features cached in a dataset, computed from records alone (workload + trace + target).

- per-store: MetaSchedule's PerStoreFeature, one 164-float row per buffer store (block);
- trace tokens: one fixed-width vector per trace instruction (TLP's idea, rebuilt for
  MetaSchedule's instruction set: kind one-hot + log-scaled decisions, inputs and attributes);
- workload embedding: what kinds of blocks the workload has, and how big it is;
- hardware vector: what the target's ISA, the cores and the caches offer.

``features.code`` summarises the machine code LLVM generates for a program instead; it needs
a build (~0.3 s a program), so it is not among the features every dataset row caches.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tensortune.hardware import Platform

# ---- trace tokens ------------------------------------------------------------------------------

INSTRUCTION_KINDS = (
    "GetSBlock", "GetLoops", "GetChildBlocks", "GetProducers", "GetConsumers", "Split", "Fuse",
    "Reorder", "Parallel", "Vectorize", "Unroll", "Bind", "Annotate", "Unannotate",
    "SamplePerfectTile", "SampleCategorical", "SampleComputeLocation", "ComputeAt",
    "ReverseComputeAt", "ComputeInline", "ReverseComputeInline", "CacheRead", "CacheWrite",
    "RFactor", "DecomposeReduction", "Blockize", "Tensorize", "TransformLayout",
    "SetAxisSeparator", "EnterPostproc",
)  # fmt: skip
ANNOTATIONS = (
    "meta_schedule.parallel", "meta_schedule.vectorize", "meta_schedule.unroll_explicit",
    "meta_schedule.unroll_implicit", "meta_schedule.tiling_structure",
)  # fmt: skip
_N_DECISION, _N_INPUT, _N_ATTR = 6, 4, 2
TOKEN_WIDTH = len(INSTRUCTION_KINDS) + 1 + len(ANNOTATIONS) + 1 + _N_DECISION + _N_INPUT + _N_ATTR


def _log(x: float) -> float:
    return math.copysign(math.log2(abs(x) + 1.0), x)


def _numbers(value: object) -> list[float]:
    """Integers (and bools) found in an instruction field, flattened in order."""
    if isinstance(value, bool):
        return [float(value)]
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, list):
        return [n for v in value for n in _numbers(v)]
    return []


def trace_tokens(trace: list) -> np.ndarray:
    """``(instructions, TOKEN_WIDTH)`` float32 tokens of a MetaSchedule trace (JSON form).

    Instructions after ``EnterPostproc`` are left out: postprocessors apply them
    deterministically from the sampled decisions.
    """
    insts, decisions = trace
    decided = {int(i): d for i, d in decisions}
    rows = []
    kinds = {k: i for i, k in enumerate(INSTRUCTION_KINDS)}
    ann = {k: i for i, k in enumerate(ANNOTATIONS)}
    for index, (kind, inputs, attrs, _outputs) in enumerate(insts):
        if kind == "EnterPostproc":
            break
        row = np.zeros(TOKEN_WIDTH, dtype=np.float32)
        row[kinds.get(kind, len(INSTRUCTION_KINDS))] = 1.0
        base = len(INSTRUCTION_KINDS) + 1
        keys = [a for a in attrs if isinstance(a, str)]
        if kind in ("Annotate", "Unannotate") and keys:
            row[base + ann.get(keys[0], len(ANNOTATIONS))] = 1.0
        base += len(ANNOTATIONS) + 1
        for j, n in enumerate(_numbers(decided.get(index, []))[:_N_DECISION]):
            row[base + j] = _log(n)
        base += _N_DECISION
        for j, n in enumerate(_numbers([i for i in inputs if not isinstance(i, str)])[:_N_INPUT]):
            row[base + j] = _log(n)
        base += _N_INPUT
        for j, n in enumerate(_numbers([a for a in attrs if not isinstance(a, str)])[:_N_ATTR]):
            row[base + j] = _log(n)
        rows.append(row)
    return np.stack(rows) if rows else np.zeros((0, TOKEN_WIDTH), dtype=np.float32)


# ---- workload embedding ------------------------------------------------------------------------

_BLOCK_KINDS = (
    ("conv", re.compile(r"conv", re.I)),
    ("depthwise", re.compile(r"depthwise", re.I)),
    ("matmul", re.compile(r"matmul|dense|gemm|^C$", re.I)),
    ("pool", re.compile(r"pool", re.I)),
    ("softmax", re.compile(r"softmax|exp", re.I)),
    ("norm", re.compile(r"norm|mean|variance|rsqrt", re.I)),
    ("pad", re.compile(r"pad", re.I)),
    ("reduce", re.compile(r"_red|sum|max", re.I)),
    ("elementwise", re.compile(r"add|multiply|relu|gelu|tanh|divide|subtract|compute", re.I)),
    ("layout", re.compile(r"reshape|transpose|squeeze|slice|broadcast|concat|take", re.I)),
)
WORKLOAD_WIDTH = len(_BLOCK_KINDS) + 5


def workload_embedding(mod, flop: float) -> np.ndarray:
    """Block-kind counts (log-scaled) and size figures of a TIR workload, float32."""
    from tensortune.compat import ArgInfo, tvm

    sch = tvm.s_tir.Schedule(mod)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    names = [sch.get(b).name_hint for b in blocks]
    loops = sum(len(sch.get_loops(b)) for b in blocks)
    args = ArgInfo.from_prim_func(mod["main"])
    out_elems = int(np.prod([int(d) for d in args[-1].shape])) if args else 1
    vec = np.zeros(WORKLOAD_WIDTH, dtype=np.float32)
    for name in names:
        for k, (_, pattern) in enumerate(_BLOCK_KINDS):
            if pattern.search(name):
                vec[k] += 1
    vec[: len(_BLOCK_KINDS)] = np.log2(vec[: len(_BLOCK_KINDS)] + 1)
    vec[len(_BLOCK_KINDS) :] = [
        _log(flop), _log(len(names)), _log(loops), _log(out_elems), _log(flop / max(out_elems, 1))
    ]  # fmt: skip
    return vec


# ---- hardware vector ---------------------------------------------------------------------------

_ISA_FEATURES = ("sse4.2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vnni", "amx-tile")
HARDWARE_WIDTH = len(_ISA_FEATURES) + 6


def hardware_vector(platform: Platform) -> np.ndarray:
    """ISA features LLVM will use for the platform's target (not the host's), f32 SIMD lanes,
    threads and log2 cache sizes of the machine, float32."""
    from tensortune.compat import tvm

    t = platform.tvm_target
    have = [bool(tvm.target.codegen.llvm_cpu_has_features(f, t)) for f in _ISA_FEATURES]
    hardware = platform.hardware
    caches = hardware.caches
    return np.array(
        [*map(float, have), platform.simd_bits // 32, platform.threads, hardware.cores,
         *(_log(caches.get(k, 0)) for k in ("L1d", "L2", "L3"))],
        dtype=np.float32,
    )  # fmt: skip


# ---- per-store features ------------------------------------------------------------------------

PER_STORE_WIDTH = 164


def per_store_features(mod, platform: Platform, traces: list[list]) -> list[np.ndarray | None]:
    """PerStoreFeature rows of each trace replayed on ``mod`` (None where replay fails)."""
    from tensortune.compat import TuneContext, ms
    from tensortune.records.convert import candidate_from_trace

    ctx = TuneContext(mod, target=platform.tvm_target, num_threads=1)
    extractor = ms.feature_extractor.PerStoreFeature()
    cands: list = []
    where: list[int] = []
    for i, trace in enumerate(traces):
        try:
            cands.append(candidate_from_trace(mod, trace))
        except Exception:
            continue
        where.append(i)
    out: list[np.ndarray | None] = [None] * len(traces)
    for i, feats in zip(where, extractor.extract_from(ctx, cands) if cands else [], strict=True):
        out[i] = feats.numpy().astype(np.float32)
    return out


def schema_hash() -> str:
    """Changes whenever any feature's layout changes: datasets and models record it."""
    layout = {
        "tokens": [INSTRUCTION_KINDS, ANNOTATIONS, _N_DECISION, _N_INPUT, _N_ATTR],
        "workload": [k for k, _ in _BLOCK_KINDS] + ["flop", "blocks", "loops", "out", "ai"],
        "hardware": [*_ISA_FEATURES, "lanes", "threads", "cores", "L1d", "L2", "L3"],
        "per_store": PER_STORE_WIDTH,
    }
    return hashlib.sha256(json.dumps(layout).encode()).hexdigest()[:16]
