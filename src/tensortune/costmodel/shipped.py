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


def nearest_config(target: dict) -> str | None:
    """Our configuration closest to ``target`` (same SIMD width first, then core count), for
    targets that are none of them, e.g. this machine's default ``mcpu``."""
    from tensortune.compat import tvm
    from tensortune.datasets.hwconfig import CONFIGS

    def simd(t: dict) -> int:
        tt = tvm.target.Target(t)
        has = tvm.target.codegen.llvm_cpu_has_features
        return 512 if has("avx512f", tt) else 256 if has("avx", tt) else 128

    try:
        width, cores = simd(target), target.get("num-cores")
    except Exception:
        return None

    def distance(item: tuple) -> tuple[bool, bool]:
        t = item[1].target
        return simd(t) != width, t["num-cores"] != cores

    name, config = min(CONFIGS.items(), key=distance)
    return name if simd(config.target) == width else None


def shipped_model(target: dict) -> str:
    """Path of the shipped model whose hardware configuration matches ``target`` (or is the
    nearest to it): the best model of the cost-model benchmark, trained on that
    configuration's rows of the dataset."""
    name = config_of(target) or (nearest_config(target) if target.get("kind") == "llvm" else None)
    if name is not None:
        path = SHIPPED_DIR / f"{name}.ttm"
        if path.is_file():
            return str(path)
    available = sorted(p.stem for p in SHIPPED_DIR.glob("*.ttm"))
    raise TensortuneError(
        f"no pre-trained cost model is shipped for target {target}; shipped: "
        f"{', '.join(available) or 'none yet'} (tune with --target of one of them, or give a "
        "model file)"
    )
