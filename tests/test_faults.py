"""The fault-injection suite (``pytest -m faults``): kernels that crash, hang or compute the
wrong thing; a tuner killed with SIGKILL mid-batch and resumed; the PostgreSQL server restarted
mid-run; a truncated SQLite file; a full disk.  (An RPC server killed mid-batch is in
``test_rpc.py``.)

For each, the run goes on or stops with one clear line, the failure is recorded as such, and
the records committed before are all still there once (counted by ``uid``), with no candidate
measured twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import TARGET, Cli, fill

from tensortune.records import open_records

pytestmark = pytest.mark.faults

KERNELS = Path(__file__).parent / "kernels"
MM = "matmul:32,32,32"
# Candidates a batch of the tuners below (``--trials-per-round``); their runs are three batches
# long, so a fault after the first committed batch lands mid-run with work left to resume.
PER_ROUND = 4
TRIALS = 3 * PER_ROUND


def _snapshot(url: str) -> dict[str, tuple]:
    """Every record of the store by uid: (workload, status, trace hash)."""
    from tensortune.records.schema import trace_hash

    with open_records(url, create=False) as store:
        return {r.uid: (r.workload_id, r.status, trace_hash(r.trace)) for r in store.query()}


def _assert_kept(before: dict[str, tuple], after: dict[str, tuple]) -> None:
    assert before.items() <= after.items(), "a committed record was lost or changed"
    per_candidate = Counter((w, h) for w, _, h in after.values())
    assert max(per_candidate.values(), default=1) == 1, "a candidate was measured twice"


def _tune_args(url: str, work: Path, *args: str) -> list[str]:
    """The tuners' command line after ``tensortune`` (a later ``--strategy`` in ``args`` wins)."""
    return ["tune", "--records", url, "--work-dir", str(work), "--strategy", "replay-trace",
            "--cost-model", "random", "--trials-per-round", str(PER_ROUND), *args]  # fmt: skip


