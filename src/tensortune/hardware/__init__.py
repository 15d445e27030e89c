"""What programs run on: the machine's fingerprint, targets resolved into a ``Platform``, and
the named hardware configurations datasets are collected for."""

from tensortune.hardware.configs import (
    CONFIGS,
    HardwareConfig,
    config_of,
    get_config,
    nearest_config,
)
from tensortune.hardware.fingerprint import Hardware, cpuinfo, current_hardware, usable_cores
from tensortune.hardware.target import (
    Platform,
    check_runs_here,
    default_target,
    parse_target,
    resolve_platform,
    simd_bits,
    stored_target_key,
    target_key,
)

__all__ = [
    "CONFIGS",
    "Hardware",
    "HardwareConfig",
    "Platform",
    "check_runs_here",
    "config_of",
    "cpuinfo",
    "current_hardware",
    "default_target",
    "get_config",
    "nearest_config",
    "parse_target",
    "resolve_platform",
    "simd_bits",
    "stored_target_key",
    "target_key",
    "usable_cores",
]
