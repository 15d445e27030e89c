"""This machine's hardware fingerprint and the default tuning target.

Records are only comparable on the hardware they were measured on, so every record carries a
fingerprint of the CPU it ran on: model, ISA flags that change code generation, cores usable by
this process and cache sizes.  The fingerprint id is a short hash of that description.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path

from tensortune.errors import TargetError, last_line

# Flags that change what LLVM may emit or how fast it runs; the rest of /proc/cpuinfo's flags
# (virtualisation quirks, mitigations) would only split identical hardware into many ids.
_ISA_FLAGS = (
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
        d = json.loads(text)
        return cls(d["cpu_model"], d["arch"], d["cores"], tuple(d["isa"]), dict(d["caches"]))


def _cpuinfo() -> dict[str, str]:
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


def _caches() -> dict[str, int]:
    out: dict[str, int] = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")):
        try:
            level = (idx / "level").read_text().strip()
            kind = (idx / "type").read_text().strip()
            size = (idx / "size").read_text().strip()
        except OSError:
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
        mult = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(size[-1:], 1)
        out[f"L{level}{suffix}"] = int(size.rstrip("KMG")) * mult
    return out


@cache
def current_hardware() -> Hardware:
    """The fingerprint of the machine this process runs on."""
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return Hardware(
        cpu_model=info.get("model name") or platform.processor() or "unknown",
        arch=platform.machine(),
        cores=int(cores or 1),
        isa=tuple(f for f in _ISA_FLAGS if f in flags),
        caches=_caches(),
    )


def default_target() -> dict:
    """This machine's CPU with its real ``mcpu`` and all usable cores.

    TVM's bare ``{"kind": "llvm"}`` targets generic x86-64 (SSE only), ~3.5x slower code.
    """
    from tensortune.compat import tvm

    return {
        "kind": "llvm",
        "mcpu": tvm.target.codegen.llvm_get_system_cpu(),
        "num-cores": current_hardware().cores,
    }


def parse_target(target: str | dict | None) -> dict:
    """Validate a target given as a dict or JSON object text; ``None`` means the default."""
    if target is None:
        return default_target()
    if isinstance(target, str):
        text = target.strip()
        if not text.startswith("{"):
            raise TargetError(
                f'target must be a JSON object such as \'{{"kind": "llvm", "mcpu": '
                f'"skylake-avx512"}}\', not the string {target!r}'
            )
        try:
            target = json.loads(text)
        except json.JSONDecodeError as e:
            raise TargetError(f"target is not valid JSON: {e}") from None
    if not isinstance(target, dict) or "kind" not in target:
        raise TargetError("target must be a JSON object with a 'kind' key")
    from tensortune.compat import tvm

    try:
        tvm.target.Target(target)
    except Exception as e:
        raise TargetError(f"TVM rejects target {json.dumps(target)}: {last_line(e)}") from None
    return dict(target)


def target_key(target: dict | object) -> str:
    """Canonical text of a target (a dict or a ``tvm.target.Target``): records are keyed by it.

    TVM fills in defaults (``keys``, ``tag``...), so both a user's short dict and the Target
    MetaSchedule hands back map to the same text.
    """
    from tensortune.compat import tvm

    exported = tvm.target.Target(target).export() if isinstance(target, dict) else target.export()
    return json.dumps(_plain(exported), sort_keys=True)


def _plain(value: object) -> object:
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}  # type: ignore[union-attr]
    if isinstance(value, list | tuple) or type(value).__name__ in ("Array", "List"):
        return [_plain(v) for v in value]  # type: ignore[union-attr]
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return str(value)


def runtime_threads(target: dict) -> int:
    """Threads the measuring process must use: the target's ``num-cores``.

    ``num-cores`` only shapes the search space; the TVM runtime's thread pool follows
    ``TVM_NUM_THREADS`` read at process start, so the runner sets that from this.
    """
    return int(target.get("num-cores") or current_hardware().cores)
