"""Pre-trained cost models shipped with the package, one per hardware configuration."""

from __future__ import annotations

from pathlib import Path

from tensortune.errors import TensortuneError

SHIPPED_DIR = Path(__file__).parent / "pretrained"


def shipped_model(target: dict) -> str:
    """Path of the shipped model whose hardware configuration matches ``target``."""
    from tensortune.datasets.hwconfig import CONFIGS

    for name, config in CONFIGS.items():
        if all(target.get(k) == v for k, v in config.target.items()):
            path = SHIPPED_DIR / f"{name}.ttm"
            if path.is_file():
                return str(path)
    available = sorted(p.stem for p in SHIPPED_DIR.glob("*.ttm"))
    raise TensortuneError(
        f"no pre-trained cost model is shipped for target {target}; shipped: "
        f"{', '.join(available) or 'none yet'} (tune with --target of one of them, or give a "
        "model file)"
    )
