"""The embedded default store: one SQLite file in WAL mode, short transactions.

A crash (even ``kill -9``) loses at most the transaction in flight: each batch of measurements
is committed as one transaction the moment it is measured, and a commit reaches the disk before
it returns (``synchronous=FULL``: in WAL mode NORMAL lets a power cut take back the last
commits; a sync per write transaction, a batch's lease and its commit, costs milliseconds
against the batch's seconds on a local disk).  Several processes on one machine may share a
file: write transactions take the file's lock in turn (``BEGIN IMMEDIATE``).
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tensortune.errors import NoStoreError, RecordsError
from tensortune.records.schema import SCHEMA_VERSION, trace_hash
from tensortune.records.sql import (
    TABLES,
    TIMES_CHECKED,
    Cursor,
    SQLStore,
    T,
    check_run_times,
    statements,
)

_DDL = TABLES.format(serial="INTEGER PRIMARY KEY", real="REAL")

# Statements that bring a store of version N-1 to version N.
_MIGRATIONS = {
    2: [s for s in statements(_DDL) if "task_sources" in s],
    3: [
        "ALTER TABLE records ADD COLUMN trace_hash TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE records ADD COLUMN uid TEXT NOT NULL DEFAULT ''",
        "UPDATE records SET trace_hash = tt_trace_hash(trace), uid = lower(hex(randomblob(16)))",
        *[s for s in statements(_DDL) if "records_uid" in s or "records_trace" in s
          or "TABLE IF NOT EXISTS claims" in s],
    ],
    4: ["ALTER TABLE records ADD COLUMN origin TEXT NOT NULL DEFAULT ''"],
}  # fmt: skip


class _ReadOnly(RecordsError):
    """A write this process may not make: the file, its directory or the mount is read-only
    to it."""


def store_files(path: str | Path) -> list[Path]:
    """The files of the SQLite store at ``path``: the database, and the write-ahead log and
    shared-memory files WAL mode keeps beside it (moved or removed with it)."""
    return [Path(f"{path}{suffix}") for suffix in ("", "-wal", "-shm")]


def check_file(path: str) -> None:
    """The ``RecordsError`` opening a store at ``path`` would raise for its place and its
    first bytes: a directory that does not exist, a file that is not SQLite's (an empty one is
    a store being created).  Connects to nothing: ``tune --dry-run`` checks this much."""
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise RecordsError(f"records store {path}: directory {parent} does not exist")
    if not Path(path).is_file():  # none there yet (and a FIFO would block the read)
        return
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return  # not readable: connecting says so
    if head and head != b"SQLite format 3\x00":  # SQLite's own words, as connecting says them
        raise RecordsError(f"records store {path} is not usable: file is not a database")


class SQLiteStore(SQLStore):
    NOW = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, path: str, *, url: str | None = None, create: bool = True) -> None:
        super().__init__()
        self.path = self.name = path
        self.url = url or f"sqlite:///{path}"
        memory = path == ":memory:"
        if not memory:
            check_file(path)
            if not create and not Path(path).is_file():
                raise NoStoreError(f"no records store at {path}")
        try:
            self._db = sqlite3.connect(
                path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            self._db.create_function("tt_trace_hash", 1, trace_hash, deterministic=True)
        except sqlite3.Error as e:
            raise RecordsError(f"records store {path} is not usable: {self._why(e)}") from None
        try:
            self._check_or_create(memory, create)
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise RecordsError(f"records store {path} is not usable: {self._why(e)}") from None
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
            # as a database without the tables is on PostgreSQL: no store there yet
            raise NoStoreError(f"{self.path} is empty, not a tensortune records store")
        meta = dict(db.execute("SELECT key, value FROM meta")) if tables else {}
        if tables and self._schema_version(meta) < SCHEMA_VERSION:
            self._migrate()
        if not memory:
            self._use_wal()
            db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA foreign_keys=ON")
        if not tables:
            self._write(self._create_unless_present)
        elif TIMES_CHECKED not in meta:
            try:
                self._write(check_run_times)
            except _ReadOnly:
                if create:
                    raise
                # a file this process may only read is read as it is

    def _use_wal(self, timeout: float = 30.0) -> None:
        # Switching the journal mode wants the file to itself, and SQLite answers "locked" at
        # once instead of waiting when another connection is opening it at that moment.
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def _create_unless_present(self, cur: Cursor) -> None:
        # Two processes opening a new file both see it empty; the write lock taken by
        # BEGIN IMMEDIATE decides which one creates the schema, and the other finds it made.
        if not cur.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone():
            self._create(cur, _DDL)

    def _migrate(self) -> None:
        def upgrade(db: Cursor) -> None:
            # Read again under the write lock: another process opening the same old file may
            # have upgraded it while this one waited for the lock.
            now = self._schema_version(dict(db.execute("SELECT key, value FROM meta")))
            for v in range(now + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[v]:
                    db.execute(statement)
            db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                       (str(SCHEMA_VERSION),))  # fmt: skip

        self._write(upgrade)
        self._db.execute("SELECT count(*) FROM records").fetchone()  # surfaces a corrupt file

    def _write(self, fn: Callable[[Cursor], T]) -> T:
        with self._lock:
            return self._write_locked(fn)

    def _write_locked(self, fn: Callable[[Cursor], T]) -> T:
        db = self._db
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                out = fn(db)
                db.execute("COMMIT")  # can fail too (a full disk, an I/O error on the log)
            except BaseException:
                # SQLite has already rolled back by itself after some errors (a full disk);
                # a transaction left open would keep the write lock from every other process.
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            return out
        except sqlite3.OperationalError as e:
            kind = _ReadOnly if "readonly database" in str(e) else RecordsError  # SQLITE_READONLY
            raise kind(f"records store {self.path}: {self._why(e)}") from None
        except sqlite3.IntegrityError as e:
            raise RecordsError(f"records store {self.path}: invalid record ({e})") from None
        except sqlite3.DatabaseError as e:
            raise RecordsError(f"records store {self.path} is corrupt: {e}") from None

    def _why(self, error: sqlite3.Error) -> str:
        """What went wrong: SQLite reports a full disk as such while writing pages, but as an
        I/O error when it cannot create its journal files."""
        text = str(error)
        if "full" in text:
            return "disk full"
        if "I/O" in text and self.path != ":memory:":
            with contextlib.suppress(OSError):
                if shutil.disk_usage(Path(self.path).resolve().parent).free < (1 << 20):
                    return f"disk full ({text})"
        return text

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        try:
            with self._lock:
                return self._db.execute(sql, params).fetchall()
        except sqlite3.DatabaseError as e:
            raise RecordsError(f"records store {self.path}: {e}") from None

    def close(self) -> None:
        self._db.close()
