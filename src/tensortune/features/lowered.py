"""Features of a program's hot loop as TVM lowers it, just before LLVM: the register tile.

Why: ``features.code`` showed that what ranks schedules on held-out networks is how many FMAs
each memory access feeds in the hot loop (register blocking): one count carried half of
XGBoost's gain and lifted held-out PCA by 8 points.  That count is already visible one step
before LLVM, in TVM's lowered TIR, where the vectorize annotations have been applied and the
unroll ones are about to be: the innermost loop that stays a loop holds the unrolled
micro-kernel, its vector FMAs, the loads that feed them and the accumulators kept in small
local buffers.  Lowering takes ~5-20 ms a program against ~100-300 ms for LLVM's code
generation, so these features can be computed for a search's candidates, not only for
programs about to be built.

How: the module is lowered by TVM's own pipeline for its target less its ``UnrollLoop`` pass
(``compat.lower_for_codegen(..., unroll=False)``) and walked once, recording for every ``for``
its arithmetic and its memory accesses, each with the coefficient of every enclosing loop
variable in its flat index.  TVM's unrolling is replayed in the walk instead: each loop is
judged by the pass's own rule (``_Walker._unroll``, from the ``pragma_auto_unroll_max_step``
MetaSchedule writes) and, if the pass would unroll it, counted as that many copies of its body
(an element read again in every copy counts once, unless more than ``_REUSE_WINDOW`` accesses
come between).  Run, the pass hands TVM's simplifiers hundreds of copies: it made a few
programs take seconds and the mean ~56 ms a program (lowering, walk and the module's trip back
from a worker), against ~13 ms replayed, at the same held-out accuracy (benchmarks/RESULTS.md,
stop 51).  Then what LLVM does next is replayed, innermost loops first: a scalar loop whose
accesses are contiguous or invariant is vectorized (LLVM's loop vectorizer), and a short loop
is fully unrolled into its parent.
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
``benchmarks/code_features.py --features lowered``.  Not replayed: the constant folding of an
unrolled body (a Winograd transform's multiplications by 0 and 1 count as FMAs).

Callers that meet arbitrary schedules (a dataset, a search) lower and walk in the measurement
pool's workers under a time limit (``lowered_features_batch``): TVM may still crash or hang on
an odd schedule, and only the features travel back.
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
LOWERED_VERSION = 2  # bumped whenever what a feature counts changes: stored rows go stale

_UNROLL_PRAGMAS = ("pragma_auto_unroll_max_step", "pragma_unroll_explicit")
_UNROLL_DEPTH = 8  # UnrollLoop's default ``auto_max_depth``
_REUSE_WINDOW = 64  # accesses between two of one element for the second to count as free

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
    # A buffer of the function's own indexed by these loop variables only: once TVM unrolls
    # them all, every copy is at a fixed place (a register).  None: not such an access.
    pending: frozenset | None = None


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
    tvm_unrolled: bool = False  # TVM's UnrollLoop would copy its body out (``_Walker._unroll``)
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
        # TVM's UnrollLoop, replayed instead of run (``_unroll``): the innermost pragmas'
        # settings, and the pass's counters (statements unrolled so far, unrolled and kept
        # loops below the statement walked).
        self.max_step, self.explicit = 0, True
        self.steps = self.unrolled_depth = self.kept_depth = 0

    # -- statements ---------------------------------------------------------------------------
    def stmt(self, s: Any, loop: _Loop) -> None:
        t = self.t
        if isinstance(s, t.SeqStmt):
            for child in s.seq:  # the pass counts each statement of a sequence apart
                outer = (self.steps, self.unrolled_depth, self.kept_depth)
                self.steps = self.unrolled_depth = self.kept_depth = 0
                self.stmt(child, loop)
                self.steps += outer[0]
                self.unrolled_depth = max(self.unrolled_depth, outer[1])
                self.kept_depth = max(self.kept_depth, outer[2])
        elif isinstance(s, t.For):
            value = getattr(s.extent, "value", None)
            inner = _Loop(s.loop_var.name, float(value) if isinstance(value, int) else None,
                          loop.depth + 1, s.kind == t.ForKind.PARALLEL)  # fmt: skip
            inner.trips = loop.trips * (inner.extent or 1.0)
            loop.children.append(inner)
            self.enclosing.append(inner.var)
            self.stmt(s.body, inner)
            self.enclosing.pop()
            self._unroll(s, inner)
        elif isinstance(s, t.AttrStmt) and s.attr_key in _UNROLL_PRAGMAS:
            saved = (self.max_step, self.explicit)
            if s.attr_key == "pragma_auto_unroll_max_step":
                self.max_step = int(_const(s.value))
            else:
                self.explicit = bool(_const(s.value))
            self.stmt(s.body, loop)
            self.max_step, self.explicit = saved
        elif isinstance(s, t.Bind):
            self.binds[s.var.name] = s.value
            self.expr(s.value, loop)
        elif isinstance(s, t.BufferStore):
            self.steps += 1
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
            self.steps += 1
            self.expr(s.value, loop)
        elif not isinstance(s, t.AssertStmt):
            body = getattr(s, "body", None)  # AttrStmt, DeclBuffer, While, ...
            if isinstance(body, t.Stmt):
                self.stmt(body, loop)

    def _unroll(self, s: Any, loop: _Loop) -> None:
        """Whether TVM's UnrollLoop pass would copy this loop's body out, decided as the pass
        decides (tirx/transforms/unroll_loop.cc), its body walked: a loop marked unrolled, or a
        serial loop of constant extent with no kept loop inside, at most ``_UNROLL_DEPTH``
        unrolled ones, and extent x statements within the ``pragma_auto_unroll_max_step``
        around it.  The features lower with the pass left out
        (``compat.lower_for_codegen(..., unroll=False)``): TVM's simplifiers then meet the
        loop once instead of every copy, which made most of the lowering's time."""
        extent = int(loop.extent) if loop.extent is not None else -1
        unroll = (s.kind == self.t.ForKind.SERIAL and extent >= 0 and self.kept_depth == 0
                  and self.unrolled_depth <= _UNROLL_DEPTH
                  and extent * self.steps <= self.max_step)  # fmt: skip
        unroll |= s.kind == self.t.ForKind.UNROLLED and extent >= 0
        if unroll:
            self.steps *= extent
            self.unrolled_depth += 1
        else:
            self.kept_depth += 1
        # Not explicit: the pass only marks the loop for LLVM, which the walk models anyway.
        loop.tvm_unrolled = unroll and self.explicit

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
        if any(a.element == element and a.store == store
               for a in loop.accesses[-_REUSE_WINDOW:]):  # fmt: skip
            return  # the same element twice in one iteration: one access
        index = indices[-1] if len(indices) else None
        width = _lanes(index) if index is not None else 1
        base = index.base if isinstance(index, t.Ramp) else index
        coef = {v: (self._coef(base, v) if base is not None else 0) for v in self.enclosing}
        pending = None
        if buf.name in self.allocated and all(self._loop_index(i) for i in indices):
            pending = frozenset(v for v, c in coef.items() if c != 0)
        loop.accesses.append(_Access(
            element, store, width,
            contiguous=isinstance(index, t.Ramp) and _const(index.stride) == 1,
            register=pending == frozenset(), coef=coef, pending=pending,
        ))  # fmt: skip

    def _loop_index(self, e: Any) -> bool:
        """Whether ``e`` is made of constants and loop variables only (let-bound variables
        seen through): fixed once the loops are unrolled."""
        t = self.t
        if isinstance(e, t.Var):
            if e.name in self.binds:
                return self._loop_index(self.binds[e.name])
            return e.name in self.enclosing
        if isinstance(e, t.IntImm):
            return True
        if isinstance(e, t.Ramp):
            return self._loop_index(e.base) and isinstance(e.stride, t.IntImm)
        if isinstance(e, t.Add | t.Sub | t.Mul | t.FloorDiv | t.FloorMod):
            return self._loop_index(e.a) and self._loop_index(e.b)
        if isinstance(e, t.Cast):
            return self._loop_index(e.value)
        return False

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
    """Unroll what TVM unrolls, then vectorize and fully unroll as LLVM would, innermost loops
    first."""
    for child in loop.children:
        _settle(child, lanes)
    kept = []
    for child in loop.children:
        if child.tvm_unrolled:  # copied out before LLVM sees it: never vectorized as a loop
            _unroll_into(loop, child, kept, by_tvm=True)
            continue
        _vectorize(child, lanes)
        if child.children or not child.extent or child.parallel or (
                child.extent * _size(child, lanes) > UNROLL_BUDGET):  # fmt: skip
            kept.append(child)
            continue
        _unroll_into(loop, child, kept, by_tvm=False)
    loop.children = kept


