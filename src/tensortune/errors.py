"""User-facing errors: the CLI prints these as one line and exits with status 2.

An error about one argument of a public function names it (``param``), so that the command
line can name its option instead (``--cost-model``, not ``cost_model``).
"""

from __future__ import annotations

import math
import numbers
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


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


class NoStoreError(RecordsError):
    """A reader was pointed at a store not made yet: a SQLite file that does not exist, or a
    PostgreSQL database without the tables (none is created)."""


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


def check_seed(seed: object, param: str = "seed") -> int:
    """A random seed as the libraries take one (NumPy's generators refuse a negative one)."""
    if type(seed) is not int or not 0 <= seed < 2**63:
        raise TensortuneError(f"must be a whole number from 0 to 2**63 - 1, not {seed!r}",
                              param=param)  # fmt: skip
    return seed


def check_count(value: object, param: str, least: int = 1) -> int:
    """A count (rounds, repeats, ...): a whole number of at least ``least`` (a Python int, as
    every count the API takes: a NumPy one is refused too, in one line)."""
    if type(value) is not int or value < least:
        raise TensortuneError(f"must be a whole number of at least {least}, not {value!r}",
                              param=param)  # fmt: skip
    return value


def check_seconds(value: object, param: str) -> float:
    """A time limit: a positive finite number of seconds (a bool is no number; NaN never
    elapses, and 0 times everything out)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
        raise TensortuneError(f"must be a positive number of seconds, not {value!r}",
                              param=param)  # fmt: skip
    return float(value)


def check_flags(**flags: object) -> None:
    """On/off arguments: Python's True or False only, as counts are Python ints.  ``bool("no")``
    is True, so a string or a number taken for a flag would silently switch a setting on."""
    for param, value in flags.items():
        if not isinstance(value, bool):
            raise TensortuneError(f"must be True or False, not {value!r}", param=param)


def check_writable(path: str | os.PathLike | None, param: str, *, directory: bool = False,
                   parents: bool = False) -> None:  # fmt: skip
    """Refuse, before the work that ends in writing it, an output that cannot be written: a
    file that is a directory, or whose directory is missing (unless the writer makes it:
    ``parents``) or read-only; a directory (``directory``, made with its parents) in place of
    which or above which a file stands.  None: nothing to write."""
    if path is None:
        return
    target = Path(path)
    if not directory and target.is_dir():
        raise TensortuneError(f"{target} is a directory, not a file", param=param)
    existing = target if directory else target.parent
    if not (directory or parents) and not existing.is_dir():
        raise TensortuneError(f"cannot write {target}: no directory {existing}", param=param)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # the directories in between are made by the writer
    if not existing.is_dir():
        raise TensortuneError(f"{existing} is not a directory", param=param)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise TensortuneError(f"{existing} cannot be written", param=param)


# Ctrl-C during a run.  A KeyboardInterrupt raised inside a Python callback that TVM called
# (a search strategy's, a builder's) comes back as a bare RuntimeError, or, raised through
# nested callbacks, ends the process in std::terminate.  So a run that goes through TVM's
# search loop takes a first Ctrl-C as a request (``interruptible(graceful=True)``): its
# strategies see ``interrupted()`` and hand out no more candidates, the batch in flight is
# measured and recorded, and the run ends with KeyboardInterrupt; a second Ctrl-C interrupts
# at once.
_interrupted = threading.Event()
_active: Callable[[int, object], None] | None = None  # the innermost interruptible's handler
# Set in a thread other than the main one while it runs an ``interruptible`` block: Ctrl-C
# goes to the main thread's work, and a tune running in the background (a notebook's thread)
# used to end its searches early, quietly, when the main thread's call was interrupted.
_detached = threading.local()


def interrupted() -> bool:
    """Whether Ctrl-C (SIGINT) arrived inside the innermost ``interruptible`` block (never,
    for work a thread other than the main one runs in a block of its own)."""
    return _interrupted.is_set() and not getattr(_detached, "on", False)


@contextmanager
def interruptible(*, graceful: bool = False) -> Iterator[None]:
    """Within: SIGINT is remembered (``interrupted()``) as well as handled as before, and an
    error that ends the block after it is raised as the ``KeyboardInterrupt`` it was.
    ``graceful``: the first SIGINT is only remembered, and the block raises KeyboardInterrupt
    when it ends."""
    global _active
    if threading.current_thread() is not threading.main_thread():
        # signal handlers belong to the main thread, and so does its Ctrl-C
        outer_detached, _detached.on = getattr(_detached, "on", False), True
        try:
            yield
        finally:
            _detached.on = outer_detached
        return
    previous = signal.getsignal(signal.SIGINT)
    outer = _active

    def remember(signum: int, frame: object) -> None:
        if graceful and not _interrupted.is_set():
            _interrupted.set()
            sys.stderr.write("\nstopping after the batch in flight (Ctrl-C again: at once)\n")
            return
        _interrupted.set()
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN or signum != signal.SIGINT:
            raise KeyboardInterrupt

    _interrupted.clear()
    _active = remember
    # SIGINT ignored (nohup, a shell's background job) stays ignored: a Ctrl-C meant for the
    # terminal's foreground command must not stop this one.  Signals forwarded as Ctrl-C
    # (``interrupt``: SIGTERM, SIGHUP) still stop it gracefully.
    if previous != signal.SIG_IGN:
        signal.signal(signal.SIGINT, remember)
    try:
        yield
    except Exception:
        if _interrupted.is_set():
            raise KeyboardInterrupt from None
        raise
    else:
        if _interrupted.is_set():
            raise KeyboardInterrupt
    finally:
        signal.signal(signal.SIGINT, previous)
        _active = outer
        _interrupted.clear()  # a later error outside the block is what it says it is


def interrupt(signum: int, frame: object) -> None:
    """Handle a signal as Ctrl-C is handled now (SIGTERM and SIGHUP are, on the command line):
    by the innermost ``interruptible`` block, also where SIGINT itself is ignored; else by
    SIGINT's handler; else by raising KeyboardInterrupt."""
    if _active is not None:
        _active(signum, frame)
        return
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signum, frame)
    else:
        raise KeyboardInterrupt
