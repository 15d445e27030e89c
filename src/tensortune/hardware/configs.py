"""Named hardware configurations for cross-hardware datasets and the models trained on them.

One machine can stand in for several "hardware": the target's ISA (``mcpu``/``mattr``) changes
code generation and the search space, and ``num-cores`` with the runner's ``TVM_NUM_THREADS``
changes parallelism.  Each configuration is its own target in the records store.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tensortune.errors import TensortuneError
from tensortune.hardware.target import simd_bits


@dataclass(frozen=True)
class HardwareConfig:
    name: str
    target: dict
    description: str

    @property
    def threads(self) -> int:
        return int(self.target["num-cores"])


CONFIGS: dict[str, HardwareConfig] = {
    c.name: c
    for c in [
        HardwareConfig(
            "avx512-2c",
            {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2},
            "AVX-512 code (skylake-avx512), 2 cores, 2 run-time threads",
        ),
        HardwareConfig(
            "avx2-1c",
            {"kind": "llvm", "mcpu": "haswell", "num-cores": 1},
            "AVX2/FMA code only (haswell), 1 core, 1 run-time thread",
        ),
        HardwareConfig(
            "avx512-1c",
            {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 1},
            "AVX-512 code (skylake-avx512), 1 core, 1 run-time thread",
        ),
        HardwareConfig(
            "avx2-2c",
            {"kind": "llvm", "mcpu": "haswell", "num-cores": 2},
            "AVX2/FMA code only (haswell), 2 cores, 2 run-time threads",
        ),
    ]
}


def get_config(name: str) -> HardwareConfig:
    if name not in CONFIGS:
        raise TensortuneError(
            f"unknown hardware configuration '{name}'; known: {', '.join(CONFIGS)}"
        )
    return CONFIGS[name]


def config_of(target: dict) -> str | None:
    """The name of the configuration ``target`` is, if it is one of ours.  A target that adds an
    ``mattr`` (e.g. turning AVX-512 off, as this machine's default target does on a guest that
    hides it) is taken for none of ours, since it may build other code."""
    for name, config in CONFIGS.items():
        wanted = {**config.target, "mattr": config.target.get("mattr") or None}
        given = {**target, "mattr": target.get("mattr") or None}  # TVM writes none as []
        if all(given.get(k) == v for k, v in wanted.items()):
            return name
    return None


def nearest_config(target: dict, among: Iterable[str] | None = None) -> str | None:
    """Our configuration (of ``among``, default all) closest to ``target`` (same SIMD width
    first, then core count), for targets that are none of them, e.g. this machine's default
    ``mcpu``; ``None`` when none has the target's SIMD width."""
    wanted = CONFIGS.keys() if among is None else set(among)
    configs = {n: c for n, c in CONFIGS.items() if n in wanted}
    if not configs:
        return None
    try:
        width, cores = simd_bits(target), target.get("num-cores")
    except Exception:
        return None

    def distance(item: tuple[str, HardwareConfig]) -> tuple[bool, bool]:
        t = item[1].target
        return simd_bits(t) != width, t["num-cores"] != cores

    name, config = min(configs.items(), key=distance)
    return name if simd_bits(config.target) == width else None
