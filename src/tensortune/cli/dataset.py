"""``tensortune dataset``: collect measured programs, build and describe datasets."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tensortune.cli.display import console, print_json, print_table, table
from tensortune.cli.options import (
    JsonOpt,
    ModelParamOpt,
    OverwriteOpt,
    RecordsOpt,
    WorkDirOpt,
    WorkloadOpt,
    model_params,
    rename_options,
)
from tensortune.cli.progress import Reporter
from tensortune.errors import TensortuneError
from tensortune.hardware.fingerprint import usable_cores
from tensortune.records import DEFAULT_URL

app = typer.Typer(help="Collect measured programs into datasets.", no_args_is_help=True)


@app.command("collect")
def collect(
    network: Annotated[
        list[str] | None,
        typer.Option(
            "--network",
            metavar="NET",
            help="Zoo network, e.g. resnet18, or an .onnx file; repeatable (default: "
            "the whole network zoo).",
        ),
    ] = None,
    workload: WorkloadOpt = None,
    config: Annotated[
        list[str] | None,
        typer.Option(
            "--config",
            metavar="NAME",
            help="Hardware configuration, e.g. avx2-1c; repeatable (default: "
            "avx512-2c and avx2-1c, those of them this CPU can run).",
        ),
    ] = None,
    trials_per_task: Annotated[
        int,
        typer.Option(
            "--trials-per-task",
            "--per-task",
            "--budget",
            metavar="N",
            help="Programs to measure of each task on each configuration.",
        ),
    ] = 64,
    evolved_share: Annotated[
        float,
        typer.Option(
            metavar="SHARE",
            help="Share of each task's programs from evolutionary search, e.g. 0.5; "
            "the rest are random samples of its design space (the random sampler only: "
            "another --sampler picks from a pool it generates).",
        ),
    ] = 0.5,
    records: RecordsOpt = DEFAULT_URL,
    work_dir: WorkDirOpt = Path("tensortune-work"),
    worker: Annotated[
        bool,
        typer.Option(
            "--worker",
            help="One of several collectors sharing --records (e.g. a postgresql:// URL "
            "that every machine of a farm names): start at a task of its own; no two "
            "collectors ever measure the same program.",
        ),
    ] = False,
    heaviest: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            help="Only each network's N tasks with the most FLOPs (e.g. a dense pool for "
            "an active-learning study).",
        ),
    ] = None,
    exclude_network: Annotated[
        list[str] | None,
        typer.Option(
            "--exclude-network",
            metavar="NET",
            help="Leave out every task that also occurs in NET (e.g. a network a study "
            "holds out); repeatable.",
        ),
    ] = None,
    sampler: Annotated[
        str,
        typer.Option(
            metavar="NAME",
            help="random (TenSet: random programs, then evolved ones), or a selector of "
            "tensortune.active (balto, diversity, uncertainty, alt, ...): measure only its "
            "picks among fresh random programs, in rounds, the model refitted between them.",
        ),
    ] = "random",
    rounds: Annotated[
        int, typer.Option(metavar="N", help="Rounds of a selector's collection.")
    ] = 4,
) -> None:
    """Measure programs of every task of the networks on each hardware configuration.

    Resumable: running it again tops up each task to --trials-per-task programs.

    Example: tensortune dataset collect --network resnet18 --config avx2-1c --records
    sqlite:///collect.db

    Standalone operators (--workload) are recorded as the network 'ops'; given without
    --network, only they are collected: tensortune dataset collect -w softmax:128,768
    """
    from tensortune.collect import CollectResult, CollectStep, default_configs
    from tensortune.collect import collect as run_collect

    configs = config or default_configs()
    with Reporter(console) as reporter:
        bar = None
        counted: dict[tuple[str, int], int] = {}

        def progress(step: CollectStep) -> None:
            nonlocal bar
            key = (step.config, step.index)
            if key not in counted:
                reporter.line(f"[{step.config} {step.index + 1}/{step.tasks}] {step.task.name}: "
                              f"{min(step.have, step.want)}/{step.want} programs")  # fmt: skip
            if bar is None:
                bar = reporter.bar("measuring", total=len(configs) * step.tasks * step.want)
            counted[key] = min(step.have, step.want)
            reporter.update(bar, completed=sum(counted.values()),
                            description=f"{step.config} {step.task.name}")  # fmt: skip

        rename_options({"programs_per_task": "--trials-per-task", "budget": "--trials-per-task",
                    "selector": "--sampler", "config": "--config",
                    "exclude": "--exclude-network"})  # fmt: skip
        # Each setting is judged whichever sampler reads it: the branch that ignores one took
        # a value out of range in silence.
        if not 0 <= evolved_share <= 1:
            raise TensortuneError(f"must be from 0 to 1, not {evolved_share}",
                                  param="--evolved-share")  # fmt: skip
        if rounds < 1:
            raise TensortuneError(f"must be at least 1, not {rounds}", param="--rounds")
        if sampler != "random":
            from tensortune.collect.active import collect_active
            from tensortune.collect.programs import check_configs

            if worker:
                raise TensortuneError("a selector's collection runs alone: drop --worker",
                                      param="--sampler")  # fmt: skip
            # One configuration at a time, each with its own model; all checked first.
            checked, _ = check_configs(configs, param="config")
            runs = [collect_active(network or None, config=config, selector=sampler,
                                   budget=trials_per_task, rounds=rounds, records=records,
                                   work_dir=work_dir, progress=progress, heaviest=heaviest,
                                   exclude=exclude_network or (), workloads=workload or ())
                    for config in checked]  # fmt: skip
            result = CollectResult(runs[0].records_url, configs, runs[0].tasks,
                                   sum(r.measured for r in runs))  # fmt: skip
        else:
            result = run_collect(network or None, configs=configs,
                                 programs_per_task=trials_per_task,
                                 evolved_share=evolved_share, records=records,
                                 work_dir=work_dir, progress=progress, worker=worker,
                                 heaviest=heaviest, exclude=exclude_network or (),
                                 workloads=workload or ())  # fmt: skip
    console.print(f"measured {result.measured} programs of {result.tasks} tasks on "
                  f"{', '.join(result.configs)} into {result.records_url}")  # fmt: skip


@app.command("build")
def build(
    out: Annotated[
        Path, typer.Argument(metavar="DIR", help="Directory for programs.parquet and card.json.")
    ],
    records: RecordsOpt = DEFAULT_URL,
    description: Annotated[
        str,
        typer.Option(metavar="TEXT", help="How the records were collected, for the card."),
    ] = "",
    held_out: Annotated[
        str,
        typer.Option(
            metavar="NET[,NET...]",
            help="Networks a study of this dataset holds out (scored on, never trained on): "
            "recorded in the card, the default of bench al and dataset select.",
        ),
    ] = "",
    overwrite: OverwriteOpt = False,
) -> None:
    """Turn records into a Parquet dataset with labels and cached features.

    Example: tensortune dataset build ds --records sqlite:///collect.db
    """
    from tensortune.datasets.build import build_dataset

    rename_options({"out_dir": "DIR", "out": "DIR"})
    with console.status("replaying traces and extracting features..."):
        card = build_dataset(records, out, description=description,
                             held_out=[n for n in held_out.split(",") if n],
                             overwrite=overwrite)  # fmt: skip
    d = card.data
    console.print(f"{d['programs']} programs ({d['successful']} successful) of {d['tasks']} tasks "
                  f"on {len(d['hardware'])} hardware → {out}")  # fmt: skip


@app.command("select")
def select(
    out: Annotated[Path, typer.Option("--out", metavar="DIR", help="Directory for the dataset.")],
    selector: Annotated[
        str,
        typer.Option(
            metavar="NAME",
            help="random | diversity | balto | balto-weighted | uncertainty | alt.",
        ),
    ],
    fraction: Annotated[float, typer.Option(metavar="F", help="Share of the programs to keep.")],
    dataset: Annotated[
        str,
        typer.Option(metavar="DATASET", help="A dataset directory, or pool / default (shipped)."),
    ] = "pool",
    seed: Annotated[int, typer.Option(metavar="N", help="Seed of the selection.")] = 0,
    hardware: Annotated[
        str | None,
        typer.Option(metavar="HW", help="The hardware to select on, when there are several."),
    ] = None,
    held_out: Annotated[
        str,
        typer.Option(
            metavar="NET[,NET...]",
            help="Networks whose tasks are left out (default: the card's held_out).",
        ),
    ] = "",
    param: ModelParamOpt = None,
    overwrite: OverwriteOpt = False,
) -> None:
    """Write one selector's picks of a dataset's programs as a dataset that train reads, so a
    selection can be checked on any test tasks.  The selectors that read a model fit an xgb
    one as bench al does: give bench al's xgb settings (--param xgb.KEY=VALUE) to get the
    picks it scored.

    Example: tensortune dataset select --selector balto --fraction 0.05 --seed 0 --out picks
    """
    from tensortune.train.selection import select_dataset

    rename_options({"out": "--out", "fraction": "--fraction", "selector": "--selector"})
    with console.status(f"selecting with {selector}..."):
        # "a,b" is split by the API; none given: the card's
        card = select_dataset(dataset, selector, fraction, out, seed=seed, hardware=hardware,
                              held_out=held_out or None, params=_acquisition_params(param),
                              overwrite=overwrite)  # fmt: skip
    sel = card["selection"]
    console.print(f"{sel['programs']} of {sel['of']} programs ({card['tasks']} tasks) on "
                  f"{sel['hardware']} → {out}")  # fmt: skip


def _acquisition_params(param: list[str] | None) -> dict | None:
    """``--param`` options of ``dataset select``: the settings of its xgb acquisition model."""
    settings = model_params(param)
    other = sorted(set(settings) - {"xgb"})
    if other:
        raise TensortuneError(f"the selectors read an xgb model: {other[0]} settings do not "
                              "apply", param="params")  # fmt: skip
    return settings.get("xgb")


@app.command("prune")
def prune(
    out: Annotated[Path, typer.Option("--out", metavar="DIR", help="Directory for the dataset.")],
    keep: Annotated[float, typer.Option(metavar="F", help="Share of the programs to keep.")],
    method: Annotated[
        str,
        typer.Option(
            metavar="NAME",
            help="random | cluster | cluster-global | low-perf | shape-dedup | auto (the "
            "study's best).",
        ),
    ] = "auto",
    dataset: Annotated[
        str,
        typer.Option(metavar="DATASET", help="A dataset directory, or default / pool (shipped)."),
    ] = "default",
    seed: Annotated[int, typer.Option(metavar="N", help="Seed of the random choices.")] = 0,
    overwrite: OverwriteOpt = False,
) -> None:
    """Write the programs a pruning method keeps of every task of a dataset (all its
    hardware) as a dataset that train reads.

    Example: tensortune dataset prune --method auto --keep 0.45 --out pruned
    """
    from tensortune.train.pruning import prune_dataset

    rename_options({"out": "--out", "keep": "--keep", "method": "--method"})
    with console.status(f"pruning with {method}..."):
        card = prune_dataset(dataset, method, keep, out, seed=seed, overwrite=overwrite)
    p = card["pruning"]
    console.print(f"kept {p['programs']} of {p['of']} programs ({card['tasks']} tasks) with "
                  f"{p['method']} → {out}")  # fmt: skip


@app.command("recheck")
def recheck(
    out: Annotated[Path, typer.Option("--out", metavar="DIR", help="Directory for the dataset.")],
    dataset: Annotated[
        str,
        typer.Option(metavar="DATASET", help="A dataset directory, or default / pool (shipped)."),
    ] = "default",
    remeasure: Annotated[
        bool,
        typer.Option(
            "--remeasure/--drop-only",
            help="Re-time suspects measured on this machine (others are always dropped).",
        ),
    ] = True,
    overwrite: OverwriteOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Find rows whose timings cannot be trusted (whole scheduler ticks, repeats far apart),
    re-measure those measured on this machine, drop the rest, and write the result with
    labels recomputed; the card records what changed.

    Example: tensortune dataset recheck --dataset default --out ttset-checked
    """
    from tensortune.datasets.recheck import recheck_dataset

    rename_options({"out": "--out"})
    with Reporter(console, quiet=as_json) as reporter:
        report = recheck_dataset(dataset, out, remeasure=remeasure, progress=reporter.line,
                                 overwrite=overwrite)  # fmt: skip
    if as_json:
        print_json(report)
        return
    columns = {"hardware": "left", "tick": "right", "spread": "right", "re-measured": "right",
               "dropped": "right", "old / new": "right"}  # fmt: skip
    t = table(f"{report['source']} → {out}", columns)
    for hw, r in report["hardware"].items():
        ratio = r["median_old_over_new"]
        t.add_row(hw, str(r["tick"]), str(r["spread"]), str(r["remeasured"]), str(r["dropped"]),
                  "-" if ratio is None else f"{ratio:.2f}")  # fmt: skip
    print_table(t)


