"""compile_model: records applied through MetaScheduleApplyDatabase, unmeasured programs for
tasks without one, outputs equal to the untuned build, latencies of all three builds reported."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tensortune.compat import structural_equal, tvm  # noqa: E402
from tensortune.deploy.compile import compile_model  # noqa: E402
from tensortune.errors import TensortuneError  # noqa: E402
from tensortune.measure.executable import timing_repeats  # noqa: E402
from tensortune.records import open_records  # noqa: E402
from tensortune.tuning.tune import tune  # noqa: E402
from tensortune.workloads.models import load_model  # noqa: E402

TARGET = {"kind": "llvm", "num-cores": 2}


class TinyMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc2(torch.relu(self.fc1(x))), dim=-1)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return load_model(TinyMLP().eval(), example_inputs=(torch.randn(4, 32),),
                      target=tvm.target.Target(TARGET))  # fmt: skip


def test_tuned_records_are_applied_and_outputs_match(model, tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    n = len(model.tasks)
    result = tune(model=model, trials=2 * n, records=url, work_dir=tmp_path / "w",
                  trials_per_round=2, strategy="replay-trace", cost_model="random",
                  target=TARGET)  # fmt: skip
    tuned_names = {t.name for t in result.tasks if t.best_seconds is not None}
    assert tuned_names, "no task got a successful record"

    report = compile_model(model, records=url, target=TARGET, repeat=3, rounds=2)
    assert {s.name for s in report.tasks if s.tuned} == tuned_names
    assert len(report.tuned_rounds) == len(report.torch_rounds) == 2
    assert min(report.tuned_rounds) <= report.tuned_seconds <= max(report.tuned_rounds)
    assert report.max_abs_error < 1e-4
    assert report.tuned_seconds > 0 and report.untuned_seconds > 0
    assert report.torch_seconds is not None and report.torch_seconds > 0
    # TVM's own default on x86 is half the CPUs: the builds must run with the target's cores.
    assert report.threads == TARGET["num-cores"]


def test_a_store_without_records_builds_and_matches_the_untuned_build(model, tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    open_records(url).close()
    report = compile_model(model, records=url, target=TARGET, repeat=2)
    assert not any(s.tuned for s in report.tasks)
    assert report.max_abs_error == 0.0 or report.max_abs_error < 1e-5


def test_builds_are_timed_in_an_idle_worker_that_is_not_kept(model, tmp_path, monkeypatch):
    from tensortune.measure import pool as pools

    env = {"TVM_NUM_THREADS": str(TARGET["num-cores"])}
    pools.close_idle_workers()  # other tests' (a tune's builders may be of compile's kind)
    with pools.WorkerPool(1, env, reuse=True) as pool:  # the one idle worker of its kind
        pool.map("ping", [()], timeout_s=60)
        (idle,) = pool._workers
    started: list[int] = []
    fresh = pools._Worker
    monkeypatch.setattr(pools, "_Worker", lambda *a: started.append(1) or fresh(*a))
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    open_records(url).close()
    compile_model(model, records=url, target=TARGET, repeat=1)
    assert not started  # no TVM import of a worker of its own: the idle one timed the builds
    idle.process.wait(timeout=30)  # and ended with the timing, not kept with the model's memory


def test_kernels_without_a_record_get_an_unmeasured_program_not_their_bare_loops(tmp_path):
    from tensortune.deploy.compile import apply_tuned, build_tuned
    from tensortune.hardware import resolve_platform
    from tensortune.records.ms_database import StoreDatabase

    platform = resolve_platform(TARGET)
    # Products large enough to pay for threads and vectors: on TinyMLP's 4x32x64 the bare
    # loops may rightly win.
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
    model = load_model(mlp.eval(), example_inputs=(torch.randn(64, 256),),
                       target=platform.tvm_target)  # fmt: skip
    with open_records(f"sqlite:///{tmp_path / 'empty.db'}") as store:
        db = StoreDatabase(store, target=platform)
        applied = apply_tuned(db, model.mod, platform)
        built = build_tuned(db, model.mod, platform)
        again = apply_tuned(db, model.mod, platform)
    assert structural_equal(applied, again)  # the same picks, build after build
    kernels = {gv.name_hint: f for gv, f in applied.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc)}  # fmt: skip
    products = [name for name in kernels if "matmul" in name]
    assert len(products) == 2, list(kernels)
    for name in products:  # no record, yet scheduled: split, vectorized or parallel loops
        assert kernels[name].attrs.get("tirx.is_scheduled", False), name
        text = kernels[name].script()
        assert "T.vectorized" in text or "T.parallel" in text, text
    x = [tvm.runtime.tensor(a) for a in model.inputs]
    got = tvm.relax.VirtualMachine(built, tvm.cpu())["main"](*x).numpy()
    untuned = tvm.compile(model.mod, target=platform.tvm_target)
    want = tvm.relax.VirtualMachine(untuned, tvm.cpu())["main"](*x).numpy()
    assert abs(got - want).max() < 1e-5


def test_records_of_another_target_are_not_applied(model, tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    tune(model=model, trials=len(model.tasks), records=url, work_dir=tmp_path / "w",
         trials_per_round=1, strategy="replay-trace", cost_model="random",
         target={"kind": "llvm", "num-cores": 1})  # fmt: skip
    report = compile_model(model, records=url, target=TARGET, repeat=2)
    assert not any(s.tuned for s in report.tasks)


def test_slow_builds_are_timed_fewer_times_within_the_budget() -> None:
    # An untuned BERT-base call takes over a minute: ten timings would take a quarter hour.
    assert timing_repeats(85.0, 10) == 1
    assert timing_repeats(4.0, 10, budget_s=30.0) == 7
    assert timing_repeats(0.002, 10) == 10


def test_a_slow_model_is_timed_without_another_warm_up_call() -> None:
    """A call of 50 ms or more is a timing of its own, and the first call was the warm-up:
    TVM's time evaluator would call it once more before timing (a minute, for an untuned
    BERT-base)."""
    import time

    from tensortune.measure.executable import time_vm

    calls = []

    class Out:
        def numpy(self) -> np.ndarray:
            return np.zeros(1)

    def main(*args) -> Out:
        calls.append(args)
        time.sleep(0.06)
        return Out()

    class SlowVM:
        def __getitem__(self, name: str):
            assert name == "main"
            return main

        def time_evaluator(self, *args, **kwargs):
            raise AssertionError("timed again through TVM's time evaluator")

    outputs, seconds = time_vm(SlowVM(), [], repeat=3)
    assert len(calls) == 1 + 3 and len(outputs) == 1
    assert 0.06 <= seconds < 1.0


def test_rounds_and_repeats_must_be_positive():
    with pytest.raises(TensortuneError, match="at least 1"):
        compile_model("resnet18", rounds=0)


def _add_a_liar(store, wid: int) -> tuple:
    """Store the slowest program of a workload again with an impossible 1 ns, making it the
    store's "best"; returns (slowest, fastest) as they were stored before."""
    import dataclasses

    from tensortune.hardware import current_hardware, target_key

    hw = store.register_hardware(current_hardware())
    ranked = list(store.query(workload_id=wid, hardware_id=hw, target=target_key(TARGET),
                              ok_only=True, best_first=True))  # fmt: skip
    fastest, slowest = ranked[0], ranked[-1]
    store.add([dataclasses.replace(slowest, run_secs=(1e-9,), id=None, uid="")])  # a new record
    return slowest, fastest


