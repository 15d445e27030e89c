"""tune(): records land in the store, budgets resume, and TVM's own tuner and compiler read and
write the store through the PyDatabase adapter.  (A tuner killed with kill -9 mid-batch is in
``test_faults.py``.)"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from conftest import platform

from tensortune.compat import (
    PySearchStrategy,
    derived_object,
    ms,
    sblocks,
    structural_equal,
    tvm,
    tvm_logging_guard,
)
from tensortune.deploy.retime import retime_best
from tensortune.errors import TensortuneError
from tensortune.hardware import current_hardware, target_key
from tensortune.measure.builder import PersistentBuilder
from tensortune.measure.runner import PersistentRunner, TimingConfig
from tensortune.records import open_records
from tensortune.records.convert import candidate_from_trace
from tensortune.records.ms_database import StoreDatabase
from tensortune.tuning.tune import tune
from tensortune.workloads.ops import parse_spec
from tensortune.workloads.task import Task

TARGET = {"kind": "llvm", "num-cores": 2}
FAST = {"strategy": "replay-trace", "cost_model": "random", "target": TARGET}


def test_tune_fills_the_store_and_resumes_to_the_same_budget(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    seen = []
    first = tune(
        ["matmul:32,32,32"], trials=6, records=url, work_dir=tmp_path / "w", trials_per_round=3,
        progress=lambda *a: seen.append(len(a[2])), **FAST,
    )  # fmt: skip
    assert first.trials_before == 0 and first.tasks[0].trials == 6
    assert seen == [3, 3]
    assert first.tasks[0].best_seconds is not None and first.tasks[0].gflops > 0
    assert (tmp_path / "w" / "logs").is_dir()

    again = tune(["matmul:32,32,32"], trials=6, records=url, work_dir=tmp_path / "w", **FAST)
    assert again.trials_before == 6 and again.tasks[0].trials == 6  # nothing more measured

    more = tune(["matmul:32,32,32"], trials=9, records=url, work_dir=tmp_path / "w", **FAST)
    assert more.trials_before == 6 and more.tasks[0].trials == 9
    with open_records(url) as store:
        records = list(store.query())
        assert len(records) == 9
        assert {r.hardware_id for r in records} == {current_hardware().id}
        assert {r.target for r in records} == {target_key(TARGET)}
        assert len({r.run_id for r in records}) == 2
        assert all(len(r.run_secs) == 5 for r in records if r.ok)


@derived_object
class _BreaksOn(PySearchStrategy):
    """MetaSchedule's replay-trace, except that the search of tasks named ``broken`` raises
    (as TVM's own strategies do when a schedule rule mishandles a kernel)."""

    def __init__(self, broken: str, inner: object | None = None) -> None:
        super().__init__()
        self.broken = broken
        self.inner = inner or ms.search_strategy.ReplayTrace()
        self.task = ""

    def _initialize_with_tune_context(self, context) -> None:
        self.task = context.task_name
        self.inner._initialize_with_tune_context(context)

    def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None,
                   cost_model=None) -> None:  # fmt: skip
        self.inner.pre_tuning(max_trials, num_trials_per_iter, design_spaces, database,
                              cost_model)  # fmt: skip

    def post_tuning(self) -> None:
        self.inner.post_tuning()

    def generate_measure_candidates(self):
        if self.broken in self.task:
            raise RuntimeError("ScheduleError: The block no longer exists in the IRModule")
        return self.inner.generate_measure_candidates()

    def notify_runner_results(self, candidates, results) -> None:
        self.inner.notify_runner_results(candidates, results)

    def clone(self) -> _BreaksOn:
        return _BreaksOn(self.broken, self.inner.clone())


def test_a_task_whose_search_breaks_stops_and_the_others_go_on(tmp_path):
    fast = {**FAST, "strategy": _BreaksOn("softmax")}
    result = tune(["matmul:16,16,16", "softmax:4,32"], trials=8, records=f"sqlite:///{tmp_path}/r.db",
                  work_dir=tmp_path / "w", trials_per_round=2, **fast)  # fmt: skip
    matmul, softmax = result.tasks
    assert matmul.trials == 8 and not matmul.error
    assert softmax.trials == 0
    assert softmax.error.endswith("ScheduleError: The block no longer exists in the IRModule")


