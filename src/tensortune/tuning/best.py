"""What tuning found: the best program of each workload in a records store."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from tensortune.errors import RecordsError, about, check_flags, last_line
from tensortune.records import RecordStore, records_from

if TYPE_CHECKING:
    from tensortune.hardware import Platform


@dataclass
class BestProgram:
    """A workload's best successful record on one hardware and target."""

    workload_id: int
    workload: str
    hardware_id: str
    target: str
    trials: int
    ok: int
    best_seconds: float | None
    flop: float
    tir: str | None = None  # the best program's scheduled TIR, when asked for

    @property
    def gflops(self) -> float | None:
        if not self.best_seconds or not self.flop:
            return None
        return self.flop / self.best_seconds / 1e9

    def to_dict(self) -> dict:
        return {**asdict(self), "gflops": self.gflops}


def best_programs(
    records: str | RecordStore,
    *,
    hardware_id: str | None = None,
    target: str | dict | Platform | None = None,
    workload: str | None = None,
    tir: bool = False,
) -> list[BestProgram]:
    """Per workload, hardware and target of the store (optionally only ``hardware_id``,
    ``target``: a target dict, its JSON text, a ``Platform`` or the canonical text records are
    keyed by, and workloads whose name contains ``workload``): the
    trials, the successful ones and the best latency, with the scheduled TIR of the best
    program when ``tir``."""
    from tensortune.hardware import stored_target_key
    from tensortune.records.convert import candidate_from_trace
    from tensortune.workloads.sources import workload_flop

    check_flags(tir=tir)
    out = []
    with records_from(records, create=False) as store:
        modules: dict[int, object] = {}
        rows = store.summary()
        if target is not None:
            with about("target"):
                target = stored_target_key(target, {row[3] for row in rows})
        for name, wid, hw, tgt, n, ok, best in rows:
            if (hardware_id and hw != hardware_id) or (target and tgt != target):
                continue
            if workload and workload not in name:
                continue
            if wid not in modules:
                modules[wid] = store.workload(wid).mod()
            flop = workload_flop(name, modules[wid])
            program = BestProgram(wid, name, hw, tgt, n, ok, best, flop)
            if tir and best is not None:
                record = next(store.query(workload_id=wid, hardware_id=hw, target=tgt,
                                          ok_only=True, best_first=True, limit=1))  # fmt: skip
                try:
                    replayed = candidate_from_trace(modules[wid], record.trace)
                except Exception as e:  # a trace that is not JSON, or not of this workload
                    raise RecordsError(f"the best record of workload {wid} ({name}) is damaged: "
                                       f"its trace does not replay ({type(e).__name__}: "
                                       f"{last_line(e)})", param="records") from None  # fmt: skip
                program.tir = replayed.sch.mod.script()
            out.append(program)
    return out
