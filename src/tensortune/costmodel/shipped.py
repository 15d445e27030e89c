"""Pre-trained cost models shipped with the package.

A file's name lists the hardware configurations it was trained on: ``avx2-1c.ttm`` on one,
``avx2-1c+avx512-1c.ttm`` on two.  ``pretrained/card.json`` says how each was trained and holds
its checksum: a file that does not match it (a broken install, a file swapped in place) is
refused before it is loaded.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from tensortune.datasets.build import file_sha256
from tensortune.errors import TensortuneError
from tensortune.hardware import Platform, config_of, nearest_config

SHIPPED_DIR = Path(__file__).parent / "pretrained"
CARD = SHIPPED_DIR / "card.json"


class NoShippedModel(TensortuneError):
    """No model is shipped for the target (or, for MoA, for other hardware).  Callers with a
    fallback catch this one only: a shipped file that fails its checksum, or a card that
    cannot be read, is a broken install and must be said, not replaced by a cold model."""


@functools.cache
def shipped_card() -> dict:
    """The card of the shipped models: ``files`` maps each file name to its sha256, kind,
    configurations and training provenance."""
    try:
        return json.loads(CARD.read_text())
    except (OSError, ValueError) as e:
        raise TensortuneError(f"the shipped models' card cannot be read ({e})") from None


def models_trained_on(dataset: str) -> dict[str, dict]:
    """The shipped models fitted on the dataset named ``dataset`` (its card's ``name``): per
    file, its kind, configurations, split and the TenSet metrics on that split's test rows."""
    files = shipped_card().get("files", {})
    return {name: {"kind": e.get("kind"), "configurations": e.get("configurations", []),
                   **{k: v for k, v in e.get("trained_on", {}).items() if k != "dataset"}}
            for name, e in sorted(files.items())
            if e.get("trained_on", {}).get("dataset") == dataset}  # fmt: skip


def checked(path: Path) -> str:
    """``path``, a shipped model file, after checking its bytes against the card."""
    entry = shipped_card().get("files", {}).get(path.name)
    if entry is None or file_sha256(path) != entry.get("sha256"):
        raise TensortuneError(
            f"shipped model {path.name} does not match its checksum in {CARD}: reinstall tensortune"
        )
    return str(path)


def shipped_model(platform: Platform) -> str:
    """Path of the shipped model whose hardware configuration matches the platform's target (or
    is the nearest to it): the best model of the cost-model benchmark, trained on that
    configuration's rows of the dataset."""
    target = platform.target
    available = sorted(p.stem for p in SHIPPED_DIR.glob("*.ttm"))
    name = config_of(target)
    if name not in available and platform.kind == "llvm":
        name = nearest_config(target, among=available)
    if name in available:
        return checked(SHIPPED_DIR / f"{name}.ttm")
    raise NoShippedModel(
        f"no pre-trained cost model is shipped for target {target}; shipped: "
        f"{', '.join(available) or 'none yet'} (tune with --target of one of them, or give a "
        "model file)"
    )


def shipped_source(platform: Platform) -> str:
    """Path of the shipped model trained on the most configurations other than the platform's
    (or the one nearest to it): what MoA adapts to it."""
    target = platform.target
    models = sorted(SHIPPED_DIR.glob("*.ttm"))
    mine = config_of(target) or nearest_config(target, among=[p.stem for p in models])
    others = [p for p in models if mine not in p.stem.split("+")]
    if not others:
        raise NoShippedModel("no model pre-trained on other hardware is shipped for MoA")
    most = max(len(p.stem.split("+")) for p in others)
    widest = [p for p in others if len(p.stem.split("+")) == most]
    near = nearest_config(target, among=[p.stem for p in widest])  # ties: the nearest config
    return checked(next((p for p in widest if p.stem == near), widest[0]))
