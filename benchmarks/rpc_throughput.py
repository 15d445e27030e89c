"""Candidates measured per second on a device farm: one RPC server against two under one key,
on the same built candidates, through tensortune's farm runner (TVM's RPCRunner).

Method: a TVM RPC tracker (``python -m tvm.exec.rpc_tracker``) and three ``tensortune serve``
servers start on 127.0.0.1, each in a process group of its own (killed at the end): key ``one``
has one server, key ``two`` two.  N random schedules of the workload are drawn and built once,
here.  Each repetition measures all of them with every configuration, in rotating order.  A
configuration's runner is made (its tracker and hardware checks, its worker processes started)
and warmed on two candidates before the clock starts, so the wall time is the sessions' alone:
per candidate a tracker request, a connection, upload, load, argument allocation and timing.
Throughput = N / wall seconds; the median over repetitions is reported, and the two/one ratio
is taken per repetition and its median reported.

``local`` measures the same candidates with ``PersistentRunner`` (one at a time, in a worker on
this machine, no RPC) for reference.  Every configuration times with ``TimingConfig``'s
defaults, as ``tensortune tune`` does (5 timings of at least 10 ms each).

The servers share this machine's cores: two sessions at once compete for them, which a farm of
separate devices does not.  The median measured latency per configuration shows how much.

Run:  .venv/bin/python benchmarks/rpc_throughput.py [--candidates 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

from tensortune.compat import BuilderInput, RunnerInput
from tensortune.hardware import current_hardware, resolve_platform
from tensortune.measure.builder import PersistentBuilder
from tensortune.measure.rpc import RPCFarm, farm_runner, tracker_summary
from tensortune.measure.runner import PersistentRunner, TimingConfig
from tensortune.measure.status import run_seconds
from tensortune.search.space import sample_candidates
from tensortune.workloads.sources import task_from_spec

HOST = "127.0.0.1"
SERVERS = {"one": 1, "two": 2}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no lscpu)"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def _start(args: list[str], procs: list[subprocess.Popen]) -> None:
    # A group of its own: TVM's tracker runs in a child that would keep the port if only the
    # parent were killed.
    procs.append(subprocess.Popen([sys.executable, *args], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True))  # fmt: skip


def _until(ready, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ready():
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} not ready within {timeout_s:.0f} s")
        time.sleep(0.2)


def _start_farm(procs: list[subprocess.Popen]) -> int:
    port = _free_port()
    _start(["-m", "tvm.exec.rpc_tracker", "--host", HOST, "--port", str(port),
            "--port-end", str(port + 1), "--silent"], procs)  # fmt: skip
    probe = RPCFarm(HOST, port, "-")
    _until(lambda: tracker_summary(probe, timeout_s=2) is not None, "the tracker")
    for key, count in SERVERS.items():
        for _ in range(count):
            _start(["-m", "tensortune.cli.app", "serve", "--tracker", f"{HOST}:{port}",
                    "--key", key, "--port", str(_free_port())], procs)  # fmt: skip

    def all_free() -> bool:
        queues = tracker_summary(probe, timeout_s=2)["queue_info"]
        return all(queues.get(k, {}).get("free", 0) >= n for k, n in SERVERS.items())

    _until(all_free, "the servers")
    return port


def _measure(runner, inputs: list) -> tuple[float, list[float]]:
    """Wall seconds to run every input, and each candidate's latency (inf when it failed)."""
    start = time.perf_counter()
    results = [f.result() for f in runner.run(inputs)]
    wall = time.perf_counter() - start
    return wall, [run_seconds(r.run_secs) if r.error_msg is None else float("inf")
                  for r in results]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="matmul:128,128,128")
    ap.add_argument("--candidates", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    platform = resolve_platform(None)
    timing = TimingConfig()
    hw = current_hardware()
    load = os.getloadavg()[0]
    print(f"CPU (lscpu model name): {_cpu_model()}; {hw.cores} usable cores; target "
          f"{json.dumps(platform.target)}; load average before: {load:.2f}")  # fmt: skip
    t = timing
    print(f"{args.workload}: {args.candidates} random candidates built once, measured "
          f"{args.repeats} times per configuration in rotating order; timing: number "
          f"{t.number}, repeat {t.repeat}, min_repeat_ms {t.min_repeat_ms}")  # fmt: skip

    procs: list[subprocess.Popen] = []
    builder = PersistentBuilder(max_workers=2)
    try:
        port = _start_farm(procs)
        task = task_from_spec(args.workload)
        cands = sample_candidates(task.mod, platform, args.candidates, seed=0)
        built = builder.build([BuilderInput(c.sch.mod, platform.tvm_target) for c in cands])
        inputs = [RunnerInput(b.artifact_path, "cpu", c.args_info)
                  for b, c in zip(built, cands, strict=True) if b.error_msg is None]  # fmt: skip
        print(f"{len(inputs)} of {len(cands)} candidates built; tracker at {HOST}:{port}")

        def make(name: str):
            if name == "local":
                runner = PersistentRunner(timing, num_threads=platform.threads)
                runner.wait_ready()
            else:
                runner, _ = farm_runner(RPCFarm(HOST, port, name), platform, timing)
            _measure(runner, inputs[:2])  # warm: every worker process started
            return runner

        names = ["local", *SERVERS]
        walls: dict[str, list[float]] = {n: [] for n in names}
        latencies: dict[str, list[float]] = {n: [] for n in names}
        failed: dict[str, int] = dict.fromkeys(names, 0)
        for rep in range(args.repeats):
            for name in names[rep % len(names) :] + names[: rep % len(names)]:
                runner = make(name)
                try:
                    wall, lat = _measure(runner, inputs)
                finally:
                    runner.close()
                walls[name].append(wall)
                ok = [x for x in lat if x != float("inf")]
                failed[name] += len(lat) - len(ok)
                latencies[name].append(statistics.median(ok) if ok else float("inf"))
                print(f"  repetition {rep + 1}: {name:5s} {len(inputs) / wall:6.2f} cand/s "
                      f"({wall:.1f} s, {len(lat) - len(ok)} failed)", flush=True)  # fmt: skip
    finally:
        builder.close()
        for p in reversed(procs):
            if p.returncode is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)

    n = len(inputs)
    report = {}
    print(f"\nmedians over {args.repeats} repetitions, {n} candidates each:")
    for name in names:
        rate = n / statistics.median(walls[name])
        report[name] = {"candidates_per_s": rate, "wall_s": walls[name], "failed": failed[name],
                        "median_latency_s": statistics.median(latencies[name])}  # fmt: skip
        label = {"local": "local (PersistentRunner, no RPC)", "one": "farm, 1 server",
                 "two": "farm, 2 servers"}[name]  # fmt: skip
        walls_text = ", ".join(f"{w:.1f}" for w in walls[name])
        latency_us = report[name]["median_latency_s"] * 1e6
        print(f"  {label:34s} {rate:6.2f} cand/s  wall [{walls_text}] s  median latency "
              f"{latency_us:7.1f} µs  failed {failed[name]}")  # fmt: skip
    print(f"  load average after: {os.getloadavg()[0]:.2f} (other processes compete with the "
          "servers, and the local runner retries timings it finds contended)")  # fmt: skip
    ratio = statistics.median(o / t for o, t in zip(walls["one"], walls["two"], strict=True))
    report["two_over_one"] = ratio
    print(f"  2 servers / 1 server throughput (median of per-repetition ratios): {ratio:.2f}x")
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
