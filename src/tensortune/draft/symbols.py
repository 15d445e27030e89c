"""Symbols of a scheduled program, read from its TIR loop nests: the draft model's only input.

One :class:`BlockSymbols` per block that computes something: how much work it does, how that
work is spread over cores (parallel loops) and SIMD lanes (vectorized loop), how much is
unrolled, and how many bytes its loop nest touches at each loop level.  The walk reads loop
kinds, extents and the blocks' declared read/write regions only (no expression trees), so
it costs far less than MetaSchedule's per-store feature extraction.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tensortune.compat import tvm

_UNROLL_KEYS = ("pragma_auto_unroll_max_step", "meta_schedule.unroll_explicit",
                "meta_schedule.unroll_implicit")  # fmt: skip


@dataclass
class BlockSymbols:
    name: str
    iterations: float  # product of all enclosing loop extents
    ops_per_iter: float  # 2 for a multiply-accumulate reduction, 1 otherwise
    parallel: float  # product of enclosing parallel loop extents (1: serial)
    vector: float  # extent of the vectorized loop (1: scalar)
    dtype_bits: int  # of the written buffer
    unroll: float  # largest auto-unroll step or unrolled extent in scope
    inner: float  # extent of the innermost loop (loop-overhead amortisation)
    # footprint[d]: bytes touched by one execution of the loops at depth >= d (d=0: whole nest);
    # trips[d]: how many times that sub-nest runs (product of extents above depth d).
    footprint: list[float] = field(default_factory=list)
    trips: list[float] = field(default_factory=list)
    unique_bytes: float = 0.0  # the buffers' sizes (compulsory traffic)
    launches: float = 0.0  # times the outermost parallel loop starts (thread-pool wake-ups)

    @property
    def work(self) -> float:
        return self.iterations * self.ops_per_iter


def _int(x: object, default: float = 1.0) -> float:
    try:
        return float(int(x))  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return default  # symbolic extent: unknown


def _var_names(expr: object) -> set[str]:
    return {v.name for v in tvm.tirx.analysis.undefined_vars(expr)}


def program_symbols(func: object) -> list[BlockSymbols]:
    """Symbols of every computing block of a scheduled ``PrimFunc`` (or an ``IRModule``)."""
    if isinstance(func, tvm.IRModule):
        func = func["main"]
    out: list[BlockSymbols] = []
    _walk(func.body, [], {}, out)
    return out


def _walk(stmt: object, loops: list, bound: dict[str, set[str]], out: list) -> None:
    """``loops``: enclosing ``For`` nodes, outermost first; ``bound``: block var -> loop vars."""
    if isinstance(stmt, tvm.tirx.For):
        loops.append(stmt)
        _walk(stmt.body, loops, bound, out)
        loops.pop()
    elif isinstance(stmt, tvm.s_tir.SBlockRealize):
        block = stmt.block
        inner = dict(bound)
        for iv, value in zip(block.iter_vars, stmt.iter_values, strict=True):
            names: set[str] = set()
            for n in _var_names(value):
                names |= bound.get(n, {n})
            inner[iv.var.name] = names
        if _computes(block):
            out.append(_block_symbols(block, loops, inner))
        if block.init is not None:
            _walk(block.init, loops, inner, out)
        _walk(block.body, loops, inner, out)
    elif isinstance(stmt, tvm.tirx.SeqStmt):
        for s in stmt.seq:
            _walk(s, loops, bound, out)
    elif isinstance(stmt, tvm.tirx.IfThenElse):
        _walk(stmt.then_case, loops, bound, out)
        if stmt.else_case is not None:
            _walk(stmt.else_case, loops, bound, out)
    elif hasattr(stmt, "body") and not isinstance(stmt, tvm.tirx.BufferStore):
        _walk(stmt.body, loops, bound, out)


def _computes(block) -> bool:
    """A leaf block that runs at run time: its body stores directly (blocks holding loops are
    containers), and it is not a weight-layout rewrite (done ahead of time at build)."""
    return isinstance(block.body, tvm.tirx.BufferStore) and (
        "meta_schedule.layout_rewrite_preproc" not in block.annotations
    )


def _block_symbols(block, loops: list, bound: dict[str, set[str]]) -> BlockSymbols:
    extents = [_int(lp.extent) for lp in loops]
    names = [lp.loop_var.name for lp in loops]
    parallel = vector = unroll = 1.0
    launches = 0.0
    outside = 1.0
    for lp, ext in zip(loops, extents, strict=True):
        kind = int(lp.kind)
        if kind == int(tvm.tirx.ForKind.PARALLEL):
            launches = launches or outside
            parallel *= ext
        elif kind == int(tvm.tirx.ForKind.VECTORIZED):
            vector = ext
        elif kind == int(tvm.tirx.ForKind.UNROLLED):
            unroll = max(unroll, ext)
        outside *= ext
        for key in _UNROLL_KEYS:
            if key in lp.annotations:
                unroll = max(unroll, _int(lp.annotations[key]))
    iterations = 1.0
    for e in extents:
        iterations *= e
    written = block.writes[0].source if len(block.writes) else None
    bits = int(written.dtype.bits) if written is not None else 32
    reduction = block.init is not None or any(
        int(iv.iter_type) == 2
        for iv in block.iter_vars  # CommReduce
    )
    # Which loops index each accessed region: a loop outside them re-reads the same tile.
    regions = []
    for region in list(block.reads) + list(block.writes):
        used: set[str] = set()
        sizes = []
        for r in region.region:
            for n in _var_names(r.min):
                used |= bound.get(n, set())
            sizes.append(_int(r.extent))
        elem = max(int(region.source.dtype.bits) // 8, 1)
        total = elem
        for d in region.source.shape:
            total *= _int(d)
        tile = elem
        for s in sizes:
            tile *= s
        regions.append((used, tile, total))
    depth = len(loops)
    footprint = [0.0] * (depth + 1)
    for used, tile, total in regions:
        size = tile
        for d in range(depth, -1, -1):  # innermost level first, growing outward
            if d < depth and names[d] in used:
                size *= extents[d]
            footprint[d] += min(size, total)
    trips = [1.0] * (depth + 1)
    for d in range(1, depth + 1):
        trips[d] = trips[d - 1] * extents[d - 1]
    unique = sum(min(total, tile * _prod(extents)) for _, tile, total in regions)
    return BlockSymbols(
        name=block.name_hint, iterations=iterations, ops_per_iter=2.0 if reduction else 1.0,
        parallel=parallel, vector=vector, dtype_bits=bits, unroll=unroll,
        inner=extents[-1] if extents else 1.0, footprint=footprint, trips=trips,
        unique_bytes=unique, launches=launches,
    )  # fmt: skip


def _prod(xs: list[float]) -> float:
    p = 1.0
    for x in xs:
        p *= x
    return p
