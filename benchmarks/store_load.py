"""Records store under load: concurrent writers and readers on SQLite (WAL) and on PostgreSQL.

Method: W writer processes each commit B batches of K records (one transaction a batch, as a
tuner commits a measured batch) into one store, while R reader processes run `records stats`
(the CLI command, in-process, in a loop).  Throughput = records committed / wall seconds from
the first writer's start to the last writer's end.  Afterwards every record is checked: the
store must hold exactly W*B*K records, each writer's K*B uids exactly once.  Repeated
``--repeats`` times on a fresh store; the median throughput is reported.  Records carry real
traces of a 64x64x64 matmul (sampled once), as a tuner writes them.

PostgreSQL runs on a temporary server started here (``tests/postgres_server.py``: initdb on a
temporary directory, loopback port, fsync off as in the tests), a new database each repeat.

Run:  .venv/bin/python benchmarks/store_load.py [--writers 8] [--batches 40] [--batch 16]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

SPEC = "matmul:64,64,64"


def _template(url: str) -> dict:
    """A real record's fields (a sampled trace), with the workload and hardware registered."""
    from tensortune.compat import TVM_VERSION
    from tensortune.hardware import current_hardware, resolve_platform
    from tensortune.records import open_records
    from tensortune.records.convert import args_info_text, trace_text
    from tensortune.search.space import sample_candidates
    from tensortune.workloads.ops import parse_spec

    mod = parse_spec(SPEC).to_module()
    plat = resolve_platform({"kind": "llvm", "num-cores": 2})
    cands = sample_candidates(mod, plat, 16, seed=0)
    with open_records(url) as store:
        wid = store.workload_id(mod, SPEC)
        hw = store.register_hardware(current_hardware())
    return {
        "workload_id": wid, "hardware_id": hw, "target": plat.key,
        "traces": [trace_text(c.sch.trace) for c in cands],
        "args_info": args_info_text(cands[0].args_info), "tvm_version": TVM_VERSION,
    }  # fmt: skip


def _writer(url: str, template: dict, index: int, batches: int, size: int, start, out) -> None:
    from tensortune.records import open_records
    from tensortune.records.schema import Record

    traces = template["traces"]
    with open_records(url) as store:
        start.wait()
        t0 = time.perf_counter()
        for b in range(batches):
            store.add([
                Record(template["workload_id"], template["hardware_id"], template["target"],
                       traces[(b + k) % len(traces)], template["args_info"], (1e-4, 1.1e-4),
                       "ok", run_id=f"writer-{index}", tvm_version=template["tvm_version"],
                       created_at=time.time(), uid=f"w{index}-b{b}-k{k}")
                for k in range(size)
            ])  # fmt: skip
        out.put((index, t0, time.perf_counter()))


def _reader(url: str, start, stop, out) -> None:
    import contextlib
    import io

    from tensortune.cli.app import run

    start.wait()
    done = errors = 0
    while not stop.is_set():
        with contextlib.redirect_stdout(io.StringIO()):
            code = run(["records", "stats", "--records", url, "--json"])
        done += 1
        errors += code != 0
    out.put((done, errors))


def _one(url: str, writers: int, batches: int, size: int, readers: int) -> dict:
    from tensortune.records import open_records

    template = _template(url)
    ctx = mp.get_context("spawn")
    start, stop, results, reads = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Queue()
    ws = [ctx.Process(target=_writer, args=(url, template, i, batches, size, start, results))
          for i in range(writers)]  # fmt: skip
    rs = [ctx.Process(target=_reader, args=(url, start, stop, reads)) for _ in range(readers)]
    for p in ws + rs:
        p.start()
    time.sleep(3.0)  # every process has imported tensortune before the clock starts
    start.set()
    spans = [results.get(timeout=600) for _ in ws]
    stop.set()
    read = [reads.get(timeout=120) for _ in rs]
    for p in ws + rs:
        p.join(timeout=60)
    wall = max(e for _, _, e in spans) - min(s for _, s, _ in spans)
    with open_records(url) as store:
        rows = list(store.query())
    uids = [r.uid for r in rows]
    expected = {f"w{i}-b{b}-k{k}" for i in range(writers) for b in range(batches)
                for k in range(size)}  # fmt: skip
    return {
        "records": len(rows), "expected": len(expected), "wall_s": wall,
        "records_per_s": len(rows) / wall,
        "lost": len(expected - set(uids)), "duplicated": len(uids) - len(set(uids)),
        "stats_runs": sum(d for d, _ in read), "stats_errors": sum(e for _, e in read),
        "exit_codes": [p.exitcode for p in ws + rs],
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines()
                  if ln.startswith("Model name")), platform.processor())  # fmt: skip
    print(f"# {args.writers} writers x {args.batches} batches x {args.batch} records, "
          f"{args.readers} readers running `records stats` in a loop; {args.repeats} repeats; "
          f"CPU: {model}, {mp.cpu_count()} cores", flush=True)  # fmt: skip
    import postgres_server

    out: dict[str, list[dict]] = {"sqlite": [], "postgresql": []}
    server = postgres_server.start_server()
    try:
        for r in range(args.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                urls = {"sqlite": f"sqlite:///{Path(tmp) / 'load.db'}",
                        "postgresql": server.new_database()}  # fmt: skip
                for kind, url in urls.items():
                    res = _one(url, args.writers, args.batches, args.batch, args.readers)
                    out[kind].append(res)
                    print(f"{kind:10s} repeat {r + 1}: {res['records_per_s']:8.0f} records/s "
                          f"({res['records']} in {res['wall_s']:.2f} s), lost {res['lost']}, "
                          f"duplicated {res['duplicated']}, {res['stats_runs']} stats runs "
                          f"({res['stats_errors']} failed)", flush=True)  # fmt: skip
    finally:
        postgres_server.stop_server(server)
    summary = {k: {"median_records_per_s": statistics.median(x["records_per_s"] for x in v),
                   "lost": sum(x["lost"] for x in v),
                   "duplicated": sum(x["duplicated"] for x in v),
                   "stats_errors": sum(x["stats_errors"] for x in v)}
               for k, v in out.items()}  # fmt: skip
    for kind, s in summary.items():
        print(f"{kind:10s} median {s['median_records_per_s']:.0f} records/s; lost {s['lost']}, "
              f"duplicated {s['duplicated']}, failed stats runs {s['stats_errors']}")  # fmt: skip
    if args.json:
        print(json.dumps({"runs": out, "summary": summary}))


if __name__ == "__main__":
    main()
