"""Measuring on a device farm: a TVM RPC tracker with servers registered under a key.

Candidates are built here and uploaded; each is timed in a session on one of the key's
servers.  A user names the farm with a runner URL, ``rpc://HOST:PORT/KEY`` (the tracker's
address and the key).

Records must name the hardware that timed them, which is the remote device's, not this
machine's.  Servers started with ``tensortune serve`` (:func:`serve`) answer for it through a
global function every RPC session can call; a plain ``python -m tvm.exec.rpc_server`` has no
such function, so a farm of those is refused rather than recorded under a wrong hardware id.

Entry points call :func:`runner_from` with what the user gave (``"local"``, ``None`` or a URL)::

    runner, platform = runner_from(spec, platform, timing)  # runner None: measure locally

and then measure with ``runner`` and record under ``platform`` (its hardware is the remote's).
:func:`farm_runner` does the same for a parsed :class:`RPCFarm`.

As with the local ``PersistentRunner``, a kernel runs with the target's ``num-cores`` threads
(a target asking for more than the devices have is refused).  What differs: one candidate is
timed on each server at once (one kernel per device), outputs are not checked against a
reference, and a timing that competed for the CPU is not retried (the remote's load cannot be
seen from here), so servers sharing one machine disturb each other's timings.  A candidate
whose server dies is reported as failed (``[run_error] rpc: ...``); the tracker hands the next
ones to the servers left.  When no server is left, TVM's tracker queues the requests until one
registers again, for up to ``QUEUE_TIMEOUT_S`` a candidate: then it is reported as failed.
Kernels are timed as ``TimingConfig`` says, all alike: the local runner's cold timing of
kernels whose weights outgrow the caches (``model_timing``) is not done here.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import ipaddress
import logging
import math
import multiprocessing
import os
import re
import signal
import socket
import struct
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from tensortune.compat import (
    PyRunner,
    PyRunnerFuture,
    RunnerFuture,
    RunnerInput,
    RunnerResult,
    derived_object,
    ms,
    rpc_base,
    rpc_listen_loop,
    tvm_ffi,
    tvm_rpc,
)
from tensortune.errors import TensortuneError, about, last_line
from tensortune.hardware import Hardware, Platform, current_hardware
from tensortune.measure import names_a_farm
from tensortune.measure.affinity import keep_caller_off_pool_cores
from tensortune.measure.runner import TimingConfig
from tensortune.measure.status import Status, tagged
from tensortune.measure.worker import leave_stops_to_parent

# The global functions of a ``tensortune serve`` server's sessions: its hardware descriptor,
# and the size of the session's thread pool.
HARDWARE_FUNCTION = "tensortune.hardware"
THREADS_FUNCTION = "tensortune.set_threads"
RUNNER_FORMS = "'local' or rpc://HOST:PORT/KEY"
# TVM sends the key in a whitespace-separated handshake and prefixes it with "server:", so a
# key keeps to the characters that survive both.
_KEY = re.compile(r"[A-Za-z0-9._-]+")
# Seconds to reach the tracker: TVM's own client retries a refused connection for 60 s.
TRACKER_TIMEOUT_S = 10.0
# Seconds a session may last before the server ends it: one candidate's upload, load and
# timing, or the hardware query.
SESSION_TIMEOUT_S = 60.0
# Seconds past a session's timeout this side gives up on it, counted from when the session
# opened (not while the tracker queues the request for a free server): a server that lost
# power or its network mid-session sends nothing more, not even the end of the connection.
CLIENT_MARGIN_S = 10.0
# Seconds a candidate may wait for the tracker to hand it a server and for that server to
# answer the handshake: a tracker or an idle server that went silent held it for ever.
QUEUE_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class RPCFarm:
    """A TVM RPC tracker and the key its measuring servers are registered under."""

    host: str
    port: int
    key: str

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return f"rpc://{self.address}/{self.key}"


def parse_runner_url(url: str) -> RPCFarm:
    """The farm of ``rpc://HOST:PORT/KEY``; a malformed URL is refused in one line."""
    if not isinstance(url, str) or "://" not in url:
        raise TensortuneError(f"runner must be {RUNNER_FORMS}, not {url!r}", param="runner")
    try:
        parts = urlsplit(url.strip())
    except ValueError as e:  # "rpc://[::1:9190/key": an IPv6 host left open
        raise TensortuneError(f"runner URL {url!r}: {e} (rpc://HOST:PORT/KEY)",
                              param="runner") from None  # fmt: skip
    if parts.scheme != "rpc":
        raise TensortuneError(
            f"runner must be {RUNNER_FORMS}; {parts.scheme + '://'!r} is not a runner scheme",
            param="runner",
        )
    if parts.query or parts.fragment or parts.username or parts.password:
        raise TensortuneError(f"runner URL {url!r} must be rpc://HOST:PORT/KEY with nothing "
                              "else (no user, query or fragment)", param="runner")  # fmt: skip
    try:
        port = parts.port
    except ValueError:
        port = -1
    netloc_port = parts.netloc.rpartition(":")[2] if parts.netloc.count(":") == 1 else ""
    if not parts.hostname:
        raise TensortuneError(f"runner URL {url!r} names no tracker host (rpc://HOST:PORT/KEY)",
                              param="runner")  # fmt: skip
    if port is None or port <= 0:
        shown = f" {netloc_port!r}" if netloc_port else ""
        raise TensortuneError(f"runner URL {url!r}: the tracker port{shown} must be a number "
                              "from 1 to 65535 (rpc://HOST:PORT/KEY)", param="runner")  # fmt: skip
    key = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not key:
        raise TensortuneError(f"runner URL {url!r} names no server key (rpc://HOST:PORT/KEY)",
                              param="runner")  # fmt: skip
    _check_key(key, "runner")
    return RPCFarm(parts.hostname, port, key)


