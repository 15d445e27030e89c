"""``bench transfer``: transfer-tuning against tuning, per (target network ← source network).

For each pair, in one run on one machine:

1. the source network is tuned into its own store (once per source; resumed on a rerun);
2. **transfer**: the target's kernels take the source's schedules (``tensortune.transfer``);
   its search time is the wall time of replaying, building and timing them;
3. **full tuning**: the target is tuned cold with the project's recommended search for
   ``trials`` measurements;
4. **warm start**: the same tuning seeded with the source's schedules (``tune(warm_start=)``);
5. the untuned, transferred and fully tuned builds are timed end to end (``compile_model``:
   each build against the untuned build of the same call, so each speedup is a ratio taken
   side by side).

Metrics (``../shared/research/algorithms.md`` §1.6 and §1.7):

- fraction of the maximum speedup = (S_transfer − 1) / (S_full − 1), S_X = T_untuned / T_X,
  the maximum being what full tuning reached at this budget (Gibson & Cano's Fig. 5 metric);
- the time full tuning needs to match transfer: the first moment its estimated latency
  (Σ weight × each kernel's best standalone time so far, a kernel not yet measured counted at
  its untuned time) is at most the transfer's estimate by the same sum (unknown where a kernel
  has no program timed, as full tuning's sum is infinite until it has one).  The paper
  compiled the network every minute instead; the sum is what MetaSchedule's scheduler itself
  optimizes, and it costs nothing to evaluate at every record;
- warm start's time to reach full tuning's final estimate, against full tuning's own time.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tensortune.errors import TensortuneError, about
from tensortune.files import move_aside, strict_json, write_atomically
from tensortune.hardware import Platform, resolve_platform
from tensortune.records import open_records
from tensortune.records.schema import origin_kind
from tensortune.records.sqlite import store_files

# Kept in each finished pair's JSON with the settings: a rerun reuses a pair saved with the same
# ones.  Bump when the protocol changes what a pair's figures mean.
PAIR_VERSION = 1

# (target, source): the pairs of the issue, one per kind of transfer.
DEFAULT_PAIRS = (
    ("resnet18", "resnet50"),
    ("mobilenetv2", "resnet50"),
    ("bert-base-s64", "bert-layer"),
    ("gpt2-block", "bert-layer"),
    ("vit-tiny", "bert-layer"),
)


@dataclass
class PairResult:
    target: str
    source: str
    tasks: int
    trials: int
    per_kernel: int
    untuned_e2e: float
    transfer_e2e: float
    full_e2e: float
    transfer_speedup: float  # untuned / transferred, timed in one compile call
    full_speedup: float  # untuned / fully tuned, timed in one compile call
    transfer_search_s: float
    full_search_s: float
    warm_search_s: float
    transfer_estimate: float | None  # Σ weight × chosen latency (None: a kernel had none)
    full_final_estimate: float
    full_time_to_transfer: float | None  # None: full tuning never reached it
    warm_time_to_full: float | None  # None: warm start never reached full's final estimate
    outcomes: dict[str, int] = field(default_factory=dict)
    invalid_reasons: dict[str, int] = field(default_factory=dict)
    tasks_transferred: int = 0  # kernels built with a transferred schedule (the fastest)
    curves: dict[str, list[tuple[float, float]]] = field(default_factory=dict)

    @property
    def fraction_of_max(self) -> float | None:
        if self.full_speedup <= 1:
            return None
        return (self.transfer_speedup - 1) / (self.full_speedup - 1)

    @property
    def search_time_ratio(self) -> float | None:
        """Time full tuning needed to match transfer, over transfer's search time."""
        if self.full_time_to_transfer is None:
            return None
        return self.full_time_to_transfer / self.transfer_search_s

    @property
    def warm_time_share(self) -> float | None:
        """Warm start's time to full tuning's final estimate, as a share of full's time."""
        if self.warm_time_to_full is None:
            return None
        return self.warm_time_to_full / self.full_search_s

    def to_dict(self) -> dict:
        return {**asdict(self), "fraction_of_max": self.fraction_of_max,
                "search_time_ratio": self.search_time_ratio,
                "warm_time_share": self.warm_time_share}  # fmt: skip


