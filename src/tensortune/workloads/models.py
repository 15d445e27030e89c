"""Whole models → Relax → MetaSchedule tuning tasks.

Three sources: a zoo network name (see ``networks``), a path to an ``.onnx`` file, or a
``torch.nn.Module`` with example inputs.  Torch and ONNX are imported only on their routes, so
a tuning venv without them can still load the other kind.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tensortune.compat import ms, tvm
from tensortune.errors import WorkloadError, about, check_flags
from tensortune.workloads.inference import for_inference
from tensortune.workloads.networks import get_network, names_a_file
from tensortune.workloads.task import Task

if TYPE_CHECKING:
    import onnx
    import torch

# Importer messages that name the offending operators, ONNX and torch.export respectively.
_UNSUPPORTED_OP_PATTERNS = (
    re.compile(r"not supported for frontend ONNX: (.+)"),
    re.compile(r"Unsupported function types \[(.+)\]"),
)


@dataclass
class Model:
    """A model ready to tune.

    ``mod`` is the Relax module with weights bound as constants, before the fusion pipeline:
    what ``tvm.compile`` (untuned) or ``deploy.compile.build_tuned`` take.
    """

    name: str
    mod: tvm.IRModule
    tasks: list[Task]
    inputs: list[np.ndarray]
    torch_module: object | None = None
    torch_inputs: tuple | None = None


def load_model(
    source: str | os.PathLike[str] | torch.nn.Module,
    *,
    target: tvm.target.Target | dict | str | None,
    input_shapes: dict[str, list[int]] | None = None,
    example_inputs: tuple[torch.Tensor, ...] | torch.Tensor | None = None,
    name: str | None = None,
    fast_math: bool = True,
    winograd: bool = True,
    channels_last: bool = True,
) -> Model:
    """Import ``source`` and extract its tuning tasks for ``target``.

    ``source`` is a zoo network name, a path to an ``.onnx`` file (``input_shapes`` fixes its
    dynamic or missing input dimensions), or an ``nn.Module`` (``example_inputs`` required; the
    module is switched to eval mode).  ``name`` overrides the model's name.
    Batch norms are folded into convolutions, and ``fast_math`` replaces erf, exp and tanh
    (GELU, softmax) with vectorizable approximations, and ``channels_last`` runs 2-d
    convolutions in NHWC whatever the source's layout (see ``workloads.inference``), and
    ``winograd`` the eligible 3×3 stride-1 ones among them as Winograd F(4×4, 3×3) or, on
    small images, F(2×2, 3×3) (see ``workloads.winograd``).
    Raises ``WorkloadError`` for anything the user can fix.
    """
    check_flags(fast_math=fast_math, winograd=winograd, channels_last=channels_last)
    if not isinstance(target, tvm.target.Target):  # a dict, JSON text, a Platform, None
        from tensortune.hardware import resolve_platform

        with about("target"):
            target = resolve_platform(target, measurable=False).tvm_target
    rewrites = {"fast_math": fast_math, "winograd": winograd, "channels_last": channels_last}
    if _is_torch_module(source):
        if example_inputs is None:
            raise WorkloadError("an nn.Module source needs example_inputs=(tensor, ...)")
        _reject_input_shapes(input_shapes)
        if isinstance(example_inputs, sys.modules["torch"].Tensor):
            example_inputs = (example_inputs,)  # tuple() would split a lone tensor along dim 0
        module_name = name or type(source).__name__
        return _from_torch(module_name, source, tuple(example_inputs), target, rewrites)
    if not isinstance(source, str | os.PathLike):
        raise WorkloadError(
            f"cannot load a model from {type(source).__name__}; "
            "give a network name, an .onnx path or an nn.Module"
        )
    if names_a_file(source):
        path = Path(source)
        return _from_onnx(name or path.stem, path, target, input_shapes, rewrites)
    network = get_network(str(source))
    _reject_input_shapes(input_shapes)
    import torch

    with torch.random.fork_rng(devices=[]):  # the caller's torch RNG, untouched
        module, inputs = network.make()
    return _from_torch(name or network.name, module, inputs, target, rewrites)


# --------------------------------------------------------------------------------------------
# Source dispatch


def _is_torch_module(source: object) -> bool:
    # an nn.Module can only exist if torch is already imported, so there is no need to import it
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(source, torch.nn.Module)


def _reject_input_shapes(input_shapes: dict[str, list[int]] | None) -> None:
    # torch sources have fixed example inputs; ignoring the option silently would mislead
    if input_shapes:
        raise WorkloadError("input shapes (--input-shape) apply to ONNX models only")


# --------------------------------------------------------------------------------------------
# torch route: torch.export → Relax with parameters → weights bound as constants


def _from_torch(
    name: str,
    module: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    target: tvm.target.Target,
    rewrites: dict[str, bool],
) -> Model:
    import torch
    from tvm.relax.frontend.torch import from_exported_program

    if not all(isinstance(t, torch.Tensor) for t in inputs):
        raise WorkloadError(f"example inputs of {name} must all be torch.Tensor")
    try:  # the model's inputs are NumPy arrays: refused now, not after the import
        arrays = [t.detach().cpu().numpy() for t in inputs]
    except TypeError as exc:
        raise WorkloadError(f"example inputs of {name}: {_first_line(exc)} (NumPy has no such "
                            "dtype; give float32 inputs)") from None  # fmt: skip
    module = module.eval()
    with warnings.catch_warnings():
        # torch 2.13 warns about its own deprecated LeafSpec while copying the exported program
        warnings.filterwarnings("ignore", message=r".*treespec, LeafSpec", category=FutureWarning)
        try:
            exported = torch.export.export(module, inputs)
        except Exception as exc:
            raise WorkloadError(f"torch.export failed for {name}: {_first_line(exc)}") from exc
        try:
            mod = from_exported_program(
                exported, keep_params_as_input=True, unwrap_unit_return_tuple=True
            )
        except Exception as exc:
            raise _import_error(name, exc) from exc
    mod = for_inference(_bind_params(mod), **rewrites)
    return Model(
        name=name,
        mod=mod,
        tasks=_extract_tasks(name, mod, target),
        inputs=arrays,
        torch_module=module,
        torch_inputs=inputs,
    )


def _bind_params(mod: tvm.IRModule) -> tvm.IRModule:
    """Turn the importer's weight parameters into constants of ``main``."""
    from tvm import relax

    num_inputs = int(mod["main"].attrs["num_input"])
    mod, detached = relax.frontend.detach_params(mod)
    # detach_params gives {"main": [Tensor, ...]} in parameter order; BindParams wants names
    weights = detached.get("main", [])
    params = {var.name: w for var, w in zip(mod["main"].params[num_inputs:], weights, strict=True)}
    return relax.transform.BindParams("main", params)(mod) if params else mod


