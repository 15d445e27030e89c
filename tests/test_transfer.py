"""Transfer-tuning: kernel classes, trace replay on new shapes, and the transfer/warm-start flows,
on real schedules built and timed with the project's measurement."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensortune.compat import tvm
from tensortune.hardware import resolve_platform
from tensortune.records import open_records
from tensortune.records.convert import trace_text
from tensortune.records.schema import origin_kind, origin_of
from tensortune.search.space import sample_candidates, tune_context
from tensortune.transfer.apply import EXACT, INVALID, REFIT, refit_tiles, transfer_trace
from tensortune.transfer.classes import kernel_class
from tensortune.transfer.run import transfer
from tensortune.tuning.tune import tune
from tensortune.workloads.resolve import resolve_tasks

TARGET = {"kind": "llvm", "num-cores": 2}
FAST = {"strategy": "replay-trace", "cost_model": "random", "target": TARGET}


@pytest.fixture(scope="module")
def platform():
    return resolve_platform(TARGET)


def _task(spec: str, platform):
    (task,) = resolve_tasks([spec], platform=platform)
    return task


# -- classes -----------------------------------------------------------------------------------


def test_a_class_ignores_shapes_and_strides_but_not_operators_epilogues_or_layouts(platform):
    def key(spec: str) -> str:
        return kernel_class(_task(spec, platform).mod).key

    conv = key("conv2d_nchw_bias_relu:1,56,56,64,64,3")
    assert key("conv2d_nchw_bias_relu:1,28,28,128,256,3,2") == conv  # other shape and stride
    assert key("conv2d_nchw:1,56,56,64,64,3") != conv  # no fused epilogue
    assert key("conv2d_nhwc_bias_relu:1,56,56,64,64,3") != conv  # another layout
    assert key("depthwise_conv2d:1,56,56,64,3") != conv
    assert key("dense_bias_relu:128,768,768") == key("dense_bias_relu:1,10,4096")
    assert key("dense_bias_relu:128,768,768") != key("matmul:128,768,768")
    assert key("max_pool2d:1,56,56,64,3") != key("avg_pool2d:1,56,56,64,3")


def _matmul(name: str, n: int):
    from tvm import te

    a, b = te.placeholder((n, n), name="A"), te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name=name)
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def test_block_numbering_is_not_part_of_a_class_and_a_trace_follows_the_renamed_block(platform):
    source, target = _matmul("C1", 64), _matmul("C7", 96)
    assert kernel_class(source) == kernel_class(target)
    cand = sample_candidates(source, platform, 1, seed=3)[0]
    posts = list(tune_context(target, platform).space_generator.postprocs)
    moved = transfer_trace(source, trace_text(cand.sch.trace), target, posts)
    assert moved.outcome == REFIT, moved.error
    assert "C7" in moved.candidate.sch.mod.script()


# -- replay --------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    decision=st.lists(st.integers(1, 64), min_size=2, max_size=5),
    extent=st.integers(1, 5000),
    max_innermost=st.sampled_from([None, 16, 64]),
)
def test_refit_tiles_multiply_to_the_extent_and_respect_the_innermost_limit(
    decision, extent, max_innermost
):
    out = refit_tiles(decision, extent, max_innermost)
    assert len(out) == len(decision) and math.prod(out) == extent
    assert all(f >= 1 for f in out)
    if max_innermost is not None:
        assert out[-1] <= max_innermost
    if math.prod(decision) == extent:
        # an inner factor that still divides what is left is kept
        assert out[-1] == decision[-1] or (max_innermost and decision[-1] > max_innermost)


def test_refit_keeps_inner_tiles_and_lets_the_outermost_absorb_the_change():
    assert refit_tiles([1, 1, 4, 16], 128) == [2, 1, 4, 16]
    assert refit_tiles([4, 7, 2, 1], 28) == [2, 7, 2, 1]
    # TVM's own repair would make the innermost tile 1000; ours takes the divisor nearest 16
    assert refit_tiles([10, 4, 25, 16], 1000, 64) == [1, 2, 25, 20]


def test_transferred_convolutions_build_run_and_compute_the_right_output(platform):
    from tensortune.measure.session import MeasureSession

    source = _task("conv2d_nchw_bias_relu:1,56,56,64,64,3", platform)
    target = _task("conv2d_nchw_bias_relu:1,28,28,96,96,3", platform)
    cands = sample_candidates(source.mod, platform, 6, seed=1)
    posts = list(tune_context(target.mod, platform).space_generator.postprocs)
    moved = [transfer_trace(source.mod, trace_text(c.sch.trace), target.mod, posts)
             for c in cands]  # fmt: skip
    assert all(m.outcome == REFIT for m in moved), [m.error for m in moved]
    again = transfer_trace(source.mod, trace_text(cands[0].sch.trace), target.mod, posts)
    assert trace_text(again.candidate.sch.trace) == trace_text(moved[0].candidate.sch.trace)
    # postprocessing marked as the search marks it: a replay that removes it leaves no
    # parallel or vectorize steps fitted to the earlier program behind
    for m in moved:
        kinds = [inst.kind.name for inst in m.candidate.sch.trace.insts]
        assert "EnterPostproc" in kinds
        design = kinds[: kinds.index("EnterPostproc")]
        assert not {"Parallel", "Vectorize", "Unroll", "DecomposeReduction"} & set(design)
    with MeasureSession(platform, check_correctness=True) as session:
        session.add_references([target])
        built, ran = session.measure([m.candidate for m in moved])
    assert all(b.error_msg is None for b in built)
    assert all(r.error_msg is None and r.run_secs for r in ran), [r.error_msg for r in ran]


def _residual_conv(n: int, c: int, size: int):
    """conv2d (3×3, pad 1) + bias + residual add + relu: ResNet-18's basic-block tail."""
    from tvm import te, topi

    data = te.placeholder((n, c, size, size), name="data")
    weight = te.placeholder((c, c, 3, 3), name="weight")
    bias = te.placeholder((1, c, 1, 1), name="bias")
    skip = te.placeholder((n, c, size, size), name="skip")
    out = topi.nn.relu(topi.add(topi.add(topi.nn.conv2d_nchw(data, weight, 1, 1, 1), bias), skip))
    return tvm.IRModule({"main": te.create_prim_func([data, weight, bias, skip, out])})


