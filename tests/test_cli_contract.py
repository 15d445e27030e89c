"""The command line's contract, driven through ``tensortune.cli.app.run`` (what the
``tensortune`` script calls) in this process, so hundreds of command lines stay cheap.

Every bad input: exit status 2, nothing on stdout, exactly one stderr line ``error: OPTION: ...``
naming the option the user typed, and the records store's bytes unchanged.  Operator specs and
target JSON are also drawn by ``hypothesis``: whatever the text, the answer is a result (exit 0)
or that one line (exit 2), never a traceback (exit 1).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import click
import pytest
import typer
from conftest import TARGET, Cli, fill
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tensortune.cli.app import app, native_log
from tensortune.hardware import current_hardware
from tensortune.records import open_records
from tensortune.workloads.ops import OPS

MM = "matmul:16,16,16"
TJ = json.dumps(TARGET)
# The cheapest search to plan: no cost model file to load for a dry run.
PLAN = ["--trials", "4", "--dry-run", "--strategy", "evolutionary", "--cost-model", "random"]


@pytest.fixture(scope="module")
def store_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with six measured schedules of MM on this machine and TARGET."""
    path = tmp_path_factory.mktemp("store") / "r.db"
    with open_records(f"sqlite:///{path}") as store:
        fill(store, MM, [3e-3, 1e-3, 2e-3, 4e-3, None, 5e-3])
    return path


@pytest.fixture
def store(store_file: Path, tmp_path: Path) -> tuple[str, Callable[[], None]]:
    """A copy of the store and a check that its directory and bytes are as they were."""
    path = tmp_path / "r.db"
    path.write_bytes(store_file.read_bytes())
    before = path.read_bytes()

    def unchanged() -> None:
        assert path.read_bytes() == before
        assert sorted(p.name for p in tmp_path.glob("r.db*")) == ["r.db"]

    return f"sqlite:///{path}", unchanged


def one_error(result: tuple[int, str, str], option: str, *fragments: str) -> str:
    code, out, err = result
    assert code == 2, (out, err)
    assert out == ""  # nothing printed before the error: no banner, no work
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"error: {option}"), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# ---- bad inputs, each named by the option that carried it ---------------------------------

TUNE = ["tune", "-w", MM, "--target", TJ]
SELECT = ["dataset", "select", "--dataset", "default", "--out", "never-written"]

