"""Winograd convolutions: a model's channels-last 3×3 stride-1 convolutions as F(4×4, 3×3), or
F(2×2, 3×3) where an image holds too few 4×4 tiles.

Why: a direct convolution needs 9 multiply-adds per output and input channel; Winograd's
F(4×4, 3×3) needs 36 per tile of 16 outputs (4× fewer) and F(2×2, 3×3) 16 per tile of 4
(2.25× fewer), plus input and output transforms whose cost does not grow with the channel
count.  ONNX Runtime and OpenVINO run direct convolutions at a CPU's peak, so only fewer
operations can beat them.  On a 2-core Intel Xeon (AVX-512), ResNet-18's layers with bias and
ReLU, inside the model after 20 minutes of tuning it, took 424-435 µs at 56×56×64 and 399-408
µs at 28×28×128, where the direct ones took 551-577 and 570-615 µs (ONNX Runtime's: 511-516
and 525-540 µs).

How: each eligible ``relax.nn.conv2d`` (NHWC data, 3×3, stride and dilation 1, one group, a
constant float32 weight, enough channels and tiles, see ``tile_for``) becomes a call to the TE
computation below, on a weight transformed here, once (G·w·Gᵀ, in float64).  Its stages are
the ones MetaSchedule's CPU rules for NHWC Winograd expect (``conv2d_nhwc_winograd_data_pack``
and ``_inverse`` unroll the small transforms); the batched matrix product between them is
tuned like any other, its weight laid out for the schedule at compile time like a direct
convolution's.  The input is padded to whole tiles, so no tile reads outside it, and the
output reads only the tiles' valid part.

When not, and which tile: the transformed weight is (m + 2)² / 9 times the direct one (4× for
m = 4, 1.8× for m = 2), and inside a model it comes from memory, not from the cache that a
kernel timed alone keeps it in.  At 14×14×256 (16 tiles of 4×4, a 9.4 MB transformed weight)
F(4×4)'s kernels timed alone took 437-590 µs against 575-634 µs direct, but 774-783 µs inside
the model against 629-680 µs.  So a convolution takes the largest tile that leaves it
``MIN_TILES`` tiles, each value of its transformed weight then feeding enough multiply-adds, and
stays direct where no tile does.  At 14×14×256 that is F(2×2) (49 tiles, a 4.2 MB weight):
ResNet-50 and ResNet-18 built with it ran 1.01-1.05× and 1.04× faster than with those layers
direct, tuned alike (same store, the new tasks given the direct ones' trials; an Intel Xeon,
2 cores, whole models timed in turns).  At 7×7 not even 2×2 tiles are enough (16).

Cost: more rounding.  The transforms add and subtract scaled neighbours, so float32 results
move further from exact than a direct convolution's (``tests/test_winograd.py`` bounds it).
"""

from __future__ import annotations

import numpy as np

from tensortune.compat import tvm

# F(m×m, 3×3) for m in TILES, the largest that leaves a convolution MIN_TILES tiles; MetaSchedule's
# CPU Winograd rules unroll the α = m + 2 wide transforms (6 or 4).
TILES = (4, 2)
KERNEL = 3
# Below this many input or output channels the transforms cost more than the product saves.
MIN_CHANNELS = 16
# Fewer tiles than this and reading the larger transformed weight costs more than Winograd saves
# (see above: 16 tiles of 4×4 lost; 49 of 4×4, and of 2×2, won).
MIN_TILES = 32


