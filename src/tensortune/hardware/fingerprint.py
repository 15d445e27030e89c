"""This machine's hardware fingerprint.

Records are only comparable on the hardware they were measured on, so every record carries a
fingerprint of the CPU it ran on: model, ISA flags that change code generation, cores usable by
this process and cache sizes.  The fingerprint id is a short hash of that description.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path

# Flags that change what LLVM may emit or how fast it runs; the rest of /proc/cpuinfo's flags
# (virtualisation quirks, mitigations) would only split identical hardware into many ids.
ISA_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl",
    "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16",
    "asimd", "sve", "sve2",
)  # fmt: skip


@dataclass(frozen=True)
class Hardware:
    """What a measurement's speed depends on, besides the program itself."""

    cpu_model: str
    arch: str
    cores: int
    isa: tuple[str, ...]
    caches: dict[str, int] = field(default_factory=dict)  # "L1d" -> bytes

    @property
    def id(self) -> str:
        """Short stable id: the first 16 hex digits of the description's sha256."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Hardware:
        """The description ``to_json`` wrote; ``ValueError`` for text that is not one."""
        try:
            d = json.loads(text)
            hw = cls(d["cpu_model"], d["arch"], d["cores"], tuple(d["isa"]), dict(d["caches"]))
        except (ValueError, RecursionError, TypeError, KeyError) as e:
            raise ValueError(f"not a hardware description ({type(e).__name__}: {e})") from None
        if not (
            isinstance(hw.cpu_model, str)
            and isinstance(hw.arch, str)
            and type(hw.cores) is int
            and all(isinstance(x, str) for x in hw.isa)
            and all(isinstance(k, str) and type(v) is int for k, v in hw.caches.items())
        ):
            raise ValueError("not a hardware description (a field of the wrong type)")
        return hw


def cpuinfo() -> dict[str, str]:
    """The first value of each key of ``/proc/cpuinfo`` (empty where there is none)."""
    info: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key and key not in info:
                info[key] = value.strip()
    except OSError:
        pass
    return info


def _caches(base: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> dict[str, int]:
    out: dict[str, int] = {}
    for idx in sorted(base.glob("index*")):
        try:
            level = (idx / "level").read_text().strip()
            kind = (idx / "type").read_text().strip()
            size = (idx / "size").read_text().strip()
        except OSError:
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
        mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(size[-1:], 1)
        try:
            out[f"L{level}{suffix}"] = int(size.rstrip("KMG")) * mult
        except ValueError:  # an empty or odd size file (seen in some VMs): not known
            continue
    return out


def affinity_cores() -> int:
    """Cores this process's CPU affinity allows: what describes the machine (``Hardware``)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return int(cores or 1)


def usable_cores() -> int:
    """Cores to run threads and workers on: the CPU affinity's, and no more than a cgroup CPU
    quota grants (a container limited to 2 CPUs of a 64-core host ran 64 threads and started
    64 builders).  The quota is not part of the machine's description (``Hardware.cores``):
    the same machine keeps its id in a container of any quota."""
    cores = affinity_cores()
    return max(1, min(cores, cgroup_cpu_quota() or cores))


def cgroup_cpu_quota(cgroups: Path = Path("/proc/self/cgroup"),
                     root: Path = Path("/sys/fs/cgroup")) -> int | None:  # fmt: skip
    """The whole CPUs this process's cgroups allow it (the least over its cgroup and those
    above it; cgroup v2's ``cpu.max``, v1's CFS quota), rounded up; None when unlimited."""
    try:
        lines = cgroups.read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, path = [*line.split(":", 2), "", ""][:3]
        if controllers == "":  # v2: one hierarchy, cpu.max = "QUOTA PERIOD" or "max PERIOD"
            base, read = root, _v2_quota
        elif "cpu" in controllers.split(","):  # v1: the cpu controller's own hierarchy
            base = next((root / d for d in ("cpu", "cpu,cpuacct", "cpuacct,cpu")
                         if (root / d).is_dir()), None)  # fmt: skip
            read = _v1_quota
        else:
            continue
        if base is None:
            continue
        here = base / path.strip("/")
        for directory in (here, *here.parents):  # every ancestor's limit applies
            limit = read(directory)
            if limit is not None:
                limits.append(limit)
            if directory == base:
                break
    return min(limits) if limits else None


def _v2_quota(directory: Path) -> int | None:
    try:
        quota, period = (directory / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError, ZeroDivisionError):
        return None


def _v1_quota(directory: Path) -> int | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else max(1, math.ceil(quota / period))
    except (OSError, ValueError, ZeroDivisionError):
        return None


def pid_scope() -> str | None:
    """Where this process's pids mean something: the boot and the pid namespace (``BOOT:NS``;
    None without ``/proc``).  Another container or VM, or the same machine after a reboot,
    sees this process's pid as gone, or as another process."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return None


@contextmanager
def affinity_kept() -> Iterator[None]:
    """Run TVM in this process without losing the calling thread's CPU affinity: TVM's
    thread pool pins the thread that starts it to one core, and every thread and process it
    starts later would inherit that single core (PyTorch's pool, a subprocess)."""
    if not hasattr(os, "sched_getaffinity"):
        yield
        return
    saved = os.sched_getaffinity(0)
    try:
        yield
    finally:
        if os.sched_getaffinity(0) != saved:
            os.sched_setaffinity(0, saved)


def cpu_flags(info: dict[str, str] | None = None) -> set[str]:
    """The CPU's feature flags as the kernel lists them (x86 ``flags``, Arm ``Features``);
    empty where there is no ``/proc/cpuinfo``."""
    info = cpuinfo() if info is None else info
    return set((info.get("flags") or info.get("Features") or "").split())


@cache
def current_hardware() -> Hardware:
    """The fingerprint of the machine this process runs on."""
    info = cpuinfo()
    flags = cpu_flags(info)
    return Hardware(
        cpu_model=info.get("model name") or platform.processor() or "unknown",
        arch=platform.machine(),
        cores=affinity_cores(),
        isa=tuple(f for f in ISA_FLAGS if f in flags),
        caches=_caches(),
    )
