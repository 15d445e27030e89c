"""``tensortune bench``: methods compared on the same footing."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from tensortune.cli.display import (
    console,
    fmt_metric,
    fmt_ratio,
    fmt_seconds,
    print_json,
    print_table,
    table,
)
from tensortune.cli.options import (
    DraftOptionOpt,
    FastMathOpt,
    JsonOpt,
    ModelOpt,
    ModelParamOpt,
    TargetOpt,
    WorkloadOpt,
    WorkloadsFromOpt,
    key_values,
    model_params,
)
from tensortune.cli.progress import Reporter
from tensortune.errors import check_writable

# bench splits, al, prune and hardware (``compare.checkpoint``)
CheckpointOpt = Annotated[
    Path | None,
    typer.Option(
        "--checkpoint",
        metavar="FILE",
        help="Keep each finished unit here; run again with the same settings, the study "
        "does only what FILE does not hold (a file of other settings is moved aside).",
    ),
]

# compare/summary.mean_and_sd's rule, said under every study's table
SAME_ONCE = "a fold counted once where every seed gave it the same figures"

app = typer.Typer(help="Benchmarks of tensortune's methods against MetaSchedule's.",
                  no_args_is_help=True)  # fmt: skip


@app.command("tune")
def tune(
    workload: WorkloadOpt = None,
    model: ModelOpt = None,
    workloads_from: WorkloadsFromOpt = None,
    trials_per_task: Annotated[
        int,
        typer.Option(
            "--trials-per-task", metavar="N", help="Trials every method measures of each task."
        ),
    ] = 64,
    work_dir: Annotated[
        Path,
        typer.Option(
            "--work-dir",
            metavar="DIR",
            help="Each method's records store and logs, and results.json.",
        ),
    ] = Path("tensortune-bench"),
    target: TargetOpt = None,
    method: Annotated[
        list[str] | None,
        typer.Option(
            "--method",
            metavar="NAME",
            help="default (MetaSchedule's) | draft | pretrained | moa | alt (pretrained with "
            "ALT's validity filter and ping-pong) | alt-adaptive (exploring only after a round "
            "that did not improve the task) | frozen (pretrained, never updated) | "
            "moa-ungated (MoA always trusting the adapted model); repeatable (default: the "
            "first four).",
        ),
    ] = None,
    max_tasks: Annotated[
        int | None,
        typer.Option("--max-tasks", metavar="N", help="Keep the N heaviest tasks of a model."),
    ] = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", metavar="PNG", help="Draw the curves into PNG.")
    ] = None,
    as_json: JsonOpt = False,
    seed: Annotated[
        list[int] | None,
        typer.Option(
            metavar="N",
            help="Random seed of the searches; repeatable: each seed runs in "
            "WORK_DIR/seed-N and the medians over seeds are reported.",
        ),
    ] = None,
    draft_option: DraftOptionOpt = None,
    pretrained: Annotated[
        Path | None,
        typer.Option(
            "--pretrained",
            metavar="FILE",
            help="Verifier of 'pretrained', 'alt', 'alt-adaptive' and 'frozen' (default: the "
            "model shipped "
            "for the target).",
        ),
    ] = None,
    moa_source: Annotated[
        Path | None,
        typer.Option(
            "--moa-source",
            metavar="FILE",
            help="Neural model 'moa' and 'moa-ungated' adapt (default: the shipped one "
            "trained on the most other configurations).",
        ),
    ] = None,
    fast_math: FastMathOpt = True,
    retime: Annotated[
        int,
        typer.Option(
            "--retime",
            metavar="ROUNDS",
            help="After the methods ran, time every method's record-breaking programs again "
            "side by side in ROUNDS rounds and report the speedups on that one clock too; 0: "
            "not.",
        ),
    ] = 5,
) -> None:
    """Compare search methods on the same tasks, budget per task, builder and runner.

    Reports each method's final latency, the search-time speedup over MetaSchedule's default
    (time to reach the default's final latency) and where the time went; then the same
    speedup with the programs each curve reads timed again side by side ("re-timed"), which a
    timing that moved between the methods' runs does not sway.

    Example: tensortune bench tune --model resnet50 --max-tasks 2 --trials-per-task 128 --seed
    0 --seed 1 --plot b.png
    """
    check_writable(plot, "plot")
    from tensortune.compare.search_methods import DEFAULT_METHODS
    from tensortune.compare.seeds import bench_seeds, seed_plot, summarize_seeds

    seeds = seed or [0]
    methods = method or list(DEFAULT_METHODS)
    with Reporter(console, quiet=as_json) as reporter:
        bars: dict[str, object] = {}

        def progress(name: str, run, total: int) -> None:
            if name not in bars:
                bars[name] = reporter.bar(name, total=total)
            lat = run.curve[-1][2] if run.curve else None
            reporter.line(f"[{name}] {run.trials} trials, {run.curve[-1][0]:.0f} s, "
                          f"latency {fmt_seconds(lat)}")  # fmt: skip
            reporter.update(bars[name], completed=run.trials)  # type: ignore[arg-type]

        results = bench_seeds(workload, model=model, workloads_from=workloads_from,
                              trials_per_task=trials_per_task, work_dir=work_dir, target=target,
                              methods=methods, max_tasks=max_tasks, seeds=seeds, plot=plot,
                              draft_options=key_values(draft_option or [], "draft_options"),
                              pretrained=pretrained and str(pretrained),
                              moa_source=moa_source and str(moa_source),
                              fast_math=fast_math, retime=retime,
                              progress=progress)  # fmt: skip
    if as_json:
        if len(results) == 1:
            print_json(results[0].to_dict())
        else:
            print_json({"runs": [r.to_dict() for r in results],
                        "summary": summarize_seeds(results)})  # fmt: skip
        return
    for result in results:
        _print_bench(result)
        if plot is not None:
            console.print(f"curves: {plot if len(results) == 1 else seed_plot(plot, result.seed)}")
    if len(results) > 1:
        summary = summarize_seeds(results)
        n = len(results)
        for m, v in summary["speedup"].items():
            each = ", ".join(fmt_ratio(x) for x in v["seeds"])
            # Two methods that measure the same programs differ in time by the machine's noise
            # (up to 15% between runs on a shared 2-core guest); the trial ratio shows it.
            trials = ", ".join(fmt_ratio(x) for x in summary["trial_ratio"][m]["seeds"])
            console.print(f"{m}: median speedup {fmt_ratio(v['median'])} over seeds "
                          f"{summary['seeds']} "
                          f"({each}; in trials {trials}), reached in {v['reached']} of {n}; "
                          f"mean ± standard error {_near(summary, m, n)}")  # fmt: skip
            again = summary.get("retimed_speedup", {}).get(m)
            if again is not None:
                each = ", ".join(fmt_ratio(x) for x in again["seeds"])
                trials = ", ".join(fmt_ratio(x)
                                   for x in summary["retimed_trial_ratio"][m]["seeds"])  # fmt: skip
                console.print(f"  re-timed: median {fmt_ratio(again['median'])} ({each}; in "
                              f"trials {trials}), reached in {again['reached']} of {n}; "
                              f"{_near(summary, m, n, 'retimed_')}")  # fmt: skip


def _near(summary: dict, method: str, n: int, prefix: str = "") -> str:
    """The speedups to come within each tolerance of the default, over the seeds."""
    from tensortune.compare.seeds import TOLERANCES, within_key

    near = []
    for t in TOLERANCES:
        w = summary[prefix + within_key(t)][method]
        sem = "" if w["sem"] is None else f" ± {w['sem']:.2f}"
        near.append(f"within {t:.0%}: {w['reached']} of {n}, {w['mean']:.2f}x{sem}")
    return "; ".join(near)


def _print_bench(result) -> None:
    t = table(f"{len(result.tasks)} task(s) x {result.trials_per_task} trials, seed "
              f"{result.seed}", {"method": "left", **dict.fromkeys(
                  ("final latency", "wall", "speedup", "trial ratio", "build", "run", "model",
                   "analyzer"), "right")})  # fmt: skip
    speedup, ratio = result.speedup, result.trial_ratio
    for name, run in result.runs.items():
        b = run.breakdown
        t.add_row(
            name, fmt_seconds(run.final_latency), fmt_seconds(run.wall_s),
            fmt_ratio(speedup.get(name)), fmt_ratio(ratio.get(name)),
            fmt_seconds(b.get("build", 0)), fmt_seconds(b.get("run", 0)),
            fmt_seconds(b.get("model_predict", 0) + b.get("model_update", 0)),
            fmt_seconds(b.get("analyzer", 0)),
        )  # fmt: skip
    print_table(t)
    if result.retimed:
        again, trials = result.speedup_within(0.0, retimed=True), result.trials_over_default(True)
        console.print("re-timed side by side: " + "; ".join(
            f"{name} {fmt_seconds(run.final(True))}, speedup {fmt_ratio(again.get(name))} "
            f"(in trials {fmt_ratio(trials.get(name))})"
            for name, run in result.runs.items()))  # fmt: skip


@app.command("transfer")
def transfer(
    pair: Annotated[
        list[str] | None,
        typer.Option(
            "--pair",
            metavar="TARGET:SOURCE",
            help="A target network and the network whose schedules it takes, e.g. "
            "resnet18:resnet50; repeatable (default: the five pairs of the transfer "
            "benchmark).",
        ),
    ] = None,
    trials_per_task: Annotated[
        int,
        typer.Option(
            "--trials-per-task",
            metavar="N",
            help="Budget of full and of warm-started tuning, per task of the target.",
        ),
    ] = 20,
    source_trials_per_task: Annotated[
        int,
        typer.Option(
            "--source-trials-per-task", metavar="N", help="Budget tuning each source, per task."
        ),
    ] = 24,
    per_kernel: Annotated[
        int,
        typer.Option("--per-kernel", metavar="N", help="Transferred schedules timed per kernel."),
    ] = 8,
    work_dir: Annotated[
        Path,
        typer.Option(
            "--work-dir",
            metavar="DIR",
            help="Source stores (reused by a rerun), each arm's store, a JSON per pair.",
        ),
    ] = Path("bench-transfer"),
    target: TargetOpt = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", metavar="PNG", help="Draw the curves into PNG.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Transfer-tuning against full tuning and warm-started tuning, per network pair.

    For each pair: the untuned, transferred and fully tuned builds timed end to end, the
    fraction of the maximum speedup transfer reached ((S_transfer - 1) / (S_full - 1)), its
    search time, the time full tuning needed to match it, and warm-started tuning's time to
    full tuning's final latency (latencies over time are Σ weight x best standalone time).

    Example: tensortune bench transfer --pair gpt2-block:bert-layer --plot t.png
    """
    check_writable(plot, "plot")
    from tensortune.compare.transfer import DEFAULT_PAIRS, bench_transfer, plot_pairs
    from tensortune.errors import TensortuneError

    pairs = []
    for p in pair or [f"{t}:{s}" for t, s in DEFAULT_PAIRS]:
        tgt, sep, src = p.partition(":")
        if not sep or not tgt or not src:
            raise TensortuneError(f"expected TARGET:SOURCE, got {p!r}", param="pair")
        pairs.append((tgt, src))
    with Reporter(console, quiet=as_json) as reporter:
        results = bench_transfer(pairs, trials_per_task=trials_per_task,
                                 source_trials_per_task=source_trials_per_task,
                                 per_kernel=per_kernel, work_dir=work_dir, target=target,
                                 progress=reporter.line)  # fmt: skip
    if plot is not None:
        plot_pairs(results, plot)
    if as_json:
        print_json([r.to_dict() for r in results])
        return
    t = table(f"transfer-tuning: {trials_per_task} trials a task of tuning, {per_kernel} "
              "schedules per kernel",
              {"target <- source": "left", **dict.fromkeys(
                  ("untuned", "transferred", "full", "fraction of max", "transfer search",
                   "full to match", "ratio", "warm to full", "share"), "right")})  # fmt: skip
    for r in results:
        t.add_row(
            f"{r.target} <- {r.source}", fmt_seconds(r.untuned_e2e), fmt_seconds(r.transfer_e2e),
            fmt_seconds(r.full_e2e), _pct(r.fraction_of_max), fmt_seconds(r.transfer_search_s),
            fmt_seconds(r.full_time_to_transfer) if r.full_time_to_transfer is not None
            else "-" if r.transfer_estimate is None else f"> {fmt_seconds(r.full_search_s)}",
            "-" if r.transfer_estimate is None else fmt_ratio(r.search_time_ratio),
            fmt_seconds(r.warm_time_to_full)
            if r.warm_time_to_full is not None else "never", _pct(r.warm_time_share),
        )  # fmt: skip
    print_table(t)
    for r in results:
        o = r.outcomes
        console.print(
            f"{r.target} <- {r.source}: {o.get('exact', 0)} exact, "
            f"{o.get('refit', 0)} re-fitted, {o.get('invalid', 0)} invalid transfers "
            f"({o.get('relaxed', 0)} from kernels with a shorter epilogue); "
            f"{r.tasks_transferred}/{r.tasks} kernels took a transferred schedule"
        )
    if plot is not None:
        console.print(f"curves: {plot}")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


@app.command("e2e")
def e2e(
    network: Annotated[
        list[str] | None,
        typer.Option(
            "--network",
            "-m",
            metavar="NET",
            help="Zoo network; repeatable (default: resnet18, resnet50, mobilenetv2, "
            "bert-layer, gpt2-block).",
        ),
    ] = None,
    time_budget: Annotated[
        str,
        typer.Option("--time", metavar="DURATION", help="Tuning time per network, e.g. 20m."),
    ] = "20m",
    rounds: Annotated[
        int, typer.Option(metavar="N", help="Rounds in which all systems take turns.")
    ] = 3,
    anchor: Annotated[
        list[str] | None,
        typer.Option(
            "--anchor",
            metavar="NAME",
            help="pytorch | torch.compile | onnxruntime | openvino; repeatable (default: all).",
        ),
    ] = None,
    work_dir: Annotated[
        Path,
        typer.Option(
            "--work-dir",
            metavar="DIR",
            help="A store per network (a rerun times it again without tuning), ONNX "
            "exports, a JSON per network.",
        ),
    ] = Path("bench-e2e"),
    target: TargetOpt = None,
    plot: Annotated[
        Path | None, typer.Option("--plot", metavar="PNG", help="Draw the latencies into PNG.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Tune each network for a time budget, then time it against PyTorch eager,
    torch.compile, ONNX Runtime and OpenVINO (fp32), in turns in this process, outputs checked
    against eager, with the machine's practical peak (fp32 matrix products up to 2048³).  The tuned
    build is also timed as shipped: its artifact read back by tensortune.load (here, and in a
    process of its own that has loaded nothing else), and through the torch.compile backend.

    Example: tensortune bench e2e -m resnet18 --time 20m --plot e2e.png
    """
    check_writable(plot, "plot")
    from tensortune.cli.display import fmt_duration
    from tensortune.cli.options import parse_duration, rename_options
    from tensortune.compare.e2e import ANCHORS, TUNED, bench_e2e, plot_e2e

    rename_options({"max_seconds": "--time", "anchors": "--anchor"})
    seconds = parse_duration(time_budget, "max_seconds")
    with Reporter(console, quiet=as_json) as reporter:
        results = bench_e2e(network, max_seconds=seconds, work_dir=work_dir, target=target,
                            rounds=rounds, anchors=tuple(anchor or ANCHORS),
                            progress=reporter.line)  # fmt: skip
    if plot is not None and results:
        plot_e2e(results, plot)
    if as_json:
        print_json([r.to_dict() for r in results])
        return
    for r in results:
        tuned = (
            f"{r.trials} trials, {fmt_duration(r.tune_seconds)} since it resumed"
            if r.resumed
            else f"{r.trials} trials in {fmt_duration(r.tune_seconds)}"
        )
        t = table(f"{r.network}: {tuned}, {r.gflop:.2f} GFLOP, {r.threads} threads, "
                  f"{rounds} rounds",
                  {"system": "left", "median": "right", "spread": "right",
                   "tuned is faster by": "right", "GFLOP/s": "right", "% of peak": "right",
                   "max |Δ| vs eager": "right"}, caption=r.cpu)  # fmt: skip
        for name, s in r.systems.items():
            if s.missing:
                t.add_row(name, s.missing, "", "", "", "", "")
                continue
            spread = f"{fmt_seconds(min(s.rounds))}–{fmt_seconds(max(s.rounds))}"
            gf = r.gflops(name)
            faster = "" if name == TUNED else fmt_ratio(r.speedup_over(name))
            label = f"{name} ({s.note})" if s.note else name
            t.add_row(label, fmt_seconds(s.median), spread, faster,
                      f"{gf:.1f}" if gf else "-", _pct(gf / r.peak_gflops if gf else None),
                      f"{s.max_abs_error:.1e}" if s.max_abs_error is not None else "-")  # fmt: skip
        print_table(t)
    if results:
        r = results[0]
        console.print(f"practical peak: {r.peak_gflops:.1f} GFLOP/s (the best fp32 matrix "
                      f"product of 512³–2048³ in PyTorch and the runtimes, {r.threads} threads: "
                      f"{r.peak_by})")  # fmt: skip
    if plot is not None:
        console.print(f"plot: {plot}")


# Options the offline studies (bench al, bench prune) share.
StudyHardwareOpt = Annotated[
    str | None,
    typer.Option(metavar="HW", help="The hardware to study, when the dataset has several."),
]
DefaultDatasetOpt = Annotated[
    str,
    typer.Option(
        metavar="DATASET", help="A dataset directory, or a shipped one's name (default, pool)."
    ),
]


@app.command("al")
def active_learning(
    selector: Annotated[
        list[str] | None,
        typer.Option(
            "--selector",
            metavar="NAME",
            help="random | diversity | balto | balto-weighted | uncertainty | alt; "
            "repeatable (default: all).",
        ),
    ] = None,
    dataset: Annotated[
        str,
        typer.Option(metavar="DATASET", help="The pool: a dataset directory, or pool (shipped)."),
    ] = "pool",
    held_out: Annotated[
        str,
        typer.Option(
            metavar="NET[,NET...]",
            help="Networks to score on; their tasks are kept out of the pool "
            "(default: the dataset card's held_out).",
        ),
    ] = "",
    test_dataset: Annotated[
        str | None,
        typer.Option(
            metavar="DATASET", help="Where the held-out rows come from (default: --dataset)."
        ),
    ] = None,
    hardware: StudyHardwareOpt = None,
    prior: Annotated[
        str | None,
        typer.Option(
            metavar="DATASET",
            help="Rows of other CPUs every model also learns from (e.g. default): what "
            "measuring on a CPU new to that dataset adds. The held-out rows are then the "
            "pool's CPU's alone.",
        ),
    ] = None,
    fractions: Annotated[
        str, typer.Option(metavar="F[,F...]", help="Shares of the pool to measure.")
    ] = "0.01,0.02,0.03,0.05,0.1,0.2,1",
    models: Annotated[
        str, typer.Option(metavar="KIND[,KIND...]", help="Cost models trained on each selection.")
    ] = "xgb,mlp",
    seeds: Annotated[int, typer.Option(metavar="N", help="Seeds 0..N-1 of every selector.")] = 3,
    param: ModelParamOpt = None,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", metavar="PNG", help="Accuracy against measurements, all selectors."),
    ] = None,
    checkpoint: CheckpointOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Active learning offline: each selector picks programs from a measured pool, a model is
    trained on its picks at each fraction and scored on held-out networks (PCA, top-1, top-5
    score, and how many of its top-5 are truly slow), over several seeds.

    Example: tensortune bench al --selector random --selector balto --fractions 0.01,0.05,1
    """
    check_writable(plot, "plot")
    from tensortune.cli.options import rename_options
    from tensortune.compare.active_learning import SELECTOR_NAMES, plot_study, study
    from tensortune.train.selection import held_out_networks

    rename_options({"held_out": "--held-out", "fractions": "--fractions", "seeds": "--seeds",
                    "selectors": "--selector", "models": "--models"})  # fmt: skip
    held = held_out_networks(dataset, held_out)
    fracs = _shares(fractions, "fractions")
    settings = model_params(param)
    with Reporter(console, quiet=as_json) as reporter:
        result = study(dataset, held_out=held, selectors=selector or SELECTOR_NAMES,
                       fractions=fracs, models=[m for m in models.split(",") if m],
                       seeds=range(seeds), test_dataset=test_dataset, hardware=hardware,
                       params=settings, progress=reporter.line, prior=prior,
                       checkpoint=checkpoint)  # fmt: skip
    if plot is not None:
        plot_study(result, plot)
    _print_study(result, as_json, plot, picked="selector", counted="measured")


@app.command("prune")
def pruning(
    method: Annotated[
        list[str] | None,
        typer.Option(
            "--method",
            metavar="NAME",
            help="random | cluster | cluster-global | low-perf | shape-dedup; repeatable "
            "(default: all).",
        ),
    ] = None,
    # The pool's card names its held-out networks and it holds one machine, so the bare
    # command runs; the main dataset needs --held-out and --hardware.
    dataset: DefaultDatasetOpt = "pool",
    held_out: Annotated[
        str,
        typer.Option(
            metavar="NET[,NET...]",
            help="Networks to score on; their tasks are kept out of what is pruned "
            "(default: the dataset card's held_out; the default dataset has none).",
        ),
    ] = "",
    hardware: StudyHardwareOpt = None,
    keep: Annotated[
        str, typer.Option(metavar="F[,F...]", help="Shares of the programs to keep.")
    ] = "0.2,0.35,0.45,0.6,0.8,1",
    models: Annotated[
        str, typer.Option(metavar="KIND[,KIND...]", help="Cost models trained on each share.")
    ] = "xgb",
    seeds: Annotated[int, typer.Option(metavar="N", help="Seeds 0..N-1 of every method.")] = 3,
    param: ModelParamOpt = None,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", metavar="PNG", help="Accuracy against programs kept, all methods."),
    ] = None,
    checkpoint: CheckpointOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Dataset pruning: each method keeps a share of a dataset's programs, a model is trained
    on them and scored on held-out networks (PCA, top-1, top-5 score), over several seeds.

    Example: tensortune bench prune --keep 0.35,0.45,1 (the pool); on the main dataset:
    --dataset default --held-out mobilenetv2,gpt2-block --hardware avx512-2c@eab22ab1
    """
    check_writable(plot, "plot")
    from tensortune.cli.options import rename_options
    from tensortune.compare.active_learning import plot_study
    from tensortune.compare.pruning import prune_study
    from tensortune.train.pruning import METHODS
    from tensortune.train.selection import held_out_networks

    rename_options({"held_out": "--held-out", "keeps": "--keep", "seeds": "--seeds",
                    "methods": "--method", "models": "--models"})  # fmt: skip
    held = held_out_networks(dataset, held_out)
    with Reporter(console, quiet=as_json) as reporter:
        result = prune_study(dataset, held_out=held, methods=method or METHODS,
                             keeps=_shares(keep, "keeps"),
                             models=[m for m in models.split(",") if m], seeds=range(seeds),
                             hardware=hardware, params=model_params(param),
                             progress=reporter.line, checkpoint=checkpoint)  # fmt: skip
    if plot is not None:
        plot_study(result, plot, counted="kept")
    _print_study(result, as_json, plot, picked="method", counted="kept")


@app.command("hardware")
def hardware(
    hardware: Annotated[
        str,
        typer.Option(
            metavar="HW",
            help="The machine to hold out: a hardware of the dataset (its configuration name, "
            "e.g. avx512-1c, or name@fingerprint).",
        ),
    ] = "avx512-1c",
    dataset: DefaultDatasetOpt = "default",
    folds: Annotated[
        str,
        typer.Option(
            metavar="NET[+NET][,...]",
            help="Held-out networks, one fold each (+ joins networks into one fold).",
        ),
    ] = "resnet18,bert-base,vit-tiny",
    models: Annotated[
        str,
        typer.Option(
            metavar="KIND[,KIND...]",
            help="Cost models to transfer: neural ones, xgb or lgbm (those are refined; the "
            "MoA arms are for neural models only).",
        ),
    ] = "hwattn",
    samples: Annotated[
        str, typer.Option(metavar="K[,K...]", help="Target measurements for the few-shot arms.")
    ] = "16,64,256",
    seeds: Annotated[int, typer.Option(metavar="N", help="Seeds 0..N-1 of every arm.")] = 3,
    param: ModelParamOpt = None,
    checkpoint: CheckpointOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Held-out hardware: a model trained on the other machines (zero-shot), fine-tuned on k of
    the new machine's measurements, trained on those k alone, adapted by MoA, and trained on
    all of the new machine's rows, each scored on held-out networks measured on it.

    Example: tensortune bench hardware --hardware avx512-1c --folds resnet18 --seeds 2
    """
    from tensortune.cli.options import rename_options
    from tensortune.compare.hardware import hardware_study
    from tensortune.errors import TensortuneError, about
    from tensortune.train.metrics import RANK_METRICS

    rename_options({"folds": "--folds", "ks": "--samples", "seeds": "--seeds",
                    "models": "--models", "hardware": "--hardware"})  # fmt: skip
    with about("ks"):
        try:
            ks = [int(k) for k in samples.split(",") if k]
        except ValueError:
            raise TensortuneError(f"expected counts such as 16,64, got {samples!r}") from None
    with Reporter(console, quiet=as_json) as reporter:
        result = hardware_study(dataset, hardware=hardware,
                                folds=[f.split("+") for f in folds.split(",") if f],
                                models=[m for m in models.split(",") if m], ks=ks,
                                seeds=range(seeds), params=model_params(param),
                                progress=reporter.line, checkpoint=checkpoint)  # fmt: skip
    if as_json:
        _print_json(result)
        return
    s = result.setup
    t = table(f"held-out hardware {s['hardware']}; folds {', '.join(map('+'.join, s['folds']))}; "
              f"{len(s['seeds'])} seeds; mean ± sd over folds and seeds, {SAME_ONCE}",
              {"model": "left", "arm": "left", "PCA": "right", "top-1 score": "right",
               "top-5 score": "right"})  # fmt: skip
    for e in result.summary():
        cells = (_mean_sd(e, k) for k in RANK_METRICS)
        t.add_row(e["model"], e["arm"], *cells)
    print_table(t)


@app.command("splits")
def splits(
    dataset: DefaultDatasetOpt = "default",
    split: Annotated[
        list[str] | None,
        typer.Option(
            "--split",
            metavar="KIND",
            help="within-task | by-task | by-network | by-hardware; repeatable (default: all).",
        ),
    ] = None,
    models: Annotated[
        str, typer.Option(metavar="KIND[,KIND...]", help="Cost models to train under each split.")
    ] = "xgb",
    seeds: Annotated[int, typer.Option(metavar="N", help="Seeds 0..N-1 of every fold.")] = 3,
    param: ModelParamOpt = None,
    checkpoint: CheckpointOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The same models under each way of splitting a dataset (within tasks, by task, by
    network, by hardware): how much a record-level split overstates accuracy on networks and
    machines never seen.

    Example: tensortune bench splits --models xgb,hwattn --seeds 2
    """
    from tensortune.cli.options import rename_options
    from tensortune.compare.splits import SPLIT_KINDS, split_study
    from tensortune.train.metrics import RANK_METRICS

    rename_options({"splits": "--split", "models": "--models", "seeds": "--seeds"})
    with Reporter(console, quiet=as_json) as reporter:
        result = split_study(dataset, splits=split or SPLIT_KINDS,
                             models=[m for m in models.split(",") if m], seeds=range(seeds),
                             params=model_params(param), progress=reporter.line,
                             checkpoint=checkpoint)  # fmt: skip
    if as_json:
        _print_json(result)
        return
    s = result.setup
    t = table(f"{s['dataset']} ({s['programs']} programs); {len(s['seeds'])} seeds; mean ± sd "
              f"over folds and seeds, {SAME_ONCE}",
              {"model": "left", "split": "left", "folds": "right", "PCA": "right",
               "top-1 score": "right", "top-5 score": "right",
               "PCA over by-network": "right"})  # fmt: skip
    for e in result.summary():
        over = e["pca_over_by_network"]
        cells = (_mean_sd(e, k) for k in RANK_METRICS)
        t.add_row(e["model"], e["split"], str(e["folds"]), *cells,
                  "-" if over is None else fmt_metric(over, "+.3f"))  # fmt: skip
    print_table(t)
    for split, why in s.get("skipped", {}).items():
        console.print(f"Left out {split}: {why}")
    ceiling = s.get("measurement_ceiling")
    if ceiling:
        console.print("Measurement ceiling (each program's first timing repeat ranked against "
                      f"its other repeats, {ceiling['programs']} programs): PCA "
                      f"{fmt_metric(ceiling['pca'], '.3f')}, top-1 score "
                      f"{ceiling['top1_score']:.3f}, top-5 score "
                      f"{ceiling['top5_score']:.3f}")  # fmt: skip


def _mean_sd(entry: dict, key: str) -> str:
    """A study table's cell: the mean ± the sample standard deviation (none of one run)."""
    sd = entry[f"{key}_std"]
    return fmt_metric(entry[key], ".3f") + " ± " + ("-" if math.isnan(sd) else f"{sd:.3f}")


def _print_json(result) -> None:
    """A study's setup, summary and every run, as one JSON object."""
    print_json({"setup": result.setup, "summary": result.summary(), "runs": result.rows})


def _shares(text: str, param: str) -> list[float]:
    from tensortune.errors import TensortuneError, about

    with about(param):
        try:
            return [float(f) for f in text.split(",") if f]
        except ValueError:
            raise TensortuneError(f"expected numbers such as 0.01,0.05,1, got {text!r}") from None


def _print_study(result, as_json: bool, plot: Path | None, *, picked: str, counted: str) -> None:
    """A study's summary as JSON or a table (mean ± sd over seeds)."""
    if as_json:
        _print_json(result)
        return
    s = result.setup
    t = table(f"{s['pool_programs']} programs of {s['pool_tasks']} tasks on {s['hardware']}; "
              f"held out: {', '.join(s['held_out'])} ({s['test_programs']} programs, "
              f"{s['test_tasks']} tasks); {len(s['seeds'])} seeds, mean ± sd, {SAME_ONCE}"
              + (f"; every model also learns from {s['prior']['programs']} programs of other "
                 f"CPUs ({s['prior']['dataset']})" if s.get("prior") else ""),
              {"model": "left", picked: "left", counted: "right", "PCA": "right",
               "top-1 score": "right", "top-5 score": "right",
               "top-5 in slow half": "right"})  # fmt: skip
    summary = result.summary()
    for e in summary:
        t.add_row(e["model"], e["selector"], f"{e['measured']} ({e['fraction']:.0%})",
                  *(_mean_sd(e, k)
                    for k in ("pca", "top1_score", "top5_score", "overestimation")))  # fmt: skip
    print_table(t)
    for e in summary:
        if e["unscored"]:
            console.print(f"Not scored: {e['model']} on {e['selector']}'s picks at "
                          f"{e['fraction']:.0%}, {e['unscored']} of "
                          f"{e['unscored'] + e['seeds']} seeds (none of their programs ran); "
                          + ("its figures are of the other seeds" if e["seeds"] else
                             "it has no figures"))  # fmt: skip
    if plot is not None:
        console.print(f"plot: {plot}")
