"""Studies that resume (``bench splits``, ``bench al``): each finished unit's rows (a model's
fold, a selector's seed) saved the moment it ends, in one JSON file, so that a study killed
after an hour and run again with the same settings redoes only what it had not finished.

Opt-in, as Optuna's storage is: a file saved with other settings (another dataset, other
model parameters, another version of the study) is moved aside (``files.move_aside``), never
read; one saved with the same settings is trusted, so a change to a model's code between two
runs needs a new file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from tensortune.errors import check_writable
from tensortune.files import move_aside, write_atomically

# Bump when a study's rows mean something else for the same settings.
# 2: a selection of which no program ran is a row (it was dropped); PCA leaves out tasks whose
# programs all failed
STUDY_VERSION = 2


class Checkpoint:
    """The finished units of one study; ``path`` None keeps nothing (a study run once).
    ``setup()`` says the settings the rows depend on; called only with a file (it may read and
    hash whole datasets)."""

    def __init__(self, path: str | os.PathLike | None, setup: Callable[[], dict]) -> None:
        check_writable(path, "checkpoint")  # before the first unit's minutes, not after
        self.path = None if path is None else Path(path)
        self.done: dict[str, list[dict]] = {}
        if self.path is None:
            return
        # as JSON gives it back (tuples become lists), so that a saved setup compares equal
        self.setup = json.loads(_json({"version": STUDY_VERSION, **setup()}))
        if not self.path.exists():
            return
        try:
            saved = json.loads(self.path.read_text())
            done = saved["done"] if saved["setup"] == self.setup else None
            usable = isinstance(done, dict) and all(
                isinstance(rows, list) and all(isinstance(r, dict) for r in rows)
                for rows in done.values()
            )
        except (OSError, ValueError, RecursionError, TypeError, KeyError):
            usable = False
        if usable:
            self.done = done
        else:
            move_aside(self.path.parent, [self.path],
                       f"{self.path.name} holds another study's rows")  # fmt: skip

    def unit(self, rows: list[dict], key: tuple, work: Callable[[], None]) -> bool:
        """Run the unit ``key``, whose ``work`` appends its rows to ``rows``, and save them;
        a unit saved before adds its saved rows instead.  Returns whether it was."""
        saved = self.rows(*key)
        if saved is not None:
            rows += saved
            return True
        first = len(rows)
        work()
        self.save(rows[first:], *key)
        return False

    def rows(self, *key: object) -> list[dict] | None:
        """The rows saved for ``key``, or None: not finished."""
        return self.done.get(_key(key))

    def save(self, rows: list[dict], *key: object) -> None:
        """``rows`` of the unit ``key``, written at once (NaN metrics as JSON's NaN: only this
        module reads the file)."""
        self.done[_key(key)] = rows
        if self.path is not None:
            write_atomically(self.path, _json({"setup": self.setup, "done": self.done}))


def dataset_identity(dataset: str | os.PathLike | None) -> dict | None:
    """What a study's rows read of ``dataset`` (a directory or a shipped name): its files'
    checksums from its card, and its lowered-loop features' file and version, which the card
    does not name (``dataset lower`` rewrites it)."""
    from tensortune.datasets.build import LOWERED, file_sha256, read_card
    from tensortune.datasets.shipped import dataset_path
    from tensortune.features.lowered import LOWERED_VERSION

    if dataset is None:
        return None
    directory = Path(dataset_path(dataset))
    lowered = directory / LOWERED
    return {"files": read_card(directory).data.get("files"),
            "lowered": file_sha256(lowered) if lowered.is_file() else None,
            "lowered_version": LOWERED_VERSION}  # fmt: skip


def _json(value: object) -> str:
    """JSON of rows and settings: numpy's numbers as Python's (seeds from ``np.arange``,
    parameters from an array), anything else JSON cannot hold as its text."""
    return json.dumps(value, default=lambda o: o.item() if hasattr(o, "item") else str(o))


def _key(parts: tuple) -> str:
    return json.dumps([str(p) for p in parts])
