"""Where transferred schedules come from: the best records of other kernels, by kernel class."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tensortune.errors import TensortuneError
from tensortune.records import RecordStore, records_from, redact
from tensortune.records.schema import origin_kind
from tensortune.transfer.classes import KernelClass, kernel_class

if TYPE_CHECKING:
    from tensortune.hardware import Platform
    from tensortune.records.schema import Record


@dataclass(frozen=True)
class SourceSchedule:
    """The best successful record of one workload of a source store."""

    store_url: str  # redacted
    workload: str
    kclass: KernelClass
    mod: object
    record: Record

    def origin(self, inlined: int = 0) -> str:
        """What a record made from this schedule says of where it came from (``inlined``: how
        many of the target's epilogue blocks were inlined to fit it)."""
        where = {"kind": "transfer", "from": self.store_url, "workload": self.workload,
                 "uid": self.record.uid, "cost": self.record.cost}  # fmt: skip
        return json.dumps({**where, "inlined": inlined} if inlined else where)


SourceStores = str | os.PathLike | RecordStore | Sequence[str | os.PathLike | RecordStore]


def source_schedules(stores: SourceStores, platform: Platform, per_workload: int = 1, *,
                     param: str = "sources",
                     required: bool = True) -> dict[str, list[SourceSchedule]]:  # fmt: skip
    """Per kernel-class key, the ``per_workload`` best records of every workload the stores hold
    for ``platform``'s target (measured on any hardware, this one's first).  Stores that hold
    none are refused in one line when they are ``required``: a transfer from them would only
    time each kernel's untuned and fallback programs, and record them, with nothing
    transferred."""
    if isinstance(stores, str | os.PathLike | RecordStore) or not isinstance(stores, Iterable):
        stores = [stores]
    out: dict[str, list[SourceSchedule]] = {}
    with contextlib.ExitStack() as opened:
        # Every one opened (or refused, in one line naming ``param``) before any is read.
        given = [opened.enter_context(records_from(s, create=False, param=param))
                 for s in stores]  # fmt: skip
        for store in given:
            for src in _store_sources(store, platform, per_workload):
                out.setdefault(src.kclass.key, []).append(src)
        if not out and required:
            raise TensortuneError(_nothing_for(given, platform.key), param=param)
    return out


def _nothing_for(stores: list[RecordStore], target: str) -> str:
    """Why ``stores`` give no source for ``target``, and what targets they do hold."""
    one = len(stores) == 1
    held = {t for s in stores for *_, t, _, ok, _ in s.summary() if ok}
    says = (f"{', '.join(s.url for s in stores)} {'holds' if one else 'hold'} no successful "
            f"schedule for the target {target}")  # fmt: skip
    if target in held:  # only programs that are no source: untuned ones
        return says + f" ({'its' if one else 'their'} records for it are of untuned programs)"
    others = sorted(held)
    return says + (f"; {'its' if one else 'their'} schedules are for {'; '.join(others)}"
                   if others else "")  # fmt: skip


def _schedules(record: Record) -> bool:
    """Whether the record's trace holds any instruction (an untuned program's holds none)."""
    try:
        return bool(json.loads(record.trace)[0])
    except (ValueError, IndexError, TypeError, KeyError):
        return True  # not ours to judge here: replaying it will say


def _store_sources(store: RecordStore, platform: Platform, per_workload: int) -> list:
    here = platform.hardware.id
    others = [h for h in store.hardware() if h != here]
    found = []
    for w in store.workloads():
        best: list[Record] = []
        for hw in [here, *others]:
            # Not an untuned record (a transfer's store holds one a kernel, hence two rows
            # more than needed): its empty trace would time the target's own bare loops.  Its
            # label is not enough: a MetaSchedule database carries no origins, so one taken
            # through `records export` and `import` holds them unlabelled.
            ranked = store.query(workload_id=w.id, hardware_id=hw, target=platform.key,
                                 ok_only=True, best_first=True, limit=per_workload + 2)  # fmt: skip
            best = list(itertools.islice((r for r in ranked if origin_kind(r) != "untuned"
                                          and _schedules(r)), per_workload))  # fmt: skip
            if best:
                break
        if not best:
            continue
        mod = w.mod()
        kclass = kernel_class(mod)
        found += [SourceSchedule(redact(store.url), w.name, kclass, mod, r) for r in best]
    return found
