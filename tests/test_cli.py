"""The command line: exit codes, one-line errors, records commands.  Most commands run in this
process (the ``cli`` fixture: the same entry point, a second a command cheaper); what only a
fresh interpreter can check runs as a process of its own (``run_cli``, or one script for all
the one-line errors)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TARGET, fill, other_hardware

from tensortune.compat import ms
from tensortune.hardware import current_hardware
from tensortune.records import open_records
from tensortune.workloads.networks import NETWORKS
from tensortune.workloads.ops import OPS

MM = "matmul:16,16,16"


def run_cli(cwd: Path, *args: str, cache: Path | None = None) -> subprocess.CompletedProcess:
    """``tensortune ARGS`` in a process of its own, in ``cwd``.  It keeps what it caches (the
    machine's speeds, the zoo's task counts) in the suite's cache, measured once for all the
    commands, or in ``cache``."""
    env = dict(os.environ)
    env["COLUMNS"] = "300"  # rich tables and messages on one line each
    if cache is not None:
        env["XDG_CACHE_HOME"] = str(cache)
    env.pop("TENSORTUNE_GPU_INTRINSICS", None)
    return subprocess.run(
        [sys.executable, "-m", "tensortune.cli.app", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def tt(cli, monkeypatch: pytest.MonkeyPatch):
    """``tensortune ARGS`` in this process, in the test's directory, as ``run_cli`` returns it."""
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.delenv("TENSORTUNE_GPU_INTRINSICS", raising=False)

    def call(*args: str) -> subprocess.CompletedProcess:
        code, out, err = cli(*args)
        return subprocess.CompletedProcess(list(args), code, out, err)

    return call


