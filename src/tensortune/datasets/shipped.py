"""The datasets shipped with the package (collected with ``tensortune dataset collect``)."""

from __future__ import annotations

from pathlib import Path

_DATA = Path(__file__).resolve().parent.parent / "data"
DATASET_DIR = _DATA / "ttset-cpu-v3"
# The dense pool for active-learning studies: few tasks, ~800 programs each, one hardware.
POOL_DIR = _DATA / "ttset-pool-v1"
# Names a user may give instead of a directory.
SHIPPED_DATASETS = {"default": DATASET_DIR, "pool": POOL_DIR}


def dataset_path(dataset: str | Path) -> Path:
    """The directory of ``dataset``: a shipped dataset's name (``default``, ``pool``) or a
    directory."""
    return SHIPPED_DATASETS.get(str(dataset), Path(dataset))