# --------------------------------------------------------------------------------------------
# ONNX route


def _from_onnx(
    name: str,
    path: Path,
    target: tvm.target.Target,
    input_shapes: dict[str, list[int]] | None,
    rewrites: dict[str, bool],
) -> Model:
    from tvm.relax.frontend.onnx import from_onnx

    graph = _read_onnx(path)
    shapes, dtypes = _onnx_inputs(graph, input_shapes or {})
    try:
        mod = from_onnx(graph, shape_dict=shapes)  # weights become constants
    except Exception as exc:
        raise _import_error(name, exc) from exc
    mod = for_inference(mod, **rewrites)
    rng = np.random.default_rng(0)
    inputs = [_example_array(rng, shapes[k], dtypes[k]) for k in shapes]
    return Model(name=name, mod=mod, tasks=_extract_tasks(name, mod, target), inputs=inputs)


def _read_onnx(path: Path) -> onnx.ModelProto:
    import onnx

    if path.is_dir():
        raise WorkloadError(f"{path} is a directory, not an ONNX model file")
    if not path.is_file():
        raise WorkloadError(f"model file not found: {path}")
    try:
        graph = onnx.load(str(path))
    except Exception as exc:
        raise WorkloadError(f"cannot read ONNX file {path}: {_first_line(exc)}") from exc
    # protobuf parses many garbage byte strings without complaint, into an empty model
    if not graph.graph.node:
        raise WorkloadError(f"{path} is not a valid ONNX model (its graph has no nodes)")
    return graph


