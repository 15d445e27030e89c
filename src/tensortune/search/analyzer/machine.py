"""The machine parameters the analyzer's roofline needs, for a platform.

Cores and SIMD width come from the target (what the generated code may use); cache sizes from
the host; frequency and memory and L2 bandwidth from ``hardware.speeds``, measured once per
machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensortune.hardware import Platform
from tensortune.hardware.speeds import machine_speeds


@dataclass(frozen=True)
class Machine:
    cores: int
    vector_bits: int  # SIMD register width the target's ISA allows
    ghz: float
    l1_bytes: float  # per core
    l2_bytes: float  # per core
    l2_gbps: float  # one core streaming from L2
    mem_gbps: float  # all cores streaming from memory
    fma_ports: int = 2

    def lanes(self, dtype_bits: int) -> int:
        return max(self.vector_bits // max(dtype_bits, 8), 1)


def machine_for(platform: Platform) -> Machine:
    """The machine the platform's code runs on: its target's ISA and core count, on the
    platform hardware's caches, at this machine's measured speeds (``hardware.speeds``)."""
    hw = platform.hardware
    speeds = machine_speeds()
    return Machine(
        cores=platform.threads,
        vector_bits=platform.simd_bits,
        ghz=speeds.ghz,
        l1_bytes=float(hw.caches.get("L1d", 32 * 1024)),
        l2_bytes=float(hw.caches.get("L2", 1024 * 1024)),
        l2_gbps=speeds.l2_gbps,
        mem_gbps=speeds.mem_gbps,
    )