def test_a_longer_epilogue_takes_a_shorter_ones_schedule_once_inlined(platform):
    from tensortune.measure.session import MeasureSession
    from tensortune.transfer.classes import epilogue_blocks
    from tensortune.workloads.task import Task

    source = _task("conv2d_nchw_bias_relu:1,28,28,32,32,3", platform)
    target_mod = _residual_conv(1, 16, 14)
    src_class, tgt_class = kernel_class(source.mod), kernel_class(target_mod)
    assert src_class.key != tgt_class.key and src_class.core == tgt_class.core
    assert (src_class.epilogue, tgt_class.epilogue) == (2, 3)
    assert kernel_class(_task("conv2d_nchw:1,28,28,32,32,3", platform).mod).epilogue == 0
    inline = epilogue_blocks(target_mod)[:1]
    cands = sample_candidates(source.mod, platform, 4, seed=2)
    posts = list(tune_context(target_mod, platform).space_generator.postprocs)
    moved = [transfer_trace(source.mod, trace_text(c.sch.trace), target_mod, posts,
                            inline=inline) for c in cands]  # fmt: skip
    assert all(m.candidate is not None for m in moved), [m.error for m in moved]
    # Without the inlining the blocks do not line up: nothing or a wrong fit, never a crash.
    plain = transfer_trace(source.mod, trace_text(cands[0].sch.trace), target_mod, posts)
    assert plain.error is None or "\n" not in plain.error
    target = Task("residual_conv", target_mod)
    with MeasureSession(platform, check_correctness=True) as session:
        session.add_references([target])
        built, ran = session.measure([m.candidate for m in moved])
    assert all(b.error_msg is None for b in built)
    assert all(r.error_msg is None and r.run_secs for r in ran), [r.error_msg for r in ran]