@app.command("lower")
def lower(
    dataset: Annotated[
        str,
        typer.Option(metavar="DATASET", help="A dataset directory, or default / pool (shipped)."),
    ] = "default",
    workers: Annotated[
        int, typer.Option(min=1, help="Processes lowering programs in parallel.")
    ] = usable_cores(),
    as_json: JsonOpt = False,
) -> None:
    """Compute the lowered-loop features (the register tile TVM hands LLVM) of a dataset's
    programs into lowered.parquet beside its table, so that models with `--param lowered=1`
    can train on it.  ~13 ms a program on a 2-core machine (benchmarks/RESULTS.md, stop
    54); a killed run resumes where it stopped.

    Example: tensortune dataset lower --dataset my-dataset
    """
    from tensortune.datasets.lowered import lower_dataset

    with Reporter(console, quiet=as_json) as reporter:
        bar = reporter.bar("lowering programs", None)
        report = lower_dataset(
            dataset, workers=workers,
            progress=lambda n, total: reporter.update(bar, completed=n, total=total),
        )  # fmt: skip
    if as_json:
        print_json(report)
        return
    console.print(f"{report['file']}: {report['programs']} programs ({report['lowered_now']} "
                  f"lowered now, {report['failed']} could not be lowered)")  # fmt: skip