def winograd_convs(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with its eligible convolutions in Winograd form (see the module docstring);
    weights must already be constants, convolutions already channels-last."""
    from tvm import relax

    mutator = _mutator()(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gv, mutator.visit_expr(func))
    return mutator.builder_.get()


def transformed_weight(weight: np.ndarray, layout: str = "OIHW",
                       tile: int = TILES[0]) -> np.ndarray:  # fmt: skip
    """A 3×3 weight in ``layout`` as the (α, α, CO, CI) kernel ``winograd_nhwc`` takes for
    F(``tile``×``tile``, 3×3): G·w·Gᵀ per channel pair, computed in float64, stored in the
    weight's dtype."""
    from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points

    oihw = np.transpose(weight, [layout.index(axis) for axis in "OIHW"]).astype(np.float64)
    # TOPI's matrices (as winograd_transform_matrices makes them), so that the transforms in
    # the computation match this one
    _, _, g = _cook_toom_convolution(_interpolation_points(tile + KERNEL - 2), tile, KERNEL)
    u = np.einsum("ak,oikl,bl->aboi", g, oihw, g)
    return np.ascontiguousarray(u, dtype=weight.dtype)


def winograd_nhwc(data: tvm.te.Tensor, kernel: tvm.te.Tensor,
                  padding: tuple[int, int, int, int]) -> tvm.te.Tensor:  # fmt: skip
    """A 3×3 stride-1 convolution of NHWC ``data`` with a transformed (α, α, CO, CI)
    ``kernel``; ``padding`` is (top, left, bottom, right)."""
    from tvm import te, topi
    from tvm.topi.nn.winograd_util import winograd_transform_matrices

    n, height, width, ci = (int(d) for d in data.shape)
    alpha, _, co, _ = (int(d) for d in kernel.shape)
    m = alpha - KERNEL + 1
    top, left, _, _ = padding
    out_h, out_w = _output_size(height, width, padding)
    tiles_h, tiles_w = -(-out_h // m), -(-out_w // m)
    tiles = n * tiles_h * tiles_w
    a, b, _ = winograd_transform_matrices(m, KERNEL, "float32")
    # padded to whole tiles: the last row and column of tiles read zeros, not past the buffer
    pad_to_h, pad_to_w = tiles_h * m + KERNEL - 1, tiles_w * m + KERNEL - 1
    padded = topi.nn.pad(data, (0, top, left, 0),
                         (0, pad_to_h - height - top, pad_to_w - width - left, 0),
                         name="data_pad", attrs={"schedule_rule": "None"})  # fmt: skip

    def tile_of(p):  # (image, first row, first column) of tile p
        return p // (tiles_h * tiles_w), (p // tiles_w) % tiles_h * m, p % tiles_w * m

    def read_tile(eps, nu, p, c):
        image, row, col = tile_of(p)
        return padded[image, row + eps, col + nu, c]

    input_tile = te.compute((alpha, alpha, tiles, ci), read_tile, name="input_tile",
                            attrs={"schedule_rule": "None"})  # fmt: skip
    ra, rb = te.reduce_axis((0, alpha), "r_a"), te.reduce_axis((0, alpha), "r_b")
    data_pack = te.compute(
        (alpha, alpha, tiles, ci),
        lambda eps, nu, p, c: te.sum(input_tile[ra, rb, p, c] * b[ra, eps] * b[rb, nu],
                                     axis=[ra, rb]),
        name="data_pack", attrs={"schedule_rule": "conv2d_nhwc_winograd_data_pack"},
    )  # fmt: skip
    rc = te.reduce_axis((0, ci), name="ci")
    bgemm = te.compute(
        (alpha, alpha, tiles, co),
        lambda eps, nu, p, o: te.sum(data_pack[eps, nu, p, rc] * kernel[eps, nu, o, rc], axis=[rc]),
        name="bgemm", attrs={"layout_free_placeholders": [kernel]},
    )  # fmt: skip
    ra, rb = te.reduce_axis((0, alpha), "r_a"), te.reduce_axis((0, alpha), "r_b")
    inverse = te.compute(
        (m, m, tiles, co),
        lambda vh, vw, p, o: te.sum(bgemm[ra, rb, p, o] * a[ra, vh] * a[rb, vw], axis=[ra, rb]),
        name="inverse", attrs={"schedule_rule": "conv2d_nhwc_winograd_inverse"},
    )  # fmt: skip
    return te.compute(
        (n, out_h, out_w, co),
        lambda i, h, w, o: inverse[h % m, w % m, (i * tiles_h + h // m) * tiles_w + w // m, o],
        name="conv2d_winograd",
    )


def tile_for(call: tvm.relax.Call) -> int | None:
    """The output tile (m of F(m×m, 3×3)) ``winograd_convs`` rewrites a ``relax.nn.conv2d``
    call with, or None where it stays direct."""
    a = call.attrs
    data, weight = call.args
    if not isinstance(weight, tvm.ir.Constant) or str(weight.value.dtype) != "float32":
        return None
    if a.data_layout != "NHWC" or a.out_layout != "NHWC" or a.groups != 1:
        return None
    if any(int(s) != 1 for s in (*a.strides, *a.dilation)):
        return None
    if str(a.out_dtype) not in ("", "float32") or data.ty.dtype != "float32":
        return None
    shape = dict(zip(a.kernel_layout, (int(d) for d in weight.value.shape), strict=True))
    if (shape["H"], shape["W"]) != (KERNEL, KERNEL) or min(shape["O"], shape["I"]) < MIN_CHANNELS:
        return None
    n, height, width, _ = (int(d) for d in data.ty.shape)
    out_h, out_w = _output_size(height, width, tuple(int(p) for p in a.padding))
    for tile in TILES:
        if n * -(-out_h // tile) * -(-out_w // tile) >= MIN_TILES:
            return tile
    return None


def _output_size(height: int, width: int, padding: tuple) -> tuple[int, int]:
    """A 3×3 stride-1 convolution's output height and width; ``padding`` is (top, left,
    bottom, right)."""
    top, left, bottom, right = padding
    return height + top + bottom - KERNEL + 1, width + left + right - KERNEL + 1


def _mutator() -> type:
    from tvm import relax

    @relax.expr_functor.mutator
    class WinogradMutator(relax.PyExprMutator):
        def visit_call_(self, call: relax.Call) -> relax.Expr:
            call = super().visit_call_(call)
            if getattr(call.op, "name", None) != "relax.nn.conv2d":
                return call
            tile = tile_for(call)
            if tile is None:
                return call
            data, weight = call.args
            kernel = transformed_weight(weight.value.numpy(), str(call.attrs.kernel_layout), tile)
            padding = tuple(int(p) for p in call.attrs.padding)
            # returned unbound, so that FuseOps sees the convolution feed its epilogue directly
            return self.builder_.call_te(winograd_nhwc, data, relax.const(kernel), padding,
                                         primfunc_name_hint="conv2d_winograd")  # fmt: skip

    return WinogradMutator
