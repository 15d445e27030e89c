"""The analyzer: a roofline latency estimate from a program's symbols (Pruner's PSA, for CPUs).

Per block, compute time is its work over the throughput its schedule can reach: FMA units x the
SIMD lanes its vectorized loop fills (or the loop LLVM vectorizes unasked, where the schedule
vectorized none) x the cores its parallel loops keep busy (a parallel extent of 5 on 4 cores
leaves 3 idle in the second wave), slowed by loop overhead that unrolling hides
and by low data reuse.  Memory time is the bytes its tiles move into L1 and L2 over the
bandwidths: a tile that fits a cache level is loaded once per execution of the loops above it.
A block takes the sum of the two (scheduled CPU code overlaps them poorly: on our dataset the
sum recalls more of each task's best programs than the roofline's max does); the program is
the sum over blocks plus the thread-pool wake-ups of its parallel loops.  Only the ranking
within a task matters.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from tensortune.search.analyzer.machine import Machine
from tensortune.search.analyzer.symbols import BlockSymbols, StructureCache, program_symbols

_LAUNCH_SECONDS = 2e-6  # one wake-up of TVM's thread pool
_CACHE_USE = 0.75  # share of a cache a tile may fill before it spills


def block_latency(b: BlockSymbols, m: Machine) -> float:
    lanes = m.lanes(b.dtype_bits)
    # LLVM vectorizes a loop left to it only when it holds a whole vector's lanes
    vector = b.vector if b.vector > 1 or b.implicit_vector < lanes else b.implicit_vector
    used_lanes = vector / math.ceil(vector / lanes) if vector > 1 else 1.0
    cores = b.parallel / math.ceil(b.parallel / m.cores) if b.parallel > 1 else 1.0
    per_core = m.ghz * 1e9 * m.fma_ports * used_lanes * (2.0 if b.ops_per_iter >= 2 else 1.0)
    overhead = 1.0 + 1.0 / max(1.0, min(b.unroll, b.iterations)) + 1.0 / max(b.inner, 1.0)
    reuse = b.work / max(b.unique_bytes / (b.dtype_bits / 8), 1.0)
    compute = b.work / (per_core * cores) * overhead * (1.0 + 1.0 / max(reuse, 1e-3))
    from_l2, from_mem = block_traffic(b, m)
    memory = from_l2 / (m.l2_gbps * 1e9 * cores) + from_mem / (m.mem_gbps * 1e9)
    return compute + memory + b.launches * _LAUNCH_SECONDS


def block_traffic(b: BlockSymbols, m: Machine) -> tuple[float, float]:
    """Bytes the block loads into L1 from L2, and into L2 from memory."""
    return _traffic(b, m.l1_bytes * _CACHE_USE), _traffic(b, m.l2_bytes * _CACHE_USE)


def _traffic(b: BlockSymbols, capacity: float) -> float:
    """Bytes loaded into a cache of ``capacity``: the outermost sub-nest whose footprint fits
    is loaded once per run of the loops above it (at least the data itself, once)."""
    for d, size in enumerate(b.footprint):
        if size <= capacity:
            return max(b.trips[d] * size, b.unique_bytes)
    return b.trips[-1] * b.footprint[-1] if b.footprint else b.unique_bytes


def estimate_latency(symbols: Sequence[BlockSymbols], machine: Machine) -> float:
    """Estimated seconds of a program (``inf`` when it has no computing block)."""
    if not symbols:
        return math.inf
    return sum(block_latency(b, machine) for b in symbols)


class Analyzer:
    """Scores scheduled programs of one task by their estimated latency: higher is faster.

    Use one per task: it caches the access structure of the task's blocks.
    """

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.structure: StructureCache = {}

    def latency(self, mod: object) -> float:
        try:
            return estimate_latency(program_symbols(mod, self.structure), self.machine)
        except Exception:  # a schedule the walk does not understand ranks last, not fatally
            return math.inf

    def scores(self, mods: Sequence[object]) -> np.ndarray:
        lat = np.array([self.latency(m) for m in mods], dtype=np.float64)
        return np.where(np.isfinite(lat), 1.0 / np.maximum(lat, 1e-12), 0.0)
