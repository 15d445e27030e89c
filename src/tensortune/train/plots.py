"""Pictures of a cost model on a test set: predicted vs measured, and TenSet-style top-k curves."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def task_groups(task_id: np.ndarray, hardware: np.ndarray | None = None) -> list[np.ndarray]:
    """Row indices of each task: a ``task_id`` on one ``hardware`` (when given), as in
    ``metrics``: scores and labels only compare within one machine.  One sort, not a pass
    over the rows per task."""
    task = np.asarray(task_id).astype(str)
    where = np.zeros(len(task), dtype=str) if hardware is None else np.asarray(hardware, str)
    if not len(task):
        return []
    _, code = np.unique(np.stack([task, where], axis=1), axis=0, return_inverse=True)
    code = code.ravel()
    order = np.argsort(code, kind="stable")
    return np.split(order, np.cumsum(np.bincount(code))[:-1])


def top_k_curve(task_id: np.ndarray, label: np.ndarray, pred: np.ndarray,
                hardware: np.ndarray | None = None, k: int = 32) -> np.ndarray | None:  # fmt: skip
    """Mean over tasks of the best measured label among the top-j predicted programs, for
    j = 1..k (tied scores picked worst first, as in ``metrics``); None when no task has a
    successful program."""
    return _curve(task_groups(task_id, hardware), label, pred, k)


def _curve(groups: list[np.ndarray], label: np.ndarray, pred: np.ndarray,
           k: int) -> np.ndarray | None:  # fmt: skip
    from tensortune.train.metrics import best_so_far

    curves = []
    for group in groups:
        best = best_so_far(pred[group], label[group], k)
        if best is not None:
            curve = np.ones(k)  # after a task's last program, its best has been picked
            curve[: len(best)] = best
            curves.append(curve)
    return np.mean(curves, axis=0) if curves else None


def plot_predictions(task_id: np.ndarray, label: np.ndarray, pred: np.ndarray, out: str | Path,
                     title: str = "", hardware: np.ndarray | None = None) -> None:  # fmt: skip
    """Two panels: each program's score against its measured normalised throughput (scores are
    rescaled per task to [0, 1], as only their order within a task matters), and
    ``top_k_curve`` for k = 1..32."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    groups = task_groups(task_id, hardware)
    for group in groups:
        p, y = pred[group], label[group]
        span = p.max() - p.min()
        left.scatter(y, (p - p.min()) / span if span > 0 else np.full_like(p, 0.5), s=6,
                     alpha=0.5)  # fmt: skip
    left.set_xlabel("measured: best cost in task / cost")
    left.set_ylabel("predicted score (rescaled per task)")
    left.set_title("predicted vs measured")
    curve = _curve(groups, label, pred, 32)
    if curve is not None:
        right.plot(np.arange(1, len(curve) + 1), curve, marker=".")
    right.set_xlabel("k (programs picked by the model)")
    right.set_ylabel("best measured label among top-k (mean over tasks)")
    right.set_ylim(0, 1.02)
    right.set_title("top-k curve")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
