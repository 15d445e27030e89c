"""The machine parameters the analyzer's roofline needs, for a platform.

Cores and SIMD width come from the target (what the generated code may use); frequency and cache
sizes from the host; memory and L2 bandwidth are measured once per process with a NumPy copy
(a few hundred milliseconds), because no CPU reports them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cache

import numpy as np

from tensortune.hardware import Platform, cpuinfo


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
    platform hardware's caches."""
    hw = platform.hardware
    l2, mem = bandwidth_gbps()
    return Machine(
        cores=platform.threads,
        vector_bits=platform.simd_bits,
        ghz=_ghz(),
        l1_bytes=float(hw.caches.get("L1d", 32 * 1024)),
        l2_bytes=float(hw.caches.get("L2", 1024 * 1024)),
        l2_gbps=l2,
        mem_gbps=mem,
    )


@cache  # one clock a process: the same programs rank the same way within a run
def _ghz() -> float:
    try:
        return float(cpuinfo().get("cpu MHz", "")) / 1000.0
    except ValueError:
        return 2.5


@cache
def bandwidth_gbps() -> tuple[float, float]:
    """(L2, memory) copy bandwidth in GB/s: the best of a few timed ``np.copyto`` runs."""

    def best(n_bytes: int, reps: int) -> float:
        src = np.ones(n_bytes // 8)
        dst = np.empty_like(src)
        np.copyto(dst, src)  # touch the pages first
        fastest = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(reps):
                np.copyto(dst, src)
            fastest = min(fastest, (time.perf_counter() - t0) / reps)
        return 2 * n_bytes / fastest / 1e9  # read + write

    return best(256 * 1024, 200), best(256 * 1024 * 1024, 2)