def _check_key(key: str, param: str) -> None:
    if not _KEY.fullmatch(key):
        raise TensortuneError(f"server key {key!r} must be letters, digits, '.', '_' or '-'",
                              param=param)  # fmt: skip


def parse_address(text: str, param: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6addr]:PORT`` too) as a pair; anything else is refused in one line."""
    host, sep, port = text.strip().rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise TensortuneError(f"{text!r} must be HOST:PORT, e.g. 127.0.0.1:9190", param=param)
    return host, int(port)


# ---- the tracker ------------------------------------------------------------------------------


def tracker_summary(
    farm: RPCFarm, timeout_s: float = TRACKER_TIMEOUT_S, *, param: str = "runner"
) -> dict:
    """The tracker's summary (``queue_info``: free and pending per key; ``server_info``).

    Speaks the tracker protocol on a socket of its own so that an unreachable or silent
    tracker is one line after ``timeout_s``, not TVM's minute of retries.
    """
    try:
        with socket.create_connection((farm.host, farm.port), timeout=timeout_s) as sock:
            sock.sendall(struct.pack("<i", rpc_base.RPC_TRACKER_MAGIC))
            magic = struct.unpack("<i", rpc_base.recvall(sock, 4))[0]
            if magic != rpc_base.RPC_TRACKER_MAGIC:
                raise TensortuneError(f"{farm.address} answers, but is not a TVM RPC tracker",
                                      param=param)  # fmt: skip
            rpc_base.sendjson(sock, [rpc_base.TrackerCode.SUMMARY])
            code, summary = rpc_base.recvjson(sock)
    except (OSError, ValueError, TypeError, struct.error) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
        raise TensortuneError(f"cannot reach the TVM RPC tracker at {farm.address}: {why}",
                              param=param) from None  # fmt: skip
    if code != rpc_base.TrackerCode.SUCCESS or not isinstance(summary, dict):
        raise TensortuneError(f"the TVM RPC tracker at {farm.address} did not give its summary",
                              param=param)  # fmt: skip
    return summary


def farm_servers(farm: RPCFarm) -> int:
    """How many servers the tracker has under the key, busy ones included; a key without any
    is refused in one line.

    Counting only the free ones would miss a server that is between two sessions (it registers
    again after each) and so measure with fewer workers than the farm has.
    """
    summary = tracker_summary(farm)
    queues = summary.get("queue_info") or {}
    free = int((queues.get(farm.key) or {}).get("free", 0))
    registered = sum(
        (info or {}).get("key") == f"server:{farm.key}" for info in summary.get("server_info", [])
    )
    if not free and not registered:
        others = ", ".join(sorted(k for k, q in queues.items() if q.get("free"))) or "none"
        raise TensortuneError(
            f"the TVM RPC tracker at {farm.address} has no server under key {farm.key!r} (keys "
            f"with free servers: {others}); start one on each device with `tensortune serve "
            f"--tracker {farm.address} --key {farm.key}`",
            param="runner",
        )
    return max(free, registered)


# ---- the remote hardware -------------------------------------------------------------------


def remote_hardware(
    farm: RPCFarm, servers: int = 1, *, timeout_s: float = SESSION_TIMEOUT_S
) -> Hardware:
    """The hardware the key's servers report, asking ``servers`` of them at once (so each is
    a different one; a busy one answers when its session ends); servers that disagree, or
    that cannot answer (not started with ``tensortune serve``), are refused in one line."""
    tracker_summary(farm)  # one line now if unreachable, not TVM's minute of retries
    try:
        tracker = tvm_rpc.connect_tracker(farm.host, farm.port)
    except Exception as e:
        raise TensortuneError(f"cannot reach the TVM RPC tracker at {farm.address}: "
                              f"{last_line(e)}", param="runner") from None  # fmt: skip
    sessions: list = []  # held until all have answered, so that each is another server
    answers: list[str] = []
    try:
        for _ in range(servers):
            try:
                sessions.append(tracker.request(farm.key, priority=1, session_timeout=timeout_s))
            except Exception as e:
                raise TensortuneError(
                    f"no session from a server under key {farm.key!r} at {farm.address}: "
                    f"{last_line(e)}",
                    param="runner",
                ) from None
            answers.append(_ask_hardware(sessions[-1], farm))
    finally:
        sessions.clear()  # a session ends when dropped, and its server registers again
        tracker.close()
    if len(set(answers)) > 1:
        ids = ", ".join(sorted({Hardware.from_json(a).id for a in answers}))
        raise TensortuneError(
            f"the servers under key {farm.key!r} at {farm.address} are different hardware "
            f"({ids}); register each kind of device under a key of its own",
            param="runner",
        )
    return Hardware.from_json(answers[0])


def _ask_hardware(session, farm: RPCFarm) -> str:
    try:
        describe = session.get_function(HARDWARE_FUNCTION)
    except (AttributeError, RuntimeError):
        describe = None
    if describe is None:
        raise TensortuneError(
            f"a server under key {farm.key!r} at {farm.address} cannot say what hardware it is "
            "(records would carry the wrong hardware id); start the servers with `tensortune "
            f"serve --tracker {farm.address} --key {farm.key}` instead of TVM's rpc_server",
            param="runner",
        )
    text = str(describe())
    try:
        Hardware.from_json(text)
    except (ValueError, KeyError, TypeError) as e:
        raise TensortuneError(
            f"a server under key {farm.key!r} at {farm.address} described its hardware "
            f"unreadably: {last_line(e)}",
            param="runner",
        ) from None
    return text


def remote_platform(platform: Platform, farm: RPCFarm, servers: int = 1) -> Platform:
    """``platform`` with the farm's hardware: the platform to record the farm's timings under.

    The target stays the caller's: it must describe the remote CPU (its ``mcpu`` and
    ``num-cores``), as it is what the candidates are compiled for.
    """
    return dataclasses.replace(platform, hardware=remote_hardware(farm, servers))


# ---- the runner -------------------------------------------------------------------------------


@derived_object
class FarmRunner(PyRunner):
    """TVM's ``RPCRunner``, with each failure told in one tagged line (``[run_error] rpc: ...``,
    ``[timeout] ...``) like the local runner's, instead of the worker's whole traceback."""

    def __init__(self, rpc_runner: object, servers: int) -> None:
        super().__init__()
        self.rpc_runner = rpc_runner
        self.servers = servers  # candidates in flight at once

    def run(self, runner_inputs: list[RunnerInput]) -> list[RunnerFuture]:
        return [_FarmFuture(f) for f in self.rpc_runner.run(runner_inputs)]

    def close(self) -> None:
        """Stop the worker processes that hold the sessions.  Candidates still queued are
        dropped, not measured: TVM's pool ran every one of them first (each in a new session),
        so a second Ctrl-C or an error waited on the whole queue, 10 minutes a candidate
        with the farm down."""
        pool = self.rpc_runner.pool
        pool._threadpool.shutdown(wait=False, cancel_futures=True)  # TVM's pool has no such option
        pool.shutdown()


@derived_object
class _FarmFuture(PyRunnerFuture):
    def __init__(self, future: RunnerFuture) -> None:
        super().__init__()
        self.future = future

    def done(self) -> bool:
        return bool(self.future.done())

    def result(self) -> RunnerResult:
        result = self.future.result()
        if result.error_msg is None:
            return result
        return RunnerResult(None, _one_line_error(str(result.error_msg)))


# The line of a Python traceback that names the exception ("tvm.error.InternalError: ...").
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*")


def _one_line_error(text: str) -> str:
    """``RPCRunner``'s error text as one tagged line: the first exception it names (the cause;
    the later ones come from cleaning up a session that is already gone)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    causes = [ln for ln in lines[1:] if _EXCEPTION_LINE.match(ln)]
    why = causes[0] if causes else lines[-1] if lines else "no message"
    timed_out = any(
        w in f"{lines[0] if lines else ''} {why}".lower() for w in ("timeout", "expired")
    )
    return tagged(Status.TIMEOUT if timed_out else Status.RUN_ERROR, f"rpc: {why}")


