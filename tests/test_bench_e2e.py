"""bench e2e's machinery on a tiny model: every system set up on the same inputs, outputs
checked against eager, timed in turns; a missing runtime is named, not fatal."""

from __future__ import annotations

import builtins
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_compile import TinyMLP  # noqa: E402
from test_winograd import Convs  # noqa: E402

from tensortune.compare import e2e  # noqa: E402
from tensortune.compare.e2e import SystemTiming  # noqa: E402
from tensortune.compare.own_process import OwnProcess  # noqa: E402
from tensortune.compat import tvm  # noqa: E402
from tensortune.errors import TensortuneError  # noqa: E402
from tensortune.hardware import resolve_platform  # noqa: E402
from tensortune.hardware.fingerprint import affinity_kept  # noqa: E402
from tensortune.tuning.tune import tune  # noqa: E402
from tensortune.workloads.models import load_model  # noqa: E402


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """(model, store, platform): the platform's threads are those TVM's pool runs here."""
    tmp = tmp_path_factory.mktemp("e2e")
    with affinity_kept():  # starting TVM's pool here would pin this thread to one core
        threads = int(tvm.get_global_func("runtime.NumThreads")())
    platform = resolve_platform({"kind": "llvm", "num-cores": threads})
    torch.manual_seed(0)
    model = load_model(TinyMLP().eval(), example_inputs=(torch.randn(4, 32),), name="tiny",
                       target=platform.tvm_target)  # fmt: skip
    tune(model=model, trials=2 * len(model.tasks), records=f"sqlite:///{tmp / 'tiny.db'}",
         work_dir=tmp / "w", trials_per_round=2, strategy="replay-trace", cost_model="random",
         target=platform)  # fmt: skip
    return model, tmp / "tiny.db", platform, tmp


def test_every_system_runs_the_same_model_and_is_timed_in_turns(tuned):
    model, store, platform, work = tuned
    systems = e2e._set_up(model, store, platform, ("pytorch", "onnxruntime", "openvino"), work,
                          lambda text: None)  # fmt: skip
    assert list(systems) == [e2e.TUNED, *e2e.ROUTES, "pytorch", "onnxruntime", "openvino"]
    for name, (run, timing) in systems.items():
        assert run is not None and not timing.missing and not timing.note, name
        assert timing.max_abs_error is not None and timing.max_abs_error < 1e-4, name
    try:
        e2e._time_in_turns(systems, rounds=2, repeat=2)
    finally:
        e2e._close(systems)
    result = e2e.E2EResult("tiny", 1e-3, platform.threads, "cpu", 100.0, 1.0, 4,
                           {n: s for n, (_, s) in systems.items()})  # fmt: skip
    assert all(len(s.rounds) == 2 and s.median > 0 for s in result.systems.values())
    pairs = zip(result.systems["pytorch"].rounds, result.systems[e2e.TUNED].rounds, strict=True)
    ratios = sorted(p / t for p, t in pairs)
    assert result.speedup_over("pytorch") == pytest.approx(sum(ratios) / 2)
    assert result.fastest_runtime() == min(("onnxruntime", "openvino"),
                                           key=lambda n: result.systems[n].median)  # fmt: skip
    assert result.to_dict()["systems"]["pytorch"]["gflops"] == pytest.approx(
        1e-3 / result.systems["pytorch"].median
    )


def test_a_model_s_work_counts_its_convolutions_direct_whatever_ran_them() -> None:
    platform = resolve_platform(None)
    x = torch.randn(1, 16, 24, 24)
    work = {}
    net = Convs().eval()
    for winograd in (True, False):
        model = load_model(net, example_inputs=(x,), target=platform.tvm_target,
                           winograd=winograd)  # fmt: skip
        work[winograd] = (sum(t.flop * t.weight for t in model.tasks) / 1e9,
                          e2e._direct_gflop(model, platform, net, example_inputs=(x,)))  # fmt: skip
    assert work[True][0] < work[False][0]  # Winograd's tasks do less
    assert work[True][1] == pytest.approx(work[False][0]) == work[False][1]


