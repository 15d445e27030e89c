"""Pre-trained cost models shipped with the package.

A file's name lists the hardware configurations it was trained on: ``avx2-1c.ttm`` on one,
``avx2-1c+avx512-1c.ttm`` on two.
"""

from __future__ import annotations

from pathlib import Path

from tensortune.errors import TensortuneError
from tensortune.hardware import Platform, config_of, nearest_config

SHIPPED_DIR = Path(__file__).parent / "pretrained"


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
        return str(SHIPPED_DIR / f"{name}.ttm")
    raise TensortuneError(
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
        raise TensortuneError("no model pre-trained on other hardware is shipped for MoA")
    most = max(len(p.stem.split("+")) for p in others)
    widest = [p for p in others if len(p.stem.split("+")) == most]
    near = nearest_config(target, among=[p.stem for p in widest])  # ties: the nearest config
    return str(next((p for p in widest if p.stem == near), widest[0]))
