"""Pictures of a search benchmark: each method's best latency against time and trials."""

from __future__ import annotations

from pathlib import Path

from tensortune.compare.search_methods import BenchResult


def plot_curves(result: BenchResult, out: str | Path) -> None:
    """Best network latency of each method against wall time and against trials."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_time, by_trials) = plt.subplots(1, 2, figsize=(10, 4.2))
    for name, run in result.runs.items():
        points = [(t, n, lat * 1e3) for t, n, lat in run.curve if lat is not None]
        if not points:
            continue
        by_time.step([p[0] for p in points], [p[2] for p in points], where="post", label=name)
        by_trials.step([p[1] for p in points], [p[2] for p in points], where="post", label=name)
    base = result.runs.get("default")
    for ax, xlabel in ((by_time, "search time (s)"), (by_trials, "trials measured")):
        if base is not None and base.final_latency:
            ax.axhline(base.final_latency * 1e3, color="grey", lw=0.8, ls="--")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("estimated latency (ms): Σ weight × best")
        ax.set_yscale("log")
        ax.legend()
    fig.suptitle(f"{len(result.tasks)} task(s), {result.trials_per_task} trials each")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
