"""Whether something else wanted the CPU while a kernel was being timed.

A multi-threaded kernel waits for its slowest thread on every call: if another process holds
one of the cores, each call can take a whole scheduler tick (4 ms on this kernel), and a 20 µs
kernel is recorded at 4-8 ms.  Linux's pressure-stall information says, to the microsecond,
how long runnable tasks waited for a CPU; the hypervisor's steal time (in /proc/stat) says
how long the virtual CPUs did not run at all.  Either one over a small share of the timing
window means the timing is not to be trusted.  Elsewhere than Linux, nothing is known and
``share`` returns None.
"""

from __future__ import annotations

import os
from time import perf_counter

_PSI = "/proc/pressure/cpu"
_STAT = "/proc/stat"
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def _first_fields(path: str) -> list[str]:
    """The whitespace-separated fields of a file's first line; none if it cannot be read."""
    try:
        with open(path) as f:
            return f.readline().split()
    except OSError:
        return []


def _psi_wait_s() -> float | None:
    """Seconds during which some runnable task waited for a CPU, since boot."""
    for field in _first_fields(_PSI):
        if field.startswith("total="):
            return int(field[6:]) / 1e6
    return None


def _steal_s() -> float | None:
    """Seconds the virtual CPUs were ready but the hypervisor ran something else, all CPUs."""
    cpu = _first_fields(_STAT)
    return int(cpu[8]) * _TICK_S if len(cpu) > 8 and cpu[0] == "cpu" else None


class CpuWatch:
    """Started before a timing; ``share()`` after it gives the contended share of the window."""

    def __init__(self) -> None:
        self.wall = perf_counter()
        self.wait = _psi_wait_s()
        self.steal = _steal_s()

    def share(self) -> float | None:
        """Waiting-for-CPU time over the window's wall time (steal spread over all CPUs)."""
        elapsed = perf_counter() - self.wall
        if elapsed <= 0:
            return None
        shares = []
        wait = _psi_wait_s()
        if wait is not None and self.wait is not None:
            shares.append((wait - self.wait) / elapsed)
        steal = _steal_s()
        if steal is not None and self.steal is not None:
            shares.append((steal - self.steal) / (elapsed * (os.cpu_count() or 1)))
        return max(shares) if shares else None