def test_retime_builds_with_the_program_that_is_fastest_now_not_the_stored_best(tmp_path):
    from conftest import platform

    from tensortune.deploy.retime import retime_best
    from tensortune.records.ms_database import StoreDatabase
    from tensortune.workloads.sources import task_from_spec

    url = f"sqlite:///{tmp_path / 'r.db'}"
    task = task_from_spec("matmul:128,128,128")  # random schedules of it differ up to 8x here
    tune([task.source], trials=12, records=url, work_dir=tmp_path / "w", trials_per_round=12,
         strategy="replay-trace", cost_model="random", target=TARGET)  # fmt: skip
    store = open_records(url)
    wid = store.workload_id(task.mod, create=False)
    slowest, fastest = _add_a_liar(store, wid)
    assert slowest.cost > 3 * fastest.cost, "the sampled schedules are too alike to tell apart"

    # The two best stored: the liar (really the slowest program) and the really fastest.
    again = retime_best(store, [task], platform(TARGET), top_k=2)[wid]
    assert again.candidates == 2
    assert again.rank == 1 and again.chosen.trace == fastest.trace
    assert again.best_stored_seconds is not None and again.best_stored_seconds > 1e-7
    assert again.best_stored_seconds > 2 * again.seconds  # the liar, re-timed, is found slow

    tvm_target = tvm.target.Target(TARGET)

    def served(db: StoreDatabase) -> list[float]:
        return [float(s) for s in db.query_tuning_record(task.mod, tvm_target, task.name).run_secs]

    assert served(StoreDatabase(store, target=TARGET)) == [1e-9]
    pinned = StoreDatabase(store, target=TARGET, pinned={wid: again.chosen})
    assert served(pinned) == pytest.approx(list(fastest.run_secs))
    store.close()


