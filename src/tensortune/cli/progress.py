"""Progress of long jobs: a bar with its ETA in a terminal, plain lines anywhere else.

Piped or captured output (CI logs, ``| tee``) gets the same information as one line per step,
with no escape codes.  Lines printed while a bar runs appear above it.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class Reporter:
    """``with Reporter(console) as r:`` then ``r.bar(...)``, ``r.advance(...)``, ``r.line(...)``;
    ``quiet`` drops the lines and the bars (e.g. for ``--json``)."""

    def __init__(self, console: Console, *, quiet: bool = False) -> None:
        self.console = console
        self.quiet = quiet
        self.live = console.is_terminal and not quiet
        self._progress: Progress | None = None

    def __enter__(self) -> Reporter:
        if self.live:
            self._progress = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("ETA"),
                TimeRemainingColumn(), console=self.console, transient=True,
            )  # fmt: skip
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def bar(self, description: str, total: float | None, completed: float = 0) -> TaskID | None:
        """A new bar (``total`` None: no end known yet); None when there are no bars."""
        if self._progress is None:
            return None
        return self._progress.add_task(description, total=total, completed=completed)

    def update(self, bar: TaskID | None, *, advance: float = 0, completed: float | None = None,
               total: float | None = None, description: str | None = None) -> None:  # fmt: skip
        if self._progress is None or bar is None:
            return
        fields: dict = {"advance": advance}
        if completed is not None:
            fields["completed"] = completed
        if total is not None:
            fields["total"] = total
        if description is not None:
            fields["description"] = description
        self._progress.update(bar, **fields)

    def line(self, text: str) -> None:
        if not self.quiet:
            self.console.print(text)
