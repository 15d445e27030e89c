"""``torch.compile(model, backend="tensortune")``: each graph PyTorch hands over is built by TVM
with the tuned records, so a PyTorch user adopts tuned kernels with one line.

The backend is registered through the ``torch_dynamo_backends`` entry point: no import of
tensortune is needed.  ``options`` (``torch.compile(..., options={...})``) take ``records``
(a records store URL, default ``sqlite:///tensortune.db``), ``target`` (default: this CPU),
``fast_math`` and ``winograd`` (what the model was tuned with; default True).  A graph TVM
cannot import runs eagerly, with a warning that says why; kernels with no tuned record run
the program the analyzer picks for them, unmeasured (``deploy.unrecorded``), with a warning
that says how many.
"""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from tensortune.deploy.host_call import HostCall
from tensortune.errors import NoStoreError, TensortuneError, WorkloadError, check_flags
from tensortune.records import DEFAULT_URL

_OPTIONS = {"records": DEFAULT_URL, "target": None, "fast_math": True, "winograd": True}
# Builds kept per compiled graph, one per set of module weights it has been called with.
MAX_BUILDS = 4


@dataclass
class BackendStats:
    """What the backend did in this process: graphs built by TVM, graphs left to eager."""

    built: int = 0
    eager: int = 0


stats = BackendStats()


def tensortune_backend(gm: Any, example_inputs: list, options: dict | None = None,
                       **_: Any) -> Any:  # fmt: skip
    """A ``torch.compile`` backend: ``gm`` (a ``torch.fx.GraphModule``) built by TVM with the
    records of ``options["records"]``; its ``forward`` where TVM cannot take it."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    opts = dict(_OPTIONS)
    for key, value in (options or {}).items():
        if key not in _OPTIONS:
            known = ", ".join(_OPTIONS)
            raise TensortuneError(f"unknown tensortune backend option {key!r} (known: {known})")
        opts[key] = value
    check_flags(fast_math=opts["fast_math"], winograd=opts["winograd"])
    if not all(isinstance(x, torch.Tensor) for x in example_inputs):
        return _eager(gm, "its inputs are not all tensors (dynamic shapes?)")
    elsewhere = sorted({x.device.type for x in example_inputs} - {"cpu"})
    if elsewhere:  # TVM's build runs on this CPU: it would mix devices, or move the work here
        return _eager(gm, f"its tensors are on {elsewhere[0]}, and tensortune builds for the CPU")
    state = _state_inputs(gm, example_inputs)
    data = [i for i in range(len(example_inputs)) if i not in state]
    try:
        # Dynamo may hand over fake tensors; only shapes and dtypes matter to the import.
        shaped = tuple(torch.zeros(tuple(int(d) for d in example_inputs[i].shape),
                                   dtype=example_inputs[i].dtype) for i in data)  # fmt: skip
    except TypeError:  # a symbolic dimension
        return _eager(gm, "it has dynamic shapes (use torch.compile(..., dynamic=False))")
    try:
        dtypes = [str(x.numpy().dtype) for x in shaped]
    except TypeError:
        return _eager(gm, "an input's dtype has no NumPy equivalent")
    module = _bound(gm, {i: example_inputs[i] for i in state}, len(example_inputs))
    with torch.no_grad():
        leaves, spec = tree_flatten(module(*shaped))
    if not leaves or not all(isinstance(x, torch.Tensor) for x in leaves):
        return _eager(gm, "its outputs are not all tensors")

    from tensortune.hardware import check_runs_here, resolve_platform, usable_cores

    platform = resolve_platform(opts["target"])
    check_runs_here(platform.target)  # its code runs in this process: SIGILL would end it
    # TVM sizes its thread pool once per process, when first used; no more threads than this
    # process may use, or they spin on each other (as tensortune.load caps them)
    os.environ.setdefault("TVM_NUM_THREADS", str(min(platform.threads, usable_cores())))

    def build(module: Any) -> HostCall:
        vm, untuned, n_tasks = _build(module, shaped, platform, opts)
        if untuned:
            warnings.warn(f"tensortune: {untuned} of {n_tasks} kernels of this graph have no "
                          f"tuned record in {opts['records']}: they run unmeasured programs, "
                          "or their bare loops "
                          "(tune the model first, e.g. tensortune tune --model ...)",
                          stacklevel=3)  # fmt: skip
        stats.built += 1
        return HostCall(vm, [tuple(x.shape) for x in shaped], dtypes)

    try:
        first = build(module)
    except WorkloadError as e:
        return _eager(gm, str(e))
    # The weights are baked into a build, and Dynamo hands one compiled graph every module
    # of the same class (it guards on the type, not on which object): another module's
    # weights get a build of their own.
    # Each build keeps its weights referenced, so their memory is not another module's later;
    # the least recently used goes when more than MAX_BUILDS are kept.
    order = sorted(state)
    weights = [example_inputs[i] for i in order]
    builds = OrderedDict({_weights_key(weights): (weights, first)})
    n_out = len(leaves)

    def run(*args: Any) -> Any:
        weights = [args[i] for i in order]
        key = _weights_key(weights)
        if key not in builds:
            builds[key] = (weights, build(_bound(gm, {i: args[i] for i in state}, len(args))))
            while len(builds) > MAX_BUILDS:
                builds.popitem(last=False)
        builds.move_to_end(key)
        call = builds[key][1]
        outs = [torch.from_numpy(o) for o in call([args[i].detach().cpu().numpy() for i in data])]
        if len(outs) != n_out:  # cannot happen for a graph TVM imported whole
            raise TensortuneError(f"TVM's build returned {len(outs)} outputs, not {n_out}")
        return tree_unflatten(outs, spec)

    return run


def _weights_key(weights: list) -> tuple:
    """Which weights a build baked in: their tensors' storage and layout, and the version
    PyTorch counts up at every in-place change (``load_state_dict``, an optimizer step), so
    that changed weights get a build of their own instead of the old constants."""
    return tuple((w.untyped_storage().data_ptr(), w.storage_offset(), tuple(w.shape),
                  tuple(w.stride()), str(w.dtype), _version(w)) for w in weights)  # fmt: skip


# Values of an inference tensor that stand in for the version it does not count.
SAMPLED_VALUES = 64


def _version(w: Any) -> int | bytes:
    """PyTorch's count of in-place changes; for a tensor made in ``inference_mode``, which
    counts none (and can be changed in place only there), ``SAMPLED_VALUES`` of its values,
    evenly spaced: new weights loaded in place there change them (new weights equal at every
    sampled place would not be seen)."""
    if not w.is_inference():
        return w._version
    import torch

    if w.numel() == 0:
        return b""
    # gathered where they lie: flattening a channels-last weight would copy all of it per call
    flat = torch.linspace(0, w.numel() - 1, min(SAMPLED_VALUES, w.numel())).long()
    return w.detach()[torch.unravel_index(flat, w.shape)].cpu().numpy().tobytes()


def _state_inputs(gm: Any, example_inputs: list) -> set[int]:
    """The inputs that are the module's parameters and buffers: Dynamo hands them over as
    graph inputs, and they are baked into the build as constants (so batch norms fold into
    convolutions and the kernels are the ones ``tune --model`` tuned); weights changed later
    get a build of their own (``_weights_key``)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    state = set()
    for i, (node, x) in enumerate(zip(placeholders, example_inputs, strict=False)):
        if isinstance(x, FakeTensor):
            continue
        source = getattr(node.meta.get("grapharg"), "source", None)
        name = getattr(source, "name", None)
        name = str(name() if callable(name) else name or node.target)
        if isinstance(x, torch.nn.Parameter) or "_parameters" in name or "_buffers" in name:
            state.add(i)
    return state


