"""Targets, resolved once into the ``Platform`` every layer below an entry point is handed.

A target is the JSON object TVM takes (``{"kind": "llvm", "mcpu": "znver4", "num-cores": 2}``);
the platform pairs it with the hardware that measures it.  Resolving validates the target the
way a user would want before any work starts: TVM must accept it, an ``mcpu`` must be one LLVM
knows (LLVM would otherwise fall back to generic code and only log it), and ``num-cores`` is
filled in with this machine's usable cores when it is left out (MetaSchedule requires it).
"""

from __future__ import annotations

import functools
import json
import platform as host
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from tensortune.errors import TargetError, check_flags, last_line
from tensortune.hardware.fingerprint import ISA_FLAGS, Hardware, current_hardware, usable_cores

if TYPE_CHECKING:
    from collections.abc import Iterable

    from tensortune.compat import tvm

# Kinds whose candidates can be measured here: the runner times kernels on this machine's CPU.
MEASURABLE_KINDS = ("llvm",)


# Instruction sets LLVM may emit for an x86 or Arm CPU target; the tuning-only features LLVM
# also lists for an mcpu (fast-*, macrofusion...) differ between vendors but not in what runs.
# Byte shuffles and shifts use VBMI (vpermb) and GFNI (gf2p8affineqb) where the CPU has them:
# an Ice Lake build judged without them passed on a Cascade Lake.
ISA = (
    "sse3", "ssse3", "sse4.1", "sse4.2", "sse4a", "popcnt", "pclmul", "avx", "avx2", "fma",
    "f16c", "bmi", "bmi2", "lzcnt", "movbe", "avx512f", "avx512bw", "avx512dq", "avx512vl",
    "avx512cd", "avx512ifma", "avx512vbmi", "avx512vbmi2", "avx512bitalg", "avx512vpopcntdq",
    "avx512vnni", "avx512bf16", "avx512fp16", "avxvnni", "gfni", "vaes", "vpclmulqdq",
    "amx-tile", "amx-int8", "amx-bf16", "neon", "sve", "sve2", "dotprod", "i8mm", "bf16",
    "fullfp16",
)  # fmt: skip
# LLVM's feature names that /proc/cpuinfo spells otherwise (the rest: "." and "-" become "_");
# the x86 ones as a Zen 4 guest's kernel listed them (2026-12-06).
_CPUINFO_NAME = {
    "sse3": "pni", "pclmul": "pclmulqdq", "bmi": "bmi1", "lzcnt": "abm",
    "avx512vbmi2": "avx512_vbmi2", "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq", "avx512vnni": "avx512_vnni",
    "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16", "avxvnni": "avx_vnni",
    "neon": "asimd", "dotprod": "asimddp", "fullfp16": "fphp",
}  # fmt: skip


def default_target() -> dict:
    """This machine's CPU with its real ``mcpu`` and all usable cores.

    TVM's bare ``{"kind": "llvm"}`` targets generic x86-64 (SSE only), ~3.5x slower code.
    Instruction sets the ``mcpu`` has but this machine's kernel does not list are turned off
    (``mattr``): a VM may hide some (a 2-core Xeon guest named ``emeraldrapids`` lists no AMX,
    AVX-512 FP16/BF16 or AVX-VNNI), and code using them would die of SIGILL.
    """
    from tensortune.compat import tvm

    mcpu = tvm.target.codegen.llvm_get_system_cpu()
    target = {"kind": "llvm", "mcpu": mcpu, "num-cores": usable_cores()}
    hidden = hidden_features(mcpu)
    if hidden:
        target["mattr"] = [f"-{f}" for f in sorted(hidden)]
    return target


def cpuinfo_name(feature: str) -> str:
    """How ``/proc/cpuinfo`` spells one of LLVM's instruction-set names."""
    return _CPUINFO_NAME.get(feature, feature.replace(".", "_").replace("-", "_"))


def hidden_features(mcpu: str) -> set[str]:
    """Instruction sets (of ``ISA``) LLVM names for CPU model ``mcpu`` that this machine's
    kernel does not list; none where there is no ``/proc/cpuinfo`` (LLVM's word is all there
    is)."""
    from tensortune.hardware.fingerprint import cpu_flags

    if not cpu_flags():
        return set()
    return target_isa({"kind": "llvm", "mcpu": mcpu}) - cpu_isa()


def cpu_isa() -> set[str]:
    """The instruction sets (of ``ISA``) this machine's CPU runs: those its kernel lists, or,
    where there is no ``/proc/cpuinfo``, those LLVM names for its CPU model.  From the kernel's
    list, not LLVM's name for the CPU: one guest was named ``emeraldrapids`` by one LLVM call
    and ``rocketlake`` by a later one, and a CPU LLVM does not know is ``generic``."""
    from tensortune.hardware.fingerprint import cpu_flags

    flags = cpu_flags()
    if flags:
        return {f for f in ISA if cpuinfo_name(f) in flags}
    from tensortune.compat import tvm

    return target_isa({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()})