@app.command("info")
def info(
    dataset: Annotated[
        str,
        typer.Argument(
            metavar="DATASET",
            help="Dataset directory, or a shipped dataset: default (the main one) or pool.",
        ),
    ] = "default",
    as_json: JsonOpt = False,
) -> None:
    """Programs, tasks, hardware and networks of a dataset, and the shipped models fitted on it.

    Example: tensortune dataset info default --json
    """
    from tensortune.costmodel.shipped import models_trained_on
    from tensortune.datasets.build import checked_file, read_card
    from tensortune.datasets.lowered import lowered_state
    from tensortune.datasets.shipped import dataset_path
    from tensortune.errors import about
    from tensortune.train.metrics import RANK_METRICS

    rename_options({"dataset": "DATASET"})
    with about("dataset"):
        card = read_card(dataset_path(dataset))
        checked_file(dataset_path(dataset), card)  # a card alone is not a dataset
    d = card.data
    summary = {k: d[k] for k in ("programs", "successful", "tasks", "networks")}
    summary["hardware"] = sorted(d["hardware"])
    summary["feature_schema"] = d["feature_schema"]
    if d.get("held_out"):
        summary["held_out"] = d["held_out"]
    summary["lowered"] = lowered_state(dataset_path(dataset))
    models = models_trained_on(d.get("name", ""))
    if as_json:
        print_json({**summary, "shipped_models": models} if models else summary)
        return
    for key, value in summary.items():
        console.print(f"{key:15s} {', '.join(value) if isinstance(value, list) else value}")
    for name, m in models.items():  # what `tune --cost-model default` serves, and how good
        test = m.get("test", {})
        figures = ", ".join(f"{k} {test[k]:.3f}" for k in RANK_METRICS if k in test)
        console.print(f"{'shipped model':15s} {name}: {m['kind']}, {m.get('train_programs')} "
                      f"programs, split {m.get('split')}; on its test rows {figures}")  # fmt: skip
