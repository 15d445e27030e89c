"""compile --out → load: the shipped file gives the model's outputs in a fresh process, from
NumPy arrays or PyTorch tensors; files that are not artifacts, or were built for another
format, TVM, architecture or CPU, are refused with one line before any library is opened."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tensortune.compat import tvm  # noqa: E402
from tensortune.deploy.artifact import ArtifactError, load  # noqa: E402
from tensortune.deploy.compile import compile_model  # noqa: E402
from tensortune.errors import TensortuneError  # noqa: E402
from tensortune.hardware.target import ISA, cpu_isa, default_target, target_isa  # noqa: E402
from tensortune.tuning.tune import tune  # noqa: E402
from tensortune.workloads.models import load_model  # noqa: E402

TARGET = {"kind": "llvm", "num-cores": 2}


class TwoHeads(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.fc1(x))
        return torch.softmax(self.fc2(h), dim=-1), h.sum(dim=-1)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """(artifact path, the torch module, an input) of a tuned two-output MLP."""
    tmp = tmp_path_factory.mktemp("artifact")
    torch.manual_seed(0)
    module = TwoHeads().eval()
    x = torch.randn(4, 32)
    model = load_model(module, example_inputs=(x,), target=tvm.target.Target(TARGET))
    url = f"sqlite:///{tmp / 'r.db'}"
    tune(model=model, trials=2 * len(model.tasks), records=url, work_dir=tmp / "w",
         trials_per_round=2, strategy="replay-trace", cost_model="random",
         target=TARGET)  # fmt: skip
    report = compile_model(model, records=url, target=TARGET, repeat=2, rounds=1,
                           out=tmp / "mlp.tt")  # fmt: skip
    assert report.artifact == str(tmp / "mlp.tt")
    assert any(s.tuned for s in report.tasks)
    return tmp / "mlp.tt", module, x


def test_a_fresh_process_gets_the_models_outputs_from_numpy(shipped, tmp_path):
    path, module, x = shipped
    np.save(tmp_path / "x.npy", x.numpy())
    script = (
        "import sys, numpy as np, tensortune as tt\n"
        "m = tt.load(sys.argv[1])\n"
        "a, b = m(np.load(sys.argv[2]))\n"
        "np.save(sys.argv[3], a); np.save(sys.argv[4], b)\n"
    )
    outs = [tmp_path / "a.npy", tmp_path / "b.npy"]
    args = [sys.executable, "-c", script, str(path), str(tmp_path / "x.npy"), *map(str, outs)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    with torch.no_grad():
        want = module(x)
    for got, ref in zip(outs, want, strict=True):
        np.testing.assert_allclose(np.load(got), ref.numpy(), rtol=1e-4, atol=1e-5)


def test_torch_tensors_in_give_torch_tensors_out(shipped):
    path, module, x = shipped
    m = load(path)
    before = os.sched_getaffinity(0)
    a, b = m(x)
    # TVM's pool pins the thread that starts it; what this process starts next must not
    # inherit one core.
    assert os.sched_getaffinity(0) == before
    assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    with torch.no_grad():
        torch.testing.assert_close(a, module(x)[0], rtol=1e-4, atol=1e-5)
    assert m.manifest["model"] == "TwoHeads" and m.manifest["tasks"] >= 1


def test_each_call_sees_its_own_inputs_from_any_thread(shipped):
    # the inputs are staged in tensors allocated once: no call may see another's
    path, module, _ = shipped
    m = load(path)
    xs = [torch.randn(4, 32, generator=torch.Generator().manual_seed(k)) for k in range(8)]
    with torch.no_grad():
        want = [module(x)[0] for x in xs]
    for x, w in zip(xs, want, strict=True):
        torch.testing.assert_close(m(x)[0], w, rtol=1e-4, atol=1e-5)
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda x: m(x.numpy())[0], xs * 4))
    for g, w in zip(got, want * 4, strict=True):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-5)


def test_inputs_of_the_wrong_shape_or_count_get_one_line(shipped):
    m = load(shipped[0])
    wrong = r"input 0: expected float32\[4, 32\], got float32\[2, 32\]"
    with pytest.raises(TensortuneError, match=wrong):
        m(np.zeros((2, 32), np.float32))
    with pytest.raises(TensortuneError, match="takes 1 input"):
        m(shipped[2], shipped[2])
    # a tensor NumPy has no type for: the same line, not NumPy's TypeError
    bf16 = r"input 0: expected float32\[4, 32\], got torch.bfloat16\[4, 32\]"
    with pytest.raises(TensortuneError, match=bf16):
        m(shipped[2].to(torch.bfloat16))


def test_two_writers_of_one_artifact_keep_to_their_own_partial_files(shipped, tmp_path):
    """Every compile wrote ``OUT.partial`` and removed it at the end: a second compile to the
    same file removed, or wrote into, the first one's while it was being written."""
    from types import SimpleNamespace

    from tensortune.deploy.artifact import read_manifest, save_artifact

    library = tmp_path / "model.so"
    with zipfile.ZipFile(shipped[0]) as z:
        library.write_bytes(z.read("model.so"))
    out = tmp_path / "m.tt"
    theirs = out.with_name(out.name + ".partial")
    theirs.write_bytes(b"another compile's, half written")
    model = SimpleNamespace(name="m", inputs=[np.zeros((4, 32), np.float32)],
                            mod={"main": SimpleNamespace(ret_ty=None)})  # fmt: skip
    save_artifact(None, out, model=model, target=TARGET, threads=1, library=library)
    assert theirs.read_bytes() == b"another compile's, half written"
    assert read_manifest(out)["model"] == "m"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.tt", "m.tt.partial", "model.so"]