def farm_runner(
    farm: RPCFarm,
    platform: Platform,
    timing: TimingConfig | None = None,
    *,
    session_timeout_s: float = SESSION_TIMEOUT_S,
) -> tuple[FarmRunner, Platform]:
    """A MetaSchedule runner timing candidates on the farm, and the platform to record its
    timings under (``platform`` with the remote hardware).

    The tracker, the key, the servers' hardware and the target's ``num-cores`` (at most the
    servers' cores) are checked first: each problem is one ``TensortuneError`` line
    (``param="runner"``, ``"target"`` for the cores) before anything is measured.  The runner
    opens a session per candidate on whichever server is free, with one candidate in flight
    per server the key has, its kernel run by ``num-cores`` threads; ``session_timeout_s``
    bounds each session, on the server and, ``CLIENT_MARGIN_S`` later, here (a server that
    stops answering; the wait for a free server is not counted).  ``close()`` it when done.
    """
    servers = farm_servers(farm)
    remote = remote_platform(platform, farm, servers)
    with about("target"):
        remote.check_runs_here()  # every candidate would die of SIGILL on the servers
    threads, cores = remote.threads, remote.hardware.cores
    if threads > cores:  # more threads than cores: every timing would compete with itself
        raise TensortuneError(
            f"the target's num-cores {threads} is more than the {cores} cores of the servers "
            f'under key {farm.key!r}; give a target for them, with "num-cores": {cores}',
            param="target",
        )
    t = timing or TimingConfig()
    config = ms.runner.RPCConfig(
        tracker_host=farm.host,
        tracker_port=farm.port,
        tracker_key=farm.key,
        session_priority=1,
        session_timeout_sec=session_timeout_s,
    )
    evaluator = ms.runner.EvaluatorConfig(
        number=t.number,
        repeat=t.repeat,
        min_repeat_ms=t.min_repeat_ms,
        enable_cpu_cache_flush=t.cache_flush,
    )
    # Each worker process opens its sessions with this (pickled by reference).
    session = functools.partial(_session_with_threads, threads=threads,
                                deadline_s=session_timeout_s + CLIENT_MARGIN_S,
                                queue_s=QUEUE_TIMEOUT_S)  # fmt: skip
    # Its worker processes leave Ctrl-C, SIGHUP and SIGTERM to this one (a graceful stop lets
    # the batch in flight finish; killed by the signal meant for the group, they recorded it
    # as failed) and die with it.
    runner = ms.runner.RPCRunner(config, evaluator, f_create_session=session,
                                 f_cleanup=_cleanup_and_disarm, max_workers=servers,
                                 initializer=leave_stops_to_parent)  # fmt: skip
    return FarmRunner(runner, servers), remote