def test_retime_passes_over_a_stored_best_that_no_longer_replays(tmp_path):
    import dataclasses

    from conftest import fill, platform

    from tensortune.deploy.retime import retime_best
    from tensortune.workloads.sources import task_from_spec

    task = task_from_spec("matmul:16,16,16")
    with open_records(f"sqlite:///{tmp_path / 'r.db'}") as store:
        mm = fill(store, "matmul:16,16,16", [2e-3, 1e-3])
        (sm,) = fill(store, "softmax:4,8", [1e-9])
        # a softmax trace under the matmul, the fastest stored: it fetches blocks the matmul
        # does not have (a record of another TVM version or a twin's fails the same way)
        store.add([dataclasses.replace(sm, workload_id=mm[0].workload_id, id=None, uid="")])
        again = retime_best(store, [task], platform(TARGET), top_k=3)[mm[0].workload_id]
    assert again.candidates == 2 and again.chosen.trace in {r.trace for r in mm}


def test_a_retiming_that_reads_no_time_is_not_the_fastest(tmp_path):
    from conftest import fill, platform

    from tensortune.compat import ms
    from tensortune.deploy.retime import retime_best
    from tensortune.workloads.sources import task_from_spec

    class Reads:  # a runner whose timer reads these seconds, one list per candidate in turn
        def __init__(self, *secs: list[float]) -> None:
            self.secs = secs

        def run(self, inputs: list) -> list:
            assert len(inputs) == len(self.secs)
            return [Done(ms.runner.RunnerResult(s, None)) for s in self.secs]

    class Done:
        def __init__(self, result: object) -> None:
            self.result = lambda: result

    task = task_from_spec("matmul:16,16,16")
    with open_records(f"sqlite:///{tmp_path / 'r.db'}") as store:
        best, other = fill(store, "matmul:16,16,16", [1e-3, 2e-3])
        for reads, want in (([0.0, 0.0], 5e-4), ([float("nan")], 5e-4), ([-1e-6], 5e-4),
                            ([3e-4], 3e-4)):  # fmt: skip
            again = retime_best(store, [task], platform(TARGET), top_k=2,
                                runner=Reads(reads, [5e-4]))[best.workload_id]  # fmt: skip
            assert again.seconds == want, reads
            assert again.chosen.trace == (best if want == 3e-4 else other).trace
            assert again.best_stored_seconds == (3e-4 if want == 3e-4 else None)


def test_compile_with_retime_reports_the_stored_best_and_the_retimed_one(model, tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    n = len(model.tasks)
    tune(model=model, trials=3 * n, records=url, work_dir=tmp_path / "w", trials_per_round=3,
         strategy="replay-trace", cost_model="random", target=TARGET)  # fmt: skip
    task = model.tasks[0]
    with open_records(url) as store:
        _add_a_liar(store, store.workload_id(task.mod, create=False))

    report = compile_model(model, records=url, target=TARGET, repeat=2, rounds=1, retime=3)
    status = next(s for s in report.tasks if s.name == task.name)
    assert status.best_seconds == pytest.approx(1e-9)  # the stored best is still reported
    assert status.retimed_seconds is not None and status.retimed_seconds > 1e-7
    assert status.retime_rank is not None and 0 <= status.retime_rank < 3
    assert report.max_abs_error < 1e-4


class TinyConv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


def _rewrites_weights_at_run_time(mod) -> bool:
    return any("layout_rewrite_preproc" in f.script() for _, f in mod.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc))  # fmt: skip