def test_a_trace_of_another_class_is_invalid_not_an_exception(platform):
    source = _task("dense_bias_relu:64,64,64", platform)
    target = _task("conv2d_nchw_bias_relu:1,14,14,8,8,3", platform)
    cand = sample_candidates(source.mod, platform, 1)[0]
    posts = list(tune_context(target.mod, platform).space_generator.postprocs)
    moved = transfer_trace(source.mod, trace_text(cand.sch.trace), target.mod, posts)
    assert moved.outcome == INVALID and moved.candidate is None
    assert moved.error and "\n" not in moved.error
    unchanged = transfer_trace(source.mod, trace_text(cand.sch.trace), source.mod, posts)
    assert unchanged.outcome == EXACT


# -- flows -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def source_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("source") / "src.db"
    url = f"sqlite:///{path}"
    tune(["dense_bias_relu:64,64,64"], trials=6, records=url,
         work_dir=path.parent / "w", **FAST)  # fmt: skip
    return url


def test_transfer_falls_back_to_the_unrecorded_pick_and_resumes(tmp_path, source_store, platform):
    out = f"sqlite:///{tmp_path / 'out.db'}"
    specs = ["dense_bias_relu:128,64,64", "matmul:32,32,32"]
    result = transfer(source_store, specs, records=out, target=TARGET, per_kernel=2,
                      work_dir=tmp_path / "w")  # fmt: skip
    dense, matmul = result.tasks
    assert dense.sources == 1 and dense.exact + dense.refit == 1 and dense.measured == 1
    assert dense.source == "dense_bias_relu:64,64,64" and dense.best_seconds is not None
    assert dense.untuned_seconds is not None and dense.fallback_seconds is not None
    assert dense.chosen_seconds == min(dense.untuned_seconds, dense.fallback_seconds,
                                       dense.best_seconds)  # fmt: skip
    assert matmul.sources == 0 and matmul.best_seconds is None  # no matmul in the source
    # Not the bare loops by default: what compile builds a kernel with no record from competes.
    assert matmul.fallback_seconds is not None
    assert matmul.chosen_seconds == min(matmul.untuned_seconds, matmul.fallback_seconds)
    with open_records(out) as store:
        kinds = sorted(origin_of(r).get("kind") for r in store.query())
        assert kinds == ["fallback", "fallback", "transfer", "untuned", "untuned"]
        (moved,) = [r for r in store.query() if origin_of(r).get("kind") == "transfer"]
        assert origin_of(moved)["from"] == source_store
        before = store.count()
    again = transfer(source_store, specs, records=out, target=TARGET, per_kernel=2,
                     work_dir=tmp_path / "w")  # fmt: skip
    with open_records(out) as store:
        assert store.count() == before  # nothing measured twice
    assert [t.chosen_seconds for t in again.tasks] == [t.chosen_seconds for t in result.tasks]
    # What compile builds each kernel from, and the origin its report shows.
    from tensortune.cli.compile import schedule_label
    from tensortune.deploy.compile import TaskStatus
    from tensortune.records.ms_database import StoreDatabase

    with open_records(out) as store:
        db = StoreDatabase(store, target=platform)
        for spec, kernel in zip(specs, result.tasks, strict=True):
            rec = db.chosen_record(_task(spec, platform).mod, platform.tvm_target)
            assert rec.cost == kernel.chosen_seconds
            kind = origin_kind(rec)
            assert (kind == "transfer") == kernel.took_transferred
            label = schedule_label(TaskStatus(spec, 1, True, rec.cost, origin=kind))
            expected = {"transfer": "transferred", "untuned": "untuned (timed)",
                        "fallback": "fallback (timed)"}  # fmt: skip
            assert label == expected[kind]  # none of them was tuned here
    assert schedule_label(TaskStatus("t", 1, True, 1.0)) == "tuned"  # a record of no origin
    for malformed in ('{"kind": null}', "not json", "[1]"):
        assert origin_kind(dataclasses.replace(rec, origin=malformed)) == ""
    assert schedule_label(TaskStatus("t", 1, False, None)) == "fallback (no record)"


