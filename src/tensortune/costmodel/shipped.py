"""Pre-trained cost models shipped with the package, one per hardware configuration."""

from __future__ import annotations

from pathlib import Path

from tensortune.errors import TensortuneError

SHIPPED_DIR = Path(__file__).parent / "pretrained"


def config_of(target: dict) -> str | None:
    """The name of the hardware configuration ``target`` is, if it is one of ours."""
    from tensortune.datasets.hwconfig import CONFIGS

    for name, config in CONFIGS.items():
        if all(target.get(k) == v for k, v in config.target.items()):
            return name
    return None


def shipped_model(target: dict) -> str:
    """Path of the shipped model whose hardware configuration matches ``target``.

    ``<config>.ttm`` is the best model on that configuration's data; ``<config>.nn.ttm`` a
    neural one, the starting point for momentum adaptation (MoA) on other hardware.
    """
    name = config_of(target)
    if name is not None:
        path = SHIPPED_DIR / f"{name}.ttm"
        if path.is_file():
            return str(path)
    available = sorted(p.stem for p in SHIPPED_DIR.glob("*.ttm") if ".nn" not in p.name)
    raise TensortuneError(
        f"no pre-trained cost model is shipped for target {target}; shipped: "
        f"{', '.join(available) or 'none yet'} (tune with --target of one of them, or give a "
        "model file)"
    )
