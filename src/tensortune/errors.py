"""User-facing errors: the CLI prints these as one line and exits with status 2.

An error about one argument of a public function names it (``param``), so that the command
line can name its option instead (``--cost-model``, not ``cost_model``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class TensortuneError(Exception):
    """A problem with the user's input or environment, explained in one line."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def __str__(self) -> str:
        return self.message if self.param is None else f"{self.param}: {self.message}"


class WorkloadError(TensortuneError):
    """An unknown operator or network, a malformed shape, an unreadable workload file."""


class RecordsError(TensortuneError):
    """The records store cannot be opened, is corrupt, foreign, or cannot be written."""


class TargetError(TensortuneError):
    """A target that is not a JSON object, or that TVM rejects."""


@contextmanager
def about(param: str) -> Iterator[None]:
    """Errors raised inside are about the value given for ``param``: they say so."""
    try:
        yield
    except TensortuneError as e:
        if e.param is None:
            e.param = param
        raise


def last_line(e: BaseException) -> str:
    """The line of an exception's text that says what went wrong.

    TVM's errors carry a backtrace first and the cause last; Python's are one line anyway.
    """
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    text = lines[-1] if lines else type(e).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def shown(value: object, limit: int = 40) -> str:
    """A value read from a file, fit for a one-line message: as it is when it is printable
    text, else quoted with its line breaks and control characters escaped; cut to ``limit``."""
    text = str(value)
    if not text.isprintable():
        text = repr(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."