def _tampered(src, dst, **changes):
    with zipfile.ZipFile(src) as z:
        manifest = json.loads(z.read("manifest.json"))
        library = z.read("model.so")
    manifest.update(changes)
    with zipfile.ZipFile(dst, "w") as z:
        z.writestr("manifest.json", json.dumps(manifest))
        z.writestr("model.so", library)
    return dst


def test_foreign_artifacts_are_refused_before_loading(shipped, tmp_path):
    path = shipped[0]
    lacking = next(f for f in ISA if f not in cpu_isa())
    cases = {
        "newer than this tensortune reads": {"version": 99},
        "built with TVM 0.1.0": {"tvm": "0.1.0"},
        "built for riscv64": {"arch": "riscv64"},
        f"CPU with {lacking}, which this CPU lacks": {"cpu_features": [lacking]},
        "not a tensortune artifact": {"format": "something-else"},
        "damaged manifest": {"inputs": [{"shape": "x"}]},
        r"damaged manifest \(inputs\)": {"inputs": [{"shape": ["4"], "dtype": "float32"}]},
        r"damaged manifest \(inputs\)(?# a record dtype)": {
            "inputs": [{"shape": [4, 32], "dtype": "f4,%"}]
        },
        r"damaged manifest \(threads\)": {"threads": -3},
        r"damaged manifest \(version\)": {"version": 0},
        r"damaged manifest \(single_output\)": {"single_output": "no"},
        "its model takes 1 inputs, the manifest lists 0": {"inputs": []},
    }
    for i, (message, change) in enumerate(cases.items()):
        bad = _tampered(path, tmp_path / f"{i}.tt", **change)
        with pytest.raises(ArtifactError, match=message):
            load(bad)


def test_a_manifest_whose_inputs_the_library_refuses_gets_one_line(shipped, tmp_path):
    # Checked at load by count only: TVM's own many-worded RuntimeError and ValueError came out.
    for i, inputs in enumerate(([{"shape": [5, 32], "dtype": "float32"}],
                                [{"shape": [4, 32], "dtype": "int64"}])):  # fmt: skip
        m = load(_tampered(shipped[0], tmp_path / f"{i}.tt", inputs=inputs))
        spec = m.inputs[0]
        with pytest.raises(ArtifactError, match="the compiled model failed") as caught:
            m(np.zeros(spec.shape, spec.dtype))
        assert len(str(caught.value).splitlines()) == 1


