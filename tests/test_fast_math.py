"""Fast math for TIR workloads: what is replaced, what is kept, and how far outputs move."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import platform

from tensortune.compat import structural_equal, tvm
from tensortune.workloads.fast_math import approximate, with_fast_math
from tensortune.workloads.resolve import resolve_tasks
from tensortune.workloads.sources import task_from_spec


def _elementwise(fn, n: int = 4096) -> tvm.IRModule:
    from tvm import te

    x = te.placeholder((n,), "float32", name="x")
    y = te.compute((n,), lambda i: fn(x[i]), name="y")
    return tvm.IRModule({"main": te.create_prim_func([x, y])})


def _run(mod: tvm.IRModule, x: np.ndarray) -> np.ndarray:
    lib = tvm.compile(mod, target=platform().tvm_target)
    dev = tvm.cpu()
    out = tvm.runtime.tensor(np.zeros_like(x), dev)
    lib["main"](tvm.runtime.tensor(x, dev), out)
    return out.numpy()


def _calls(mod: tvm.IRModule) -> str:
    return mod.script()


@pytest.mark.parametrize(
    ("name", "low", "high", "exact"),
    [("exp", -80.0, 80.0, np.exp), ("tanh", -9.0, 9.0, np.tanh),
     ("erf", -4.0, 4.0, np.vectorize(math.erf))],
)  # fmt: skip
def test_approximations_stay_within_a_few_ulps(name: str, low: float, high: float, exact) -> None:
    from tvm import te

    mod = _elementwise(getattr(te, name))
    fast = approximate(mod)
    assert fast is not None
    assert f"T.{name}(" in _calls(mod) and f"T.{name}(" not in _calls(fast)
    x = np.linspace(low, high, 4096, dtype="float32")
    want = exact(x.astype("float64"))
    got = _run(fast, x).astype("float64")
    # float32's ulp is 2^-23 ~ 1.2e-7 relative. With FMA the approximations keep within a few
    # ulps; TARGET is generic x86-64 (no FMA), where exp's range reduction (n * ln 2 rounded
    # to float32) costs up to ~35 ulps near the ends of the range: far inside the 1e-3 that
    # candidates are checked with.
    assert np.max(np.abs(got - want) / np.maximum(np.abs(want), 1.0)) < 1e-5


def test_a_workload_without_those_functions_keeps_its_module() -> None:
    task = task_from_spec("matmul:16,16,16")
    assert approximate(task.mod) is None
    assert with_fast_math(task) is task  # same key: its records still apply


def test_float64_and_other_calls_are_left_alone() -> None:
    from tvm import te

    x = te.placeholder((8,), "float64", name="x")
    y = te.compute((8,), lambda i: te.exp(x[i]) + te.sqrt(x[i]), name="y")
    assert approximate(tvm.IRModule({"main": te.create_prim_func([x, y])})) is None


def test_clamped_inputs_and_nested_calls() -> None:
    from tvm import te

    # fast_tanh clamps its input in a stage of its own: it must come along (tanh(60) is 1).
    mod = _elementwise(lambda v: te.tanh(v * v), 8)
    x = np.array([0.5, 1, 2, 3, 5, 8, -9, 0], dtype="float32")
    np.testing.assert_allclose(_run(approximate(mod), x), np.tanh(x.astype("float64") ** 2),
                               atol=1e-6)  # fmt: skip
    # tanh of an expression holding exp: exp is approximated, tanh keeps libm's call rather
    # than copy exp's approximation ~20 times.
    nested = approximate(_elementwise(lambda v: te.tanh(te.exp(v) * v), 8)).script()
    assert "T.exp(" not in nested and "T.tanh(" in nested


def test_approximating_twice_changes_nothing() -> None:
    fast = approximate(task_from_spec("softmax:4,32").mod)
    assert fast is not None and approximate(fast) is None


def test_resolved_tasks_keep_the_exact_module_to_check_against() -> None:
    (task,) = resolve_tasks(["softmax:4,32"], platform=platform())
    exact = task_from_spec("softmax:4,32").mod
    assert task.exact is not None and structural_equal(task.exact, exact)
    assert task.reference is task.exact
    x = np.random.default_rng(0).standard_normal((4, 32)).astype("float32") * 4
    lib_fast = tvm.compile(task.mod, target=platform().tvm_target)
    lib_exact = tvm.compile(exact, target=platform().tvm_target)
    outs = []
    for lib in (lib_fast, lib_exact):
        out = tvm.runtime.tensor(np.zeros_like(x), tvm.cpu())
        lib["main"](tvm.runtime.tensor(x, tvm.cpu()), out)
        outs.append(out.numpy())
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-7)

    (plain,) = resolve_tasks(["softmax:4,32"], platform=platform(), fast_math=False)
    assert plain.exact is None and structural_equal(plain.mod, exact)


def test_stored_workloads_report_the_specs_flop_not_the_polynomials() -> None:
    from tensortune.workloads.ops import parse_spec
    from tensortune.workloads.sources import estimate_flop, workload_flop

    (task,) = resolve_tasks(["softmax:64,128"], platform=platform())
    spec_flop = parse_spec("softmax:64,128").flop
    assert estimate_flop(task.mod) > 2 * spec_flop  # the polynomial's operations counted too
    assert workload_flop(task.name, task.mod) == spec_flop
    assert workload_flop("my_kernel.main", task.mod) == estimate_flop(task.mod)