@pytest.fixture
def no_openvino(monkeypatch):
    """Imports of openvino fail, as where it is not installed."""
    real_import = builtins.__import__

    def without(name, *args, **kwargs):
        if name == "openvino" or name.startswith("openvino."):
            raise ImportError("No module named 'openvino'", name="openvino")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without)


def test_a_missing_runtime_is_named_and_skipped(tuned, no_openvino):
    model, store, platform, work = tuned
    systems = e2e._set_up(model, store, platform, ("openvino",), work, lambda text: None)
    run, timing = systems["openvino"]
    assert run is None and "pip install tensortune[anchors]" in timing.missing
    e2e._time_in_turns(systems, rounds=1, repeat=1)
    assert systems[e2e.TUNED][1].rounds and not timing.rounds


def test_a_system_that_fails_to_set_up_is_named_with_its_error_and_skipped(tuned, monkeypatch):
    model, store, platform, work = tuned

    def broken(*args):
        raise RuntimeError("Traceback (most recent call last):\n  ...\nScheduleError: no block")

    monkeypatch.setattr(e2e, "_ort_runner", broken)
    systems = e2e._set_up(model, store, platform, ("pytorch", "onnxruntime"), work,
                          lambda text: None)  # fmt: skip
    run, timing = systems["onnxruntime"]
    assert run is None and timing.missing == "failed: RuntimeError: ScheduleError: no block"
    e2e._time_in_turns(systems, rounds=1, repeat=1)
    assert systems["pytorch"][1].rounds and not timing.rounds


def test_only_an_anchor_package_that_fails_to_import_is_a_missing_install():
    def ours():
        raise ImportError("cannot import name 'x' from 'tensortune.deploy'",
                          name="tensortune.deploy")  # fmt: skip

    def theirs():
        raise ImportError("No module named 'openvino'", name="openvino")

    assert e2e._start("tensortune.load", ours, [])[1].missing == (
        "failed: ImportError: cannot import name 'x' from 'tensortune.deploy'"
    )
    assert e2e._start("openvino", theirs, [])[1].missing == (
        "not installed (openvino): pip install tensortune[anchors]"
    )

    def torchs():  # a package the anchors extra does not install
        raise ImportError("No module named 'ml_dtypes'", name="ml_dtypes")

    assert e2e._start("pytorch", torchs, [])[1].missing.startswith("failed: ImportError")


def test_tvm_running_another_thread_count_is_refused(tuned):
    model, store, platform, _ = tuned
    other = resolve_platform({"kind": "llvm", "num-cores": platform.threads + 1})
    with pytest.raises(TensortuneError, match="TVM_NUM_THREADS"):
        e2e._tvm_runner(model, store, other, {})


def test_unknown_anchors_are_refused_before_any_work(tmp_path):
    with pytest.raises(TensortuneError, match="unknown anchor 'tensorrt'"):
        e2e.bench_e2e(["resnet18"], anchors=("tensorrt",), work_dir=tmp_path)
    assert not list(tmp_path.iterdir())


def test_an_interrupted_tuning_does_not_pass_for_an_earlier_finished_one(tmp_path, monkeypatch):
    # An earlier run's summary stayed after its store was deleted to tune anew: the new
    # tuning, interrupted, was then timed as if it were the earlier one.
    import json

    import tensortune.tuning.tune as tuning
    import tensortune.workloads.models as models

    summary = tmp_path / "resnet18-tune.json"
    summary.write_text(json.dumps({"trials": 400, "seconds": 1200.0, "resumed": False}))

    def interrupted(**_: object) -> None:
        (tmp_path / "resnet18.db").write_bytes(b"")  # a store begun
        raise KeyboardInterrupt

    monkeypatch.setattr(e2e, "peak_gflops", lambda *_: (1.0, "pytorch, 64³"))
    monkeypatch.setattr(models, "load_model", lambda *_, **__: None)
    monkeypatch.setattr(tuning, "tune", interrupted)
    with pytest.raises(KeyboardInterrupt):
        e2e.bench_e2e(["resnet18"], work_dir=tmp_path, anchors=())
    assert not summary.exists()  # the next run resumes the tuning


