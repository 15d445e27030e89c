"""``tensortune transfer``, ``tune --warm-start`` and ``workloads --classes`` on the command line:
real schedules tuned for one shape, replayed on another and timed, through ``cli.app.run``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TARGET, Cli

from tensortune.records import open_records
from tensortune.records.schema import origin_of
from tensortune.tuning.tune import tune

TJ = json.dumps(TARGET)
SOURCE = "dense_bias_relu:64,64,64"
TASK = "dense_bias_relu:128,64,64"  # the same class, other extents: its tiles are re-fitted
# The cheapest search that measures real programs: no cost model file to load.
FAST = {"strategy": "replay-trace", "cost_model": "random", "target": TARGET}


@pytest.fixture(scope="module")
def source_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with 8 measured schedules of SOURCE on this machine and TARGET."""
    from tensortune.tuning.tune import tune

    work = tmp_path_factory.mktemp("source")
    path = work / "src.db"
    tune([SOURCE], trials=8, records=f"sqlite:///{path}", work_dir=work / "w", **FAST)
    return path


@pytest.fixture
def source(source_file: Path, tmp_path: Path) -> str:
    """A copy of the source store, so no test sees another's writes."""
    path = tmp_path / "src.db"
    path.write_bytes(source_file.read_bytes())
    return f"sqlite:///{path}"


def class_of(spec: str) -> str:
    from tensortune.transfer.classes import kernel_class
    from tensortune.workloads.ops import parse_spec

    return str(kernel_class(parse_spec(spec).to_module()))


def origins(url: str) -> list[dict]:
    with open_records(url, create=False) as store:
        return [origin_of(r) for r in store.query()]


def one_error(result: tuple[int, str, str], option: str, *fragments: str) -> str:
    code, out, err = result
    assert code == 2, err
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: {option}: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


def test_transfer_times_the_source_schedule_and_resumes(cli: Cli, source: str, tmp_path: Path):
    out_url = f"sqlite:///{tmp_path / 'out.db'}"
    args = ["transfer", "--from", source, "--workload", TASK, "--records", out_url,
            "--per-kernel", "2", "--target", TJ, "--work-dir", "w"]  # fmt: skip
    code, out, err = cli(*args, "--json")
    assert code == 0, err
    result = json.loads(out)  # the JSON object and nothing else
    assert result["per_kernel"] == 2 and result["records_url"] == out_url
    (task,) = result["tasks"]
    assert task["name"] == TASK
    assert task["kernel_class"] == class_of(TASK) == class_of(SOURCE)
    assert task["sources"] == 1 and task["refit"] + task["exact"] == 1 and task["invalid"] == 0
    assert task["untuned_seconds"] > 0
    assert task["measured"] == 1
    assert task["fallback_seconds"] > 0
    assert task["chosen_seconds"] == min(s for s in (task["untuned_seconds"],
                                                     task["fallback_seconds"],
                                                     task["best_seconds"]) if s)  # fmt: skip
    assert result["outcomes"]["invalid"] == 0 and result["model"] is None

    found = origins(out_url)
    assert {"kind": "untuned"} in found and {"kind": "fallback"} in found
    transferred = [o for o in found if o.get("kind") == "transfer"]
    assert len(transferred) == 1 and len(found) == 3
    assert transferred[0]["from"] == source and transferred[0]["workload"] == SOURCE
    assert task["best_seconds"] is not None  # the transferred schedule was timed
    assert task["source"] == SOURCE and task["source_store"] == source

    code, out, err = cli(*args)  # again, as a table: everything is in the store already
    assert code == 0, err
    assert len(origins(out_url)) == 3
    row = next(line for line in out.splitlines() if line.startswith(f"│ {TASK} "))
    assert class_of(TASK) in row and " 1 (" in row
    taken = {task["best_seconds"]: SOURCE, task["fallback_seconds"]: "fallback",
             task["untuned_seconds"]: "untuned"}[task["chosen_seconds"]]  # fmt: skip
    assert f" {taken} " in row
    assert "transferred schedules: " in out and "search: " in out
    assert "[1] " + TASK in out  # the progress line of the kernel