def _session_with_threads(rpc_config: object, threads: int, deadline_s: float | None = None,
                          queue_s: float | None = None) -> object:  # fmt: skip
    """A session on a free server, its kernels run by ``threads`` threads: the target's
    ``num-cores``, as the local runner does (TVM's own default differs: 1 thread on a
    2-CPU machine, where remote latencies came out twice the local ones).

    This worker process dies (SIGALRM's default) unless the session opens within ``queue_s``
    and the candidate is done ``deadline_s`` after that: TVM's RPC reads have no deadline,
    and a tracker or server that stopped answering would hold the candidate, and the run, for
    ever.  TVM reports the candidate failed and starts another worker."""

    def alarm(seconds: float | None) -> None:
        if seconds is not None:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(max(1, math.ceil(seconds)))

    alarm(queue_s)
    session = rpc_config.connect_server()  # type: ignore[attr-defined]
    alarm(deadline_s)
    session.get_function(THREADS_FUNCTION)(threads)
    return session


def _cleanup_and_disarm(session: object, remote_path: str | None) -> None:
    """TVM's clean-up of a candidate's session (it may wait on the server too), then the
    alarm ``_session_with_threads`` set is taken back."""
    try:
        ms.runner.rpc_runner.default_cleanup(session, remote_path)
    finally:
        signal.alarm(0)


