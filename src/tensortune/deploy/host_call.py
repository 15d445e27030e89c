"""A built model's ``main`` called on host arrays, as the artifact and the torch.compile backend
call it on every inference.

Inputs are copied into TVM tensors allocated once: allocating them per call faulted their pages
in every time (mobilenetv2's 0.6 MB image cost 4-5% of a 2.5 ms call on an AMD Zen 5), and
host arrays are rarely aligned as TVM needs to take them without a copy. Calls from several
threads take turns: the virtual machine and the staged inputs are one per model.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from tensortune.hardware.fingerprint import affinity_kept


class HostCall:
    """``call(arrays)``: ``vm["main"]`` on NumPy arrays of ``shapes``/``dtypes``, its outputs
    as a flat list of NumPy arrays."""

    def __init__(self, vm: Any, shapes: Sequence[tuple[int, ...]], dtypes: Sequence[str]) -> None:
        self._main = vm["main"]
        self._specs = list(zip(shapes, dtypes, strict=True))
        self._staged: list[Any] | None = None  # allocated on the first call, in its thread
        self._lock = threading.Lock()

    def __call__(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        from tensortune.compat import tvm
        from tensortune.measure.executable import as_arrays

        with self._lock:
            if self._staged is None:
                dev = tvm.cpu()
                self._staged = [tvm.runtime.empty(s, d, dev) for s, d in self._specs]
            for staged, x in zip(self._staged, arrays, strict=True):
                staged.copyfrom(np.asarray(x, order="C"))  # a scalar stays 0-d
            with affinity_kept():  # TVM's pool pins the calling thread to one core
                return as_arrays(self._main(*self._staged))
