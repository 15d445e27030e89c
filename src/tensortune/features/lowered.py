"""Features of a program's hot loop as TVM lowers it, just before LLVM: the register tile.

Why: ``features.code`` showed that what ranks schedules on held-out networks is how many FMAs
each memory access feeds in the hot loop (register blocking): one count carried half of
XGBoost's gain and lifted held-out PCA by 8 points.  That count is already visible one step
before LLVM, in TVM's lowered TIR, where the unroll and vectorize annotations have been
applied: the innermost loop that stays a loop holds the unrolled micro-kernel, its vector
FMAs, the loads that feed them and the accumulators kept in small local buffers.  Lowering
takes a median ~15 ms a program against ~100-300 ms for LLVM's code generation, so these
features can be computed for a search's candidates, not only for programs about to be built.

How: the module is lowered by TVM's own pipeline for its target (``compat.lower_for_codegen``)
and walked once, recording for every ``for`` its arithmetic and its memory accesses, each with
the coefficient of every enclosing loop variable in its flat index.  Then what LLVM does next
is replayed, innermost loops first: a scalar loop whose accesses are contiguous or invariant
is vectorized (LLVM's loop vectorizer), and a short loop is fully unrolled into its parent.
LLVM's SLP vectorizer (packing an unrolled body's neighbouring scalars) and vectorized sums
are left out: modelled, they ranked the dense pool's programs worse (the per-task Spearman
correlation of the hot loop's FMAs per access with throughput fell from 0.76 to 0.75-0.62).
The hot loop is the surviving loop with the most work times trips.  Of it the features count,
per iteration and in the target's vector registers: FMA lanes, other float arithmetic, the
loads that change with the loop (split into contiguous vector, scalar/broadcast and gathered),
stores, accumulators (elements read and written at the same place every iteration, and small
buffers of the function's own at fixed places: LLVM keeps both in registers), invariant loads
and how far all these overflow the register file.  Estimates of what LLVM will emit, not a
substitute for ``features.code``; what they are worth is measured in
``benchmarks/code_features.py --features lowered``.

TVM lowers most programs in ~15 ms (the mean is ~65 ms) but a few pathological unrolls for
minutes, so callers that
meet arbitrary schedules (a dataset, a search) lower in the measurement pool's workers under a
time limit (``lowered_features_batch``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tensortune.measure.pool import WorkerPool

_LOOP_FIELDS = ("fma_lanes", "arith_lanes", "vector_loads", "scalar_loads", "gathers",
                "invariant_loads", "stores", "local_accesses", "calls")  # fmt: skip
LOWERED_FEATURE_NAMES: tuple[str, ...] = (
    *(f"hot_{f}" for f in _LOOP_FIELDS),
    "hot_fma_per_access", "hot_arith_per_access", "hot_accumulator_registers",
    "hot_register_excess", "hot_work_share", "hot_log_trips", "hot_log_extent", "hot_depth",
    "hot_parallel", "program_loops", "program_log_work", "program_fma_share",
    "program_vector_share", "program_fma_per_access",
)  # fmt: skip
LOWERED_WIDTH = len(LOWERED_FEATURE_NAMES)
LOWERED_VERSION = 1  # bumped whenever what a feature counts changes: stored rows go stale

# LLVM fully unrolls a loop of constant trip count when the unrolled body stays under a size
# budget (~300 instructions at -O3); one unit here (an operation or an access) is about two
# instructions once addresses are computed.  (256 ranked the pool's programs worse.)
UNROLL_BUDGET = 128


def vector_registers(target: dict) -> tuple[int, int]:
    """(fp32 lanes of one vector register, number of vector registers) of an x86-or-other
    target dict; an unknown CPU counts as SSE (4 lanes, 16 registers)."""
    from tensortune.hardware.target import simd_bits

    bits = simd_bits(target) or 128
    return bits // 32, 32 if bits == 512 else 16


@dataclass
class _Access:
    element: tuple  # (buffer, index text): the same element read twice is one access
    store: bool
    width: int  # lanes of the index: 1 for a scalar access
    contiguous: bool  # a vector access at stride 1
    register: bool  # a buffer of the function's own at a fixed place: a register in LLVM
    coef: dict  # loop variable -> its coefficient in the flat index (None: not linear)
    copies: float = 1.0  # distinct elements once inner loops are unrolled into this one


@dataclass
class _Loop:
    var: str
    extent: float | None  # None: not a constant
    depth: int
    parallel: bool
    trips: float = 1.0  # product of the extents of this loop and those around it
    fma: float = 0.0  # lanes
    arith: float = 0.0  # lanes of other float arithmetic
    calls: float = 0.0
    vector_ops: bool = False  # some arithmetic is already vector (TVM vectorized it)
    accesses: list[_Access] = field(default_factory=list)
    children: list[_Loop] = field(default_factory=list)


class _Walker:
    """One pass over a lowered PrimFunc's statements, filling a ``_Loop`` per ``for``."""

    def __init__(self) -> None:
        from tensortune.compat import tvm

        self.t, self.ir = tvm.tirx, tvm.ir
        self.top = _Loop("", 1.0, 0, False)
        self.allocated: set[str] = set()  # buffers the function allocates (not arguments)
        self.binds: dict[str, Any] = {}  # let-bound variable -> its value
        self.enclosing: list[str] = []  # loop variables around the statement walked
        self._coef_cache: dict[tuple[str, str], int | None] = {}

    # -- statements ---------------------------------------------------------------------------
    def stmt(self, s: Any, loop: _Loop) -> None:
        t = self.t
        if isinstance(s, t.SeqStmt):
            for child in s.seq:
                self.stmt(child, loop)
        elif isinstance(s, t.For):
            value = getattr(s.extent, "value", None)
            inner = _Loop(s.loop_var.name, float(value) if isinstance(value, int) else None,
                          loop.depth + 1, s.kind == t.ForKind.PARALLEL)  # fmt: skip
            inner.trips = loop.trips * (inner.extent or 1.0)
            loop.children.append(inner)
            self.enclosing.append(inner.var)
            self.stmt(s.body, inner)
            self.enclosing.pop()
        elif isinstance(s, t.Bind):
            self.binds[s.var.name] = s.value
            self.expr(s.value, loop)
        elif isinstance(s, t.BufferStore):
            for i in s.indices:
                self.expr(i, loop)
            self.expr(s.value, loop)
            self._access(s.buffer, s.indices, loop, store=True)
        elif isinstance(s, t.AllocBuffer):
            self.allocated.add(s.buffer.name)
        elif isinstance(s, t.IfThenElse):
            self.expr(s.condition, loop)
            self.stmt(s.then_case, loop)
            if s.else_case is not None:
                self.stmt(s.else_case, loop)
        elif isinstance(s, t.Evaluate):
            self.expr(s.value, loop)
        elif not isinstance(s, t.AssertStmt):
            body = getattr(s, "body", None)  # AttrStmt, DeclBuffer, While, ...
            if isinstance(body, t.Stmt):
                self.stmt(body, loop)

    # -- expressions --------------------------------------------------------------------------
    def expr(self, e: Any, loop: _Loop) -> None:
        t = self.t
        if isinstance(e, t.Var | t.IntImm | t.FloatImm | self.ir.StringImm):
            return
        if isinstance(e, self.ir.TensorLoad):  # a BufferLoad
            for i in e.indices:
                self.expr(i, loop)
            self._access(e.source, e.indices, loop, store=False)
            return
        lanes = _lanes(e)
        if isinstance(e, t.Add | t.Sub) and _is_float(e):
            mul = next((x for x in (e.b, e.a) if isinstance(x, t.Mul) and _is_float(x)), None)
            if mul is not None:
                loop.fma += lanes
                loop.vector_ops |= lanes > 1
                other = e.a if mul.same_as(e.b) else e.b
                for x in (mul.a, mul.b, other):
                    self.expr(x, loop)
                return
            loop.arith += lanes
            loop.vector_ops |= lanes > 1
        elif isinstance(e, t.Mul | t.Div | t.Max | t.Min) and _is_float(e):
            loop.arith += lanes
            loop.vector_ops |= lanes > 1
        if isinstance(e, self.ir.Call):
            loop.calls += 1.0
        for child in _children(e, self.ir.Expr):
            self.expr(child, loop)

    def _access(self, buf: Any, indices: Any, loop: _Loop, *, store: bool) -> None:
        t = self.t
        element = (buf.name, str(indices))
        if any(a.element == element and a.store == store for a in loop.accesses[-64:]):
            return  # the same element twice in one iteration: one access
        index = indices[-1] if len(indices) else None
        width = _lanes(index) if index is not None else 1
        fixed = all(isinstance(i, t.IntImm) for i in indices)
        base = index.base if isinstance(index, t.Ramp) else index
        coef = {v: (self._coef(base, v) if base is not None else 0) for v in self.enclosing}
        loop.accesses.append(_Access(
            element, store, width,
            contiguous=isinstance(index, t.Ramp) and _const(index.stride) == 1,
            register=buf.name in self.allocated and fixed, coef=coef,
        ))  # fmt: skip

    def _coef(self, e: Any, v: str) -> int | None:
        """The coefficient of loop variable ``v`` in integer expression ``e`` (0: independent,
        None: it appears other than linearly), let-bound variables seen through."""
        t = self.t
        if isinstance(e, t.Var):
            if e.name == v:
                return 1
            if e.name not in self.binds:
                return 0
            key = (e.name, v)
            if key not in self._coef_cache:
                self._coef_cache[key] = self._coef(self.binds[e.name], v)
            return self._coef_cache[key]
        if isinstance(e, t.IntImm):
            return 0
        if isinstance(e, t.Add | t.Sub):
            a, b = self._coef(e.a, v), self._coef(e.b, v)
            if a is None or b is None:
                return None
            return a + b if isinstance(e, t.Add) else a - b
        if isinstance(e, t.Mul):
            for x, k in ((e.a, e.b), (e.b, e.a)):
                if isinstance(k, t.IntImm):
                    c = self._coef(x, v)
                    return None if c is None else c * int(k.value)
        if isinstance(e, t.Cast):
            return self._coef(e.value, v)
        children = list(_children(e, self.ir.Expr))
        return 0 if all(self._coef(c, v) == 0 for c in children) else None


