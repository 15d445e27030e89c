"""Import from and export to MetaSchedule's JSON database directories.

A JSON database has no notion of hardware.  Exported files hold one hardware's records; imported
records are tagged with the hardware the user vouches for, or with a stand-in id that keeps them
out of tuning on this machine.  Nor does it name workloads: an export writes their names beside
it (``NAMES_FILE``, which TVM ignores), and an import (or ``tune --workloads-from``) reads them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tensortune.errors import RecordsError, about, check_count, check_flags, last_line
from tensortune.hardware import (
    Hardware,
    Platform,
    current_hardware,
    stored_target_key,
    target_key,
)
from tensortune.measure.status import FAILED_COST
from tensortune.records import names_a_url, records_from
from tensortune.records.convert import args_info_text, to_tuning_record, trace_text
from tensortune.records.ms_json import check_database, read_in_order
from tensortune.records.schema import Record
from tensortune.records.storage import RecordStore
from tensortune.workloads.sources import NAMES_FILE, workload_names

_FILES = ("database_workload.json", "database_tuning_record.json")


@dataclass(frozen=True)
class Transfer:
    workloads: int
    records: int
    skipped: int = 0
    hardware_id: str = ""


def export_records(
    store: RecordStore | str | os.PathLike,
    directory: str | Path,
    *,
    top_k: int | None = None,
    hardware_id: str | None = None,
    target: str | dict | Platform | None = None,
) -> Transfer:
    """Write one hardware's records (default: this machine's) from ``store`` (a records store
    or its URL) as a MetaSchedule JSON database, with the workloads' names beside it.  Another
    store is copied into with ``copy_records``.

    With ``top_k``, only the k fastest successful records of each workload and target; with
    ``target`` (a target dict, its JSON text, a ``Platform`` or the canonical text records are
    keyed by, ``Platform.key``), only that target's records.  Records whose traces no longer
    replay on their workload are left out (``skipped``).
    """
    if top_k is not None:
        check_count(top_k, "top_k")
    out = _directory(directory)
    with records_from(store, create=False, param="store") as opened:
        if target is not None:
            with about("target"):
                target = stored_target_key(target, {row[3] for row in opened.summary()})
        return _export_checked(opened, out, top_k, hardware_id, target)


def _directory(directory: str | os.PathLike) -> Path:
    """A MetaSchedule database's directory, refused in one line where it is none: an empty
    name (the working directory, files and all) or a store's URL, which ``Path`` folded into a
    local folder (``postgresql:/me@db/tuning``)."""
    text = os.fspath(directory)
    if not str(text).strip():
        raise RecordsError("give a directory, not an empty name", param="directory")
    if isinstance(text, str) and names_a_url(text):
        raise RecordsError(f"{text} names a records store, not a directory: copy between stores "
                           "with copy_records(src, dst)", param="directory")  # fmt: skip
    return Path(text)


def _export_checked(store: RecordStore, out: Path, top_k: int | None, hardware_id: str | None,
                    target: str | None) -> Transfer:  # fmt: skip
    hw = hardware_id or current_hardware().id
    known = store.hardware()
    if hw not in known:
        raise RecordsError(f"no records of hardware {hw} in {store.url} (it has: "
                           f"{', '.join(known) or 'none'})", param="hardware_id")  # fmt: skip
    if target is not None and not store.count(hardware_id=hw, target=target):
        raise RecordsError(f"no records of this target on hardware {hw} in {store.url} (see "
                           "`tensortune records stats`)", param="target")  # fmt: skip
    if out.exists() and not out.is_dir():
        raise RecordsError(f"{out} exists and is not a directory", param="directory")
    if (out / _FILES[1]).exists():
        raise RecordsError(f"{out} already holds a MetaSchedule database; choose a new directory",
                           param="directory")  # fmt: skip
    if (out / _FILES[0]).exists():  # the records file is moved in last
        raise RecordsError(f"{out} holds part of a MetaSchedule database ({_FILES[0]} without "
                           f"{_FILES[1]}: an export that stopped half way?); remove it or "
                           "choose a new directory", param="directory")  # fmt: skip
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RecordsError(f"cannot create {out}: {e.strerror}", param="directory") from None
    # Written beside, then moved in: an export that stops half way leaves no database that
    # TVM would read with records missing, and no files that refuse the rerun.
    partial = Path(tempfile.mkdtemp(prefix=".export-", dir=out))
    try:
        done = _export(store, partial, top_k, hw, target)
        for name in (NAMES_FILE, *_FILES):  # the records file last (see above)
            os.replace(partial / name, out / name)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return done


def _export(store: RecordStore, out: Path, top_k: int | None, hw: str,
            target: str | None) -> Transfer:  # fmt: skip
    from tensortune.compat import Workload, ms

    db = ms.database.JSONDatabase(work_dir=str(out))
    n_workloads = n_records = skipped = 0
    names: dict[str, str] = {}
    for w in store.workloads():
        # Written in the order they were measured (the store's order), as MetaSchedule writes
        # its own: a reader that takes "the first K" (``finetune``) gets the first measured.
        records = list(store.query(workload_id=w.id, hardware_id=hw, target=target,
                                   ok_only=top_k is not None,
                                   best_first=top_k is not None))  # fmt: skip
        if top_k is not None:
            per_target: dict[str, int] = {}
            kept = []
            for r in records:
                per_target[r.target] = per_target.get(r.target, 0) + 1
                if per_target[r.target] <= top_k:
                    kept.append(r)
            records = sorted(kept, key=lambda r: r.id or 0)  # the best k, in measured order
        workload = Workload(w.mod())
        converted = []
        for r in records:
            try:
                converted.append(to_tuning_record(r, workload))
            except Exception:  # a trace that no longer replays (another TVM wrote it): left out
                skipped += 1
        if not converted:
            continue
        committed = db.commit_workload(w.mod())
        names[w.shash] = w.name
        n_workloads += 1
        for tr in converted:
            db.commit_tuning_record(ms.database.TuningRecord(
                tr.trace, committed, tr.run_secs, tr.target, tr.args_info))  # fmt: skip
            n_records += 1
    (out / NAMES_FILE).write_text(json.dumps({"names": names}, indent=1))
    return Transfer(n_workloads, n_records, skipped, hardware_id=hw)


def import_records(
    store: RecordStore | str | os.PathLike,
    directory: str | Path,
    *,
    measured_here: bool = False,
    run_id: str = "",
) -> Transfer:
    """Add a MetaSchedule JSON database's records to ``store`` (a records store or its URL,
    made if new), skipping ones already there.

    Without ``measured_here`` the records get a stand-in hardware id derived from the files, so
    they are kept and exported but never taken as this machine's measurements.  Workloads keep
    the names an export wrote beside the database (else ``DIRNAME.w``).
    """
    check_flags(measured_here=measured_here)
    src = _directory(directory)
    check_database(src)  # TVM's reader trusts the files: a malformed line could crash it
    with records_from(store, param="store") as opened:
        return _import_checked(opened, src, measured_here, run_id)


def _import_checked(store: RecordStore, src: Path, measured_here: bool,
                    run_id: str) -> Transfer:  # fmt: skip
    from tensortune.compat import TVM_VERSION, structural_hash

    names = workload_names(src)
    try:
        # Everything TVM may refuse is read before the store is touched: a refused database
        # leaves the store as it was.  In the file's order: the store's program ids then
        # follow the order of measurement (``finetune`` takes the first K).
        read = [(tr.workload.mod, trace_text(tr.trace), target_key(tr.target),
                 args_info_text(tr.args_info), tuple(float(s) for s in tr.run_secs or []))
                for tr in read_in_order(src)]  # fmt: skip
        named = [names.get(structural_hash(mod), f"{src.name}.w") for mod, *_ in read]
    except Exception as e:
        raise RecordsError(f"cannot read MetaSchedule database {src}: {last_line(e)}") from None
    hw_id = _import_hardware(store, src, measured_here, read)
    seen: dict[int, set[tuple[str, str]]] = {}
    batch: list[Record] = []
    skipped = 0
    workload_ids: set[int] = set()
    now = time.time()
    for (mod, trace, target, args_info, secs), name in zip(read, named, strict=True):
        wid = store.workload_id(mod, name)
        if wid not in seen:
            seen[wid] = {(r.trace, r.target) for r in store.query(workload_id=wid,
                                                                  hardware_id=hw_id)}  # fmt: skip
        key = (trace, target)
        if key in seen[wid]:
            skipped += 1
            continue
        seen[wid].add(key)
        workload_ids.add(wid)
        stored = _stored_secs(secs)
        batch.append(
            Record(
                wid,
                hw_id,
                target,
                trace,
                args_info,
                stored,
                "ok" if stored else "run_error",
                None if stored else "failed (imported from a MetaSchedule database)",
                run_id,
                TVM_VERSION,
                now,
            )
        )
    store.add(batch)  # one transaction: a failed import adds no record (its workloads stay)
    return Transfer(len(workload_ids), len(batch), skipped, hw_id)


def _stored_secs(secs: tuple[float, ...]) -> tuple[float, ...]:
    """A database record's run times as the store keeps them: none for a failure."""
    return secs if secs and max(secs) < FAILED_COST / 10 else ()


