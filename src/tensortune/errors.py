"""User-facing errors: the CLI prints these as one line and exits non-zero."""

from __future__ import annotations


class TensortuneError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class WorkloadError(TensortuneError):
    """An unknown operator or network, a malformed shape, an unreadable workload file."""


class RecordsError(TensortuneError):
    """The records store cannot be opened, is corrupt, foreign, or cannot be written."""


class TargetError(TensortuneError):
    """A target that is not a JSON object, or that TVM rejects."""


def last_line(e: BaseException) -> str:
    """The line of an exception's text that says what went wrong.

    TVM's errors carry a backtrace first and the cause last; Python's are one line anyway.
    """
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    text = lines[-1] if lines else type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."
