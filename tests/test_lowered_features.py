"""Lowered-loop features: the hot loop of TVM's lowered TIR, read before LLVM runs."""

from __future__ import annotations

import numpy as np
import pytest

from tensortune.features.lowered import LOWERED_FEATURE_NAMES, LOWERED_WIDTH, lowered_features

AVX512 = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}
AVX2 = {"kind": "llvm", "mcpu": "haswell", "num-cores": 2}


def named(row: np.ndarray) -> dict[str, float]:
    assert row.shape == (LOWERED_WIDTH,) and np.isfinite(row).all()
    return dict(zip(LOWERED_FEATURE_NAMES, row.tolist(), strict=True))


def matmul(tile_rows: int | None):
    """64³ matmul: naive (None), or a register tile of ``tile_rows`` x 16 lanes under k."""
    from tensortune.compat import tvm
    from tensortune.workloads.ops import parse_spec

    mod = parse_spec("matmul:64,64,64").to_module()
    if tile_rows is None:
        return mod
    sch = tvm.s_tir.Schedule(mod)
    i, j, k = sch.get_loops(sch.get_sblock("C"))
    i0, i1 = sch.split(i, [None, tile_rows])
    j0, j1 = sch.split(j, [None, 16])
    sch.reorder(i0, j0, k, i1, j1)
    sch.unroll(i1)
    sch.vectorize(j1)
    return sch.mod


def test_the_naive_loop_feeds_one_fma_lane_per_two_loads():
    f = named(lowered_features(matmul(None), AVX512))
    assert f["hot_fma_lanes"] == 1
    assert f["hot_scalar_loads"] == 2 and f["hot_vector_loads"] == 0
    # C[i, j] does not move with k: it is an accumulator, not an access per iteration.
    assert f["hot_stores"] == 0 and f["hot_accumulator_registers"] == 1
    assert f["hot_fma_per_access"] == pytest.approx(0.5)
    assert f["hot_log_trips"] == pytest.approx(np.log2(64**3 + 1), rel=1e-4)


def test_a_loop_kept_inside_an_unrolled_one_runs_as_often_as_the_nest_says():
    # Lifted out of the unrolled loop, its trips were multiplied by that loop's extent again
    # (4x too many here: log2 20 for 18).
    from tensortune.compat import tvm
    from tensortune.workloads.ops import parse_spec

    sch = tvm.s_tir.Schedule(parse_spec("matmul:64,64,64").to_module())
    i, j, k = sch.get_loops(sch.get_sblock("C"))
    i0, i1 = sch.split(i, [None, 4])
    sch.reorder(i0, j, i1, k)
    sch.unroll(i1)
    f = named(lowered_features(sch.mod, AVX512))
    assert f["hot_log_trips"] == pytest.approx(np.log2(64**3 + 1), rel=1e-4)


def test_a_register_tile_reads_as_many_fmas_per_access():
    f = named(lowered_features(matmul(4), AVX512))
    # Under k: four 16-lane FMAs fed by one vector load of B and four scalar loads of A.
    assert f["hot_fma_lanes"] == 64
    assert f["hot_vector_loads"] == 1 and f["hot_scalar_loads"] == 4
    assert f["hot_accumulator_registers"] == 4 and f["hot_register_excess"] == 0
    assert f["hot_fma_per_access"] == pytest.approx(64 / 5)
    assert f["program_vector_share"] > 0.1


def test_registers_are_counted_for_the_target():
    zmm = named(lowered_features(matmul(4), AVX512))
    ymm = named(lowered_features(matmul(4), AVX2))
    assert ymm["hot_vector_loads"] == 2 * zmm["hot_vector_loads"]
    assert ymm["hot_accumulator_registers"] == 2 * zmm["hot_accumulator_registers"]


def test_a_tile_too_big_for_the_registers_shows_as_excess():
    f = named(lowered_features(matmul(64), AVX2))  # 64 rows x 2 ymm accumulators > 16
    assert f["hot_accumulator_registers"] == 128
    assert f["hot_register_excess"] > 100
    assert f["hot_fma_per_access"] < named(lowered_features(matmul(4), AVX2))["hot_fma_per_access"]