def _children(e: Any, expr_type: type) -> list:
    out = []
    for name in ("a", "b", "value", "base", "stride", "condition", "true_value",
                 "false_value", "body"):  # fmt: skip
        child = getattr(e, name, None)
        if isinstance(child, expr_type):
            out.append(child)
    out += [c for c in getattr(e, "args", ()) or () if isinstance(c, expr_type)]
    return out


def _const(e: Any) -> float:
    value = getattr(e, "value", None)
    return float(value) if isinstance(value, int | float) else 1.0


def _dtype(e: Any) -> Any:
    return getattr(getattr(e, "ty", None), "dtype", None)


def _lanes(e: Any) -> int:
    return int(getattr(_dtype(e), "lanes", 1) or 1)


def _is_float(e: Any) -> bool:
    return str(_dtype(e)).startswith(("float", "bfloat"))


# ---- what LLVM makes of the loops ----------------------------------------------------------------


def _size(loop: _Loop, lanes: int) -> float:
    """Operations and accesses of one iteration, in vector registers' worth."""
    ops = (loop.fma + loop.arith) / (lanes if loop.vector_ops else 1)
    return ops + loop.calls + sum(a.copies for a in loop.accesses if not a.register)


def _vectorize(loop: _Loop, lanes: int) -> None:
    """LLVM's loop vectorizer on a scalar innermost loop of constant trip count whose accesses
    are contiguous or invariant in its variable; a strided access, or a sum into one element
    (float addition may not be reordered), keeps it scalar."""
    if loop.children or loop.vector_ops or not loop.extent or loop.extent < 2 or loop.parallel:
        return
    coefs = [a.coef.get(loop.var, 0) for a in loop.accesses]
    if any(c not in (0, 1) for c in coefs) or not any(c == 1 for c in coefs):
        return
    if any(a.store and c == 0 for a, c in zip(loop.accesses, coefs, strict=True)):
        return
    vf = int(min(loop.extent, lanes))
    loop.fma, loop.arith, loop.vector_ops = loop.fma * vf, loop.arith * vf, True
    for a, c in zip(loop.accesses, coefs, strict=True):
        if c == 1 and a.width == 1:
            a.width, a.contiguous = vf, True
    loop.extent = math.ceil(loop.extent / vf)
    loop.trips /= vf


