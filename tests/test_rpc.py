"""Measuring on a device farm (``measure/rpc.py``, ``tensortune serve``, ``tune --runner``):
a real TVM RPC tracker and real servers on 127.0.0.1, each in a process group of its own that
the fixtures kill (TVM's processes fork children that would otherwise keep their ports).

Servers whose sessions are counted are watched through their forked session children: TVM's
server forks one per session, so the children seen during a batch are the sessions it served.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from conftest import TARGET, Cli, other_hardware, platform

from tensortune.compat import RunnerInput
from tensortune.errors import TensortuneError
from tensortune.hardware import current_hardware
from tensortune.measure.builder import PersistentBuilder
from tensortune.measure.rpc import (
    HARDWARE_FUNCTION,
    RPCFarm,
    farm_runner,
    farm_servers,
    parse_runner_url,
    remote_hardware,
    remote_platform,
    runner_from,
)
from tensortune.measure.runner import TimingConfig
from tensortune.measure.status import run_seconds
from tensortune.search.space import sample_candidates
from tensortune.workloads.sources import task_from_spec

HOST = "127.0.0.1"
MM = "matmul:64,64,64"
START_S = 60.0  # a process that has not registered by then is broken (2 loaded cores: ~3 s)
FAST = TimingConfig(number=1, repeat=3, min_repeat_ms=1)
# The tracker itself, run in this process's way of hiding torch (TVM's own launcher imports
# it twice, ~5 s); it is TVM's tracker all the same.
TRACKER = (
    "import sys, tensortune.compat; from tvm.rpc.tracker import PopenTrackerServerState as T; "
    "port = int(sys.argv[1]); T('127.0.0.1', port, port + 1, silent=True).thread.join()"
)
# A server stating its hardware: the Python API's ``hardware=`` (for devices whose own
# fingerprint is wrong), used here so that an answer can only have come through RPC.
STATED = (
    "import sys; from tensortune.hardware import Hardware; from tensortune.measure.rpc import "
    "serve; serve(sys.argv[1], sys.argv[2], port=int(sys.argv[3]), "
    "hardware=Hardware.from_json(sys.argv[4]))"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _wait(
    ready: Callable[[], bool], what: str, procs: list[subprocess.Popen], poll_s: float = 0.1
) -> None:
    deadline = time.monotonic() + START_S
    while not ready():
        for p in procs:
            if p.poll() is not None:  # its log says why (a missing tornado, a taken port...)
                log = Path(getattr(p, "log_path", "")).read_text(errors="replace")[-2000:]
                raise AssertionError(f"{what}: {p.args} exited with {p.returncode}:\n{log}")
        assert time.monotonic() < deadline, f"{what} not within {START_S:.0f} s"
        time.sleep(poll_s)


class Lab:
    """A tracker and the servers started for the tests, all killed by :meth:`close`."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.procs: list[subprocess.Popen] = []
        self.port = _free_port()
        self.tracker = self._spawn("tracker", ["-c", TRACKER, str(self.port)])
        _wait(self._reachable, "the tracker", [self.tracker])

    def farm(self, key: str) -> RPCFarm:
        return RPCFarm(HOST, self.port, key)

    def url(self, key: str) -> str:
        return str(self.farm(key))

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.logs / f"{name}-{len(self.procs)}.log", "wb")  # noqa: SIM115
        with log:  # the child keeps its own descriptor
            proc = subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
        proc.log_path = log.name  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def _reachable(self) -> bool:
        try:
            self.summary()
        except TensortuneError:
            return False
        return True

    def summary(self) -> dict:
        from tensortune.measure.rpc import tracker_summary

        return tracker_summary(self.farm("-"), timeout_s=5)

    def free(self, key: str) -> int:
        return int(self.summary()["queue_info"].get(key, {}).get("free", 0))

    def serve(self, key: str, count: int = 1, *, how: str = "cli", hardware=None) -> list:
        """``count`` servers under ``key``, started at once and registered when this returns:
        ``tensortune serve`` (``cli``), TVM's own (``tvm``) or the API stating ``hardware``."""
        tracker = f"{HOST}:{self.port}"
        started = []
        for _ in range(count):
            port = str(_free_port())
            args = {
                "cli": ["-m", "tensortune.cli.app", "serve", "--tracker", tracker, "--key", key,
                        "--host", HOST, "--port", port],
                "tvm": ["-m", "tvm.exec.rpc_server", "--host", HOST, "--port", port,
                        "--port-end", str(int(port) + 1), "--tracker", tracker, "--key", key,
                        "--custom-addr", HOST, "--silent"],
                "stated": ["-c", STATED, tracker, key, port,
                           hardware.to_json() if hardware else ""],
            }[how]  # fmt: skip
            started.append(self._spawn(f"{how}-{key}", args))
        _wait(lambda: self.free(key) >= count, f"{count} server(s) under {key!r}", started)
        return started

    def wait_free(self, key: str, count: int) -> None:
        """Servers register again a moment after each session: wait for ``count``."""
        _wait(lambda: self.free(key) >= count, f"{count} free under {key!r}", [])

    def kill(self, proc: subprocess.Popen) -> None:
        """SIGKILL ``proc``'s process group: TVM's session children too.

        Only while ``proc`` is unreaped (its pid, the group's id, cannot have been reused).
        """
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def close(self) -> None:
        for proc in reversed(self.procs):
            self.kill(proc)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory):
    lab = Lab(tmp_path_factory.mktemp("rpc-logs"))
    try:
        yield lab
    finally:
        lab.close()