def target_isa(target: dict) -> set[str]:
    """The instruction sets (of ``ISA``) code built for ``target`` may use (its ``mcpu`` less
    what its ``mattr`` turns off); none for a target that is not a CPU."""
    from tensortune.compat import tvm

    if target.get("kind") != "llvm":
        return set()
    return set(tvm.target.codegen.llvm_get_cpu_features(tvm.target.Target(target))) & set(ISA)


def check_runs_here(target: dict) -> None:
    """Refuse to build code for this machine that its CPU cannot run (it would die of SIGILL,
    and every candidate would be recorded as a crash): a target for another CPU model."""
    lacking = sorted(target_isa(target) - cpu_isa())
    if lacking:
        raise TargetError(
            f"target {json.dumps(target)} uses {', '.join(lacking)}, which this CPU lacks: "
            "its code cannot run here (leave --target out for this CPU's own)"
        )


def check_runs_on(target: dict, hardware: Hardware) -> None:
    """``check_runs_here`` for the machine ``hardware`` describes: this one, or a device farm's
    servers, whose code is built here and run there.  For another machine only the instruction
    sets its fingerprint records are judged (``ISA_FLAGS``: SIMD and matrix extensions)."""
    if hardware.id == current_hardware().id:
        return check_runs_here(target)
    if not hardware.isa:  # a server that could not read its CPU's flags: nothing to judge by
        return None
    known = {f for f in target_isa(target) if cpuinfo_name(f) in ISA_FLAGS}
    lacking = sorted(f for f in known if cpuinfo_name(f) not in hardware.isa)
    if lacking:
        raise TargetError(
            f"target {json.dumps(target)} uses {', '.join(lacking)}, which the measuring "
            f"machine ({hardware.cpu_model}) lacks: its code cannot run there"
        )


def parse_target(target: str | dict | None) -> dict:
    """A target given as a dict or JSON object text, checked; ``None`` means the default.

    An ``llvm`` target without ``num-cores`` gets this machine's usable cores.
    """
    if target is None:
        return default_target()
    target = target_dict(target)
    _check_kind(target)
    if target["kind"] == "llvm":
        _check_llvm(target)
    from tensortune.compat import tvm

    try:
        tvm.target.Target(target)
    except Exception as e:
        raise TargetError(f"TVM rejects target {json.dumps(target)}: {last_line(e)}") from None
    return target


def target_dict(target: str | dict) -> dict:
    """A copy of the target as a dict with a ``kind``; JSON text is parsed."""
    if isinstance(target, str):
        text = target.strip()
        if not text.startswith("{"):
            raise TargetError(
                f'target must be a JSON object such as \'{{"kind": "llvm", "mcpu": '
                f'"skylake-avx512"}}\', not the string {target!r}'
            )
        try:
            target = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as e:
            raise TargetError(f"target is not valid JSON: {e}") from None
    if not isinstance(target, dict) or not isinstance(target.get("kind"), str):
        raise TargetError("target must be a JSON object with a 'kind' string")
    return dict(target)


@functools.lru_cache(maxsize=256)
def is_target_text(text: str) -> bool:
    """Whether ``text`` is a target as stores and datasets keep it (JSON of an object with a
    kind).  Cached: every record read carries one, and a store holds few distinct ones."""
    try:
        target_dict(text)
    except TargetError:
        return False
    return True


def _check_kind(target: dict) -> None:
    from tensortune.compat import tvm

    kinds = tvm.target.Target.list_kinds()
    if target["kind"] not in kinds:
        raise TargetError(f"TVM rejects target {json.dumps(target)}: unknown target kind "
                          f"{target['kind']!r} (TVM knows {', '.join(sorted(kinds))})")  # fmt: skip


def _check_llvm(target: dict) -> None:
    """Fill in ``num-cores``; refuse a core count that is not a positive integer and an
    ``mcpu`` LLVM does not know."""
    cores = target.setdefault("num-cores", usable_cores())
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise TargetError(f"target num-cores must be a positive integer, not {cores!r}")
    mcpu = target.get("mcpu")
    if mcpu is None:
        return
    from tensortune.compat import tvm

    triple = target.get("mtriple")
    try:
        known = tvm.target.codegen.llvm_get_cpu_archlist(
            tvm.target.Target({"kind": "llvm", **({"mtriple": triple} if triple else {})})
        )
    except Exception as e:
        raise TargetError(f"TVM rejects target {json.dumps(target)}: {last_line(e)}") from None
    if not isinstance(mcpu, str) or mcpu not in set(known):
        system = tvm.target.codegen.llvm_get_system_cpu()
        examples = [c for c in ("haswell", "skylake-avx512", "znver4", "neoverse-v1") if c in known]
        raise TargetError(f"LLVM does not know mcpu {mcpu!r} (this machine's is {system!r}; it "
                          f"knows {len(known)} others, e.g. {', '.join(examples)})")  # fmt: skip


def target_key(target: dict | object) -> str:
    """Canonical text of a target (a dict or a ``tvm.target.Target``): records are keyed by it.

    TVM fills in defaults (``keys``, ``tag``...), so both a user's short dict and the Target
    MetaSchedule hands back map to the same text.
    """
    from tensortune.compat import tvm

    exported = tvm.target.Target(target).export() if isinstance(target, dict) else target.export()
    return json.dumps(_plain(exported), sort_keys=True)


