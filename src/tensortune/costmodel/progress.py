"""How far a model's training has got, for whoever asked (a progress bar).

Training loops call ``report(done, total)``; ``training_progress(callback)`` makes the callback
hear it for the code run inside.  Models keep no reference to it: it is not their state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_listener: ContextVar[Callable[[int, int], None] | None] = ContextVar("listener", default=None)


@contextmanager
def training_progress(callback: Callable[[int, int], None]) -> Iterator[None]:
    """``callback(done, total)`` hears the training steps (rounds, epochs) run inside."""
    token = _listener.set(callback)
    try:
        yield
    finally:
        _listener.reset(token)


def report(done: int, total: int) -> None:
    """A training loop finished ``done`` of its ``total`` steps."""
    listener = _listener.get()
    if listener is not None:
        listener(done, total)
