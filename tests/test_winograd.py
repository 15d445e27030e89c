"""Winograd convolutions: which convolutions are rewritten, and that the rewritten model computes
what PyTorch does, partial tiles and wider padding included."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import platform  # noqa: E402

from tensortune.compat import tvm  # noqa: E402
from tensortune.measure.executable import as_arrays  # noqa: E402
from tensortune.workloads.models import load_model  # noqa: E402
from tensortune.workloads.winograd import TILE, transformed_weight  # noqa: E402


class Convs(torch.nn.Module):
    """One convolution of each kind on a 24×24 image (6×6 tiles of 4×4 outputs): only the first
    is Winograd's."""

    def __init__(self) -> None:
        super().__init__()
        self.same = torch.nn.Conv2d(16, 32, 3, padding=1)  # rewritten
        self.strided = torch.nn.Conv2d(32, 32, 3, stride=2, padding=1)
        self.pointwise = torch.nn.Conv2d(32, 32, 1)
        self.grouped = torch.nn.Conv2d(32, 32, 3, padding=1, groups=4)
        self.narrow = torch.nn.Conv2d(32, 8, 3, padding=1)  # too few output channels
        self.few_tiles = torch.nn.Conv2d(32, 32, 3, padding=1)  # 12×12: 9 tiles

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.same(x))
        x = self.narrow(self.grouped(self.pointwise(self.strided(x))))
        return self.few_tiles(torch.cat([x, x, x, x], dim=1))


class Ragged(torch.nn.Module):
    """Outputs that are not whole tiles (22×22 → 6×6 tiles, the last ones partly outside) and
    padding that is not 'same' (24×24 from 22×22): the tiles must read zeros, not garbage."""

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


def _close(got: torch.Tensor, expected: torch.Tensor) -> bool:
    # F(4×4, 3×3) rounds more than a direct convolution, but stays close in float32
    return torch.allclose(got, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))


def test_only_eligible_convolutions_become_winograd_and_outputs_match_pytorch() -> None:
    net, x, model = _load(winograd=True)
    names = [t.name for t in model.tasks]
    assert sum("winograd" in n for n in names) == 1, names
    assert sum("conv2d" in n and "winograd" not in n for n in names) == 5, names
    with torch.no_grad():
        expected = net(x)
    assert _close(_run(model), expected)


def test_partial_tiles_and_wider_padding_compute_the_convolution() -> None:
    net, x, model = _load(winograd=True, net=Ragged(), size=22)
    assert sum("winograd" in t.name for t in model.tasks) == 2, [t.name for t in model.tasks]
    with torch.no_grad():
        expected = net(x)
    got = _run(model)
    assert got.shape == expected.shape == (1, 16, 24, 24)
    assert _close(got, expected)


def test_turned_off_every_convolution_stays_direct() -> None:
    _, _, model = _load(winograd=False)
    assert not any("winograd" in t.name for t in model.tasks)


def test_the_transformed_weight_does_not_depend_on_the_weight_layout() -> None:
    weight = np.random.default_rng(0).standard_normal((8, 4, 3, 3)).astype(np.float32)
    oihw = transformed_weight(weight, "OIHW")
    assert oihw.shape == (TILE + 2, TILE + 2, 8, 4)
    np.testing.assert_array_equal(transformed_weight(weight.transpose(0, 2, 3, 1), "OHWI"), oihw)
    np.testing.assert_array_equal(transformed_weight(weight.transpose(2, 3, 1, 0), "HWIO"), oihw)
