"""Every zoo network imports, and its TVM build (or, for an entry that is another at a larger
size, its base's) computes what PyTorch computes; an ONNX file's build computes what ONNX
Runtime computes.

Untuned builds (TVM's unscheduled TIR, only the inference rewrites applied: batch norms folded,
fast math), for the target every user gets by default: this CPU with its real ``mcpu``.  The
tolerance is 1e-5 of the output's largest magnitude (at least 1e-5): float32 summation order and
fast math's polynomials stay within a few ulps here (BERT-base: 4e-6 on outputs up to 4.7), a
wrong layout, a lost residual or a badly folded batch norm miss it by orders of magnitude.
"""

from __future__ import annotations

import copy
import functools
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tensortune.compat import tvm  # noqa: E402
from tensortune.hardware import resolve_platform  # noqa: E402
from tensortune.measure.executable import as_arrays  # noqa: E402
from tensortune.workloads.models import Model, load_model  # noqa: E402
from tensortune.workloads.networks import NETWORKS  # noqa: E402

RELATIVE = 1e-5


def run_untuned(model: Model) -> list[np.ndarray]:
    """The model built without tuned schedules for the default target, run on its inputs."""
    platform = resolve_platform(None)
    executable = tvm.compile(model.mod, target=platform.tvm_target)
    vm = tvm.relax.VirtualMachine(executable, tvm.cpu())
    return as_arrays(vm["main"](*[tvm.runtime.tensor(x) for x in model.inputs]))


def assert_close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        scale = max(1.0, float(np.abs(w).max()))
        error = float(np.abs(g - w).max())
        assert error <= RELATIVE * scale, f"max error {error:.3g} on outputs up to {scale:.3g}"


# Entries that are another entry's module at a larger batch, sequence or depth: their kernels are
# the base's at other shapes, so only the base is run (bert-base's untuned kernels alone took a
# minute); these are checked to import at their size.
AT_ANOTHER_SIZE = {"resnet18-b4": "resnet18", "mobilenetv2-b4": "mobilenetv2",
                   "bert-base": "bert-layer", "bert-base-s64": "bert-layer",
                   "gpt2-block-s256": "gpt2-block"}  # fmt: skip


@functools.cache
def zoo_model(name: str) -> Model:
    """A base network, loaded once for every test that needs it."""
    return load_model(name, target=resolve_platform(None).tvm_target)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in NETWORKS if n not in AT_ANOTHER_SIZE])
def test_every_zoo_network_builds_and_matches_pytorch(name: str) -> None:
    model = zoo_model(name)
    assert model.tasks and all(t.weight >= 1 for t in model.tasks)
    with torch.no_grad():
        expected = model.torch_module(*model.torch_inputs)
        # float64 shows how far float32 itself strays on this network (deep CNNs: ~1e-5 of
        # their outputs); TVM's build, summing in another order, may stray as far
        exact = copy.deepcopy(model.torch_module).double()(
            *[t.double() for t in model.torch_inputs])  # fmt: skip
    expected = [t.numpy() for t in (expected if isinstance(expected, tuple) else (expected,))]
    exact = [t.numpy() for t in (exact if isinstance(exact, tuple) else (exact,))]
    got = run_untuned(model)
    assert len(got) == len(expected)
    for g, e, x in zip(got, expected, exact, strict=True):
        assert g.shape == e.shape and g.dtype == e.dtype
        float32_error = float(np.abs(e - x).max())
        error = float(np.abs(g - x).max())
        assert error <= max(4 * float32_error, RELATIVE * max(1.0, float(np.abs(x).max()))), (
            f"max error {error:.3g} against float64, PyTorch's float32 {float32_error:.3g}"
        )
    # the comparison means something only if the outputs depend on the input (a network whose
    # activations die out answers with its last bias, whatever the kernels compute)
    torch.manual_seed(3)
    with torch.no_grad():
        other = model.torch_module(*[torch.randn_like(t) for t in model.torch_inputs])
    other = other if isinstance(other, tuple) else (other,)
    for e, o in zip(expected, other, strict=True):
        assert np.abs(e - o.numpy()).max() > 0.01 * max(1.0, float(np.abs(e).max()))


@pytest.mark.parametrize(("name", "base"), sorted(AT_ANOTHER_SIZE.items()))
def test_each_larger_variant_imports_at_its_size(name: str, base: str) -> None:
    model, smaller = load_model(name, target=resolve_platform(None).tvm_target), zoo_model(base)
    assert model.tasks and all(t.weight >= 1 for t in model.tasks)
    assert [x.shape for x in model.inputs] == [tuple(t.shape) for t in model.torch_inputs]

    def work(m: Model) -> float:
        return sum(t.flop * t.weight for t in m.tasks)

    assert work(model) > 1.5 * work(smaller)  # the larger size took effect


class SmallCNN(torch.nn.Module):
    """What the ONNX exporter folds and what it keeps: conv + batch norm, depthwise conv,
    residual add, pooling, flatten, linear layers, GELU (erf), layer norm and softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16),
            torch.nn.ReLU(),
        )  # fmt: skip
        self.depthwise = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.head = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
            torch.nn.Linear(32, 10),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        y = y + torch.relu(self.depthwise(y))
        y = torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)
        return torch.softmax(self.head(y), dim=-1)


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    net = SmallCNN().eval()
    with torch.no_grad():  # non-trivial batch-norm statistics, so that folding them matters
        bn = net.stem[1]
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    path = tmp_path_factory.mktemp("onnx") / "small_cnn.onnx"
    with warnings.catch_warnings():  # the TorchScript exporter: no onnxscript needed
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(net, (torch.randn(2, 3, 32, 32),), str(path), dynamo=False,
                          opset_version=17, input_names=["image"])  # fmt: skip
    return path


def test_an_onnx_file_builds_and_matches_onnx_runtime(onnx_file: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    model = load_model(onnx_file, target=resolve_platform(None).tvm_target)
    assert model.torch_module is None and [x.shape for x in model.inputs] == [(2, 3, 32, 32)]
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"image": model.inputs[0]})
    assert_close(run_untuned(model), expected)


def test_the_check_catches_a_wrong_build(onnx_file: Path) -> None:
    """The tolerance is not so loose that a different computation passes it."""
    model = load_model(onnx_file, target=resolve_platform(None).tvm_target)
    got = run_untuned(model)
    shifted = [np.roll(g, 1, axis=-1) for g in got]  # the classes' probabilities, permuted
    with pytest.raises(AssertionError, match="max error"):
        assert_close(shifted, got)
