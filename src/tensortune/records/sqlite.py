"""The embedded default store: one SQLite file in WAL mode, short transactions.

A crash (even ``kill -9``) loses at most the transaction in flight: each batch of measurements
is committed as one transaction the moment it is measured.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from tensortune.errors import RecordsError
from tensortune.hardware import Hardware
from tensortune.records.schema import SCHEMA_VERSION, Record, StoredWorkload, TaskSource
from tensortune.records.storage import RecordStore

_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS hardware (id TEXT PRIMARY KEY, description TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS workloads (
    id INTEGER PRIMARY KEY,
    shash TEXT NOT NULL,
    name TEXT NOT NULL,
    mod_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS workloads_shash ON workloads (shash);
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY,
    workload_id INTEGER NOT NULL REFERENCES workloads (id),
    hardware_id TEXT NOT NULL REFERENCES hardware (id),
    target TEXT NOT NULL,
    trace TEXT NOT NULL,
    args_info TEXT NOT NULL,
    run_secs TEXT NOT NULL,
    cost REAL,
    status TEXT NOT NULL,
    error TEXT,
    run_id TEXT NOT NULL,
    tvm_version TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS records_lookup ON records (workload_id, hardware_id, target, cost);
CREATE TABLE IF NOT EXISTS task_sources (
    network TEXT NOT NULL,
    workload_id INTEGER NOT NULL REFERENCES workloads (id),
    task_name TEXT NOT NULL,
    weight INTEGER NOT NULL,
    PRIMARY KEY (network, workload_id)
);
"""

# Statements that bring a store of version N-1 to version N.
_MIGRATIONS = {
    2: [_TABLES[_TABLES.index("CREATE TABLE IF NOT EXISTS task_sources") :]],
}

_COLUMNS = (
    "workload_id, hardware_id, target, trace, args_info, run_secs, status, error, run_id, "
    "tvm_version, created_at, id"
)


def _row_to_record(row: tuple) -> Record:
    w, h, t, trace, args, secs, status, err, run, ver, at, rid = row
    return Record(w, h, t, trace, args, tuple(json.loads(secs)), status, err, run, ver, at, rid)


