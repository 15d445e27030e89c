"""The datasets shipped with the package (collected with ``tensortune dataset collect``)."""

from __future__ import annotations

from pathlib import Path

_DATA = Path(__file__).resolve().parent.parent / "data"
DATASET_DIR = _DATA / "ttset-cpu-v6"
# The dense pool for active-learning studies: few tasks, ~800 programs each, one hardware.
POOL_DIR = _DATA / "ttset-pool-v1"
# Names a user may give instead of a directory; each shipped dataset also answers to its own
# name (``ttset-cpu-v2``), as the figures measured on it cite it.
SHIPPED_DATASETS = {"default": DATASET_DIR, "pool": POOL_DIR}


def dataset_path(dataset: str | Path) -> Path:
    """The directory of ``dataset``: a shipped dataset's name (``default``, ``pool``,
    ``ttset-cpu-v6``, ...) or a directory (which wins over a shipped name)."""
    name = str(dataset)
    given = Path(dataset)
    if given.is_dir():  # a user's ./pool is theirs: reading or overwriting the shipped one
        return given  # instead would lose their data
    if name in SHIPPED_DATASETS:
        return SHIPPED_DATASETS[name]
    shipped = _DATA / name
    if not given.exists() and given.name == name and (shipped / "card.json").is_file():
        return shipped
    return given