def _onnx_inputs(
    graph: onnx.ModelProto, overrides: dict[str, list[int]]
) -> tuple[dict[str, list[int]], dict[str, np.dtype]]:
    """Static shape and dtype of each real graph input (initializers excluded)."""
    from onnx.helper import tensor_dtype_to_np_dtype

    weights = {init.name for init in graph.graph.initializer}
    inputs = [value for value in graph.graph.input if value.name not in weights]
    unknown = sorted(set(overrides) - {value.name for value in inputs})
    if unknown:
        names = [value.name for value in inputs]
        raise WorkloadError(f"the input shapes given name {unknown}, but the model's inputs "
                            f"are {names}")  # fmt: skip
    shapes: dict[str, list[int]] = {}
    dtypes: dict[str, np.dtype] = {}
    for value in inputs:
        if not value.type.HasField("tensor_type") or not value.type.tensor_type.elem_type:
            raise WorkloadError(
                f"ONNX input {value.name!r} is not a tensor of a known element type "
                "(a sequence, map or optional, or untyped)"
            )
        tensor = value.type.tensor_type
        dtype = np.dtype(tensor_dtype_to_np_dtype(tensor.elem_type))
        # bfloat16 and the float8s come from ml_dtypes, as kind "V": TVM built the fallback
        # kernel of a bfloat16 MatMul wrongly (a dtype mismatch deep in the build), and an
        # example input of them would be zeros.
        if dtype.kind not in "biuf":
            raise WorkloadError(f"ONNX input {value.name!r} is {dtype.name}; tensortune compiles "
                                "models with float, integer and boolean inputs (cast it to "
                                "float32)")  # fmt: skip
        dtypes[value.name] = dtype
        dims = [d.dim_value if d.dim_value > 0 else None for d in tensor.shape.dim]
        if value.name in overrides:
            given = _given_shape(value.name, overrides[value.name])
            # Checked here: TVM's importer fails deep inside on a wrong rank, with lines on
            # both streams and a message cut short.  A fixed size may be overridden (a model
            # exported at batch 1 may run at 8 where its graph does not hard-code it).
            if tensor.HasField("shape") and len(given) != len(dims):
                declared = [d or dim.dim_param or "?" for d, dim in zip(dims, tensor.shape.dim,
                                                                        strict=True)]  # fmt: skip
                raise WorkloadError(f"input shape {value.name}={','.join(map(str, given))} has "
                                    f"{len(given)} dimensions; the model's has {len(dims)}: "
                                    f"{declared}")  # fmt: skip
            shapes[value.name] = given
            continue
        if not tensor.HasField("shape") or None in dims:
            shown = [d.dim_value or d.dim_param or "?" for d in tensor.shape.dim] or "unknown rank"
            raise WorkloadError(
                f"ONNX input {value.name!r} has no static shape ({shown}); give it: "
                f"--input-shape {value.name}=D,D,... (input_shapes= in Python)"
            )
        shapes[value.name] = [int(d) for d in dims]
    return shapes, dtypes


