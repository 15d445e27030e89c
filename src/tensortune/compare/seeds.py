"""A benchmark run once per seed, and what the seeds say together: single runs of a search
spread widely (on resnet50 MetaSchedule's own final latency doubled between two seeds)."""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Sequence
from pathlib import Path

from tensortune.compare.plots import plot_curves
from tensortune.compare.search_methods import BenchResult, bench_tune
from tensortune.errors import TensortuneError, check_seed, check_writable
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
    if isinstance(seeds, int):
        raise TensortuneError(f"a list of seeds, e.g. [0, 1, 2], not {seeds!r}", param="seeds")
    if not seeds:
        raise TensortuneError("give at least one seed", param="seeds")
    for s in seeds:
        check_seed(s)
    check_writable(plot, "plot")  # before the runs (minutes each), not after the first
    seeds = list(dict.fromkeys(seeds))  # a seed given twice would count as two runs of one
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


# How close to the default's final latency counts as reaching it, besides exactly: a search
# that ends 0.1% above it has not failed, and single runs fall off that cliff either way.
TOLERANCES = (0.01, 0.03)


def within_key(tolerance: float) -> str:
    """The summary's key for the speedup to come within ``tolerance`` of the default."""
    return f"speedup_within_{round(tolerance * 100)}pct"


def summarize_seeds(results: Sequence[BenchResult]) -> dict:
    """Per method, the speedup and trial ratio of every seed and their medians; how many seeds
    reached the default's final latency; and the speedup to come within 1% and 3% of it, per
    seed and as mean ± standard error over the seeds.  Where every seed's curves were re-timed
    side by side (``compare.retime``), all of these again on those: ``retimed_speedup``,
    ``retimed_trial_ratio``, ``retimed_speedup_within_1pct``, ...

    A seed where the method never got there is ``None`` in the per-seed lists and counts as 0
    in the median and the mean (slower than any speedup).  The median is ``None`` unless more
    than half the seeds got there: otherwise it would be 0 or, over an even number of seeds,
    half a speedup that no seed had.  Only methods every seed ran are summarised: a method
    saved in some seeds' directories by an earlier run would be judged on those alone."""
    out: dict[str, dict] = {}
    every = [m for m in dict.fromkeys(m for r in results for m in r.runs)
             if all(m in r.runs for r in results)]  # fmt: skip
    within = {within_key(t): t for t in TOLERANCES}
    keys: list[tuple[str, float | None, bool]] = [
        ("speedup", 0.0, False), ("trial_ratio", None, False),
        *((k, t, False) for k, t in within.items())]  # fmt: skip
    if results and all(r.retimed for r in results):  # the same, on the re-timed curves
        keys += [(f"retimed_{k}", t, True) for k, t, _ in keys]
    for key, tolerance, retimed in keys:
        per_method: dict[str, list[float | None]] = {}
        for r in results:
            values = (r.trials_over_default(retimed) if tolerance is None
                      else r.speedup_within(tolerance, retimed=retimed))  # fmt: skip
            for method in every:  # one value a seed: None where the default set no goal
                per_method.setdefault(method, []).append(values.get(method))
        out[key] = {m: _spread(v) for m, v in per_method.items()}
    out["final_latency"] = {m: [r.runs[m].final_latency for r in results] for m in every}
    out["seeds"] = [r.seed for r in results]
    return out


def _spread(per_seed: list[float | None]) -> dict:
    """Per-seed values with their median (``None`` unless more than half got a value: then the
    middle ones are all real values), mean, standard error of the mean and how many seeds
    got a value (unreached seeds count as 0)."""
    values = [x or 0.0 for x in per_seed]
    reached = sum(x is not None for x in per_seed)
    sem = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None
    return {"seeds": per_seed,
            "median": statistics.median(values) if 2 * reached > len(values) else None,
            "mean": statistics.fmean(values), "sem": sem, "reached": reached}  # fmt: skip