def assert_user_error(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    """Exit code 2, no traceback, exactly one stderr line ``error: ...``; returns that line."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    return lines[0]


TARGET_JSON = json.dumps(TARGET)

BAD_INPUTS = {
    "unknown op": (["tune", "-w", "nosuchop:4,4,4", "-n", "1"], ["unknown operator 'nosuchop'"]),
    "malformed shape": (["tune", "-w", "matmul:4,x,4", "-n", "1"], ["comma-separated integers"]),
    "wrong arity": (["tune", "-w", "matmul:4,4", "-n", "1"], ["matmul takes 3 integers"]),
    "target string": (
        ["tune", "-w", "matmul:4,4,4", "--target", "llvm", "-n", "1"],
        ["target must be a JSON object", "'llvm'"],
    ),
    "target rejected": (
        ["tune", "-w", "matmul:4,4,4", "--target", '{"kind": "nosuchkind"}', "-n", "1"],
        ["TVM rejects target"],
    ),
    "unknown network": (["tune", "-m", "nosuchnet", "-n", "1"], ["unknown network 'nosuchnet'"]),
    "malformed duration": (
        ["tune", "-w", "matmul:4,4,4", "--time", "20x"],
        ["--time: expected a duration such as 20m", "'20x'"],
    ),
    "missing tvmscript": (
        ["tune", "-w", "missing_workload.py", "-n", "1"],
        ["workload file not found", "missing_workload.py"],
    ),
    "not a database dir": (
        ["tune", "--workloads-from", "emptydir", "-n", "1"],
        ["not a MetaSchedule database"],
    ),
    "corrupt records": (
        ["records", "stats", "--records", "sqlite:///garbage.db"],
        ["garbage.db", "file is not a database"],
    ),
    "corrupt records, dry run": (
        ["tune", "-w", MM, "-n", "4", "--records", "sqlite:///garbage.db", "--dry-run"],
        ["garbage.db", "file is not a database"],
    ),
    "export to an empty name": (
        ["records", "export", "", "--records", "sqlite:///garbage.db"],
        ["DIR|URL", "empty name"],
    ),
    "export to a URL without its slashes": (
        ["records", "export", "sqlite:backup.db", "--records", "sqlite:///garbage.db"],
        ["DIR|URL", "lacks the '//' after its scheme"],
    ),
    "unknown network in a transfer pair": (
        ["bench", "transfer", "--pair", "nosuch:resnet18", "--work-dir", "bt"],
        ["--pair", "unknown network 'nosuch'"],
    ),
    "records in no directory, dry run": (
        ["tune", "-w", MM, "-n", "4", "--records", "sqlite:///nodir/r.db", "--dry-run"],
        ["nodir", "does not exist"],
    ),
    "broken model file": (
        ["bench", "tune", "-w", MM, "--moa-source", "garbage.db"],
        ["garbage.db", "not a tensortune cost model file"],
    ),
    "records scheme": (
        ["records", "stats", "--records", "mysql://host/db"],
        ["unsupported records URL scheme"],
    ),
}


def _prepare(cwd: Path) -> None:
    (cwd / "garbage.db").write_bytes(b"\x00garbage, not SQLite\n" * 300)
    (cwd / "emptydir").mkdir()


def _args(case: str) -> list[str]:
    args = BAD_INPUTS[case][0]
    if args[0] == "tune" and "--target" not in args:
        args = [*args, "--target", TARGET_JSON]
    return args


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_user_errors_are_one_line(tmp_path: Path, case: str, tt) -> None:
    _prepare(tmp_path)
    proc = tt(*_args(case))
    assert_user_error(proc, *BAD_INPUTS[case][1])
    assert proc.stdout == ""
    assert not (tmp_path / "tensortune.db").exists()  # nothing tuned, no store created


def test_every_user_error_is_one_line_in_a_process_of_its_own(tmp_path: Path) -> None:
    """What only a fresh interpreter shows (TVM and LLVM loading, a first import's warning)
    must not add a line to any of them either: every case, in turn, in one new process."""
    _prepare(tmp_path)
    cases = sorted(BAD_INPUTS)
    script = (
        "from tensortune.cli.app import run\n"
        f"print([run(args) for args in {[_args(c) for c in cases]!r}])"
    )
    env = {**os.environ, "COLUMNS": "300"}
    for name in ("TENSORTUNE_GPU_INTRINSICS", "TENSORTUNE_DEBUG"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.stdout.strip() == str([2] * len(cases)), proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == len(cases), proc.stderr
    for case, line in zip(cases, lines, strict=True):
        assert line.startswith("error: ") and all(f in line for f in BAD_INPUTS[case][1]), case
    assert not (tmp_path / "tensortune.db").exists()


def test_a_misspelt_workload_or_network_is_refused_before_tvm_or_torch_loads(
    tmp_path: Path,
) -> None:
    # a typo costs a fraction of a second, not the seconds of loading TVM and a cost model
    cases = ["unknown op", "malformed shape", "wrong arity", "unknown network"]
    script = (
        "import sys\nfrom tensortune.cli.app import run\n"
        f"codes = [run(args) for args in {[BAD_INPUTS[c][0] for c in cases]!r}]\n"
        "print(codes, sorted({'tvm', 'torch'} & set(sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.stdout.strip() == "[2, 2, 2, 2] []", proc.stdout + proc.stderr
    for case in cases:
        assert all(f in proc.stderr for f in BAD_INPUTS[case][1]), proc.stderr


@pytest.mark.parametrize("case", ["unknown op", "corrupt records"])
def test_debug_shows_the_traceback(tmp_path: Path, case: str) -> None:
    _prepare(tmp_path)
    args, fragments = BAD_INPUTS[case]
    proc = run_cli(tmp_path, "--debug", *args)
    assert proc.returncode == 2
    assert "Traceback (most recent call last)" in proc.stderr
    assert "Error" in proc.stderr  # the exception class (WorkloadError / RecordsError)
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("error: ")
    assert all(f in last for f in fragments)


def test_error_message_with_brackets(tt) -> None:
    proc = tt("tune", "-w", "x[/]y.py", "--target", TARGET_JSON)
    assert_user_error(proc, "workload file not found", "x[/]y.py")


def test_workloads_lists_ops_and_networks(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, "workloads", "--no-tasks", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    words = set(proc.stdout.replace("│", " ").split())
    assert set(OPS) <= words
    assert set(NETWORKS) <= words
    assert not (tmp_path / "cache").exists()  # --no-tasks imports no network


def test_workloads_shows_op_docs_verbatim(tt) -> None:
    proc = tt("workloads", "--no-tasks")
    assert proc.returncode == 0, proc.stderr
    for d in OPS.values():
        assert d.doc in proc.stdout, d.name


# ---- records commands ------------------------------------------------------------------------


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    url = "sqlite:///" + str(tmp_path / "r.db")
    with open_records(url) as store:
        fill(store, MM, [3e-3, 1e-3, None])
        fill(store, MM, [1e-5], hardware=other_hardware(), seed=1)
    return url


def test_records_stats(tmp_path: Path, store_url: str, tt) -> None:
    proc = tt("records", "stats", "--records", store_url)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    here, other = current_hardware().id, other_hardware()
    assert f"{here} (this machine)" in out
    assert f"{other.id} {other.cpu_model}" in out
    assert f"1: {MM}" in out
    assert "1.00 ms" in out  # best on this machine
    assert "10.0 µs" in out  # best on the other one
    assert "num-cores=2" in out
    assert "4 records, 1 workloads, 2 hardware" in out
    rows = [ln for ln in out.splitlines() if MM in ln]
    assert len(rows) == 2
    mine = next(r for r in rows if "this machine" in r)
    assert [c.strip() for c in mine.split("│")][4:7] == ["3", "2", "1.00 ms"]


def test_records_stats_empty_store(tmp_path: Path, tt) -> None:
    open_records(f"sqlite:///{tmp_path / 'empty.db'}").close()
    proc = tt("records", "stats", "--records", "sqlite:///empty.db")
    assert proc.returncode == 0, proc.stderr
    assert "0 records, 0 workloads, 0 hardware" in proc.stdout


def test_records_stats_does_not_create_a_missing_store(tmp_path: Path, tt) -> None:
    proc = tt("records", "stats", "--records", "sqlite:///typo.db")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --records: no records store at typo.db"
    assert not (tmp_path / "typo.db").exists()


def test_records_export(tmp_path: Path, store_url: str, tt) -> None:
    here = current_hardware().id
    out = tmp_path / "exported"
    proc = tt("records", "export", str(out), "--records", store_url)
    assert proc.returncode == 0, proc.stderr
    assert f"exported 3 records of 1 workloads (hardware {here}) to {out}" in proc.stdout
    assert len(ms.database.JSONDatabase(work_dir=str(out), allow_missing=False)) == 3

    proc = tt("records", "export", str(out), "--records", store_url)
    assert_user_error(proc, "already holds a MetaSchedule database")


def test_records_export_options(tmp_path: Path, store_url: str, tt) -> None:
    proc = tt(
        "records",
        "export",
        str(tmp_path / "top1"),
        "--records",
        store_url,
        "--top-k",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    assert "exported 1 records of 1 workloads" in proc.stdout
    assert len(ms.database.JSONDatabase(work_dir=str(tmp_path / "top1"))) == 1

    other = other_hardware().id
    proc = tt(
        "records",
        "export",
        str(tmp_path / "other"),
        "--records",
        store_url,
        "--hardware",
        other,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"exported 1 records of 1 workloads (hardware {other})" in proc.stdout


@pytest.fixture
def exported(tmp_path: Path, store_url: str) -> Path:
    from tensortune.records.interop import export_records

    with open_records(store_url) as store:
        export_records(store, tmp_path / "exported")
    return tmp_path / "exported"


def test_records_import(tmp_path: Path, exported: Path, tt) -> None:
    here = current_hardware().id
    new = "sqlite:///" + str(tmp_path / "new.db")
    proc = tt("records", "import", str(exported), "--records", new)
    assert proc.returncode == 0, proc.stderr
    assert "imported 3 records of 1 workloads (0 already present) as hardware" in proc.stdout
    assert f"as hardware {here}" not in proc.stdout
    assert "--measured-here" in proc.stdout  # the hint

    proc = tt("records", "import", str(exported), "--records", new)
    assert proc.returncode == 0, proc.stderr
    assert "imported 0 records of 0 workloads (3 already present)" in proc.stdout
    with open_records(new) as store:
        assert store.count() == 3
        assert store.count(hardware_id=here) == 0


def test_records_import_measured_here(tmp_path: Path, exported: Path, tt) -> None:
    here = current_hardware().id
    new = "sqlite:///" + str(tmp_path / "new.db")
    proc = tt("records", "import", str(exported), "--records", new, "--measured-here")
    assert proc.returncode == 0, proc.stderr
    assert f"imported 3 records of 1 workloads (0 already present) as hardware {here}" in (
        proc.stdout
    )
    assert "--measured-here" not in proc.stdout
    with open_records(new) as store:
        assert store.count(hardware_id=here) == 3


def test_records_import_not_a_database(tmp_path: Path, tt) -> None:
    (tmp_path / "emptydir").mkdir()
    proc = tt("records", "import", "emptydir", "--records", "sqlite:///n.db")
    assert_user_error(proc, "emptydir is not a MetaSchedule database")


def test_signals_the_caller_ignores_stay_ignored() -> None:
    # nohup: a closed terminal's SIGHUP stopped the run anyway; a shell's background job
    # (SIGINT ignored) was stopped by a Ctrl-C meant for the foreground command.
    import os
    import signal

    from tensortune import errors
    from tensortune.cli.app import _terminate_as_interrupt

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)}
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with _terminate_as_interrupt():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is errors.interrupt
            with pytest.raises(KeyboardInterrupt), errors.interruptible(graceful=True):
                os.kill(os.getpid(), signal.SIGINT)  # ignored: no effect
                assert not errors.interrupted()
                os.kill(os.getpid(), signal.SIGTERM)  # still a graceful stop
                assert errors.interrupted()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def test_a_metrics_table_shows_undefined_pca_file_names_and_counts(capsys) -> None:
    # finetune's table holds the model file it wrote: formatting every value as a float
    # failed after the model was saved.
    from tensortune.cli.train import _metrics_table

    _metrics_table("t", {"pca": float("nan"), "top1_score": 0.5, "tasks": 3, "out": "mine.ttm"})
    out = capsys.readouterr().out
    assert re.search(r"pca\W+n/a\W", out) and "0.5000" in out and "mine.ttm" in out, out


def test_seconds_read_in_a_unit_that_shows_them() -> None:
    from tensortune.cli.display import fmt_seconds

    # a kernel of a few elements ran in 37 ns, shown as "0.0 µs"
    assert [fmt_seconds(s) for s in (3.7e-8, 2.5e-6, 0.0123, 2.0, None)] == [
        "37.0 ns", "2.5 µs", "12.30 ms", "2.00 s", "-"]  # fmt: skip


def test_a_ratio_near_one_shows_which_side_of_it_it_lies() -> None:
    from tensortune.cli.display import fmt_ratio

    assert [fmt_ratio(x) for x in (0.996, 1.0, 1.004, 1.2345, None)] == [
        "0.996x", "1.00x", "1.004x", "1.23x", "not reached"]  # fmt: skip


def test_ctrl_c_in_the_main_thread_does_not_stop_a_tune_in_another() -> None:
    """The flag Ctrl-C sets was the process's: a notebook's background tune ended its
    searches early, quietly, when a call in the main thread was interrupted."""
    import signal
    import threading

    from tensortune import errors

    inside, seen = threading.Event(), []
    release = threading.Event()

    def background() -> None:
        with errors.interruptible(graceful=True):  # what tune() runs its search in
            inside.set()
            release.wait(30)
            seen.append(errors.interrupted())

    thread = threading.Thread(target=background)
    thread.start()
    assert inside.wait(30)
    with pytest.raises(KeyboardInterrupt), errors.interruptible(graceful=True):
        # raise_signal, not os.kill: the kernel may hand a signal sent to the process to the
        # other thread, and Python then runs the handler after this thread has looked
        signal.raise_signal(signal.SIGINT)  # graceful: remembered
        assert errors.interrupted()  # the main thread's work stops after its batch
        release.set()
        thread.join(30)
    assert seen == [False]
