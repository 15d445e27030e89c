"""Timing a compiled whole model (a Relax executable's ``main``) in the process that runs it.

The measurement worker calls this with TVM's thread pool sized by ``TVM_NUM_THREADS``, which
TVM reads once per process (see ``tensortune.deploy.compile``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

_TIMING_BUDGET_S = 30.0  # per build: an untuned BERT-base runs for over a minute per call
MIN_REPEAT_S = 0.05  # the least a timing repeats a call for (a fast model: many calls each)


def as_arrays(value) -> list[np.ndarray]:
    """A Relax function's result (a tensor, or nested tuples of them) as a flat list."""
    if hasattr(value, "numpy"):
        return [value.numpy()]
    return [a for v in value for a in as_arrays(v)]


def time_vm(vm, inputs: list, repeat: int) -> tuple[list[np.ndarray], float]:
    """Outputs and median latency of ``vm["main"]``; a build too slow for ``repeat`` timings
    within the budget gets fewer (at least one after the first call, which pays one-off
    initialisation)."""
    from tensortune.compat import tvm

    dev = tvm.cpu()
    main = vm["main"]
    start = time.perf_counter()
    out = as_arrays(main(*inputs))
    dev.sync()
    first = time.perf_counter() - start
    # Each timing loops for at least MIN_REPEAT_S, however fast a call is.
    repeat = timing_repeats(max(first, MIN_REPEAT_S), repeat)
    if first >= MIN_REPEAT_S:
        # A call this long is a timing of its own, and the first call was the warm-up: TVM's
        # time evaluator would make one more call before timing (1.1 s for an untuned
        # gpt2-block, over a minute for an untuned BERT-base).
        def call() -> None:
            main(*inputs)
            dev.sync()

        return out, statistics.median(seconds_per_call(call) for _ in range(repeat))
    timer = vm.time_evaluator("main", dev, number=1, repeat=repeat,
                              min_repeat_ms=int(MIN_REPEAT_S * 1000))  # fmt: skip
    return out, float(timer(*inputs).median)


def seconds_per_call(call: Callable[[], object], at_least: float = MIN_REPEAT_S) -> float:
    """Seconds per call of ``call``, looping for at least ``at_least`` seconds."""
    calls, start = 0, time.perf_counter()
    while calls == 0 or time.perf_counter() - start < at_least:
        call()
        calls += 1
    return (time.perf_counter() - start) / calls


def timing_repeats(first_call_s: float, repeat: int, budget_s: float = _TIMING_BUDGET_S) -> int:
    """How many timings fit the budget, judged by the first call; at least one."""
    return max(1, min(repeat, int(budget_s / max(first_call_s, 1e-9))))
