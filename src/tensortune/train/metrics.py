"""Offline cost-model metrics as TenSet defines them (research brief §1.2–1.5), numpy only.

Conventions shared by every function here:

* ``pred``: the model's score, higher = predicted faster.  ``label``: TenSet's
  ``y = best cost of the task / cost`` in [0, 1], 0 for a failed program.
* Per-task metrics take the programs of ONE task (on one hardware); labels are only
  comparable within a task.
* Programs with equal predictions are picked worst-first (lowest label, highest latency).
  TenSet leaves this to ``np.argsort``; fixing it makes results independent of row order and
  gives a model no credit for an order it did not predict (a constant model scores as badly
  as the worst ordering of its ties, not as well as the data happens to be sorted).
* ``k > n`` (fewer programs than picks) means "pick every program": a-peak averages the
  best-so-far curve over the n picks that exist (TenSet's ``metric_peak_score`` does the
  same), recall divides by ``min(k, n)`` so that a perfect model scores 1.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

# TenSet turns a label back into a latency as best / max(y, 1e-5): a failed program (y = 0)
# counts as 1e5 times slower than the task's best, so picking one is costly but finite.
MIN_THROUGHPUT = 1e-5
# TenSet's metric_r_squared calls labels this flat "nothing to explain" and returns 1.
R2_FLAT_TOTAL = 1e-6
# Rows of the pairwise-comparison matrix built at once: bounds memory at n * block booleans
# for the thousands of programs a whole held-out task can have.
_PCA_BLOCK = 1024

Array = NDArray[np.float64]


def _vector(values: ArrayLike, what: str) -> Array:
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional, got shape {v.shape}")
    return v


def _pair(pred: ArrayLike, label: ArrayLike) -> tuple[Array, Array]:
    p, y = _vector(pred, "pred"), _vector(label, "label")
    if len(p) != len(y):
        raise ValueError(f"pred has {len(p)} entries but label has {len(y)}")
    if len(p) == 0:
        raise ValueError("empty task: no programs to score")
    if np.isnan(p).any() or np.isnan(y).any():
        raise ValueError("pred and label must not contain NaN")
    return p, y


def _check_k(k: int) -> None:
    if int(k) != k or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")


def _picks(pred: Array, worst_first: Array) -> NDArray[np.intp]:
    """Indices by decreasing prediction; ties ordered by increasing ``worst_first``."""
    # lexsort's last key is the primary one.
    return np.lexsort((worst_first, -pred))


def ranks_anything(label: ArrayLike) -> bool:
    """Whether a task's PCA measures a model: two programs or more, one of which ran.  A task
    of one program has no pair (its 0.5 says nothing), and one whose programs all failed has
    no order (its pairs all tie at 0, which TenSet's rule credits by row order)."""
    y = np.asarray(label)
    return len(y) > 1 and float(y.max()) > 0


def pairwise_accuracy(pred: ArrayLike, label: ArrayLike) -> float:
    """PCA (§1.4): share of pairs i < j with ``(p_i - p_j > 0) == (y_i - y_j > 0)``.

    Exactly TenSet's rule, including its asymmetry: a tie is "not greater", so a pair with
    equal labels is correct only when ``p_i <= p_j`` (i before j in the given order), and a
    pair with equal predictions only when ``y_i <= y_j``.  One program or none: 0.5.
    """
    p = _vector(pred, "pred")
    y = _vector(label, "label")
    if len(p) != len(y):
        raise ValueError(f"pred has {len(p)} entries but label has {len(y)}")
    n = len(p)
    if n <= 1:
        return 0.5
    if np.isnan(p).any() or np.isnan(y).any():
        raise ValueError("pred and label must not contain NaN")
    correct = 0
    for start in range(0, n - 1, _PCA_BLOCK):
        stop = min(start + _PCA_BLOCK, n - 1)
        # Only columns right of the block can be a j > i; the mask trims the triangle inside.
        cols = slice(start + 1, n)
        p_greater = p[start:stop, None] - p[None, cols] > 0
        y_greater = y[start:stop, None] - y[None, cols] > 0
        agree = p_greater == y_greater
        upper = np.arange(start + 1, n)[None, :] > np.arange(start, stop)[:, None]
        correct += int(np.count_nonzero(agree & upper))
    return correct / (n * (n - 1) / 2)


def average_peak_score(pred: ArrayLike, label: ArrayLike, k: int) -> float:
    """a-peak@k (§1.3): mean over the first k picks of ``best label so far / best label``.

    ``k > n``: the mean runs over the n picks there are (as TenSet's ``metric_peak_score``).
    Every label 0 (all programs failed): NaN. There is no peak to reach, so the task says
    nothing about the model; ``task_weighted`` leaves NaN tasks out (TenSet would divide 0/0).
    """
    curve = best_so_far(pred, label, k)
    return math.nan if curve is None else float(np.mean(curve))


def best_so_far(pred: ArrayLike, label: ArrayLike, k: int) -> Array | None:
    """``best label so far / best label`` after each of the first ``min(k, n)`` picks (ties
    worst first); None when every label is 0."""
    _check_k(k)
    p, y = _pair(pred, label)
    peak = y.max()
    if peak <= 0:
        return None
    return np.maximum.accumulate(y[_picks(p, y)[: min(k, len(y))]]) / peak


def top_k_recall(pred: ArrayLike, label: ArrayLike, k: int) -> float:
    """|top-k by prediction ∩ top-k by label| / k (§1.5), with ``k`` capped at n.

    When labels tie at the k-th place the true top-k set is ambiguous (failures all tie at
    0); a pick then counts if it could belong to it: every pick above the k-th label counts,
    and picks equal to it count up to the number of top-k places that label fills.
    Every label 0 (all programs failed): NaN, as for ``a_peak_at_k`` (any pick would count).
    """
    _check_k(k)
    p, y = _pair(pred, label)
    if y.max() <= 0:
        return math.nan
    k = min(k, len(y))
    chosen = y[_picks(p, y)[:k]]
    kth = np.sort(y)[::-1][k - 1]
    above = int(np.count_nonzero(chosen > kth))
    slots_at_kth = k - int(np.count_nonzero(y > kth))
    at = min(int(np.count_nonzero(chosen == kth)), slots_at_kth)
    return (above + at) / k


def r2(pred: ArrayLike, label: ArrayLike) -> float:
    """Coefficient of determination of ``pred`` against ``label``.

    As TenSet's ``metric_r_squared``: labels whose total sum of squares is below 1e-6
    (e.g. a task whose test programs all failed) give 1.0, whatever the predictions.
    """
    p, y = _pair(pred, label)
    total = float(np.sum(np.square(y - y.mean())))
    if total < R2_FLAT_TOTAL:
        return 1.0
    return 1.0 - float(np.sum(np.square(y - p))) / total


def rmse(pred: ArrayLike, label: ArrayLike) -> float:
    """Root mean squared error of ``pred`` against ``label``."""
    p, y = _pair(pred, label)
    return float(np.sqrt(np.mean(np.square(p - y))))


def task_weighted(
    metric_per_task: Mapping[Any, float], sizes: Mapping[Any, int], *, rms: bool = False
) -> float:
    """Average of per-task values weighted by each task's test-set size (§1.5).

    ``rms=True`` is for RMSE: the square root of the weighted mean of squared values.
    NaN values (a metric undefined on that task) are left out and the weights renormalised
    over the rest; NaN when no task has a value.
    """
    total = weight_sum = 0.0
    for task, value in metric_per_task.items():
        if task not in sizes:
            raise ValueError(f"no test-set size for task {task!r}")
        size = sizes[task]
        if not size > 0:
            raise ValueError(f"task {task!r} has test-set size {size}; sizes must be positive")
        if math.isnan(value):
            continue
        total += size * (value * value if rms else value)
        weight_sum += size
    if weight_sum == 0:
        return math.nan
    mean = total / weight_sum
    return math.sqrt(mean) if rms else mean


class WeightedTask(NamedTuple):
    """One task of a network for ``top_k_score``: occurrences, measured costs, predictions.

    ``costs`` are seconds; ``None``, NaN or ``inf`` mark failed programs.
    """

    weight: float
    costs: ArrayLike
    pred: ArrayLike


def _costs(costs: ArrayLike) -> Array:
    # dtype=float turns None (a failure in the table's cost column) into NaN.
    c = _vector(np.asarray(costs, dtype=object).astype(np.float64), "costs")
    c[np.isnan(c)] = np.inf
    if (c <= 0).any():
        raise ValueError("costs must be positive (None, NaN or inf for failures)")
    return c


def top_k_score(tasks: Iterable[WeightedTask | tuple], k: int) -> float:
    """TenSet's network score@k (§1.2): ``Σ w_t c*_t / Σ w_t min_{i in top-k(t)} c_i``.

    ``c*_t`` is the best cost among the task's given programs, and a pick's latency is
    TenSet's ``c*_t / max(y_i, 1e-5)`` with ``y_i = c*_t / c_i``: a failed pick costs
    ``1e5 · c*_t`` (so a task whose top-k are all failures adds ``1e5 · w_t · c*_t`` to the
    denominator) and successes slower than that are clamped to it too.  A task with no
    successful program has no ``c*_t`` and is left out (TenSet drops such tasks when it
    builds its dataset).  NaN when no task is left.
    """
    _check_k(k)
    best_total = picked_total = 0.0
    for number, task in enumerate(tasks):
        weight, costs, pred = task
        if not (math.isfinite(weight) and weight > 0):
            raise ValueError(f"task {number}: weight must be positive, got {weight!r}")
        c = _costs(costs)
        p = _vector(pred, "pred")
        if len(c) != len(p) or len(c) == 0:
            raise ValueError(f"task {number}: {len(c)} costs but {len(p)} predictions")
        if np.isnan(p).any():
            raise ValueError(f"task {number}: predictions contain NaN")
        ok = np.isfinite(c)
        if not ok.any():
            continue
        best = float(c[ok].min())
        throughput = np.where(ok, best / c, 0.0)
        latency = best / np.maximum(throughput, MIN_THROUGHPUT)
        picked = float(latency[_picks(p, -latency)[:k]].min())
        best_total += weight * best
        picked_total += weight * picked
    if picked_total == 0:
        return math.nan
    return best_total / picked_total


def network_weights(sources: Iterable[Any]) -> dict[str, dict[int, int]]:
    """``{network: {task_id: weight}}`` for ``evaluate`` from ``TaskSource``-like records.

    A workload listed twice in one network (two task names, one structure) runs
    ``w1 + w2`` times there, so the weights add up.
    """
    out: dict[str, dict[int, int]] = defaultdict(dict)
    for s in sources:
        per = out[s.network]
        per[int(s.workload_id)] = per.get(int(s.workload_id), 0) + int(s.weight)
    return dict(out)


def _column(rows: Any, name: str, *, required: bool = True) -> np.ndarray | None:
    try:
        col = rows[name]
    except (KeyError, IndexError, ValueError, TypeError):
        if required:
            raise ValueError(f"the test rows have no {name!r} column") from None
        return None
    # pyarrow and pandas columns convert through to_numpy (nulls become NaN for floats).
    return col.to_numpy() if hasattr(col, "to_numpy") else np.asarray(col)


# What the studies compare models on: ranking within tasks, and what tuning would pick.
RANK_METRICS = ("pca", "top1_score", "top5_score")

METRIC_KEYS = (
    "pca", "top1_score", "top5_score", "a_peak@1", "a_peak@5",
    "top1_recall", "top5_recall", "r2", "rmse", "tasks", "programs",
)  # fmt: skip


def score_predictions(
    test_rows: Any,
    predictions: ArrayLike,
    *,
    networks: Mapping[str, Mapping[int, int]] | None = None,
) -> dict[str, float | int]:
    """Every offline metric of one model on the rows of a test split, in one dict.

    ``test_rows`` maps column names to arrays (a dict of numpy arrays, a pyarrow Table or a
    pandas DataFrame) with at least ``task_id``, ``label`` and ``cost`` (None/NaN = failed);
    ``predictions`` is aligned with its rows.  A task is a ``task_id`` on one hardware: when
    a ``hardware`` column is present its values split tasks apart, because labels and costs
    of different machines do not compare.  Within a task rows keep their given order (PCA's
    tie rule depends on it).

    Keys (``METRIC_KEYS``): task-level metrics (``pca``, ``a_peak@k``, ``topk_recall``,
    ``r2``, ``rmse``) are weighted by test-set size per task (§1.5), PCA over the tasks with
    two test programs or more, one of which ran (``ranks_anything``; NaN when none has);
    ``topk_score`` is TenSet's score@k (§1.2) per network, averaged over networks.
    ``networks`` maps a network to ``{task_id: weight}``; only its tasks present in the test
    rows count, and with a ``hardware`` column each (network, hardware) pair is scored on its
    own.  Networks with no such task, or none with a successful program, are left out of the
    average.  ``networks=None`` makes every task its own network of weight 1.  ``tasks`` and
    ``programs`` count the task groups and rows evaluated.
    """
    task_id = np.asarray(_column(test_rows, "task_id"))
    label = _vector(_column(test_rows, "label"), "label")
    cost = np.asarray(_column(test_rows, "cost"), dtype=object)
    hardware = _column(test_rows, "hardware", required=False)
    n = len(task_id)
    if n == 0:
        raise ValueError("empty test set: there are no rows to evaluate")
    if not (len(label) == len(cost) == n) or (hardware is not None and len(hardware) != n):
        raise ValueError("the test rows' columns have different lengths")
    if np.isnan(label).any():
        raise ValueError("the label column contains NaN")
    pred = _vector(predictions, "predictions")
    if len(pred) != n:
        raise ValueError(f"{len(pred)} predictions for {n} test rows")
    if np.isnan(pred).any():
        raise ValueError(
            f"predictions contain NaN ({int(np.isnan(pred).sum())} of {n}): the model "
            "diverged or was fed missing features"
        )
    cost = _costs(cost)

    # One integer code per (hardware, task) group, then rows sorted stably by group.
    task_values, task_code = np.unique(task_id, return_inverse=True)
    if hardware is None:
        hw_values, hw_code = np.array([None], dtype=object), np.zeros(n, dtype=np.intp)
    else:
        hw_values, hw_code = np.unique(np.asarray(hardware).astype(str), return_inverse=True)
    group_code = hw_code.ravel() * len(task_values) + task_code.ravel()
    order = np.argsort(group_code, kind="stable")
    codes, starts = np.unique(group_code[order], return_index=True)
    bounds = [*starts[1:], n]

    groups: dict[tuple, np.ndarray] = {}
    for code, start, stop in zip(codes, starts, bounds, strict=True):
        hw = hw_values[code // len(task_values)]
        groups[(hw, int(task_values[code % len(task_values)]))] = order[start:stop]

    per_task: dict[str, dict[tuple, float]] = defaultdict(dict)
    sizes = {key: len(idx) for key, idx in groups.items()}
    for key, idx in groups.items():
        p, y = pred[idx], label[idx]
        # a within-task split leaves hundreds of one-program tasks (TenSet keeps no task under
        # 48 programs)
        per_task["pca"][key] = pairwise_accuracy(p, y) if ranks_anything(y) else math.nan
        for k in (1, 5):
            per_task[f"a_peak@{k}"][key] = average_peak_score(p, y, k)
            per_task[f"top{k}_recall"][key] = top_k_recall(p, y, k)
        per_task["r2"][key] = r2(p, y)
        per_task["rmse"][key] = rmse(p, y)

    def weighted(key: tuple) -> WeightedTask:
        return WeightedTask(1.0, cost[groups[key]], pred[groups[key]])

    scored: list[list[WeightedTask]] = []
    if networks is None:
        scored = [[weighted(key)] for key in groups]
    else:
        for weights in networks.values():
            for hw in hw_values:
                members = [
                    weighted((hw, int(t)))._replace(weight=w)
                    for t, w in weights.items()
                    if (hw, int(t)) in groups
                ]
                if members:
                    scored.append(members)
        if not scored:
            raise ValueError(
                f"none of the {len(networks)} networks has a task in the test rows; "
                "pass the networks the test split holds out"
            )

    def network_mean(k: int) -> float:
        values = [s for s in (top_k_score(tasks, k) for tasks in scored) if not math.isnan(s)]
        return float(np.mean(values)) if values else math.nan

    return {
        "pca": task_weighted(per_task["pca"], sizes),
        "top1_score": network_mean(1),
        "top5_score": network_mean(5),
        "a_peak@1": task_weighted(per_task["a_peak@1"], sizes),
        "a_peak@5": task_weighted(per_task["a_peak@5"], sizes),
        "top1_recall": task_weighted(per_task["top1_recall"], sizes),
        "top5_recall": task_weighted(per_task["top5_recall"], sizes),
        "r2": task_weighted(per_task["r2"], sizes),
        "rmse": task_weighted(per_task["rmse"], sizes, rms=True),
        "tasks": len(groups),
        "programs": n,
    }
