"""Register-blocked seeds: a task's first programs tiled by rule, not by chance.

Why: a CPU runs a matrix product or convolution near its peak only with a register-blocked
micro-kernel: a few rows times a few vectors of outputs kept in registers while a long stretch
of the reduction streams through them.  MetaSchedule's CPU design space holds such kernels, but
its tile sizes are sampled at random and each loop's factor alone decides little, so a search
of minutes may not meet one.  GPT-2's 128×3072→768 product after 20 minutes of tuning (2-core
Intel Xeon, AVX-512) reduced 12 values per pass over 32×32 outputs; the tiling below (8 rows ×
2 vectors, 64-long reduction passes) ran it 1.13-1.14× faster, timed in turns with it.

How: MetaSchedule's ``MultiLevelTiling`` (``SSRSRS`` on CPUs) samples one perfect tiling per loop
of a block: four factors for a spatial loop, two for a reduction loop, in the block's loop
order.  A seed is a design-space sketch with those decisions set:

- the last spatial loop (the output's contiguous axis: a matrix's columns, a channels-last
  convolution's output channels) ends in ``nv`` vectors of the target's lanes, or, where
  those do not divide it (1000 classes, 24 or 40 channels), in one narrower vector of a
  power-of-two width (``vector_width``);
- the nearest spatial loop before it with more than one iteration (rows, image width) ends in
  the most rows whose ``rows × nv`` accumulators, ``nv`` loaded vectors and one broadcast fit
  the vector registers;
- the next level up gathers up to ``TILE_ROWS`` rows (the rows loop first, then the loops
  before it), so a stretch of weights loaded into the caches serves that many rows;
- the last reduction loop (the channels or the inner dimension) runs its largest factor up
  to the space's innermost limit inside the tile, other reduction loops (kernel windows) around;
- everything else stays outside, where it is run in parallel; the explicit unroll is 16 or 64.

Seeds are made for every sketch (each consumer placement) and ``nv`` = 1, 2, 4 where they fit,
two unroll steps each (18 for a task with one tiled block and MetaSchedule's three CPU
sketches), and post-processed like any candidate. Where a postprocessor refuses a seed, the
other blocks' tiles are drawn anew a few times; a seed that still fails is dropped.
A vector holds as many lanes as the widest accumulator of the task's reducing blocks fits, but
no narrower than float32's (8 float64 or 16 int32 with AVX-512): CPUs without native float16
arithmetic compute half precision in float32 registers.
Sketches without a ``SSRSRS`` block (GPU spaces, element-wise tasks) give none.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tensortune.compat import MeasureCandidate, sblocks, task_func, tvm
from tensortune.search.space import replayed

if TYPE_CHECKING:
    from tensortune.hardware import Platform

STRUCTURE = "SSRSRS"
# Rows one tile at the second level gathers: 64 rows of a 64-long reduction pass are 16 KB
# of float32 inputs, within any L1 data cache.
TILE_ROWS = 64
UNROLL_STEPS = (16, 64)
VECTORS = (1, 2, 4)
# Draws of the other blocks' tiles tried for a seed a postprocessor refused as sketched.
REDRAWS = 4


def vector_registers(platform: Platform) -> int:
    """Vector registers the target's code may use: 32 with AVX-512 or on Arm, 16 on other x86."""
    triple = str(platform.tvm_target.attrs.get("mtriple", "")) or _host_arch()
    return 32 if platform.simd_bits >= 512 or triple.startswith(("aarch64", "arm64")) else 16


def _host_arch() -> str:
    import platform as host

    return host.machine()