def _tuner(url: str, work: Path, *args: str) -> subprocess.Popen:
    # As a terminal starts a command: Ctrl-C handled.  A test run started in the background
    # of a shell without job control (`cmd &` in a script) ignores SIGINT, its children
    # inherit that, and a tuner keeps an ignored SIGINT ignored (as under nohup).
    return subprocess.Popen(
        [sys.executable, "-m", "tensortune.cli.app", *_tune_args(url, work, *args)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "TVM_NUM_THREADS": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def _wait_for(url: str, at_least: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        with contextlib.suppress(Exception), open_records(url, create=False) as store:
            if store.count() >= at_least:
                return
        time.sleep(0.2)
    raise AssertionError(f"fewer than {at_least} records after {timeout} s")


@pytest.fixture
def seeded(tmp_path: Path) -> str:
    """A store that already holds records of other runs, which no fault may touch."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with open_records(url) as store:
        fill(store, "matmul:16,16,16", [1e-3, None, 2e-3])
    return url


# ---- kernels that crash, hang, or compute the wrong thing --------------------------------------


def test_a_segfaulting_kernel_is_recorded_as_a_run_error_and_the_run_goes_on(
    seeded: str, cli: Cli
) -> None:
    before = _snapshot(seeded)
    code, out, err = cli("tune", "--workload", str(KERNELS / "crash.py"), "--workload", MM,
                         "--trials", "16", "--records", seeded, "--strategy", "replay-trace",
                         "--cost-model", "random")  # fmt: skip
    assert code == 0, err
    # the task none of whose programs ran says why (its table row alone said "0 ok")
    assert re.search(r"crash\.\w+: none of its programs ran \(\d+ of \d+: .*SIGSEGV", out), out
    after = _snapshot(seeded)
    _assert_kept(before, after)
    with open_records(seeded) as store:
        crashed = [r for r in store.query() if r.uid not in before and "SIGSEGV" in (r.error or "")]
        fine = [r for r in store.query(ok_only=True) if r.uid not in before]
    assert crashed and all(r.status == "run_error" for r in crashed)
    assert fine  # the other task was measured in the same run


def test_a_hanging_kernel_times_out_is_recorded_and_the_run_goes_on(
    seeded: str, tmp_path: Path
) -> None:
    from tensortune.measure.runner import PersistentRunner, TimingConfig
    from tensortune.tuning.tune import tune

    before = _snapshot(seeded)
    runner = PersistentRunner(TimingConfig(repeat=1, min_repeat_ms=1), num_threads=1, timeout_s=2)
    try:
        started = time.monotonic()
        result = tune([str(KERNELS / "hang.py"), MM], trials=2, records=seeded, target=TARGET,
                      strategy="replay-trace", cost_model="random", runner=runner,
                      work_dir=tmp_path / "w", trials_per_round=1)  # fmt: skip
        took = time.monotonic() - started
    finally:
        runner.close()
    assert took < 120
    after = _snapshot(seeded)
    _assert_kept(before, after)
    statuses = Counter(s for uid, (_, s, _) in after.items() if uid not in before)
    assert statuses["timeout"] >= 1 and statuses["ok"] >= 1
    assert [t.trials for t in result.tasks] == [1, 1]


def test_a_kernel_with_wrong_results_is_recorded_as_such(seeded: str, tmp_path: Path) -> None:
    from tensortune.compat import ArgInfo, BuilderInput, tvm
    from tensortune.measure.builder import PersistentBuilder
    from tensortune.measure.runner import PersistentRunner, TimingConfig, signature_of
    from tensortune.tuning.tune import tune

    # The reference the runner checks against computes C = A + B: every matmul is "wrong".
    a, b = tvm.te.placeholder((32, 32), name="A"), tvm.te.placeholder((32, 32), name="B")
    c = tvm.te.compute((32, 32), lambda i, j: a[i, j] + b[i, j], name="C")
    impostor = tvm.IRModule({"main": tvm.te.create_prim_func([a, b, c])})
    before = _snapshot(seeded)
    builder = PersistentBuilder()
    runner = PersistentRunner(TimingConfig(repeat=1, min_repeat_ms=1), num_threads=1,
                              check_correctness=True)  # fmt: skip
    try:
        (ref,) = builder.build([BuilderInput(impostor, tvm.target.Target(TARGET))])
        runner.add_reference(signature_of(ArgInfo.from_prim_func(impostor["main"])),
                             ref.artifact_path)  # fmt: skip
        tune(
            [MM],
            trials=4,
            records=seeded,
            target=TARGET,
            strategy="replay-trace",
            cost_model="random",
            runner=runner,
            builder=builder,
            work_dir=tmp_path / "w",
        )
    finally:
        runner.close()
        builder.close()
    after = _snapshot(seeded)
    _assert_kept(before, after)
    new = [s for uid, (_, s, _) in after.items() if uid not in before]
    assert new == ["wrong_result"] * 4


# ---- processes and servers that die ------------------------------------------------------------


def test_a_tuner_killed_mid_batch_resumes_and_loses_only_its_batch(
    seeded: str, tmp_path: Path, cli: Cli
) -> None:
    # One task with a large space: every batch is PER_ROUND new programs (a small space's
    # draws may repeat a program, which is measured once, and make a batch smaller).
    workloads = ("--workload", MM, "--trials", str(TRIALS))
    first = _tuner(seeded, tmp_path / "w", *workloads)
    _wait_for(seeded, 3 + PER_ROUND, first)  # at least one batch committed
    os.kill(first.pid, signal.SIGKILL)  # the tuner alone, as the OOM killer does (its workers
    first.communicate(timeout=30)  # die with it: they ask for a signal when their parent does)
    before = _resumed(cli, seeded, tmp_path / "w", workloads)
    assert 3 + PER_ROUND <= len(before) < 3 + TRIALS
    assert (len(before) - 3) % PER_ROUND == 0  # whole batches only
    with open_records(seeded) as store:
        assert store.lease_holders() == set()


def _resumed(cli: Cli, url: str, work: Path, workloads: tuple) -> dict[str, tuple]:
    """Run the stopped tuner's command again (in this process): it keeps every record and tops
    the store (3 records of other runs) up to ``TRIALS``, the stopped run's leases holding
    nothing back; returns the records before."""
    before = _snapshot(url)
    code, _, err = cli(*_tune_args(url, work, *workloads))
    assert code == 0, err[-2000:]
    after = _snapshot(url)
    _assert_kept(before, after)
    assert len(after) - 3 == TRIALS
    return before


@pytest.mark.parametrize("how", ["Ctrl-C", "SIGTERM"])
def test_a_tuner_stopped_by_ctrl_c_or_sigterm_exits_130_and_resumes(
    seeded: str, tmp_path: Path, how: str, cli: Cli
) -> None:
    # TVM hands a KeyboardInterrupt raised inside its callbacks back as a RuntimeError (the
    # run went on, or ended with exit 1); raised through nested callbacks, as std::terminate.
    workloads = ("--workload", MM, "--workload", "softmax:4,256", "--trials", str(TRIALS),
                 "--strategy", "draft-verify")  # fmt: skip
    first = _tuner(seeded, tmp_path / "w", *workloads)
    _wait_for(seeded, 3 + PER_ROUND, first)
    if how == "Ctrl-C":  # a terminal sends it to the whole process group, workers included
        os.killpg(first.pid, signal.SIGINT)
    else:
        os.kill(first.pid, signal.SIGTERM)
    _, err = first.communicate(timeout=120)
    assert first.returncode == 130, err[-2000:]
    assert err.strip().endswith("run the same command to resume"), err[-2000:]
    _resumed(cli, seeded, tmp_path / "w", workloads)


def test_a_worker_timing_a_hanging_kernel_dies_with_its_parent(seeded: str, tmp_path: Path):
    import psutil

    # A worker notices an idle parent's end at its next read; one inside a kernel that never
    # returns would go on for ever (the parent enforced the time limit).
    tuner = _tuner(seeded, tmp_path / "w", "--workload", str(KERNELS / "hang.py"),
                   "--trials", "2", "--trials-per-round", "2")  # fmt: skip
    deadline = time.monotonic() + 120
    busy = None
    # The runner's worker (its output goes to its log), inside the kernel: the kernel's library
    # is loaded and it is busy.  Busy alone is no proof: a worker still importing TVM is busy
    # too, and it would notice its parent's end at its first read.
    while busy is None:
        assert time.monotonic() < deadline and tuner.poll() is None, "the runner never got busy"
        time.sleep(0.1)
        for child in psutil.Process(tuner.pid).children():
            with contextlib.suppress(psutil.Error, OSError):
                if (
                    os.readlink(f"/proc/{child.pid}/fd/1").endswith("runner-worker.log")
                    and "/kernel.so" in Path(f"/proc/{child.pid}/maps").read_text()
                    and child.cpu_percent(interval=0.5) > 50
                ):
                    busy = child
                    break
    os.kill(tuner.pid, signal.SIGKILL)
    tuner.communicate(timeout=30)
    busy.wait(timeout=20)  # psutil.TimeoutExpired: it outlived its parent


def test_the_postgresql_server_restarted_mid_run(postgres_server, postgres_url: str,
                                                tmp_path: Path) -> None:  # fmt: skip
    trials = 4 * PER_ROUND  # three batches left to write across the restart
    run = _tuner(postgres_url, tmp_path / "w", "--workload", MM, "--workload", "softmax:4,256",
                 "--trials", str(trials))  # fmt: skip
    _wait_for(postgres_url, PER_ROUND, run)
    before = _snapshot(postgres_url)
    postgres_server.restart()
    _, err = run.communicate(timeout=300)
    assert run.returncode == 0, err[-2000:]
    after = _snapshot(postgres_url)
    _assert_kept(before, after)
    assert len(after) == trials


# ---- stores that are damaged or full -----------------------------------------------------------


def test_a_truncated_sqlite_file_is_one_line_and_left_as_it_was(seeded: str, cli: Cli) -> None:
    path = Path(seeded.removeprefix("sqlite:///"))
    with open_records(seeded) as store:  # fold the WAL into the file, then cut it in half
        fill(store, MM, [1e-3] * 4)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    for suffix in ("-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    cut = path.read_bytes()
    for args in (("records", "stats"), ("tune", "--workload", MM, "--trials", "4")):
        code, _, err = cli(*args, "--records", seeded)
        assert code == 2 and err.count("\n") == 1 and err.startswith("error: --records:"), err
        assert path.read_bytes() == cut


@contextlib.contextmanager
def _small_disk(root: Path, size: str = "640k"):
    """A directory on a size-limited filesystem (tmpfs), or None where none can be mounted."""
    root.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(root)],
                             capture_output=True).returncode == 0  # fmt: skip
    try:
        yield root if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(root)], check=False)


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    with contextlib.suppress(OSError), filler.open("wb") as f:
        while True:
            f.write(b"\0" * 4096)
            f.flush()
    return filler


def test_a_disk_that_fills_mid_run_stops_it_with_one_line_and_keeps_what_was_committed(
    tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _small_disk(tmp_path / "small", "2m") as disk:
        if disk is None:  # no mount here: the store's writes fail as a full disk makes them
            import sqlite3

            from tensortune.records.sqlite import SQLiteStore

            url = f"sqlite:///{tmp_path / 'r.db'}"
            with open_records(url) as store:
                fill(store, "matmul:16,16,16", [1e-3, 2e-3])
            before = _snapshot(url)

            def full(self, fn):
                raise sqlite3.OperationalError("database or disk is full")

            monkeypatch.setattr(SQLiteStore, "_write", full)
            code, _, err = cli("tune", "--workload", MM, "--trials", "8", "--records", url)
            assert code == 2 and err.count("\n") == 1 and "disk full" in err, err
            monkeypatch.undo()
            _assert_kept(before, _snapshot(url))
            return
        url = f"sqlite:///{disk / 'r.db'}"
        run = _tuner(url, tmp_path / "w", "--workload", MM, "--workload", "softmax:4,256",
                     "--trials", "400")  # fmt: skip
        _wait_for(url, PER_ROUND, run)
        before = _snapshot(url)
        filler = _fill(disk)
        _, err = run.communicate(timeout=300)
        lines = err.strip().splitlines()
        assert run.returncode == 2 and len(lines) == 1 and "disk full" in lines[0], err[-3000:]
        # reading needs no room: what was committed can be looked at while the disk is full
        code, out, err = cli("records", "stats", "--records", url, "--json")
        assert code == 0, err
        filler.unlink()
        after = _snapshot(url)
        assert PER_ROUND <= len(after) < 400
        assert json.loads(out)["records"] == len(after)
        _assert_kept(before, after)


def test_a_results_file_a_full_disk_cuts_short_is_the_old_one(tmp_path: Path, monkeypatch):
    """``bench tune`` resumes from its ``results.json`` and ``bench e2e`` from its tuning
    summaries: written in place, a full disk left half a file, and every method already run
    was lost with it."""
    import errno

    import tensortune.files as files
    from tensortune.compare.e2e import _tuned_before
    from tensortune.files import write_atomically

    path = tmp_path / "results.json"
    write_atomically(path, json.dumps({"trials": 64, "seconds": 12.5}))
    real_fsync = os.fsync

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(path, json.dumps({"trials": 128, "seconds": 30.0}))
    monkeypatch.setattr(files.os, "fsync", real_fsync)
    assert json.loads(path.read_text()) == {"trials": 64, "seconds": 12.5}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no partial file left
    write_atomically(path, b'{"trials": 128, "seconds": 30.0}')
    assert _tuned_before(path) == {"trials": 128, "seconds": 30.0}
    assert path.stat().st_mode & 0o777 == 0o666 & ~_umask()  # not a private temporary file's
    # A summary cut short by an older version reads as a tuning that did not finish.
    for cut in ('{"trials": 12', "", '{"trials": 12}', "[1, 2]"):
        path.write_text(cut)
        assert _tuned_before(path) is None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
