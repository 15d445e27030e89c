"""``tensortune records``: inspect, import and export measurement records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tensortune.cli.display import console, fmt_gflops, fmt_seconds, print_json, print_table, table
from tensortune.cli.options import JsonOpt, RecordsOpt, TargetOpt, rename_options
from tensortune.errors import TargetError, TensortuneError, about, last_line
from tensortune.records import DEFAULT_URL, RecordStore, names_a_url, open_records, redact

app = typer.Typer(help="Inspect, import and export measurement records.", no_args_is_help=True)

HardwareOpt = Annotated[
    str | None,
    typer.Option("--hardware", metavar="ID",
                 help="Hardware id, as `records stats` lists them (default: this machine)."),
]  # fmt: skip


def _checked_target(target: str | None) -> str | None:
    """``--target`` as given, for the API to match against the store's keys
    (``stored_target_key``: resolved here, a target measured elsewhere got this machine's
    ``num-cores`` and matched nothing); one TVM cannot read is refused before any store
    opens."""
    if target is None:
        return None
    from tensortune.hardware import resolve_platform, target_key
    from tensortune.hardware.target import target_dict

    with about("target"):
        try:
            target_key(target_dict(target))
        except TensortuneError:
            raise
        except Exception as e:  # TVM's own words span lines: resolve_platform says why in one
            resolve_platform(target, measurable=False)
            raise TargetError(f"TVM rejects target {target}: {last_line(e)}") from None
    return target


def _opened(records: str, *, create: bool = False) -> RecordStore:
    """The store ``--records`` names (errors opening it are about that option)."""
    with about("records"):
        return open_records(records, create=create)


def _short_target(key: str) -> str:
    return " ".join(f"{k}={v}" for k, v in json.loads(key).items() if k not in ("keys", "tag"))


@app.command("stats")
def stats(records: RecordsOpt = DEFAULT_URL, as_json: JsonOpt = False) -> None:
    """Records per workload, hardware and target, with the best latency.

    Example: tensortune records stats --records sqlite:///r.db
    """
    from tensortune.hardware import current_hardware

    with _opened(records) as store:
        here = current_hardware().id
        hardware = store.hardware()
        rows = store.summary()
        n_workloads = len(store.workloads())
    if as_json:
        print_json({
            "records_url": store.url,
            "rows": [{"workload": name, "workload_id": wid, "hardware_id": hw,
                      "this_machine": hw == here, "target": json.loads(tgt), "records": n,
                      "ok": ok, "best_seconds": best} for name, wid, hw, tgt, n, ok, best in rows],
            "records": sum(r[4] for r in rows), "workloads": n_workloads,
            "hardware": {h: json.loads(d.to_json()) for h, d in hardware.items()},
        })  # fmt: skip
        return
    columns = {"workload": "left", "hardware": "left", "target": "left", "records": "right",
               "ok": "right", "best": "right"}  # fmt: skip
    t = table(f"records in {store.url}", columns)
    for name, wid, hw, tgt, n, ok, best in rows:
        known = hardware.get(hw)  # a store written by hand may name none it describes
        hw_text = (f"{hw} (this machine)" if hw == here
                   else f"{hw} {known.cpu_model if known else '(not described)'}")  # fmt: skip
        t.add_row(f"{wid}: {name}", hw_text, _short_target(tgt), str(n), str(ok),
                  fmt_seconds(best))  # fmt: skip
    print_table(t)
    console.print(f"{sum(r[4] for r in rows)} records, {n_workloads} workloads, "
                  f"{len(hardware)} hardware")  # fmt: skip


@app.command("show")
def show(
    records: RecordsOpt = DEFAULT_URL,
    workload: Annotated[
        str | None,
        typer.Option(
            "--workload",
            "-w",
            metavar="TEXT",
            help="Only workloads whose name contains TEXT, e.g. conv2d.",
        ),
    ] = None,
    hardware: HardwareOpt = None,
    target: TargetOpt = None,
    tir: Annotated[
        bool, typer.Option("--tir", help="Print the scheduled TIR of each best program too.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """The best program of each workload: latency, GFLOP/s and trials.

    Example: tensortune records show --records sqlite:///r.db --workload matmul --tir
    """
    from tensortune.hardware import current_hardware
    from tensortune.tuning.best import best_programs

    best = best_programs(records, hardware_id=hardware or current_hardware().id,
                         target=_checked_target(target), workload=workload, tir=tir)  # fmt: skip
    if as_json:
        print_json([b.to_dict() for b in best])
        return
    columns = {"workload": "left", "target": "left", "trials": "right", "ok": "right",
               "best latency": "right", "GFLOP/s": "right"}  # fmt: skip
    t = table(f"best programs in {redact(records)}", columns)
    for b in best:
        t.add_row(f"{b.workload_id}: {b.workload}", _short_target(b.target), str(b.trials),
                  str(b.ok), fmt_seconds(b.best_seconds), fmt_gflops(b.gflops))  # fmt: skip
    print_table(t)
    if not best:
        console.print("no records of this hardware (see `tensortune records stats`)")
    for b in best if tir else []:
        console.print(f"\n# {b.workload_id}: {b.workload}, best {fmt_seconds(b.best_seconds)}")
        console.print(b.tir or "(no successful record)")


@app.command("export")
def export(
    directory: Annotated[
        str,
        typer.Argument(
            metavar="DIR|URL",
            help="New directory for the JSON database, or "
            "another records store's URL to copy every record into.",
        ),
    ],
    records: RecordsOpt = DEFAULT_URL,
    top_k: Annotated[
        int | None,
        typer.Option(
            "--top-k",
            metavar="K",
            help="Only the K fastest successful records of each workload and target.",
        ),
    ] = None,
    hardware: HardwareOpt = None,
    target: TargetOpt = None,
) -> None:
    """Write records as a MetaSchedule JSON database (TVM's JSONDatabase loads it), with the
    workloads' names beside it; or copy them all into another records store.

    Example: tensortune records export best-db --records sqlite:///r.db --top-k 1
    Example: tensortune records export postgresql://me@dbhost/tuning --records sqlite:///r.db
    """
    from tensortune.records.interop import export_records

    rename_options({"directory": "DIR|URL"})
    if not directory.strip():  # Path("") is the working directory, files and all
        raise TensortuneError("give a directory or a records URL, not an empty name",
                              param="directory")  # fmt: skip
    if names_a_url(directory):
        given = [n for n, v in (("--top-k", top_k), ("--hardware", hardware),
                                ("--target", target)) if v is not None]  # fmt: skip
        if given:
            raise TensortuneError(f"{given[0]} applies to a directory export: a copy to another "
                                  "store takes every record")  # fmt: skip
        _copy(records, directory, params=("records", "directory"), verb="exported")
        return
    target = _checked_target(target)
    with _opened(records) as store:
        done = export_records(store, Path(directory), top_k=top_k, hardware_id=hardware,
                              target=target)  # fmt: skip
    left_out = (f"; {done.skipped} left out: they do not convert (a trace that no longer "
                "replays on its workload)") if done.skipped else ""  # fmt: skip
    console.print(f"exported {done.records} records of {done.workloads} workloads "
                  f"(hardware {done.hardware_id}) to {directory}{left_out}")  # fmt: skip


def _copy(src: str, dst: str, *, params: tuple[str, str], verb: str) -> None:
    """Every record of store ``src`` into store ``dst`` (only those it lacks); ``params``:
    the API parameters that name them, for errors."""
    from tensortune.records import check_url
    from tensortune.records.interop import copy_records

    with about(params[1]):
        check_url(dst)  # a mistyped URL is said before the source is opened
    with about(params[0]):
        source = open_records(src, create=False)
    with source:
        with about(params[1]):
            target = open_records(dst, create=True)
        with target:
            done = copy_records(source, target)
        console.print(f"{verb} {done.records} records of {done.workloads} workloads from "
                      f"{source.url} to {target.url} ({done.skipped} already there)")  # fmt: skip


@app.command("import")
def import_(
    directory: Annotated[
        str,
        typer.Argument(
            metavar="DIR|URL",
            help="A MetaSchedule JSON database directory, or "
            "another records store's URL to copy every record from.",
        ),
    ],
    records: RecordsOpt = DEFAULT_URL,
    measured_here: Annotated[
        bool,
        typer.Option(
            "--measured-here",
            help="The records were measured on this machine: use them when tuning here.",
        ),
    ] = False,
) -> None:
    """Add a MetaSchedule JSON database's records to the store, or copy every record of
    another store (which keeps its hardware ids: --measured-here does not apply).

    Example: tensortune records import best-db --records sqlite:///r.db --measured-here
    Example: tensortune records import postgresql://me@dbhost/tuning --records sqlite:///r.db
    """
    from tensortune.records.interop import import_records
    from tensortune.records.ms_json import check_database

    rename_options({"directory": "DIR|URL"})
    if names_a_url(directory):
        if measured_here:
            raise TensortuneError("--measured-here applies to a MetaSchedule database: a copy "
                                  "from another store keeps its hardware ids")  # fmt: skip
        _copy(directory, records, params=("directory", "records"), verb="imported")
        return
    with about("directory"):
        check_database(directory)  # before the store is created: a refused import leaves no file
    with _opened(records, create=True) as store, about("directory"):
        done = import_records(store, Path(directory), measured_here=measured_here)
    console.print(f"imported {done.records} records of {done.workloads} workloads "
                  f"({done.skipped} already present) as hardware {done.hardware_id}")  # fmt: skip
    if not measured_here:
        console.print("they are not used when tuning on this machine; pass --measured-here "
                      "if they were measured here")  # fmt: skip
