"""What one measurement record holds, and the store's schema version."""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any

from tensortune.errors import RecordsError, last_line

# Bump with a migration in sqlite.py and postgres.py whenever the tables change.
# v2: task_sources (which networks a workload is a task of, and how often it occurs there).
# v3: records.trace_hash (what leases name a candidate by), records.uid (a record committed
#     twice, by a retried transaction or a second copy between stores, is kept once) and
#     claims (the leases of candidates being measured; ``RecordStore.claim``).
# v4: records.origin (where a schedule came from, when it was not measured from scratch here:
#     ``origin_of``).
# (A change of the rows alone is no new version, which older tensortune processes sharing the
# store would refuse: see ``sql.TIMES_CHECKED``.)
SCHEMA_VERSION = 4


def positive_seconds(secs: object) -> bool:
    """Whether ``secs`` is a list (or tuple) of run times every read of a store accepts:
    positive seconds that fit a float (a zero or negative time would rank as the fastest
    schedule of its task; an integer past a float's range overflows)."""
    return isinstance(secs, list | tuple) and all(
        type(x) in (int, float) and 0 < x <= sys.float_info.max for x in secs
    )


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
    # JSON text saying where the schedule came from, e.g. {"kind": "transfer", "from": ...};
    # empty for a record measured from scratch.  Last, so positional constructions still work.
    origin: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok" and bool(self.run_secs)

    @property
    def cost(self) -> float:
        """Median run time in seconds; infinite for failed measurements."""
        return statistics.median(self.run_secs) if self.ok else float("inf")

    def trace_json(self) -> list:
        return json.loads(self.trace)


def origin_of(record: Record) -> dict[str, Any]:
    """A record's ``origin`` as a dict: ``{}`` when it has none.

    Whoever reads this is showing or filtering records, not validating them: a malformed origin
    (written by a foreign tool, or by hand) counts as none rather than stopping the reader.
    """
    if not record.origin:
        return {}
    try:
        value = json.loads(record.origin)
    except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
        return {}
    return value if isinstance(value, dict) else {}


def origin_kind(record: Record | None) -> str:
    """The ``kind`` of a record's origin ("transfer", "untuned", ...): "" for no record, no
    origin, or a malformed one."""
    kind = origin_of(record).get("kind", "") if record is not None else ""
    return kind if isinstance(kind, str) else ""


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
        return read_module(self.mod_json, self.id)


def read_module(mod_json: str, workload_id: int) -> object:
    """A stored workload's module; a ``RecordsError`` where the store's text is not one."""
    from tensortune.compat import load_ir_json

    try:
        return load_ir_json(mod_json)
    except Exception as e:  # TVM's errors have no common base class
        raise RecordsError(f"workload {workload_id}: its module cannot be read "
                           f"({last_line(e)})") from None  # fmt: skip