def _given_shape(name: str, dims: object) -> list[int]:
    """An input shape given in Python: a list or tuple of positive whole numbers (the command
    line's parser checks its own; ``int()`` turned 1.5 into 1 and "14" into (1, 4))."""
    ok = isinstance(dims, list | tuple) and all(
        isinstance(d, int | np.integer) and not isinstance(d, bool) and d > 0 for d in dims
    )
    if not ok:
        raise WorkloadError(f"input shape of {name!r}: {dims!r} is not a list of positive whole "
                            "numbers")  # fmt: skip
    return [int(d) for d in dims]


# The largest model input an example is made for: an ONNX file can declare any shape.
MAX_INPUT_BYTES = 4 << 30


def _example_array(rng: np.random.Generator, shape: list[int], dtype: np.dtype) -> np.ndarray:
    size = int(np.prod(shape, dtype=object)) * np.dtype(dtype).itemsize
    if size > MAX_INPUT_BYTES:
        limit = MAX_INPUT_BYTES >> 30
        raise WorkloadError(f"an input of shape {list(shape)} takes {size / 2**30:.0f} GiB, "
                            f"over the {limit} GiB an example may take")  # fmt: skip
    # integer inputs are usually indices (token ids), where only zero is always in range
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    return np.zeros(shape, dtype=dtype)


# --------------------------------------------------------------------------------------------
# Task extraction


def _extract_tasks(name: str, mod: tvm.IRModule, target: tvm.target.Target) -> list[Task]:
    from tvm.s_tir.analysis import estimate_tir_flops

    extracted = ms.relax_integration.extract_tasks(fuse(mod, target), target)
    tasks = []
    for task in extracted:
        # the module tune_relax hands to its TuneContext (extracted_tasks_to_tune_contexts)
        prim = task.dispatched[0] if task.dispatched else task.mod
        if _is_scheduled(task.mod):
            continue  # tune_relax skips these too: there is nothing left to search
        try:
            flop = float(estimate_tir_flops(prim))
        except Exception:
            flop = 0.0  # the estimate gives up on some data-dependent loops: read as unknown
        tasks.append(
            Task(name=task.task_name, mod=prim, weight=int(task.weight), flop=flop, source=name)
        )
    if not tasks:
        raise WorkloadError(f"model {name} has no tunable operators")
    return tasks


def fuse(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """Lower and fuse ``mod`` into the PrimFuncs that are tuned; ``build_tuned`` starts with
    this very function, so the tasks tuned and the kernels built have the same keys.

    The target's library dispatch (sort/scan/sampling on CPU) runs before legalization, as in
    TVM's own pipelines.  Weights (the module's constants) are then marked layout-free: on the
    tasks that read them, MetaSchedule's RewriteLayout may store each weight in the order its
    schedule reads it (for a convolution, output-channel tiles innermost, so the vector loads
    are contiguous), and ``build_tuned`` does that rewrite once, at compile time.
    """
    from tvm import relax

    try:
        dispatch = relax.pipeline.library_dispatch_passes(target)
    except (ValueError, AttributeError):
        dispatch = []  # a target kind with no registered pipeline has nothing to dispatch
    with target:
        mod = tvm.transform.Sequential(dispatch)(mod)
        mod = relax.get_pipeline("zero")(mod)
        return relax.transform.AttachAttrLayoutFreeBuffers()(mod)


def _is_scheduled(mod: tvm.IRModule) -> bool:
    attrs = mod.attrs
    return bool(attrs is not None and attrs.get("tirx.is_scheduled", False))


# --------------------------------------------------------------------------------------------
# Error messages


def _import_error(name: str, exc: Exception) -> WorkloadError:
    message = str(exc)
    for pattern in _UNSUPPORTED_OP_PATTERNS:
        found = pattern.search(message)
        if found:
            ops = ", ".join(op.strip(" '\"") for op in found.group(1).splitlines()[0].split(","))
            return WorkloadError(f"cannot import {name}: unsupported operator(s): {ops}")
    return WorkloadError(f"cannot import {name}: {_first_line(exc)}")


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


__all__ = ["Model", "fuse", "load_model"]