@pytest.fixture(scope="module")
def farm(lab: Lab) -> tuple[RPCFarm, list[subprocess.Popen]]:
    """Two ``tensortune serve`` servers under one key, and their processes."""
    return lab.farm("farm"), lab.serve("farm", 2)


@pytest.fixture(scope="module")
def stated(lab: Lab) -> str:
    """The URL of a key whose one server states other hardware than this machine's."""
    lab.serve("stated", how="stated", hardware=other_hardware())
    return lab.url("stated")


@pytest.fixture(scope="module")
def built():
    """Eight built candidates of MM (artifacts kept for the whole module): runner inputs."""
    task = task_from_spec(MM)
    cands = sample_candidates(task.mod, platform(TARGET), 8, seed=0)
    builder = PersistentBuilder(max_workers=2, timeout_s=60)
    try:
        from tensortune.compat import BuilderInput

        results = builder.build([BuilderInput(c.sch.mod, platform(TARGET).tvm_target)
                                 for c in cands])  # fmt: skip
        assert all(r.error_msg is None for r in results), [r.error_msg for r in results]
        yield [RunnerInput(r.artifact_path, "cpu", c.args_info)
               for r, c in zip(results, cands, strict=True)]  # fmt: skip
    finally:
        builder.close()


class Sessions:
    """The session children each server forks while a batch runs (sampled every 5 ms)."""

    def __init__(self, servers: list[subprocess.Popen]) -> None:
        self.seen: dict[int, set[int]] = {p.pid: set() for p in servers}
        self._since: dict[int, float] = {}  # session child -> when first seen (monotonic)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            for pid, seen in self.seen.items():
                with contextlib.suppress(psutil.NoSuchProcess):
                    for child in psutil.Process(pid).children():
                        seen.add(child.pid)
                        self._since.setdefault(child.pid, time.monotonic())
            time.sleep(0.005)

    def in_session(self, pid: int, age_s: float) -> bool:
        """Whether server ``pid`` has had a session going for ``age_s`` seconds: past its
        start and, with ``age_s`` well under a session's length, before its answer.  (The
        process start times the kernel gives are not precise enough for this.)"""
        try:
            children = psutil.Process(pid).children()
        except psutil.NoSuchProcess:
            return False
        now = time.monotonic()
        return any(now - self._since.get(c.pid, now) >= age_s for c in children)

    def __enter__(self) -> Sessions:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _one_line(e: pytest.ExceptionInfo, *fragments: str) -> str:
    text = str(e.value)
    assert e.value.param == "runner", text
    assert "\n" not in text, text
    for fragment in fragments:
        assert fragment in text, text
    return text