def test_a_network_tuned_for_another_target_is_tuned_again_and_the_old_kept(tmp_path, monkeypatch):
    # Taken for "tuned before", its records (keyed by the other target) applied to nothing:
    # the untuned build was timed under the tuned build's name.
    import json

    import tensortune.tuning.tune as tuning
    import tensortune.workloads.models as models

    other = resolve_platform({"kind": "llvm", "num-cores": 1}).key
    summary = tmp_path / "resnet18-tune.json"
    summary.write_text(json.dumps({"trials": 400, "seconds": 1200.0, "target": other}))
    (tmp_path / "resnet18.db").write_bytes(b"the other target's records")

    def tuning_anew(**_: object) -> None:
        raise KeyboardInterrupt  # where the new tuning starts

    monkeypatch.setattr(e2e, "peak_gflops", lambda *_: (1.0, "pytorch, 64³"))
    monkeypatch.setattr(models, "load_model", lambda *_, **__: None)
    monkeypatch.setattr(tuning, "tune", tuning_anew)
    # bench_e2e sets it: set first, so that monkeypatch has a value to put back (a delenv of
    # an unset variable records nothing, and the test's value stayed for the tests after)
    monkeypatch.setenv("TVM_NUM_THREADS", "")
    monkeypatch.delenv("TVM_NUM_THREADS")
    with pytest.warns(UserWarning, match="resnet18 was tuned for another target"), \
            pytest.raises(KeyboardInterrupt):  # fmt: skip
        e2e.bench_e2e(["resnet18"], work_dir=tmp_path, anchors=(), target={"kind": "llvm",
                      "num-cores": 2})  # fmt: skip
    assert (tmp_path / "replaced-1" / "resnet18.db").read_bytes() == b"the other target's records"
    assert json.loads((tmp_path / "replaced-1" / summary.name).read_text())["target"] == other
    # A summary written before summaries named the target: the store's records say.
    from conftest import fill

    from tensortune.records import open_records

    with open_records(f"sqlite:///{tmp_path / 'resnet18.db'}") as store:
        fill(store, "matmul:16,16,16", [1e-3], target={"kind": "llvm", "num-cores": 1})
    summary.write_text(json.dumps({"trials": 400, "seconds": 1200.0}))
    with pytest.warns(UserWarning, match="resnet18 was tuned for another target.*replaced-2"), \
            pytest.raises(KeyboardInterrupt):  # fmt: skip
        e2e.bench_e2e(["resnet18"], work_dir=tmp_path, anchors=(), target={"kind": "llvm",
                      "num-cores": 2})  # fmt: skip


def test_the_peak_is_the_best_matrix_product_of_the_runtimes_at_hand(tmp_path, no_openvino):
    libraries = ("pytorch", "onnxruntime", "openvino")
    peak, where = e2e.peak_gflops(1, tmp_path, libraries, sizes=(64, 128), repeat=1)
    library, size = where.split(", ")
    assert peak > 0 and library in ("pytorch", "onnxruntime") and size in ("64³", "128³")
    assert (tmp_path / "matmul-128.onnx").is_file()  # ONNX Runtime's was timed too


def test_the_artifact_is_timed_in_a_process_of_its_own_beside_the_tuned_build(tuned):
    model, store, platform, work = tuned
    systems = e2e._set_up(model, store, platform, (), work, lambda text: None)
    assert e2e.OWN_PROCESS not in systems  # nothing else is timed while it runs
    timing = e2e._time_own_process(systems, model, platform.threads, work, rounds=2, repeat=2)
    assert not timing.missing and timing.max_abs_error < 1e-4
    assert len(timing.rounds) == 2 and len(timing.baseline) == 2
    assert not systems[e2e.TUNED][1].rounds  # the pair's tuned rounds are its own
    result = e2e.E2EResult("tiny", 1e-3, platform.threads, "cpu", 100.0, 1.0, 4,
                           {e2e.TUNED: SystemTiming(e2e.TUNED, rounds=[1.0, 1.0]),
                            e2e.OWN_PROCESS: timing})  # fmt: skip
    ratios = sorted(o / t for o, t in zip(timing.rounds, timing.baseline, strict=True))
    assert result.speedup_over(e2e.OWN_PROCESS) == pytest.approx(sum(ratios) / 2)