def tiled_with_pragma(max_step: int):
    """matmul(4) whose 4-row tile is left to TVM's auto-unroll, as MetaSchedule's
    postprocessor writes it: the unroll pragmas on the outermost loop."""
    from tensortune.compat import tvm
    from tensortune.workloads.ops import parse_spec

    sch = tvm.s_tir.Schedule(parse_spec("matmul:64,64,64").to_module())
    i, j, k = sch.get_loops(sch.get_sblock("C"))
    i0, i1 = sch.split(i, [None, 4])
    j0, j1 = sch.split(j, [None, 16])
    sch.reorder(i0, j0, k, i1, j1)
    sch.vectorize(j1)
    sch.annotate(i0, "pragma_auto_unroll_max_step", max_step)
    sch.annotate(i0, "pragma_unroll_explicit", 1)
    return sch.mod


@pytest.mark.parametrize("max_step", [0, 16, 511, 512])
def test_tvms_unrolling_replayed_in_the_walk_decides_as_tvm_does(max_step):
    from tensortune.compat import lower_for_codegen
    from tensortune.features.lowered import summarize_lowered

    mod = tiled_with_pragma(max_step)
    replayed = named(summarize_lowered(lower_for_codegen(mod, AVX512, unroll=False), AVX512))
    unrolled = named(summarize_lowered(lower_for_codegen(mod, AVX512), AVX512))
    # Each of k's 64 iterations holds 8 statements (the 4-row tile's updates and, under
    # k == 0, their initializations): 512 steps unroll k into j's loop, which becomes the hot
    # loop; fewer leave k the hot loop, the tile unrolled into it.
    unrolls_k = max_step >= 512
    assert replayed["hot_depth"] == unrolled["hot_depth"] == (2 if unrolls_k else 3)
    assert replayed["hot_fma_lanes"] == unrolled["hot_fma_lanes"] == 64 * (64 if unrolls_k else 1)
    if not unrolls_k:
        assert replayed == unrolled
    else:  # the 4 accumulator rows, stored once per j: TVM's copies read as 24 elements
        assert replayed["hot_stores"] == 4 < unrolled["hot_stores"]


@pytest.mark.parametrize("spec", ["softmax:8,256", "conv2d_nchw:1,16,14,14,16,3,1,1"])
def test_other_workloads_give_finite_rows(spec):
    from tensortune.workloads.ops import parse_spec

    f = named(lowered_features(parse_spec(spec).to_module(), AVX512))
    assert f["program_log_work"] > 0 and 0 < f["hot_work_share"] <= 1


def long_chain(stages: int):
    """``stages`` elementwise steps, one block each: TVM takes seconds to lower 2,000 (its
    unrolled copies, which once took it minutes, are no longer asked for)."""
    from tensortune.compat import tvm

    te = tvm.te

    def step(x, i: int):  # te.compute refuses a lambda with defaults
        return te.compute((64,), lambda j: x[j] * 1.5 + 1.0, name=f"B{i}")

    x = a = te.placeholder((64,), name="A")
    for i in range(stages):
        x = step(x, i)
    return tvm.IRModule({"main": te.create_prim_func([a, x])})


def test_a_batch_lowers_in_workers_and_a_program_past_the_time_limit_costs_only_its_row():
    from tensortune.features.lowered import lowered_features_batch
    from tensortune.measure.pool import WorkerPool

    jobs = [(matmul(4), AVX512), (None, AVX512), (matmul(None), AVX2)]
    with WorkerPool(1) as pool:
        tiled, unreplayed, naive = lowered_features_batch(jobs, pool)
        np.testing.assert_array_equal(tiled, lowered_features(matmul(4), AVX512))
        np.testing.assert_array_equal(naive, lowered_features(matmul(None), AVX2))
        assert np.isnan(unreplayed).all()
        (slow,) = lowered_features_batch([(long_chain(2000), AVX2)], pool, timeout_s=0.5)
        assert np.isnan(slow).all()
        (again,) = lowered_features_batch([jobs[0]], pool)
        np.testing.assert_array_equal(again, tiled)  # the pool went on with a fresh worker


def test_a_checkpoint_a_full_disk_stops_leaves_the_last_one_and_no_partial_file(
        tmp_path, monkeypatch):  # fmt: skip
    import errno

    import tensortune.datasets.lowered as lowered
    import tensortune.files as files

    path = tmp_path / lowered.LOWERED_FILE
    row = np.arange(lowered.LOWERED_WIDTH, dtype=np.float32)
    lowered._write(path, {1: row}, table=None, complete=False)

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "replace", full)  # the file is written through files.py
    with pytest.raises(OSError, match="No space left"):
        lowered._write(path, {1: row, 2: row + 1}, table=None, complete=True)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    rows, complete = lowered._read(path)
    assert list(rows) == [1] and not complete
