"""Fast math for TIR workloads: float32 ``exp``, ``tanh`` and ``erf`` become the polynomial
approximations of TVM's ``topi.fast_*``, which vectorize.

Why: LLVM has no vector ``erf`` and calls libm's scalar ``exp``/``tanh`` once per element, so
a softmax or GELU tuned with the exact functions stays several times slower than PyTorch's
(a 128×512 softmax, unscheduled, on an AMD EPYC Zen 5: 140 µs exact, 62 µs approximated).
A model gets the same rewrite on its Relax graph (``inference.for_inference``); this module
gives it to workloads that arrive as TIR: operator specs, TVMScript files and MetaSchedule
databases.

How far results move (float64 reference, 2^20 points, AMD EPYC Zen 5 with FMA): largest
relative error 3.1e-7 for ``exp`` on [-87, 88] (libm: 6.0e-8), absolute 3.1e-7 for ``tanh`` on
[-20, 20] and 3.3e-7 for ``erf`` on [-8, 8]: a few float32 ulps.  Without FMA (a generic x86-64
target) ``exp``'s range reduction rounds n·ln 2 to float32 and its error grows to ~4e-6 near
the ends of the range.  ``exp`` flushes to 0 below -88.38, where libm still returns denormals.
A task rewritten here keeps its exact module in ``Task.exact``, and candidates' outputs are
checked against the exact build (``measure.session``, rtol 1e-3).
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from tensortune.compat import tvm, tvm_ffi

if TYPE_CHECKING:
    from tensortune.workloads.task import Task

# TIR intrinsic → the topi function whose element-wise body replaces it.
APPROXIMATED = {"tirx.exp": "fast_exp", "tirx.tanh": "fast_tanh", "tirx.erf": "fast_erf"}
_TENSOR_LOAD = "te.tensor_load"  # how a TE compute body reads its input
# An approximation reads its argument ~20 times: larger arguments (nested transcendental
# calls) keep the exact call rather than grow the program by hundreds of nodes.
MAX_ARGUMENT_NODES = 128


@cache
def _template(intrinsic: str) -> tvm.ir.PrimExpr:
    """The approximation's body for one float32 element.

    It reads its input through TE loads: of the placeholder, or of an intermediate stage
    (``fast_tanh`` clamps its input in a stage of its own), which ``_expand`` binds.
    """
    from tvm import te, topi

    x = te.placeholder((1,), "float32", name="x")
    return getattr(topi, APPROXIMATED[intrinsic])(x).op.body[0]


def _expand(body: tvm.ir.PrimExpr, value: tvm.ir.PrimExpr) -> tvm.ir.PrimExpr:
    """``body`` with the placeholder read as ``value`` and intermediate stages inlined.

    No ``Let``: TVM's FLOP estimate (``EstimateTIRFlops``, which MetaSchedule runs on every
    task) has no rule for it.  Copies are what MetaSchedule's own inlining makes of the
    Relax rewrite too, and LLVM merges them.
    """

    def bind(node: tvm.ir.expr.Call) -> tvm.ir.PrimExpr:
        if getattr(node.op, "name", "") != _TENSOR_LOAD:
            return node
        producer = node.args[0].op
        if not hasattr(producer, "body"):  # the placeholder: the function's argument
            return value
        return _expand(producer.body[0], value)

    return tvm_ffi.structural_map(body, (tvm.ir.expr.Call, bind))


def _size(expr: tvm.ir.PrimExpr) -> int:
    count = 0

    def visit(node: object, visitor: tvm_ffi.StructuralVisitor) -> None:
        nonlocal count
        count += 1
        return visitor.default_visit(node)

    tvm_ffi.structural_visit(expr, visit)
    return count


def _approximate(call: tvm.ir.expr.Call) -> tvm.ir.PrimExpr:
    name = getattr(call.op, "name", "")
    if name not in APPROXIMATED or str(call.ty) != "float32":
        return call
    (arg,) = call.args
    if _size(arg) > MAX_ARGUMENT_NODES:
        return call  # its copies would swell the program more than the libm call costs
    return _expand(_template(name), arg)


def approximate(mod: tvm.IRModule) -> tvm.IRModule | None:
    """``mod`` with its float32 ``exp``/``tanh``/``erf`` approximated, or ``None`` when it
    has none (the module is then left as it is, so its records keep their key)."""
    out = tvm_ffi.structural_map(mod, (tvm.ir.expr.Call, _approximate))
    return None if out.same_as(mod) else out


def with_fast_math(task: Task) -> Task:
    """``task`` approximated, remembering the exact module; unchanged when nothing applies."""
    from dataclasses import replace

    fast = approximate(task.mod)
    if fast is None:
        return task
    return replace(task, mod=fast, exact=task.reference)