def test_a_child_that_dies_while_timed_costs_only_its_own_figures(tuned, tmp_path):
    model, store, platform, work = tuned
    systems = e2e._set_up(model, store, platform, (), work, lambda text: None)
    child = OwnProcess(work / "tiny.tt", model.inputs, platform.threads, tmp_path)
    child._child.kill()
    child._child.wait()
    timing = SystemTiming(e2e.OWN_PROCESS)
    pair = {e2e.TUNED: systems[e2e.TUNED], e2e.OWN_PROCESS: (child, timing)}
    try:
        e2e._time_in_turns(pair, rounds=2, repeat=1)
    finally:
        e2e._close(pair)
    assert pair[e2e.OWN_PROCESS][0] is None and not timing.rounds
    assert timing.missing.startswith("failed while timed: the artifact's own process ended")
    assert len(systems[e2e.TUNED][1].rounds) == 2


def test_without_a_shipped_artifact_the_own_process_is_named_and_skipped(tuned):
    model, _, platform, work = tuned
    systems = {e2e.TUNED: (None, SystemTiming(e2e.TUNED, missing="failed: x"))}
    timing = e2e._time_own_process(systems, model, platform.threads, work, rounds=1, repeat=1)
    assert timing.missing == "failed: there is no artifact to load" and not timing.rounds


def test_a_child_that_hangs_is_killed_with_one_line(tmp_path):
    # the child's side stands in for a kernel that never returns: a process that never answers
    hung = OwnProcess.__new__(OwnProcess)
    hung._timeout_s, hung._log_path = 0.5, tmp_path / "hung.log"
    hung._log = open(hung._log_path, "w")  # noqa: SIM115
    hung._child = subprocess.Popen(["sleep", "60"], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)  # fmt: skip
    with pytest.raises(TensortuneError, match=r"did not answer 'time' in 0.5 s") as e:
        hung.median_of(3)
    assert "\n" not in str(e.value) and hung._child.poll() is not None


def test_a_file_that_is_not_an_artifact_is_refused_by_the_child_in_one_line(tmp_path):
    bad = tmp_path / "bad.tt"
    bad.write_bytes(b"not a zip")
    with pytest.raises(TensortuneError, match=r"own process: ArtifactError: .*bad\.tt: not a") as e:
        OwnProcess(bad, [np.zeros(2, dtype="float32")], 1, tmp_path)
    assert "\n" not in str(e.value)


def test_a_runtime_that_fails_is_left_out_of_the_peak(tmp_path, monkeypatch):
    def broken(*args):
        raise RuntimeError("no kernel for this CPU")

    monkeypatch.setattr(e2e, "_ort_runner", broken)
    peak, where = e2e.peak_gflops(1, tmp_path, ("pytorch", "onnxruntime"), sizes=(64,), repeat=1)
    assert peak > 0 and where == "pytorch, 64³"


@pytest.mark.filterwarnings("ignore:No artists with labels")  # the bars are caught, not drawn
def test_the_plot_shows_the_tables_figure_the_median_of_each_rounds_ratio(tmp_path, monkeypatch):
    # The bars were the ratio of the medians; with rounds this uneven it lies on the other side
    # of 1 from the table's median of ratios (0.9 here, against 1.1).
    from matplotlib.axes import Axes

    from tensortune.compare.e2e import SystemTiming

    bars: dict[str, list[float]] = {}
    monkeypatch.setattr(Axes, "bar", lambda self, xs, ys, *a, label, **k: bars.update({label: ys}))
    result = e2e.E2EResult("net", 1e-3, 2, "cpu", 100.0, 1.0, 4, {
        e2e.TUNED: SystemTiming(e2e.TUNED, rounds=[1.0, 2.0, 3.0]),
        "pytorch": SystemTiming("pytorch", rounds=[1.1, 1.8, 3.3])})  # fmt: skip
    assert result.speedup_over("pytorch") == pytest.approx(1.1)
    e2e.plot_e2e([result], tmp_path / "p.png")
    assert bars["pytorch"] == [pytest.approx(1.1)] and bars[e2e.TUNED] == [1.0]
