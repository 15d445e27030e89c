"""Every path a user takes, once each, through the command line's real entry point
(``tensortune.cli.app.run``, what the ``tensortune`` script calls) and with no ``--target``:
the target every user gets by default, this CPU with its real ``mcpu``.

One workspace is built the way a user builds one: ``dataset collect`` on a small ONNX model,
``dataset build``, ``dataset info``, ``train``; the tests after it use its files.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
from conftest import Cli

torch = pytest.importorskip("torch")

from test_compile import TinyMLP  # noqa: E402

from tensortune.cli.app import run  # noqa: E402
from tensortune.hardware import resolve_platform  # noqa: E402
from tensortune.records import open_records  # noqa: E402

MM = "matmul:32,32,32"


def _json(result: tuple[int, str, str]) -> dict:
    code, out, err = result
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny.onnx, its programs collected (c.db), built into a dataset (ds) and a model (m.ttm)."""
    root = tmp_path_factory.mktemp("workspace")
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(TinyMLP().eval(), (torch.randn(4, 32),), str(root / "tiny.onnx"),
                          dynamo=False, opset_version=17)  # fmt: skip
    # avx2-1c: a configuration every x86-64 CPU seen here can measure.
    steps = (
        ["dataset", "collect", "--network", str(root / "tiny.onnx"), "--config", "avx2-1c",
         "--per-task", "6", "--records", f"sqlite:///{root / 'c.db'}", "--work-dir",
         str(root / "cw")],
        ["dataset", "build", str(root / "ds"), "--records", f"sqlite:///{root / 'c.db'}"],
        ["train", "--dataset", str(root / "ds"), "--cost-model", "xgb", "--split", "by-task",
         "--param", "n_rounds=20", "--out", str(root / "m.ttm")],
    )  # fmt: skip
    for args in steps:
        assert run(args) == 0, args
    return root


def test_collect_build_and_info_make_a_dataset(workspace: Path, cli: Cli) -> None:
    with open_records(f"sqlite:///{workspace / 'c.db'}") as store:
        measured = store.count()
        tasks = len(store.task_sources("tiny"))
    assert tasks >= 2 and measured == 6 * tasks
    info = _json(cli("dataset", "info", str(workspace / "ds"), "--json"))
    assert info["programs"] == measured and info["tasks"] == tasks
    assert info["networks"] == ["tiny"] and len(info["hardware"]) == 1
    code, out, _ = cli("dataset", "info", str(workspace / "ds"))
    assert code == 0 and "programs" in out and "tiny" in out


def test_evaluate_a_trained_model_on_a_split_with_a_plot(workspace: Path, cli: Cli) -> None:
    scores = _json(cli("evaluate", "--cost-model", str(workspace / "m.ttm"), "--dataset",
                       str(workspace / "ds"), "--split", "within-task", "--plot", "p.png",
                       "--json"))  # fmt: skip
    # Six programs a task leave one each to this split's test: no pair, so no PCA (not 0.5).
    assert scores["pca"] is None and scores["programs"] > 0 and scores["top1_score"] > 0
    assert Path("p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, out, err = cli("evaluate", "--cost-model", str(workspace / "m.ttm"), "--dataset",
                         str(workspace / "ds"))  # fmt: skip
    assert code == 0, err
    # the split it was trained with, as its file says: by-task, whole tasks
    assert re.search(r"pca\W+(0\.\d{4}|1\.0000)\W", out), out


def test_evaluate_on_records_exported_from_a_store(workspace: Path, cli: Cli) -> None:
    url = f"sqlite:///{workspace / 'c.db'}"
    assert cli("records", "export", "exported", "--records", url)[0] == 0
    scores = _json(cli("evaluate", "--cost-model", str(workspace / "m.ttm"), "--test-records",
                       "exported", "--json"))  # fmt: skip
    with open_records(url) as store:
        assert scores["programs"] == store.count()


# ---- tune: the default search, each cost model and how it learns ---------------------------


def test_tune_with_every_default(cli: Cli) -> None:
    """No --target, --strategy or --cost-model: draft-then-verify with the shipped model for
    this CPU, adapted by MoA, into the default store in the working directory."""
    result = _json(cli("tune", "-w", MM, "--trials", "8", "--json"))
    assert result["target"] == resolve_platform(None).target and "mcpu" in result["target"]
    assert (result["strategy"], result["cost_model"]) == ("DraftThenVerify", "pacm (MoA)")
    assert result["trials_total"] == 8 and result["tasks"][0]["ok"] == 8
    assert Path("tensortune.db").is_file()
    code, out, err = cli("tune", "-w", MM, "--trials", "8")  # the text output, resumed
    assert code == 0, err
    assert "nothing to do" in out and "search: DraftThenVerify with pacm (MoA)" in out
    assert any(line.strip("│ ").startswith(MM) for line in out.splitlines())