def test_inputs_are_checked_against_the_manifest_scalars_included():
    from tensortune.deploy.artifact import TensorSpec, _as_array

    scalar = TensorSpec((), "float32")
    assert _as_array(np.float32(2.0), scalar, 0).shape == ()
    assert _as_array(torch.tensor(2.0), scalar, 0).shape == ()
    strided = np.zeros((8, 4), np.float32)[:, ::2]
    assert _as_array(strided, TensorSpec((8, 2), "float32"), 0).flags.c_contiguous
    with pytest.raises(TensortuneError, match=r"input 1: expected float32\[\], got float32\[1\]"):
        _as_array(np.zeros(1, np.float32), scalar, 1)


def test_an_artifact_whose_library_bytes_are_damaged_gets_one_line(shipped, tmp_path):
    data = bytearray(shipped[0].read_bytes())
    with zipfile.ZipFile(shipped[0]) as z:
        info = z.getinfo("model.so")
    # The member's data follow its local header (30 bytes, its name, its extra field).
    name_len, extra_len = (int.from_bytes(data[info.header_offset + k : info.header_offset + k + 2],
                                          "little") for k in (26, 28))  # fmt: skip
    start = info.header_offset + 30 + name_len + extra_len
    data[start + info.compress_size // 2] ^= 0xFF
    (tmp_path / "flipped.tt").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="damaged library"):
        load(tmp_path / "flipped.tt")


def test_members_zipfile_cannot_read_get_one_line(shipped, tmp_path):
    """An integer past Python's 4,300 digits in the manifest (a ValueError, not a JSON
    error); a library member flagged encrypted (a RuntimeError from zipfile)."""
    with zipfile.ZipFile(shipped[0]) as z:
        manifest, library = json.loads(z.read("manifest.json")), z.read("model.so")
    text = json.dumps({**manifest, "version": "V"}).replace('"V"', "1" + "0" * 5000)
    with zipfile.ZipFile(tmp_path / "huge.tt", "w") as z:
        z.writestr("manifest.json", text)
        z.writestr("model.so", library)
    with pytest.raises(ArtifactError, match=r"damaged manifest \(ValueError\)"):
        load(tmp_path / "huge.tt")
    data = bytearray(shipped[0].read_bytes())
    entry = data.rfind(b"model.so") - 46  # its central directory entry: the last of its name
    assert data[entry : entry + 4] == b"PK\x01\x02"
    data[entry + 8] |= 0x1  # its flags: encrypted, so zipfile wants a password
    (tmp_path / "locked.tt").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="damaged library"):
        load(tmp_path / "locked.tt")


def test_an_artifact_runs_on_no_more_threads_than_this_machine_gives(shipped, tmp_path,
                                                                       monkeypatch):  # fmt: skip
    from tensortune.hardware import usable_cores

    monkeypatch.setenv("TVM_NUM_THREADS", "")  # restored after the test, set or not
    monkeypatch.delenv("TVM_NUM_THREADS")
    load(_tampered(shipped[0], tmp_path / "many.tt", threads=10**6))
    assert int(os.environ["TVM_NUM_THREADS"]) == usable_cores()


def test_an_instruction_set_the_kernel_hides_is_one_this_cpu_lacks(shipped, tmp_path, monkeypatch):
    # A VM may hide AVX-512 under a CPU model name that has it: LLVM's name alone would pass
    # the artifact, and its code would die of SIGILL.
    import tensortune.hardware.fingerprint as fingerprint
    from tensortune.hardware.target import cpuinfo_name

    has = sorted(cpu_isa())
    if not has:
        pytest.skip("LLVM names no instruction set for this CPU")
    info = fingerprint.cpuinfo()
    key = "flags" if "flags" in info else "Features"
    hidden = cpuinfo_name(has[-1])
    shown = " ".join(f for f in info[key].split() if f != hidden)
    monkeypatch.setattr(fingerprint, "cpuinfo", lambda: {**info, key: shown})
    assert has[-1] not in cpu_isa()
    assert f"-{has[-1]}" in default_target()["mattr"]  # code for this CPU will not use it
    bad = _tampered(shipped[0], tmp_path / "hidden.tt", cpu_features=[has[-1]])
    with pytest.raises(ArtifactError, match=f"CPU with {re.escape(has[-1])}, which this CPU lacks"):
        load(bad)


