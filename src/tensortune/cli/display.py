"""How the command line shows things: its consoles and number formats, kept apart from the
commands.  Tables keep names on one line (they are shortened with an ellipsis instead), so a
row never wraps in a terminal of 100 columns."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Column, Table

from tensortune.files import strict_json

# No markup: task names, file names and op docs contain brackets that Rich would eat.
console = Console(highlight=False, markup=False)
errors = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)


def print_json(value: object) -> None:
    """``value`` as one line of strict JSON on stdout (``files.strict_json``)."""
    print(strict_json(value))


def fmt_seconds(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    if s < 1e-6:  # a kernel of a few elements: "0.0 µs" said nothing
        return f"{s * 1e9:.1f} ns"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def fmt_duration(s: float) -> str:
    """``1h05m``, ``12m30s``, ``45s``: a wall-clock span, as --time takes it."""
    s = max(0, round(s))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m"
    return f"{m}m{sec:02d}s" if m else f"{sec}s"


def fmt_gflops(g: float | None) -> str:
    return "-" if g is None else f"{g:.1f}"


def fmt_metric(value: object, spec: str) -> str:
    """A metric's cell: a float in ``spec``, ``n/a`` for NaN (PCA of tasks with one test
    program each: no pair), anything else as it is (a count, a file name)."""
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else format(value, spec)
    return str(value)


def fmt_ratio(x: float | None) -> str:
    if x is None:
        return "not reached"
    # near 1, a third decimal says which side of it a ratio lies (0.996 is no 1.00x)
    return f"{x:.3f}x" if x != 1 and abs(x - 1) < 0.005 else f"{x:.2f}x"


# A name column keeps at least this many characters before it is shortened.
_NAME_WIDTH = 32


def table(title: str | None, columns: dict[str, str], *, caption: str | None = None) -> Table:
    """A table whose columns are ``{name: "left" | "right"}``: numbers are right-justified,
    text left; no cell wraps (text is shortened with an ellipsis).  Print it with
    ``print_table``."""
    t = Table(title=title, caption=caption)
    for name, justify in columns.items():
        t.add_column(name, justify=justify, no_wrap=True, overflow="ellipsis")  # type: ignore[arg-type]
    return t


def print_table(t: Table, *, keep_tail: tuple[str, ...] = ()) -> None:
    """Print a ``table`` within the console's width: numbers keep all their digits, the first
    column (the row's name) keeps up to ``_NAME_WIDTH`` characters, and the other text columns
    share what is left (a cell longer than its column is shortened with an ellipsis).  The
    columns named in ``keep_tail`` lose their cells' start instead: the end is what tells
    those apart (a kernel class's key)."""
    columns = t.columns
    widest = [max([len(str(c.header)), *(len(str(x)) for x in c.cells)]) for c in columns]
    room = console.width - (3 * len(columns) + 1)  # each column's padding and border
    width = [w if c.justify == "right" else 0 for c, w in zip(columns, widest, strict=True)]
    width[0] = min(widest[0], _NAME_WIDTH) if columns[0].justify != "right" else widest[0]
    flexible = [i for i, c in enumerate(columns) if i > 0 and c.justify != "right"]
    left = room - sum(width)
    while flexible and left > 0:  # fill the narrowest wishes first, evenly
        share = left // len(flexible)
        if share == 0:
            break
        for i in sorted(flexible, key=lambda i: widest[i]):
            give = min(widest[i] - width[i], share)
            width[i] += give
            left -= give
        flexible = [i for i in flexible if width[i] < widest[i]]
    width[0] += max(0, min(widest[0] - width[0], left))
    if sum(width) <= room:
        for column, w in zip(columns, width, strict=True):
            column.width = max(w, 1)
            if column.header in keep_tail:
                _shorten_start(column, max(w, 1))
    caption, t.caption = t.caption, None  # a line of its own, not wrapped to the table's width
    console.print(t)
    if caption:
        console.print(caption)


def _shorten_start(column: Column, width: int) -> None:
    # Rich only cuts a cell's end and has no public way to change a cell once added: the cells
    # that would be cut are rewritten in Column's own (private) list.
    cells = column._cells
    for i, cell in enumerate(cells):
        if isinstance(cell, str) and len(cell) > width:
            cells[i] = "…" + cell[len(cell) - width + 1 :] if width > 1 else "…"
