"""Pre-trained cost models shipped with the package.

A file's name lists the hardware configurations it was trained on: ``avx2-1c.ttm`` on one,
``avx2-1c+avx512-1c.ttm`` on two.
"""

from __future__ import annotations

from collections.abc import Iterable
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


def nearest_config(target: dict, among: Iterable[str] | None = None) -> str | None:
    """Our configuration (of ``among``, default all) closest to ``target`` (same SIMD width
    first, then core count), for targets that are none of them, e.g. this machine's default
    ``mcpu``."""
    from tensortune.compat import tvm
    from tensortune.datasets.hwconfig import CONFIGS

    wanted = CONFIGS.keys() if among is None else set(among)
    configs = {n: c for n, c in CONFIGS.items() if n in wanted}
    if not configs:
        return None

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

    name, config = min(configs.items(), key=distance)
    return name if simd(config.target) == width else None


def shipped_model(target: dict) -> str:
    """Path of the shipped model whose hardware configuration matches ``target`` (or is the
    nearest to it): the best model of the cost-model benchmark, trained on that
    configuration's rows of the dataset."""
    available = sorted(p.stem for p in SHIPPED_DIR.glob("*.ttm"))
    name = config_of(target)
    if name not in available and target.get("kind") == "llvm":
        name = nearest_config(target, among=available)
    if name in available:
        return str(SHIPPED_DIR / f"{name}.ttm")
    raise TensortuneError(
        f"no pre-trained cost model is shipped for target {target}; shipped: "
        f"{', '.join(available) or 'none yet'} (tune with --target of one of them, or give a "
        "model file)"
    )


def shipped_source(target: dict) -> str:
    """Path of the shipped model trained on the most configurations other than ``target``'s
    (or the one nearest to it): what MoA adapts to ``target``."""
    models = sorted(SHIPPED_DIR.glob("*.ttm"))
    mine = config_of(target) or nearest_config(target, among=[p.stem for p in models])
    others = [p for p in models if mine not in p.stem.split("+")]
    if not others:
        raise TensortuneError("no model pre-trained on other hardware is shipped for MoA")
    most = max(len(p.stem.split("+")) for p in others)
    widest = [p for p in others if len(p.stem.split("+")) == most]
    near = nearest_config(target, among=[p.stem for p in widest])  # ties: the nearest config
    return str(next((p for p in widest if p.stem == near), widest[0]))