def test_weights_are_laid_out_for_the_tuned_kernels_once_at_compile_time(tmp_path):
    from tensortune.deploy.compile import apply_tuned
    from tensortune.hardware import resolve_platform
    from tensortune.records.ms_database import StoreDatabase
    from tensortune.workloads.models import fuse

    platform = resolve_platform(TARGET)
    torch.manual_seed(0)
    model = load_model(TinyConv().eval(), example_inputs=(torch.randn(1, 8, 12, 12),),
                       target=platform.tvm_target)  # fmt: skip
    conv = [t for t in model.tasks if "conv2d" in t.name]
    assert conv and all("layout_free_buffers" in t.mod["main"].attrs for t in conv)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    tune(model=model, trials=4 * len(model.tasks), records=url, work_dir=tmp_path / "w",
         trials_per_round=4, strategy="replay-trace", cost_model="random",
         target=TARGET)  # fmt: skip
    with open_records(url, create=False) as store:
        db = StoreDatabase(store, target=platform)
        with platform.tvm_target, db:
            applied_as_tuned = tvm.relax.transform.MetaScheduleApplyDatabase()(
                fuse(model.mod, platform.tvm_target)
            )
        applied = apply_tuned(db, model.mod, platform)
    # The tuned conv reads its weight in another layout; the build must not redo that per call.
    assert _rewrites_weights_at_run_time(applied_as_tuned)
    assert not _rewrites_weights_at_run_time(applied)
    report = compile_model(model, records=url, target=TARGET, repeat=2, rounds=1)
    assert report.max_abs_error < 1e-4


def test_a_tuned_build_whose_outputs_are_wrong_is_not_shipped(model, tmp_path, monkeypatch):
    """``compile --out`` checks the build it ships against TVM's untuned build of the model:
    a wrong program in the store (imported, or measured without a check) stops it."""
    from tensortune.deploy import compile as deploy

    torch.manual_seed(7)  # the same network with other weights: wrong outputs, right shapes
    other = load_model(TinyMLP().eval(), example_inputs=(torch.randn(4, 32),),
                       target=tvm.target.Target(TARGET))  # fmt: skip
    monkeypatch.setattr(deploy, "build_tuned", lambda db, mod, platform: tvm.compile(
        other.mod, target=platform.tvm_target))  # fmt: skip
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    open_records(url).close()
    with pytest.raises(TensortuneError, match="no artifact written"):
        compile_model(model, records=url, target=TARGET, repeat=1, rounds=1,
                      out=tmp_path / "m.tt")  # fmt: skip
    assert not (tmp_path / "m.tt").exists()


def test_a_missing_store_is_said_before_the_model_is_imported(tmp_path, monkeypatch):
    import tensortune.workloads.models as models

    def no_import(*args, **kwargs):
        raise AssertionError("the model was imported before the store was opened")

    monkeypatch.setattr(models, "load_model", no_import)
    with pytest.raises(TensortuneError, match="no records store"):
        compile_model("resnet18", records=f"sqlite:///{tmp_path / 'typo.db'}", target=TARGET)
    assert not (tmp_path / "typo.db").exists()


