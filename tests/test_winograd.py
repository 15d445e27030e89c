"""Winograd convolutions: which convolutions are rewritten, and that the rewritten model computes
what PyTorch does, partial tiles and wider padding included."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import platform  # noqa: E402

from tensortune.compat import ArgInfo, tvm  # noqa: E402
from tensortune.measure.executable import as_arrays  # noqa: E402
from tensortune.workloads.models import load_model  # noqa: E402
from tensortune.workloads.winograd import transformed_weight  # noqa: E402


class Convs(torch.nn.Module):
    """One convolution of each kind: on a 24×24 image (36 tiles of 4×4 outputs) F(4×4, 3×3),
    on 12×12 (9 tiles of 4×4, 36 of 2×2) F(2×2, 3×3), on 6×6 (9 tiles of 2×2) direct."""

    def __init__(self) -> None:
        super().__init__()
        self.same = torch.nn.Conv2d(16, 32, 3, padding=1)  # F(4×4)
        self.strided = torch.nn.Conv2d(32, 32, 3, stride=2, padding=1)
        self.pointwise = torch.nn.Conv2d(32, 32, 1)
        self.grouped = torch.nn.Conv2d(32, 32, 3, padding=1, groups=4)
        self.narrow = torch.nn.Conv2d(32, 8, 3, padding=1)  # too few output channels
        self.small = torch.nn.Conv2d(32, 32, 3, padding=1)  # 12×12: F(2×2)
        self.halve = torch.nn.Conv2d(32, 32, 3, stride=2, padding=1)
        self.few_tiles = torch.nn.Conv2d(32, 32, 3, padding=1)  # 6×6: too few tiles of any size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.same(x))
        x = self.narrow(self.grouped(self.pointwise(self.strided(x))))
        return self.few_tiles(self.halve(self.small(torch.cat([x, x, x, x], dim=1))))


class Ragged(torch.nn.Module):
    """Outputs that are not whole tiles (22×22: 6×6 tiles of 4×4; 11×11 and 13×13: 6×6 and
    7×7 tiles of 2×2; the last ones partly outside) and padding that is not 'same' (from 22×22
    to 24×24, or 11×11 to 13×13): the tiles must read zeros, not garbage."""

    def __init__(self) -> None:
        super().__init__()
        self.same = torch.nn.Conv2d(16, 16, 3, padding=1)
        self.wide = torch.nn.Conv2d(16, 16, 3, padding=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wide(torch.relu(self.same(x)))


def _load(winograd: bool, net: torch.nn.Module | None = None, size: int = 24):
    torch.manual_seed(0)
    net = (net or Convs()).eval()
    x = torch.randn(1, 16, size, size)
    return net, x, load_model(net, example_inputs=(x,), target=platform().tvm_target,
                              winograd=winograd)  # fmt: skip


def _run(model) -> torch.Tensor:
    vm = tvm.relax.VirtualMachine(tvm.compile(model.mod, target=platform().tvm_target),
                                  tvm.cpu())  # fmt: skip
    return torch.from_numpy(as_arrays(vm["main"](tvm.runtime.tensor(model.inputs[0])))[0])


def _alphas(model) -> list[int]:
    """The transform width α = m + 2 of each Winograd task: its transformed weight is
    (α, α, CO, CI)."""
    alphas = []
    for task in model.tasks:
        if "winograd" in task.name:
            func = next(iter(task.mod.functions.values()))
            shapes = [[int(d) for d in a.shape] for a in ArgInfo.from_prim_func(func)]
            alphas += [s[0] for s in shapes if len(s) == 4 and s[0] == s[1] and s[0] in (4, 6)]
    return sorted(alphas)


def _close(got: torch.Tensor, expected: torch.Tensor) -> bool:
    # Winograd rounds more than a direct convolution, but stays close in float32
    return torch.allclose(got, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))


def test_only_eligible_convolutions_become_winograd_and_outputs_match_pytorch() -> None:
    net, x, model = _load(winograd=True)
    names = [t.name for t in model.tasks]
    assert _alphas(model) == [4, 6], names  # F(2×2) at 12×12, F(4×4) at 24×24
    assert sum("conv2d" in n and "winograd" not in n for n in names) == 6, names
    with torch.no_grad():
        expected = net(x)
    assert _close(_run(model), expected)


@pytest.mark.parametrize(("size", "alpha"), [(22, 6), (11, 4)])
def test_partial_tiles_and_wider_padding_compute_the_convolution(size: int, alpha: int) -> None:
    net, x, model = _load(winograd=True, net=Ragged(), size=size)
    assert _alphas(model) == [alpha, alpha], [t.name for t in model.tasks]
    with torch.no_grad():
        expected = net(x)
    got = _run(model)
    assert got.shape == expected.shape == (1, 16, size + 2, size + 2)
    assert _close(got, expected)


def test_turned_off_every_convolution_stays_direct() -> None:
    _, _, model = _load(winograd=False)
    assert not any("winograd" in t.name for t in model.tasks)


def test_the_transformed_weight_does_not_depend_on_the_weight_layout() -> None:
    weight = np.random.default_rng(0).standard_normal((8, 4, 3, 3)).astype(np.float32)
    for tile in (4, 2):
        oihw = transformed_weight(weight, "OIHW", tile)
        assert oihw.shape == (tile + 2, tile + 2, 8, 4)
        np.testing.assert_array_equal(transformed_weight(weight.transpose(0, 2, 3, 1), "OHWI",
                                                         tile), oihw)  # fmt: skip
        np.testing.assert_array_equal(transformed_weight(weight.transpose(2, 3, 1, 0), "HWIO",
                                                         tile), oihw)  # fmt: skip