def test_a_store_that_fails_under_the_search_ends_the_run_with_its_error(tmp_path, monkeypatch):
    # MetaSchedule's search reads the store from C++, which hands a store error on as a plain
    # RuntimeError: each task then "broke" in turn and tune() returned as if all went well.
    from tensortune.errors import RecordsError

    def locked(self, *args):
        raise RecordsError("records store r.db: database is locked")

    monkeypatch.setattr(StoreDatabase._cls, "_records", locked)
    with pytest.raises(RecordsError, match="database is locked"):
        tune(["matmul:16,16,16", "softmax:4,32"], trials=8, records=f"sqlite:///{tmp_path}/r.db",
             work_dir=tmp_path / "w", trials_per_round=2,
             **{**FAST, "strategy": "evolutionary"})  # fmt: skip


def test_several_tasks_share_one_budget(tmp_path):
    result = tune(["matmul:16,16,16", "softmax:4,32"], trials=4, records=f"sqlite:///{tmp_path}/r.db",
                  work_dir=tmp_path / "w", trials_per_round=2, **FAST)  # fmt: skip
    assert sum(t.trials for t in result.tasks) == 4
    assert all(t.trials > 0 for t in result.tasks)
    # Rounds larger than the budget allows: the first pass over the tasks (no round of it
    # committed before every task has had one) still stops at the budget, not 8 + 8, and
    # goes from the task of most work to the least, whatever order they were given in.
    specs = ["matmul:16,16,16", "matmul:32,32,32", "matmul:24,24,24"]
    result = tune(specs, trials=10, records=f"sqlite:///{tmp_path}/big.db",
                  work_dir=tmp_path / "w", trials_per_round=8, **FAST)  # fmt: skip
    assert [t.trials for t in result.tasks] == [0, 8, 2]


def test_each_round_is_committed_before_the_next_is_measured(tmp_path, monkeypatch):
    # MetaSchedule's gradient scheduler collects none of its first pass's rounds before every
    # task has had one: a kill then lost them all.  Ours commits each as soon as it is timed.
    from tensortune.records.ms_callback import RecordToStore

    events: list[str] = []
    run, commit = PersistentRunner._cls.run, RecordToStore._cls.apply
    monkeypatch.setattr(PersistentRunner._cls, "run",
                        lambda self, inputs: events.append("run") or run(self, inputs))  # fmt: skip
    monkeypatch.setattr(RecordToStore._cls, "apply",
                        lambda self, *a: events.append("commit") or commit(self, *a))  # fmt: skip
    specs = ["matmul:16,16,16", "matmul:24,24,24", "matmul:32,32,32"]
    result = tune(specs, trials=8, records=f"sqlite:///{tmp_path}/r.db", work_dir=tmp_path / "w",
                  trials_per_round=2, **FAST)  # fmt: skip
    assert sum(t.trials for t in result.tasks) == 8  # the first pass and a round after it
    assert events == ["run", "commit"] * 4


def test_the_gradient_rule_picks_as_metaschedules_does():
    from tensortune.search.scheduler import INVALID_MS, UNJUDGED_ROUNDS, pick_task

    rng = np.random.default_rng(0)
    kw = {"alpha": 0.2, "window": 3, "rng": rng}
    # Task 0: 4 rounds, 10 → 6 ms; g = 0.2 * (10 - 6) / 3 + 0.8 * 6 / 4 = 1.4667, weight 1.
    # Task 1: 1 round at 5 ms; g = 0.8 * 5 = 4, weight 0.25: 1.0.  Task 2: nothing valid in
    # as many rounds as a task gets to show one.
    history = [[10.0, 8.0, 7.0, 6.0], [5.0], [INVALID_MS] * UNJUDGED_ROUNDS]
    assert pick_task(history, [1.0, 0.25, 9.0], [0, 1, 2], **kw) == 0
    assert pick_task(history, [1.0, 0.5, 9.0], [0, 1, 2], **kw) == 1  # 2.0 now
    assert pick_task(history, [1.0, 0.5, 9.0], [0, 2], **kw) == 0  # a finished task is out
    ties = {pick_task([[2.0], [2.0]], [1.0, 1.0], [0, 1], **kw) for _ in range(40)}
    assert ties == {0, 1}  # a tie is drawn at random
    # Where MetaSchedule differs: a task whose first rounds all failed gets the next round
    # (MetaSchedule left it behind after one), until it has had UNJUDGED_ROUNDS.
    for rounds in range(1, UNJUDGED_ROUNDS):
        history[2] = [INVALID_MS] * rounds
        assert pick_task(history, [1.0, 0.5, 0.01], [0, 1, 2], **kw) == 2
    # Two such tasks tie, and a tie is drawn at random (argmax took the first every time).
    history[0] = [INVALID_MS]
    assert {pick_task(history, [1.0, 0.5, 0.01], [0, 1, 2], **kw) for _ in range(40)} == {0, 2}