def test_a_transfer_stops_after_the_kernel_in_flight_and_counts_tuned_records(
    tmp_path, source_store
):
    # Ctrl-C went unheeded until every kernel was timed; a record tune wrote to the same
    # store was left out of what compile builds with; a transfer's untuned records were
    # taken as sources by the next transfer from its store.
    from conftest import fill

    import tensortune.errors as errors

    out = f"sqlite:///{tmp_path / 'out.db'}"
    specs = ["dense_bias_relu:128,64,64", "matmul:32,32,32"]
    with open_records(out) as store:
        fill(store, "matmul:32,32,32", [1e-9])  # a tuner's record, faster than anything

    def stop(index: int, kernel: object) -> None:
        errors._interrupted.set()  # as the first Ctrl-C does

    try:
        with pytest.raises(KeyboardInterrupt):
            transfer(source_store, specs, records=out, target=TARGET, per_kernel=2,
                     work_dir=tmp_path / "w", progress=stop)  # fmt: skip
    finally:
        errors._interrupted.clear()
    with open_records(out) as store:
        assert store.count() == 1 + 3  # the dense's untuned, fallback and transferred ones
    result = transfer(source_store, specs, records=out, target=TARGET, per_kernel=2,
                      work_dir=tmp_path / "w")  # fmt: skip
    matmul = result.tasks[1]
    assert matmul.tuned_seconds == 1e-9 == matmul.chosen_seconds and matmul.taken_from == "tuned"


def test_a_model_is_loaded_for_transfer_as_tune_loads_it(tmp_path, source_store, monkeypatch):
    # without Winograd or with an ONNX model's input shapes, its tasks are others
    import tensortune.workloads.models as models

    seen = {}

    def load_model(source, **kwargs):
        seen.update(kwargs)
        raise KeyboardInterrupt  # enough: what it was asked for is known

    monkeypatch.setattr(models, "load_model", load_model)
    with pytest.raises(KeyboardInterrupt):
        transfer(source_store, model="net.onnx", records=f"sqlite:///{tmp_path / 'r.db'}",
                 target=TARGET, winograd=False, input_shapes={"x": [1, 8]})  # fmt: skip
    assert seen["winograd"] is False and seen["input_shapes"] == {"x": [1, 8]}


def test_an_untuned_record_is_no_source(tmp_path, platform):
    # A transfer's store holds one per kernel, often its fastest for a small kernel: its empty
    # trace took a source's place and timed the target's own bare loops as a transfer.
    from conftest import make_records

    from tensortune.errors import TensortuneError
    from tensortune.transfer.run import UNTUNED_ORIGIN
    from tensortune.transfer.sources import source_schedules

    with open_records(f"sqlite:///{tmp_path / 'r.db'}") as store:
        tuned, untuned, imported = make_records(store, "matmul:32,32,32", [2e-3, 1e-3, 5e-4])
        # One exported to a MetaSchedule database and imported back has lost its label.
        imported = dataclasses.replace(imported, trace=json.dumps([[], []]))
        store.add([tuned, dataclasses.replace(untuned, origin=UNTUNED_ORIGIN), imported])
        (found,) = [s for srcs in source_schedules([store], platform).values() for s in srcs]
    assert found.record.cost == 2e-3 and origin_kind(found.record) == ""
    # A store of untuned programs only is nothing to transfer from, and says why.
    with open_records(f"sqlite:///{tmp_path / 'untuned.db'}") as store:
        (only,) = make_records(store, "matmul:32,32,32", [1e-3])
        store.add([dataclasses.replace(only, origin=UNTUNED_ORIGIN)])
        with pytest.raises(TensortuneError, match="its records for it are of untuned programs"):
            source_schedules([store], platform)


