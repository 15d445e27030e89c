"""torch.compile(model, backend="tensortune"): found through the entry point, builds each graph
with the store's records, matches eager, and says what it could not build."""

from __future__ import annotations

import os
import warnings

import pytest

torch = pytest.importorskip("torch")
# Dynamo wraps a backend's error; the tensortune error it holds is what users read.
from torch._dynamo.exc import BackendCompilerFailed  # noqa: E402

from tensortune.compat import tvm  # noqa: E402
from tensortune.deploy import torch_backend  # noqa: E402
from tensortune.errors import TensortuneError  # noqa: E402
from tensortune.records import open_records  # noqa: E402
from tensortune.tuning.tune import tune  # noqa: E402
from tensortune.workloads.models import load_model  # noqa: E402

TARGET = {"kind": "llvm", "num-cores": 2}


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x)).mean(dim=(2, 3))
        return self.fc(h)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_the_backend_is_found_by_name_without_importing_it():
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("tensortune") is torch_backend.tensortune_backend


def test_a_compiled_module_matches_eager_and_uses_the_tuned_records(tmp_path):
    torch.manual_seed(0)
    module, x = Block().eval(), torch.randn(2, 3, 16, 16)
    url = f"sqlite:///{tmp_path / 'r.db'}"
    model = load_model(module, example_inputs=(x,), target=tvm.target.Target(TARGET))
    tune(model=model, trials=3 * len(model.tasks), records=url, work_dir=tmp_path / "w",
         trials_per_round=3, strategy="replay-trace", cost_model="random",
         target=TARGET)  # fmt: skip
    with open_records(url, create=False) as store:
        tuned = sum(1 for t in model.tasks
                    if next(store.query(workload_id=store.workload_id(t.mod, create=False),
                                        ok_only=True, limit=1), None))  # fmt: skip
    built = torch_backend.stats.built
    compiled = torch.compile(module, backend="tensortune",
                             options={"records": url, "target": TARGET})  # fmt: skip
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        got = compiled(x)
        want = module(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert torch_backend.stats.built == built + 1
    untuned = [str(w.message) for w in caught if "no tuned record" in str(w.message)]
    if tuned == len(model.tasks):
        assert not untuned
    else:
        assert untuned and f"{len(model.tasks) - tuned} of {len(model.tasks)}" in untuned[0]


def test_without_a_store_kernels_get_unmeasured_programs_and_it_says_so(tmp_path, monkeypatch):
    from tensortune.deploy import unrecorded

    seeded, real = [], unrecorded.seed_unrecorded

    def spy(mod, platform):
        seeded.append(mod)
        return real(mod, platform)

    monkeypatch.setattr(unrecorded, "seed_unrecorded", spy)
    module, x = Block().eval(), torch.randn(2, 3, 16, 16)
    url = f"sqlite:///{tmp_path / 'none.db'}"
    compiled = torch.compile(module, backend="tensortune", options={"records": url,
                                                                    "target": TARGET})  # fmt: skip
    with pytest.warns(UserWarning) as caught, torch.no_grad():
        got = compiled(x)
    said = [str(w.message) for w in caught]
    assert any("none.db" in m and "no kernel has a tuned record" in m for m in said), said
    assert seeded, "built by tvm.compile: every kernel from its bare loops"
    with torch.no_grad():
        torch.testing.assert_close(got, module(x), rtol=1e-4, atol=1e-5)
    assert not (tmp_path / "none.db").exists()  # compiling writes no store


def test_tensors_on_another_device_run_eagerly_and_threads_stay_within_the_cpus(monkeypatch):
    # A CUDA model's graph was run on zeros made on the CPU (a device mismatch surfaced as
    # Dynamo's traceback), and a graph of no weights built for the CPU, its outputs moved there.
    from tensortune.hardware import usable_cores

    gm = torch.fx.symbolic_trace(Block().eval())
    before = torch_backend.stats.eager
    with pytest.warns(UserWarning, match="on meta, and tensortune builds for the CPU"):
        run = torch_backend.tensortune_backend(gm, [torch.empty(2, 3, 16, 16, device="meta")])
    assert run == gm.forward and torch_backend.stats.eager == before + 1

    # A target of more cores than the process may use: as many threads as it may
    def not_built(*args):
        raise RuntimeError("not built in this test")

    monkeypatch.setenv("TVM_NUM_THREADS", "")  # so that monkeypatch puts the old value back
    monkeypatch.delenv("TVM_NUM_THREADS")
    monkeypatch.setattr(torch_backend, "_build", not_built)
    wide, x = {**TARGET, "num-cores": usable_cores() + 30}, torch.randn(2, 3, 16, 16)
    with pytest.raises(RuntimeError, match="not built"):  # the backend builds at once
        torch_backend.tensortune_backend(gm, [x], {"target": wide})
    assert os.environ["TVM_NUM_THREADS"] == str(usable_cores())


@pytest.mark.parametrize("kept", [4, 1])
def test_two_modules_of_one_class_each_get_their_own_weights(tmp_path, monkeypatch, kept):
    # Dynamo hands one compiled graph every module of a class (it guards on the type)
    monkeypatch.setattr(torch_backend, "MAX_BUILDS", kept)
    opts = {"records": f"sqlite:///{tmp_path / 'none.db'}", "target": TARGET}
    torch.manual_seed(1)
    a, b, x = torch.nn.Linear(8, 8).eval(), torch.nn.Linear(8, 8).eval(), torch.randn(2, 8)
    f = torch.compile(lambda m, x: m(x), backend="tensortune", options=opts)
    built = torch_backend.stats.built
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # untuned
        for m in (a, b, a):
            torch.testing.assert_close(f(m, x), m(x), rtol=1e-4, atol=1e-5)
    # a's and b's builds; a's again only when one build is all that is kept
    assert torch_backend.stats.built == built + (2 if kept > 1 else 3)


def test_weights_changed_in_place_get_a_build_of_their_own(tmp_path):
    """load_state_dict (or an optimizer step) keeps the tensors and Dynamo does not compile
    again: the build must not go on with the weights it baked in."""
    opts = {"records": f"sqlite:///{tmp_path / 'none.db'}", "target": TARGET}
    torch.manual_seed(2)
    m, x = torch.nn.Linear(8, 8).eval(), torch.randn(2, 8)
    f = torch.compile(m, backend="tensortune", options=opts)
    built = torch_backend.stats.built
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # untuned
        torch.testing.assert_close(f(x), m(x), rtol=1e-4, atol=1e-5)
        m.load_state_dict({k: torch.randn_like(v) for k, v in m.state_dict().items()})
        torch.testing.assert_close(f(x), m(x), rtol=1e-4, atol=1e-5)
    assert torch_backend.stats.built == built + 2


def test_a_module_made_in_inference_mode_compiles(tmp_path):
    """Its parameters are inference tensors, which count no in-place changes: new weights
    loaded in place there still get a build of their own (it ran the old ones)."""
    opts = {"records": f"sqlite:///{tmp_path / 'none.db'}", "target": TARGET}
    with torch.inference_mode():
        m, x = torch.nn.Linear(8, 8).eval(), torch.randn(2, 8)
        f = torch.compile(m, backend="tensortune", options=opts)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # untuned
            torch.testing.assert_close(f(x), m(x), rtol=1e-4, atol=1e-5)
            m.load_state_dict({k: torch.randn_like(v) for k, v in m.state_dict().items()})
            torch.testing.assert_close(f(x), m(x), rtol=1e-4, atol=1e-5)


def test_a_broken_store_is_an_error_not_an_untuned_build(tmp_path):
    """Only a store that does not exist yet builds untuned with a warning: a corrupt file or a
    mistyped URL would otherwise run the model hundreds of times slower, silently tuned."""
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"not a database" * 100)
    for url in (f"sqlite:///{bad}", f"sqllite:///{tmp_path / 'r.db'}"):
        torch._dynamo.reset()
        f = torch.compile(torch.nn.Linear(4, 4).eval(), backend="tensortune",
                          options={"records": url, "target": TARGET})  # fmt: skip
        refused = r"not a database|unsupported records URL"
        with pytest.raises(BackendCompilerFailed, match=refused) as e:
            f(torch.randn(1, 4))
        assert isinstance(e.value.inner_exception, TensortuneError)


def test_an_unknown_option_is_refused():
    compiled = torch.compile(Block().eval(), backend="tensortune", options={"record": "x"})
    with pytest.raises(BackendCompilerFailed, match="unknown tensortune backend option") as e:
        compiled(torch.randn(1, 3, 8, 8))
    assert isinstance(e.value.inner_exception, TensortuneError)
    # bool("no") is True: a flag given as text switched fast math on.
    torch._dynamo.reset()
    compiled = torch.compile(Block().eval(), backend="tensortune", options={"fast_math": "no"})
    with pytest.raises(BackendCompilerFailed, match="fast_math: must be True or False") as e:
        compiled(torch.randn(1, 3, 8, 8))
    assert isinstance(e.value.inner_exception, TensortuneError)
