"""``tensortune dataset``: collect measured programs, build and describe datasets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from tensortune.cli.display import console
from tensortune.cli.options import JsonOpt, RecordsOpt, WorkDirOpt, rename_options
from tensortune.cli.progress import Reporter
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
    config: Annotated[
        list[str] | None,
        typer.Option(
            "--config",
            metavar="NAME",
            help="Hardware configuration, e.g. avx2-1c; repeatable (default: "
            "avx512-2c and avx2-1c).",
        ),
    ] = None,
    trials_per_task: Annotated[
        int,
        typer.Option(
            "--trials-per-task",
            "--per-task",
            metavar="N",
            help="Programs to measure of each task on each configuration.",
        ),
    ] = 64,
    evolved_share: Annotated[
        float,
        typer.Option(
            metavar="SHARE",
            help="Share of each task's programs from evolutionary search, e.g. 0.5; "
            "the rest are random samples of its design space.",
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
) -> None:
    """Measure programs of every task of the networks on each hardware configuration.

    Resumable: running it again tops up each task to --trials-per-task programs.

    Example: tensortune dataset collect --network resnet18 --config avx2-1c --records
    sqlite:///collect.db
    """
    from tensortune.collect import DEFAULT_CONFIGS, CollectStep
    from tensortune.collect import collect as run_collect

    configs = config or list(DEFAULT_CONFIGS)
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

        rename_options({"programs_per_task": "--trials-per-task"})
        result = run_collect(network or None, configs=configs, programs_per_task=trials_per_task,
                             evolved_share=evolved_share, records=records, work_dir=work_dir,
                             progress=progress, worker=worker)  # fmt: skip
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
) -> None:
    """Turn records into a Parquet dataset with labels and cached features.

    Example: tensortune dataset build ds --records sqlite:///collect.db
    """
    from tensortune.datasets.build import build_dataset

    rename_options({"out_dir": "DIR"})
    with console.status("replaying traces and extracting features..."):
        card = build_dataset(records, out, description=description)
    d = card.data
    console.print(f"{d['programs']} programs ({d['successful']} successful) of {d['tasks']} tasks "
                  f"on {len(d['hardware'])} hardware → {out}")  # fmt: skip


@app.command("info")
def info(
    dataset: Annotated[
        str,
        typer.Argument(
            metavar="DATASET",
            help="Dataset directory, or default (the dataset shipped with tensortune).",
        ),
    ] = "default",
    as_json: JsonOpt = False,
) -> None:
    """Programs, tasks, hardware and networks of a dataset.

    Example: tensortune dataset info default --json
    """
    from tensortune.datasets.build import read_card
    from tensortune.datasets.shipped import dataset_path
    from tensortune.errors import about

    rename_options({"dataset": "DATASET"})
    with about("dataset"):
        d = read_card(dataset_path(dataset)).data
    summary = {k: d[k] for k in ("programs", "successful", "tasks", "networks")}
    summary["hardware"] = sorted(d["hardware"])
    summary["feature_schema"] = d["feature_schema"]
    if as_json:
        print(json.dumps(summary))
        return
    for key, value in summary.items():
        console.print(f"{key:15s} {', '.join(value) if isinstance(value, list) else value}")