def stored_target_key(target: str | dict | Platform, known: Iterable[str] = ()) -> str:
    """``target`` as records are keyed by it: a key of ``known`` (the store's) as it is, or
    TVM's canonical text of a target dict or its JSON text where the store holds that (a
    target measured elsewhere, with another ``num-cores`` or an ``mcpu`` this LLVM does not
    know), else the key tuning here would give it (``Platform.key``: a missing ``num-cores``
    is this machine's).  Compared as given, a dict or a short JSON target matched no record
    and a query came back empty."""
    known = set(known)
    if isinstance(target, str) and target in known:
        return target
    if isinstance(target, str | dict) and known:
        try:
            as_given = target_key(target_dict(target))
        except Exception:  # not a target TVM reads: resolve_platform says why, in one line
            as_given = None
        if as_given in known:
            return as_given
    return resolve_platform(target, measurable=False).key


def _plain(value: object) -> object:
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}  # type: ignore[union-attr]
    if isinstance(value, list | tuple) or type(value).__name__ in ("Array", "List"):
        return [_plain(v) for v in value]  # type: ignore[union-attr]
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return str(value)


def simd_bits(target: dict | object) -> int:
    """Width of the SIMD registers code for ``target`` may use: 512 (AVX-512), 256 (AVX),
    128 otherwise; 0 for a target that is not a CPU (LLVM) one."""
    from tensortune.compat import tvm

    t = tvm.target.Target(target) if isinstance(target, dict) else target
    if t.kind.name != "llvm":
        return 0
    has = tvm.target.codegen.llvm_cpu_has_features
    return 512 if has("avx512f", t) else 256 if has("avx", t) else 128


@dataclass(frozen=True)
class Platform:
    """Where programs run: a checked target and the hardware that measures it.

    Entry points resolve one (``resolve_platform``) and hand it down, so the target is parsed,
    validated and turned into TVM's ``Target`` once.
    """

    target: dict
    hardware: Hardware

    @property
    def kind(self) -> str:
        return str(self.target["kind"])

    @cached_property
    def tvm_target(self) -> tvm.target.Target:
        from tensortune.compat import tvm

        return tvm.target.Target(self.target)

    @cached_property
    def key(self) -> str:
        """The target's canonical text (see ``target_key``)."""
        return target_key(self.tvm_target)

    @property
    def threads(self) -> int:
        """Threads the measuring process must run: the target's ``num-cores``.

        ``num-cores`` only shapes the search space; the TVM runtime's thread pool follows
        ``TVM_NUM_THREADS`` read at process start, so the runner sets that from this.
        """
        return int(self.target.get("num-cores") or self.hardware.cores)

    @cached_property
    def simd_bits(self) -> int:
        return simd_bits(self.tvm_target)

    @property
    def device_type(self) -> str:
        """The device its programs run on, as a ``RunnerInput`` names it: "cpu" for LLVM's
        targets, the kind itself ("cuda", "rocm", ...) for the others."""
        return "cpu" if self.kind == "llvm" else self.kind

    def check_measurable(self) -> None:
        """Refuse targets whose programs cannot be timed on this machine."""
        _check_measurable(self.target)

    def check_runs_here(self) -> None:
        """Refuse a target whose code the CPU that times it cannot run: this machine's, or a
        farm's (``check_runs_on``)."""
        check_runs_on(self.target, self.hardware)


# Architecture names that LLVM triples and the kernel spell differently.
_ARCH_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


def _check_measurable(spec: dict) -> None:
    kind = spec.get("kind")
    if kind not in MEASURABLE_KINDS:
        raise TargetError(
            f"target kind {kind!r} cannot be measured here yet: tensortune times candidates on "
            f'this machine\'s CPU (give {{"kind": "llvm", ...}})'
        )
    triple = spec.get("mtriple")
    if isinstance(triple, str) and triple:
        arch = triple.split("-")[0]
        here = host.machine()
        if _ARCH_ALIASES.get(arch, arch) != _ARCH_ALIASES.get(here, here):
            raise TargetError(f"target mtriple {triple!r} is for {arch}: tensortune builds and "
                              f"times candidates on this machine's CPU ({here})")  # fmt: skip


def resolve_platform(
    target: str | dict | Platform | None = None,
    *,
    hardware: Hardware | None = None,
    measurable: bool = True,
) -> Platform:
    """The platform of ``target`` (dict, JSON text, ``None`` for this CPU) on ``hardware``
    (default: this machine).  With ``measurable``, a target this machine cannot time is refused
    before TVM sees it (TVM logs warnings while it fills in a GPU target's defaults)."""
    check_flags(measurable=measurable)
    if isinstance(target, Platform):
        if measurable:
            target.check_measurable()
        return target
    spec = None if target is None else target_dict(target)
    if measurable and spec is not None:
        _check_kind(spec)
        _check_measurable(spec)
    return Platform(parse_target(spec), hardware or current_hardware())
