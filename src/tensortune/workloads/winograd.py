"""Winograd convolutions: a model's 3×3 stride-1 convolutions rewritten as F(m×m, 3×3).

Why: a direct convolution needs 9 multiply-adds per output and input channel; Winograd's
F(4×4, 3×3) needs 36 per 16 outputs (4× fewer), F(2×2, 3×3) 16 per 4 (2.25× fewer), plus
input and output transforms whose cost does not grow with the channel count.  ONNX Runtime and
OpenVINO already run direct convolutions near a CPU's peak, so only fewer FLOPs can beat them.

How: each eligible ``relax.nn.conv2d`` (NCHW/OIHW, 3×3, stride and dilation 1, one group, a
constant float32 weight, enough channels that the transforms pay, an output of whole 4×4
tiles) becomes TOPI's
``conv2d_winograd_nchw`` on a pre-transformed weight: the weight is transformed here, once,
and the convolution's stages carry MetaSchedule's CPU Winograd schedule rules
(``conv2d_nchw_winograd_data_pack`` / ``_inverse``); its batched matrix product is tuned like
any other.

Cost: more rounding.  The input and output transforms add and subtract scaled neighbours, so
float32 results move further from exact than a direct convolution's (``tests/test_winograd.py``
bounds it).

Status: experimental, off by default (``load_model(..., winograd=True)``).  On an Intel Xeon
(2 cores) one ResNet-18 layer (64 channels, 56×56, conv + bias + ReLU) tuned 64 trials each ran
0.97 ms against 1.12 ms direct (1.15×; eager PyTorch 0.93 ms), but each Winograd trial took ~3×
as long to build and run.  Tuning all of ResNet-18 with it stopped twice on a MetaSchedule
error in a Winograd task's first round ("The block no longer exists in the IRModule", raised
from the search's parallel sampling, which takes the whole run down): once on a variant that
cropped a padded output (since removed), once on a 28×28 layer that 16 trials alone had tuned
without error.
"""

from __future__ import annotations

import numpy as np

from tensortune.compat import tvm

# F(TILE×TILE, 3×3).  Both TOPI's public entry point and MetaSchedule's CPU rules use 4.
TILE = 4
# Below this many input or output channels the transforms cost more than the product saves.
MIN_CHANNELS = 16


def winograd_convs(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its eligible convolutions in Winograd form (see the module docstring);
    weights must already be constants (run after binding them)."""
    from tvm import relax

    mutator = _mutator()(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()


def transformed_weight(weight: np.ndarray) -> np.ndarray:
    """A (CO, CI, 3, 3) weight as the (α, α, CI, CO) kernel TOPI's pre-computed Winograd
    convolution takes: G·w·Gᵀ per channel pair, computed in float64, stored in float32."""
    # TOPI's own weight transform cannot be used: its memoized matrices refuse TVM 0.27's dtype
    # objects.  The matrices themselves are TOPI's, so the convolution's transforms match.
    from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

    kernel = weight.shape[-1]
    _, _, g = _cook_toom_convolution(_interpolation_points(TILE + kernel - 2), TILE, kernel)
    u = np.einsum("ak,oikl,bl->abio", g, weight.astype(np.float64), g)
    return np.ascontiguousarray(u, dtype=weight.dtype)


def eligible(call: tvm.relax.Call) -> bool:
    """Whether a ``relax.nn.conv2d`` call is one ``winograd_convs`` rewrites."""

    a = call.attrs
    data, weight = call.args
    if not isinstance(weight, tvm.ir.Constant) or str(weight.value.dtype) != "float32":
        return False
    if (a.data_layout, a.kernel_layout, a.out_layout) != ("NCHW", "OIHW", "NCHW"):
        return False
    if a.groups != 1 or any(int(s) != 1 for s in (*a.strides, *a.dilation)):
        return False
    if str(a.out_dtype) not in ("", "float32") or data.ty.dtype != "float32":
        return False
    co, ci, kh, kw = (int(d) for d in weight.value.shape)
    _, _, height, width = (int(d) for d in data.ty.shape)
    top, left, bottom, right = (int(p) for p in a.padding)
    # TOPI's tiles read past its padded input unless the output is a whole number of tiles
    # (garbage, even NaN, then leaks into real outputs); padding further and cropping the
    # output instead left MetaSchedule's Winograd design space failing on the fused crop.
    whole = (height + top + bottom - 2) % TILE == 0 and (width + left + right - 2) % TILE == 0
    return (kh, kw) == (3, 3) and min(co, ci) >= MIN_CHANNELS and whole


def _mutator() -> type:
    from tvm import relax, topi

    @relax.expr_functor.mutator
    class WinogradMutator(relax.PyExprMutator):
        def visit_call_(self, call: relax.Call) -> relax.Expr:
            call = super().visit_call_(call)
            if getattr(call.op, "name", None) != "relax.nn.conv2d" or not eligible(call):
                return call
            data, weight = call.args
            a, bb = call.attrs, self.builder_
            packed = relax.const(transformed_weight(weight.value.numpy()))
            padding = [int(p) for p in a.padding]
            # returned unbound, so that FuseOps sees the convolution feed its epilogue directly
            return bb.call_te(topi.nn.conv2d_winograd_nchw_without_weight_transform, data,
                              packed, [1, 1], padding, [1, 1], "float32",
                              primfunc_name_hint="conv2d_winograd")  # fmt: skip

    return WinogradMutator
