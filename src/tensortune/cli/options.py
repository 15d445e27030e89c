"""Options several commands share, and how an API error names the option the user typed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from tensortune.errors import TensortuneError

RecordsOpt = Annotated[
    str,
    typer.Option("--records", metavar="URL",
                 help="Records store URL, e.g. sqlite:///records.db (sqlite:////abs/path.db)."),
]  # fmt: skip
TargetOpt = Annotated[
    str | None,
    typer.Option("--target", metavar="JSON",
                 help='TVM target as a JSON object, e.g. \'{"kind":"llvm","mcpu":"znver4"}\' '
                 "(num-cores defaults to this machine's usable cores). Default: this CPU with "
                 "its real mcpu."),
]  # fmt: skip
WorkDirOpt = Annotated[
    Path,
    typer.Option("--work-dir", metavar="DIR",
                 help="Logs (MetaSchedule's per task, the workers') go to DIR/logs."),
]  # fmt: skip
ModelParamOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--param", metavar="KIND.KEY=VALUE", help="A model setting, e.g. mlp.epochs=20; repeatable."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")]
OverwriteOpt = Annotated[
    bool, typer.Option("--overwrite", help="Replace a dataset already in the output directory.")
]
WorkloadOpt = Annotated[
    list[str] | None,
    typer.Option("--workload", "-w", metavar="SPEC",
                 help="Operator spec, e.g. matmul:512,512,512 (see `tensortune workloads`), or "
                 "a TVMScript .py file; repeatable."),
]  # fmt: skip
ModelOpt = Annotated[
    str | None,
    typer.Option("--model", "-m", metavar="NET",
                 help="Zoo network, e.g. resnet18 (see `tensortune workloads`), or an .onnx "
                 "file."),
]  # fmt: skip
InputShapeOpt = Annotated[
    list[str] | None,
    typer.Option("--input-shape", metavar="NAME=D,D,...",
                 help="The shape of an ONNX model's input that the file leaves dynamic, e.g. "
                 "input=1,3,224,224 (repeatable)."),
]  # fmt: skip
WorkloadsFromOpt = Annotated[
    Path | None,
    typer.Option("--workloads-from", metavar="DIR",
                 help="Every workload of a MetaSchedule JSON database directory."),
]  # fmt: skip
FastMathOpt = Annotated[
    bool,
    typer.Option("--fast-math/--no-fast-math",
                 help="Approximate float32 exp, tanh and erf with TVM's vectorizing fast_* "
                 "polynomials (within a few float32 ulps; `tune --check`, its default, "
                 "compares an operator's kernels with the exact workload, a model's with "
                 "their unscheduled build). On by default: LLVM's scalar exp left a tuned "
                 "softmax 4x slower than PyTorch's."),
]  # fmt: skip

WinogradOpt = Annotated[
    bool,
    typer.Option("--winograd/--no-winograd",
                 help="Run a model's 3x3 stride-1 convolutions with enough channels and output "
                 "tiles as Winograd F(4x4, 3x3), or F(2x2, 3x3) on small images (4x or "
                 "2.25x fewer multiply-adds; see workloads/winograd.py). On by default; tune "
                 "and compile must agree, as the tasks differ (a store tuned before Winograd "
                 "was the default holds direct ones)."),
]  # fmt: skip

DraftOptionOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--draft-option",
        metavar="KEY=VALUE",
        help="A setting of draft-then-verify, e.g. population=256 or seeds=0 (also "
        "draft_size, redraft_every, per_round, eps, build_cost_weight, ...); repeatable.",
    ),
]

# API parameters whose option is not ``--`` + the name with dashes.
_OPTION_NAMES = {
    "workloads": "--workload",
    "methods": "--method",
    "seeds": "--seed",
    "draft_options": "--draft-option",
    "params": "--param",
    "online": "--online/--frozen/--moa",
    "online_cost_model": "--online/--frozen/--moa",
    "configs": "--config",
    "networks": "--network",
    "programs_per_task": "--trials-per-task",
    "max_trials_per_task": "--trials-per-task",
    "hardware_id": "--hardware",
    "sources": "--from",
    "input_shapes": "--input-shape",
}


# What the running command calls some parameters (e.g. a positional argument's name).
_renamed: dict[str, str] = {}


def rename_options(names: dict[str, str]) -> None:
    """Name these API parameters so in errors of the running command."""
    _renamed.update(names)


def forget_renamed_options() -> None:
    """Start a command line with no renames left from the previous one (``run`` may be
    called many times in one process)."""
    _renamed.clear()


def option_name(param: str) -> str:
    """The command-line name of an API parameter (``cost_model`` → ``--cost-model``)."""
    for names in (_renamed, _OPTION_NAMES):
        if param in names:
            return names[param]
    if param.startswith("-"):  # already an option's name
        return param
    return "--" + param.replace("_", "-")


def key_values(pairs: list[str], option: str) -> dict[str, str]:
    """``["k=v", ...]`` as a dict; a clear error for a pair without ``=``."""
    bad = [p for p in pairs if "=" not in p or p.startswith("=")]
    if bad:
        raise TensortuneError(f"expected KEY=VALUE, got {bad[0]!r}", param=option)
    return dict(p.split("=", 1) for p in pairs)


def input_shapes(pairs: list[str] | None) -> dict[str, list[int]] | None:
    """``--input-shape NAME=D,D,...`` options as ``load_model``'s ``input_shapes``."""
    if not pairs:
        return None
    out = {}
    for name, dims in key_values(pairs, "--input-shape").items():
        try:
            shape = [int(d) for d in dims.split(",")]
        except ValueError:
            shape = []
        if not shape or min(shape) < 1:
            raise TensortuneError(f"{name}={dims}: expected positive sizes such as 1,3,224,224",
                                  param="--input-shape")  # fmt: skip
        out[name] = shape
    return out


MAX_DURATION_S = 366 * 24 * 3600  # a longer --time is a typo, not a budget
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?")


def parse_duration(text: str, param: str) -> float:
    """Seconds in ``20m``, ``90s``, ``90``, ``1h30m``, ``1.5h``; a one-line error otherwise."""
    plain = text.strip().lower()
    m = _DURATION.fullmatch(plain)
    if m is None or not any(m.groups()):
        raise TensortuneError(f"expected a duration such as 20m, 90s or 1h30m, got {text!r}",
                              param=param)  # fmt: skip
    if m.group(3) and (m.group(1) or m.group(2)) and not plain.endswith("s"):
        # "1h30" read as 1 h 30 s would be a surprise: a unit after the last number, please
        raise TensortuneError(f"{text!r}: give the last number its unit, e.g. 1h30m",
                              param=param)  # fmt: skip
    h, mins, secs = (float(g) if g else 0.0 for g in m.groups())
    seconds = 3600 * h + 60 * mins + secs
    if not 0 < seconds <= MAX_DURATION_S:
        raise TensortuneError(f"must be positive and at most a year, got {text!r}", param=param)
    return seconds


def model_params(param: list[str] | None) -> dict[str, dict]:
    """``--param KIND.KEY=VALUE`` options as each model kind's settings."""
    from tensortune.costmodel.registry import check_settings, model_settings
    from tensortune.errors import about

    settings: dict[str, dict] = {}
    with about("params"):
        for key, value in key_values(param or [], "--param").items():
            kind, _, name = key.partition(".")
            if not name:
                raise TensortuneError(f"expected KIND.KEY=VALUE, got {key}={value}")
            settings.setdefault(kind, {}).update(model_settings(kind, {name: value}))
        for kind, given in settings.items():  # as a whole: a width and its heads go together
            check_settings(kind, given)
    return settings