class SQLiteStore(RecordStore):
    def __init__(self, path: str, *, url: str | None = None, create: bool = True) -> None:
        self.path = path
        self.url = url or f"sqlite:///{path}"
        self._workload_cache: dict[str, list[tuple[int, object]]] = {}
        memory = path == ":memory:"
        if not memory:
            parent = Path(path).resolve().parent
            if not parent.is_dir():
                raise RecordsError(f"records store {path}: directory {parent} does not exist")
            if not create and not Path(path).is_file():
                raise RecordsError(f"no records store at {path}")
        try:
            self._db = sqlite3.connect(
                path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as e:
            raise RecordsError(f"records store {path} is not usable: {e}") from None
        try:
            self._check_or_create(memory, create)
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise RecordsError(f"records store {path} is not usable: {e}") from None
        except RecordsError:
            self._db.close()
            raise

    # -- opening -----------------------------------------------------------------------------

    def _check_or_create(self, memory: bool, create: bool) -> None:
        db = self._db
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables and "meta" not in tables:
            raise RecordsError(f"{self.path} is a SQLite file but not a tensortune records store")
        if not tables and not create:  # an empty file: reading it must not write a schema
            raise RecordsError(f"{self.path} is empty, not a tensortune records store")
        if tables:
            self._check_version()
        if not memory:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA foreign_keys=ON")
        if not tables:
            with self._transaction():
                for statement in _TABLES.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(
                    "INSERT INTO meta VALUES ('app', 'tensortune'), ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )

    def _check_version(self) -> None:
        db = self._db
        meta = dict(db.execute("SELECT key, value FROM meta"))
        if meta.get("app") != "tensortune":
            raise RecordsError(f"{self.path} is not a tensortune records store")
        try:
            version = int(meta.get("schema_version", "0"))
        except ValueError:
            raise RecordsError(
                f"{self.path}: unreadable records schema version {meta['schema_version']!r}"
            ) from None
        if version > SCHEMA_VERSION:
            raise RecordsError(
                f"{self.path} has records schema v{version}; this tensortune reads up to "
                f"v{SCHEMA_VERSION} (upgrade tensortune)"
            )
        if version < 1:
            raise RecordsError(f"{self.path}: unknown old records schema v{version}")
        if version < SCHEMA_VERSION:
            self._migrate(version)

    def _migrate(self, version: int) -> None:
        with self._transaction() as db:
            for v in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[v]:
                    db.execute(statement)
            db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                       (str(SCHEMA_VERSION),))  # fmt: skip
        db.execute("SELECT count(*) FROM records").fetchone()  # surfaces a corrupt file early

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                # SQLite has already rolled back by itself after some errors (a full disk).
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.OperationalError as e:
            if "full" in str(e):
                raise RecordsError(f"records store {self.path}: disk full") from None
            raise RecordsError(f"records store {self.path}: {e}") from None
        except sqlite3.IntegrityError as e:
            raise RecordsError(f"records store {self.path}: invalid record ({e})") from None
        except sqlite3.DatabaseError as e:
            raise RecordsError(f"records store {self.path} is corrupt: {e}") from None

    def _read(self, sql: str, params: tuple = ()) -> list[tuple]:
        try:
            return self._db.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as e:
            raise RecordsError(f"records store {self.path}: {e}") from None

    # -- workloads and hardware --------------------------------------------------------------

    def workload_id(self, mod, name: str = "", *, create: bool = True) -> int | None:
        from tensortune.compat import structural_equal, structural_hash, tvm

        shash = structural_hash(mod)
        if shash not in self._workload_cache:
            rows = self._read("SELECT id, mod_json FROM workloads WHERE shash = ?", (shash,))
            self._workload_cache[shash] = [(i, tvm.ir.load_json(text)) for i, text in rows]
        for wid, other in self._workload_cache[shash]:
            if structural_equal(mod, other):
                return wid
        if not create:
            return None
        with self._transaction() as db:
            cur = db.execute(
                "INSERT INTO workloads (shash, name, mod_json) VALUES (?, ?, ?)",
                (shash, name, tvm.ir.save_json(mod)),
            )
        wid = int(cur.lastrowid)
        self._workload_cache[shash].append((wid, mod))
        return wid

    def workload(self, workload_id: int) -> StoredWorkload:
        rows = self._read("SELECT id, shash, name, mod_json FROM workloads WHERE id = ?",
                          (workload_id,))  # fmt: skip
        if not rows:
            raise RecordsError(f"no workload {workload_id} in {self.path}")
        return StoredWorkload(*rows[0])

    def workloads(self) -> list[StoredWorkload]:
        rows = self._read("SELECT id, shash, name, mod_json FROM workloads ORDER BY id")
        return [StoredWorkload(*r) for r in rows]

    def register_hardware(self, hardware: Hardware) -> str:
        with self._transaction() as db:
            db.execute("INSERT OR IGNORE INTO hardware VALUES (?, ?)",
                       (hardware.id, hardware.to_json()))  # fmt: skip
        return hardware.id

    def hardware(self) -> dict[str, Hardware]:
        return {i: Hardware.from_json(d) for i, d in self._read("SELECT * FROM hardware")}

    # -- records -----------------------------------------------------------------------------

    def add(self, records: Iterable[Record]) -> None:
        rows = [
            (
                r.workload_id, r.hardware_id, r.target, r.trace, r.args_info,
                json.dumps(list(r.run_secs)), r.cost if r.ok else None, r.status, r.error,
                r.run_id, r.tvm_version, r.created_at or time.time(),
            )
            for r in records
        ]  # fmt: skip
        if not rows:
            return
        with self._transaction() as db:
            db.executemany(
                "INSERT INTO records (workload_id, hardware_id, target, trace, args_info, "
                "run_secs, cost, status, error, run_id, tvm_version, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

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
        order = " ORDER BY cost IS NULL, cost, id" if best_first else " ORDER BY id"
        tail = f" LIMIT {int(limit)}" if limit is not None else ""
        for row in self._read(f"SELECT {_COLUMNS} FROM records{where}{order}{tail}", params):
            yield _row_to_record(row)

    def count(self, *, workload_id=None, hardware_id=None, target=None, ok_only=False) -> int:
        where, params = self._where(workload_id, hardware_id, target, ok_only)
        return int(self._read(f"SELECT count(*) FROM records{where}", params)[0][0])

    def add_task_sources(self, sources: Iterable[TaskSource]) -> None:
        rows = [(s.network, s.workload_id, s.task_name, s.weight) for s in sources]
        with self._transaction() as db:
            db.executemany("INSERT OR REPLACE INTO task_sources VALUES (?, ?, ?, ?)", rows)

    def task_sources(self, network: str | None = None) -> list[TaskSource]:
        where, params = (" WHERE network = ?", (network,)) if network else ("", ())
        rows = self._read(f"SELECT * FROM task_sources{where} ORDER BY network, workload_id",
                          params)  # fmt: skip
        return [TaskSource(*r) for r in rows]

    def summary(self) -> list[tuple]:
        return self._read(
            "SELECT w.name, r.workload_id, r.hardware_id, r.target, count(*), "
            "count(r.cost), min(r.cost) FROM records r JOIN workloads w ON w.id = r.workload_id "
            "GROUP BY r.workload_id, r.hardware_id, r.target ORDER BY r.workload_id"
        )

    def close(self) -> None:
        self._db.close()
