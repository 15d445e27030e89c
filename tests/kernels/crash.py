# A kernel that writes far outside its output buffer: the process running it dies (SIGSEGV).
from tvm.script import tirx as T


@T.prim_func(s_tir=True)
def crash(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
    for i in range(16):
        with T.sblock("B"):
            vi = T.axis.spatial(16, i)
            B[vi * 100000000 + 100000000] = A[vi]