def test_transfer_rejects_bad_input_before_any_work(cli: Cli, source: str, tmp_path: Path):
    out = tmp_path / "out.db"
    common = ["--workload", TASK, "--records", f"sqlite:///{out}", "--target", TJ]
    missing = tmp_path / "missing.db"
    one_error(cli("transfer", "--from", f"sqlite:///{missing}", *common), "--from", "missing.db")
    one_error(cli("transfer", "--from", source, "--per-kernel", "0", *common), "--per-kernel")
    # A store with nothing to transfer: the run would time and record only untuned kernels.
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    open_records(empty).close()
    one_error(cli("transfer", "--from", empty, *common), "--from", "no successful schedule")
    other = {"kind": "llvm", "mcpu": "haswell", "num-cores": 1}  # what the source holds is not it
    one_error(cli("transfer", "--from", source, "--workload", TASK, "--records",
                  f"sqlite:///{out}", "--target", json.dumps(other)),
              "--from", "its schedules are for")  # fmt: skip
    code, _, err = cli("transfer", *common)
    assert code == 2 and "--from" in err
    # a model loads as tune loads it: --input-shape and --winograd are transfer's too
    one_error(cli("transfer", "--from", source, "--no-winograd", "--input-shape", "x=1,8",
                  *common), "--input-shape", "fixed shapes")  # fmt: skip
    assert not out.exists()


def test_workloads_classes_groups_the_tasks_that_share_schedules(cli: Cli):
    other = "matmul:64,64,64"
    code, out, err = cli("workloads", "-w", SOURCE, "-w", TASK, "-w", other, "--classes")
    assert code == 0, err
    shared = class_of(SOURCE)
    assert shared == class_of(TASK) != class_of(other)
    row = next(line for line in out.splitlines() if line.startswith(f"│ {shared} "))
    assert row.split("│")[2].strip() == "2"  # two tasks of one class
    assert "3 tasks in 2 classes; 1 with several tasks" in out

    code, out, err = cli("workloads", "-w", SOURCE)  # the tasks without their classes
    assert code == 0, err
    assert SOURCE in out and "kernel classes" not in out and "#" not in out

    one_error(cli("workloads", "--classes"), "--classes", "--model")


def test_workloads_classes_of_a_model(cli: Cli):
    code, out, err = cli("workloads", "--model", "resnet18", "--classes", "--target", TJ)
    assert code == 0, err
    lines = out.splitlines()
    assert any(line.startswith("│ fused_conv2d") for line in lines)
    classes = {line.split("│")[1].strip() for line in lines[lines.index(
        next(x for x in lines if "kernel classes" in x)):] if line.startswith("│ ")}  # fmt: skip
    summary = next(line for line in lines if " tasks in " in line)
    assert summary.startswith("19 tasks in ") and f" in {len(classes)} classes" in summary
    assert all("#" in c for c in classes)
    assert any(c.startswith("pad_temp+conv2d_nhwc") for c in classes)


def test_tune_warm_start_counts_the_transferred_schedules(cli: Cli, source: str, tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'warm.db'}"
    code, out, err = cli("tune", "-w", TASK, "--trials", "8", "--records", url, "--warm-start",
                         source, "--target", TJ, "--strategy", "replay-trace", "--cost-model",
                         "random", "--work-dir", "w", "--json")  # fmt: skip
    assert code == 0, err
    result = json.loads(out)
    assert result["trials_before"] == 0  # a fresh store
    assert result["trials_warm_start"] == 1  # the one transferred schedule, before the search
    assert result["trials_total"] == 8
    found = origins(url)
    assert len(found) == 8
    transferred = [o for o in found if o.get("kind") == "transfer"]
    assert len(transferred) == 1 and transferred[0]["from"] == source


def test_tune_warm_start_names_its_option(cli: Cli, tmp_path: Path):
    missing = tmp_path / "missing.db"
    args = ["tune", "-w", TASK, "--trials", "8", "--records", "sqlite:///warm.db", "--warm-start",
            f"sqlite:///{missing}", "--target", TJ, "--strategy", "replay-trace",
            "--cost-model", "random"]  # fmt: skip
    one_error(cli(*args), "--warm-start", "missing.db")
    # One that exists and holds nothing yet (the first run of a loop that warm-starts from its
    # own growing store) is no error: the search starts cold, and says so.
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    open_records(empty).close()
    with pytest.warns(UserWarning, match="hold no schedule for this target"):
        result = tune([TASK], trials=8, records=f"sqlite:///{tmp_path / 'r.db'}",
                      work_dir=tmp_path / "w", warm_start=empty, target=json.loads(TJ),
                      strategy="replay-trace", cost_model="random")  # fmt: skip
    assert result.trials_warm_start == 0 and result.tasks[0].trials == 8


