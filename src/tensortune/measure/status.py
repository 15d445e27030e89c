"""How a measured candidate ended, from the error texts of its build and run.

MetaSchedule carries only an error string per candidate; our builder and runner start theirs
with a ``[status]`` tag, and TVM's own LocalBuilder/LocalRunner messages are recognised too, so
records from either path are classified the same way.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from enum import Enum


class Status(str, Enum):
    OK = "ok"
    BUILD_ERROR = "build_error"
    RUN_ERROR = "run_error"
    TIMEOUT = "timeout"
    WRONG_RESULT = "wrong_result"


def tagged(status: Status, message: str) -> str:
    return f"[{status.value}] {message}"


def classify(build_error: str | None, run_error: str | None) -> Status:
    """The status of a candidate given its builder's and runner's error messages (None = fine)."""
    for text, default in ((build_error, Status.BUILD_ERROR), (run_error, Status.RUN_ERROR)):
        if not text:
            continue
        for status in Status:
            if text.startswith(f"[{status.value}]"):
                return status
        if "timeout" in text.lower() or "timed out" in text.lower():
            return Status.TIMEOUT
        return default
    return Status.OK


# MetaSchedule's convention for a failed measurement: a run time no sort will ever prefer.
FAILED_COST = 1e10


def run_seconds(run_secs: Iterable[object] | None) -> float:
    """A runner result's latency: the median of its repeats, ``inf`` when it has none, carries
    the failure convention, or holds a time that is not a positive number (a timer that read
    0 measured nothing, and as the task's best it would make every other label 0/cost and
    its own 0/0)."""
    secs = [float(s) for s in run_secs or []]
    fine = secs and all(0 < s < FAILED_COST / 10 for s in secs)  # False for NaN too
    return statistics.median(secs) if fine else math.inf
