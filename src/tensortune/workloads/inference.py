"""Rewrites of an imported model for inference, applied before it is cut into tuning tasks.

They run on ``Model.mod`` itself, so the tasks tuned and the module ``compile`` builds are cut
from the same graph and their keys match.
"""

from __future__ import annotations

import math

from tensortune.compat import tvm
from tensortune.workloads.winograd import winograd_convs

# Part of the key of anything derived from a model's task list (the zoo's cached task counts):
# raise it whenever a rewrite here changes the tasks a model is cut into.
REWRITES_VERSION = 3  # 3: weights marked layout-free (models.fuse)


def for_inference(mod: tvm.IRModule, *, fast_math: bool = True,
                  winograd: bool = False) -> tvm.IRModule:  # fmt: skip
    """Fold batch norms into convolutions and, with ``fast_math``, replace the transcendental
    functions by polynomial approximations that vectorize; with ``winograd`` (experimental),
    run eligible 3×3 convolutions as Winograd's (``workloads.winograd``).

    Left alone, an inference-mode batch norm legalizes to a tuple-returning PrimFunc that
    FuseOps cannot merge with its neighbours, so every conv → BN → ReLU (→ residual add) costs
    a conv task plus a memory-bound BN task.  Folded, the bias, the add and the ReLU fuse into
    the conv's epilogue, where they cost almost nothing.  Batch norms with no conv in front
    become plain arithmetic that fuses as well.

    LLVM has no vector ``erf`` and scalarizes ``exp`` and ``tanh`` into libm calls, so one
    exact GELU over a 128×3072 activation costs ~2 ms on a 2-core x86 (eager PyTorch
    vectorizes it).  With TVM's ``fast_*`` approximations a BERT layer's output stays
    within 2.4e-6 of PyTorch's.
    """
    from tvm import relax

    passes = [
        relax.transform.FoldBatchnormToConv2D(),
        relax.transform.DecomposeOpsForInference(),
        relax.transform.FoldConstant(),  # the scaled weights and the folded biases
        relax.transform.CanonicalizeBindings(),  # the tuple that BN left behind
        relax.transform.DeadCodeElimination(),
    ]
    if fast_math:
        passes += [_ExpandGelu(), relax.transform.FastMathTransform()]
    mod = tvm.transform.Sequential(passes)(mod)
    return winograd_convs(mod) if winograd else mod


@tvm.transform.module_pass(opt_level=0, name="tensortune.ExpandGelu")
class _ExpandGelu:
    """Write ``nn.gelu`` / ``nn.gelu_tanh`` out with ``erf`` / ``tanh``, which
    ``FastMathTransform`` then replaces (it knows no GELU)."""

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        mutator = _gelu_mutator()(mod)
        for gv, func in mod.functions_items():
            if isinstance(func, tvm.relax.Function):
                mutator.builder_.update_func(gv, mutator.visit_expr(func))
        return mutator.builder_.get()


def _gelu_mutator() -> type:
    from tvm import relax

    @relax.expr_functor.mutator
    class GeluMutator(relax.PyExprMutator):
        def visit_call_(self, call: relax.Call) -> relax.Expr:
            name = getattr(call.op, "name", None)
            if name not in ("relax.nn.gelu", "relax.nn.gelu_tanh"):
                return super().visit_call_(call)
            x, emit, op = call.args[0], self.builder_.emit, relax.op
            dtype = x.ty.dtype

            def const(value: float) -> relax.Constant:
                return relax.const(value, dtype)

            if name == "relax.nn.gelu":  # x/2 · (1 + erf(x / √2))
                inner = op.erf(emit(op.multiply(x, const(0.5**0.5))))
            else:  # x/2 · (1 + tanh(√(2/π) · (x + 0.044715 x³)))
                cube = emit(op.multiply(emit(op.multiply(x, x)), x))
                poly = emit(op.add(x, emit(op.multiply(cube, const(0.044715)))))
                inner = op.tanh(emit(op.multiply(poly, const(math.sqrt(2 / math.pi)))))
            one_plus = emit(op.add(emit(inner), const(1.0)))
            return op.multiply(emit(op.multiply(x, const(0.5))), one_plus)

    return GeluMutator
