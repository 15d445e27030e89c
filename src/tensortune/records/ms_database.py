"""MetaSchedule ``Database`` over a tensortune records store.

TVM's own ``tune_tasks`` and ``relax.transform.MetaScheduleApplyDatabase`` read and write our
store through this adapter.  It only ever returns records measured on ``hardware`` (by default
this machine), so records from other machines are never mistaken for local ones.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import TypeVar

from tensortune.compat import (
    TVM_VERSION,
    ArgInfo,
    PyDatabase,
    TuningRecord,
    Workload,
    block_names,
    derived_object,
    tvm,
)
from tensortune.errors import RecordsError
from tensortune.hardware import Hardware, Platform, current_hardware, target_key
from tensortune.measure.status import FAILED_COST
from tensortune.records.convert import (
    args_info_text,
    block_renames,
    to_tuning_record,
    trace_text,
)
from tensortune.records.schema import Record, positive_seconds
from tensortune.records.storage import RecordStore

T = TypeVar("T")


def _kept(method: Callable[..., T]) -> Callable[..., T]:
    """Remember the store's first error in ``self.error`` before it goes on: MetaSchedule's
    search calls these from C++, which hands the exception on as a plain ``RuntimeError``
    (and a search strategy may take that for its own failure on one task)."""

    @functools.wraps(method)
    def kept(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except RecordsError as e:
            if self.error is None:
                self.error = e
            raise

    return kept


@derived_object
class StoreDatabase(PyDatabase):
    """A ``PyDatabase`` view of ``store`` for one hardware (and, optionally, one target).

    ``target`` is a target dict or a ``Platform`` (whose hardware is then the default);
    ``pinned`` (workload id → record) overrides the stored best that a workload's query
    returns, e.g. with the record that was fastest when its best few were timed again.
    """

    def __init__(
        self,
        store: RecordStore,
        *,
        hardware: Hardware | None = None,
        target: dict | Platform | None = None,
        run_id: str = "",
        pinned: dict[int, Record] | None = None,
    ) -> None:
        super().__init__()
        if isinstance(target, Platform):
            hardware = hardware or target.hardware
            self.target: str | None = target.key
        else:
            self.target = target_key(target) if target is not None else None
        self.store = store
        # registered in the store with the first record committed, not here: a database that
        # only reads (``compile``'s) writes nothing, and so reads a store it may not write
        self._hardware = hardware or current_hardware()
        self._registered = False
        self.hardware_id = self._hardware.id
        self.run_id = run_id
        self.pinned = dict(pinned or {})
        self._stored_names: dict[int, list[str]] = {}  # workload id → its blocks' names
        self.error: RecordsError | None = None  # the store's first error (``_kept``)

    @_kept
    def has_workload(self, mod) -> bool:
        return self.store.workload_id(mod, create=False) is not None

    @_kept
    def commit_workload(self, mod) -> Workload:
        self.store.workload_id(mod)
        return Workload(mod)

    @_kept
    def commit_tuning_record(self, record: TuningRecord) -> None:
        secs = [float(s) for s in record.run_secs or []]
        ok = bool(secs) and max(secs) < FAILED_COST / 10 and positive_seconds(secs)
        # Both are optional in MetaSchedule's records (its JSON and memory databases take
        # them without): this database's target, and the arguments of the workload's entry.
        if record.target is not None:
            target = target_key(record.target)
        elif self.target is not None:
            target = self.target
        else:
            raise RecordsError("a tuning record without a target, committed to a database "
                               "that has none either: give the database a target")  # fmt: skip
        args_info = record.args_info
        if args_info is None:
            args_info = ArgInfo.from_entry_func(record.workload.mod, remove_preproc=True)
        if not self._registered:
            self.store.register_hardware(self._hardware)
            self._registered = True
        self.store.add([
            Record(
                workload_id=self.store.workload_id(record.workload.mod),
                hardware_id=self.hardware_id,
                target=target,
                trace=trace_text(record.trace),
                args_info=args_info_text(args_info),
                run_secs=tuple(secs) if ok else (),
                status="ok" if ok else "run_error",
                error=None if ok else "failed (reported by MetaSchedule without a message)",
                run_id=self.run_id,
                tvm_version=TVM_VERSION,
                created_at=time.time(),
            )
        ])  # fmt: skip

    def _records(self, wid: int | None, target: str | None, limit: int | None) -> list[Record]:
        if wid is None:
            return []
        return list(
            self.store.query(
                workload_id=wid,
                hardware_id=self.hardware_id,
                target=target,
                ok_only=True,
                best_first=True,
                limit=limit,
            )
        )

    def _as_asked(self, records: list[Record], wid: int | None, mod,
                  want: int | None = None) -> list[tuple[TuningRecord, Record]]:  # fmt: skip
        """``records`` of workload ``wid`` as MetaSchedule's records of ``mod`` (the first
        ``want`` that convert), their traces' blocks renamed to ``mod``'s where its names
        differ from the stored twin's (a layer norm of a ``torch.compile`` graph finding the
        records of the same one cut from the whole model: ``convert.block_renames``).

        A record whose trace no longer replays (another TVM version's, a twin's block TVM
        cannot find) is passed over, as an export passes it over: raised, it ended every
        search and build of its workload.  A damaged one (``RecordsError``) is the store's
        error, and raised."""
        if not records:
            return []
        if wid not in self._stored_names:
            self._stored_names[wid] = block_names(self.store.workload(wid).mod())
        names = block_renames(self._stored_names[wid], block_names(mod))
        workload = Workload(mod)
        out = []
        for r in records:
            try:
                out.append((to_tuning_record(r, workload, names), r))
            except RecordsError:
                raise
            except Exception:  # TVM's replay refused it
                continue
            if want is not None and len(out) >= want:
                break
        return out

    def _best(self, wid: int | None, target: str | None, k: int,
              mod) -> list[tuple[TuningRecord, Record]]:  # fmt: skip
        """The fastest ``k`` records of ``wid`` that replay on ``mod`` (MetaSchedule's top k
        are valid records): past one that does not, the next best."""
        limit = k
        while True:
            records = self._records(wid, target, limit)
            found = self._as_asked(records, wid, mod, want=k)
            if len(found) >= k or len(records) < limit:
                return found
            limit *= 4

    @_kept
    def get_top_k(self, workload: Workload, top_k: int) -> list[TuningRecord]:
        wid = self.store.workload_id(workload.mod, create=False)
        return [t for t, _ in self._best(wid, self.target, top_k, workload.mod)]

    @_kept
    def outcomes(self, mod, limit: int = 256) -> list[tuple[TuningRecord, bool]]:
        """Earlier measurements of ``mod`` on this hardware and target, failures included
        (MetaSchedule's queries return only programs that ran), with whether each ran: up to
        ``limit`` of each kind (the newest), for what learns which programs fail (ALT's
        validity filter warm-starts on them)."""
        wid = self.store.workload_id(mod, create=False)
        if wid is None:
            return []
        kept: dict[bool, list[Record]] = {True: [], False: []}
        for r in self.store.query(workload_id=wid, hardware_id=self.hardware_id,
                                  target=self.target):  # fmt: skip
            kept[r.ok].append(r)
        picked = [r for group in kept.values() for r in (group[-limit:] if limit > 0 else [])]
        return [(t, r.ok) for t, r in self._as_asked(picked, wid, mod)]

    @_kept
    def get_all_tuning_records(self) -> list[TuningRecord]:
        out = []
        for w in self.store.workloads():
            records = list(self.store.query(workload_id=w.id, hardware_id=self.hardware_id,
                                            target=self.target))  # fmt: skip
            out += [t for t, _ in self._as_asked(records, w.id, w.mod())]
        return out

    def chosen_record(self, mod, target) -> Record | None:
        """The stored record a build of ``mod`` for ``target`` takes: the pinned one, else the
        fastest that replays on ``mod``; ``None`` when there is none.  Ours, not
        MetaSchedule's, so its ``origin`` says where the schedule came from."""
        chosen = self._chosen(mod, target)
        return chosen[1] if chosen else None

    def _chosen(self, mod, target) -> tuple[TuningRecord, Record] | None:
        """The record a build takes, as MetaSchedule's and as ours (``chosen_record``)."""
        tkey = target_key(target)
        wid = self.store.workload_id(mod, create=False)
        pinned = self.pinned.get(wid) if self.pinned else None
        if pinned is not None and pinned.target == tkey:
            found = self._as_asked([pinned], wid, mod)
            if found:
                return found[0]
        found = self._best(wid, tkey, 1, mod)
        return found[0] if found else None

    @_kept
    def query_tuning_record(self, mod, target, workload_name: str | None = None):
        chosen = self._chosen(mod, target)
        return chosen[0] if chosen else None

    def query_schedule(self, mod, target, workload_name: str | None = None):
        record = self.query_tuning_record(mod, target, workload_name)
        if record is None:
            return None
        sch = tvm.s_tir.Schedule(mod)
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        return sch

    def query_ir_module(self, mod, target, workload_name: str | None = None):
        sch = self.query_schedule(mod, target, workload_name)
        return None if sch is None else sch.mod

    @_kept
    def __len__(self) -> int:
        return self.store.count(hardware_id=self.hardware_id, target=self.target)
