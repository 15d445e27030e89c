"""compile_model: records applied through MetaScheduleApplyDatabase, fallback for untuned tasks,
outputs equal to the untuned build, latencies of all three builds reported."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tensortune.compat import tvm  # noqa: E402
from tensortune.deploy.compile import compile_model  # noqa: E402
from tensortune.errors import TensortuneError  # noqa: E402
from tensortune.measure.executable import timing_repeats  # noqa: E402
from tensortune.records import open_records  # noqa: E402
from tensortune.tuning.tune import tune  # noqa: E402
from tensortune.workloads.models import load_model  # noqa: E402

TARGET = {"kind": "llvm", "num-cores": 2}


class TinyMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc2(torch.relu(self.fc1(x))), dim=-1)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return load_model(TinyMLP().eval(), example_inputs=(torch.randn(4, 32),),
                      target=tvm.target.Target(TARGET))  # fmt: skip


def test_tuned_records_are_applied_and_outputs_match(model, tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    n = len(model.tasks)
    result = tune(model=model, trials=2 * n, records=url, work_dir=tmp_path / "w",
                  trials_per_round=2, strategy="replay-trace", cost_model="random",
                  target=TARGET)  # fmt: skip
    tuned_names = {t.name for t in result.tasks if t.best_seconds is not None}
    assert tuned_names, "no task got a successful record"

    report = compile_model(model, records=url, target=TARGET, repeat=3, rounds=2)
    assert {s.name for s in report.tasks if s.tuned} == tuned_names
    assert len(report.tuned_rounds) == len(report.torch_rounds) == 2
    assert min(report.tuned_rounds) <= report.tuned_seconds <= max(report.tuned_rounds)
    assert report.max_abs_error < 1e-4
    assert report.tuned_seconds > 0 and report.untuned_seconds > 0
    assert report.torch_seconds is not None and report.torch_seconds > 0
    # TVM's own default on x86 is half the CPUs: the builds must run with the target's cores.
    assert report.threads == TARGET["num-cores"]


def test_a_store_without_records_falls_back_to_default_schedules(model, tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    open_records(url).close()
    report = compile_model(model, records=url, target=TARGET, repeat=2)
    assert not any(s.tuned for s in report.tasks)
    assert report.max_abs_error == 0.0 or report.max_abs_error < 1e-5


def test_records_of_another_target_are_not_applied(model, tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    tune(model=model, trials=len(model.tasks), records=url, work_dir=tmp_path / "w",
         trials_per_round=1, strategy="replay-trace", cost_model="random",
         target={"kind": "llvm", "num-cores": 1})  # fmt: skip
    report = compile_model(model, records=url, target=TARGET, repeat=2)
    assert not any(s.tuned for s in report.tasks)


def test_slow_builds_are_timed_fewer_times_within_the_budget() -> None:
    # An untuned BERT-base call takes over a minute: ten timings would take a quarter hour.
    assert timing_repeats(85.0, 10) == 1
    assert timing_repeats(4.0, 10, budget_s=30.0) == 7
    assert timing_repeats(0.002, 10) == 10


def test_rounds_and_repeats_must_be_positive():
    with pytest.raises(TensortuneError, match="at least 1"):
        compile_model("resnet18", rounds=0)


def test_retime_exposes_a_best_record_that_lies_and_builds_with_the_fastest_now(model, tmp_path):
    import dataclasses

    from conftest import platform

    from tensortune.deploy.retime import retime_best
    from tensortune.hardware import current_hardware, target_key
    from tensortune.records.ms_database import StoreDatabase

    url = f"sqlite:///{tmp_path / 'r.db'}"
    n = len(model.tasks)
    tune(model=model, trials=3 * n, records=url, work_dir=tmp_path / "w", trials_per_round=3,
         strategy="replay-trace", cost_model="random", target=TARGET)  # fmt: skip
    store = open_records(url)
    hw = store.register_hardware(current_hardware())
    where = {"hardware_id": hw, "target": target_key(TARGET), "ok_only": True}
    task = model.tasks[0]
    wid = store.workload_id(task.mod, create=False)
    slowest = max(store.query(workload_id=wid, **where), key=lambda r: r.cost)
    # The slowest program stored again with an impossible 1 ns: now the store's "best".
    store.add([dataclasses.replace(slowest, run_secs=(1e-9,), id=None)])

    retimed = retime_best(store, model.tasks, platform(TARGET), top_k=3)
    again = retimed[wid]
    assert again.candidates >= 2 and 0 <= again.rank < again.candidates
    assert again.best_stored_seconds is not None and again.best_stored_seconds > 1e-7
    assert again.seconds <= again.best_stored_seconds
    tvm_target = tvm.target.Target(TARGET)

    def served(db: StoreDatabase) -> list[float]:
        return [float(s) for s in db.query_tuning_record(task.mod, tvm_target, task.name).run_secs]

    assert served(StoreDatabase(store, target=TARGET)) == [1e-9]
    pinned = StoreDatabase(store, target=TARGET, pinned={wid: again.chosen})
    assert served(pinned) == pytest.approx(list(again.chosen.run_secs))
    store.close()

    report = compile_model(model, records=url, target=TARGET, repeat=2, rounds=1, retime=3)
    status = next(s for s in report.tasks if s.name == task.name)
    assert status.best_seconds == pytest.approx(1e-9)  # the stored best is still reported
    assert status.retimed_seconds is not None and status.retimed_seconds > 1e-7
    assert report.max_abs_error < 1e-4