def test_the_scheduler_sees_a_time_of_zero_as_no_measurement():
    """The store keeps a zero or negative time as a failure; as a task's best (0 ms) it made
    the task's gradient 0, below every other's, and the task was never picked again."""
    from tensortune.compat import ms
    from tensortune.search.scheduler import INVALID_MS, _Latencies

    seen = []

    class Scheduler:
        def observe(self, task: int, latencies: list[float]) -> None:
            seen.append((task, latencies))

    ran = [([2e-3, 4e-3], None), ([0.0], None), ([-1e-3, 2e-3, 3e-3], None), ([1e-3], "boom"),
           (None, None)]  # fmt: skip
    built = [ms.builder.BuilderResult("a", None)] * len(ran)
    callback = _Latencies(Scheduler())._inst  # its Python side: TVM's wants a real scheduler
    callback.apply(None, 3, [], built, [ms.runner.RunnerResult(s, e) for s, e in ran])
    assert seen == [(3, [pytest.approx(3.0)] + [INVALID_MS] * 4)]


def _layer_norm(input_name: str) -> tvm.IRModule:
    """A layer norm whose blocks TOPI names after its input (``x_sum``, ``x_mean``, ...)."""
    from tvm import te, topi

    x = te.placeholder((4, 64), name=input_name)
    gamma, beta = te.placeholder((64,), name="gamma"), te.placeholder((64,), name="beta")
    out = topi.nn.layer_norm(x, gamma, beta, axis=[1])
    return tvm.IRModule({"main": te.create_prim_func([x, gamma, beta, out])})


def test_a_record_applies_to_a_twin_kernel_whose_blocks_are_named_otherwise(tmp_path):
    # the same layer norm cut from two graphs: structurally equal, blocks named after each
    # graph's variable; the trace also fetches by name a block that its rfactor made
    tuned, twin = _layer_norm("x"), _layer_norm("y")
    assert structural_equal(tuned, twin)
    sch = tvm.s_tir.Schedule(tuned)
    _, k = sch.get_loops(sch.get_sblock("x_sum"))
    sch.rfactor(sch.split(k, [None, 8])[1], 0)
    sch.parallel(sch.get_loops(sch.get_sblock("x_sum_rf"))[0])
    target = tvm.target.Target(TARGET)
    with open_records(f"sqlite:///{tmp_path / 'r.db'}") as store:
        db = StoreDatabase(store, target=TARGET)
        db.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, db.commit_workload(tuned), [1e-5], target,
            ms.arg_info.ArgInfo.from_prim_func(tuned["main"]),
        ))  # fmt: skip
        applied = db.query_schedule(twin, target, "layer_norm")
        # compile --retime replays the two best records on the twin: renamed the same way
        plain = tvm.s_tir.Schedule(tuned)
        db.commit_tuning_record(ms.database.TuningRecord(
            plain.trace, db.commit_workload(tuned), [2e-5], target,
            ms.arg_info.ArgInfo.from_prim_func(tuned["main"]),
        ))  # fmt: skip
        retimed = retime_best(store, [Task("layer_norm", twin)], platform(TARGET), top_k=2)
    assert applied is not None
    names = [b.name_hint for b in sblocks(applied.mod["main"].body)]
    assert "y_sum_rf" in names and not [n for n in names if n.startswith("x_")]
    assert [r.candidates for r in retimed.values()] == [2]


def test_tvm_tune_tir_and_compile_tir_use_the_store(tmp_path):
    store = open_records(f"sqlite:///{tmp_path / 'r.db'}")
    mod = parse_spec("matmul:32,32,32").to_module()
    db = StoreDatabase(store, target=TARGET)
    builder, runner = PersistentBuilder(), PersistentRunner(TimingConfig(repeat=2))
    try:
        with tvm_logging_guard():
            ms.tune_tir(mod, tvm.target.Target(TARGET), str(tmp_path / "w"), max_trials_global=4,
                        num_trials_per_iter=4, builder=builder, runner=runner, database=db,
                        strategy="replay-trace", cost_model="random")  # fmt: skip
    finally:
        builder.close()
        runner.close()
    assert store.count() == 4 and len(db) == 4
    sch = ms.tir_integration.compile_tir(db, mod, tvm.target.Target(TARGET))
    assert sch is not None
    # TVM compiles the program of the store's fastest record, whatever TVM chose to tune.
    best, *others = store.query(ok_only=True, best_first=True)
    assert others and best.cost < min(r.cost for r in others)
    assert structural_equal(sch.mod, candidate_from_trace(mod, best.trace).sch.mod)


