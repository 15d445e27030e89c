"""The dataset shipped with the package (collected with ``tensortune dataset collect``)."""

from __future__ import annotations

from pathlib import Path

DATASET_DIR = Path(__file__).resolve().parent.parent / "data" / "ttset-cpu-v2"
