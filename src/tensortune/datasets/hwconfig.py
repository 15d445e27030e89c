"""Named hardware configurations for cross-hardware datasets.

One machine can stand in for several "hardware": the target's ISA (``mcpu``/``mattr``) changes
code generation and the search space, and ``num-cores`` with the runner's ``TVM_NUM_THREADS``
changes parallelism.  Each configuration is its own target in the records store.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensortune.errors import TensortuneError


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
