"""Task counts of the network zoo, cached on disk: importing every network takes about a minute.

The cache key holds the TVM and tensortune versions, the version of the model rewrites and the
target, so a change to any of them recounts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def _cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tensortune" / "task-counts.json"


def task_counts(names: list[str], target: dict | None = None) -> dict[str, tuple[int, int]]:
    """``name -> (number of tasks, total occurrences)`` for each zoo network."""
    from importlib.metadata import version

    from tensortune.compat import TVM_VERSION, tvm
    from tensortune.hardware import parse_target, target_key
    from tensortune.workloads.inference import REWRITES_VERSION
    from tensortune.workloads.models import load_model

    target = parse_target(target)
    key = f"{TVM_VERSION}|{version('tensortune')}|r{REWRITES_VERSION}|{target_key(target)}"
    path = _cache_file()
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    entries = cache.setdefault(key, {})
    for name in names:
        if name not in entries:
            m = load_model(name, target=tvm.target.Target(target))
            entries[name] = [len(m.tasks), sum(t.weight for t in m.tasks)]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cache, indent=1))
    except OSError:
        pass  # a read-only home only costs a recount next time
    return {n: (int(entries[n][0]), int(entries[n][1])) for n in names}