def _bound(gm: Any, state: dict[int, Any], n_inputs: int) -> Any:
    """``gm`` with its state inputs held as parameters: a module called with the data inputs."""
    import torch

    class Bound(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gm = gm
            for i, value in state.items():
                weight = torch.nn.Parameter(value.detach(), requires_grad=False)
                self.register_parameter(f"state{i}", weight)

        def forward(self, *data: Any) -> Any:
            rest = iter(data)
            args = [getattr(self, f"state{i}", None) for i in range(n_inputs)]
            return self.gm(*[a if a is not None else next(rest) for a in args])

    return Bound()


def _build(gm: Any, inputs: tuple, platform: Any, opts: dict) -> tuple[Any, int, int]:
    """A Relax VM of ``gm`` built with the store's best records; with how many of its tasks
    have none, of how many."""
    from tensortune.compat import ms, tvm
    from tensortune.deploy.compile import build_tuned
    from tensortune.records import open_records
    from tensortune.records.ms_database import StoreDatabase
    from tensortune.workloads.models import load_model

    m = load_model(gm, target=platform.tvm_target, example_inputs=inputs, name="torch.compile",
                   fast_math=opts["fast_math"], winograd=opts["winograd"])  # fmt: skip
    try:
        store = open_records(opts["records"], create=False)
    except NoStoreError as e:  # not tuned yet; a store that is broken or unreachable raises
        # Built as from an empty store, not by tvm.compile: its bare loops ran gpt2-block
        # hundreds of times slower than eager (see deploy.unrecorded).
        warnings.warn(f"tensortune: {e}; no kernel has a tuned record", stacklevel=3)
        executable = build_tuned(ms.database.MemoryDatabase(), m.mod, platform)
        return tvm.relax.VirtualMachine(executable, tvm.cpu()), len(m.tasks), len(m.tasks)
    with store:
        db = StoreDatabase(store, target=platform)
        untuned = sum(db.query_tuning_record(t.mod, platform.tvm_target, t.name) is None
                      for t in m.tasks)  # fmt: skip
        executable = build_tuned(db, m.mod, platform)
    return tvm.relax.VirtualMachine(executable, tvm.cpu()), untuned, len(m.tasks)


def _eager(gm: Any, why: str) -> Any:
    warnings.warn(f"tensortune: running a graph eagerly: {why}", stacklevel=3)
    stats.eager += 1
    return gm.forward