def test_a_kernel_without_same_class_sources_takes_a_shorter_epilogues(tmp_path, source_store):
    from tvm import te, topi

    from tensortune.workloads.task import Task

    x, w = te.placeholder((32, 64), name="X"), te.placeholder((64, 64), name="W")
    bias, skip = te.placeholder((64,), name="bias"), te.placeholder((32, 64), name="skip")
    out = topi.nn.relu(topi.add(topi.add(topi.nn.dense(x, w), bias), skip))
    task = Task("dense_bias_add_relu", tvm.IRModule({"main": te.create_prim_func(
        [x, w, bias, skip, out])}))  # fmt: skip
    result = transfer(source_store, [task], records=f"sqlite:///{tmp_path / 'out.db'}",
                      target=TARGET, per_kernel=2, work_dir=tmp_path / "w")  # fmt: skip
    (kernel,) = result.tasks
    assert kernel.relaxed == 1 and kernel.sources == 1 and kernel.measured == 1, kernel
    assert kernel.best_seconds is not None and result.outcomes()["relaxed"] == 1
    with open_records(f"sqlite:///{tmp_path / 'out.db'}") as store:
        (moved,) = [r for r in store.query() if origin_of(r).get("kind") == "transfer"]
        assert origin_of(moved)["inlined"] == 1 and moved.ok


def test_a_budget_too_small_to_warm_start_every_task_starts_the_heaviest(tmp_path,
                                                                        source_store):  # fmt: skip
    # it started none, and said nothing
    out = f"sqlite:///{tmp_path / 'warm.db'}"
    with pytest.warns(UserWarning, match="for 1 of the 2 tasks"):
        result = tune(["dense_bias_relu:96,64,64", "dense_bias_relu:128,64,64"], trials=2,
                      records=out, work_dir=tmp_path / "w", warm_start=source_store,
                      **FAST)  # fmt: skip
    assert result.trials_warm_start == 1
    with open_records(out) as store:
        first = min(store.query(), key=lambda r: r.id)
        assert origin_of(first).get("kind") == "transfer"
        assert store.workload(first.workload_id).name == "dense_bias_relu:128,64,64"


def test_the_warm_start_comes_first_and_keeps_the_task_limit_and_the_deadline(
    tmp_path, source_store, monkeypatch
):
    from tensortune.transfer import run as transfer_run

    asked, deadlines = [], []
    real = transfer_run.transfer_tasks

    def spy(*args, per_kernel: int, **kwargs):
        asked.append(per_kernel)
        return real(*args, per_kernel=per_kernel, **kwargs)

    monkeypatch.setattr(transfer_run, "transfer_tasks", spy)
    for cap, most in ((None, 4), (1, 1)):  # 4: the default schedules a kernel
        result = tune(["dense_bias_relu:96,64,64"], trials=8, max_trials_per_task=cap,
                      records=f"sqlite:///{tmp_path / f'{cap}.db'}", work_dir=tmp_path / "w",
                      warm_start=source_store, **FAST)  # fmt: skip
        assert asked[-1] == most and result.tasks[0].trials == (cap or 8)
        if cap is None:  # the transferred schedules are timed first, within the budget
            with open_records(f"sqlite:///{tmp_path / 'None.db'}") as store:
                first = min(store.query(), key=lambda r: r.id)
                assert origin_of(first).get("kind") == "transfer" and store.count() == 8
    # And within the time budget: one spent before it starts times nothing.
    late = tune(["dense_bias_relu:96,64,64"], max_seconds=1e-6, records=f"sqlite:///{tmp_path}/t.db",
                work_dir=tmp_path / "w", warm_start=source_store, **FAST)  # fmt: skip
    assert late.out_of_time and late.tasks[0].trials == 0

    # The heaviest kernels first, whatever the room: under a deadline it ends the warm start
    # (they were taken in extraction order wherever the room held every task).
    class Started(Exception):
        pass

    def order(store, tasks, *args, **kwargs):
        asked.append([t.name for t in tasks])
        deadlines.append((kwargs["deadline"], time.monotonic()))
        raise Started

    monkeypatch.setattr(transfer_run, "transfer_tasks", order)
    light, heavy = "dense_bias_relu:16,64,64", "dense_bias_relu:96,64,64"
    with pytest.raises(Started):
        tune([light, heavy], trials=64, max_seconds=600, work_dir=tmp_path / "w",
             records=f"sqlite:///{tmp_path}/o.db", warm_start=source_store, **FAST)  # fmt: skip
    assert asked[-1] == [heavy, light]
    # Half the time at most: under --time alone the trials bound nothing (100,000 a task).
    deadline, called = deadlines[-1]
    assert 200 < deadline - called <= 300