def test_the_table_says_where_each_kernel_comes_from(capfd: pytest.CaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch):  # fmt: skip
    """The table and summary of a model's result, made by hand (no TVM): the untuned program
    or the fallback is taken where it is faster, totals are weighted, the end-to-end line has
    the speedup, and a narrow terminal shortens a class in its middle so its key stays."""
    from tensortune.cli.display import print_table
    from tensortune.cli.transfer import result_table, summary_lines
    from tensortune.transfer.run import KernelTransfer, TransferResult

    faster = KernelTransfer("conv_a", 2, "pad_temp+conv2d_nchw+T_add+compute#e2be1d", 3, 1, 1, 1,
                            2, 0, 4e-3, 1e-3, "resnet50_conv_x", "sqlite:///r50.db")  # fmt: skip
    slower = KernelTransfer("conv_b", 1, "pad_temp+conv2d_nchw+T_add+compute#8a3e7c", 1, 0, 1, 0,
                            1, 0, 1e-3, 2e-3, "resnet50_conv_y", "sqlite:///r50.db")  # fmt: skip
    alone = KernelTransfer("mean", 1, "lv_red+T_divide#8eed26", untuned_seconds=1e-5)
    seeded = KernelTransfer("dense", 1, "T_matmul_NN#1c0ffe", untuned_seconds=2e-3,
                            fallback_seconds=1e-4)  # fmt: skip
    reasons = {"does not apply: ScheduleError": 1}
    kernels = [faster, slower, alone, seeded]
    result = TransferResult("sqlite:///r18.db", TARGET, "hw", 8, 12.5, kernels, reasons,
                            "resnet18", 9e-3, 4.5e-3)  # fmt: skip
    monkeypatch.setenv("COLUMNS", "200")
    capfd.readouterr()
    print_table(result_table(result), keep_tail=("class",))
    out = capfd.readouterr().out
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.startswith("│")}
    assert "compute#e2be1d " in rows["conv_a"] and " 3 (1/1/1) " in rows["conv_a"]
    assert " resnet50_conv_x " in rows["conv_a"] and "4.00x" in rows["conv_a"]
    assert " untuned " in rows["conv_b"] and "1.00x" in rows["conv_b"]
    assert " untuned " in rows["mean"] and " 0 " in rows["mean"]
    assert " fallback " in rows["dense"] and "20.00x" in rows["dense"]
    assert [k.took_transferred for k in kernels] == [True, False, False, False]
    assert "11.01 ms" in rows["weighted total"] and "3.11 ms" in rows["weighted total"]
    assert result.weighted_seconds() == pytest.approx((11.01e-3, 3.11e-3))
    assert result.to_dict()["weighted_chosen_seconds"] == pytest.approx(3.11e-3)
    assert [k.taken_from for k in kernels] == ["resnet50_conv_x", "untuned", "untuned", "fallback"]
    # a kernel with no time, and one with a transferred time but no untuned one: the partial
    # sums leave both out, so that they compare
    unknown = TransferResult("sqlite:///r18.db", TARGET, "hw", 8, 1.0,
                             [*kernels, KernelTransfer("new", 1, "c"),
                              KernelTransfer("half", 1, "c", best_seconds=1.0)])  # fmt: skip
    assert unknown.weighted_seconds() == (None, None)
    assert unknown.weighted_seconds(partial=True) == pytest.approx((11.01e-3, 3.11e-3))
    lines = summary_lines(result)
    assert lines[0] == ("transferred schedules: 1 exact, 2 refit, 1 invalid "
                        "(invalid: 1x does not apply: ScheduleError)")  # fmt: skip
    assert lines[-1] == "end to end (resnet18): untuned 9.00 ms, transferred 4.50 ms, 2.00x"

    monkeypatch.setenv("COLUMNS", "100")
    print_table(result_table(result), keep_tail=("class",))
    out = capfd.readouterr().out
    assert "#e2be1d │" in out and "#8a3e7c │" in out and "…" in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_bench_transfer_refuses_a_pair_without_its_source(cli: Cli):
    code, out, err = cli("bench", "transfer", "--pair", "resnet18")
    assert code == 2 and out == ""
    assert err.strip() == "error: --pair: expected TARGET:SOURCE, got 'resnet18'"
    # nor one of a network and itself: every kernel finds its own schedule
    code, out, err = cli("bench", "transfer", "--pair", "resnet18:resnet18")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith("error: --pair: resnet18:resnet18 transfers a network's schedules")


