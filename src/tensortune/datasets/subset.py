"""A dataset of some of another's rows: what ``dataset select``, ``dataset prune`` and
``dataset recheck`` write.  Its own module because it carries both the table (``build``) and
the lowered-loop features beside it (``lowered``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tensortune.datasets.build import (
    FEATURE_WIDTHS,
    WORKLOADS,
    Card,
    check_out_dir,
    load_table,
    read_card,
    write_dataset,
)
from tensortune.datasets.lowered import lowered_of

# Columns a subset copies without reading them: features and traces.
_COPIED_AS_IS = ("trace", *FEATURE_WIDTHS)


def write_subset(dataset: str | Path, rows: np.ndarray, out_dir: str | Path, *,
                 description: str, extra: dict | None = None,
                 costs: dict[int, list[float]] | None = None,
                 overwrite: bool = False) -> Card:  # fmt: skip
    """A dataset of some rows of ``dataset``.  Labels are recomputed against the best program
    kept of each task: what a learner that measured only these would know.  ``costs`` gives
    some rows new timing repeats (row index -> seconds), their cost the median.  The kept
    programs' lowered-loop features come along when ``dataset`` has them, and the card's
    held-out networks (``extra`` may name others).  A dataset already in ``out_dir`` is
    replaced only with ``overwrite``."""
    import pyarrow as pa

    check_out_dir(out_dir, overwrite=overwrite)
    directory = Path(dataset)
    card = read_card(directory).data
    table = load_table(directory)
    rows = np.asarray(rows, dtype=int)
    # The features and traces go from table to table as Arrow data: made Python objects, a
    # dataset of 29,000 programs took seconds and gigabytes.
    heavy = [n for n in table.column_names if n in _COPIED_AS_IS]
    kept: dict = {n: table.column(n).take(pa.array(rows)) for n in heavy}
    columns = {n: table.column(n).to_pylist() for n in table.column_names if n not in heavy}
    for i, secs in (costs or {}).items():
        columns["run_secs"][i] = list(secs)
        columns["cost"][i] = float(np.median(secs))
    kept.update({k: [v[i] for i in rows] for k, v in columns.items()})
    best: dict[tuple, float] = {}
    for t, h, c in zip(kept["task_id"], kept["hardware"], kept["cost"], strict=True):
        if c is not None:
            best[(t, h)] = min(c, best.get((t, h), c))
    kept["label"] = [0.0 if c is None else best[(t, h)] / c
                     for t, h, c in zip(kept["task_id"], kept["hardware"], kept["cost"],
                                        strict=True)]  # fmt: skip
    tasks = set(kept["task_id"])
    modules = load_table(directory, table=WORKLOADS).to_pydict()
    keep_mod = [i for i, t in enumerate(modules["task_id"]) if t in tasks]
    modules = {k: [v[i] for i in keep_mod] for k, v in modules.items()}
    # The networks a dataset is scored on stay named: a study or selection of the subset
    # must keep away from them as it would from the source's.
    carried = ({"held_out": card["held_out"]} if card.get("held_out") else {}) | (extra or {})
    return write_dataset(out_dir, kept, modules, description=description,
                         task_weights=card.get("task_weights") or {},
                         hardware=card["hardware"], extra=carried or None,
                         overwrite=overwrite,
                         lowered=lowered_of(directory, kept["program_id"]))  # fmt: skip
