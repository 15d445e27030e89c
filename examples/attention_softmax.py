"""A workload written in TVMScript: the scaled softmax of attention scores (12 heads, 128
queries, 128 keys), as `tensortune tune --workload examples/attention_softmax.py` reads it.

A workload file defines exactly one PrimFunc (or an IRModule holding one) at top level; names
starting with `_` are ignored. TVM 0.27 spells TIR `tirx` and schedulable blocks `T.sblock`
inside `@T.prim_func(s_tir=True)`. Its `T.exp` is approximated by default (`--fast-math`).
"""

from tvm.script import tirx as T

_HEADS, _QUERIES, _KEYS = 12, 128, 128
_SCALE = 0.125  # 1 / sqrt(head size 64)


@T.prim_func(s_tir=True)
def attention_softmax(
    scores: T.Buffer((_HEADS, _QUERIES, _KEYS), "float32"),
    probs: T.Buffer((_HEADS, _QUERIES, _KEYS), "float32"),
):
    T.func_attr({"tirx.noalias": True})
    row_max = T.sblock_alloc_buffer((_HEADS, _QUERIES))
    exps = T.sblock_alloc_buffer((_HEADS, _QUERIES, _KEYS))
    row_sum = T.sblock_alloc_buffer((_HEADS, _QUERIES))
    for h, q, k in T.grid(_HEADS, _QUERIES, _KEYS):
        with T.sblock("row_max"):
            vh, vq, vk = T.axis.remap("SSR", [h, q, k])
            with T.init():
                row_max[vh, vq] = T.float32(-3.4028234663852886e38)
            row_max[vh, vq] = T.max(row_max[vh, vq], scores[vh, vq, vk] * T.float32(_SCALE))
    for h, q, k in T.grid(_HEADS, _QUERIES, _KEYS):
        with T.sblock("exp"):
            vh, vq, vk = T.axis.remap("SSS", [h, q, k])
            exps[vh, vq, vk] = T.exp(scores[vh, vq, vk] * T.float32(_SCALE) - row_max[vh, vq])
    for h, q, k in T.grid(_HEADS, _QUERIES, _KEYS):
        with T.sblock("row_sum"):
            vh, vq, vk = T.axis.remap("SSR", [h, q, k])
            with T.init():
                row_sum[vh, vq] = T.float32(0)
            row_sum[vh, vq] = row_sum[vh, vq] + exps[vh, vq, vk]
    for h, q, k in T.grid(_HEADS, _QUERIES, _KEYS):
        with T.sblock("normalize"):
            vh, vq, vk = T.axis.remap("SSS", [h, q, k])
            probs[vh, vq, vk] = exps[vh, vq, vk] / row_sum[vh, vq]
