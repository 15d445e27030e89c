"""Measurement records behind one storage interface, chosen by URL, and their conversions to
and from MetaSchedule's objects and files."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from tensortune.errors import RecordsError, TensortuneError, about, check_flags
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
    check_flags(create=create)
    scheme, where = check_url(url)
    if scheme == "sqlite":
        from tensortune.records.sqlite import SQLiteStore

        return SQLiteStore(where, url=os.fspath(url), create=create)
    from tensortune.records.postgres import PostgresStore

    return PostgresStore(url, create=create)


def names_a_url(text: str) -> bool:
    """Whether ``text`` is meant as a records store's URL, not a path: ``scheme://...``, or
    one of ours with the slashes left out (``sqlite:x.db``, which ``check_url`` refuses)."""
    head, colon, _ = text.partition(":")
    return "://" in text or (bool(colon) and head.lower() in ("sqlite", "postgresql", "postgres"))


def check_url(url: str | os.PathLike) -> tuple[str, str]:
    """The scheme of ``url`` (``sqlite`` or ``postgresql``) and the file it names (SQLite) or
    the URL itself; the ``RecordsError`` that opening it would raise for its form alone (and
    for a file that is not SQLite's, read from its first bytes).  Creates and connects to
    nothing: what a dry run can check."""
    typed = isinstance(url, str)
    url = os.fspath(url)  # a path object names a SQLite file
    scheme, sep, rest = url.partition("://")
    if not sep:
        # Text such as sqlite:x.db is a URL mistyped, not a file to create by that name.
        if typed and names_a_url(url):
            raise RecordsError(f"records URL {url!r} lacks the '//' after its scheme "
                               "(a file: sqlite:///records.db; a database: "
                               "postgresql://host/db)")  # fmt: skip
        scheme, rest = "sqlite", "/" + url
    if scheme == "sqlite":
        path = rest[1:] if rest.startswith("/") else rest
        if not path:
            raise RecordsError(f"records URL {url!r} names no file (try sqlite:///records.db)")
        if Path(path).is_dir():
            raise RecordsError(f"records store {path} is not usable: it is a directory")
        if path != ":memory:":
            from tensortune.records.sqlite import check_file

            check_file(path)
        return scheme, path
    if scheme in ("postgresql", "postgres"):
        redact(url)  # parses the host and port
        return "postgresql", url
    raise RecordsError(f"unsupported records URL scheme '{scheme}' in {redact(url)!r} "
                       "(supported: sqlite, postgresql)")  # fmt: skip


@contextlib.contextmanager
def records_from(records: str | os.PathLike | RecordStore, *, create: bool = True,
                 param: str = "records") -> Iterator[RecordStore]:  # fmt: skip
    """The store an API call was given: a URL is opened here (errors opening it are about the
    parameter ``param``) and closed on the way out; a store is used as it is, left open."""
    if not isinstance(records, str | os.PathLike):
        if not isinstance(records, RecordStore):  # None, a number: refused before any work
            raise TensortuneError(f"a records store or its URL, not {records!r:.60}",
                                  param=param)  # fmt: skip
        yield records
        return
    with about(param):
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
    "names_a_url",
    "open_records",
    "records_from",
    "redact",
]
