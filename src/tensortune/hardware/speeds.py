"""This machine's clock and copy bandwidths, measured once and kept on disk.

No CPU reports its bandwidth, so it is timed: a NumPy copy, a few hundred milliseconds.  Timed
anew in every process it came out a little different each time, and the draft analyzer's
roofline, which reads it, then ordered near-tied programs differently from one run to the next:
a seeded search could not be repeated (benchmarks/RESULTS.md, stop 67).  So the figures are
kept per machine in the user's cache (``$XDG_CACHE_HOME/tensortune/speeds-v<N>-<hardware
id>.json``), and every process on the machine reads the same ones.  Delete the file to
measure again.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import time
from dataclasses import asdict, dataclass, fields
from functools import cache
from pathlib import Path

import numpy as np

from tensortune.files import write_atomically
from tensortune.hardware.fingerprint import cpuinfo, current_hardware


@dataclass(frozen=True)
class Speeds:
    ghz: float  # the clock /proc/cpuinfo reports
    l2_gbps: float  # one core copying a block that stays in L2
    mem_gbps: float  # copying a block far larger than any cache


def cache_dir() -> Path:
    """Where tensortune keeps what it can recompute (``$XDG_CACHE_HOME/tensortune``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tensortune"


# Bumped when what is measured changes, so that a machine measures again (2: the L2 copy
# sized by the machine's L2, ``l2_block``).
_VERSION = 2


def _path() -> Path:
    return cache_dir() / f"speeds-v{_VERSION}-{current_hardware().id}.json"


@cache  # once a process, whatever the file does meanwhile
def machine_speeds() -> Speeds:
    """This machine's ``Speeds``: read from the cache, or measured and written there."""
    try:
        path = _path()
        path.parent.mkdir(parents=True, exist_ok=True)
        # Processes starting together wait for one measurement rather than each timing a
        # copy while the others load the memory bus, the slowest figure kept for good.
        with open(path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return _read(path) or _write(path, _measure())
    except (OSError, RuntimeError):  # no home to keep it in: measured in each process
        return _measure()


def _read(path: Path) -> Speeds | None:
    try:
        raw = json.loads(path.read_text())
        speeds = Speeds(**{f.name: float(raw[f.name]) for f in fields(Speeds)})
    except (OSError, ValueError, KeyError, TypeError, ArithmeticError, RecursionError):
        return None  # none yet, or damaged: measured again and rewritten
    return speeds if all(math.isfinite(v) and v > 0 for v in asdict(speeds).values()) else None


def _write(path: Path, speeds: Speeds) -> Speeds:
    write_atomically(path, json.dumps(asdict(speeds)))
    return speeds


def _measure() -> Speeds:
    l2, mem = _bandwidth_gbps()
    return Speeds(ghz=_ghz(), l2_gbps=l2, mem_gbps=mem)


def _ghz() -> float:
    """The highest clock the kernel allows a core where it says (cpufreq), else the clock
    ``/proc/cpuinfo`` reports now (a virtual machine's is fixed); 2.5 where neither is."""
    try:
        khz = float(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text())
        if khz > 0:
            return khz / 1e6
    except (OSError, ValueError):
        pass
    try:
        mhz = float(cpuinfo().get("cpu MHz", ""))
    except ValueError:
        mhz = 0.0
    return mhz / 1000.0 if mhz > 0 else 2.5


def _bandwidth_gbps() -> tuple[float, float]:
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

    return best(l2_block(current_hardware().caches), 200), best(256 * 1024 * 1024, 2)


def l2_block(caches: dict[str, int]) -> int:
    """Bytes of each of the two buffers of the L2 copy: together half the L2, so that both
    stay there (256 KiB each on a 1 MiB L2; a fixed 256 KiB filled a Zen 3's 512 KiB L2 and
    measured L3), a multiple of 8 bytes, 256 KiB where the L2 is not known."""
    l2 = caches.get("L2", 0)
    return max(16 * 1024, l2 // 4) // 8 * 8 if l2 > 0 else 256 * 1024
