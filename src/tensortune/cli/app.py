"""The ``tensortune`` command line: a thin layer over the Python API."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Annotated

import typer

from tensortune.cli.display import console, errors, fmt_seconds, progress_line, result_table
from tensortune.errors import TensortuneError, last_line
from tensortune.records.storage import DEFAULT_URL

app = typer.Typer(
    name="tensortune",
    help="Fast auto-tuning of tensor programs on Apache TVM MetaSchedule.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
records_app = typer.Typer(help="Inspect, import and export measurement records.",
                          no_args_is_help=True)  # fmt: skip
app.add_typer(records_app, name="records")
dataset_app = typer.Typer(help="Collect measured programs into datasets.", no_args_is_help=True)
app.add_typer(dataset_app, name="dataset")
bench_app = typer.Typer(help="Benchmarks of search methods.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

_state = {"debug": False}

RecordsOpt = Annotated[
    str, typer.Option("--records", help="Records store URL (sqlite:///file.db).")
]
TargetOpt = Annotated[
    str | None,
    typer.Option("--target", help='Target as JSON, e.g. \'{"kind":"llvm","mcpu":"znver4"}\'; '
                 "default: this CPU with its real mcpu and all cores."),
]  # fmt: skip


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks on errors.")] = False,
) -> None:
    _state["debug"] = debug


@app.command()
def tune(
    workload: Annotated[
        list[str] | None,
        typer.Option(
            "--workload",
            "-w",
            help="Operator spec (e.g. matmul:512,512,512) or TVMScript .py file; repeatable.",
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model", "-m", help="Zoo network name (see `tensortune workloads`) or an .onnx file."
        ),
    ] = None,
    workloads_from: Annotated[
        Path | None,
        typer.Option(
            "--workloads-from",
            help="Tune every workload of a MetaSchedule JSON database directory.",
        ),
    ] = None,
    trials: Annotated[int, typer.Option("--trials", "-n", help="Total trial budget.")] = 64,
    records: RecordsOpt = DEFAULT_URL,
    work_dir: Annotated[Path, typer.Option("--work-dir", help="Logs per task go here.")] = Path(
        "tensortune-work"
    ),
    target: TargetOpt = None,
    strategy: Annotated[
        str,
        typer.Option(
            help="evolutionary (MetaSchedule's) | draft-verify (analyzer drafts, cost model "
            "verifies) | replay-trace | replay-func"
        ),
    ] = "evolutionary",
    cost_model: Annotated[
        str,
        typer.Option(
            "--cost-model",
            help="MetaSchedule's xgb | random | mlp, a model file from `tensortune train`, or "
            "default (the pre-trained model shipped for the target).",
        ),
    ] = "xgb",
    online: Annotated[
        bool,
        typer.Option(
            "--online/--frozen", help="Refine a pre-trained cost model with each measured batch."
        ),
    ] = False,
    moa: Annotated[
        bool,
        typer.Option(
            "--moa",
            help="Momentum online adaptation (MoA) of a neural pre-trained cost model, from "
            "other hardware or this one's (--cost-model default); implies --online, and beat "
            "refining after every batch on our benchmark.",
        ),
    ] = False,
    trials_per_round: Annotated[
        int | None,
        typer.Option(
            help="Candidates measured per round (default: 64, fewer so each task gets a round)."
        ),
    ] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check/--no-check",
            help="Compare each candidate's output with an unscheduled reference build.",
        ),
    ] = True,
    seed: Annotated[int, typer.Option(help="Random seed of the search.")] = 0,
) -> None:
    """Tune operators, a TVMScript workload, a model or a database's workloads.

    Records go to the store as they are measured; running the same command again resumes and
    stops when the store holds --trials measurements of these tasks on this hardware.
    """
    from tensortune.tuning.tune import tune as run_tune

    failed_total = [0]

    def progress(i, task, batch, task_result) -> None:
        failed = sum(not r.ok for r in batch)
        failed_total[0] += failed
        console.print(progress_line(i, n_tasks[0], len(batch), failed, task_result))

    n_tasks = [0]
    from tensortune.hardware import parse_target
    from tensortune.tuning.tune import resolve_tasks

    tgt = parse_target(target)
    tasks = resolve_tasks(workload, model=model, workloads_from=workloads_from, target=tgt)
    n_tasks[0] = len(tasks)
    console.print(f"tuning {len(tasks)} task(s), {trials} trials, records {records}")
    result = run_tune(tasks, trials=trials, records=records, work_dir=work_dir, target=tgt,
                      strategy=strategy, cost_model=cost_model,
                      online_cost_model="moa" if moa else online,
                      trials_per_round=trials_per_round, check_correctness=check, seed=seed,
                      progress=progress)  # fmt: skip
    if result.trials_before >= trials:
        console.print(f"the store already holds {result.trials_before} trials of these tasks "
                      f"(budget {trials}): nothing to do")  # fmt: skip
    console.print(result_table(result))
    console.print(f"logs per task: {work_dir / 'logs'}")


@app.command()
def workloads(
    count_tasks: Annotated[
        bool,
        typer.Option(
            "--tasks/--no-tasks",
            help="Import each network to count its tuning tasks (takes a minute or two).",
        ),
    ] = True,
) -> None:
    """List the operator zoo (with its spec grammar) and the network zoo."""
    from rich.table import Table

    from tensortune.workloads.ops import OPS

    ops = Table(title="operators: --workload OP:PARAMS")
    ops.add_column("op")
    ops.add_column("parameters")
    for d in OPS.values():
        ops.add_row(d.name, d.doc)
    console.print(ops)
    from tensortune.workloads.networks import NETWORKS

    nets = Table(title="networks: --model NAME")
    for col in ("network", "tasks", "occurrences", "description"):
        nets.add_column(col, justify="right" if col in ("tasks", "occurrences") else "left")
    counts = _task_counts(list(NETWORKS)) if count_tasks else {}
    for name, d in NETWORKS.items():
        tasks, total = counts.get(name, ("-", "-"))
        nets.add_row(name, str(tasks), str(total), d.description)
    console.print(nets)


def _task_counts(names: list[str]) -> dict[str, tuple[int, int]]:
    from tensortune.workloads.catalog import task_counts

    with console.status("importing networks to count their tasks..."):
        return task_counts(names)


@records_app.command("stats")
def records_stats(records: RecordsOpt = DEFAULT_URL) -> None:
    """Records per workload, hardware and target, with the best latency."""
    from rich.table import Table

    from tensortune.hardware import current_hardware
    from tensortune.records.storage import open_records

    with open_records(records, create=False) as store:
        here = current_hardware().id
        hardware = store.hardware()
        t = Table(title=f"records in {records}")
        for col in ("workload", "hardware", "target", "records", "ok", "best"):
            t.add_column(col, justify="right" if col in ("records", "ok", "best") else "left")
        rows = store.summary()
        for name, wid, hw, tgt, n, ok, best in rows:
            hw_text = f"{hw} (this machine)" if hw == here else f"{hw} {hardware[hw].cpu_model}"
            short = json.loads(tgt)
            tgt_text = " ".join(f"{k}={v}" for k, v in short.items() if k not in ("keys", "tag"))
            t.add_row(f"{wid}: {name}", hw_text, tgt_text, str(n), str(ok), fmt_seconds(best))
        console.print(t)
        console.print(f"{sum(r[4] for r in rows)} records, {len(store.workloads())} workloads, "
                      f"{len(hardware)} hardware")  # fmt: skip


@records_app.command("export")
def records_export(
    directory: Annotated[Path, typer.Argument(help="New directory for the JSON database.")],
    records: RecordsOpt = DEFAULT_URL,
    top_k: Annotated[int | None, typer.Option("--top-k", help="The k best per workload.")] = None,
    hardware: Annotated[str | None, typer.Option(help="Hardware id (default: this one).")] = None,
) -> None:
    """Write records as a MetaSchedule JSON database (TVM's JSONDatabase loads it)."""
    from tensortune.records.interop import export_records
    from tensortune.records.storage import open_records

    with open_records(records, create=False) as store:
        done = export_records(store, directory, top_k=top_k, hardware_id=hardware)
    console.print(f"exported {done.records} records of {done.workloads} workloads "
                  f"(hardware {done.hardware_id}) to {directory}")  # fmt: skip


@records_app.command("import")
def records_import(
    directory: Annotated[Path, typer.Argument(help="A MetaSchedule JSON database directory.")],
    records: RecordsOpt = DEFAULT_URL,
    measured_here: Annotated[
        bool,
        typer.Option(
            "--measured-here",
            help="The records were measured on this machine: use them when tuning here.",
        ),
    ] = False,
) -> None:
    """Add a MetaSchedule JSON database's records to the store."""
    from tensortune.records.interop import import_records
    from tensortune.records.storage import open_records

    with open_records(records) as store:
        done = import_records(store, directory, measured_here=measured_here)
    console.print(f"imported {done.records} records of {done.workloads} workloads "
                  f"({done.skipped} already present) as hardware {done.hardware_id}")  # fmt: skip
    if not measured_here:
        console.print("they are not used when tuning on this machine; pass --measured-here "
                      "if they were measured here")  # fmt: skip


@dataset_app.command("collect")
def dataset_collect(
    network: Annotated[
        list[str] | None,
        typer.Option(
            "--network",
            help="Zoo network or .onnx file; repeatable (default: the whole network zoo).",
        ),
    ] = None,
    config: Annotated[
        list[str] | None,
        typer.Option(
            "--config", help="Hardware configuration; repeatable (default: avx512-2c and avx2-1c)."
        ),
    ] = None,
    per_task: Annotated[int, typer.Option("--per-task", help="Programs per task.")] = 64,
    evolved_share: Annotated[
        float,
        typer.Option(
            help="Share of each task's programs from evolutionary search; the rest are random."
        ),
    ] = 0.5,
    records: RecordsOpt = DEFAULT_URL,
    work_dir: Annotated[Path, typer.Option("--work-dir")] = Path("tensortune-work"),
) -> None:
    """Measure programs of every task of the networks on each hardware configuration.

    Resumable: running it again tops up each task to --per-task programs.
    """
    from tensortune.datasets.collect import DEFAULT_CONFIGS, collect

    def progress(cfg: str, i: int, n: int, task, have: int, want: int) -> None:
        console.print(f"[{cfg} {i + 1}/{n}] {task.name}: {min(have, want)}/{want} programs")

    result = collect(network or None, configs=config or DEFAULT_CONFIGS, programs_per_task=per_task,
                     evolved_share=evolved_share, records=records, work_dir=work_dir,
                     progress=progress)  # fmt: skip
    console.print(f"measured {result.measured} programs of {result.tasks} tasks on "
                  f"{', '.join(result.configs)} into {result.records_url}")  # fmt: skip


@dataset_app.command("build")
def dataset_build(
    out: Annotated[Path, typer.Argument(help="Directory for programs.parquet and card.json.")],
    records: RecordsOpt = DEFAULT_URL,
    description: Annotated[str, typer.Option(help="How the records were collected.")] = "",
) -> None:
    """Turn records into a Parquet dataset with labels and cached features."""
    from tensortune.datasets.build import build_dataset

    with console.status("replaying traces and extracting features..."):
        card = build_dataset(records, out, description=description)
    d = card.data
    console.print(f"{d['programs']} programs ({d['successful']} successful) of {d['tasks']} tasks "
                  f"on {len(d['hardware'])} hardware → {out}")  # fmt: skip


@dataset_app.command("info")
def dataset_info(
    dataset: Annotated[
        Path | None,
        typer.Argument(help="Dataset directory (default: the dataset shipped with tensortune)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
) -> None:
    """Programs, tasks, hardware and networks of a dataset."""
    from tensortune.datasets.build import read_card
    from tensortune.datasets.shipped import DATASET_DIR

    dataset = dataset or DATASET_DIR
    d = read_card(dataset).data
    info = {k: d[k] for k in ("programs", "successful", "tasks", "networks")}
    info["hardware"] = sorted(d["hardware"])
    info["feature_schema"] = d["feature_schema"]
    if as_json:
        print(json.dumps(info))
        return
    for key, value in info.items():
        console.print(f"{key:15s} {', '.join(value) if isinstance(value, list) else value}")


@app.command("train")
def train_cmd(
    dataset: Annotated[Path, typer.Option("--dataset", help="Dataset directory.")],
    model: Annotated[
        str, typer.Option("--model", help="xgb | lgbm | mlp | tlp | pacm | ms-xgb")
    ] = "xgb",
    split: Annotated[
        str, typer.Option(help="within-task | by-task | by-network:NET[,NET] | by-hardware:HW[,HW]")
    ] = "within-task",
    out: Annotated[Path | None, typer.Option("--out", help="Write the model file here.")] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param",
            help="KEY=VALUE setting of the model (e.g. members=5 for mlp, tlp, pacm: an "
            "ensemble); repeatable.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Fit a cost model on a dataset split and report TenSet's metrics on its test part."""
    from tensortune.costmodel.registry import model_settings
    from tensortune.train.trainer import train

    params = model_settings(model, _key_values(param or []))
    result = train(dataset, model=model, split=split, out=out, params=params)
    summary = {**result.metrics, "train_programs": result.train_programs,
               "fit_seconds": result.fit_seconds,
               "predict_programs_per_second": result.predict_per_second}  # fmt: skip
    if as_json:
        print(json.dumps(summary))
        return
    _metrics_table(f"{model} on {dataset} ({split})", summary)
    if out is not None:
        console.print(f"model written to {out}")


@app.command("evaluate")
def evaluate_cmd(
    model: Annotated[Path, typer.Option("--model", help="A model file from `train`.")],
    dataset: Annotated[Path | None, typer.Option("--dataset")] = None,
    split: Annotated[
        str | None,
        typer.Option(
            help="Split of --dataset to test on (default: the one the model was trained with)."
        ),
    ] = None,
    test_records: Annotated[
        Path | None,
        typer.Option(
            "--test-records", help="A MetaSchedule JSON database directory to test on instead."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    plot: Annotated[
        Path | None, typer.Option(help="Write a PNG: predicted vs measured, and the top-k curve.")
    ] = None,
) -> None:
    """Score a trained cost model with TenSet's metrics."""
    from tensortune.train.trainer import evaluate

    scores = evaluate(model, dataset=dataset, split=split, test_records=test_records, plot=plot)
    if as_json:
        print(json.dumps(scores))
        return
    _metrics_table(f"{model}", scores)


def _metrics_table(title: str, values: dict) -> None:
    from rich.table import Table

    t = Table(title=title)
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in values.items():
        t.add_row(k, f"{v:.4f}" if isinstance(v, float) else str(v))
    console.print(t)


@app.command("compile")
def compile_cmd(
    model: Annotated[str, typer.Argument(help="Zoo network name or .onnx file.")],
    records: RecordsOpt = DEFAULT_URL,
    target: TargetOpt = None,
    repeat: Annotated[
        int, typer.Option(help="Timed repeats of each build (fewer if they would take over 30 s).")
    ] = 10,
    rounds: Annotated[
        int, typer.Option(help="Rounds in which the tuned build and PyTorch eager take turns.")
    ] = 3,
    retime: Annotated[
        int,
        typer.Option(
            help="Time each task's best K records again, side by side, and build with the "
            "fastest (0: the stored best)."
        ),
    ] = 0,
) -> None:
    """Build a model with the tuned schedules and compare its latency."""
    from tensortune.deploy.compile import compile_model
    from tensortune.deploy.report import print_report

    report = compile_model(model, records=records, target=target, repeat=repeat, rounds=rounds,
                           retime=retime)  # fmt: skip
    print_report(report, console)


def main() -> None:
    try:
        app()
    except TensortuneError as e:
        if _state["debug"]:
            traceback.print_exc()
        errors.print(f"error: {e}")
        sys.exit(2)
    except KeyboardInterrupt:
        errors.print(
            "interrupted: measured records are saved; run the same command to resume",
        )
        sys.exit(130)
    except Exception as e:
        if _state["debug"]:
            traceback.print_exc()
        errors.print(f"error: {type(e).__name__}: {last_line(e)} "
                     "(run with --debug for the traceback)")  # fmt: skip
        sys.exit(1)


@bench_app.command("tune")
def bench_tune_cmd(
    workload: Annotated[
        list[str] | None,
        typer.Option("--workload", "-w", help="Operator spec or TVMScript file; repeatable."),
    ] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Zoo network.")] = None,
    workloads_from: Annotated[
        Path | None, typer.Option("--workloads-from", help="A MetaSchedule database directory.")
    ] = None,
    trials: Annotated[int, typer.Option("--trials", "-n", help="Trials per task.")] = 64,
    work_dir: Annotated[Path, typer.Option("--work-dir", help="Stores, logs, results.json.")] = (
        Path("tensortune-bench")
    ),
    target: TargetOpt = None,
    method: Annotated[
        list[str] | None,
        typer.Option("--method", help="default | draft | pretrained | moa; repeatable (all)."),
    ] = None,
    max_tasks: Annotated[
        int | None, typer.Option("--max-tasks", help="Keep the heaviest N tasks of a model.")
    ] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write the curves (PNG).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    seed: Annotated[
        list[int] | None,
        typer.Option(
            help="Random seed of the searches; repeatable: each seed runs in "
            "WORK_DIR/seed-N and the medians over seeds are reported."
        ),
    ] = None,
    draft_option: Annotated[
        list[str] | None,
        typer.Option(
            "--draft-option",
            help="KEY=VALUE setting of draft-then-verify (population, draft_size, "
            "redraft_every, per_round, eps, build_cost_weight, ...); repeatable.",
        ),
    ] = None,
    pretrained: Annotated[
        Path | None,
        typer.Option("--pretrained", help="Verifier of 'pretrained' (default: the shipped one)."),
    ] = None,
    moa_source: Annotated[
        Path | None,
        typer.Option(
            "--moa-source",
            help="Neural model MoA adapts (default: the shipped one of other configurations).",
        ),
    ] = None,
) -> None:
    """Compare search methods on the same tasks, budget, builder and runner.

    Reports each method's final latency, the search-time speedup over MetaSchedule's default
    (time to reach the default's final latency) and where the time went.
    """
    from tensortune.bench.tune import (
        METHODS,
        bench_tune,
        format_latency,
        plot_curves,
        summarize_seeds,
    )

    seeds = seed or [0]

    def progress(name, run) -> None:
        if not as_json:
            lat = run.curve[-1][2] if run.curve else None
            console.print(f"[{name}] {run.trials} trials, {run.curve[-1][0]:.0f} s, "
                          f"latency {format_latency(lat)}", highlight=False)  # fmt: skip

    results = []
    for s in seeds:
        where = work_dir if len(seeds) == 1 else work_dir / f"seed-{s}"
        results.append(bench_tune(workload, model=model, workloads_from=workloads_from,
                                  trials=trials, work_dir=where, target=target,
                                  methods=method or METHODS, max_tasks=max_tasks, seed=s,
                                  draft_options=_key_values(draft_option or []),
                                  pretrained=pretrained and str(pretrained),
                                  moa_source=moa_source and str(moa_source),
                                  progress=progress))  # fmt: skip
    plots = _plot_paths(plot, seeds)
    for result, path in zip(results, plots, strict=True):
        if path is not None:
            plot_curves(result, path)
    if as_json:
        if len(results) == 1:
            print(json.dumps(results[0].to_dict()))
        else:
            print(json.dumps({"runs": [r.to_dict() for r in results],
                              "summary": summarize_seeds(results)}))  # fmt: skip
        return
    for result, path in zip(results, plots, strict=True):
        _print_bench(result, trials, path)
    if len(results) > 1:
        summary = summarize_seeds(results)
        for m, v in summary["speedup"].items():
            each = ", ".join(_ratio(x) for x in v["seeds"])
            console.print(f"{m}: median speedup {_ratio(v['median'])} over seeds "
                          f"{seeds} ({each})", highlight=False)  # fmt: skip


def _key_values(pairs: list[str]) -> dict[str, str]:
    """``["k=v", ...]`` as a dict; a clear error for a pair without ``=``."""
    bad = [p for p in pairs if "=" not in p]
    if bad:
        raise TensortuneError(f"expected KEY=VALUE, got {bad[0]!r}")
    return dict(p.split("=", 1) for p in pairs)


def _plot_paths(plot: Path | None, seeds: list[int]) -> list[Path | None]:
    if plot is None:
        return [None] * len(seeds)
    if len(seeds) == 1:
        return [plot]
    return [plot.with_name(f"{plot.stem}-seed{s}{plot.suffix}") for s in seeds]


def _print_bench(result, trials: int, plot: Path | None) -> None:
    from rich.table import Table

    from tensortune.bench.tune import format_latency

    table = Table(title=f"{len(result.tasks)} task(s) x {trials} trials, seed {result.seed}")
    for col in ("method", "final latency", "wall", "speedup", "trial ratio", "build", "run",
                "model", "analyzer"):  # fmt: skip
        table.add_column(col)
    speedup, ratio = result.speedup, result.trial_ratio
    for name, run in result.runs.items():
        b = run.breakdown
        table.add_row(
            name, format_latency(run.final_latency), fmt_seconds(run.wall_s),
            _ratio(speedup.get(name)), _ratio(ratio.get(name)), fmt_seconds(b.get("build", 0)),
            fmt_seconds(b.get("run", 0)),
            fmt_seconds(b.get("model_predict", 0) + b.get("model_update", 0)),
            fmt_seconds(b.get("analyzer", 0)),
        )  # fmt: skip
    console.print(table)
    if plot is not None:
        console.print(f"curves: {plot}")


def _ratio(x: float | None) -> str:
    return "not reached" if x is None else f"{x:.2f}x"


if __name__ == "__main__":
    main()
