"""load_model: torch and ONNX routes on a tiny CNN, bad inputs, and one zoo network (slow)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")

from tensortune.compat import tvm  # noqa: E402
from tensortune.errors import WorkloadError  # noqa: E402
from tensortune.workloads.models import Model, load_model  # noqa: E402

TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 2})


class TinyCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


def tiny() -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return TinyCNN().eval(), (torch.randn(1, 3, 16, 16),)


def export_onnx(path: Path, **kwargs: object) -> None:
    """Export the tiny CNN with the legacy exporter (the default one needs onnxscript)."""
    module, inputs = tiny()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "legacy exporter" notices
        torch.onnx.export(
            module, inputs, str(path), dynamo=False, opset_version=17, input_names=["image"],
            **kwargs,
        )  # fmt: skip


def assert_tunable(model: Model) -> None:
    assert model.tasks
    for task in model.tasks:
        assert isinstance(task.weight, int) and task.weight > 0
        assert isinstance(task.mod, tvm.IRModule)
        assert any(isinstance(f, tvm.tirx.PrimFunc) for f in task.mod.functions.values())
        assert task.source == model.name
    assert any(task.flop > 0 for task in model.tasks)
    assert isinstance(model.mod["main"], tvm.relax.Function)


def assert_matches_torch(model: Model, module: torch.nn.Module, inputs: tuple,
                         atol: float) -> None:  # fmt: skip
    """The model built untuned gives the module's output on the module's input."""
    vm = tvm.relax.VirtualMachine(tvm.compile(model.mod, target=TARGET), tvm.cpu())
    got = vm["main"](tvm.runtime.tensor(model.inputs[0])).numpy()
    with torch.no_grad():
        want = module(*inputs).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol)


def test_torch_module() -> None:
    module, inputs = tiny()
    model = load_model(module, example_inputs=inputs, target=TARGET)
    assert_tunable(model)
    assert model.name == "TinyCNN"
    assert model.torch_module is module and model.torch_inputs == inputs
    assert [a.shape for a in model.inputs] == [(1, 3, 16, 16)]
    # weights are bound as constants: the only parameter left is the image
    assert len(model.mod["main"].params) == 1


def test_batch_norm_folds_into_the_conv_and_outputs_match_torch() -> None:
    module, inputs = tiny()
    with torch.no_grad():  # statistics far from the identity, so that a wrong fold shows
        module.bn.running_mean.uniform_(-1, 1)
        module.bn.running_var.uniform_(0.5, 2)
        module.bn.weight.uniform_(0.5, 2)
        module.bn.bias.uniform_(-1, 1)
    model = load_model(module, example_inputs=inputs, target=TARGET)
    names = [task.name for task in model.tasks]
    assert not any("batch_norm" in name for name in names), names
    assert any("conv2d" in name and "relu" in name for name in names), names
    assert_matches_torch(model, module, inputs, atol=1e-5)


def test_weights_fold_in_numpy_exactly_as_relax_folds_them(monkeypatch) -> None:
    from tensortune.compat import structural_equal
    from tensortune.workloads import inference

    module, inputs = tiny()
    with torch.no_grad():
        module.bn.running_var.uniform_(0.5, 2)
    ours = load_model(module, example_inputs=inputs, target=TARGET)
    # the NumPy stage alone leaves relax's FoldConstant nothing to fold, only bindings to inline
    relax = tvm.relax.transform
    numpy_only = tvm.transform.Sequential([
        inference._rewrite_calls("numpy", inference._NUMPY_FOLDS, constant_args=True),
        relax.CanonicalizeBindings(), relax.DeadCodeElimination(),
    ])  # fmt: skip
    monkeypatch.setattr(inference, "fold_constants", lambda: numpy_only)
    assert structural_equal(load_model(module, example_inputs=inputs, target=TARGET).mod, ours.mod)
    monkeypatch.setattr(inference, "fold_constants", relax.FoldConstant)
    assert structural_equal(load_model(module, example_inputs=inputs, target=TARGET).mod, ours.mod)


class Blocks(torch.nn.Module):
    """What MobileNet and ResNet blocks hold: ReLU6, a depthwise and a strided convolution, a
    residual add and a max pool; the output is a feature map."""

    def __init__(self) -> None:
        super().__init__()
        self.expand = torch.nn.Conv2d(4, 16, 1)
        self.depthwise = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.project = torch.nn.Conv2d(16, 4, 1)
        self.down = torch.nn.Conv2d(4, 8, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.relu6(self.depthwise(torch.nn.functional.relu6(self.expand(x))))
        y = self.project(y) + x
        return torch.nn.functional.max_pool2d(torch.relu(self.down(y)), 2)


def _calls(mod: tvm.IRModule, op: str) -> list:
    calls: list = []
    tvm.relax.analysis.post_order_visit(
        mod["main"],
        lambda e: calls.append(e) if isinstance(e, tvm.relax.Call) and e.op.name == op else None,
    )
    return calls


def test_convolutions_run_channels_last_with_one_transpose_at_each_end() -> None:
    torch.manual_seed(0)
    module, inputs = Blocks().eval(), (torch.randn(1, 4, 12, 12),)
    model = load_model(module, example_inputs=inputs, target=TARGET)
    convs = _calls(model.mod, "relax.nn.conv2d")
    assert len(convs) == 4 and {c.attrs.data_layout for c in convs} == {"NHWC"}
    # ReLU6 (clip) and the pool take NHWC too: no transposes inside the graph
    assert len(_calls(model.mod, "relax.permute_dims")) == 2
    assert_matches_torch(model, module, inputs, atol=1e-5)
    as_imported = load_model(module, example_inputs=inputs, target=TARGET, channels_last=False)
    assert {c.attrs.data_layout for c in _calls(as_imported.mod, "relax.nn.conv2d")} == {"NCHW"}


@pytest.mark.parametrize(("approximate", "fast_op"), [("none", "fast_erf"), ("tanh", "fast_tanh")])
def test_gelu_and_softmax_use_fast_math_and_outputs_match_torch(approximate, fast_op) -> None:
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.GELU(approximate=approximate), torch.nn.Softmax(-1)
    ).eval()
    inputs = (3 * torch.randn(4, 16),)  # wide enough to reach the approximations' tails
    model = load_model(module, example_inputs=inputs, target=TARGET)
    names = " ".join(task.name for task in model.tasks)
    assert fast_op in names and "fast_softmax" in names, names
    assert_matches_torch(model, module, inputs, atol=1e-6)
    exact = load_model(module, example_inputs=inputs, target=TARGET, fast_math=False)
    assert "fast_" not in " ".join(task.name for task in exact.tasks)


def test_torch_module_needs_example_inputs() -> None:
    with pytest.raises(WorkloadError, match="example_inputs"):
        load_model(tiny()[0], target=TARGET)
    # bfloat16 has no NumPy dtype: refused in one line, before the export and the import
    module, (x,) = tiny()
    with pytest.raises(WorkloadError, match=r"example inputs of TinyCNN: .*float32"):
        load_model(module.bfloat16(), example_inputs=(x.bfloat16(),), target=TARGET)


def test_onnx_file(tmp_path: Path) -> None:
    path = tmp_path / "tiny.onnx"
    export_onnx(path)
    model = load_model(path, target=TARGET)
    assert_tunable(model)
    assert model.name == "tiny" and model.torch_module is None
    assert [(a.shape, a.dtype) for a in model.inputs] == [((1, 3, 16, 16), np.float32)]


def test_onnx_dynamic_dim_needs_input_shapes(tmp_path: Path) -> None:
    path = tmp_path / "dyn.onnx"
    export_onnx(path, dynamic_axes={"image": {0: "batch"}})
    with pytest.raises(WorkloadError, match="input_shapes"):
        load_model(path, target=TARGET)
    model = load_model(path, target=TARGET, input_shapes={"image": [2, 3, 16, 16]})
    assert_tunable(model)
    assert model.inputs[0].shape == (2, 3, 16, 16)


def test_the_command_line_gives_dynamic_onnx_inputs_their_shapes(cli, tmp_path: Path) -> None:
    path = tmp_path / "dyn.onnx"
    export_onnx(path, dynamic_axes={"image": {0: "batch"}})
    code, _, err = cli("tune", "-m", str(path), "--dry-run")
    assert code == 2 and "--input-shape image=" in err
    code, out, err = cli("tune", "-m", str(path), "--input-shape", "image=2,3,16,16", "--dry-run",
                         "--json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["tasks"]
    code, _, err = cli("workloads", "-m", str(path), "--input-shape", "image=2,3,0,16")
    assert code == 2 and err.startswith("error: --input-shape:"), err
    # A shape of another rank than the declared one: TVM's importer printed lines on both
    # streams and cut its message short.
    for wrong in ("image=1,3,16", "image=1,3,16,16,1"):
        code, out, err = cli("tune", "-m", str(path), "--input-shape", wrong, "--dry-run")
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (out, err)
        assert "the model's has 4: ['batch', 3, 16, 16]" in err, err


def test_onnx_inputs_tensortune_cannot_feed_are_refused_in_one_line(tmp_path: Path) -> None:
    # A sequence input and an untyped one raised KeyError 0; a bfloat16 MatMul failed deep in
    # the build of its fallback kernel (a dtype mismatch), its example input all zeros.
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h

    def save(name: str, node: onnx.NodeProto, x: onnx.ValueInfoProto, y_type: int) -> Path:
        y = h.make_tensor_value_info("y", y_type, [4])
        graph = h.make_graph([node], name, [x], [y])
        path = tmp_path / f"{name}.onnx"
        onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), path)
        return path

    relu = h.make_node("Relu", ["x"], ["y"])
    cases = {
        save("seq", h.make_node("SequenceLength", ["x"], ["y"]),
             h.make_tensor_sequence_value_info("x", T.FLOAT, [4]), T.INT64): "not a tensor",
        save("untyped", relu, h.make_tensor_value_info("x", T.UNDEFINED, [4]), T.FLOAT):
            "not a tensor",
        save("bf16", relu, h.make_tensor_value_info("x", T.BFLOAT16, [4]), T.BFLOAT16):
            "'x' is bfloat16",
    }  # fmt: skip
    for path, words in cases.items():
        with pytest.raises(WorkloadError, match=words) as caught:
            load_model(path, target=TARGET)
        assert len(str(caught.value).splitlines()) == 1


@pytest.mark.parametrize("shape", [[0, 3, 16, 16], [-1, 3, 16, 16], [1.5, 3, 16, 16], "2316",
                                   [True, 3, 16, 16], 2])  # fmt: skip
def test_input_shapes_given_in_python_are_checked(tmp_path: Path, shape: object) -> None:
    # int() made 1.5 a 1 and "2316" four dimensions; 0 and -1 failed inside TVM or NumPy.
    path = tmp_path / "dyn.onnx"
    export_onnx(path, dynamic_axes={"image": {0: "batch"}})
    with pytest.raises(WorkloadError, match="not a list of positive whole numbers"):
        load_model(path, target=TARGET, input_shapes={"image": shape})


def test_unknown_network() -> None:
    with pytest.raises(WorkloadError, match=r"unknown network 'nope'; known: .*resnet18"):
        load_model("nope", target=TARGET)


def test_garbage_onnx(tmp_path: Path) -> None:
    path = tmp_path / "garbage.onnx"
    path.write_bytes(b"this is not a protobuf \x00\xff\x13" * 10)
    with pytest.raises(WorkloadError, match=r"garbage\.onnx"):
        load_model(str(path), target=TARGET)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="not found"):
        load_model(str(tmp_path / "missing.onnx"), target=TARGET)
    (tmp_path / "folder.onnx").mkdir()  # it exists: "not found" misled
    with pytest.raises(WorkloadError, match=r"folder\.onnx is a directory"):
        load_model(str(tmp_path / "folder.onnx"), target=TARGET)


@pytest.mark.slow
def test_resnet18() -> None:
    from test_zoo import zoo_model  # loaded once for the zoo's tests and this one

    model = zoo_model("resnet18")
    assert len(model.tasks) > 10
    assert sum(task.weight for task in model.tasks) > len(model.tasks)


def test_a_damaged_task_count_cache_is_counted_again(tmp_path, monkeypatch):
    # A cache of valid JSON but another shape raised AttributeError on every `workloads`.
    from types import SimpleNamespace

    from conftest import platform

    from tensortune.workloads import catalog

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    counted = SimpleNamespace(tasks=[SimpleNamespace(weight=2)] * 3)
    monkeypatch.setattr("tensortune.workloads.models.load_model", lambda *a, **k: counted)
    path = tmp_path / "tensortune" / "task-counts.json"
    path.parent.mkdir(parents=True)
    for text in ('{"a key": 1}', "[" * 100_000, "[]"):
        path.write_text(text)
        assert catalog.task_counts(["net"], platform(), cached_only=True) == {}
        assert catalog.task_counts(["net"], platform()) == {"net": (3, 6)}
    cache = json.loads(path.read_text())
    (key,) = cache
    cache[key]["net"] = "x"  # an entry of another shape under this machine's key
    path.write_text(json.dumps(cache))
    assert catalog.task_counts(["net"], platform(), cached_only=True) == {}
    assert catalog.task_counts(["net"], platform()) == {"net": (3, 6)}


def test_task_counts_are_computed_once_and_cached(tmp_path, monkeypatch):
    from conftest import platform

    from tensortune.workloads import catalog

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert not catalog.cache_exists()
    counts = catalog.task_counts(["gpt2-block"], platform({"kind": "llvm", "num-cores": 2}))
    model = load_model("gpt2-block", target=TARGET)
    assert counts == {"gpt2-block": (len(model.tasks), sum(t.weight for t in model.tasks))}
    assert (tmp_path / "tensortune" / "task-counts.json").is_file()

    def fail(*args, **kwargs):
        raise AssertionError("the cached count should have been used")

    monkeypatch.setattr("tensortune.workloads.models.load_model", fail)
    again = catalog.task_counts(["gpt2-block"], platform({"kind": "llvm", "num-cores": 2}))
    assert again == counts
    cached = catalog.task_counts(["gpt2-block", "resnet18"], platform(), cached_only=True)
    assert cached == counts  # resnet18 was never counted: left out, not imported