def bench_transfer(
    pairs: list[tuple[str, str]] | None = None,
    *,
    trials_per_task: int = 20,
    source_trials_per_task: int = 24,
    per_kernel: int = 8,
    work_dir: str | Path = "bench-transfer",
    target: dict | str | Platform | None = None,
    rounds: int = 3,
    progress: object = None,
) -> list[PairResult]:
    """Run the protocol above for each (target, source) network pair, tuning budgets given
    per task of each network; stores and a JSON of each finished pair stay in ``work_dir``.
    A rerun reuses the source stores and the pairs finished with the same settings; a pair
    it measures again (other settings, or interrupted) has its earlier JSON and stores moved
    into ``work_dir/replaced-N`` first."""
    from tensortune.transfer.run import transfer
    from tensortune.tuning.tune import tune
    from tensortune.workloads.models import load_model
    from tensortune.workloads.networks import check_source

    budgets = (
        ("trials_per_task", trials_per_task),
        ("rounds", rounds),
        ("source_trials_per_task", source_trials_per_task),
        ("per_kernel", per_kernel),
    )
    for name, value in budgets:
        if type(value) is not int or value < 1:  # before any network loads
            raise TensortuneError(f"must be a positive whole number, not {value!r}", param=name)
    with about("pair"):  # a typo found now, not after hours of tuning the source
        for name in dict.fromkeys(n for p in pairs or DEFAULT_PAIRS for n in p):
            check_source(name)
        for tgt, src in pairs or DEFAULT_PAIRS:
            if tgt == src:  # every kernel would find its own tuned schedule
                raise TensortuneError(f"{tgt}:{src} transfers a network's schedules to "
                                      "itself: name another network as the source")  # fmt: skip
    platform = resolve_platform(target)
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda text: None)
    # the CPU too (its fingerprint: model, cores, instruction sets, caches): a work directory
    # copied to a machine of another CPU with the same target text reused timings made
    # elsewhere (pairs saved before this key are measured again)
    setup = {"version": PAIR_VERSION, "target": platform.key, "hardware": platform.hardware.id,
             "trials_per_task": trials_per_task, "source_trials_per_task": source_trials_per_task,
             "per_kernel": per_kernel, "rounds": rounds}  # fmt: skip
    out = []
    for tgt, src in pairs or DEFAULT_PAIRS:
        saved = work / f"{tgt}-from-{src}.json"
        stores = {k: work / f"{tgt}-from-{src}-{k}.db" for k in ("transfer", "full", "warm")}
        done = _finished_pair(saved, setup)
        if done is not None:
            say(f"{tgt} <- {src}: measured before ({saved})")
            out.append(done)
            continue
        # each arm starts cold (this is a measurement): an earlier try's stores move aside
        earlier = [saved, *(f for path in stores.values() for f in store_files(path))]
        if any(path.exists() for path in earlier):
            move_aside(work, earlier, f"{tgt} <- {src} was not finished with these settings")
        src_url = f"sqlite:///{work / f'source-{src}.db'}"
        source = load_model(src, target=platform.tvm_target)
        source_trials = source_trials_per_task * len(source.tasks)
        say(f"{src}: tuning the source ({source_trials} trials)")
        tuned = tune(model=source, trials=source_trials, records=src_url, target=platform,
                     work_dir=work / "work")  # fmt: skip
        if tuned.trials_before > source_trials:  # tuned further by an earlier run: not this one
            move_aside(work, store_files(work / f"source-{src}.db"),
                       f"the source {src} holds {tuned.trials_before} trials, more than "
                       f"{source_trials}")  # fmt: skip
            tune(model=source, trials=source_trials, records=src_url, target=platform,
                 work_dir=work / "work")  # fmt: skip
        model = load_model(tgt, target=platform.tvm_target)
        trials = trials_per_task * len(model.tasks)
        say(f"{tgt} <- {src}: transfer")
        moved = transfer(src_url, model=model, records=f"sqlite:///{stores['transfer']}",
                         target=platform, per_kernel=per_kernel, rounds=rounds,
                         work_dir=work / "work")  # fmt: skip
        untuned = {k.name: k.untuned_seconds for k in moved.tasks}
        say(f"{tgt}: full tuning ({trials} trials)")
        full_s, full_curve = _timed_tune(tune, model, stores["full"], platform, trials, work,
                                         untuned)  # fmt: skip
        say(f"{tgt} <- {src}: warm-started tuning ({trials} trials)")
        warm_s, warm_curve = _timed_tune(tune, model, stores["warm"], platform, trials, work,
                                         untuned, warm_start=src_url)  # fmt: skip
        say(f"{tgt}: timing the fully tuned build")
        full = _compile(model, stores["full"], platform, rounds)
        estimate = transfer_estimate(moved.tasks)
        full_final = full_curve[-1][1] if full_curve else float("inf")
        matched = None if estimate is None else _first_below(full_curve, estimate)
        result = PairResult(
            tgt, src, len(model.tasks), trials, per_kernel, moved.untuned_e2e or 0.0,
            moved.transferred_e2e or 0.0, full.tuned_seconds, moved.e2e_speedup or 0.0,
            full.speedup_over_untuned, moved.search_seconds, full_s, warm_s, estimate,
            full_final, matched, _first_below(warm_curve, full_final),
            moved.outcomes(), moved.invalid_reasons,
            sum(k.took_transferred for k in moved.tasks),
            {"full": full_curve, "warm": warm_curve},
        )  # fmt: skip
        write_atomically(saved, strict_json({**result.to_dict(), "setup": setup}))
        out.append(result)
    return out


