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
