"""Pictures of a cost model on a test set: predicted vs measured, and TenSet-style top-k curves."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_predictions(task_id: np.ndarray, label: np.ndarray, pred: np.ndarray, out: str | Path,
                     title: str = "") -> None:  # fmt: skip
    """Two panels: each program's score against its measured normalised throughput (scores are
    rescaled per task to [0, 1], as only their order within a task matters), and the mean over
    tasks of the best measured label among the top-k predicted programs, for k = 1..32."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    curves = []
    for t in np.unique(task_id):
        m = task_id == t
        p, y = pred[m], label[m]
        span = p.max() - p.min()
        left.scatter(y, (p - p.min()) / span if span > 0 else np.full_like(p, 0.5), s=6,
                     alpha=0.5)  # fmt: skip
        if y.max() > 0:
            best_so_far = np.maximum.accumulate(y[np.argsort(-p, kind="stable")]) / y.max()
            curve = np.ones(32)
            curve[: min(32, len(best_so_far))] = best_so_far[:32]
            curves.append(curve)
    left.set_xlabel("measured: best cost in task / cost")
    left.set_ylabel("predicted score (rescaled per task)")
    left.set_title("predicted vs measured")
    if curves:
        right.plot(np.arange(1, 33), np.mean(curves, axis=0), marker=".")
    right.set_xlabel("k (programs picked by the model)")
    right.set_ylabel("best measured label among top-k (mean over tasks)")
    right.set_ylim(0, 1.02)
    right.set_title("top-k curve")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