def _import_hardware(store: RecordStore, src: Path, measured_here: bool, read: list) -> str:
    """The hardware id the records of ``src`` (``read``: its records, as ``_import_checked``
    reads them) are stored under: this machine's with ``measured_here``, else a stand-in."""
    if measured_here:
        return store.register_hardware(current_hardware())
    digest = hashlib.sha256()
    for f in _FILES:
        digest.update((src / f).read_bytes())
    tag = (f"import-{digest.hexdigest()[:12]}",)
    # The files alone name the stand-in: the same database imported from another directory
    # (moved, or a colleague's copy into a shared store) finds its records already there.
    # Stand-ins registered before named their directory too; one of them is reused.
    stand_ins = {hw_id: known for hw_id, known in store.hardware().items()
                 if known.arch == "unknown" and len(known.isa) == 1
                 and known.isa[0].startswith("import-")}  # fmt: skip
    for hw_id, known in stand_ins.items():
        if known.isa == tag:
            return hw_id
    grown = _grown_from(store, stand_ins, read)
    if grown is not None:
        return grown
    stand_in = Hardware(cpu_model="unknown (imported from a MetaSchedule database)",
                        arch="unknown", cores=0, isa=tag)  # fmt: skip
    return store.register_hardware(stand_in)


def _grown_from(store: RecordStore, stand_ins: dict[str, Hardware], read: list) -> str | None:
    """The stand-in whose every record is one of ``read``, timings and all: the database was
    imported before and has grown since (MetaSchedule appends to its files), and only its new
    records are to be added.  Another machine's own database never holds this one's timings;
    a copy of it tuned further elsewhere does, and its new records come in under this
    stand-in (a stand-in says only "not measured here")."""
    ids = {}
    for mod, *_ in read:
        if id(mod) not in ids:
            ids[id(mod)] = store.workload_id(mod, create=False)
    mine = {(ids[id(mod)], trace, target, args, _stored_secs(secs))
            for mod, trace, target, args, secs in read}  # fmt: skip
    for hw_id in stand_ins:
        held = [(r.workload_id, r.trace, r.target, r.args_info, tuple(r.run_secs))
                for r in store.query(hardware_id=hw_id)]  # fmt: skip
        if held and all(r in mine for r in held):
            return hw_id
    return None


