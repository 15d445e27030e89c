"""dataset collect: random + evolved programs per task, on every hardware configuration, resumable,
with each workload's networks recorded."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tensortune.collect import collect  # noqa: E402
from tensortune.compat import tvm  # noqa: E402
from tensortune.errors import TensortuneError  # noqa: E402
from tensortune.hardware import (  # noqa: E402
    CONFIGS,
    HardwareConfig,
    target_key,
)
from tensortune.records import open_records  # noqa: E402
from tensortune.select.samplers import RandomSampler  # noqa: E402
from tensortune.workloads.models import load_model  # noqa: E402
from tensortune.workloads.ops import parse_spec  # noqa: E402

SMALL = [
    HardwareConfig("a", {"kind": "llvm", "num-cores": 2}, "2 cores"),
    HardwareConfig("b", {"kind": "llvm", "num-cores": 1}, "1 core"),
]


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return load_model(Tiny().eval(), example_inputs=(torch.randn(2, 16),),
                      target=tvm.target.Target(SMALL[0].target), name="tiny")  # fmt: skip


def test_collect_fills_every_task_on_every_configuration_and_resumes(tiny, tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    first = collect([tiny], configs=SMALL, programs_per_task=4, records=url,
                    work_dir=tmp_path / "w")  # fmt: skip
    assert first.tasks == len(tiny.tasks)
    with open_records(url) as store:
        sources = store.task_sources("tiny")
        assert {s.task_name for s in sources} == {t.name for t in tiny.tasks}
        for config in SMALL:
            for s in sources:
                n = store.count(workload_id=s.workload_id, target=target_key(config.target))
                assert n >= 2  # the random half at least; tiny spaces may run dry after that
        total = store.count()
    again = collect([tiny], configs=SMALL, programs_per_task=4, records=url,
                    work_dir=tmp_path / "w")  # fmt: skip
    with open_records(url) as store:
        assert store.count() == total + again.measured
    assert again.measured <= first.measured


def test_random_sampler_never_repeats_a_measured_program():
    mod = parse_spec("matmul:32,32,32").to_module()
    from conftest import platform

    target = platform({"kind": "llvm", "num-cores": 2})
    sampler = RandomSampler()
    first = sampler.sample(mod, target, 6, seed=0, exclude=set())
    from tensortune.records.convert import trace_text

    seen = {trace_text(c.sch.trace) for c in first}
    assert len(seen) == len(first) == 6
    second = sampler.sample(mod, target, 6, seed=0, exclude=seen)
    assert not seen & {trace_text(c.sch.trace) for c in second}


def test_the_shipped_configurations_differ_in_isa_and_threads():
    a, b = CONFIGS["avx512-2c"], CONFIGS["avx2-1c"]
    assert (a.threads, b.threads) == (2, 1)
    assert a.target["mcpu"] != b.target["mcpu"]
    with pytest.raises(TensortuneError, match="unknown hardware configuration"):
        collect(["gpt2-block"], configs=["no-such-config"], records="sqlite:///:memory:")