def test_what_strays_is_judged_on_floating_outputs_with_equal_infinities_agreeing():
    import numpy as np

    from tensortune.deploy.compile import OUTPUT_FLOOR, _stray

    logp = np.array([-np.inf, -0.5, 20.0], np.float32)
    assert _stray([logp], [logp.copy()]) == (0.0, 1e-3 * 20.0 + OUTPUT_FLOOR)
    flipped = np.array([3], np.int64)  # an argmax flipped on a near tie is not judged
    assert _stray([logp, flipped], [logp, np.array([0], np.int64)])[0] == 0.0
    assert _stray([np.array([np.nan, 1.0])], [np.array([0.0, 1.0])])[0] == np.inf
    assert _stray([np.array([np.inf])], [np.array([-np.inf])])[0] == np.inf
    assert _stray([np.array([1.5, 2.0])], [np.array([1.0, 2.0])]) == (0.5, 2e-3 + OUTPUT_FLOOR)
    import ml_dtypes  # NumPy calls bfloat16 kind "V": such outputs went unjudged

    far = [np.array([1e6], ml_dtypes.bfloat16)], [np.array([0.0], ml_dtypes.bfloat16)]
    assert _stray(*far)[0] > 1e5
    # bfloat16 holds values near 0.5 in steps of 3.9e-3, float16 in steps of 4.9e-4: a step
    # off is rounding, not a wrong program (1e-3 of 0.5 refused bfloat16's)
    for dtype, step in ((ml_dtypes.bfloat16, 2**-8), (np.float16, 2**-11)):
        half, off = np.array([0.5], dtype), np.array([0.5 + step], dtype)
        stray, allowed = _stray([off], [half])
        assert stray == step and stray <= allowed, dtype
        assert _stray([np.array([0.25], dtype)], [half])[0] > allowed
    # each output against its own size: logits near 5,000 do not excuse wrong probabilities
    logits, probs = np.array([4999.0, 5000.0]), np.array([0.25, 0.75])
    stray, allowed = _stray([logits, probs[::-1]], [logits, probs])
    assert (stray, allowed) == (0.5, 1e-3 * 0.75 + OUTPUT_FLOOR) and stray > allowed
    # small values too: every probability of a 50,257-way softmax wrong (uniform, 3.4e-4 off
    # at most) passed a floor of 1e-3
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.full(50_257, 0.5)).astype(np.float32)
    stray, allowed = _stray([np.full_like(probs, 1 / probs.size)], [probs])
    assert stray > allowed
    # Sums of large terms that cancel into a small output, taken in another order, stray by
    # the large terms' float32 steps (6.1e-5 at 1,000), as each candidate's check allows;
    # a dead ReLU's zeros stay zeros.
    x = (1000 + rng.uniform(-1e-3, 1e-3, 4096)).astype(np.float32)
    mean = x.mean(dtype=np.float32)
    other = np.nextafter(mean, np.float32(np.inf))  # the mean summed in another order
    stray, allowed = _stray([x - other, np.zeros(4)], [x - mean, np.zeros(4)])
    assert stray == float(other - mean) and stray <= allowed


def test_the_report_s_error_takes_masks_empty_outputs_and_infinities():
    # a - b raised on a model's boolean mask and on an empty output, and gave NaN for -inf
    # log-probabilities in both builds
    from types import SimpleNamespace

    import numpy as np

    from tensortune.deploy.compile import _report

    outs = [np.array([True, False]), np.zeros((0, 3), np.float32),
            np.array([-np.inf, 0.25], np.float32)]  # fmt: skip
    platform = SimpleNamespace(threads=1, target={"kind": "llvm"})
    report = _report(SimpleNamespace(name="m"), SimpleNamespace(url="sqlite:///r.db"), platform,
                     [], [(outs, 2e-3, 1), ([o.copy() for o in outs], 1e-3, 1)], [])  # fmt: skip
    assert report.max_abs_error == 0.0 and report.speedup_over_untuned == 2.0


def test_bench_e2es_error_is_not_lost_to_a_nan_and_its_files_are_strict_json():
    """``bench e2e`` took a bare max over outputs: NaN where an output held one, or dropped
    by Python's ``max`` when a later output held it; its files held NaN and Infinity, which
    jq and JavaScript refuse."""
    import json
    import math

    from tensortune.deploy.compile import output_difference
    from tensortune.files import strict_json

    good = np.array([1.0, -np.inf, 2.0])
    broken = np.array([1.0, -np.inf, np.nan])
    assert output_difference(good, good.copy()) == 0.0  # equal infinities agree
    assert output_difference(broken, good) == math.inf  # a NaN on one side: without bound
    assert output_difference(np.array([np.inf]), np.array([1.0])) == math.inf
    errors = [output_difference(np.array([0.5]), np.array([0.4])), math.inf]
    assert max(errors) == max(errors[::-1]) == math.inf  # whatever the order of outputs
    text = strict_json({"max_abs_error": math.inf, "pca": math.nan, "curve": [(1.0, -math.inf)]})
    assert json.loads(text) == {"max_abs_error": None, "pca": None, "curve": [[1.0, None]]}
