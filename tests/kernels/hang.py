# A kernel that runs for hours (10^12 dependent float additions): it must be timed out.
from tvm.script import tirx as T


@T.prim_func(s_tir=True)
def hang(A: T.Buffer((1,), "float32"), B: T.Buffer((1,), "float32")):
    for i, j in T.grid(1000000, 1000000):
        with T.sblock("B"):
            vi, vj = T.axis.remap("SR", [i, j])
            with T.init():
                B[0] = T.float32(0)
            B[0] = B[0] + A[0] * T.float32(1.0001)