def runner_from(
    spec: str | None, platform: Platform, timing: TimingConfig | None = None
) -> tuple[FarmRunner | None, Platform]:
    """The runner a user named and the platform to record under: ``(None, platform)`` for
    ``"local"`` (or ``None``): the caller's own runner measures here; for
    ``rpc://HOST:PORT/KEY``, :func:`farm_runner`'s."""
    if not names_a_farm(spec):
        return None, platform
    return farm_runner(parse_runner_url(spec), platform, timing)


# ---- the server -------------------------------------------------------------------------------


def register_functions(hardware: Hardware) -> None:
    """Register the global functions this process's sessions (forked children) answer:
    :data:`HARDWARE_FUNCTION` with ``hardware``, and :data:`THREADS_FUNCTION`."""
    text = hardware.to_json()
    tvm_ffi.register_global_func(HARDWARE_FUNCTION, lambda: text, override=True)
    tvm_ffi.register_global_func(THREADS_FUNCTION, _set_threads, override=True)


def _set_threads(threads: int) -> None:
    # TVM sizes a process's thread pool from TVM_NUM_THREADS when its first parallel kernel
    # runs; each session is a fresh fork of the server, which runs no kernel itself.  The
    # pool is made here, so the session's thread can keep off its threads' cores at once.
    os.environ["TVM_NUM_THREADS"] = str(int(threads))
    keep_caller_off_pool_cores()


