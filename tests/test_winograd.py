"""Winograd convolutions: which convolutions are rewritten, that the rewritten model computes
what PyTorch does, and that it is off unless asked for."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from conftest import platform  # noqa: E402

from tensortune.compat import tvm  # noqa: E402
from tensortune.measure.executable import as_arrays  # noqa: E402
from tensortune.workloads.models import load_model  # noqa: E402


class Convs(torch.nn.Module):
    """One convolution of each kind: only the first is Winograd's."""

    def __init__(self) -> None:
        super().__init__()
        self.same = torch.nn.Conv2d(16, 32, 3, padding=1)  # rewritten
        self.strided = torch.nn.Conv2d(32, 32, 3, stride=2, padding=1)
        self.pointwise = torch.nn.Conv2d(32, 32, 1)
        self.grouped = torch.nn.Conv2d(32, 32, 3, padding=1, groups=4)
        self.narrow = torch.nn.Conv2d(32, 8, 3, padding=1)  # too few output channels
        self.ragged = torch.nn.Conv2d(32, 32, 3, padding=1)  # 6×6: not whole 4×4 tiles

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.same(x))
        x = self.narrow(self.grouped(self.pointwise(self.strided(x))))
        return self.ragged(torch.cat([x, x, x, x], dim=1))


def _load(winograd: bool):
    torch.manual_seed(0)
    net = Convs().eval()
    x = torch.randn(1, 16, 12, 12)
    return net, x, load_model(net, example_inputs=(x,), target=platform().tvm_target,
                              winograd=winograd)  # fmt: skip


def _run(model) -> torch.Tensor:
    vm = tvm.relax.VirtualMachine(tvm.compile(model.mod, target=platform().tvm_target),
                                  tvm.cpu())  # fmt: skip
    return torch.from_numpy(as_arrays(vm["main"](tvm.runtime.tensor(model.inputs[0])))[0])


def test_only_eligible_convolutions_become_winograd_and_outputs_match_pytorch() -> None:
    net, x, model = _load(winograd=True)
    names = [t.name for t in model.tasks]
    assert sum("winograd" in n for n in names) == 1, names
    assert sum("conv2d" in n and "winograd" not in n for n in names) == 5, names
    with torch.no_grad():
        expected = net(x)
    got = _run(model)
    # F(4×4, 3×3) rounds more than a direct convolution, but stays close in float32
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4 * float(expected.abs().max()))


def test_by_default_every_convolution_stays_direct() -> None:
    _, _, model = _load(winograd=False)
    assert not any("winograd" in t.name for t in model.tasks)
