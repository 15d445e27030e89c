"""Task counts of the network zoo, cached on disk: importing every network takes about a minute.

The cache key holds the TVM and tensortune versions, the version of the model rewrites and the
target, so a change to any of them recounts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from tensortune.files import write_atomically
from tensortune.hardware.speeds import cache_dir

if TYPE_CHECKING:
    from tensortune.hardware import Platform


def _cache_file() -> Path:
    return cache_dir() / "task-counts.json"


def cache_exists() -> bool:
    """Whether any count has been cached (looking it up needs TVM; this does not)."""
    return _cache_file().is_file()


def task_counts(
    names: list[str], platform: Platform | None = None, *, cached_only: bool = False
) -> dict[str, tuple[int, int]]:
    """``name -> (number of tasks, total occurrences)`` for each zoo network (default: for
    this CPU); with ``cached_only``, only the networks already counted, importing none."""
    from importlib.metadata import version

    from tensortune.compat import TVM_VERSION
    from tensortune.hardware import resolve_platform
    from tensortune.workloads.inference import REWRITES_VERSION
    from tensortune.workloads.models import load_model

    platform = platform or resolve_platform()
    key = f"{TVM_VERSION}|{version('tensortune')}|r{REWRITES_VERSION}|{platform.key}"
    path = _cache_file()
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        cache = {}
    if not isinstance(cache, dict):  # damaged or written by something else: counted again
        cache = {}
    entries = cache.get(key)
    if not isinstance(entries, dict):
        entries = cache[key] = {}
    for name in [n for n, e in entries.items() if not _count_entry(e)]:
        del entries[name]
    if cached_only:
        return {n: (int(entries[n][0]), int(entries[n][1])) for n in names if n in entries}
    for name in names:
        if name not in entries:
            m = load_model(name, target=platform.tvm_target)
            entries[name] = [len(m.tasks), sum(t.weight for t in m.tasks)]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(cache, indent=1))  # a reader never sees half a file
    except OSError:
        pass  # a read-only home only costs a recount next time
    return {n: (int(entries[n][0]), int(entries[n][1])) for n in names}


def _count_entry(entry: object) -> bool:
    """Whether a cached entry is ``[tasks, occurrences]``, two whole numbers of at least 0."""
    return (isinstance(entry, list) and len(entry) == 2
            and all(type(v) is int and v >= 0 for v in entry))  # fmt: skip