def test_a_tune_leaves_the_callers_logging_as_it_was(tmp_path):
    # MetaSchedule's logger set-up runs dictConfig, which closed every handler of the process:
    # a notebook logging to a file opened with mode "w" lost every line after the first tune,
    # and the run's own log files stayed open after it.
    import logging
    import os

    handler = logging.FileHandler(tmp_path / "mine.log", mode="w")
    mine = logging.getLogger("a_users_app")
    mine.addHandler(handler)
    mine.setLevel(logging.INFO)
    try:
        mine.info("before")
        tune(["matmul:16,16,16"], trials=2, trials_per_round=2,
             records=f"sqlite:///{tmp_path / 'r.db'}", work_dir=tmp_path / "w", **FAST)  # fmt: skip
        mine.info("after")
        handler.flush()
        assert (tmp_path / "mine.log").read_text().split() == ["before", "after"]
    finally:
        mine.removeHandler(handler)
        handler.close()
    logs = {p.name: p.read_text() for p in (tmp_path / "w" / "logs").glob("tvm.s_tir.*.log")}
    task = next(text for name, text in logs.items() if "task_0" in name)
    scheduler = next(text for name, text in logs.items() if "task_scheduler" in name)
    assert "Initializing Task #0" in task and scheduler.strip(), logs  # MetaSchedule's lines
    held = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")]  # fmt: skip
    assert not [f for f in held if str(tmp_path / "w" / "logs") in f], held


