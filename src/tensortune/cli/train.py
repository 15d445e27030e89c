"""``tensortune train`` and ``tensortune evaluate``: cost models on datasets."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tensortune.cli.display import console, fmt_metric, print_json, print_table, table
from tensortune.cli.options import JsonOpt, TargetOpt, key_values
from tensortune.cli.progress import Reporter
from tensortune.errors import TensortuneError

DatasetOpt = Annotated[
    str | None,
    typer.Option("--dataset", metavar="DIR",
                 help="Dataset directory (from `tensortune dataset build`), or the name of a "
                 "shipped dataset: default (the main one, ttset-cpu-v6), pool (the dense pool) or "
                 "an older version by name (ttset-cpu-v1 to v5)."),
]  # fmt: skip
SplitOpt = Annotated[
    str | None,
    typer.Option(metavar="SPLIT",
                 help="within-task | by-task[:SEED] | by-network:NET[,NET] | by-hardware:HW[,HW], "
                 "e.g. by-network:bert-base."),
]  # fmt: skip
# Before --cost-model, train and evaluate called the cost model --model; still accepted.
OldModelOpt = Annotated[str | None, typer.Option("--model", hidden=True)]


def _one(cost_model: str | None, old: str | None, default: str | None = None) -> str:
    if cost_model is not None and old is not None:
        raise TensortuneError("give --cost-model once (--model is its old name)",
                              param="cost_model")  # fmt: skip
    chosen = cost_model or old or default
    if chosen is None:
        raise TensortuneError("missing: give a model file or default", param="cost_model")
    return chosen


def train(
    dataset: DatasetOpt = None,
    cost_model: Annotated[
        str | None,
        typer.Option(
            "--cost-model",
            metavar="KIND",
            help="xgb (the default) | lgbm | mlp | tlp | pacm | hwattn (attention over statements, "
            "conditioned on the hardware) | ms-xgb (MetaSchedule's XGBModel).",
        ),
    ] = None,
    split: SplitOpt = "within-task",
    out: Annotated[
        Path | None, typer.Option("--out", metavar="FILE", help="Write the model file, e.g. m.ttm.")
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            metavar="KEY=VALUE",
            help="A setting of the model, e.g. members=5 (an ensemble of mlp, tlp, pacm or "
            "hwattn), n_rounds=100, or lowered=1 (xgb, lgbm, pacm: read the lowered-loop "
            "features of `tensortune dataset lower`); repeatable.",
        ),
    ] = None,
    as_json: JsonOpt = False,
    model: OldModelOpt = None,
) -> None:
    """Fit a cost model on a dataset split and report TenSet's metrics on its test part.

    Example: tensortune train --dataset default --cost-model pacm --split by-network:bert-base
    --out pacm.ttm
    """
    from tensortune.costmodel.registry import model_class, model_settings
    from tensortune.errors import about
    from tensortune.train.trainer import train as run_train

    kind = _one(cost_model, model, "xgb")
    if dataset is None:
        raise TensortuneError("missing: give a dataset directory or default", param="dataset")
    with about("cost_model"):
        model_class(kind)  # an unknown kind is the option's fault, not --param's
    with about("params"):
        params = model_settings(kind, key_values(param or [], "params"))
    with Reporter(console, quiet=as_json) as reporter:
        bars: dict[str, object] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in bars:
                what = {"read": "reading the dataset", "fit": f"fitting {kind}",
                        "score": "scoring the test split"}[stage]  # fmt: skip
                reporter.line(what)
                bars[stage] = reporter.bar(what, total=total)
            reporter.update(bars[stage], completed=done, total=total)  # type: ignore[arg-type]

        result = run_train(dataset, cost_model=kind, split=split or "within-task", out=out,
                           params=params, progress=progress)  # fmt: skip
    summary = {**result.metrics, "train_programs": result.train_programs,
               "fit_seconds": result.fit_seconds,
               "predict_programs_per_second": result.predict_per_second}  # fmt: skip
    if as_json:
        print_json(summary)
        return
    _metrics_table(f"{kind} on {dataset} ({split})", summary)
    if out is not None:
        console.print(f"model written to {out}")


def evaluate(
    cost_model: Annotated[
        str | None,
        typer.Option(
            "--cost-model",
            metavar="MODEL",
            help="A model file from `tensortune train`, or default (the model shipped "
            "for --target, as `tune --cost-model default` picks it).",
        ),
    ] = None,
    dataset: DatasetOpt = None,
    split: SplitOpt = None,
    test_records: Annotated[
        Path | None,
        typer.Option(
            "--test-records",
            metavar="DIR",
            help="A MetaSchedule JSON database directory to test on instead.",
        ),
    ] = None,
    measured_here: Annotated[
        bool,
        typer.Option(
            "--measured-here",
            help="--test-records were measured on this machine: their rows carry its hardware "
            "vector, as finetune reads them (else a stand-in machine's).",
        ),
    ] = False,
    target: TargetOpt = None,
    as_json: JsonOpt = False,
    plot: Annotated[
        Path | None,
        typer.Option(
            metavar="PNG", help="Write a picture: predicted vs measured, and the top-k curve."
        ),
    ] = None,
    model: OldModelOpt = None,
) -> None:
    """Score a cost model with TenSet's metrics on a dataset split or on records measured
    elsewhere (the split defaults to the one the model was trained with).

    Example: tensortune evaluate --cost-model default --test-records my_db --json
    """
    from tensortune.train.trainer import evaluate as run_evaluate

    chosen = _one(cost_model, model)
    with console.status("scoring..."):
        scores = run_evaluate(chosen, dataset=dataset, split=split, test_records=test_records,
                              plot=plot, target=target, measured_here=measured_here)  # fmt: skip
    if as_json:
        print_json(scores)
        return
    _metrics_table(chosen, scores)


def finetune(
    cost_model: Annotated[
        str,
        typer.Option(
            "--model",
            "--cost-model",
            metavar="FILE",
            help="The model file to start from (from `tensortune train`).",
        ),
    ],
    records: Annotated[
        str,
        typer.Option(
            metavar="DIR_OR_DATASET",
            help="What the target machine measured: a MetaSchedule JSON database "
            "directory (taken as measured on this machine), a dataset directory, or a "
            "shipped dataset's name.",
        ),
    ],
    samples: Annotated[
        int, typer.Option(metavar="K", help="How many successful programs to fine-tune on.")
    ],
    out: Annotated[Path, typer.Option(metavar="FILE", help="Write the fine-tuned model here.")],
    seed: Annotated[
        int | None,
        typer.Option(
            metavar="S",
            help="Sample whole tasks in a seeded order (up to 16 programs "
            "each) instead of the first K programs measured.",
        ),
    ] = None,
    hardware: Annotated[
        str | None,
        typer.Option(
            metavar="HW",
            help="Of a dataset with several machines, this one's rows (e.g. avx512-1c).",
        ),
    ] = None,
    steps: Annotated[
        int, typer.Option(metavar="N", help="Optimizer steps on the sample (neural models).")
    ] = 100,
    validate: Annotated[
        bool,
        typer.Option(
            help="Choose how long to train (0, a quarter of --steps or all of them) by "
            "holding out part of the sample; --no-validate trains --steps steps.",
        ),
    ] = True,
    test_records: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            help="Also score before and after on this MetaSchedule JSON database (measured on "
            "this machine, as --records is).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Adapt a trained cost model to new hardware from K of its measurements (few-shot).

    Example: tensortune finetune --model hwattn.ttm --records my_db --samples 64 --out tuned.ttm
    """
    from tensortune.train.finetune import PER_TASK
    from tensortune.train.finetune import finetune as run_finetune
    from tensortune.train.metrics import RANK_METRICS

    with console.status(f"fine-tuning on {samples} programs..."):
        result = run_finetune(cost_model, records, samples=samples, seed=seed,
                              hardware=hardware, steps=steps, validate=validate,
                              out=out, test_records=test_records)  # fmt: skip
    summary: dict = {"samples": result.samples, "tasks": result.tasks, "steps": result.steps,
                     "out": str(out)}  # fmt: skip
    if result.samples < samples and not as_json:
        console.print(f"fine-tuned on {result.samples} programs, not the {samples} asked "
                      "for: the records have no more successful ones"
                      f"{f' (at most {PER_TASK} a task with --seed)' if seed is not None else ''}",
                      style="yellow")  # fmt: skip
    if result.before is not None:
        summary |= {f"{k}_before": result.before[k] for k in RANK_METRICS}
        summary |= {f"{k}_after": result.after[k] for k in RANK_METRICS}
    if as_json:
        print_json(summary)
        return
    _metrics_table(f"{cost_model} fine-tuned on {records}", summary)


def _metrics_table(title: str, values: dict) -> None:
    t = table(title, {"metric": "left", "value": "right"})
    for k, v in values.items():
        t.add_row(k, fmt_metric(v, ".4f"))
    print_table(t)