@pytest.mark.parametrize(("options", "described"), [
    (["--cost-model", "default"], "pacm (MoA)"),
    (["--cost-model", "default", "--online"], "pacm (online)"),
    (["--cost-model", "default", "--frozen"], "pacm (frozen)"),
    (["--cost-model", "default", "--moa"], "pacm (MoA)"),
    (["--cost-model", "xgb"], "XGBModel"),
    (["--cost-model", "FILE"], "xgb (online)"),
    (["--cost-model", "FILE", "--frozen"], "xgb (frozen)"),
])  # fmt: skip
def test_draft_verify_with_each_cost_model(workspace: Path, cli: Cli, options: list[str],
                                           described: str) -> None:  # fmt: skip
    options = [str(workspace / "m.ttm") if o == "FILE" else o for o in options]
    result = _json(cli("tune", "-w", MM, "--trials", "2", "--strategy", "draft-verify",
                       *options, "--records", "sqlite:///r.db", "--json"))  # fmt: skip
    assert (result["strategy"], result["cost_model"]) == ("DraftThenVerify", described)
    assert result["trials_total"] == 2 and result["tasks"][0]["ok"] == 2


def test_tune_with_alt_says_what_its_validity_filter_did(cli: Cli) -> None:
    import re

    code, out, err = cli("tune", "-w", MM, "--trials", "4", "--strategy", "alt",
                         "--cost-model", "xgb", "--records", "sqlite:///r.db")  # fmt: skip
    assert code == 0, err
    assert re.search(r"validity filter: \d+ of 4 measurements failed; about \d+ measurements "
                     r"saved", " ".join(out.split())), out  # fmt: skip
    # Resumed: four more, the filter started from the first run's outcomes.
    result = _json(cli("tune", "-w", MM, "--trials", "8", "--strategy", "alt", "--cost-model",
                       "xgb", "--records", "sqlite:///r.db", "--json"))  # fmt: skip
    assert result["validity"]["measured"] == 4 and result["validity"]["earlier"] == 4


def test_tune_a_zoo_network_then_compile_it(cli: Cli) -> None:
    # gpt2-block, not resnet18: the same path in half the time (LLVM takes ~35 s to emit a
    # ResNet-18 build whose kernels are scheduled; test_zoo builds every network)
    url = "sqlite:///net.db"
    result = _json(cli("tune", "--model", "gpt2-block", "--trials", "2", "--records", url,
                       "--json"))  # fmt: skip
    n_tasks = len(result["tasks"])
    assert n_tasks == 18 and result["trials_total"] == 2
    tuned = [t["name"] for t in result["tasks"] if t["best_seconds"] is not None]
    assert tuned
    assert result["weighted_seconds"] is None  # not every task has a time yet

    code, out, err = cli("compile", "gpt2-block", "--records", url, "--repeat", "1", "--rounds",
                         "1")  # fmt: skip
    assert code == 0, err
    lines = out.splitlines()
    for build in ("tensortune (tuned records)", "TVM untuned", "PyTorch eager"):
        row = next(line for line in lines if build in line)
        assert any(unit in row for unit in (" ms", " µs", " s ")), row
    for name in tuned:
        assert any(name in line and "tuned" in line and "fallback" not in line for line in lines)
    assert sum("fallback (no record)" in line for line in lines) == n_tasks - len(tuned)
    assert f"{len(tuned)}/{n_tasks} tasks tuned, {n_tasks - len(tuned)} without a record" in out


def test_tune_a_metaschedule_database_s_workloads(cli: Cli) -> None:
    # The search is not what is tested here: MetaSchedule's cheapest, throughout.
    cheap = ["--strategy", "replay-trace", "--cost-model", "random"]
    assert cli("tune", "-w", MM, "-w", "softmax:8,64", "--trials", "4", "--trials-per-round",
               "2", *cheap, "--records", "sqlite:///a.db")[0] == 0  # fmt: skip
    assert cli("records", "export", "db", "--records", "sqlite:///a.db")[0] == 0
    result = _json(cli("tune", "--workloads-from", "db", "--trials", "4", *cheap, "--records",
                       "sqlite:///b.db", "--json"))  # fmt: skip
    assert sorted(t["name"] for t in result["tasks"]) == sorted([MM, "softmax:8,64"])
    assert result["trials_before"] == 0 and result["trials_total"] == 4
    # A database that holds a workload twice tunes it once: as two tasks, its records would
    # count twice toward the budget (a rerun would stop at half of it).
    workloads = Path("db", "database_workload.json")
    workloads.write_text(workloads.read_text() * 2)
    result = _json(cli("tune", "--workloads-from", "db", "--trials", "6", *cheap, "--records",
                       "sqlite:///b.db", "--json"))  # fmt: skip
    assert sorted(t["name"] for t in result["tasks"]) == sorted([MM, "softmax:8,64"])
    assert result["trials_before"] == 4 and result["trials_total"] == 6
    assert sum(t["trials"] for t in result["tasks"]) == 6