BAD = {
    "cuda target": (["tune", "-w", MM, "--target", '{"kind": "cuda"}'], "--target", "cuda"),
    "unknown mcpu": (
        ["tune", "-w", MM, "--target", '{"kind": "llvm", "mcpu": "nosuchcpu"}'],
        "--target",
        "LLVM does not know mcpu 'nosuchcpu'",
    ),
    "num-cores zero": (
        ["tune", "-w", MM, "--target", '{"kind": "llvm", "num-cores": 0}'],
        "--target",
        "num-cores",
    ),
    "unknown strategy": ([*TUNE, "--strategy", "nosuch"], "--strategy", "'nosuch'"),
    "unknown cost model": ([*TUNE, "--cost-model", "nosuch"], "--cost-model", "'nosuch'"),
    "moa with xgb": ([*TUNE, "--moa", "--cost-model", "xgb"], "--moa", "xgb"),
    "int32 parameter": (
        ["tune", "-w", "matmul:99999999999,4,4", "--target", TJ],
        "--workload",
        "int32",
    ),
    "int32 tensor": (["tune", "-w", "matmul:99999,99999,4", "--target", TJ], "--workload", "int32"),
    "zero trials": ([*TUNE, "--trials", "0"], "--trials", "positive"),
    "zero trials per task": ([*TUNE, "--trials-per-task", "0"], "--trials-per-task", "positive"),
    "two workload sources": ([*TUNE, "--model", "resnet18"], "--model", "give exactly one"),
    "unknown network": (["tune", "-m", "nosuchnet", "--target", TJ], "--model", "nosuchnet"),
    "unknown option": ([*TUNE, "--nosuch"], "No such option: --nosuch"),
    "unknown command": (["nosuch"], "No such command 'nosuch'"),
    "study checkpoint in no directory": (
        ["bench", "splits", "--checkpoint", "/nonexistent/splits.json"],
        "--checkpoint",
        "no directory",
    ),
    "show unknown target": (
        ["records", "show", "--target", '{"kind": "nosuchkind"}'],
        "--target",
        "nosuchkind",
    ),
    "evaluate unknown model": (["evaluate", "--cost-model", "nosuch"], "--cost-model"),
    "train unknown kind": (
        ["train", "--dataset", "default", "--cost-model", "nosuch"],
        "--cost-model",
        "nosuch",
    ),
    "train without a dataset": (["train"], "--dataset", "missing"),
    "compile unknown network": (["compile", "nosuchnet"], "NET", "nosuchnet"),
    "compile re-timing one record": (
        ["compile", "resnet18", "--retime", "1"],
        "--retime",
        "nothing to be compared with",
    ),
    "bench unknown method": (["bench", "tune", "-w", MM, "--method", "nosuch"], "--method"),
    "tune unknown draft option": (
        [*TUNE, "--draft-option", "nosuch=1"],
        "--draft-option",
        "nosuch",
    ),
    "tune draft option out of range": (
        [*TUNE, "--draft-option", "seeds=2"],
        "--draft-option",
        "seeds='2'",
    ),
    "tune draft option without =": ([*TUNE, "--draft-option", "seeds"], "--draft-option"),
    "tune draft option, MetaSchedule's strategy": (
        [*TUNE, "--strategy", "evolutionary", "--draft-option", "seeds=0"],
        "--draft-option",
        "draft-verify and alt only",
    ),
    "bench bad draft option": (
        ["bench", "tune", "-w", MM, "--draft-option", "population=-1"],
        "--draft-option",
    ),
    "collect unknown sampler": (
        ["dataset", "collect", "--network", "resnet18", "--sampler", "nosuch"],
        "--sampler",
        "unknown selector 'nosuch'",
    ),
    "collect zero heaviest": (
        ["dataset", "collect", "--network", "resnet18", "--heaviest", "0"],
        "--heaviest",
        "at least 1",
    ),
    "bench al unknown selector": (
        ["bench", "al", "--dataset", "default", "--held-out", "gpt2-block", "--selector", "x"],
        "--selector",
        "unknown selector 'x'",
    ),
    "bench al bad fraction": (
        ["bench", "al", "--dataset", "default", "--held-out", "gpt2-block", "--fractions", "2"],
        "--fractions",
    ),
    "bench al unknown held-out network": (
        ["bench", "al", "--dataset", "default", "--held-out", "nosuch", "--hardware", "x"],
        "--held-out",
        "nosuch",
    ),
    "select unknown selector": ([*SELECT, "--selector", "x", "--fraction", "0.1"], "--selector"),
    "select zero fraction": ([*SELECT, "--selector", "random", "--fraction", "0"], "--fraction"),
    "select another model's setting": (
        [*SELECT, "--selector", "balto", "--fraction", "0.1", "--param", "mlp.epochs=2"],
        "--param",
        "the selectors read an xgb model",
    ),
    "collect unknown config": (
        ["dataset", "collect", "--network", "resnet18", "--config", "nosuch"],
        "--config",
        "nosuch",
    ),
    "seed below zero": ([*TUNE, "--seed", "-1"], "--seed", "-1"),
    "moa and frozen": ([*TUNE, "--moa", "--frozen"], "--moa", "--frozen"),
    "another architecture": (
        ["tune", "-w", MM, "--target", '{"kind": "llvm", "mtriple": "aarch64-linux-gnu"}'],
        "--target",
        "aarch64",
    ),
    "a time budget of centuries": ([*TUNE, "--time", "99999999h"], "--time"),
    "an hour and thirty of what": ([*TUNE, "--time", "1h30"], "--time", "1h30m"),
    "input shapes for an operator": ([*TUNE, "--input-shape", "x=1,2"], "--input-shape:"),
    "more trials than TVM counts": ([*TUNE, "--trials", str(10**20)], "--trials"),
    "a padded input over int32": (
        ["tune", "-w", "conv2d_nchw:1,8,8,1,1,1,100000,50000", "--target", TJ],
        "--workload",
        "int32",
    ),
    "a negative pad": (
        ["tune", "-w", "conv2d_nchw:1,8,8,4,4,3,1,-1", "--target", TJ],
        "--workload",
        "pad must not be negative",
    ),
    "export to a store, filtered": (
        ["records", "export", "sqlite:///never-written.db", "--top-k", "1"],
        "--top-k",
    ),
    "import with --measured-here from a store": (
        ["records", "import", "sqlite:///never-read.db", "--measured-here"],
        "--measured-here",
    ),
    "evaluate records and a dataset": (
        ["evaluate", "--cost-model", "default", "--test-records", "db", "--dataset", "default"],
        "--test-records",
        "not both",
    ),
    "collect an unknown excluded network": (
        ["dataset", "collect", "--network", "resnet18", "--exclude-network", "nosuch"],
        "--exclude-network",
        "nosuch",
    ),
    "a plot in a missing directory": (
        [
            "bench",
            "al",
            "--dataset",
            "default",
            "--held-out",
            "gpt2-block",
            "--plot",
            "/nonexistent/al.png",
        ],
        "--plot",
    ),
    "an artifact in place of a directory": (["compile", "resnet18", "--out", "/tmp"], "--out"),
    "transfer with no source budget": (
        ["bench", "transfer", "--source-trials-per-task", "0"],
        "--source-trials-per-task",
    ),
    "collect malformed operator": (
        ["dataset", "collect", "-w", "softmax:4", "--config", "avx2-1c"],
        "--workload",
        "softmax",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_and_touches_no_store(cli: Cli, store, case: str) -> None:
    url, unchanged = store
    args, option, *fragments = BAD[case]
    opens_store = args[0] in ("tune", "records", "compile") or args[:2] == ["dataset", "collect"]
    if opens_store:
        args = [*args, "--records", url]
    one_error(cli(*args), option, *fragments)
    unchanged()


_SCRIPTS = {
    "exits": ("import sys\nsys.exit(0)\n", "sys.exit(0)"),
    "symbolic": ("from tvm.script import tirx as T\n\n@T.prim_func(s_tir=True)\n"
                 "def add(a: T.handle, b: T.handle):\n    n = T.int32()\n"
                 "    A = T.match_buffer(a, (n,), 'float32')\n"
                 "    B = T.match_buffer(b, (n,), 'float32')\n"
                 "    for i in range(n):\n        with T.sblock('B'):\n"
                 "            vi = T.axis.spatial(n, i)\n            B[vi] = A[vi]\n",
                 "symbolic shape"),
}  # fmt: skip


def _copy(shape: str) -> str:
    """A TVMScript copy kernel of ``shape``: the sizes an operator spec refuses, in a file."""
    dims = shape.strip("()").rstrip(",").split(",")
    loops = ", ".join(f"i{k}" for k in range(len(dims)))
    axes = ", ".join(f"v{k}" for k in range(len(dims)))
    return ("from tvm.script import tirx as T\n\n@T.prim_func(s_tir=True)\n"
            f"def copy(A: T.Buffer({shape}, 'float32'), B: T.Buffer({shape}, 'float32')):\n"
            f"    for {loops} in T.grid({', '.join(dims)}):\n"
            "        with T.sblock('B'):\n"
            f"            {axes} = T.axis.remap('{'S' * len(dims)}', [{loops}])\n"
            f"            B[{axes}] = A[{axes}]\n")  # fmt: skip


_SCRIPTS["empty"] = (_copy("(0, 16)"), "empty")
_SCRIPTS["past int32"] = (_copy("(100000, 100000)"), "int32")
_SCRIPTS["larger than a workload may be"] = (_copy("(40000, 20000)"), "GiB")


@pytest.mark.parametrize("case", sorted(_SCRIPTS))
def test_a_tvmscript_file_that_cannot_be_tuned_is_refused_before_anything(
    cli: Cli, store, tmp_path: Path, case: str
) -> None:
    url, unchanged = store
    text, fragment = _SCRIPTS[case]
    path = tmp_path / f"{case}.py"
    path.write_text(text)
    for plan in ([], ["--dry-run", "--json"]):
        one_error(cli("tune", "-w", str(path), "--trials", "2", "--records", url, *plan),
                  "--workload", fragment)  # fmt: skip
    if case != "exits":  # the same kernel in a MetaSchedule database another tuner wrote
        import runpy

        from tensortune.compat import ms, tvm

        func = next(v for v in runpy.run_path(str(path)).values()
                    if isinstance(v, tvm.tirx.PrimFunc))  # fmt: skip
        (tmp_path / "db").mkdir()
        database = ms.database.JSONDatabase(work_dir=str(tmp_path / "db"))
        database.commit_workload(tvm.IRModule({"main": func}))
        one_error(cli("tune", "--workloads-from", str(tmp_path / "db"), "--trials", "2",
                      "--records", url), "--workloads-from", fragment)  # fmt: skip
    unchanged()


def test_a_dry_run_checks_the_store_url_and_the_work_dir(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    dry = ["tune", "-w", MM, "--target", TJ, *PLAN]
    one_error(cli(*dry, "--records", "mysql://x"), "--records", "scheme")
    one_error(cli(*dry, "--records", f"sqlite:///{tmp_path}"), "--records", "directory")
    one_error(cli(*dry, "--work-dir", str(tmp_path / "file" / "w")), "--work-dir")
    one_error(cli("tune", "-w", MM, "--target", TJ, "--trials", "2", "--records",
                  f"sqlite:///{tmp_path / 'r.db'}", "--work-dir", str(tmp_path / "file")),
              "--work-dir")  # fmt: skip
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # no store was created


def test_a_dry_run_names_the_draft_options_given(cli: Cli) -> None:
    for strategy, options, name in [
        ("draft-verify", ["seeds=0", "population=64"], "DraftThenVerify(population=64, seeds=0)"),
        ("alt", ["seeds=0"], "DraftThenVerify(validity=1, pingpong=1, seeds=0)"),
        ("alt", ["validity=0"], "DraftThenVerify(pingpong=1)"),  # a default given wins too
        ("draft-verify", [], "DraftThenVerify"),
    ]:
        given = [a for option in options for a in ("--draft-option", option)]
        code, out, err = cli("tune", "-w", MM, "--target", TJ, "--trials", "4", "--dry-run",
                             "--json", "--cost-model", "random", "--strategy", strategy,
                             *given)  # fmt: skip
        assert code == 0, err
        assert json.loads(out)["strategy"] == name


def test_a_refused_import_creates_no_store(cli: Cli, tmp_path: Path) -> None:
    one_error(cli("records", "import", str(tmp_path / "nodb"), "--records",
                  f"sqlite:///{tmp_path / 'new.db'}"), "DIR|URL")  # fmt: skip
    assert not (tmp_path / "new.db").exists()


def test_a_spec_given_twice_is_one_task_and_one_spec_is_not_split() -> None:
    from tensortune.tuning.tune import plan_tune

    plan = plan_tune([MM, "softmax:4,8", MM], trials=4, target=TARGET, strategy="evolutionary",
                     cost_model="random")  # fmt: skip
    assert [t.name for t in plan.tasks] == [MM, "softmax:4,8"]
    plan = plan_tune(MM, trials=4, target=TARGET, strategy="evolutionary", cost_model="random")
    assert [t.name for t in plan.tasks] == [MM]


def test_json_output_is_strict_json() -> None:
    from tensortune.cli.display import print_json

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_json({"pca": float("nan"), "rows": [1.0, float("inf")], "n": 3})
    assert json.loads(out.getvalue(), parse_constant=pytest.fail) == {
        "pca": None, "rows": [1.0, None], "n": 3}  # fmt: skip


def test_a_missing_model_file_is_refused_when_the_budget_is_already_met(cli: Cli, store) -> None:
    url, unchanged = store  # the store already holds 6 trials of MM
    args = [*TUNE, "--records", url, "--trials", "2", "--cost-model", "missing.ttm"]
    one_error(cli(*args), "--cost-model", "missing.ttm")
    unchanged()


def test_records_commands_leave_an_empty_file_alone(cli: Cli, tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    for command in (["records", "stats"], ["records", "show"], ["records", "export", "out"]):
        one_error(cli(*command, "--records", "sqlite:///empty.db"), "--records", "empty")
        assert empty.stat().st_size == 0
    assert not (tmp_path / "out").exists()


def test_export_into_an_existing_file_is_refused(cli: Cli, store, tmp_path: Path) -> None:
    url, unchanged = store
    (tmp_path / "taken").write_text("mine\n")
    one_error(cli("records", "export", "taken", "--records", url), "DIR", "taken")
    assert (tmp_path / "taken").read_text() == "mine\n"
    unchanged()


# ---- property-based: operator specs and target JSON ----------------------------------------

_numbers = st.one_of(
    st.integers(min_value=-3, max_value=2**40).map(str),
    st.text(alphabet="0123456789x-+ .e", max_size=4),
)
_specs = st.builds(
    lambda op, sep, numbers: f"{op}{sep}{','.join(numbers)}",
    st.sampled_from([*sorted(OPS), "nosuchop", "", "Matmul"]),
    st.sampled_from([":", ":", "", "::", ";"]),
    st.lists(_numbers, max_size=9),
)
_HYPOTHESIS = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@_HYPOTHESIS
@given(spec=_specs)
def test_any_spec_is_planned_or_refused_in_one_line(cli: Cli, store, spec: str) -> None:
    assume(not spec.startswith("-"))  # an option to the parser, not a spec
    url, unchanged = store
    result = cli("tune", "-w", spec, "--target", TJ, "--records", url, *PLAN)
    if result[0] == 0:
        assert json.loads(cli("tune", "-w", spec, "--target", TJ, *PLAN, "--json")[1])["tasks"]
    else:
        one_error(result, "--workload")
    unchanged()


_targets = st.fixed_dictionaries(
    {
        "kind": st.one_of(
            st.sampled_from(["llvm", "cuda", "c", "nosuch", "LLVM"]), st.text(max_size=5)
        )
    },
    optional={
        "mcpu": st.one_of(
            st.sampled_from(["znver4", "skylake-avx512", "haswell", "nosuchcpu", ""]),
            st.text(max_size=6),
            st.integers(),
        ),
        "num-cores": st.one_of(
            st.integers(min_value=-2, max_value=4), st.booleans(), st.text(max_size=3), st.floats()
        ),
        "nosuch-attr": st.integers(),
    },
)
_target_texts = st.one_of(
    _targets.map(json.dumps),
    st.text(max_size=12),
    st.sampled_from(["llvm", "{", "[]", "null", '{"kind": 3}', "{}"]),
)


@_HYPOTHESIS
@given(text=_target_texts)
def test_any_target_is_planned_or_refused_in_one_line(cli: Cli, store, text: str) -> None:
    assume(not text.startswith("-"))
    url, unchanged = store
    result = cli("tune", "-w", MM, "--target", text, "--records", url, *PLAN)
    if result[0] == 0:
        assert json.loads(text)["kind"] == "llvm"  # only CPU targets can be measured here
    else:
        one_error(result, "--target")
    unchanged()


def test_a_target_whose_code_this_cpu_cannot_run_is_refused_before_any_work(
    cli: Cli, store, monkeypatch, tmp_path
) -> None:
    # Every candidate would die of SIGILL and be recorded as a crash (``dataset collect``'s
    # default configuration is AVX-512 code; an AMD Zen 3 runs AVX2 only).
    import tensortune.hardware.fingerprint as fingerprint
    from tensortune.collect import collect
    from tensortune.errors import TensortuneError

    info = fingerprint.cpuinfo()
    if "avx2" not in info.get("flags", "").split():
        pytest.skip("not an x86 CPU with AVX2")
    shown = " ".join(f for f in info["flags"].split() if not f.startswith(("avx2", "avx512")))
    monkeypatch.setattr(fingerprint, "cpuinfo", lambda: {**info, "flags": shown})
    url, unchanged = store
    haswell = json.dumps({"kind": "llvm", "mcpu": "haswell", "num-cores": 1})
    one_error(cli("tune", "-w", MM, "--target", haswell, "--records", url, *PLAN), "--target",
              "avx2", "which this CPU lacks")  # fmt: skip
    unchanged()
    with pytest.raises(TensortuneError, match=r"avx512.*which this CPU lacks"):
        collect(["gpt2-block"], configs=["avx512-2c"], records=url)
    unchanged()
    # transfer found it only when it came to measure: the model loaded, its store created
    from tensortune.transfer.run import transfer

    with pytest.raises(TensortuneError, match=r"avx2.*which this CPU lacks") as e:
        transfer(url, workloads=[MM], records=f"sqlite:///{tmp_path / 'new.db'}", target=haswell)
    assert e.value.param == "target" and not (tmp_path / "new.db").exists()
    unchanged()


# ---- what a user expects besides errors ----------------------------------------------------


def test_version(cli: Cli) -> None:
    from tensortune import __version__

    assert cli("--version") == (0, f"tensortune {__version__}\n", "")


def test_debug_works_after_the_subcommand(cli: Cli) -> None:
    code, _, err = cli("tune", "-w", "nosuchop:1", "--target", TJ, "--debug")
    assert code == 2
    assert "Traceback (most recent call last)" in err
    assert err.splitlines()[-1].startswith("error: --workload: unknown operator 'nosuchop'")


def test_no_arguments_print_help(cli: Cli) -> None:
    code, out, err = cli()
    assert code == 0 and err == ""
    assert "tune" in out and "records" in out


def _commands() -> list[tuple[str, click.Command]]:
    def walk(prefix: str, command: click.Command) -> list[tuple[str, click.Command]]:
        found = [(prefix, command)]
        for name, sub in getattr(command, "commands", {}).items():
            found += walk(f"{prefix} {name}".strip(), sub)
        return found

    return walk("", typer.main.get_command(app))


@pytest.mark.parametrize("name", [n for n, _ in _commands()])
def test_help_has_a_description_an_example_and_a_text_per_option(cli: Cli, name: str) -> None:
    command = dict(_commands())[name]
    assert command.help and command.help.strip()
    if not hasattr(command, "commands"):  # a group lists its commands instead
        assert "Example: tensortune" in command.help, name
    for param in command.params:
        if isinstance(param, click.Option) and param.name != "help":
            assert param.help and param.help.strip(), f"{name} {param.opts}"
    code, out, _ = cli(*name.split(), "--help")
    assert code == 0
    assert "<bool>" not in out and "BOOLEAN" not in out


def test_native_messages_go_to_the_log(cli: Cli) -> None:
    from tensortune.cli.app import _native_stderr_to_log

    with _native_stderr_to_log():
        os.write(2, b"[12:00:00] some.cc:1: Warning: from C++\n")
        print("a Python warning", file=sys.stderr)
    _, _, err = cli("--version")
    assert "from C++" not in err
    assert "from C++" in native_log().read_text()


def test_native_messages_of_a_command_that_died_reach_the_log_next_time(cli: Cli) -> None:
    """The messages went to an anonymous file, copied into the log at the end: a command
    killed by a segmentation fault or LLVM's abort lost the lines that said why."""

    from tensortune.cli.app import _native_stderr_to_log, _scope

    directory = native_log().parent
    directory.mkdir(parents=True, exist_ok=True)
    with _native_stderr_to_log():
        os.write(2, b"LLVM ERROR: out of registers\n")
        (mine,) = directory.glob(f"native-{os.getpid()}-*.part")  # on disk while it runs
        assert b"LLVM ERROR" in mine.read_bytes()
    assert not mine.exists()

    def gone() -> str:  # the pid of a process that has ended
        ran = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                             capture_output=True, text=True, check=True)  # fmt: skip
        return ran.stdout.strip()

    scope = _scope()
    dead = directory / f"native-{gone()}-{scope}.part"
    dead.write_bytes(b"--- tensortune compile resnet18\nLLVM ERROR: it died here\n")
    quiet = directory / f"native-{gone()}-{scope}.part"  # it said nothing
    quiet.write_bytes(b"--- tensortune tune\n")
    rebooted = directory / f"native-{os.getpid()}-x{scope[1:]}.part"  # an earlier boot's
    rebooted.write_bytes(b"--- tensortune tune --model bert\nbefore the reboot\n")
    alive = directory / f"native-1-{scope}.part"  # pid 1 lives: its file is left alone
    other = directory / f"native-{gone()}-{scope[:8]}9{scope[8:]}.part"  # another container's
    for part in (alive, other):
        part.write_bytes(b"--- tensortune tune\nstill running\n")
    # And this very pid's, left by a dead command it was reused from: not wiped at the start.
    (directory / f"native-{os.getpid()}-{scope}.part").write_bytes(b"--- tensortune x\nreused\n")
    assert cli("--version")[0] == 0  # a command with nothing to say sweeps up too
    log = native_log().read_text()
    assert "--- tensortune compile resnet18 (it ended without a word" in log
    for said in ("LLVM ERROR: it died here", "before the reboot", "reused"):
        assert said in log
    assert "still running" not in log
    assert not dead.exists() and not quiet.exists() and not rebooted.exists()
    assert alive.exists() and other.exists()
    alive.unlink()
    other.unlink()


# ---- records show, --json, export/import names ---------------------------------------------


def test_records_show_lists_the_best_program(cli: Cli, store) -> None:
    url, unchanged = store
    code, out, err = cli("records", "show", "--records", url)
    assert code == 0, err
    row = next(line for line in out.splitlines() if MM in line)
    assert "1.00 ms" in row and " 6 " in row and " 5 " in row  # best, trials, ok

    code, out, _ = cli("records", "show", "--records", url, "--json")
    (best,) = json.loads(out)
    assert best["workload"] == MM and best["trials"] == 6 and best["ok"] == 5
    assert best["best_seconds"] == pytest.approx(1e-3)
    assert best["gflops"] == pytest.approx(2 * 16**3 / 1e-3 / 1e9)

    code, out, _ = cli("records", "show", "--records", url, "--tir", "-w", "matmul")
    assert code == 0
    assert "T.prim_func" in out and "def main" in out  # the scheduled program itself
    code, out, _ = cli("records", "show", "--records", url, "-w", "conv2d", "--json")
    assert json.loads(out) == []
    unchanged()


def test_records_show_and_export_find_a_target_measured_elsewhere(cli: Cli, tmp_path) -> None:
    # Records of a target with no num-cores (measured elsewhere): the CLI resolved --target
    # itself, gave it this machine's num-cores and matched nothing; the API matches it as given.
    bare = {"kind": "llvm", "mcpu": "znver3"}
    url = f"sqlite:///{tmp_path / 'b.db'}"
    with open_records(url) as s:
        fill(s, MM, [5e-3, 6e-3, 7e-3], target=bare)
    code, out, err = cli("records", "show", "--records", url, "--target", json.dumps(bare),
                         "--json")  # fmt: skip
    assert code == 0, err
    (best,) = json.loads(out)
    assert best["trials"] == 3 and best["best_seconds"] == pytest.approx(5e-3)
    code, out, err = cli("records", "export", str(tmp_path / "db"), "--records", url,
                         "--target", json.dumps(bare))  # fmt: skip
    assert code == 0, err
    assert "exported 3 records" in out


def test_records_stats_json(cli: Cli, store) -> None:
    url, _ = store
    code, out, err = cli("records", "stats", "--records", url, "--json")
    assert code == 0, err
    stats = json.loads(out)
    assert stats["records"] == 6 and stats["workloads"] == 1


def test_export_and_import_keep_workload_names(cli: Cli, store, tmp_path: Path) -> None:
    url, _ = store
    assert cli("records", "export", "db", "--records", url, "--target", TJ)[0] == 0
    assert cli("records", "import", "db", "--records", "sqlite:///new.db")[0] == 0
    with open_records("sqlite:///new.db") as new:
        assert [w.name for w in new.workloads()] == [MM]
    code, out, _ = cli("tune", "--workloads-from", "db", "--target", TJ, *PLAN, "--json")
    assert code == 0
    assert [t["name"] for t in json.loads(out)["tasks"]] == [MM]
    other = json.dumps({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})
    one_error(
        cli("records", "export", "none", "--records", url, "--target", other),
        "--target",
    )


def test_evaluate_the_default_model_on_records_measured_here(cli: Cli, store) -> None:
    url, _ = store
    assert cli("records", "export", "db", "--records", url)[0] == 0
    code, out, err = cli("evaluate", "--cost-model", "default", "--test-records", "db", "--json")
    assert code == 0, err
    scores = json.loads(out)
    assert scores["programs"] == 6  # the failed one too: its cost is inf, it must rank last
    assert 0 <= scores["pca"] <= 1 and 0 < scores["top1_score"] <= 1
    assert 0 < scores["top5_score"] <= 1


# ---- fast math, Winograd and TVMScript workloads -------------------------------------------

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "attention_softmax.py"


def test_the_tvmscript_example_is_a_workload(cli: Cli) -> None:
    code, out, err = cli("tune", "-w", str(EXAMPLE), "--target", TJ, *PLAN, "--json")
    assert code == 0, err
    (task,) = json.loads(out)["tasks"]
    assert task["name"] == "attention_softmax.attention_softmax"
    assert task["fast_math"] is True  # its T.exp is approximated by default
    code, out, _ = cli("tune", "-w", str(EXAMPLE), "--target", TJ, *PLAN, "--json",
                       "--no-fast-math")  # fmt: skip
    assert json.loads(out)["tasks"][0]["fast_math"] is False


def test_a_model_s_convolutions_are_winograd_unless_told_not_to(cli: Cli) -> None:
    def conv_tasks(*flags: str) -> list[str]:
        code, out, err = cli("tune", "--model", "resnet18", "--target", TJ, *PLAN, "--json",
                             *flags)  # fmt: skip
        assert code == 0, err
        return [t["name"] for t in json.loads(out)["tasks"] if "conv2d" in t["name"]]

    assert any("winograd" in name for name in conv_tasks())
    direct = conv_tasks("--no-winograd")
    assert direct and not any("winograd" in name for name in direct)


# ---- a real run: --json, progress and log names --------------------------------------------


def test_tune_json_and_log_file_names(cli: Cli, tmp_path: Path) -> None:
    code, out, err = cli("tune", "-w", "softmax:8,64", "--trials", "4", "--target", TJ,
                         "--strategy", "replay-trace", "--cost-model", "random", "--json",
                         "--records", "sqlite:///t.db", "--work-dir", "w")  # fmt: skip
    assert code == 0, err
    result = json.loads(out)  # stdout is the JSON object alone
    (task,) = result["tasks"]
    assert task["name"] == "softmax:8,64" and task["trials"] == 4
    assert task["ok"] == 4  # approximated exp within the check's tolerance of the exact build
    logs = [p.name for p in (tmp_path / "w" / "logs").rglob("*") if p.is_file()]
    assert logs
    assert not [n for n in logs if set(n) & set(":,")], logs


def test_tables_fit_100_columns(cli: Cli, store_file: Path, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")  # read at each table, as a terminal's width
    url = f"sqlite:///{store_file}"
    for args in (["records", "stats", "--records", url], ["records", "show", "--records", url],
                 ["workloads", "--no-tasks"]):  # fmt: skip
        code, out, err = cli(*args)
        assert code == 0, err
        lines = out.splitlines()
        assert max(len(line) for line in lines) <= 100, args
        if args[0] == "records":
            assert any(MM in line and "1.00 ms" in line for line in lines), out


def test_records_show_names_a_best_record_whose_trace_is_damaged(cli: Cli, store) -> None:
    import sqlite3

    url, _ = store
    with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
        db.execute("UPDATE records SET trace = 'not json'")
    err = one_error(cli("records", "show", "--records", url, "--tir"), "--records",
                    "best record of workload", "is damaged", "does not replay")  # fmt: skip
    assert "JSONDecodeError" in err


def test_this_machine_is_named_in_records_show(cli: Cli, store) -> None:
    url, _ = store
    here = current_hardware().id
    code, out, _ = cli("records", "show", "--records", url, "--hardware", "nosuchid")
    assert code == 0 and "no records of this hardware" in out
    code, out, _ = cli("records", "show", "--records", url, "--hardware", here, "--json")
    assert len(json.loads(out)) == 1
