"""The operator zoo: common tensor operators as TIR workloads, named by a one-line spec.

Spec grammar (whitespace-free)::

    spec    := op ":" int ("," int)*
    op      := one of OPS below; the integers are its parameters, in the order listed there

Trailing parameters with defaults may be left out; ``str(OpSpec)`` always writes them all, so
``parse_spec(str(s)) == s`` and the canonical text of a spec round-trips exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tensortune.errors import WorkloadError

if TYPE_CHECKING:
    import tvm

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class OpDef:
    name: str
    params: tuple[str, ...]
    defaults: dict[str, Callable[[dict[str, int]], int]]
    doc: str
    build: Callable[..., list]  # te tensors: inputs..., output
    flop: Callable[..., float]


@dataclass(frozen=True)
class OpSpec:
    op: str
    args: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.op}:{','.join(map(str, self.args))}"

    @property
    def params(self) -> dict[str, int]:
        return dict(zip(OPS[self.op].params, self.args, strict=True))

    @property
    def flop(self) -> float:
        return float(OPS[self.op].flop(**self.params))

    def to_module(self) -> tvm.IRModule:
        from tensortune.compat import tvm

        tensors = OPS[self.op].build(**self.params)
        mod = tvm.IRModule({"main": tvm.te.create_prim_func(tensors)})
        check_arguments(mod, f"'{self}'")
        return mod


# What a workload's buffers may take in all: each candidate timed allocates them (a model's
# inputs have the same limit, ``models.MAX_INPUT_BYTES``), and a reference check runs the
# untuned kernel on them.
MAX_ARGUMENT_BYTES = 4 << 30


def check_arguments(mod: tvm.IRModule, what: str) -> None:
    """A one-line ``WorkloadError`` for buffers of ``mod``'s PrimFuncs a tuner cannot use:
    symbolic shapes, empty ones, ones past int32 indexing, or more than
    ``MAX_ARGUMENT_BYTES`` in all."""
    from tensortune.compat import tvm

    total = 0
    params = [p for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)
              for p in f.params]  # fmt: skip
    for param in params:
        ty = param.ty
        shape = getattr(ty, "shape", None)  # a buffer's (a scalar parameter has none)
        if shape is None:
            continue
        if not all(isinstance(d, tvm.tirx.IntImm) for d in shape):
            dims = ", ".join(str(d) for d in shape)
            raise WorkloadError(f"{what}: buffer {param} has a symbolic shape ({dims}); a "
                                "workload to tune needs static shapes")  # fmt: skip
        elements = math.prod(int(d) for d in shape)
        if elements == 0:
            raise WorkloadError(f"{what}: buffer {param} is empty (a dimension of 0)")
        # TIR indexes buffers with int32 unless told otherwise: a larger tensor's flat
        # index wraps around, and the kernel reads and writes out of bounds.
        if elements > INT32_MAX:
            raise WorkloadError(f"{what}: tensor {param} would hold {elements:,} elements, more "
                                f"than int32 indexing allows ({INT32_MAX:,})")  # fmt: skip
        total += elements * tvm.DataType(str(ty.dtype)).bits // 8
    if total > MAX_ARGUMENT_BYTES:
        raise WorkloadError(f"{what}: its buffers take {total / 2**30:.1f} GiB, more than the "
                            f"{MAX_ARGUMENT_BYTES >> 30} GiB a workload may")  # fmt: skip


def _out(size: int, k: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - k) // stride + 1


# ---- definitions (te is imported lazily: building a spec's text must not need TVM) ----------


def _matmul(M: int, N: int, K: int) -> list:
    from tvm import te

    A, B = te.placeholder((M, K), name="A"), te.placeholder((K, N), name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    return [A, B, C]


def _batch_matmul(B: int, M: int, N: int, K: int) -> list:
    from tvm import te

    X, Y = te.placeholder((B, M, K), name="A"), te.placeholder((B, K, N), name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((B, M, N), lambda b, i, j: te.sum(X[b, i, k] * Y[b, k, j], axis=k), name="C")
    return [X, Y, C]


def _dense(M: int, N: int, K: int) -> list:
    from tvm import te, topi

    X, W = te.placeholder((M, K), name="X"), te.placeholder((N, K), name="W")
    bias = te.placeholder((N,), name="bias")
    return [X, W, bias, topi.nn.relu(topi.add(topi.nn.dense(X, W), bias))]


def _conv2d(layout: str, fused: bool):
    def build(N: int, H: int, W: int, CI: int, CO: int, K: int, stride: int, pad: int) -> list:
        from tvm import te, topi

        if layout == "NCHW":
            data = te.placeholder((N, CI, H, W), name="data")
            weight = te.placeholder((CO, CI, K, K), name="weight")
            out = topi.nn.conv2d_nchw(data, weight, stride, pad, 1)
            bias_shape = (1, CO, 1, 1)
        else:
            data = te.placeholder((N, H, W, CI), name="data")
            weight = te.placeholder((K, K, CI, CO), name="weight")
            out = topi.nn.conv2d_nhwc(data, weight, stride, pad, 1)
            bias_shape = (1, 1, 1, CO)
        if not fused:
            return [data, weight, out]
        bias = te.placeholder(bias_shape, name="bias")
        return [data, weight, bias, topi.nn.relu(topi.add(out, bias))]

    return build


def _conv2d_flop(fused: bool):
    def flop(N: int, H: int, W: int, CI: int, CO: int, K: int, stride: int, pad: int) -> float:
        outputs = N * _out(H, K, stride, pad) * _out(W, K, stride, pad) * CO
        return 2.0 * outputs * CI * K * K + (2.0 * outputs if fused else 0.0)

    return flop


def _depthwise(N: int, H: int, W: int, C: int, K: int, stride: int, pad: int) -> list:
    from tvm import te, topi

    data = te.placeholder((N, C, H, W), name="data")
    weight = te.placeholder((C, 1, K, K), name="weight")
    return [data, weight, topi.nn.depthwise_conv2d_nchw(data, weight, stride, pad, 1)]


def _pool(kind: str):
    def build(N: int, H: int, W: int, C: int, K: int, stride: int, pad: int) -> list:
        from tvm import te, topi

        data = te.placeholder((N, C, H, W), name="data")
        out = topi.nn.pool2d(data, (K, K), (stride, stride), (1, 1), (pad, pad, pad, pad), kind)
        return [data, out]

    return build


def _window_flop(N: int, H: int, W: int, C: int, K: int, stride: int, pad: int) -> float:
    return float(N * C * _out(H, K, stride, pad) * _out(W, K, stride, pad) * K * K)


def _softmax(M: int, N: int) -> list:
    from tvm import te, topi

    X = te.placeholder((M, N), name="X")
    return [X, topi.nn.softmax(X, axis=-1)]


def _layernorm(M: int, N: int) -> list:
    from tvm import te, topi

    X = te.placeholder((M, N), name="X")
    gamma, beta = te.placeholder((N,), name="gamma"), te.placeholder((N,), name="beta")
    return [X, gamma, beta, topi.nn.layer_norm(X, gamma, beta, axis=[-1], epsilon=1e-5)]


_CONV_PARAMS = ("N", "H", "W", "CI", "CO", "K", "stride", "pad")
_CONV_DEFAULTS: dict[str, Callable[[dict[str, int]], int]] = {
    "stride": lambda p: 1,
    "pad": lambda p: p["K"] // 2,
}
_WINDOW_PARAMS = ("N", "H", "W", "C", "K", "stride", "pad")
_CONV_DOC = "N,H,W,CI,CO,K[,stride=1[,pad=K//2]]: square KxK kernel"

OPS: dict[str, OpDef] = {
    d.name: d
    for d in [
        OpDef("matmul", ("M", "N", "K"), {}, "M,N,K: C[M,N] = A[M,K]·B[K,N]",
              _matmul, lambda M, N, K: 2.0 * M * N * K),
        OpDef("batch_matmul", ("B", "M", "N", "K"), {}, "B,M,N,K: C[b] = A[b,M,K]·B[b,K,N]",
              _batch_matmul, lambda B, M, N, K: 2.0 * B * M * N * K),
        OpDef("dense_bias_relu", ("M", "N", "K"), {}, "M,N,K: relu(X[M,K]·W[N,K]ᵀ + b[N])",
              _dense, lambda M, N, K: 2.0 * M * N * K + 2.0 * M * N),
        OpDef("conv2d_nchw", _CONV_PARAMS, _CONV_DEFAULTS, _CONV_DOC,
              _conv2d("NCHW", False), _conv2d_flop(False)),
        OpDef("conv2d_nhwc", _CONV_PARAMS, _CONV_DEFAULTS, _CONV_DOC,
              _conv2d("NHWC", False), _conv2d_flop(False)),
        OpDef("conv2d_nchw_bias_relu", _CONV_PARAMS, _CONV_DEFAULTS, _CONV_DOC + ", +bias+relu",
              _conv2d("NCHW", True), _conv2d_flop(True)),
        OpDef("conv2d_nhwc_bias_relu", _CONV_PARAMS, _CONV_DEFAULTS, _CONV_DOC + ", +bias+relu",
              _conv2d("NHWC", True), _conv2d_flop(True)),
        OpDef("depthwise_conv2d", _WINDOW_PARAMS, _CONV_DEFAULTS,
              "N,H,W,C,K[,stride=1[,pad=K//2]]: NCHW, one KxK filter per channel",
              _depthwise, lambda **p: 2.0 * _window_flop(**p)),
        OpDef("max_pool2d", _WINDOW_PARAMS, {"stride": lambda p: p["K"], "pad": lambda p: 0},
              "N,H,W,C,K[,stride=K[,pad=0]]: NCHW max pooling", _pool("max"), _window_flop),
        OpDef("avg_pool2d", _WINDOW_PARAMS, {"stride": lambda p: p["K"], "pad": lambda p: 0},
              "N,H,W,C,K[,stride=K[,pad=0]]: NCHW average pooling", _pool("avg"), _window_flop),
        OpDef("softmax", ("M", "N"), {}, "M,N: softmax over the last axis",
              _softmax, lambda M, N: 4.0 * M * N),
        OpDef("layernorm", ("M", "N"), {}, "M,N: layer norm over the last axis (+gamma, beta)",
              _layernorm, lambda M, N: 8.0 * M * N),
    ]
}  # fmt: skip


def parse_spec(text: str) -> OpSpec:
    """Parse ``op:int,int,...``; raises :class:`WorkloadError` with the reason on bad input."""
    op, sep, rest = text.strip().partition(":")
    if op not in OPS:
        raise WorkloadError(f"unknown operator '{op}'; known: {', '.join(OPS)}")
    d = OPS[op]
    if not sep or not rest:
        raise WorkloadError(f"'{text}': expected {op}:{d.doc.split(':')[0]}")
    try:
        values = [int(v) for v in rest.split(",")]
    except ValueError:
        raise WorkloadError(f"'{text}': shape must be comma-separated integers") from None
    required = len(d.params) - len(d.defaults)
    if not required <= len(values) <= len(d.params):
        raise WorkloadError(
            f"'{text}': {op} takes {required}-{len(d.params)} integers ({d.doc.split(':')[0]})"
            if d.defaults
            else f"'{text}': {op} takes {len(d.params)} integers ({d.doc.split(':')[0]})"
        )
    given = dict(zip(d.params, values, strict=False))
    for name in d.params[len(values) :]:
        given[name] = d.defaults[name](given)
    bad = [n for n, v in given.items() if (v <= 0 and n != "pad") or v < 0]
    if bad:
        what = "must be positive" if bad != ["pad"] else "must not be negative"
        raise WorkloadError(f"'{text}': {', '.join(bad)} {what}")
    huge = [n for n, v in given.items() if v > INT32_MAX]
    if huge:
        raise WorkloadError(f"'{text}': {', '.join(huge)} must be at most {INT32_MAX:,} (int32)")
    spec = OpSpec(op, tuple(given[n] for n in d.params))
    if (
        "K" in given
        and "H" in given
        and (
            _out(given["H"], given["K"], given.get("stride", 1), given.get("pad", 0)) <= 0
            or _out(given["W"], given["K"], given.get("stride", 1), given.get("pad", 0)) <= 0
        )
    ):
        raise WorkloadError(f"'{text}': the kernel does not fit the padded input")
    return spec
