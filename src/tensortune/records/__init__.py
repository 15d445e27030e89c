"""Measurement records behind one storage interface, chosen by URL, and their conversions to
and from MetaSchedule's objects and files."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from tensortune.errors import RecordsError, about
from tensortune.records.postgres import redact
from tensortune.records.schema import Record
from tensortune.records.storage import DEFAULT_URL, RecordStore


def open_records(url: str | os.PathLike = DEFAULT_URL, *, create: bool = True) -> RecordStore:
    """Open the records store named by ``url``, creating it unless ``create`` is False.

    ``sqlite:///relative/path.db`` and ``sqlite:////absolute/path.db`` name a SQLite file (a
    plain file path is taken as one); ``postgresql://user[:password]@host[:port]/database``
    a PostgreSQL database (libpq's ``PGPASSWORD`` and ``~/.pgpass`` work too), whose schema
    is created on first use.
    """
    scheme, where = check_url(url)
    if scheme == "sqlite":
        from tensortune.records.sqlite import SQLiteStore

        return SQLiteStore(where, url=os.fspath(url), create=create)
    from tensortune.records.postgres import PostgresStore

    return PostgresStore(url, create=create)


def check_url(url: str | os.PathLike) -> tuple[str, str]:
    """The scheme of ``url`` (``sqlite`` or ``postgresql``) and the file it names (SQLite) or
    the URL itself; the ``RecordsError`` that opening it would raise for its form alone (and
    for a file that is not SQLite's, read from its first bytes).  Creates and connects to
    nothing: what a dry run can check."""
    url = os.fspath(url)  # a path object names a SQLite file
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "sqlite", "/" + url
    if scheme == "sqlite":
        path = rest[1:] if rest.startswith("/") else rest
        if not path:
            raise RecordsError(f"records URL {url!r} names no file (try sqlite:///records.db)")
        if Path(path).is_dir():
            raise RecordsError(f"records store {path} is not usable: it is a directory")
        if path != ":memory:":
            parent = Path(path).resolve().parent
            if not parent.is_dir():
                raise RecordsError(f"records store {path}: directory {parent} does not exist")
            if _not_sqlite(Path(path)):
                # SQLite's own words, as opening it would say them
                raise RecordsError(f"records store {path} is not usable: file is not a database")
        return scheme, path
    if scheme in ("postgresql", "postgres"):
        redact(url)  # parses the host and port
        return "postgresql", url
    raise RecordsError(f"unsupported records URL scheme '{scheme}' in {redact(url)!r} "
                       "(supported: sqlite, postgresql)")  # fmt: skip


def _not_sqlite(path: Path) -> bool:
    """Whether ``path`` is a file of some bytes that do not begin as a SQLite database's (an
    empty file is what a store being created looks like)."""
    if not path.is_file():  # none there yet (a FIFO would block the read)
        return False
    try:
        with path.open("rb") as f:
            head = f.read(16)
    except OSError:
        return False  # none there yet, or not readable: opening it says which
    return bool(head) and head != b"SQLite format 3\x00"


@contextlib.contextmanager
def records_from(records: str | os.PathLike | RecordStore, *,
                 create: bool = True) -> Iterator[RecordStore]:  # fmt: skip
    """The store an API call was given: a URL is opened here (errors opening it are about the
    ``records`` parameter) and closed on the way out; a store is used as it is, left open."""
    if not isinstance(records, str | os.PathLike):
        yield records
        return
    with about("records"):
        store = open_records(records, create=create)
    try:
        yield store
    finally:
        store.close()


__all__ = [
    "DEFAULT_URL",
    "Record",
    "RecordStore",
    "check_url",
    "open_records",
    "records_from",
    "redact",
]