# ---- runner URLs ------------------------------------------------------------------------------


def test_a_runner_url_names_the_tracker_and_the_key() -> None:
    assert parse_runner_url("rpc://127.0.0.1:9190/epyc-2c") == RPCFarm("127.0.0.1", 9190, "epyc-2c")
    assert parse_runner_url("rpc://[::1]:9190/k").host == "::1"
    assert str(RPCFarm("farm.local", 9190, "a_b.1")) == "rpc://farm.local:9190/a_b.1"
    p = platform(TARGET)
    assert runner_from("local", p) == (None, p)
    assert runner_from(None, p) == (None, p)


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("rpc://127.0.0.1:9190", "names no server key"),
        ("rpc://127.0.0.1:9190/", "names no server key"),
        ("rpc://127.0.0.1/k", "port must be a number"),
        ("rpc://127.0.0.1:http/k", "port 'http' must be a number"),
        ("rpc://127.0.0.1:70000/k", "port '70000' must be a number"),
        ("rpc://:9190/k", "names no tracker host"),
        ("rpc://[::1:9190/k", "Invalid IPv6 URL"),
        ("rpc://127.0.0.1:9190/a/b", "must be letters, digits"),
        ("rpc://127.0.0.1:9190/k?x=1", "nothing else"),
        ("http://127.0.0.1:9190/k", "'http://' is not a runner scheme"),
        ("127.0.0.1:9190/k", "must be 'local' or rpc://HOST:PORT/KEY"),
        ("remote", "must be 'local' or rpc://HOST:PORT/KEY"),
    ],
)
def test_a_malformed_runner_url_is_one_line(url: str, fragment: str) -> None:
    with pytest.raises(TensortuneError) as e:
        runner_from(url, platform(TARGET))
    _one_line(e, fragment)


def test_an_unreachable_tracker_is_one_line_before_anything_is_measured(cli: Cli) -> None:
    url = f"rpc://{HOST}:{_free_port()}/k"  # nothing listens there
    start = time.monotonic()
    with pytest.raises(TensortuneError) as e:
        runner_from(url, platform(TARGET))
    _one_line(e, "cannot reach the TVM RPC tracker", "refused")
    assert time.monotonic() - start < 5  # not TVM's minute of reconnecting

    mm = "matmul:16,16,16"
    code, out, err = cli("tune", "-w", mm, "--target", json.dumps(TARGET), "--runner", url)
    assert (code, out) == (2, "")
    assert err.splitlines() == [f"error: --runner: cannot reach the TVM RPC tracker at "
                                f"{url[6:url.rindex('/')]}: Connection refused"]  # fmt: skip
    code, out, err = cli("serve", "--tracker", url[6 : url.rindex("/")], "--key", "k")
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith("error: --tracker: cannot reach the TVM RPC tracker"), err


def test_a_server_address_tuners_cannot_reach_is_refused_and_an_open_one_warned_of(cli: Cli):
    """The tracker hands tuners the address ``serve --host`` names: 0.0.0.0 sent them to their
    own machine.  And a server other machines reach runs whatever code it is sent."""
    tracker = f"{HOST}:{_free_port()}"  # nothing listens there: nothing gets as far
    for wildcard in ("0.0.0.0", "::", "0"):  # "0" names 0.0.0.0 too
        code, out, err = cli("serve", "--tracker", tracker, "--key", "k", "--host", wildcard)
        assert (code, out) == (2, "") and len(err.splitlines()) == 1, err
        assert err.startswith(f"error: --host: {wildcard} listens on every interface"), err
    from tensortune.measure.rpc import serve

    with pytest.warns(UserWarning, match="no authentication"), pytest.raises(TensortuneError):
        serve(tracker, "k", host="192.0.2.1")  # an address of the farm's network
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # loopback: no warning
        with pytest.raises(TensortuneError, match="cannot reach the TVM RPC tracker"):
            serve(tracker, "k", host=HOST)


