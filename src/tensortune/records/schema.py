"""What one measurement record holds, and the store's schema version."""

from __future__ import annotations

import hashlib
import json
import statistics
from dataclasses import dataclass, field

# Bump with a migration in sqlite.py whenever the tables change.
# v2: task_sources (which networks a workload is a task of, and how often it occurs there).
# v3: records.trace_hash (what leases name a candidate by), records.uid (a record committed
#     twice, by a retried transaction or a second copy between stores, is kept once) and
#     claims (the leases of candidates being measured; ``RecordStore.claim``).
SCHEMA_VERSION = 3


def trace_hash(trace: str) -> str:
    """The name of a candidate in leases and copies: a digest of its trace's JSON text."""
    return hashlib.sha256(trace.encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Record:
    """One measured candidate: a schedule (trace) of a workload on a hardware/target.

    ``run_secs`` holds every timing repeat; ``cost`` is their median.  ``trace`` and
    ``args_info`` are MetaSchedule's JSON forms as text, ``target`` the canonical target text.
    """

    workload_id: int
    hardware_id: str
    target: str
    trace: str
    args_info: str
    run_secs: tuple[float, ...]
    status: str
    error: str | None = None
    run_id: str = ""
    tvm_version: str = ""
    created_at: float = 0.0
    id: int | None = field(default=None, compare=False)
    # Given by the store that first commits the record, kept by every copy of it.
    uid: str = field(default="", compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and bool(self.run_secs)

    @property
    def cost(self) -> float:
        """Median run time in seconds; infinite for failed measurements."""
        return statistics.median(self.run_secs) if self.ok else float("inf")

    def trace_json(self) -> list:
        return json.loads(self.trace)


@dataclass(frozen=True, slots=True)
class TaskSource:
    """Workload ``workload_id`` is task ``task_name`` of ``network``, occurring ``weight`` times."""

    network: str
    workload_id: int
    task_name: str
    weight: int


@dataclass(frozen=True, slots=True)
class StoredWorkload:
    id: int
    shash: str
    name: str
    mod_json: str

    def mod(self):
        from tensortune.compat import tvm

        return tvm.ir.load_json(self.mod_json)