def register_tiles(extents: list[int], spatial: list[bool], lanes: int, registers: int,
                   nv: int, innermost: int) -> list[list[int]] | None:  # fmt: skip
    """Each loop's tile factors (four per spatial loop, two per reduction loop) for a micro-
    kernel of ``nv`` vectors of ``lanes``; None where the last spatial loop does not split
    into such vectors or the innermost factor would pass ``innermost``."""
    s_idx = [i for i, s in enumerate(spatial) if s]
    r_idx = [i for i, s in enumerate(spatial) if not s]
    if not s_idx:
        return None
    col = s_idx[-1]
    width = vector_width(extents[col], lanes, nv, innermost)
    if width is None:
        return None
    tiles = [[e, 1, 1, 1] if s else [e, 1] for e, s in zip(extents, spatial, strict=True)]
    tiles[col] = [extents[col] // width, 1, 1, width]
    # Accumulators, the loaded vectors and one broadcast register share the register file.
    max_rows = min((registers - nv - 1) // nv, innermost)
    if max_rows < 1:
        return None
    before = [i for i in s_idx[:-1] if extents[i] > 1]
    budget = TILE_ROWS
    if before:
        row = before[-1]
        rows = _largest_divisor(extents[row], max_rows)
        budget = max(budget // rows, 1)
        rest = extents[row] // rows
        level2 = _largest_divisor(rest, budget)
        tiles[row] = [rest // level2, 1, level2, rows]
        budget //= level2
        for i in reversed(before[:-1]):  # then the loops outside it, e.g. image height
            level2 = _largest_divisor(extents[i], budget)
            tiles[i] = [extents[i] // level2, 1, level2, 1]
            budget //= level2
    if r_idx:
        k = r_idx[-1]
        inner = _largest_divisor(extents[k], innermost)
        tiles[k] = [extents[k] // inner, inner]
    return tiles


def vector_width(extent: int, lanes: int, nv: int, innermost: int) -> int | None:
    """The innermost factor of an output axis of ``extent`` for ``nv`` vectors: ``nv`` whole
    vectors where they divide it; where they do not and ``nv`` is 1, the widest power of two of
    at least 4 lanes that divides it (a 1000-class product: 8 of 16 lanes); else None.  Why
    powers of two: TVM vectorizes the loop as one LLVM vector of its extent, and LLVM splits a
    24-wide one badly; seeds 24 wide ran MobileNetV2's 1x1 convolutions 14 times slower than
    random programs (benchmarks/RESULTS.md)."""
    if extent % (lanes * nv) == 0 and lanes * nv <= innermost:
        return lanes * nv
    if nv != 1:
        return None
    narrower = (lanes // 2, lanes // 4, lanes // 8)
    return max((w for w in narrower if 4 <= w <= innermost and extent % w == 0), default=None)


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, max(min(n, at_most), 1) + 1) if n % d == 0)


def seed_candidates(mod: tvm.IRModule, design_spaces: list, postprocs: list,
                    platform: Platform) -> list[MeasureCandidate]:  # fmt: skip
    """The register-blocked seeds of ``mod`` (see the module docstring), post-processed."""
    lanes = platform.simd_bits // accumulator_bits(mod)
    if lanes < 1:
        return []
    registers = vector_registers(platform)
    out = (_replayed_or_redrawn(mod, trace, postprocs) for space in design_spaces
           for trace in _seed_traces(space.trace, lanes, registers))  # fmt: skip
    return [c for c in out if c is not None]


def _replayed_or_redrawn(mod: tvm.IRModule, trace: object,
                         postprocs: list) -> MeasureCandidate | None:  # fmt: skip
    """``trace`` post-processed; where a postprocessor refuses it, the same with the tiles of
    the blocks the seed does not set drawn anew (``REDRAWS`` fixed draws, the first accepted).
    Why: a seed keeps the sketch's own draws for the other blocks, and those may not fit.
    ResNet's 56×56 Winograd tasks split the input transform's 196 tiles 4 × 49, so each part
    reads a varying number of image rows, and ``DisallowDynamicLoop`` refused every seed."""
    found = replayed(mod, trace, postprocs)
    if found is not None:
        return found
    ours = [inst for group in _tiled_blocks(trace) for inst in group]
    free = trace
    for inst in trace.insts:
        if inst.kind.name == "SamplePerfectTile" and not any(inst.same_as(o) for o in ours):
            free = free.with_decision(inst, None, remove_postproc=True)
    if free is trace:
        return None
    for draw in range(1, REDRAWS + 1):  # TVM's schedule seeds start at 1
        found = replayed(mod, free, postprocs, seed=draw)
        if found is not None:
            return found
    return None


def accumulator_bits(mod: tvm.IRModule) -> int:
    """The widest type the reducing blocks of ``mod`` write, in bits, 32 at least: what the
    micro-kernel keeps in registers (see the module docstring)."""
    bits = [int(w.source.dtype.bits) for b in sblocks(task_func(mod).body)
            if any(int(iv.iter_type) == 2 for iv in b.iter_vars) for w in b.writes]  # fmt: skip
    return max([32, *bits])


def _seed_traces(trace, lanes: int, registers: int) -> list:
    groups = _tiled_blocks(trace)
    if not groups:
        return []
    unrolls = [i for i in trace.insts if i.kind.name == "SampleCategorical"
               and _unroll_candidates(i) is not None]  # fmt: skip
    out = []
    for nv in VECTORS:
        seeded = trace
        for insts in groups:
            extents = [math.prod(int(v) for v in trace.decisions[i]) for i in insts]
            spatial = [int(i.attrs[0]) == 4 for i in insts]
            # MetaSchedule's -1 is no limit; ours is then the longest pass we make (64)
            innermost = min(int(i.attrs[1]) if int(i.attrs[1]) > 0 else 64 for i in insts)
            tiles = register_tiles(extents, spatial, lanes, registers, nv, innermost)
            if tiles is None:
                seeded = None
                break
            for inst, factors in zip(insts, tiles, strict=True):
                seeded = seeded.with_decision(inst, factors, remove_postproc=True)
        if seeded is None:
            continue
        for step in UNROLL_STEPS:
            with_unroll = seeded
            for inst in unrolls:
                candidates = _unroll_candidates(inst)
                if step in candidates:
                    with_unroll = with_unroll.with_decision(inst, candidates.index(step),
                                                            remove_postproc=True)  # fmt: skip
            out.append(with_unroll)
    return out


def _tiled_blocks(trace) -> list[list]:
    """For each ``SSRSRS`` block of the trace, its tile-sampling instructions in loop order."""
    groups: list[list] = []
    current: list | None = None
    for inst in trace.insts:
        name = inst.kind.name
        if name == "Annotate" and len(inst.inputs) > 1 and str(inst.attrs[0]) == \
                "meta_schedule.tiling_structure":  # fmt: skip
            current = [] if str(inst.inputs[1]) == STRUCTURE else None
        elif name == "SamplePerfectTile" and current is not None:
            if int(inst.attrs[0]) not in (2, 4):
                current = None  # not the CPU structure after all
            else:
                current.append(inst)
        elif name == "Reorder" and current is not None:
            if current:
                groups.append(current)
            current = None
    return groups


def _unroll_candidates(inst) -> list[int] | None:
    """The unroll steps a ``SampleCategorical`` chooses between, if it chooses one."""
    try:
        values = [int(v) for v in inst.attrs[0]]
    except (TypeError, ValueError):
        return None
    return values if 0 in values and any(v in values for v in UNROLL_STEPS) else None