def _settle(loop: _Loop, lanes: int) -> None:
    """Vectorize and fully unroll, innermost loops first, as LLVM would."""
    for child in loop.children:
        _settle(child, lanes)
    kept = []
    for child in loop.children:
        _vectorize(child, lanes)
        if child.children or not child.extent or child.parallel or (
                child.extent * _size(child, lanes) > UNROLL_BUDGET):  # fmt: skip
            kept.append(child)
            continue
        n = child.extent  # unrolled into this loop's body
        loop.fma += child.fma * n
        loop.arith += child.arith * n
        loop.calls += child.calls * n
        loop.vector_ops |= child.vector_ops
        for a in child.accesses:
            moves = a.coef.get(child.var, 0) != 0
            loop.accesses.append(_Access(a.element, a.store, a.width, a.contiguous, a.register,
                                         a.coef, a.copies * (n if moves else 1)))  # fmt: skip
    loop.children = kept


def _loops(loop: _Loop) -> list[_Loop]:
    return [loop, *(x for c in loop.children for x in _loops(c))]


def _work(loop: _Loop, lanes: int) -> float:
    return loop.trips * _size(loop, lanes)


def _hot_counts(hot: _Loop, lanes: int) -> dict[str, float]:
    """Per-iteration counts of the hot loop, in vector registers; "accumulators" among them."""
    c = {"fma_lanes": hot.fma, "arith_lanes": hot.arith, "calls": hot.calls}
    accumulators = invariant = 0.0
    for a in hot.accesses:
        regs = a.copies * math.ceil(a.width / lanes)
        if a.register:
            c["local_accesses"] = c.get("local_accesses", 0.0) + a.copies
            accumulators += regs if a.store else 0.0
        elif a.coef.get(hot.var, 0) == 0:
            # The same element every iteration: a hoisted load, or an accumulator LLVM
            # promotes to a register out of a reduction loop.
            if a.store:
                accumulators += regs
            else:
                invariant += regs
        elif a.store:
            c["stores"] = c.get("stores", 0.0) + regs
        elif a.contiguous:
            c["vector_loads"] = c.get("vector_loads", 0.0) + regs
        elif a.width > 1:
            c["gathers"] = c.get("gathers", 0.0) + a.copies * a.width
        else:
            c["scalar_loads"] = c.get("scalar_loads", 0.0) + a.copies
    stored = {a.element for a in hot.accesses if a.store}
    invariant -= sum(a.copies * math.ceil(a.width / lanes) for a in hot.accesses
                     if not a.store and not a.register and a.element in stored
                     and a.coef.get(hot.var, 0) == 0)  # fmt: skip
    c["invariant_loads"] = max(0.0, invariant)
    c["accumulators"] = accumulators
    return c


