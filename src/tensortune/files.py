"""Files written whole or not at all, JSON any parser reads, and earlier results moved aside
rather than deleted.

A results file that a rerun resumes from (``bench tune``'s ``results.json``) was written in
place: a kill or a full disk while writing it left half a file, which the rerun refuses, and
every method already run was lost with it.  Written beside it and renamed over it, the file
is either the old one or the new one.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import threading
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path


def write_atomically(path: str | os.PathLike, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` through a temporary file in its directory,
    synced to disk before it replaces the old file."""
    path = Path(path).resolve()  # a link's target is replaced, not the link
    with replaced_whole(path) as partial, open(partial, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def replaced_whole(path: Path) -> Iterator[Path]:
    """A file to write ``path``'s new contents to, renamed over ``path`` when the block ends
    without an error and removed if it does not: a crash never leaves half a file.  Named by
    the process and thread (not mkstemp's, which is private to its owner): the new file has
    the permissions the user's umask gives, and two writers of one path never write, or
    remove, each other's."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
    try:
        yield partial
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def strict_json(value: object, **dumps: object) -> str:
    """``value`` as strict JSON: a number that is NaN or infinite (a metric of a task with one
    program, a latency a task never got) is written as null; Python's ``json`` would write
    ``NaN``/``Infinity``, which jq and JavaScript refuse."""
    return json.dumps(_finite(value), allow_nan=False, **dumps)


def _finite(value: object) -> object:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def move_aside(directory: Path, paths: Sequence[Path], why: str) -> Path:
    """Move ``paths`` (files or folders of ``directory`` that a benchmark is about to measure
    anew) into a new ``directory/replaced-N``, and say so in a warning that starts with
    ``why``: a rerun with other settings, or after a kill, never deletes a measurement."""
    n = 1
    while True:  # made, not looked for: two processes moving things aside get one each
        aside = directory / f"replaced-{n}"
        try:
            aside.mkdir()
            break
        except FileExistsError:
            n += 1
    for path in paths:
        if path.exists():
            shutil.move(path, aside / path.name)
    warnings.warn(f"tensortune: {why}: measured again, the earlier ones moved to {aside}",
                  stacklevel=3)  # fmt: skip
    return aside