def test_an_artifact_is_judged_by_what_the_kernel_lists_not_by_llvms_name_for_the_cpu(
    shipped, tmp_path, monkeypatch
):
    # One guest was named ``emeraldrapids`` by LLVM, and ``rocketlake`` by a later call, on
    # the same machine; a CPU LLVM does not know is ``generic``: neither may refuse an
    # artifact that uses only what this CPU runs.
    has = sorted(cpu_isa())
    if not has:
        pytest.skip("this CPU lists no instruction set of ISA")
    monkeypatch.setattr(tvm.target.codegen, "llvm_get_system_cpu", lambda: "x86-64")
    assert not target_isa(default_target())  # LLVM's name for this CPU now promises nothing
    load(_tampered(shipped[0], tmp_path / "named.tt", cpu_features=has))


def test_an_artifact_is_judged_by_its_target_not_only_by_the_sets_its_manifest_names(
    shipped, tmp_path
):
    # An artifact written when ISA was shorter (before VBMI, GFNI and the like were on it)
    # names fewer sets than its target's code may use: an Ice Lake build would have loaded on
    # a Cascade Lake and died of SIGILL.
    mcpus = ("icelake-server", "sapphirerapids", "graniterapids", "znver4", "znver5", "haswell")
    other = next(({"kind": "llvm", "mcpu": m} for m in mcpus
                  if target_isa({"kind": "llvm", "mcpu": m}) - cpu_isa()), None)  # fmt: skip
    if other is None:
        pytest.skip("this CPU runs all these CPUs' code")
    lacking = sorted(target_isa(other) - cpu_isa())
    old = _tampered(shipped[0], tmp_path / "old.tt", target=other, cpu_features=[])
    with pytest.raises(ArtifactError, match=f"CPU with {re.escape(', '.join(lacking))}, which"):
        load(old)
    for target in ("x", {"kind": "llvm", "mcpu": 7}):
        with pytest.raises(ArtifactError, match=r"damaged manifest \(target\)"):
            load(_tampered(shipped[0], tmp_path / "t.tt", target=target))


def test_instruction_sets_llvm_emits_beyond_avx512f_are_judged():
    # VBMI and GFNI (byte shuffles and shifts), among others: an Ice Lake build would have
    # passed on a Cascade Lake, whose AVX-512 lacks them
    icelake = target_isa({"kind": "llvm", "mcpu": "icelake-server"})
    assert {"avx512vbmi", "avx512vbmi2", "avx512bitalg", "avx512vpopcntdq", "avx512ifma", "gfni",
            "vpclmulqdq"} <= icelake  # fmt: skip
    assert not {"avx512vbmi", "gfni"} & target_isa({"kind": "llvm", "mcpu": "cascadelake"})


def test_files_that_are_not_artifacts_get_one_line(tmp_path):
    (tmp_path / "garbage.tt").write_bytes(b"\x7fELF not really" * 100)
    with pytest.raises(ArtifactError, match="not a zip file"):
        load(tmp_path / "garbage.tt")
    with pytest.raises(ArtifactError, match="no such file"):
        load(tmp_path / "missing.tt")
    with zipfile.ZipFile(tmp_path / "empty.tt", "w") as z:
        z.writestr("readme.txt", "hello")
    with pytest.raises(ArtifactError, match=r"no manifest\.json"):
        load(tmp_path / "empty.tt")
    with zipfile.ZipFile(tmp_path / "bad.tt", "w") as z:
        z.writestr("manifest.json", "{not json")
        z.writestr("model.so", b"")
    with pytest.raises(ArtifactError, match="damaged manifest"):
        load(tmp_path / "bad.tt")
    # A manifest that inflates to 30 MB, and one nested deeper than Python's parser goes.
    with zipfile.ZipFile(tmp_path / "bomb.tt", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("manifest.json", " " * 30_000_000 + "{}")
        z.writestr("model.so", b"")
    assert (tmp_path / "bomb.tt").stat().st_size < 100_000
    with pytest.raises(ArtifactError, match="damaged manifest"):
        load(tmp_path / "bomb.tt")
    with zipfile.ZipFile(tmp_path / "deep.tt", "w") as z:
        z.writestr("manifest.json", "[" * 100_000 + "]" * 100_000)
        z.writestr("model.so", b"")
    with pytest.raises(ArtifactError, match="damaged manifest"):
        load(tmp_path / "deep.tt")
