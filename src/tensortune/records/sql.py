"""What the SQL stores share: the tables, the queries and the leases, written once.

SQLite (``sqlite.py``) and PostgreSQL (``postgres.py``) differ in how they connect, how a
transaction starts, what an error means, a few words of DDL and the placeholder; every query
here is written with ``?`` and run through the dialect's cursor.

Leases (``claims``) keep two workers from measuring the same candidate: a worker claims the
candidates of a batch before it measures them, and the transaction that commits their records
drops their claims.  A claim expires by the database's clock, so the claims of a worker that
died are free again after ``seconds``, whichever machine's clock is off.
"""

from __future__ import annotations

import abc
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

from tensortune.errors import RecordsError
from tensortune.hardware import Hardware
from tensortune.hardware.target import is_target_text
from tensortune.records.schema import (
    SCHEMA_VERSION,
    Record,
    StoredWorkload,
    TaskSource,
    positive_seconds,
    read_module,
    trace_hash,
)
from tensortune.records.storage import ClaimBudget, RecordStore
from tensortune.records.trace_checks import args_info_problem, parsed, trace_problem

T = TypeVar("T")

# {serial}: an auto-numbered primary key; {real}: a double.
TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS hardware (id TEXT PRIMARY KEY, description TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS workloads (
    id {serial},
    shash TEXT NOT NULL,
    name TEXT NOT NULL,
    mod_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS workloads_shash ON workloads (shash);
CREATE TABLE IF NOT EXISTS records (
    id {serial},
    workload_id INTEGER NOT NULL REFERENCES workloads (id),
    hardware_id TEXT NOT NULL REFERENCES hardware (id),
    target TEXT NOT NULL,
    trace TEXT NOT NULL,
    args_info TEXT NOT NULL,
    run_secs TEXT NOT NULL,
    cost {real},
    status TEXT NOT NULL,
    error TEXT,
    run_id TEXT NOT NULL,
    tvm_version TEXT NOT NULL,
    created_at {real} NOT NULL,
    trace_hash TEXT NOT NULL DEFAULT '',
    uid TEXT NOT NULL DEFAULT '',
    origin TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS records_lookup ON records (workload_id, hardware_id, target, cost);
CREATE TABLE IF NOT EXISTS task_sources (
    network TEXT NOT NULL,
    workload_id INTEGER NOT NULL REFERENCES workloads (id),
    task_name TEXT NOT NULL,
    weight INTEGER NOT NULL,
    PRIMARY KEY (network, workload_id)
);
CREATE UNIQUE INDEX IF NOT EXISTS records_uid ON records (uid);
CREATE INDEX IF NOT EXISTS records_trace ON records (workload_id, hardware_id, target, trace_hash);
CREATE TABLE IF NOT EXISTS claims (
    workload_id INTEGER NOT NULL,
    hardware_id TEXT NOT NULL,
    target TEXT NOT NULL,
    trace_hash TEXT NOT NULL,
    worker TEXT NOT NULL,
    expires_at {real} NOT NULL,
    PRIMARY KEY (workload_id, hardware_id, target, trace_hash)
);
"""

# The table names a tensortune store has; a database holding some of them but no ``meta``
# belongs to someone else.
TABLE_NAMES = ("meta", "hardware", "workloads", "records", "task_sources", "claims")

COLUMNS = (
    "workload_id, hardware_id, target, trace, args_info, run_secs, status, error, run_id, "
    "tvm_version, created_at, id, uid, origin, cost"
)


def statements(ddl: str) -> list[str]:
    return [s.strip() for s in ddl.split(";") if s.strip()]


def row_to_record(row: tuple) -> Record:
    w, h, t, trace, args, secs, status, err, run, ver, at, rid, uid, origin, cost = row
    record = Record(w, h, _target_text(t, f"record {rid}"), trace, args, _run_secs(secs, rid),
                    status, err, run, ver, at, rid, uid, origin)  # fmt: skip
    # Queries rank by the cost column ("best" is its least): it must say what the run times
    # say, or an edited row would be chosen (a failed one handed to MetaSchedule as the best).
    if cost != (record.cost if record.ok else None):
        raise RecordsError(f"record {rid} is damaged: its cost is {cost!r}, not the median of "
                           "its run times (none for a failed measurement)")  # fmt: skip
    return record


def _run_secs(text: object, rid: object) -> tuple[float, ...]:
    """A row's run times: a JSON list of positive seconds (empty for a failed measurement).
    Stores are shared files: a row written by another tool or by hand is checked, not trusted."""
    try:
        secs = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):
        secs = None
    if not positive_seconds(secs):
        raise RecordsError(f"record {rid} is damaged: its run times are not a list of "
                           "positive seconds")  # fmt: skip
    return tuple(float(x) for x in secs)


# A key of ``meta``: the store's rows were checked by ``check_run_times``.  Stores created since
# hold it; an older one is checked the first time it is opened by a process that may write it.
TIMES_CHECKED = "run_times_checked"


def check_run_times(cur: Cursor) -> None:
    """Each successful row whose run times are numbers but not all positive seconds
    (``positive_seconds``) made the run error the measuring code writes since, its times
    kept in the error text; ``TIMES_CHECKED`` is set first, so that a process that may not
    write fails before it reads the table.  Versions before 880b850 kept a timer's 0 (and
    imports before 167c1e0 an imported one); every read refused such a row as damaged, and
    with it each summary and query of its workload.  A row damaged otherwise (not JSON, not
    numbers) is left to be refused as before."""
    if cur.execute("SELECT 1 FROM meta WHERE key = ?", (TIMES_CHECKED,)).fetchone():
        return  # another process did it while this one waited for the write lock
    cur.execute("INSERT INTO meta VALUES (?, '1')", (TIMES_CHECKED,))
    bad = []
    for rid, text in cur.execute("SELECT id, run_secs FROM records WHERE status = 'ok'"
                                 ).fetchall():  # fmt: skip
        try:
            secs = json.loads(text)
        except (TypeError, ValueError, RecursionError):
            continue
        numbers = isinstance(secs, list) and all(type(x) in (int, float) for x in secs)
        if numbers and secs and not positive_seconds(secs):
            bad.append((f"the timer returned {secs!r:.80} (kept by an older tensortune as a "
                        "successful run)", rid))  # fmt: skip
    cur.executemany("UPDATE records SET status = 'run_error', run_secs = '[]', cost = NULL, "
                    "error = ? WHERE id = ?", bad)  # fmt: skip


def _target_text(text: object, where: str) -> str:
    """A row's target, checked to be a JSON object (commands parse it to show it)."""
    if not (isinstance(text, str) and is_target_text(text)):
        raise RecordsError(f"{where} is damaged: its target is not a JSON object")
    return text


class Cursor(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> Any: ...


class SQLStore(RecordStore):
    """A records store in a SQL database; subclasses connect and say how to run a write."""

    # How errors name the store: a file path, or a URL without its password.
    name: str
    # SQL for the database's clock in seconds since the epoch (leases expire by it).
    NOW: str

    def __init__(self) -> None:
        self._workload_cache: dict[str, list[tuple[int, object]]] = {}
        # One connection, one statement or transaction at a time: a store object that two
        # threads share (a notebook's background tune and an import) ran a second BEGIN
        # inside the first's transaction.  Reentrant: a transaction's work may read.
        self._lock = threading.RLock()

    @abc.abstractmethod
    def _write(self, fn: Callable[[Cursor], T]) -> T:
        """Run ``fn`` in one transaction: committed whole, or not at all and RecordsError."""

    @abc.abstractmethod
    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]: ...

    # -- schema ------------------------------------------------------------------------------

    def _schema_version(self, meta: dict[str, str]) -> int:
        """The version a ``meta`` table states, refused when it is not ours or too new."""
        if meta.get("app") != "tensortune":
            raise RecordsError(f"{self.name} is not a tensortune records store")
        try:
            version = int(meta.get("schema_version", "0"))
        except ValueError:
            raise RecordsError(
                f"{self.name}: unreadable records schema version {meta['schema_version']!r}"
            ) from None
        if version > SCHEMA_VERSION:
            raise RecordsError(
                f"{self.name} has records schema v{version}; this tensortune reads up to "
                f"v{SCHEMA_VERSION} (upgrade tensortune)"
            )
        if version < 1:
            raise RecordsError(f"{self.name}: unknown old records schema v{version}")
        return version

    @staticmethod
    def _create(cur: Cursor, ddl: str) -> None:
        for statement in statements(ddl):
            cur.execute(statement)
        cur.execute(
            "INSERT INTO meta VALUES ('app', 'tensortune'), ('schema_version', ?), (?, '1')",
            (str(SCHEMA_VERSION), TIMES_CHECKED),
        )

    def _lock_workloads(self, cur: Cursor) -> None:
        """Keep other writers from adding a workload until this transaction ends (SQLite's
        write transactions already exclude each other)."""

    # -- workloads and hardware --------------------------------------------------------------

    def _known(self, mod, shash: str, rows: list[tuple]) -> int | None:
        from tensortune.compat import structural_equal

        cached = self._workload_cache.setdefault(shash, [])
        ids = {wid for wid, _ in cached}
        cached += [(i, read_module(text, i)) for i, text in rows if i not in ids]
        return next((wid for wid, other in cached if structural_equal(mod, other)), None)

    def workload_id(self, mod, name: str = "", *, create: bool = True) -> int | None:
        from tensortune.compat import json_graph_problem, structural_hash, tvm

        shash = structural_hash(mod)
        # The oldest first: every process picks the same of two equal workloads, should a
        # store ever hold them (a hand edit, a TVM whose structural equality changed).
        select = "SELECT id, mod_json FROM workloads WHERE shash = ? ORDER BY id"
        wid = self._known(mod, shash, []) if shash in self._workload_cache else None
        if wid is None:  # only hits are cached: another writer may have added it since
            wid = self._known(mod, shash, self._read(select, (shash,)))
        if wid is not None or not create:
            return wid
        text = tvm.ir.save_json(mod)
        problem = json_graph_problem(json.loads(text))
        if problem:  # stored, it could not be read back (compat.MAX_GRAPH_DEPTH)
            raise RecordsError(f"workload {name or shash} cannot be stored: its module's "
                               f"graph {problem}")  # fmt: skip

        def insert(cur: Cursor) -> int:
            # Another process may have added it since we looked: look again under the lock.
            self._lock_workloads(cur)
            found = self._known(mod, shash, cur.execute(select, (shash,)).fetchall())
            if found is not None:
                return found
            row = cur.execute(
                "INSERT INTO workloads (shash, name, mod_json) VALUES (?, ?, ?) RETURNING id",
                (shash, _no_nul(name), text),
            ).fetchone()
            return int(row[0])

        wid = self._write(insert)
        if all(i != wid for i, _ in self._workload_cache[shash]):
            self._workload_cache[shash].append((wid, mod))
        return wid

    def workload(self, workload_id: int) -> StoredWorkload:
        rows = self._read("SELECT id, shash, name, mod_json FROM workloads WHERE id = ?",
                          (workload_id,))  # fmt: skip
        if not rows:
            raise RecordsError(f"no workload {workload_id} in {self.name}")
        return StoredWorkload(*rows[0])

    def workloads(self) -> list[StoredWorkload]:
        rows = self._read("SELECT id, shash, name, mod_json FROM workloads ORDER BY id")
        return [StoredWorkload(*r) for r in rows]

    def register_hardware(self, hardware: Hardware) -> str:
        self._write(lambda cur: cur.execute(
            "INSERT INTO hardware VALUES (?, ?) ON CONFLICT (id) DO NOTHING",
            (hardware.id, hardware.to_json())))  # fmt: skip
        return hardware.id

    def hardware(self) -> dict[str, Hardware]:
        out = {}
        for i, text in self._read("SELECT * FROM hardware"):
            try:
                out[i] = Hardware.from_json(text)
            except ValueError as e:
                raise RecordsError(f"hardware {i} in {self.name} is damaged: {e}") from None
        return out

    # -- records -----------------------------------------------------------------------------

    def add(self, records: Iterable[Record]) -> None:
        records = list(records)
        for r in records:  # what every later read would refuse is refused before it is written
            if not positive_seconds(r.run_secs):
                raise RecordsError(f"a record to add ({r.status}) has run times that are not "
                                   f"positive seconds: {list(r.run_secs)!r:.80}")  # fmt: skip
            _target_text(r.target, "a record to add")
            problem = trace_problem(parsed(r.trace)) or args_info_problem(parsed(r.args_info))
            if problem:  # copied on, it would crash TVM in every store it reached
                raise RecordsError(f"a record to add ({r.status}) is damaged: {problem}")
        # uids are fixed before the first try, so a retried transaction adds nothing twice.
        rows = [
            (
                r.workload_id, r.hardware_id, r.target, r.trace, r.args_info,
                json.dumps(list(r.run_secs)), r.cost if r.ok else None, r.status,
                _no_nul(r.error), _no_nul(r.run_id), _no_nul(r.tvm_version),
                r.created_at or time.time(), trace_hash(r.trace), r.uid or uuid.uuid4().hex,
                _no_nul(r.origin),
            )
            for r in records
        ]  # fmt: skip
        if not rows:
            return

        def insert(cur: Cursor) -> None:
            cur.executemany(
                "INSERT INTO records (workload_id, hardware_id, target, trace, args_info, "
                "run_secs, cost, status, error, run_id, tvm_version, created_at, trace_hash, uid, "
                "origin) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (uid) DO NOTHING",
                rows,
            )
            # Measured now: the leases on these candidates have done their work.
            cur.executemany(
                "DELETE FROM claims WHERE workload_id = ? AND hardware_id = ? AND target = ? "
                "AND trace_hash = ?",
                sorted({(r[0], r[1], r[2], r[12]) for r in rows}),
            )

        self._write(insert)

    @staticmethod
    def _where(workload_id, hardware_id, target, ok_only=False) -> tuple[str, tuple]:
        clauses, params = [], []
        for column, value in (("workload_id", workload_id), ("hardware_id", hardware_id),
                              ("target", target)):  # fmt: skip
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if ok_only:
            clauses.append("cost IS NOT NULL")
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(params)

    def query(self, *, workload_id=None, hardware_id=None, target=None, ok_only=False,
              best_first=False, limit=None) -> Iterator[Record]:  # fmt: skip
        where, params = self._where(workload_id, hardware_id, target, ok_only)
        # Successful records only: "cost, id" is the index's own order (``records_lookup``,
        # then the rowid), where "cost IS NULL" first made SQLite sort every record of the
        # task for each top-k (28 ms at 80k records, against 0.02).
        order = " ORDER BY id"
        if best_first:
            order = " ORDER BY cost, id" if ok_only else " ORDER BY cost IS NULL, cost, id"
        if limit is not None and int(limit) < 0:  # SQLite reads it as no limit, PostgreSQL
            raise RecordsError(f"a query's limit must not be negative, not {limit}")
        tail = f" LIMIT {int(limit)}" if limit is not None else ""
        for row in self._read(f"SELECT {COLUMNS} FROM records{where}{order}{tail}", params):
            yield row_to_record(row)

    def count(self, *, workload_id=None, hardware_id=None, target=None, ok_only=False) -> int:
        where, params = self._where(workload_id, hardware_id, target, ok_only)
        return int(self._read(f"SELECT count(*) FROM records{where}", params)[0][0])

    def add_task_sources(self, sources: Iterable[TaskSource]) -> None:
        rows = [(_no_nul(s.network), s.workload_id, _no_nul(s.task_name), s.weight)
                for s in sources]  # fmt: skip
        upsert = (
            "INSERT INTO task_sources VALUES (?, ?, ?, ?) ON CONFLICT (network, workload_id) "
            "DO UPDATE SET task_name = excluded.task_name, weight = excluded.weight"
        )
        self._write(lambda cur: cur.executemany(upsert, rows))

    def task_sources(self, network: str | None = None) -> list[TaskSource]:
        where, params = (" WHERE network = ?", (network,)) if network else ("", ())
        rows = self._read(f"SELECT * FROM task_sources{where} ORDER BY network, workload_id",
                          params)  # fmt: skip
        return [TaskSource(*r) for r in rows]

    def summary(self) -> list[tuple]:
        rows = [tuple(r) for r in self._read(
            "SELECT w.name, r.workload_id, r.hardware_id, r.target, count(*), "
            "count(r.cost), min(r.cost) FROM records r JOIN workloads w ON w.id = r.workload_id "
            "GROUP BY w.name, r.workload_id, r.hardware_id, r.target "
            "ORDER BY r.workload_id, r.hardware_id, r.target"
        )]  # fmt: skip
        for name, wid, _, target, _, _, best in rows:
            _target_text(target, f"a record of workload {wid} ({name})")
            if best is not None and not positive_seconds([best]):
                raise RecordsError(f"a record of workload {wid} ({name}) is damaged: its cost "
                                   f"is {best!r}, not positive seconds")  # fmt: skip
        return rows

    # -- leases ------------------------------------------------------------------------------

    def claim(self, workload_id: int, hardware_id: str, target: str, hashes: Sequence[str], *,
              worker: str, seconds: float,
              budget: ClaimBudget | None = None) -> list[str]:  # fmt: skip
        # In one order for every worker: two PostgreSQL transactions inserting the same rows in
        # opposite orders wait on each other until one is aborted as a deadlock.  Under a
        # budget, claims take turns (``_lock_claims``) and the caller's order decides.
        wanted = sorted(set(hashes)) if budget is None else list(dict.fromkeys(hashes))
        if not wanted:
            return []

        def take(cur: Cursor) -> list[str]:
            key = (workload_id, hardware_id, target)
            held = []
            todo, room = wanted, len(wanted)
            if budget is not None:
                self._lock_claims(cur)
                measured = self._measured(cur, key, wanted)
                todo = [h for h in wanted if h not in measured]
                room = self._room(cur, key, budget, worker, todo)
            for h in todo:
                if len(held) >= room:
                    break
                row = cur.execute(
                    "INSERT INTO claims VALUES (?, ?, ?, ?, ?, " + self.NOW + " + ?) "
                    "ON CONFLICT (workload_id, hardware_id, target, trace_hash) DO UPDATE "
                    "SET worker = excluded.worker, expires_at = excluded.expires_at "
                    "WHERE claims.expires_at < " + self.NOW + " OR claims.worker = excluded.worker "
                    "RETURNING trace_hash",
                    (*key, h, worker, float(seconds)),
                ).fetchone()
                if row is not None:
                    held.append(h)
            if budget is not None:  # no commit came between: each deletes claims, and waits
                return held  # in the caller's order, the measured ones left out
            # Read after claiming: a worker whose commit we waited on is seen now.
            measured = self._measured(cur, key, held)
            cur.executemany(
                "DELETE FROM claims WHERE workload_id = ? AND hardware_id = ? AND target = ? "
                "AND trace_hash = ? AND worker = ?",
                [(*key, h, worker) for h in sorted(measured)],
            )
            kept = set(held) - measured
            return [h for h in dict.fromkeys(hashes) if h in kept]  # in the caller's order

        return self._write(take)

    def _lock_claims(self, cur: Cursor) -> None:
        """Make claims under a budget take turns (SQLite's write transactions already do)."""

    @staticmethod
    def _measured(cur: Cursor, key: tuple, hashes: list[str]) -> set[str]:
        """Those of ``hashes`` the store holds a record of, for ``key`` (workload, hardware,
        target)."""
        if not hashes:
            return set()
        marks = ", ".join("?" * len(hashes))
        return {r[0] for r in cur.execute(
            "SELECT DISTINCT trace_hash FROM records WHERE workload_id = ? AND "
            f"hardware_id = ? AND target = ? AND trace_hash IN ({marks})", (*key, *hashes),
        ).fetchall()}  # fmt: skip

    def _room(self, cur: Cursor, key: tuple, budget: ClaimBudget, worker: str,
              todo: list[str]) -> int:  # fmt: skip
        """How many more leases ``budget`` has room for: what the records and live leases of
        its workloads leave, not counting ``worker``'s own leases of ``todo`` (renewed, not
        added)."""
        workload_id, hardware_id, target = key
        ids = budget.workload_ids
        marks = ", ".join("?" * len(ids))
        where = f"hardware_id = ? AND target = ? AND workload_id IN ({marks})"
        done = dict(cur.execute(f"SELECT workload_id, count(*) FROM records WHERE {where} "
                                "GROUP BY workload_id",
                                (hardware_id, target, *ids)).fetchall())  # fmt: skip
        renewed = set(todo)
        live: dict[int, int] = {}
        for w, h, holder in cur.execute(
            f"SELECT workload_id, trace_hash, worker FROM claims WHERE {where} AND "
            f"expires_at > {self.NOW}", (hardware_id, target, *ids),
        ).fetchall():  # fmt: skip
            if not (holder == worker and w == workload_id and h in renewed):
                live[w] = live.get(w, 0) + 1
        total = budget.total - sum(done.values()) - sum(live.values())
        task = budget.per_task - done.get(workload_id, 0) - live.get(workload_id, 0)
        return max(0, min(total, task))

    def release(self, worker: str) -> None:
        self._write(lambda cur: cur.execute("DELETE FROM claims WHERE worker = ?", (worker,)))

    def lease_holders(self) -> set[str]:
        return {r[0] for r in self._read("SELECT DISTINCT worker FROM claims")}

    def counts(self, workload_ids: Sequence[int], hardware_id: str,
               target: str) -> dict[int, int]:  # fmt: skip
        # One query, not one a task: a tuner asks before every round, over all its tasks.
        if not workload_ids:
            return {}
        marks = ", ".join("?" * len(workload_ids))
        rows = self._read(
            "SELECT workload_id, count(*) FROM records WHERE hardware_id = ? AND target = ? "
            f"AND workload_id IN ({marks}) GROUP BY workload_id",
            (hardware_id, target, *workload_ids),
        )
        return {int(w): int(n) for w, n in rows}

    def leased(self, workload_ids: Sequence[int], hardware_id: str, target: str, *,
               worker: str = "") -> dict[int, int]:  # fmt: skip
        if not workload_ids:
            return {}
        marks = ", ".join("?" * len(workload_ids))
        rows = self._read(
            "SELECT workload_id, count(*) FROM claims WHERE hardware_id = ? AND target = ? "
            f"AND worker <> ? AND expires_at > {self.NOW} AND workload_id IN ({marks}) "
            "GROUP BY workload_id",
            (hardware_id, target, worker, *workload_ids),
        )
        return {int(w): int(n) for w, n in rows}


def _no_nul(text: str | None) -> str | None:
    """``text`` as both stores keep it: PostgreSQL refuses a NUL character in text (the whole
    batch with it), which a compiler's or a crashing kernel's error message may hold."""
    return text.replace("\x00", "\\x00") if text and "\x00" in text else text
