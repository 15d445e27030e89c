"""Rewrites of an imported model for inference, applied before it is cut into tuning tasks.

They run on ``Model.mod`` itself, so the tasks tuned and the module ``compile`` builds are cut
from the same graph and their keys match.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from tensortune.compat import tvm
from tensortune.workloads.winograd import winograd_convs

# Part of the key of anything derived from a model's task list (the zoo's cached task counts):
# raise it whenever a rewrite here changes the tasks a model is cut into.
# 3: weights marked layout-free (models.fuse); 4: channels-last convs; 5: Winograd convs;
# 6: Winograd F(2×2, 3×3) on small images
REWRITES_VERSION = 6

# Activations in NHWC, weights in OHWI (which RewriteLayout then re-orders per schedule).
CHANNELS_LAST = {"relax.nn.conv2d": ["NHWC", "OHWI"]}


def for_inference(mod: tvm.IRModule, *, fast_math: bool = True, winograd: bool = True,
                  channels_last: bool = True) -> tvm.IRModule:  # fmt: skip
    """Fold batch norms into convolutions and, with ``fast_math``, replace the transcendental
    functions by polynomial approximations that vectorize; with ``channels_last``, run 2-d
    convolutions in NHWC, and with ``winograd`` too, the eligible 3×3 stride-1 ones among them
    as Winograd F(4×4, 3×3), or F(2×2, 3×3) on small images (``workloads.winograd``: 4× or
    2.25× fewer multiply-adds).

    Left alone, an inference-mode batch norm legalizes to a tuple-returning PrimFunc that
    FuseOps cannot merge with its neighbours, so every conv → BN → ReLU (→ residual add) costs
    a conv task plus a memory-bound BN task.  Folded, the bias, the add and the ReLU fuse into
    the conv's epilogue, where they cost almost nothing.  Batch norms with no conv in front
    become plain arithmetic that fuses as well.

    LLVM has no vector ``erf`` and scalarizes ``exp`` and ``tanh`` into libm calls, so one
    exact GELU over a 128×3072 activation costs ~2 ms on a 2-core x86 (eager PyTorch
    vectorizes it).  With TVM's ``fast_*`` approximations a BERT layer's output stays
    within 2.4e-6 of PyTorch's.

    In NCHW a convolution's only long contiguous axis is the image width, which is 7 in a
    ResNet's last stage and strided in its downsampling layers, so MetaSchedule's schedules
    vectorize badly there; in NHWC they vectorize over output channels (64 to 2048 of them),
    broadcasting one input value into a register tile of outputs.  On a 2-core Xeon, 64
    trials each, three ResNet-18 convolutions went from 130-195 GFLOP/s in NCHW to 290-310
    in NHWC.  ConvertLayout carries NHWC through the element-wise ops and pools that follow,
    so the graph transposes once at its input (and at outputs that are feature maps).
    """
    from tvm import relax

    passes = [
        relax.transform.FoldBatchnormToConv2D(),
        relax.transform.DecomposeOpsForInference(),
        fold_constants(),  # the scaled weights and the folded biases
        relax.transform.CanonicalizeBindings(),  # the tuple that BN left behind
        relax.transform.DeadCodeElimination(),
    ]
    if fast_math:
        passes += [
            _rewrite_calls("tensortune.ExpandGelu", _EXPAND_GELU),
            relax.transform.FastMathTransform(),
        ]
    mod = tvm.transform.Sequential(passes)(mod)
    if channels_last:
        layout = [
            _rewrite_calls("tensortune.ClipAsMinMax", {"relax.clip": _clip}),
            relax.transform.ConvertLayout(CHANNELS_LAST),
            fold_constants(),
            # an input that several convolutions read is transposed once for each of them
            relax.transform.EliminateCommonSubexpr(),
        ]
        mod = tvm.transform.Sequential(layout)(mod)  # the weights' transposes, folded
        if winograd:  # on NHWC convolutions, with their weights in their final layout
            mod = winograd_convs(mod)
    return mod


def fold_constants() -> tvm.transform.Pass:
    """Relax's ``FoldConstant``, with the operators that fold weights computed in NumPy first.

    ``FoldConstant`` compiles every call it folds with LLVM, ~35 ms each: folding the batch
    norms into MobileNetV2's 52 convolutions and transposing their weights is ~520 calls,
    20 s of every ``load_model``.  Each of these operators is one NumPy call, exact in float32
    like the compiled kernel; whatever is left (other operators) goes to ``FoldConstant``.
    """
    folding = _rewrite_calls("tensortune.FoldInNumPy", _NUMPY_FOLDS, constant_args=True)
    return tvm.transform.Sequential([folding, tvm.relax.transform.FoldConstant()])


def _rewrite_calls(name: str, rewrites: dict[str, Callable], *,
                   constant_args: bool = False) -> tvm.transform.Pass:  # fmt: skip
    """A pass that replaces each call to an operator named in ``rewrites`` by what
    ``rewrites[op](emit, call)`` returns (``emit`` binds an intermediate expression).
    With ``constant_args``, only calls whose every argument is a constant (or a variable bound
    to one), a shape or a scalar are rewritten, by ``rewrites[op](call, those arguments)``."""
    from tvm import relax

    # a scalar like ``relax.prim_value(1e-5)`` is a ``tvm.ir.Constant`` as well
    literal = (tvm.ir.Constant, relax.ShapeExpr)

    @relax.expr_functor.mutator
    class Rewriter(relax.PyExprMutator):
        def visit_call_(self, call: relax.Call) -> relax.Expr:
            rewrite = rewrites.get(getattr(call.op, "name", None))
            call = super().visit_call_(call)  # the arguments first
            if rewrite is None:
                return call
            if not constant_args:
                return rewrite(self.builder_.emit, call)
            args = [self._bound(a) for a in call.args]
            if not all(isinstance(a, literal) for a in args):
                return call
            return rewrite(call, args)

        def _bound(self, arg: relax.Expr) -> relax.Expr:
            value = self.lookup_binding(arg) if isinstance(arg, relax.Var) else None
            return value if isinstance(value, tvm.ir.Constant) else arg

    def transform(mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        rewriter = Rewriter(mod)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
        return rewriter.builder_.get()

    return tvm.transform.module_pass(transform, opt_level=0, name=name)


def _gelu(emit: Callable, call: tvm.relax.Call) -> tvm.relax.Expr:
    """``nn.gelu`` / ``nn.gelu_tanh`` written out with ``erf`` / ``tanh``, which
    ``FastMathTransform`` then replaces (it knows no GELU)."""
    from tvm import relax

    x, op = call.args[0], relax.op
    dtype = x.ty.dtype

    def const(value: float) -> relax.Constant:
        return relax.const(value, dtype)

    if call.op.name == "relax.nn.gelu":  # x/2 · (1 + erf(x / √2))
        inner = op.erf(emit(op.multiply(x, const(0.5**0.5))))
    else:  # x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))
        cube = emit(op.multiply(emit(op.multiply(x, x)), x))
        poly = emit(op.add(x, emit(op.multiply(cube, const(0.044715)))))
        inner = op.tanh(emit(op.multiply(poly, const(math.sqrt(2 / math.pi)))))
    one_plus = emit(op.add(emit(inner), const(1.0)))
    return op.multiply(emit(op.multiply(x, const(0.5))), one_plus)


def _clip(emit: Callable, call: tvm.relax.Call) -> tvm.relax.Expr:
    """``clip(x, lo, hi)`` (ReLU6) as ``minimum(maximum(x, lo), hi)``: ConvertLayout knows no
    layout for ``clip`` and would wrap each one in a pair of transposes, where element-wise
    binary ops take any layout and fuse into the convolution before them."""
    from tvm import relax

    x, lo, hi = call.args
    dtype = x.ty.dtype
    low, high = (relax.const(float(getattr(b.value, "value", b.value)), dtype) for b in (lo, hi))
    return relax.op.minimum(emit(relax.op.maximum(x, low)), high)


_EXPAND_GELU = {"relax.nn.gelu": _gelu, "relax.nn.gelu_tanh": _gelu}


def _fold(compute: Callable[..., np.ndarray], *, with_attrs: bool = False) -> Callable:
    """A rewrite (for ``_rewrite_calls(constant_args=True)``) that replaces a call on constants
    by the constant ``compute(*argument values)`` (``compute(call.attrs, *values)`` with
    ``with_attrs``), in the call's dtype."""

    def rewrite(call: tvm.relax.Call, args: list[tvm.relax.Expr]) -> tvm.relax.Expr:
        from tvm import relax

        dtype = str(getattr(call.ty, "dtype", ""))
        if dtype not in _NUMPY_DTYPES:  # integer division and the like differ from NumPy's
            return call
        values = [_literal(a) for a in args]
        result = compute(call.attrs, *values) if with_attrs else compute(*values)
        return relax.const(np.asarray(result, dtype=dtype), dtype)

    return rewrite


def _literal(arg: tvm.relax.Expr) -> object:
    from tvm import relax

    if isinstance(arg, relax.ShapeExpr):
        return tuple(int(v) for v in arg.values)
    value = arg.value  # a tensor constant's tensor, or a scalar's float or int
    return value.numpy() if hasattr(value, "numpy") else value


def _permute(attrs: object, x: np.ndarray) -> np.ndarray:
    axes = attrs.axes
    return np.transpose(x, None if axes is None else [int(a) for a in axes])


_NUMPY_DTYPES = ("float16", "float32", "float64")

# The operators that fold a batch norm into a convolution (relax's FoldBatchnormToConv2D and
# DecomposeOpsForInference) and lay out its weight (ConvertLayout).  NumPy broadcasts as Relax does.
_NUMPY_FOLDS = {
    "relax.add": _fold(np.add),
    "relax.subtract": _fold(np.subtract),
    "relax.multiply": _fold(np.multiply),
    "relax.divide": _fold(np.divide),
    "relax.sqrt": _fold(np.sqrt),
    "relax.reshape": _fold(np.reshape),
    "relax.permute_dims": _fold(_permute, with_attrs=True),
}