def transfer_estimate(kernels: list) -> float | None:
    """Σ weight × the standalone latency of the program ``compile`` builds each kernel with;
    None (unknown) when a kernel has none timed (its untuned program timed out and nothing
    transferred ran): full tuning's curve counts such a kernel as infinite until it is
    measured.  Counted as 0 s, it made the transfer look faster than anything full tuning
    could match."""
    chosen = [(k.weight, k.chosen_seconds) for k in kernels]
    if any(s is None for _, s in chosen):
        return None
    return sum(w * s for w, s in chosen)


def _finished_pair(path: Path, setup: dict) -> PairResult | None:
    """The pair a rerun can reuse: its JSON, saved with the same ``setup``; None if there is
    none, or it is of other settings or unreadable (then it is measured again)."""
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("setup") != setup:
            return None
        known = {k: v for k, v in data.items() if k in PairResult.__dataclass_fields__}
        known["curves"] = {arm: [tuple(point) for point in curve]
                           for arm, curve in known.get("curves", {}).items()}  # fmt: skip
        return PairResult(**known)
    except (OSError, ValueError, TypeError, AttributeError, RecursionError):
        return None


def _timed_tune(tune, model, store: Path, platform: Platform, trials: int, work: Path,
                untuned: dict, **kwargs) -> tuple[float, list[tuple[float, float]]]:  # fmt: skip
    start = time.time()
    tune(model=model, trials=trials, records=f"sqlite:///{store}", target=platform,
         work_dir=work / "work", **kwargs)  # fmt: skip
    return time.time() - start, latency_curve(store, model.tasks, platform, untuned, start)


def _compile(model, store: Path, platform: Platform, rounds: int):
    from tensortune.deploy.compile import compile_model

    return compile_model(model, records=f"sqlite:///{store}", target=platform, rounds=rounds)


def latency_curve(store_path: Path, tasks: list, platform: Platform, untuned: dict,
                  start: float) -> list[tuple[float, float]]:  # fmt: skip
    """(seconds since ``start``, Σ weight × best standalone latency so far) after each record
    of the store, a task without a successful record yet counted at ``untuned[name]``."""
    with open_records(f"sqlite:///{store_path}", create=False) as store:
        hw = platform.hardware.id
        events = []
        for task in tasks:
            wid = store.workload_id(task.mod, create=False)
            if wid is None:
                continue
            for rec in store.query(workload_id=wid, hardware_id=hw, target=platform.key,
                                   ok_only=True):  # fmt: skip
                if origin_kind(rec) != "untuned":
                    events.append((rec.created_at, task.name, rec.cost))
    best = {t.name: untuned.get(t.name) or float("inf") for t in tasks}
    weight = {t.name: t.weight for t in tasks}
    curve = []
    for at, name, cost in sorted(events):
        best[name] = min(best[name], cost)
        curve.append((at - start, sum(weight[n] * best[n] for n in best)))
    return curve


def _first_below(curve: list[tuple[float, float]], level: float) -> float | None:
    return next((t for t, v in curve if v <= level * (1 + 1e-9)), None)


def plot_pairs(results: list[PairResult], out: str | Path) -> None:
    """Per pair: estimated latency of full and warm-started tuning against time, with the
    transfer's estimate at its search time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(4.2 * len(results), 3.8), squeeze=False)
    for ax, r in zip(axes[0], results, strict=True):
        for name, curve in r.curves.items():
            if curve:
                ax.step([t for t, _ in curve], [v * 1e3 for _, v in curve], where="post",
                        label=f"{name} tuning")  # fmt: skip
        if r.transfer_estimate is not None:
            ax.plot([r.transfer_search_s], [r.transfer_estimate * 1e3], "o", color="black",
                    label="transfer")  # fmt: skip
            ax.axhline(r.transfer_estimate * 1e3, color="grey", lw=0.8, ls="--")
        ax.set_yscale("log")
        ax.set_xlabel("search time (s)")
        ax.set_ylabel("Σ weight × best (ms)")
        ax.set_title(f"{r.target} ← {r.source}", fontsize=10)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
