"""Code features: a summary of the x86 assembly LLVM generates for a scheduled program."""

from __future__ import annotations

import numpy as np
import pytest

from tensortune.errors import TensortuneError
from tensortune.features.code import (
    CODE_FEATURE_NAMES,
    CODE_WIDTH,
    code_features,
    code_features_batch,
    summarize_assembly,
)

AVX512 = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}

# Two nested loops in a compute function, a spill reload in the inner one, and a TVM helper
# whose instructions must not count.
ASM = """\
\t.text
__tvm_ffi_main:
\tvfmadd231ps\t%zmm1, %zmm2, %zmm3
\tcallq\tmain_compute_
main_compute_:
\txorl\t%eax, %eax
.LBB0_1:
\tvbroadcastss\t(%rdi,%rax,4), %zmm0
.LBB0_2:
\tvmovups\t64(%rsi,%rcx), %zmm1
\tvfmadd231ps\t%zmm1, %zmm0, %zmm2
\tvfmadd231ps\t(%rsi), %zmm0, %zmm3
\tvmovaps\t128(%rsp), %zmm4
\taddq\t$64, %rcx
\tjne\t.LBB0_2
\tvmovups\t%zmm2, (%rdx)
\tvaddss\t%xmm0, %xmm1, %xmm1
\tjne\t.LBB0_1
\tretq
"""


def named(row: np.ndarray) -> dict[str, float]:
    return dict(zip(CODE_FEATURE_NAMES, row.tolist(), strict=True))


def test_loops_nest_by_backward_branches_and_helpers_do_not_count():
    f = named(summarize_assembly(ASM))
    assert len(CODE_FEATURE_NAMES) == CODE_WIDTH
    assert f["program_loops"] == 2 and f["program_max_depth"] == 2
    assert f["program_functions"] == 1  # __tvm_ffi_main is TVM's, not the kernel's
    # The inner loop: 6 instructions, two 16-lane FMAs, three loads (one a stack reload).
    assert f["hot_instructions"] == 6
    assert f["hot_fma_lanes"] == 32
    assert f["hot_loads"] == 3 and f["hot_stores"] == 0
    assert f["hot_stack"] == 1 and f["hot_stack_share"] == pytest.approx(1 / 6)
    assert f["hot_fma_per_access"] == pytest.approx(32 / 4)
    # Around it: the broadcast, the store of the accumulator, a scalar add, the branch.
    assert f["around_hot_broadcasts"] == 1 and f["around_hot_stores"] == 1
    assert f["around_hot_scalar_fp"] == 1 and f["around_hot_fma_lanes"] == 0
    assert f["program_fma_lanes"] == 32  # the helper's FMA is not the kernel's


def test_rbp_is_a_register_like_any_other_not_the_stack():
    # LLVM leaves out the frame pointer at -O3 (none in 8 sampled conv2d kernels, where 34
    # operands used %rbp): data indexed by it are no spills; only %rsp-based operands are.
    asm = ("\t.text\nmain_compute_:\n.LBB0_1:\n"
           "\tvmovss\t(%r13,%rbp,4), %xmm2\n\tvmovss\t%xmm2, 4(%rbp)\n"
           "\tvmovups\t64(%rsp), %zmm3\n\tjne\t.LBB0_1\n\tretq\n")  # fmt: skip
    f = named(summarize_assembly(asm))
    assert f["hot_loads"] == 2 and f["hot_stores"] == 1
    assert f["hot_stack"] == 1


def test_no_compute_function_gives_zeros_not_an_error():
    assert not summarize_assembly("\t.text\n__tvm_ffi_main:\n\tretq\n").any()


def matmul(vectorized: bool):
    from tensortune.compat import tvm
    from tensortune.workloads.ops import parse_spec

    mod = parse_spec("matmul:64,64,64").to_module()
    if not vectorized:
        return mod
    sch = tvm.s_tir.Schedule(mod)
    i, j, k = sch.get_loops(sch.get_sblock("C"))
    outer, inner = sch.split(j, [None, 16])
    sch.reorder(i, outer, k, inner)
    sch.vectorize(inner)
    return sch.mod


def test_a_vectorized_schedule_reads_as_vector_code_and_the_naive_one_as_scalar():
    naive = named(code_features(matmul(False), AVX512))
    vector = named(code_features(matmul(True), AVX512))
    assert naive["hot_scalar_fp"] > 0 and naive["hot_zmm"] == 0
    assert vector["hot_scalar_fp"] == 0 and vector["hot_zmm"] > 0
    assert vector["hot_fma_per_access"] > 4 * naive["hot_fma_per_access"]


def test_the_code_is_generated_for_the_target_not_the_host():
    avx2 = named(code_features(matmul(True), {"kind": "llvm", "mcpu": "haswell"}))
    assert avx2["program_zmm"] == 0 and avx2["program_ymm"] > 0


@pytest.mark.parametrize("target", [{"kind": "llvm", "mtriple": "aarch64-linux-gnu"},
                                    {"kind": "cuda"}])  # fmt: skip
def test_a_target_that_is_not_x86_is_refused_with_one_line(target):
    with pytest.raises(TensortuneError, match="not x86"):
        code_features(matmul(False), target)
    with pytest.raises(TensortuneError, match="not x86"):
        next(code_features_batch([(matmul(False), target)], workers=1))


def test_a_batch_keeps_its_order_and_a_failed_build_costs_only_its_own_row():
    jobs = [(matmul(True), AVX512), ("not a module", AVX512), (matmul(False), AVX512)]
    vector, failed, naive = code_features_batch(jobs, workers=2)
    assert failed is None
    np.testing.assert_array_equal(vector, code_features(matmul(True), AVX512))
    np.testing.assert_array_equal(naive, code_features(matmul(False), AVX512))
