"""Two tuners, one PostgreSQL store: do they share the budget, and what does killing one cost?

Method: a temporary PostgreSQL server (``tests/postgres_server.py``), a new database per phase.
Phase 1: two ``tensortune tune`` processes start together on the same tasks, each with
``--trials N`` (the project's defaults: draft-then-verify with the shipped model).  Reported:
the records each committed, in all, and the candidates measured twice (same workload and trace
hash).  Phase 2: the same start; once the store holds N/4 records, one process is killed with
SIGKILL; its leases still in the store are the batch it had in flight.  The other finishes, then
the killed command is run again.  Reported: the records in all (the budget is N), the batch in
flight when killed (the leases its pid held), candidates measured twice, leases left at the end.
Both processes run with TVM_NUM_THREADS=1 (two of them share the machine's two cores).

Run:  .venv/bin/python benchmarks/shared_tuning.py [--trials 128] [--per-round 16]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

WORKLOADS = ("matmul:128,128,128", "conv2d_nhwc:1,28,28,32,32,3")


def _tune(url: str, work: Path, trials: int, per_round: int) -> subprocess.Popen:
    args = [sys.executable, "-m", "tensortune.cli.app", "tune", "--records", url,
            "--work-dir", str(work), "--trials", str(trials), "--trials-per-round",
            str(per_round)]  # fmt: skip
    for w in WORKLOADS:
        args += ["--workload", w]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            env={**os.environ, "TVM_NUM_THREADS": "1"})  # fmt: skip


def _counts(url: str) -> dict:
    import psycopg

    from tensortune.records import open_records

    open_records(url).close()  # the schema, if no tuner has made it yet
    with psycopg.connect(url) as conn:
        total, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT (workload_id, trace_hash)) FROM records"
        ).fetchone()
        by_run = dict(conn.execute("SELECT run_id, count(*) FROM records GROUP BY run_id"))
        leases = dict(conn.execute("SELECT worker, count(*) FROM claims GROUP BY worker"))
    return {"total": total, "twice": total - distinct, "by_run": by_run, "leases": leases}


def _wait(proc: subprocess.Popen) -> None:
    _, err = proc.communicate(timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"tune failed: {err.strip().splitlines()[-1:]}")


def main() -> None:
    import postgres_server

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=128)
    ap.add_argument("--per-round", type=int, default=16)
    args = ap.parse_args()
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines()
                  if ln.startswith("Model name")), "?")  # fmt: skip
    print(f"# tasks {', '.join(WORKLOADS)}; --trials {args.trials} --trials-per-round "
          f"{args.per_round}; CPU: {model}, {os.cpu_count()} cores", flush=True)  # fmt: skip
    server = postgres_server.start_server()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            url = server.new_database()
            t0 = time.perf_counter()
            runs = [_tune(url, Path(tmp) / f"a{i}", args.trials, args.per_round) for i in (0, 1)]
            for p in runs:
                _wait(p)
            c = _counts(url)
            print(f"together: {c['total']} records (budget {args.trials}) in "
                  f"{time.perf_counter() - t0:.0f} s; per process {sorted(c['by_run'].values())}; "
                  f"measured twice {c['twice']}; leases left {sum(c['leases'].values())}",
                  flush=True)  # fmt: skip

            url = server.new_database()
            runs = [_tune(url, Path(tmp) / f"b{i}", args.trials, args.per_round) for i in (0, 1)]
            # kill it mid-batch: once a quarter of the budget is in, while it holds leases
            mine = f"/{runs[0].pid}/"
            while True:
                c = _counts(url)
                held = sum(n for w, n in c["leases"].items() if mine in w)
                if (c["total"] >= args.trials // 4 and held) or runs[0].poll() is not None:
                    break
                time.sleep(0.2)
            os.killpg(runs[0].pid, signal.SIGKILL)
            runs[0].communicate()
            killed = _counts(url)
            in_flight = sum(n for w, n in killed["leases"].items() if mine in w)
            _wait(runs[1])
            again = _tune(url, Path(tmp) / "b0", args.trials, args.per_round)
            _wait(again)
            c = _counts(url)
            print(f"one killed at {killed['total']} records, its batch in flight (leases it "
                  f"held): {in_flight}; after the rerun: {c['total']} records "
                  f"(budget {args.trials}), per run {sorted(c['by_run'].values())}, measured "
                  f"twice {c['twice']}, leases left {sum(c['leases'].values())}")  # fmt: skip
    finally:
        postgres_server.stop_server(server)


if __name__ == "__main__":
    main()
