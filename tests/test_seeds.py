"""Register-blocked seeds (``search/seeds.py``): tilings by rule, and where the search uses them."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from conftest import platform

from tensortune.compat import ms, structural_hash, tvm
from tensortune.search.seeds import (
    TILE_ROWS,
    accumulator_bits,
    register_tiles,
    seed_candidates,
    vector_registers,
    vector_width,
)
from tensortune.search.space import tune_context
from tensortune.workloads.ops import parse_spec


def test_a_matrix_product_gets_rows_times_vectors_that_fit_the_registers():
    # GPT-2's 128x3072 -> 768 product on AVX-512 (16 lanes, 32 registers), two vectors wide:
    # 8 rows x 2 vectors of accumulators, 8 such blocks a tile, a 64-long reduction pass.
    assert register_tiles([128, 768, 3072], [True, True, False], 16, 32, 2, 64) == [
        [2, 1, 8, 8], [24, 1, 1, 32], [48, 64]]  # fmt: skip
    # ResNet-50's last 1x1 convolutions (NHWC: n, h, w, co; rh, rw, ci): 7 pixels of a row,
    # then the 7 rows of the image in one tile; the kernel window stays outside.
    spatial = [True] * 4 + [False] * 3
    conv = [[1, 1, 1, 1], [1, 1, 7, 1], [1, 1, 1, 7], [64, 1, 1, 32], [1, 1], [1, 1], [8, 64]]
    assert register_tiles([1, 7, 7, 2048, 1, 1, 512], spatial, 16, 32, 2, 64) == conv
    # AVX2 has half the registers: two vectors leave room for 6 rows, of which 128 takes 4.
    assert register_tiles([128, 768, 3072], [True, True, False], 8, 16, 2, 64)[0][3] == 4


def test_an_output_whole_vectors_do_not_divide_gets_one_narrower_power_of_two_vector():
    # ResNet's classifier, 1000 classes on AVX-512: half a vector of 8 lanes, not 20 or 24
    # (LLVM splits vectors of other widths badly)
    assert register_tiles([49, 1000, 2048], [True, True, False], 16, 32, 1, 64)[1] == [
        125, 1, 1, 8]  # fmt: skip
    assert [vector_width(1000, 16, nv, 64) for nv in (1, 2, 4)] == [8, None, None]
    assert vector_width(24, 16, 1, 64) == 8 and vector_width(20, 16, 1, 64) == 4
    assert vector_width(768, 16, 2, 64) == 32  # whole vectors where they divide
    assert vector_width(6, 4, 1, 64) is None  # no vector narrower than 4 lanes


def test_no_tiling_where_the_output_does_not_split_into_vectors():
    assert register_tiles([197, 197, 64], [True, True, False], 16, 32, 1, 64) is None  # prime
    assert register_tiles([64, 128, 64], [True, True, False], 16, 32, 8, 64) is None  # > 64
    assert register_tiles([64, 64], [False, False], 16, 32, 1, 64) is None  # no spatial loop


def test_every_tiling_is_perfect_and_fits_the_registers_and_the_space():
    rng = random.Random(0)
    made = 0
    for _ in range(400):
        n_s, n_r = rng.randint(1, 4), rng.randint(0, 3)
        extents = [rng.choice([1, 3, 7, 12, 14, 28, 49, 56, 64, 96, 128, 196, 768])
                   for _ in range(n_s + n_r)]  # fmt: skip
        spatial = [True] * n_s + [False] * n_r
        lanes, registers = rng.choice([(4, 16), (8, 16), (16, 32), (4, 32)])
        nv = rng.choice([1, 2, 4])
        tiles = register_tiles(extents, spatial, lanes, registers, nv, 64)
        whole = extents[n_s - 1] % (lanes * nv) == 0 and lanes * nv <= 64
        part = nv == 1 and any(extents[n_s - 1] % w == 0 for w in range(4, lanes, 4))
        if not (whole or part):
            assert tiles is None
            continue
        made += 1
        assert [math.prod(t) for t in tiles] == extents
        assert [len(t) for t in tiles] == [4 if s else 2 for s in spatial]
        assert all(t[-1] <= 64 for t in tiles)
        width = tiles[n_s - 1][-1]
        # whole vectors where they divide, else one vector of a power-of-two width
        assert width == lanes * nv if whole else (width < lanes and width & (width - 1) == 0)
        rows = math.prod(t[3] for t in tiles[: n_s - 1])
        assert rows * nv + nv + 1 <= registers
        assert math.prod(t[2] * t[3] for t in tiles[: n_s - 1]) <= max(TILE_ROWS, rows)
    assert made > 100


def _seeds(spec: str, target: dict):
    mod = parse_spec(spec).to_module()
    context = tune_context(mod, platform(target))
    spaces = context.space_generator.generate_design_space(context.mod)
    postprocs = list(context.space_generator.postprocs)
    return context, spaces, seed_candidates(context.mod, spaces, postprocs, platform(target))


def test_seeds_are_the_spaces_sketches_with_those_tiles_and_compute_the_product(target):
    _, spaces, seeds = _seeds("matmul:64,64,64", target)
    lanes, registers = platform(target).simd_bits // 32, vector_registers(platform(target))
    # every sketch, each vector count that divides 64, two unroll steps
    assert len(seeds) == len(spaces) * 3 * 2
    wanted = {nv: register_tiles([64, 64, 64], [True, True, False], lanes, registers, nv, 64)
              for nv in (1, 2, 4)}  # fmt: skip
    for cand in seeds:
        trace = cand.sch.trace
        tiles = [[int(v) for v in trace.decisions[i]] for i in trace.insts
                 if i.kind.name == "SamplePerfectTile"]  # fmt: skip
        assert tiles in wanted.values()
    lib = tvm.compile(seeds[0].sch.mod, target=tvm.target.Target(target))
    dev = tvm.cpu()
    a, b = np.random.default_rng(0).random((2, 64, 64), dtype=np.float32)
    c = tvm.runtime.tensor(np.zeros((64, 64), np.float32), dev)
    lib(tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), c)
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-5)


@pytest.mark.parametrize(("inputs", "accumulates", "bits"),
                         [("float32", "float32", 32), ("float16", "float16", 32),
                          ("int8", "int32", 32), ("float64", "float64", 64)])  # fmt: skip
def test_a_vector_holds_as_many_lanes_as_the_accumulator_fits(inputs, accumulates, bits):
    # float16 gets float32's lanes: CPUs without native half arithmetic compute it in float32
    from tvm import te

    a = te.placeholder((32, 64), inputs, name="a")
    b = te.placeholder((64, 48), inputs, name="b")
    k = te.reduce_axis((0, 64), name="k")
    c = te.compute((32, 48), lambda i, j: te.sum((a[i, k] * b[k, j]).astype(accumulates),
                                                  axis=k), name="c")  # fmt: skip
    mod = tvm.IRModule({"main": te.create_prim_func([a, b, c])})
    assert accumulator_bits(mod) == bits
    # the seeds' output columns end in whole vectors of that many lanes
    lanes = platform().simd_bits // bits
    context = tune_context(mod, platform())
    spaces = context.space_generator.generate_design_space(context.mod)
    seeds = seed_candidates(context.mod, spaces, list(context.space_generator.postprocs),
                            platform())  # fmt: skip
    assert seeds
    for cand in seeds:
        trace = cand.sch.trace
        tiles = [[int(v) for v in trace.decisions[i]] for i in trace.insts
                 if i.kind.name == "SamplePerfectTile"]  # fmt: skip
        assert tiles[1][-1] in (lanes, 2 * lanes, 4 * lanes), tiles
    # an element-wise task has no accumulator: float32's lanes
    e = te.placeholder((32, 48), accumulates, name="e")
    d = te.compute((32, 48), lambda i, j: e[i, j] + e[i, j], name="d")
    assert accumulator_bits(tvm.IRModule({"main": te.create_prim_func([e, d])})) == 32


def test_a_seed_the_sketchs_other_draws_refuse_takes_other_draws_and_computes_the_same():
    torch = pytest.importorskip("torch")
    from tensortune.search.seeds import _seed_traces
    from tensortune.search.space import replayed
    from tensortune.workloads.models import load_model

    # ResNet's first 3x3 convolution, F(4x4, 3x3): the sketch splits the input transform's 196
    # tiles 4 x 49, which DisallowDynamicLoop refuses, so every seed needs other draws there.
    torch.manual_seed(0)
    x = torch.randn(1, 64, 56, 56)
    model = load_model(torch.nn.Conv2d(64, 64, 3, padding=1).eval(), example_inputs=(x,),
                       target=platform().tvm_target)  # fmt: skip
    (task,) = [t for t in model.tasks if "winograd" in t.name]
    context = tune_context(task.mod, platform())
    spaces = context.space_generator.generate_design_space(context.mod)
    postprocs = list(context.space_generator.postprocs)
    lanes, registers = platform().simd_bits // 32, vector_registers(platform())
    as_sketched = [replayed(context.mod, t, postprocs) for s in spaces
                   for t in _seed_traces(s.trace, lanes, registers)]  # fmt: skip
    assert as_sketched and not any(as_sketched)  # the case this test is about
    seeds = seed_candidates(context.mod, spaces, postprocs, platform())
    assert len(seeds) == len(as_sketched)
    # the program builds, runs and computes the convolution (checked against the unscheduled
    # task's output, as tuning checks candidates)
    from tensortune.measure.session import MeasureSession

    with MeasureSession(platform(), check_correctness=True) as session:
        session.add_references([task])
        built, ran = session.measure(seeds[:1])
    assert built[0].error_msg is None and ran[0].error_msg is None, ran[0].error_msg
    assert ran[0].run_secs


def test_element_wise_tasks_have_no_seeds(target):
    assert _seeds("softmax:64,128", target)[2] == []


def test_a_new_tasks_first_round_measures_seeds_and_a_resumed_one_does_not(target):
    from tensortune.search.draft_verify import DraftThenVerify

    context, spaces, seeds = _seeds("matmul:64,64,64", target)
    hashes = {structural_hash(c.sch.mod) for c in seeds}
    for resumed in (False, True):
        strategy = DraftThenVerify(population=32, draft_size=16, per_round=8, verify_mutants=0)
        strategy._initialize_with_tune_context(context)
        database = ms.database.MemoryDatabase()
        if resumed:
            workload = database.commit_workload(context.mod)
            database.commit_tuning_record(ms.database.TuningRecord(
                spaces[0].trace, workload, [1e-3], context.target,
                ms.arg_info.ArgInfo.from_prim_func(context.mod["main"])))  # fmt: skip
        strategy.pre_tuning(64, 8, spaces, database, None)
        picked = strategy.generate_measure_candidates()
        strategy.post_tuning()
        from_seeds = sum(structural_hash(c.sch.mod) in hashes for c in picked)
        assert len(picked) == 8
        # half the round at least (more where they rank high), none for a resumed task
        assert from_seeds == 0 if resumed else from_seeds >= 4, resumed


def test_a_task_whose_seeds_fail_is_tuned_without_them(target, monkeypatch):
    """Seeds are a head start: a workload they trip on gets a warning and the search goes on
    (it used to end the whole run, every other task with it)."""
    import tensortune.search.draft_verify as dv

    context, spaces, _ = _seeds("matmul:64,64,64", target)

    def trips(*args, **kwargs):
        raise tvm.error.InternalError("Check failed: a sketch the seeds cannot read")

    monkeypatch.setattr(dv, "seed_candidates", trips)
    strategy = dv.DraftThenVerify(population=32, draft_size=16, per_round=8, verify_mutants=0)
    strategy._initialize_with_tune_context(context)
    with pytest.warns(UserWarning, match="no register-blocked seeds .*cannot read.*without them"):
        strategy.pre_tuning(64, 8, spaces, ms.database.MemoryDatabase(), None)
    assert strategy.seeded == [] and strategy.analyzer_seed is None
    assert len(strategy.generate_measure_candidates()) == 8
    strategy.post_tuning()


def test_seeds_the_verifier_ranks_last_still_take_half_the_first_round(target):
    from tensortune.compat import PyCostModel, derived_object
    from tensortune.search.draft_verify import DraftThenVerify

    context, spaces, seeds = _seeds("matmul:64,64,64", target)
    hashes = {structural_hash(c.sch.mod) for c in seeds}

    @derived_object
    class SeedsLast(PyCostModel):
        def predict(self, context, candidates):
            return np.array([-1.0 if structural_hash(c.sch.mod) in hashes else 1.0 + i
                             for i, c in enumerate(candidates)])  # fmt: skip

        def update(self, context, candidates, results):
            pass

    strategy = DraftThenVerify(population=32, draft_size=16, per_round=8, verify_mutants=0,
                               eps=0.0)  # fmt: skip
    strategy._initialize_with_tune_context(context)
    strategy.pre_tuning(64, 8, spaces, ms.database.MemoryDatabase(), SeedsLast())
    first = strategy.generate_measure_candidates()
    second = strategy.generate_measure_candidates()
    strategy.post_tuning()
    assert [structural_hash(c.sch.mod) in hashes for c in first].count(True) == 4
    # from then on, the verifier's order alone: the seeds it ranks last wait
    assert not any(structural_hash(c.sch.mod) in hashes for c in second)


def test_the_seed_the_analyzer_ranks_first_is_measured_first_whatever_the_verifier_says(target):
    from tensortune.compat import PyCostModel, derived_object
    from tensortune.search.analyzer import Analyzer
    from tensortune.search.analyzer.machine import machine_for
    from tensortune.search.draft_verify import DraftThenVerify

    context, spaces, seeds = _seeds("matmul:64,64,64", target)
    scores = Analyzer(machine_for(platform(target))).scores([c.sch.mod for c in seeds])
    favourite = structural_hash(seeds[int(np.argmax(scores))].sch.mod)

    @derived_object
    class FavouriteLast(PyCostModel):  # the seeds above everything else, the favourite last
        def predict(self, context, candidates):
            return np.array([(-1.0 if h == favourite else 10.0 + i) if h in hashes else 1.0
                             for i, h in enumerate(structural_hash(c.sch.mod)
                                                   for c in candidates)])  # fmt: skip

        def update(self, context, candidates, results):
            pass

    hashes = {structural_hash(c.sch.mod) for c in seeds}
    strategy = DraftThenVerify(population=32, draft_size=16, per_round=8, verify_mutants=0,
                               eps=0.0)  # fmt: skip
    strategy._initialize_with_tune_context(context)
    strategy.pre_tuning(64, 8, spaces, ms.database.MemoryDatabase(), FavouriteLast())
    first = [structural_hash(c.sch.mod) for c in strategy.generate_measure_candidates()]
    strategy.post_tuning()
    assert favourite in first
    assert sum(h in hashes for h in first) == 8  # the verifier's other picks: seeds too


def test_seeds_can_be_turned_off_by_name():
    from tensortune.errors import TensortuneError
    from tensortune.search.draft_verify import check_options

    assert check_options({"seeds": "0"}) == {"seeds": 0} and check_options({"seeds": 1}) == {}
    with pytest.raises(TensortuneError, match="seeds") as e:
        check_options({"seeds": 2})
    assert e.value.param == "draft_options"