def copy_records(src: RecordStore | str | os.PathLike, dst: RecordStore | str | os.PathLike, *,
                 chunk: int = 2000) -> Transfer:  # fmt: skip
    """Copy every workload, hardware description, task source and record of ``src`` into
    ``dst`` (stores or their URLs, ``dst`` made if new: SQLite to PostgreSQL and back).
    Records keep their ``uid``, so copying again, or after an interrupted copy, adds only what
    ``dst`` lacks; each chunk of records is one transaction."""
    with (records_from(src, create=False, param="src") as source,
          records_from(dst, param="dst") as target):  # fmt: skip
        return _copy(source, target, chunk)


def _copy(src: RecordStore, dst: RecordStore, chunk: int) -> Transfer:
    from dataclasses import replace

    from tensortune.records.schema import TaskSource

    for hardware in src.hardware().values():
        dst.register_hardware(hardware)
    ids = {w.id: dst.workload_id(w.mod(), w.name) for w in src.workloads()}
    dst.add_task_sources(TaskSource(s.network, ids[s.workload_id], s.task_name, s.weight)
                         for s in src.task_sources())  # fmt: skip
    before, total = dst.count(), 0
    for old, new in ids.items():
        records = [replace(r, workload_id=new) for r in src.query(workload_id=old)]
        total += len(records)
        for k in range(0, len(records), chunk):
            dst.add(records[k : k + chunk])
    added = dst.count() - before
    return Transfer(len(ids), added, skipped=total - added)