# -- the benchmark's arithmetic ------------------------------------------------------------------


def test_latency_curve_is_the_weighted_best_so_far_of_each_task(tmp_path, source_store, platform):
    from pathlib import Path

    from tensortune.compare.transfer import _first_below, latency_curve

    path = Path(source_store.removeprefix("sqlite:///"))
    (task,) = resolve_tasks(["dense_bias_relu:64,64,64"], platform=platform)
    other = _task("matmul:16,16,16", platform)  # never measured: counted at its untuned time
    curve = latency_curve(path, [task, other], platform, {other.name: 0.5}, start=0.0)
    with open_records(source_store) as store:
        best = next(store.query(ok_only=True, best_first=True, limit=1)).cost
        assert len(curve) == store.count(ok_only=True)
    values = [v for _, v in curve]
    assert values == sorted(values, reverse=True)
    assert values[-1] == pytest.approx(best + 0.5)
    assert _first_below(curve, values[-1]) == curve[values.index(values[-1])][0]
    assert _first_below(curve, values[-1] / 2) is None


def test_fraction_of_maximum_speedup_is_the_papers_formula():
    from tensortune.compare.transfer import PairResult

    r = PairResult("t", "s", 1, 1, 1, 3.0, 2.0, 1.0, 1.5, 3.0, 10.0, 100.0, 100.0, 1.0, 1.0,
                   50.0, 40.0)  # fmt: skip
    assert r.fraction_of_max == pytest.approx(0.25)  # (1.5 - 1) / (3 - 1)
    assert r.search_time_ratio == pytest.approx(5.0)
    assert r.warm_time_share == pytest.approx(0.4)


@pytest.mark.parametrize(("name", "value"), [("per_kernel", 0), ("rounds", 0), ("rounds", 1.5)])
def test_settings_are_checked_before_anything_is_measured(tmp_path, name, value):
    """``rounds`` is compile_model's: checked there, it failed after every kernel's timings."""
    from tensortune.errors import TensortuneError

    out = tmp_path / "out.db"
    with pytest.raises(TensortuneError, match="whole number of at least 1"):
        transfer(f"sqlite:///{tmp_path / 'none.db'}", ["matmul:32,32,32"],
                 records=f"sqlite:///{out}", target=TARGET, **{name: value})  # fmt: skip
    assert not out.exists()


def test_a_kernel_nothing_timed_leaves_the_transfer_s_estimate_unknown_not_lower():
    # It counted 0 s: the estimate fell below anything full tuning could reach, and "full
    # tuning's time to match the transfer" read as never (the table's "> full's time").
    from tensortune.compare.transfer import transfer_estimate
    from tensortune.transfer.run import KernelTransfer

    timed = KernelTransfer("conv", 2, "c", untuned_seconds=3e-3, best_seconds=1e-3)
    other = KernelTransfer("dense", 1, "d", fallback_seconds=4e-3)
    assert transfer_estimate([timed, other]) == pytest.approx(2 * 1e-3 + 4e-3)
    nothing = KernelTransfer("softmax", 1, "s")  # its untuned program timed out
    assert transfer_estimate([timed, other, nothing]) is None