def test_a_spent_time_budget_measures_nothing_and_a_rerun_resumes(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    # Gone before the first round: resolving the task alone takes longer than a microsecond.
    first = tune(["matmul:32,32,32"], max_seconds=1e-6, records=url, work_dir=tmp_path / "w",
                 **FAST)  # fmt: skip
    assert first.out_of_time and first.trials_total == 0 and first.trials_requested is None
    # and nothing was set up to measure nothing: no workers started, no task's search begun
    assert not (tmp_path / "w" / "logs").exists()
    second = tune(["matmul:32,32,32"], trials=4, max_seconds=3600, records=url,
                  work_dir=tmp_path / "w", trials_per_round=2, **FAST)  # fmt: skip
    assert second.tasks[0].trials == 4 and not second.out_of_time


def test_under_a_time_budget_every_task_gets_a_round_within_the_trial_budget(tmp_path):
    # With both budgets, rounds of the time budget's size (32) would let the first task spend
    # the 16 trials and leave the other untuned: a round is cut to an even share (8).
    specs = ["matmul:16,16,16", "matmul:16,32,16"]
    result = tune(specs, trials=16, max_seconds=3600, records=f"sqlite:///{tmp_path / 'r.db'}",
                  work_dir=tmp_path / "w", **FAST)  # fmt: skip
    assert result.trials_total == 16 and [t.trials for t in result.tasks] == [8, 8]
    # every task has a best time: the model's estimate is whole, Σ weight x best
    times = [t.best_seconds for t in result.tasks]
    assert None not in times and result.weighted_seconds() == pytest.approx(sum(times))
    result.tasks[1].best_seconds = None
    assert result.weighted_seconds() is None
    assert result.weighted_seconds(partial=True) == pytest.approx(times[0])


def test_a_budget_under_8_trials_a_task_still_gives_every_task_a_round(tmp_path):
    # Rounds were never under 8 and first rounds go in task order: 12 trials for these four
    # tasks tuned [8, 4, 0, 0].  The scheduler is one object for both runs: the first run's
    # state, kept, starved a task of the second.
    from tensortune.search.scheduler import GradientScheduler

    scheduler, url = GradientScheduler(seed=0), f"sqlite:///{tmp_path / 'r.db'}"
    first = tune(["matmul:8,8,8", "matmul:16,16,16"], trials=8, records=url,
                 work_dir=tmp_path / "w", task_scheduler=scheduler, **FAST)  # fmt: skip
    assert [t.trials for t in first.tasks] == [4, 4]
    specs = ["matmul:8,8,16", "matmul:16,8,8", "matmul:8,16,8", "matmul:16,16,8"]
    second = tune(specs, trials=12, records=url, work_dir=tmp_path / "w",
                  task_scheduler=scheduler, **FAST)  # fmt: skip
    assert [t.trials for t in second.tasks] == [3, 3, 3, 3]


def test_the_deadline_ends_the_search_after_the_round_in_flight(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from tensortune.search import leases

    # The budget's clock jumps past the deadline once the first round is recorded.
    late: list[int] = []
    clock = SimpleNamespace(
        monotonic=lambda: time.monotonic() + (1e9 if late else 0.0), sleep=time.sleep
    )
    monkeypatch.setattr(leases, "time", clock)
    result = tune(["matmul:32,32,32", "matmul:16,32,32"], max_seconds=3600,
                  records=f"sqlite:///{tmp_path / 'r.db'}", work_dir=tmp_path / "w",
                  trials_per_round=2, progress=lambda *a: late.append(1), **FAST)  # fmt: skip
    # Without the deadline nothing would end this run (no trial budget); with it, what was
    # already drawn is measured (a round of each task, at most) and nothing more.
    assert result.out_of_time and 2 <= result.trials_total <= 4
    assert len(late) == result.trials_total // 2
    assert result.trials_requested is None and result.seconds > 0


def test_a_trial_budget_spent_by_a_round_that_crossed_the_deadline_is_not_out_of_time(
    tmp_path, monkeypatch
):
    from types import SimpleNamespace

    from tensortune.search import leases

    late: list[int] = []
    clock = SimpleNamespace(
        monotonic=lambda: time.monotonic() + (1e9 if late else 0.0), sleep=time.sleep
    )
    monkeypatch.setattr(leases, "time", clock)
    result = tune(["matmul:32,32,32"], trials=2, max_seconds=3600, trials_per_round=2,
                  records=f"sqlite:///{tmp_path / 'r.db'}", work_dir=tmp_path / "w",
                  progress=lambda *a: late.append(1), **FAST)  # fmt: skip
    assert late and result.trials_total == 2 and not result.out_of_time


def test_a_task_whose_search_broke_is_not_one_the_clock_stopped(tmp_path, monkeypatch):
    """The clock passes the deadline once matmul has its 4; softmax's search broke at once:
    time stopped nothing, and "run again to go on" would measure nothing new."""
    from types import SimpleNamespace

    from tensortune.search import leases

    batches: list[int] = []
    clock = SimpleNamespace(
        monotonic=lambda: time.monotonic() + (1e9 if len(batches) >= 2 else 0.0),
        sleep=time.sleep,
    )
    monkeypatch.setattr(leases, "time", clock)
    result = tune(["matmul:16,16,16", "softmax:4,32"], trials=8, max_trials_per_task=4,
                  max_seconds=3600, trials_per_round=2, records=f"sqlite:///{tmp_path}/r.db",
                  work_dir=tmp_path / "w", progress=lambda *a: batches.append(1),
                  **{**FAST, "strategy": _BreaksOn("softmax")})  # fmt: skip
    matmul, softmax = result.tasks
    assert matmul.trials == 4 and softmax.trials == 0 and softmax.error
    assert not result.out_of_time


def test_cli_says_the_time_budget_stopped_the_run(cli, tmp_path):
    code, out, err = cli("tune", "-w", "matmul:32,32,32", "--time", "0.000001s",
                         "--records", f"sqlite:///{tmp_path / 'r.db'}", "--work-dir", "w",
                         "--strategy", "replay-trace", "--cost-model", "random",
                         "--target", '{"kind": "llvm", "num-cores": 2}')  # fmt: skip
    assert code == 0, err
    assert "stopped: the time budget (0.000001s) is spent" in out


def test_kernels_with_weights_beyond_the_l2_caches_are_tuned_cold_unless_told(cli, tmp_path):
    # B is 16 MiB: beyond any CPU's L2 caches.  A cold timing is one call after evicting it,
    # TimingConfig.cold_repeat (10) of them; a hot one keeps TimingConfig.repeat (5).
    big = ["-w", "matmul:1,4096,1024", "--trials", "2", "--strategy", "replay-trace",
           "--cost-model", "random", "--no-check"]  # fmt: skip
    for flag, timings in (("--cold-weights", 10), ("--hot-weights", 5)):
        url = f"sqlite:///{tmp_path / flag[2:]}.db"
        code, _, err = cli("tune", *big, flag, "--records", url, "--json")
        assert code == 0, err
        with open_records(url) as store:
            assert {len(r.run_secs) for r in store.query(ok_only=True)} == {timings}
    small = tune(["matmul:4,64,64"], trials=2, records=f"sqlite:///{tmp_path / 's.db'}",
                 work_dir=tmp_path / "w", **FAST)  # fmt: skip
    with open_records(small.records_url) as store:
        assert {len(r.run_secs) for r in store.query(ok_only=True)} == {5}


def test_a_tune_needs_trials_or_time(tmp_path):
    with pytest.raises(TensortuneError, match="trial budget, a time budget"):
        tune(["matmul:32,32,32"], records=f"sqlite:///{tmp_path / 'r.db'}", **FAST)
    with pytest.raises(TensortuneError, match="must be positive"):
        tune(["matmul:32,32,32"], max_seconds=0, records=f"sqlite:///{tmp_path / 'r.db'}",
             **FAST)  # fmt: skip
    assert not (tmp_path / "r.db").exists()


def test_unknown_strategy_is_rejected_before_the_store_is_opened(tmp_path):
    with pytest.raises(TensortuneError, match="'no-such-strategy' is not a search strategy") as e:
        tune(["matmul:8,8,8"], trials=2, records=f"sqlite:///{tmp_path}/r.db",
             work_dir=tmp_path / "w", strategy="no-such-strategy", target=TARGET)  # fmt: skip
    assert e.value.param == "strategy"
    assert not (tmp_path / "r.db").exists() and not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    ("name", "value"), [("task_scheduler", "Gradient"), ("task_scheduler", 3), ("progress", True)]
)
def test_a_scheduler_or_progress_nothing_can_use_is_refused_before_the_store_is_opened(
    tmp_path, name, value
):
    # TVM would refuse the scheduler's name once warm-start schedules were timed, and a
    # progress that cannot be called broke the run after its first batch
    with pytest.raises(TensortuneError) as e:
        tune(["matmul:8,8,8"], trials=2, records=f"sqlite:///{tmp_path}/r.db",
             work_dir=tmp_path / "w", target=TARGET, **{name: value})  # fmt: skip
    assert e.value.param == name and repr(value) in str(e.value)
    assert not (tmp_path / "r.db").exists() and not (tmp_path / "w").exists()


def test_records_of_another_target_do_not_count_toward_the_budget(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    tune(["matmul:16,16,16"], trials=2, records=url, work_dir=tmp_path / "w", **FAST)
    other = {"kind": "llvm", "num-cores": 1}
    result = tune(["matmul:16,16,16"], trials=2, records=url, work_dir=tmp_path / "w",
                  strategy="replay-trace", cost_model="random", target=other)  # fmt: skip
    assert result.trials_before == 0
    with open_records(url) as store:
        assert store.count() == 4


@pytest.fixture(autouse=True)
def _no_stray_workdir(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    yield
    assert not (Path(tmp_path) / "tensortune.db").exists()


def test_a_task_whose_first_round_all_failed_gets_another_round(tmp_path):
    """MetaSchedule's rule picks a task with nothing valid last: one first round that all
    failed (a tight timeout, a filter not yet trained) left the task untuned for the run."""
    from tensortune.compat import PyRunner, derived_object, ms
    from tensortune.measure.runner import PersistentRunner

    @derived_object
    class FirstRoundFails(PyRunner):  # the first batch measured fails, whatever it holds
        def __init__(self) -> None:
            super().__init__()
            self.inner, self.calls = PersistentRunner(num_threads=1), 0

        def run(self, inputs: list) -> list:
            self.calls += 1
            if self.calls > 1:
                return self.inner.run(inputs)
            done = ms.runner.local_runner.LocalRunnerFuture
            return [done(error_message="[timeout] run: too slow") for _ in inputs]

    runner = FirstRoundFails()
    try:
        result = tune(["matmul:32,32,32", "matmul:16,16,16"], trials=6, trials_per_round=2,
                      records=f"sqlite:///{tmp_path / 'r.db'}", work_dir=tmp_path / "w",
                      runner=runner, check_correctness=False, **FAST)  # fmt: skip
    finally:
        runner.inner.close()
    first = next(t for t in result.tasks if t.name == "matmul:32,32,32")  # the heavier: first
    assert first.trials > 2 and first.ok > 0


def test_metaschedules_warnings_go_to_stderr_not_among_the_json_on_stdout(tmp_path, capsys):
    import logging

    from tensortune.search.run import _task_loggers

    with _task_loggers(tmp_path, ["matmul:16,16,16"]):
        logging.getLogger("tvm.s_tir.meta_schedule.task_scheduler").warning("a warning")
    out, err = capsys.readouterr()
    assert "a warning" in err and out == ""
