"""Measurement records behind one storage interface, chosen by URL, and their conversions to
and from MetaSchedule's objects and files."""

from __future__ import annotations

from tensortune.errors import RecordsError
from tensortune.records.schema import Record
from tensortune.records.storage import DEFAULT_URL, RecordStore


def open_records(url: str = DEFAULT_URL, *, create: bool = True) -> RecordStore:
    """Open the records store named by ``url``, creating it unless ``create`` is False.

    ``sqlite:///relative/path.db`` and ``sqlite:////absolute/path.db`` are supported; a plain
    file path is taken as a SQLite file.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "sqlite", "/" + url
    if scheme == "sqlite":
        from tensortune.records.sqlite import SQLiteStore

        path = rest[1:] if rest.startswith("/") else rest
        if not path:
            raise RecordsError(f"records URL {url!r} names no file (try sqlite:///records.db)")
        return SQLiteStore(path, url=url, create=create)
    raise RecordsError(f"unsupported records URL scheme '{scheme}' in {url!r} (supported: sqlite)")


__all__ = ["DEFAULT_URL", "Record", "RecordStore", "open_records"]
