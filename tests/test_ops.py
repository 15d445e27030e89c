"""The operator zoo (spec grammar, FLOPs, numerics) and the TVMScript and database sources."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import platform

from tensortune.compat import ms, structural_equal, tvm
from tensortune.errors import WorkloadError
from tensortune.workloads.ops import OPS, OpSpec, parse_spec
from tensortune.workloads.resolve import resolve_tasks
from tensortune.workloads.sources import estimate_flop, task_from_spec, tasks_from_database

# One small spec per operator, with every parameter spelled out (the canonical text).
SMALL = {
    "matmul": "matmul:4,5,6",
    "batch_matmul": "batch_matmul:2,3,4,5",
    "dense_bias_relu": "dense_bias_relu:3,4,5",
    "conv2d_nchw": "conv2d_nchw:1,7,6,2,3,3,2,1",
    "conv2d_nhwc": "conv2d_nhwc:1,7,6,2,3,3,2,1",
    "conv2d_nchw_bias_relu": "conv2d_nchw_bias_relu:1,5,5,2,3,3,1,1",
    "conv2d_nhwc_bias_relu": "conv2d_nhwc_bias_relu:1,5,5,2,3,3,1,0",
    "depthwise_conv2d": "depthwise_conv2d:1,6,6,3,3,1,1",
    "max_pool2d": "max_pool2d:1,7,7,2,3,2,1",
    "avg_pool2d": "avg_pool2d:1,6,6,2,2,2,0",
    "softmax": "softmax:3,7",
    "layernorm": "layernorm:3,7",
}


def test_small_specs_cover_every_op() -> None:
    assert set(SMALL) == set(OPS)


@pytest.mark.parametrize("op", sorted(OPS))
def test_spec_round_trip_and_flop(op: str) -> None:
    text = SMALL[op]
    spec = parse_spec(text)
    assert spec.op == op
    assert len(spec.args) == len(OPS[op].params)
    assert str(spec) == text  # canonical text round-trips exactly
    assert parse_spec(str(spec)) == spec
    assert spec.params == dict(zip(OPS[op].params, spec.args, strict=True))
    assert spec.flop > 0
    mod = spec.to_module()
    assert isinstance(mod, tvm.IRModule)
    assert isinstance(mod["main"], tvm.tirx.PrimFunc)


# ---- numerics: compile with TVM and compare with numpy ---------------------------------------


def _conv2d_nhwc_ref(data: np.ndarray, weight: np.ndarray, stride: int, pad: int) -> np.ndarray:
    """Direct loop over output pixels; weight is (K, K, CI, CO)."""
    n, h, w, _ = data.shape
    k, _, _, co = weight.shape
    x = np.pad(data, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    out = np.zeros((n, oh, ow, co), dtype=np.float64)
    for i in range(oh):
        for j in range(ow):
            window = x[:, i * stride : i * stride + k, j * stride : j * stride + k, :]
            out[:, i, j, :] = np.einsum("nhwc,hwco->no", window, weight)
    return out


def _conv2d_nchw_ref(data: np.ndarray, weight: np.ndarray, stride: int, pad: int) -> np.ndarray:
    # NCHW data, OIHW weight: the same convolution in the other layout.
    out = _conv2d_nhwc_ref(data.transpose(0, 2, 3, 1), weight.transpose(2, 3, 1, 0), stride, pad)
    return out.transpose(0, 3, 1, 2)


def _pool_ref(data: np.ndarray, k: int, stride: int, pad: int, kind: str) -> np.ndarray:
    n, c, h, w = data.shape
    fill = -np.inf if kind == "max" else 0.0
    x = np.pad(data, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=fill)
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            window = x[:, :, i * stride : i * stride + k, j * stride : j * stride + k]
            out[:, :, i, j] = window.max(axis=(2, 3)) if kind == "max" else window.mean((2, 3))
    return out


def _depthwise_ref(data: np.ndarray, weight: np.ndarray, stride: int, pad: int) -> np.ndarray:
    n, c, h, w = data.shape
    k = weight.shape[-1]
    x = np.pad(data, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            window = x[:, :, i * stride : i * stride + k, j * stride : j * stride + k]
            out[:, :, i, j] = np.einsum("nchw,chw->nc", window, weight[:, 0])
    return out


def _softmax_ref(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _layernorm_ref(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * gamma + beta


def _reference(spec: OpSpec, inputs: list[np.ndarray]) -> np.ndarray:
    p = spec.params
    op = spec.op
    if op == "matmul":
        a, b = inputs
        return a @ b
    if op == "batch_matmul":
        a, b = inputs
        return np.matmul(a, b)
    if op == "dense_bias_relu":
        x, w, bias = inputs
        return np.maximum(x @ w.T + bias, 0.0)
    if op.startswith("conv2d"):
        conv = _conv2d_nhwc_ref if "nhwc" in op else _conv2d_nchw_ref
        out = conv(inputs[0], inputs[1], p["stride"], p["pad"])
        return np.maximum(out + inputs[2], 0.0) if op.endswith("bias_relu") else out
    if op == "depthwise_conv2d":
        return _depthwise_ref(inputs[0], inputs[1], p["stride"], p["pad"])
    if op in ("max_pool2d", "avg_pool2d"):
        return _pool_ref(inputs[0], p["K"], p["stride"], p["pad"], op[:3])
    if op == "softmax":
        return _softmax_ref(inputs[0])
    if op == "layernorm":
        return _layernorm_ref(*inputs)
    raise AssertionError(f"no reference for {op}")


@pytest.mark.parametrize("op", sorted(OPS))
def test_compiles_and_matches_numpy(op: str) -> None:
    spec = parse_spec(SMALL[op])
    tensors = OPS[op].build(**spec.params)
    shapes = [tuple(int(d) for d in t.shape) for t in tensors]
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype("float32") for s in shapes[:-1]]
    expected = _reference(spec, inputs)
    assert expected.shape == shapes[-1]

    ex = tvm.compile(spec.to_module(), target={"kind": "llvm"})
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(x, dev) for x in inputs]
    out = tvm.runtime.tensor(np.full(shapes[-1], np.nan, dtype="float32"), dev)
    ex["main"](*args, out)
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-5)


# ---- FLOPs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("m", "n", "k"), [(1, 1, 1), (4, 5, 6), (128, 64, 32)])
def test_matmul_flop(m: int, n: int, k: int) -> None:
    assert parse_spec(f"matmul:{m},{n},{k}").flop == 2.0 * m * n * k


def test_conv_flop_uses_output_size() -> None:
    # H=7, W=9, K=3, stride 2, pad 0: output 3x4
    assert parse_spec("conv2d_nhwc:1,7,9,2,3,3,2,0").flop == 2.0 * 3 * 4 * 3 * 2 * 3 * 3
    # same with pad 1: output 4x5
    assert parse_spec("conv2d_nchw:2,7,9,2,3,3,2,1").flop == 2.0 * 2 * 4 * 5 * 3 * 2 * 3 * 3
    # the fused variant adds bias and relu: 2 more per output element
    fused = parse_spec("conv2d_nhwc_bias_relu:1,7,9,2,3,3,2,1").flop
    assert fused == 2.0 * 4 * 5 * 3 * 2 * 3 * 3 + 2.0 * 4 * 5 * 3
    # pooling: one op per window element, output 3x3 for H=W=7, K=3, stride 2, pad 0
    assert parse_spec("max_pool2d:1,7,7,2,3,2,0").flop == 2 * 3 * 3 * 3 * 3


@pytest.mark.parametrize("op", sorted(set(OPS) - {"layernorm", "avg_pool2d"}))
def test_flop_agrees_with_tvm_estimate(op: str) -> None:
    # layernorm's 8·M·N and avg_pool2d's (which leaves out the final division) are deliberate
    # approximations; for the others the formula counts exactly what TVM's estimate does.
    spec = parse_spec(SMALL[op])
    assert spec.flop == estimate_flop(spec.to_module())


# ---- defaults and bad specs ------------------------------------------------------------------


def test_defaults_filled_in() -> None:
    assert parse_spec("conv2d_nhwc:1,8,8,4,4,3") == parse_spec("conv2d_nhwc:1,8,8,4,4,3,1,1")
    assert str(parse_spec("conv2d_nhwc:1,8,8,4,4,3")) == "conv2d_nhwc:1,8,8,4,4,3,1,1"
    assert str(parse_spec("conv2d_nchw:1,8,8,4,4,5,2")) == "conv2d_nchw:1,8,8,4,4,5,2,2"
    assert str(parse_spec("max_pool2d:1,8,8,4,2")) == "max_pool2d:1,8,8,4,2,2,0"
    assert str(parse_spec("depthwise_conv2d:1,8,8,4,3")) == "depthwise_conv2d:1,8,8,4,3,1,1"
    # an explicit value different from the default is kept
    assert parse_spec("conv2d_nhwc:1,8,8,4,4,3,1,0") != parse_spec("conv2d_nhwc:1,8,8,4,4,3")


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("matmull:4,4,4", r"unknown operator 'matmull'.*known: matmul, batch_matmul"),
        ("4,4,4", r"unknown operator"),
        ("", r"unknown operator ''"),
        ("matmul", r"'matmul': expected matmul:M,N,K"),
        ("matmul:", r"'matmul:': expected matmul:M,N,K"),
        ("matmul:4,4", r"matmul takes 3 integers \(M,N,K\)"),
        ("matmul:4,4,4,4", r"matmul takes 3 integers"),
        ("conv2d_nhwc:1,8,8,4,4", r"conv2d_nhwc takes 6-8 integers"),
        ("conv2d_nhwc:1,8,8,4,4,3,1,1,1", r"conv2d_nhwc takes 6-8 integers"),
        ("matmul:4,x,4", r"comma-separated integers"),
        ("matmul:4,4.0,4", r"comma-separated integers"),
        ("matmul:4,,4", r"comma-separated integers"),
        ("matmul:0,4,4", r"M must be positive"),
        ("matmul:4,-2,4", r"N must be positive"),
        ("conv2d_nhwc:1,8,8,4,4,3,0,1", r"stride must be positive"),
        ("conv2d_nhwc:1,8,8,4,4,3,1,-1", r"pad must not be negative"),
        ("softmax:0,0", r"M, N must be positive"),
        ("conv2d_nhwc:1,2,8,4,4,5,1,0", r"kernel does not fit the padded input"),
        ("conv2d_nchw:1,8,2,4,4,5,1,0", r"kernel does not fit the padded input"),
        ("max_pool2d:1,2,2,4,3", r"kernel does not fit the padded input"),
    ],
)
def test_bad_spec(text: str, pattern: str) -> None:
    with pytest.raises(WorkloadError, match=pattern):
        parse_spec(text)
    with pytest.raises(WorkloadError, match=pattern):
        task_from_spec(text)  # what the CLI calls


def test_kernel_fits_once_padded() -> None:
    # K=5 on a 2x2 input is fine with the default pad K//2 = 2: output 2x2
    spec = parse_spec("conv2d_nhwc:1,2,2,1,1,5")
    assert spec.params["pad"] == 2
    assert spec.flop == 2.0 * 2 * 2 * 1 * 1 * 5 * 5
    # and the kernel exactly as large as the input gives a 1x1 output
    assert parse_spec("conv2d_nhwc:1,5,5,1,1,5,1,0").flop == 2.0 * 25


# ---- task_from_spec ------------------------------------------------------------------------


def test_task_from_op_spec() -> None:
    task = task_from_spec("conv2d_nhwc:1,8,8,4,4,3")
    assert task.name == "conv2d_nhwc:1,8,8,4,4,3,1,1"
    assert task.source == task.name
    assert task.weight == 1
    assert task.flop == parse_spec(task.name).flop
    assert structural_equal(task.mod, parse_spec(task.name).to_module())


def test_a_workload_spelled_two_ways_is_one_task() -> None:
    specs = ["conv2d_nhwc:1,8,8,4,4,3", "matmul:8, 8,8", "conv2d_nhwc:1,8,8,4,4,3,1,1",
             "matmul:8,8,8", "matmul:8,8,8"]  # fmt: skip
    tasks = resolve_tasks(specs, platform=platform(), fast_math=False)
    assert [t.name for t in tasks] == ["conv2d_nhwc:1,8,8,4,4,3,1,1", "matmul:8,8,8"]


def _script(mod: tvm.IRModule) -> str:
    """TVMScript text of a module or function that runs as a Python file (TVM comments out the
    import lines it prints)."""
    return re.sub(r"^# (from tvm\S* import .*)$", r"\1", mod.script(), flags=re.MULTILINE)


def test_tvmscript_prim_func_file(tmp_path: Path) -> None:
    mod = parse_spec("matmul:8,4,6").to_module()
    path = tmp_path / "mm_workload.py"
    path.write_text(_script(mod["main"]))
    task = task_from_spec(str(path))
    assert structural_equal(task.mod, mod)
    assert task.name == "mm_workload.main"
    assert task.source == str(path)
    assert task.flop == 2.0 * 8 * 4 * 6


def test_tvmscript_hand_written_file(tmp_path: Path) -> None:
    """The TVM 0.27 syntax written by hand (a PrimFunc called main)."""
    path = tmp_path / "hand.py"
    path.write_text(
        "from tvm.script import tirx as T\n\n\n"
        "@T.prim_func(s_tir=True)\n"
        'def main(A: T.Buffer((4, 6), "float32"), B: T.Buffer((6, 5), "float32"),\n'
        '         C: T.Buffer((4, 5), "float32")):\n'
        '    T.func_attr({"tirx.noalias": True})\n'
        "    for i, j, k in T.grid(4, 5, 6):\n"
        '        with T.sblock("C"):\n'
        '            v_i, v_j, v_k = T.axis.remap("SSR", [i, j, k])\n'
        "            T.reads(A[v_i, v_k], B[v_k, v_j])\n"
        "            T.writes(C[v_i, v_j])\n"
        "            with T.init():\n"
        "                C[v_i, v_j] = T.float32(0.0)\n"
        "            C[v_i, v_j] = C[v_i, v_j] + A[v_i, v_k] * B[v_k, v_j]\n"
    )
    task = task_from_spec(str(path))
    assert structural_equal(task.mod, parse_spec("matmul:4,5,6").to_module())


def test_tvmscript_ir_module_file_is_renamed_to_main(tmp_path: Path) -> None:
    mod = parse_spec("softmax:3,7").to_module()
    text = _script(mod).replace("def main(", "def my_softmax(")
    assert "def my_softmax(" in text
    path = tmp_path / "sm.py"
    path.write_text(text)
    task = task_from_spec(str(path))
    assert [gv.name_hint for gv in task.mod.get_global_vars()] == ["main"]
    assert structural_equal(task.mod, mod)


def test_tvmscript_prim_func_not_named_main(tmp_path: Path) -> None:
    mod = parse_spec("matmul:4,5,6").to_module()
    path = tmp_path / "mm.py"
    path.write_text(_script(mod["main"]).replace("def main(", "def mm("))
    task = task_from_spec(str(path))
    assert task.mod["main"].attrs["global_symbol"] == "main"
    assert structural_equal(task.mod, mod)


def test_tvmscript_two_prim_funcs(tmp_path: Path) -> None:
    text = _script(parse_spec("matmul:4,5,6").to_module()["main"])
    second = text.split("\n\n", 1)[1].replace("def main(", "def other(")  # without imports
    path = tmp_path / "two.py"
    path.write_text(text + "\n\n" + second)
    with pytest.raises(WorkloadError, match=r"exactly one PrimFunc.*found: main, other"):
        task_from_spec(str(path))


def test_tvmscript_module_with_two_functions(tmp_path: Path) -> None:
    text = _script(parse_spec("matmul:4,5,6").to_module())
    func = text[text.index("    @T.prim_func") :]
    path = tmp_path / "twofuncs.py"
    path.write_text(text + "\n" + func.replace("def main(", "def other("))
    with pytest.raises(WorkloadError, match="exactly one PrimFunc to tune"):
        task_from_spec(str(path))


def test_tvmscript_a_run_could_only_fail_on_is_refused_when_read(tmp_path: Path) -> None:
    # A scalar parameter crashed the run after the store was written; a PrimFunc without
    # blocks passed --dry-run, then every search broke on it and the run exited 0.
    scalar = (
        "from tvm.script import tirx as T\n"
        "@T.prim_func(s_tir=True)\n"
        "def scale(A: T.Buffer((8,), 'float32'), alpha: T.float32, C: T.Buffer((8,), 'float32')):\n"
        "    for i in range(8):\n"
        "        with T.sblock('C'):\n"
        "            vi = T.axis.remap('S', [i])\n"
        "            C[vi] = A[vi] * alpha\n"
    )
    loops = (
        "from tvm.script import tirx as T\n"
        "@T.prim_func\n"
        "def add(A: T.Buffer((8,), 'float32'), C: T.Buffer((8,), 'float32')):\n"
        "    for i in range(8):\n"
        "        C[i] = A[i] + T.float32(1)\n"
    )
    for name, text, error in (("scalar", scalar, "parameter alpha is a scalar"),
                              ("loops", loops, r"no blocks to schedule.*s_tir=True")):  # fmt: skip
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        with pytest.raises(WorkloadError, match=error):
            task_from_spec(str(path))


def test_tvmscript_no_prim_func(tmp_path: Path) -> None:
    path = tmp_path / "empty.py"
    path.write_text("from tvm.script import tirx as T\n\nX = 3\n")
    with pytest.raises(WorkloadError, match=r"found: none"):
        task_from_spec(str(path))


def test_tvmscript_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.py"
    path.write_text("from tvm.script import tirx as T\n\ndef main(:\n    pass\n")
    with pytest.raises(WorkloadError, match=r"cannot read TVMScript file .*broken\.py"):
        task_from_spec(str(path))


def test_tvmscript_raises_inside(tmp_path: Path) -> None:
    path = tmp_path / "raises.py"
    path.write_text("raise RuntimeError('boom\\nlast line of the reason')\n")
    with pytest.raises(WorkloadError, match=r"raises\.py: last line of the reason"):
        task_from_spec(str(path))


def test_tvmscript_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.py"
    with pytest.raises(WorkloadError, match=r"workload file not found: .*nope\.py"):
        task_from_spec(str(path))


def test_a_workload_file_that_is_not_python_is_not_run(tmp_path: Path) -> None:
    # runpy ran any existing file: a zip's __main__.py (a compiled artifact is a zip) ran.
    import zipfile

    marker = tmp_path / "ran"
    path = tmp_path / "model.tt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("__main__.py", f"open({str(marker)!r}, 'w').close()\n")
    with pytest.raises(WorkloadError, match=r"model\.tt is not a TVMScript \.py file"):
        task_from_spec(str(path))
    assert not marker.exists()


# ---- tasks_from_database -----------------------------------------------------------------


def test_tasks_from_tvm_json_database(tmp_path: Path) -> None:
    mods = [parse_spec("matmul:4,5,6").to_module(), parse_spec("softmax:3,7").to_module()]
    work_dir = tmp_path / "db"
    work_dir.mkdir()
    db = ms.database.JSONDatabase(work_dir=str(work_dir))
    for mod in mods:
        db.commit_workload(mod)
    del db
    tasks = tasks_from_database(work_dir)
    assert len(tasks) == 2
    for task, mod in zip(tasks, mods, strict=True):
        assert structural_equal(task.mod, mod)
        assert task.source == str(work_dir)
        assert task.weight == 1
    assert [t.name for t in tasks] == ["db.w0", "db.w1"]
    assert tasks[0].flop == 240.0


def test_tasks_from_dir_without_database(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="not a MetaSchedule database: no database_workload"):
        tasks_from_database(tmp_path)
    with pytest.raises(WorkloadError, match="not a MetaSchedule database"):
        tasks_from_database(tmp_path / "missing")


def test_tasks_from_empty_or_corrupt_database(tmp_path: Path) -> None:
    (tmp_path / "database_workload.json").write_text("\n")
    with pytest.raises(WorkloadError, match="holds no workloads"):
        tasks_from_database(tmp_path)
    (tmp_path / "database_workload.json").write_text('["123", "bm90IGEgZ3JhcGg="]\n')
    with pytest.raises(WorkloadError, match=r"database_workload\.json:1: unreadable workload"):
        tasks_from_database(tmp_path)
