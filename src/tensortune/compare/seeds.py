"""A benchmark run once per seed, and what the seeds say together: single runs of a search
spread widely (on resnet50 MetaSchedule's own final latency doubled between two seeds)."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from pathlib import Path

from tensortune.compare.plots import plot_curves
from tensortune.compare.search_methods import BenchResult, bench_tune
from tensortune.errors import TensortuneError
from tensortune.workloads.task import Task


def bench_seeds(
    workloads: Sequence[str | Task] | None = None,
    *,
    seeds: Sequence[int],
    work_dir: str | os.PathLike,
    plot: str | os.PathLike | None = None,
    **options: object,
) -> list[BenchResult]:
    """``bench_tune`` once per seed, each in ``work_dir/seed-N`` (a single seed in ``work_dir``
    itself); with ``plot``, each seed's curves go to ``plot`` (several seeds:
    ``STEM-seedN.SUFFIX``).  ``summarize_seeds`` gives the medians."""
    if not seeds:
        raise TensortuneError("give at least one seed", param="seeds")
    results = []
    for s in seeds:
        where = Path(work_dir) if len(seeds) == 1 else Path(work_dir) / f"seed-{s}"
        result = bench_tune(workloads, work_dir=where, seed=s, **options)  # type: ignore[arg-type]
        if plot is not None:
            path = Path(plot)
            plot_curves(result, path if len(seeds) == 1 else seed_plot(path, s))
        results.append(result)
    return results


def seed_plot(path: Path, seed: int) -> Path:
    """Where ``bench_seeds`` draws one seed's curves when it runs several."""
    return path.with_name(f"{path.stem}-seed{seed}{path.suffix}")


def summarize_seeds(results: Sequence[BenchResult]) -> dict:
    """Per method, the speedup and trial ratio of every seed and their medians.

    A seed where the method never reached the default's final latency is ``None`` in the
    per-seed list and counts as 0 in the median (slower than any speedup); a median of 0 is
    reported as ``None``: most seeds never got there."""
    out: dict[str, dict] = {}
    for key in ("speedup", "trial_ratio"):
        per_method: dict[str, list[float | None]] = {}
        for r in results:
            for method, value in getattr(r, key).items():
                per_method.setdefault(method, []).append(value)
        out[key] = {m: {"seeds": v, "median": statistics.median(x or 0.0 for x in v) or None}
                    for m, v in per_method.items()}  # fmt: skip
    out["final_latency"] = {
        m: [r.runs[m].final_latency for r in results if m in r.runs]
        for m in dict.fromkeys(m for r in results for m in r.runs)
    }
    out["seeds"] = [r.seed for r in results]
    return out
