"""Train/test splits of the dataset's rows (research brief §2.2), as boolean numpy masks.

Each split returns ``(train, test)``, two boolean arrays over the rows, complementary, and
raises ``ValueError("empty ...")`` rather than hand back an empty side.  Columns are the
dataset table's (``task_id``, ``networks``, ``hardware``, ``program_id``): numpy arrays,
lists, or pyarrow / pandas columns.

Dropping small tasks (TenSet's ``min_sample_size = 48``) is the caller's choice: filter the
rows with ``min_records`` first, then split the filtered columns.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

Mask = NDArray[np.bool_]

# Added before flooring ratio * count so that products like 0.7 * 90 = 62.999... floor to
# the intended 63; TenSet's int(ratio * count) agrees for ratio 0.9 on every count.
_FLOOR_EPS = 1e-9


def _array(values: ArrayLike) -> np.ndarray:
    # pyarrow and pandas columns convert through to_numpy.
    return values.to_numpy() if hasattr(values, "to_numpy") else np.asarray(values)


def _ratio(train_ratio: float) -> float:
    if not 0 < train_ratio < 1:
        raise ValueError(f"train_ratio must lie strictly between 0 and 1, got {train_ratio}")
    return float(train_ratio)


def _floor(x: NDArray[np.float64] | float) -> NDArray[np.int64]:
    return np.floor(np.asarray(x) + _FLOOR_EPS).astype(np.int64)


def _split(test: Mask, how: str) -> tuple[Mask, Mask]:
    if len(test) == 0:
        raise ValueError(f"empty dataset: no rows to split {how}")
    if test.all():
        raise ValueError(f"empty train set: every row falls in the test set {how}")
    if not test.any():
        raise ValueError(f"empty test set: no row falls in the test set {how}")
    return ~test, test


def _groups(task_id: ArrayLike, hardware: ArrayLike | None) -> NDArray[np.intp]:
    """One integer per task (per task and hardware when ``hardware`` is given)."""
    _, code = np.unique(_array(task_id), return_inverse=True)
    code = code.ravel()
    if hardware is not None:
        hw = _array(hardware).astype(str)
        if len(hw) != len(code):
            raise ValueError(f"{len(hw)} hardware values for {len(code)} rows")
        _, hw_code = np.unique(hw, return_inverse=True)
        _, code = np.unique(hw_code.ravel() * (code.max() + 1) + code, return_inverse=True)
        code = code.ravel()
    return code


def within_task(
    task_id: ArrayLike,
    program_id: ArrayLike,
    train_ratio: float = 0.9,
    *,
    hardware: ArrayLike | None = None,
) -> tuple[Mask, Mask]:
    """TenSet's default ``within_task`` split: ordered, not random.

    Per task, rows in increasing ``program_id`` (measurement order, TenSet's file order):
    the last ``floor(train_ratio · n)`` train, the first ``n - floor(train_ratio · n)``
    test, as TenSet takes records in reverse file order.  A task with too few rows for
    one training row goes wholly to test.  Pass ``hardware`` to split each (task,
    hardware) pair separately, as TenSet splits each platform's task file.
    """
    ratio = _ratio(train_ratio)
    pid = _array(program_id)
    code = _groups(task_id, hardware)
    if len(pid) != len(code):
        raise ValueError(f"{len(pid)} program ids for {len(code)} rows")
    test = np.zeros(len(code), dtype=bool)
    if len(code):
        order = np.lexsort((pid, code))  # stable: equal ids keep row order
        counts = np.bincount(code)
        starts = np.cumsum(counts) - counts
        sorted_code = code[order]
        rank = np.arange(len(code)) - starts[sorted_code]
        n_test = counts - _floor(ratio * counts)
        test[order] = rank < n_test[sorted_code]
    return _split(test, "within tasks")


def by_task(task_id: ArrayLike, train_ratio: float = 0.9, seed: int = 0) -> tuple[Mask, Mask]:
    """TenSet's ``by_task`` split: whole tasks, in a seeded random order, fill the train set.

    Tasks are taken in the order of a permutation (``numpy.random.default_rng(seed)``) of the
    sorted task ids; a task trains while the running row count, itself included, stays
    within ``floor(train_ratio · rows)``.  The first task past it and all later ones test.
    """
    ratio = _ratio(train_ratio)
    tasks, code, counts = np.unique(_array(task_id), return_inverse=True, return_counts=True)
    code = code.ravel()
    perm = np.random.default_rng(seed).permutation(len(tasks))
    trains = np.zeros(len(tasks), dtype=bool)
    trains[perm] = np.cumsum(counts[perm]) <= _floor(ratio * len(code))
    return _split(~trains[code], f"by task with train_ratio={train_ratio}, seed={seed}")


def _names(held_out: Iterable[str], what: str) -> set[str]:
    if isinstance(held_out, str):
        raise ValueError(f"held_out must be a list of {what} names, not the string {held_out!r}")
    names = set(held_out)
    if not names:
        raise ValueError(f"held_out names no {what}")
    return names


def by_network(
    networks: Sequence[Iterable[str]],
    held_out: Iterable[str],
    *,
    task_id: ArrayLike | None = None,
) -> tuple[Mask, Mask]:
    """Hold out networks: every row of a task of any held-out network tests, the rest train.

    A task shared with a training network still tests, so no held-out task leaks into
    training.  ``networks`` is the per-row list of the task's networks (the same for all
    rows of a task); pass ``task_id`` to enforce that at the task level even if the lists
    disagree between rows.
    """
    held = _names(held_out, "network")
    if hasattr(networks, "to_numpy"):  # a pyarrow / pandas list column
        networks = networks.to_numpy()
    seen: set[str] = set()
    test = np.zeros(len(networks), dtype=bool)
    for row, names in enumerate(networks):
        row_names = set() if names is None else {str(n) for n in names}
        seen |= row_names
        test[row] = not held.isdisjoint(row_names)
    unknown = held - seen
    if unknown:
        raise ValueError(f"unknown network(s) {sorted(unknown)}: no row belongs to them")
    if task_id is not None:
        code = _groups(task_id, None)
        if len(code) != len(test):
            raise ValueError(f"{len(code)} task ids for {len(test)} rows")
        test = np.bincount(code, weights=test)[code] > 0
    return _split(test, f"holding out networks {sorted(held)}")


def by_hardware(hardware: ArrayLike, held_out: Iterable[str]) -> tuple[Mask, Mask]:
    """Hold out hardware: rows measured on a held-out hardware test, the rest train.

    A dataset's hardware names one configuration of a CPU (``avx2-1c@eab22ab1``), and the
    CPU's other configurations train: to hold out a machine, name each of its configurations
    (``bench splits``' by-hardware folds do).
    """
    held = _names(held_out, "hardware")
    hw = _array(hardware).astype(str)
    unknown = held - set(np.unique(hw).tolist())
    if unknown:
        raise ValueError(f"unknown hardware {sorted(unknown)}: no row was measured on it")
    return _split(np.isin(hw, sorted(held)), f"holding out hardware {sorted(held)}")


def min_records(
    task_id: ArrayLike, minimum: int = 48, *, hardware: ArrayLike | None = None
) -> Mask:
    """Rows whose task has at least ``minimum`` rows (TenSet drops smaller tasks).

    Pass ``hardware`` to count per (task, hardware), as TenSet counts per platform file.
    Raises ``ValueError("empty ...")`` when no task is big enough.
    """
    code = _groups(task_id, hardware)
    if len(code) == 0:
        raise ValueError("empty dataset: no rows to filter")
    counts = np.bincount(code)
    keep = counts[code] >= minimum
    if not keep.any():
        raise ValueError(
            f"empty selection: no task has {minimum} rows or more (the largest has {counts.max()})"
        )
    return keep