def serve(
    tracker: str,
    key: str,
    *,
    host: str = "127.0.0.1",
    port: int = 9090,
    port_end: int | None = None,
    hardware: Hardware | None = None,
    on_ready: Callable[[int, Hardware], None] | None = None,
) -> None:
    """Serve RPC sessions for the tracker at ``tracker`` (``HOST:PORT``) under ``key`` until
    interrupted; each session can ask what hardware this is (:data:`HARDWARE_FUNCTION`).

    Listens on ``host`` at the first free port from ``port`` up to ``port_end`` (default
    ``port + 100``) and reports ``host`` to the tracker, so clients connect to that address:
    give this machine's address on the farm's network (the default, loopback, serves only this
    machine).  ``hardware`` is what the sessions report (default: this machine's fingerprint);
    state it only for a device whose own fingerprint is wrong, e.g. a container hiding
    ``/proc/cpuinfo``.  ``on_ready(port, hardware)`` is called once listening.

    Each session runs in a forked child (TVM's server), which inherits the registered
    functions; the accept loop runs in this thread, so stopping this process (Ctrl-C, which
    raises ``KeyboardInterrupt`` here, or SIGTERM, made to do the same when this is the main
    thread) stops the server and its sessions.
    """
    tracker_addr = parse_address(tracker, "tracker")
    _check_key(key, "key")
    _check_host(host)
    if not 0 < port < 65536:
        raise TensortuneError(f"port must be from 1 to 65535, not {port}", param="port")
    end = min(port_end or port + 100, 65536)
    farm = RPCFarm(*tracker_addr, key)
    tracker_summary(farm, param="tracker")  # one line now, not a minute of TVM's retries
    described = hardware or current_hardware()
    register_functions(described)
    sock, bound = _bind(host, port, end)
    # TVM logs every session at INFO on stderr; a server's terminal only needs the problems.
    logging.getLogger("RPCServer").setLevel(logging.WARNING)
    # SIGTERM (``kill``, a service manager) stops the server the way Ctrl-C does, so that a
    # session child, which inherited the listening socket, does not keep the port.
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if in_main else None
    _sessions_die_on_sigterm(in_main)
    if on_ready is not None:
        on_ready(bound, described)
    try:
        _listen(sock, bound, key, tracker_addr, host, farm)
    finally:
        _sessions_die_on_sigterm(False)
        _end_sessions()
        sock.close()
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def _check_host(host: str) -> None:
    """Refuse an address tuners cannot connect to (the tracker hands them ``host``), and warn
    when the server is open to other machines: TVM's RPC has no authentication, and a session
    loads and runs whatever native code it is sent."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:  # a host name: what it names here (the tuners resolve it themselves)
        try:
            ip = ipaddress.ip_address(socket.getaddrinfo(host, None)[0][4][0])
        except (OSError, ValueError, IndexError):
            ip = None  # not known here: binding to it will say
    if ip is not None and ip.is_unspecified:
        raise TensortuneError(
            f"{host} listens on every interface, but it is also the address the tracker gives "
            "the tuners, who would connect to their own machine: give this machine's address "
            "on the farm's network",
            param="host",
        )
    if host != "localhost" and (ip is None or not ip.is_loopback):
        warnings.warn(f"tensortune: serving on {host}: whoever reaches it or the tracker can "
                      "run code on this machine as this user (TVM's RPC has no "
                      "authentication); serve on a network you trust", stacklevel=3)  # fmt: skip


_session_sigterm_default = False
_fork_hook_registered = False


def _sessions_die_on_sigterm(on: bool) -> None:
    """Session children forked from now on (``on``) or no longer take SIGTERM's default: death.

    A session inherits its server's handler, which raises KeyboardInterrupt; raised while the
    session answers a call, TVM returns it to the client as an RPC error and serves on, and a
    session that outlives its server keeps the port and hangs the server's exit, where
    multiprocessing joins its children (seen in CI).  Python cannot unregister a fork hook, so
    one hook reads a flag."""
    global _session_sigterm_default, _fork_hook_registered
    _session_sigterm_default = on
    if on and not _fork_hook_registered:
        os.register_at_fork(after_in_child=_default_sigterm_if_session)
        _fork_hook_registered = True


def _default_sigterm_if_session() -> None:
    if _session_sigterm_default:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _end_sessions(grace_s: float = 2.0) -> None:
    """End the sessions in progress (their clients see the connection drop): SIGTERM, then
    SIGKILL for one still alive after ``grace_s``."""
    children = multiprocessing.active_children()
    for child in children:
        child.terminate()
    for child in children:
        child.join(grace_s)
        if child.is_alive():
            child.kill()
            child.join(5)


def _listen(sock: socket.socket, port: int, key: str, tracker: tuple[str, int], host: str,
            farm: RPCFarm) -> None:  # fmt: skip
    """TVM's accept loop, entered again after a session whose process failed (a kernel that
    crashed, a client that went away mid-call): TVM raises for it, in the session's scratch
    directory, and one bad candidate must not end the farm's server."""
    cwd = os.getcwd()
    while True:
        try:
            rpc_listen_loop(sock, port, key, tracker, None, host)
        except RuntimeError as e:
            os.chdir(cwd)
            # TVM 0.27's _serving words a failed session so (rpc/server.py; a test pins it)
            if not str(e).startswith("Child process"):  # TVM gave up on a tracker that went
                raise TensortuneError(f"lost the tracker at {farm.address}: {last_line(e)}",
                                      param="tracker") from None  # fmt: skip
            print(f"tensortune serve: a session failed ({last_line(e)}); serving on",
                  file=sys.stderr, flush=True)  # fmt: skip


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _bind(host: str, port: int, end: int) -> tuple[socket.socket, int]:
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except OSError as e:
        raise TensortuneError(f"cannot listen on {host!r}: {e.strerror or e}",
                              param="host") from None  # fmt: skip
    sock = socket.socket(family, socket.SOCK_STREAM)
    if sys.platform != "win32":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    for candidate in range(port, end):
        try:
            sock.bind((host, candidate))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                continue
            sock.close()
            raise TensortuneError(f"cannot listen on {host}:{candidate}: {e.strerror or e}",
                                  param="host") from None  # fmt: skip
        sock.listen(1)
        return sock, candidate
    sock.close()
    raise TensortuneError(f"no free port on {host} from {port} to {end - 1}", param="port")


def describe(hardware: Hardware) -> str:
    """One line about a hardware descriptor, for a server's banner."""
    cores = f"{hardware.cores} core{'s' if hardware.cores != 1 else ''}"
    return f"{hardware.cpu_model} ({hardware.arch}, {cores}; hardware {hardware.id})"


__all__ = [
    "HARDWARE_FUNCTION",
    "THREADS_FUNCTION",
    "FarmRunner",
    "RPCFarm",
    "describe",
    "farm_runner",
    "farm_servers",
    "names_a_farm",
    "parse_address",
    "parse_runner_url",
    "register_functions",
    "remote_hardware",
    "remote_platform",
    "runner_from",
    "serve",
    "tracker_summary",
]