def _unroll_into(loop: _Loop, child: _Loop, kept: list[_Loop], *, by_tvm: bool) -> None:
    """Copy ``child``'s body ``extent`` times into ``loop``'s: an access that moves with the
    child's variable becomes that many distinct elements, and (``by_tvm``: TVM unrolls it) a
    local buffer's element indexed by unrolled variables only is at a fixed place in every
    copy.  Loops ``child`` kept (a loop marked unrolled around a loop that is not) become that
    many loops, counted as one whose trips (the product of every enclosing extent, the
    unrolled one's included) stay as they were."""
    n = child.extent or 1.0
    loop.fma += child.fma * n
    loop.arith += child.arith * n
    loop.calls += child.calls * n
    loop.vector_ops |= child.vector_ops
    # An element every copy reads again stays in a register only if few accesses come between
    # (the walk's own window, ``_REUSE_WINDOW``); LLVM reloads it from farther apart.
    reloaded = by_tvm and sum(a.copies for a in child.accesses) > _REUSE_WINDOW
    for a in child.accesses:
        moves = a.coef.get(child.var, 0) != 0 or reloaded
        pending = a.pending
        if by_tvm and pending is not None:
            pending = pending - {child.var}
        loop.accesses.append(_Access(a.element, a.store, a.width, a.contiguous,
                                     a.register or pending == frozenset(), a.coef,
                                     a.copies * (n if moves else 1), pending))  # fmt: skip
    for grandchild in child.children:
        for x in _loops(grandchild):  # their trips already count the unrolled loop's extent
            x.depth -= 1
        kept.append(grandchild)


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

    return summarize_lowered(lower_for_codegen(mod, target, unroll=False), target)


LOWER_TIMEOUT_S = 60.0  # programs lower in ~5-20 ms: the limit is for one TVM hangs on


def lowered_features_batch(jobs: list[tuple[Any, dict]], pool: WorkerPool,
                           timeout_s: float = LOWER_TIMEOUT_S) -> list[np.ndarray]:  # fmt: skip
    """Lowered-loop features of ``(module, target)`` pairs, lowered and walked in ``pool``'s
    workers: a module that is None, fails, crashes or overruns ``timeout_s`` gives NaN."""
    out = [np.full(LOWERED_WIDTH, np.nan, np.float32) for _ in jobs]
    runnable = [j for j, (mod, _) in enumerate(jobs) if mod is not None]
    # The walk runs in the worker too: the features come back, not the lowered module.
    outcomes = pool.map("lower", [(*jobs[j], summarize_lowered) for j in runnable], timeout_s)
    for j, got in zip(runnable, outcomes, strict=True):
        if got.kind == "ok":
            out[j] = got.value
    return out