# ---- the farm's hardware ----------------------------------------------------------------------


def test_a_key_without_servers_is_one_line(lab: Lab) -> None:
    with pytest.raises(TensortuneError) as e:
        farm_servers(lab.farm("nobody"))
    _one_line(e, "no server under key 'nobody'", "tensortune serve --tracker")


def test_tvms_own_server_is_refused_rather_than_recorded_as_this_machine(lab: Lab) -> None:
    lab.serve("plain", how="tvm")
    with pytest.raises(TensortuneError) as e:
        runner_from(lab.url("plain"), platform(TARGET))
    _one_line(e, "cannot say what hardware it is", "tensortune serve")


def test_the_remote_hardware_comes_through_rpc(lab: Lab, farm, stated: str, cli: Cli) -> None:
    lab.wait_free("farm", 2)
    assert remote_hardware(farm[0], 2) == current_hardware()  # both servers are this machine

    # A server stating other hardware: what comes back can only have come through RPC.
    p = platform(TARGET)
    remote = remote_platform(p, parse_runner_url(stated))
    assert remote.hardware == other_hardware() and remote.target == p.target and remote.key == p.key

    code, out, err = cli("tune", "-w", "matmul:16,16,16", "--target", json.dumps(TARGET),
                         "--runner", stated, "--dry-run", "--json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["hardware"] == other_hardware().id != current_hardware().id
    # the same from the API: a dry run for the farm is a plan for its hardware
    from tensortune.tuning.tune import plan_tune

    plan = plan_tune(["matmul:16,16,16"], trials=8, target=TARGET, farm=stated)
    assert plan.platform.hardware == other_hardware() and plan.platform.key == p.key


def test_tune_on_the_farm_records_the_remote_hardware(stated: str, cli: Cli, tmp_path) -> None:
    from tensortune.records import open_records

    url = f"sqlite:///{tmp_path / 'r.db'}"
    # --check is on by default, and the farm's runner compares no outputs: said, not hidden
    with pytest.warns(UserWarning, match="outputs are not checked against the workload"):
        code, out, err = cli("tune", "-w", "matmul:16,16,16", "--target", json.dumps(TARGET),
                             "--runner", stated, "--trials", "8", "--strategy",
                             "replay-trace", "--cost-model", "random", "--records", url,
                             "--json")  # fmt: skip
    assert code == 0, err
    result = json.loads(out)
    other = other_hardware()
    assert result["hardware_id"] == other.id and result["tasks"][0]["ok"] == 8
    with open_records(url) as store:
        assert store.hardware() == {other.id: other}
        assert store.count(hardware_id=other.id, ok_only=True) == 8


def test_the_target_is_checked_against_the_servers_cpu_not_this_ones(
    lab: Lab, stated: str, cli: Cli
) -> None:
    import dataclasses

    from tensortune.hardware.fingerprint import ISA_FLAGS

    # Servers with every x86 extension run code for a Sapphire Rapids, whatever CPU tunes.
    every = tuple(f for f in ISA_FLAGS if f not in ("asimd", "sve", "sve2"))
    amx = dataclasses.replace(other_hardware(), arch="x86_64", isa=every)
    lab.serve("amx", how="stated", hardware=amx)
    spr = {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2}
    code, out, err = cli("tune", "-w", "matmul:16,16,16", "--target", json.dumps(spr),
                         "--runner", lab.url("amx"), "--dry-run", "--json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["hardware"] == amx.id
    # Servers without AVX-512 cannot run AVX-512 code, though this machine may.
    code, _, err = cli("tune", "-w", "matmul:16,16,16", "--target", json.dumps(
        {**spr, "mcpu": "skylake-avx512"}), "--runner", stated, "--dry-run")  # fmt: skip
    assert code == 2 and "avx512f" in err and "Other CPU 9000 (test)) lacks" in err, err
    assert len(err.strip().splitlines()) == 1
    # A server that could not read its CPU's flags says nothing to refuse a target by.
    from tensortune.hardware import Platform

    Platform(spr, dataclasses.replace(amx, isa=())).check_runs_here()


def test_servers_under_one_key_must_be_the_same_hardware(lab: Lab) -> None:
    lab.serve("mixed", how="stated", hardware=other_hardware())
    lab.serve("mixed", how="cli")
    lab.wait_free("mixed", 2)
    with pytest.raises(TensortuneError) as e:
        runner_from(lab.url("mixed"), platform(TARGET))
    _one_line(e, "are different hardware", other_hardware().id, current_hardware().id)


# ---- measuring --------------------------------------------------------------------------------


def _ignored(pid: int) -> set[int]:
    """The signals process ``pid`` ignores."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("SigIgn:")), 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


def test_candidates_are_timed_on_every_server_by_workers_that_leave_stops_to_the_tuner(
    lab: Lab, farm, built
) -> None:
    """A graceful stop sent to the whole group (SIGTERM, SIGHUP) killed the farm's workers, and
    their candidates were recorded as failed for good."""
    url, servers = farm
    lab.wait_free(url.key, 2)
    runner, remote = farm_runner(url, platform(TARGET), FAST)
    assert remote.hardware == current_hardware() and runner.servers == 2
    try:
        with Sessions(servers) as sessions:
            results = [f.result() for f in runner.run(built)]
        pool = runner.rpc_runner.pool  # TVM's: its workers stay for the next batch
        workers = [w._proc.pid for w in pool._worker_map.values() if w._proc is not None]
        assert workers
        for pid in workers:
            assert {signal.SIGINT, signal.SIGHUP, signal.SIGTERM} <= _ignored(pid)
    finally:
        runner.close()
    assert [r.error_msg for r in results] == [None] * len(built)
    for r in results:
        assert len(r.run_secs) == 3 and 0 < run_seconds(r.run_secs) < 0.1
    assert all(sessions.seen.values()), sessions.seen  # each server served some


def test_closing_drops_the_queued_candidates(lab: Lab, farm, built) -> None:
    """Closing measured every candidate still queued, each in a session of its own."""
    url, servers = farm
    lab.wait_free(url.key, 2)
    slow = TimingConfig(number=1, repeat=3, min_repeat_ms=100)  # sessions of 0.3 s or more
    runner, _ = farm_runner(url, platform(TARGET), slow)
    try:
        with Sessions(servers) as sessions:
            futures = runner.run(built)  # 8 candidates, 2 at a time
            _wait(lambda: any(sessions.in_session(p.pid, 0.05) for p in servers),
                  "a session under way", [], poll_s=0.005)  # fmt: skip
            runner.close()  # the old pool measured the whole queue in here
        assert sum(len(s) for s in sessions.seen.values()) <= len(servers), futures  # in flight
    finally:
        runner.close()


def test_sessions_run_the_targets_threads_and_no_more_than_the_servers_have(lab: Lab, farm) -> None:
    from tensortune.compat import ms
    from tensortune.measure.rpc import _session_with_threads

    url, _ = farm
    cores = current_hardware().cores
    config = ms.runner.RPCConfig(tracker_host=HOST, tracker_port=lab.port, tracker_key=url.key,
                                 session_timeout_sec=30)  # fmt: skip
    for threads in sorted({1, cores}):  # TVM alone would run 1 thread here
        session = _session_with_threads(config, threads)
        assert session.get_function("runtime.NumThreads")() == threads
        del session

    with pytest.raises(TensortuneError) as e:
        farm_runner(url, platform({"kind": "llvm", "num-cores": cores + 2}))
    assert e.value.param == "target"
    assert f"num-cores {cores + 2} is more than the {cores} cores of the servers" in str(e.value)


@pytest.mark.faults
@pytest.mark.parametrize("when", ["mid-session", "idle"])
def test_a_server_that_stops_answering_costs_its_candidate(
    lab: Lab, built, monkeypatch, when: str
) -> None:
    # Stopped, as a machine that lost power: no FIN, no RST. Mid-session, the tuner waited for
    # ever on its answer; idle (still listed, its kernel accepting the connection), on the
    # handshake.
    import tensortune.measure.rpc as rpc

    key = f"frozen-{when}"
    (frozen,) = lab.serve(key, 1)
    lab.wait_free(key, 1)
    monkeypatch.setattr(rpc, "CLIENT_MARGIN_S", 1.0)
    # Each wait as short as it may be: idle, the handshake times out whatever its length;
    # mid-session, the session (0.3 s or more) is stopped 0.05 s into it.
    monkeypatch.setattr(rpc, "QUEUE_TIMEOUT_S", 1.0 if when == "idle" else 2.0)
    timing = TimingConfig(number=1, repeat=3, min_repeat_ms=100)
    runner, _ = farm_runner(lab.farm(key), platform(TARGET), timing, session_timeout_s=1)
    try:
        with Sessions([frozen]) as sessions:
            if when == "idle":
                os.killpg(frozen.pid, signal.SIGSTOP)
            futures = runner.run(built[:1])
            if when == "mid-session":
                _wait(lambda: sessions.in_session(frozen.pid, 0.05), "a session", [],
                      poll_s=0.005)  # fmt: skip
                os.killpg(frozen.pid, signal.SIGSTOP)
            start = time.monotonic()
            try:
                (result,) = [f.result() for f in futures]
            finally:
                os.killpg(frozen.pid, signal.SIGCONT)
        assert time.monotonic() - start < (10 if when == "mid-session" else 15)
        # the worker holding the session ended: its candidate failed, the run goes on
        assert result.error_msg is not None and result.error_msg.startswith("[run_error] rpc"), \
            result.error_msg  # fmt: skip
    finally:
        runner.close()
        lab.kill(frozen)


@pytest.mark.faults
def test_a_server_killed_mid_batch_costs_its_candidate_and_the_rest_go_on(lab: Lab, built) -> None:
    doomed, survivor = lab.serve("fault", 2)
    lab.wait_free("fault", 2)
    # Sessions of 0.3 s or more (3 timings of 100 ms), killed 50 ms into one: mid-session,
    # not while a session that has already answered is ending.
    timing = TimingConfig(number=1, repeat=3, min_repeat_ms=100)
    runner, _ = farm_runner(lab.farm("fault"), platform(TARGET), timing, session_timeout_s=30)
    try:
        start = time.monotonic()
        with Sessions([doomed, survivor]) as sessions:
            futures = runner.run(built[:4])  # one in flight on each server: the doomed one too
            _wait(lambda: sessions.in_session(doomed.pid, 0.05), "a session on the doomed server",
                  [], poll_s=0.005)  # fmt: skip
            lab.kill(doomed)
            results = [f.result() for f in futures]
        assert time.monotonic() - start < 30  # no hang: the lost session fails at once
        failed = [r.error_msg for r in results if r.error_msg is not None]
        assert 1 <= len(failed) <= 2, failed  # the candidate(s) in flight on the killed server
        for message in failed:  # one tagged line, not the RPC worker's traceback
            assert message.startswith("[run_error] rpc: ") and "\n" not in message, message
        assert all(run_seconds(r.run_secs) < 1 for r in results if r.error_msg is None)

        lab.wait_free("fault", 1)
        # The tracker drops the dead server (when it sees its connection close).
        _wait(lambda: farm_servers(lab.farm("fault")) == 1, "the tracker dropping it", [])
        with Sessions([survivor]) as sessions:
            results = [f.result() for f in runner.run(built[:2])]
    finally:
        runner.close()
    assert [r.error_msg for r in results] == [None] * 2
    assert sessions.seen[survivor.pid]


# ``tensortune serve`` with one more function its sessions answer: a call that runs Python
# for a while, as the server's own functions do briefly (hardware, threads).
SLOW_SERVE = (
    "import sys, time, tensortune.compat, tvm_ffi; "
    "tvm_ffi.register_global_func('test.sleep', lambda s: time.sleep(s)); "
    "from tensortune.cli.app import run; sys.exit(run(sys.argv[1:]))"
)


def test_sigterm_stops_a_server_its_sessions_and_frees_its_port(lab: Lab) -> None:
    from tensortune.compat import tvm_rpc

    port = _free_port()
    tracker = f"{HOST}:{lab.port}"
    server = lab._spawn("slow-term", ["-c", SLOW_SERVE, "serve", "--tracker", tracker, "--key",
                                      "term", "--host", HOST, "--port", str(port)])  # fmt: skip
    lab.wait_free("term", 1)
    session = tvm_rpc.connect_tracker(HOST, lab.port).request("term", session_timeout=30)
    # The session's child (forked once the handshake is answered) holds the listening socket.
    _wait(lambda: bool(psutil.Process(server.pid).children()), "the session's child", [server])
    busy = threading.Thread(target=_swallow(session.get_function("test.sleep")), args=(20,),
                            daemon=True)  # fmt: skip
    busy.start()
    time.sleep(0.5)  # the session is in the call, running Python
    # A session taking SIGTERM as its server does (KeyboardInterrupt) would hand it to its
    # client as an RPC error, serve on, and keep the server from exiting.
    server.send_signal(signal.SIGTERM)  # the server process only, not its group
    assert server.wait(timeout=15) == 0
    busy.join(15)
    del session
    assert not [p for p in psutil.process_iter() if _group(p) == server.pid]
    with socket.socket() as s:
        s.bind((HOST, port))  # free again: no orphan kept it


def test_a_session_whose_process_dies_does_not_end_the_server(lab: Lab) -> None:
    from tensortune.compat import tvm_rpc

    (server,) = lab.serve("crash")
    tracker = tvm_rpc.connect_tracker(HOST, lab.port)
    session = tracker.request("crash", session_timeout=30)
    _wait(lambda: bool(psutil.Process(server.pid).children()), "the session's child", [server])
    for child in psutil.Process(server.pid).children():  # a kernel that crashed, say
        child.send_signal(signal.SIGKILL)
    del session
    lab.wait_free("crash", 1)  # serving again, registered with the tracker anew
    assert server.poll() is None
    again = tracker.request("crash", session_timeout=30)
    assert json.loads(again.get_function(HARDWARE_FUNCTION)())["cores"] >= 1
    log = Path(server.log_path).read_text()  # type: ignore[attr-defined]
    assert "a session failed" in log and "lost the tracker" not in log


def _swallow(call: Callable) -> Callable:
    def calling(*args: object) -> None:
        with contextlib.suppress(Exception):  # the session ends under it
            call(*args)

    return calling


def _group(process: psutil.Process) -> int | None:
    try:
        return os.getpgid(process.pid)
    except OSError:
        return None


def test_a_lost_or_expired_session_is_one_tagged_line() -> None:
    from tensortune.measure.rpc import _one_line_error
    from tensortune.measure.status import Status, classify

    lost = (
        'RPCRunner: An exception occurred\nTraceback (most recent call last):\n  File "x.py", '
        "line 1\n    blob = feval(*args)\ntvm.error.InternalError: Check failed: code=kShutdown"
        "\n\nDuring handling of the above exception, another exception occurred:\nTraceback "
        "(most recent call last):\ntvm.error.InternalError: code=1\n"
    )
    assert (
        _one_line_error(lost)
        == "[run_error] rpc: tvm.error.InternalError: Check failed: code=kShutdown"
    )
    expired = "RPCRunner: An exception occurred\nRuntimeError: Your 20s session has expired"
    assert classify(None, _one_line_error(expired)) is Status.TIMEOUT
    assert (
        classify(None, _one_line_error("RPCRunner: Timeout, killed after 20 seconds"))
        is Status.TIMEOUT
    )