def summarize_lowered(mod: Any, target: dict) -> np.ndarray:
    """``LOWERED_WIDTH`` float32 features of a module already lowered for ``target``."""
    lanes, registers = vector_registers(target)
    loops: list[_Loop] = []
    for _, func in mod.functions.items():
        if hasattr(func, "body"):
            walker = _Walker()
            walker.stmt(func.body, walker.top)
            _settle(walker.top, lanes)
            loops += _loops(walker.top)
    out = np.zeros(LOWERED_WIDTH, dtype=np.float32)
    total = sum(_work(lp, lanes) for lp in loops)
    if not loops or total <= 0:
        return out
    hot = max(loops, key=lambda lp: _work(lp, lanes))
    c = _hot_counts(hot, lanes)
    accumulators = c.pop("accumulators")
    accesses = sum(c.get(k, 0.0) for k in ("vector_loads", "scalar_loads", "gathers", "stores"))
    # Invariant loads stay in registers only while the accumulators leave room for them.
    room = max(0.0, registers - accumulators - 2.0)  # two registers for the operands in flight
    spilled = max(0.0, accumulators - registers)  # each a load and a store per iteration
    accesses += max(0.0, c["invariant_loads"] - room) + 2.0 * spilled
    pressure = accumulators + c["invariant_loads"]
    fma = sum(lp.trips * lp.fma for lp in loops)
    arith = fma + sum(lp.trips * lp.arith for lp in loops)
    moved = [(lp, a) for lp in loops for a in lp.accesses if not a.register]
    program_accesses = sum(lp.trips * a.copies * math.ceil(a.width / lanes) for lp, a in moved)
    vector = sum(lp.trips * a.copies * a.width for lp, a in moved if a.width > 1)
    scalar = sum(lp.trips * a.copies for lp, a in moved if a.width == 1)
    values = [
        *(c.get(f, 0.0) for f in _LOOP_FIELDS),
        c["fma_lanes"] / max(accesses, 1.0),
        c["arith_lanes"] / max(accesses, 1.0),
        accumulators,
        max(0.0, pressure - registers),
        _work(hot, lanes) / total,
        math.log2(hot.trips + 1.0),
        math.log2((hot.extent or 1.0) + 1.0),
        hot.depth,
        float(hot.parallel),
        len(loops) - 1,
        math.log2(total + 1.0),
        fma / max(arith, 1.0),
        vector / max(vector + scalar, 1.0),
        fma / max(program_accesses, 1.0),
    ]
    out[:] = values
    return out


def lowered_features(mod: Any, target: dict) -> np.ndarray:
    """The lowered-loop features of a scheduled module on ``target`` (a target dict)."""
    from tensortune.compat import lower_for_codegen

    return summarize_lowered(lower_for_codegen(mod, target), target)


LOWER_TIMEOUT_S = 60.0  # TVM lowers most programs in ~15 ms; a few unrolls take it minutes


def lowered_features_batch(jobs: list[tuple[Any, dict]], pool: WorkerPool,
                           timeout_s: float = LOWER_TIMEOUT_S) -> list[np.ndarray]:  # fmt: skip
    """Lowered-loop features of ``(module, target)`` pairs, lowered in ``pool``'s workers (the
    walk runs here): a module that is None, fails, crashes or overruns ``timeout_s`` (a Winograd
    transform under a 512-step unroll kept TVM busy for minutes) gives NaN."""
    out = [np.full(LOWERED_WIDTH, np.nan, np.float32) for _ in jobs]
    runnable = [j for j, (mod, _) in enumerate(jobs) if mod is not None]
    outcomes = pool.map("lower", [jobs[j] for j in runnable], timeout_s)
    for j, got in zip(runnable, outcomes, strict=True):
        if got.kind == "ok":
            out[j] = summarize_lowered(got.value, jobs[j][1])
    return out
