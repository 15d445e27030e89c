"""How candidates are timed: TVM's time evaluator's settings, hot or cold.

Without TVM at import: a command builds its ``TimingConfig`` before anything is loaded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tensortune.errors import TensortuneError
from tensortune.measure.worker import Signature

if TYPE_CHECKING:
    from tensortune.hardware import Platform


@dataclass(frozen=True)
class TimingConfig:
    """How each candidate is timed by TVM's time evaluator.

    ``repeat`` timings are kept (all of them are stored; reports use their median).  Each
    timing runs the kernel ``number`` times, raised until one timing lasts ``min_repeat_ms``.
    ``cache_flush`` evicts the arguments from the CPU caches before each timing.
    ``cold_bytes``: a kernel whose arguments after the first (its weights, in a network) take
    more bytes than this is timed cold, one call per timing after evicting them, however
    ``cache_flush`` is set.  Inside a model such weights arrive from memory, not from the
    cache the previous call left them in, and which schedule streams them best changes with
    that (resnet18's 3x3x512x512 convolutions ran 27% faster in the model when tuned cold;
    ``model_timing`` is what tuning uses).  MetaSchedule's RPC runner, which times on a
    farm, applies ``cache_flush`` to every kernel and ignores this.
    A candidate timed while runnable tasks waited for a CPU more than ``max_wait_share`` of
    the time (another process competing with the kernel's threads) is timed again, up to
    ``retries`` times, after a short pause; the clean timing is kept, else the fastest.
    """

    number: int = 1
    repeat: int = 5
    min_repeat_ms: int = 10
    cache_flush: bool = False
    max_wait_share: float = 0.1
    retries: int = 3
    cold_bytes: int | None = None
    cold_repeat: int = 10

    def __post_init__(self) -> None:
        # A repeat of 0 would record every candidate as failed, and count it toward the budget.
        for name, least in (("number", 1), ("repeat", 1), ("min_repeat_ms", 0), ("retries", 0),
                            ("cold_repeat", 1), ("cold_bytes", 0)):  # fmt: skip
            value = getattr(self, name)
            if value is None and name == "cold_bytes":
                continue
            if type(value) is not int or value < least:
                raise TensortuneError(f"TimingConfig.{name} must be a whole number of at least "
                                      f"{least}, not {value!r}", param="timing")  # fmt: skip
        if not isinstance(self.cache_flush, bool):  # bool("no") is True
            raise TensortuneError(f"TimingConfig.cache_flush must be True or False, not "
                                  f"{self.cache_flush!r}", param="timing")  # fmt: skip
        if not 0 <= self.max_wait_share <= 1:
            raise TensortuneError(f"TimingConfig.max_wait_share must be from 0 to 1, not "
                                  f"{self.max_wait_share!r}", param="timing")  # fmt: skip

    def for_signature(self, signature: Signature) -> tuple[int, int, int, bool]:
        """``number``, ``repeat``, ``min_repeat_ms`` and ``cache_flush`` for one kernel."""
        if self.cold_bytes is not None and weight_bytes(signature) > self.cold_bytes:
            return 1, max(self.repeat, self.cold_repeat), 0, True
        return self.number, self.repeat, self.min_repeat_ms, self.cache_flush


def model_timing(platform: Platform) -> TimingConfig:
    """How tuning times candidates unless told otherwise: hot, except kernels whose arguments
    after the first (weights, and outputs too: a large output counts, even with no weight)
    outgrow the L2 caches of the cores they run on (1 MiB a core where the machine does not
    say), which inside a model read and write them in memory."""
    return TimingConfig(cold_bytes=platform.hardware.caches.get("L2", 1 << 20) * platform.threads)


def weight_bytes(signature: Signature) -> int:
    """Bytes of a kernel's arguments after the first: what a cold timing evicts."""
    from tensortune.compat import tvm

    return sum(math.prod(shape) * tvm.DataType(dtype).itemsize for dtype, shape in signature[1:])