def test_bench_transfer_reuses_a_finished_pair_and_moves_an_unfinished_one_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # A rerun after a kill started over from the first pair, deleting the finished pairs'
    # stores and measuring them again (hours on two cores).
    import tensortune.tuning.tune as tuning
    import tensortune.workloads.models as models
    from tensortune.compare.transfer import PAIR_VERSION, PairResult, bench_transfer
    from tensortune.hardware import resolve_platform

    class Measured(Exception):
        """Raised where the benchmark would start measuring."""

    def measuring(*args, **kwargs):
        raise Measured

    monkeypatch.setattr(models, "load_model", measuring)
    monkeypatch.setattr(tuning, "tune", measuring)
    pair = PairResult("resnet18", "resnet50", 11, 220, 8, 9e-3, 5e-3, 4e-3, 1.8, 2.25, 30.0,
                      600.0, 500.0, 5e-3, 4e-3, 120.0, None, {"exact": 3}, {}, 2,
                      {"full": [(1.0, 6e-3), (2.0, 4e-3)], "warm": []})  # fmt: skip
    platform = resolve_platform(TARGET)
    setup = {"version": PAIR_VERSION, "target": platform.key, "hardware": platform.hardware.id,
             "trials_per_task": 20, "source_trials_per_task": 24, "per_kernel": 8,
             "rounds": 3}  # fmt: skip
    saved = tmp_path / "resnet18-from-resnet50.json"
    # timed on another machine with the same target text: measured again
    elsewhere = {**setup, "hardware": "0123456789abcdef"}
    saved.write_text(json.dumps({**pair.to_dict(), "setup": elsewhere}))
    with pytest.warns(UserWarning, match="replaced-1"), pytest.raises(Measured):
        bench_transfer([("resnet18", "resnet50")], work_dir=tmp_path, target=TARGET)
    saved.write_text(json.dumps({**pair.to_dict(), "setup": setup}))
    store = tmp_path / "resnet18-from-resnet50-full.db"
    store.write_bytes(b"the full tuning's records")
    (done,) = bench_transfer([("resnet18", "resnet50")], work_dir=tmp_path, target=TARGET)
    assert done == pair  # nothing loaded, tuned or timed
    # other settings: measured again, the earlier JSON and stores kept aside, not deleted
    with pytest.warns(UserWarning, match="resnet18 <- resnet50 .*replaced-2"), \
            pytest.raises(Measured):  # fmt: skip
        bench_transfer([("resnet18", "resnet50")], work_dir=tmp_path, target=TARGET, rounds=5)
    assert not saved.exists() and not store.exists()
    assert json.loads((tmp_path / "replaced-2" / saved.name).read_text())["setup"] == setup
    assert (tmp_path / "replaced-2" / store.name).read_bytes() == b"the full tuning's records"


def test_bench_transfer_tunes_a_source_anew_that_holds_more_than_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # A rerun with a smaller source budget found the store "done" and transferred from the
    # larger source, while its settings said the smaller one.
    from types import SimpleNamespace

    import tensortune.tuning.tune as tuning
    import tensortune.workloads.models as models
    from tensortune.compare.transfer import bench_transfer

    calls = []

    def tune(**kwargs):
        calls.append(kwargs["trials"])
        if len(calls) == 2:
            raise KeyboardInterrupt  # where the source is tuned anew
        return SimpleNamespace(trials_before=999)

    monkeypatch.setattr(models, "load_model", lambda *_, **__: SimpleNamespace(tasks=[1, 2]))
    monkeypatch.setattr(tuning, "tune", tune)
    (tmp_path / "source-resnet50.db").write_bytes(b"999 trials")
    with pytest.warns(UserWarning, match="source resnet50 holds 999 trials, more than 48"), \
            pytest.raises(KeyboardInterrupt):  # fmt: skip
        bench_transfer([("resnet18", "resnet50")], work_dir=tmp_path, target=TARGET)
    assert calls == [48, 48]
    assert (tmp_path / "replaced-1" / "source-resnet50.db").read_bytes() == b"999 trials"
