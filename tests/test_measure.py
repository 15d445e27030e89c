"""Persistent builder and runner: real candidates, and kernels that fail every way they can."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import platform

from tensortune.compat import ArgInfo, BuilderInput, RunnerInput, tvm
from tensortune.measure.builder import PersistentBuilder
from tensortune.measure.runner import PersistentRunner, TimingConfig, signature_of
from tensortune.measure.status import Status, classify, run_seconds
from tensortune.search.space import sample_candidates
from tensortune.workloads.ops import parse_spec
from tensortune.workloads.sources import task_from_spec

KERNELS = Path(__file__).parent / "kernels"
TARGET = {"kind": "llvm", "num-cores": 2}


@pytest.fixture(scope="module")
def builder():
    b = PersistentBuilder(max_workers=2, timeout_s=60)
    yield b
    b.close()


def _signature(mod) -> list:
    return signature_of(ArgInfo.from_prim_func(mod["main"]))


def _build(builder, mods) -> list:
    return builder.build([BuilderInput(m, tvm.target.Target(TARGET)) for m in mods])


def _run(runner, artifacts, args_infos) -> list:
    inputs = [RunnerInput(a, "cpu", info) for a, info in zip(artifacts, args_infos, strict=True)]
    return [f.result() for f in runner.run(inputs)]


def test_candidates_are_built_and_timed_with_every_repeat_kept(builder):
    mod = parse_spec("matmul:32,32,32").to_module()
    cands = sample_candidates(mod, platform(TARGET), 4, seed=1)
    built = _build(builder, [c.sch.mod for c in cands])
    assert all(b.error_msg is None for b in built)
    runner = PersistentRunner(TimingConfig(repeat=3, min_repeat_ms=1), timeout_s=30)
    try:
        results = _run(runner, [b.artifact_path for b in built], [c.args_info for c in cands])
    finally:
        runner.close()
    for r in results:
        assert r.error_msg is None
        secs = [float(s) for s in r.run_secs]
        assert len(secs) == 3
        assert all(0 < s < 0.1 for s in secs)


def test_kernels_with_large_weights_are_timed_cold_and_the_others_hot(builder):
    # matmul:M,N,K -> A is the input; B (4 MiB here) and C are what a cold timing evicts.
    big, small = (parse_spec(s).to_module() for s in ("matmul:4,1024,1024", "matmul:4,64,64"))
    timing = TimingConfig(repeat=2, min_repeat_ms=1, cold_bytes=1 << 20, cold_repeat=4)
    assert timing.for_signature(_signature(big)) == (1, 4, 0, True)
    assert timing.for_signature(_signature(small)) == (1, 2, 1, False)
    assert TimingConfig().for_signature(_signature(big))[3] is False  # off unless asked
    built = _build(builder, [big, small])
    runner = PersistentRunner(timing, timeout_s=30)
    try:
        infos = [ArgInfo.from_prim_func(m["main"]) for m in (big, small)]
        results = _run(runner, [b.artifact_path for b in built], infos)
    finally:
        runner.close()
    assert [len(r.run_secs) for r in results] == [4, 2]
    assert all(float(s) > 0 for r in results for s in r.run_secs)


def test_builds_run_in_parallel_workers_that_persist(builder):
    mods = [parse_spec(f"matmul:{n},16,16").to_module() for n in (8, 16, 24, 32)]
    _build(builder, mods)
    pids_before = {w.process.pid for w in builder._pool._workers}
    _build(builder, mods)
    assert len(pids_before) == 2
    assert {w.process.pid for w in builder._pool._workers} == pids_before


def test_a_build_error_is_classified_and_does_not_stop_the_batch(builder):
    good = parse_spec("matmul:8,8,8").to_module()
    broken = tvm.IRModule(
        {"main": tvm.tirx.PrimFunc([], tvm.tirx.Evaluate(tvm.tirx.Var("x", "int32")))}
    )
    ok, bad = _build(builder, [good, broken])
    assert ok.error_msg is None and Path(ok.artifact_path).is_file()
    assert bad.artifact_path is None
    assert classify(bad.error_msg, None) is Status.BUILD_ERROR


def test_a_crashing_kernel_costs_only_its_worker(builder):
    crash = task_from_spec(str(KERNELS / "crash.py")).mod
    good = parse_spec("matmul:8,8,8").to_module()
    built = _build(builder, [crash, good, crash, good])
    runner = PersistentRunner(TimingConfig(repeat=1, min_repeat_ms=1), timeout_s=30)
    try:
        infos = [ArgInfo.from_prim_func(m["main"]) for m in (crash, good, crash, good)]
        results = _run(runner, [b.artifact_path for b in built], infos)
        assert runner._pool.restarts == 2
    finally:
        runner.close()
    assert [classify(None, r.error_msg) for r in results] == [
        Status.RUN_ERROR, Status.OK, Status.RUN_ERROR, Status.OK
    ]  # fmt: skip
    assert "SIGSEGV" in results[0].error_msg


def test_a_hanging_kernel_times_out_and_the_next_one_runs(builder):
    hang = task_from_spec(str(KERNELS / "hang.py")).mod
    good = parse_spec("matmul:8,8,8").to_module()
    built = _build(builder, [hang, good])
    runner = PersistentRunner(TimingConfig(repeat=1, min_repeat_ms=1), timeout_s=3)
    try:
        infos = [ArgInfo.from_prim_func(m["main"]) for m in (hang, good)]
        hung, fine = _run(runner, [b.artifact_path for b in built], infos)
    finally:
        runner.close()
    assert classify(None, hung.error_msg) is Status.TIMEOUT
    assert fine.error_msg is None


def test_a_wrong_result_is_caught_against_the_reference(builder):
    reference = parse_spec("matmul:16,16,16").to_module()
    # Same argument signature, different computation: C = A + B.
    a, b = tvm.te.placeholder((16, 16), name="A"), tvm.te.placeholder((16, 16), name="B")
    c = tvm.te.compute((16, 16), lambda i, j: a[i, j] + b[i, j], name="C")
    impostor = tvm.IRModule({"main": tvm.te.create_prim_func([a, b, c])})
    right = sample_candidates(reference, platform(TARGET), 1, seed=3)[0]
    ref_build, impostor_build, right_build = _build(builder, [reference, impostor, right.sch.mod])
    runner = PersistentRunner(TimingConfig(repeat=1, min_repeat_ms=1), check_correctness=True)
    try:
        runner.add_reference(_signature(reference), ref_build.artifact_path)
        wrong, ok = _run(
            runner,
            [impostor_build.artifact_path, right_build.artifact_path],
            [ArgInfo.from_prim_func(impostor["main"]), right.args_info],
        )
    finally:
        runner.close()
    assert classify(None, wrong.error_msg) is Status.WRONG_RESULT
    assert ok.error_msg is None


def test_a_wrong_mask_is_a_wrong_result(builder):
    # bools cannot be subtracted: the error's figure made it a run error
    def mask(compare) -> object:
        a, b = tvm.te.placeholder((8, 8), name="A"), tvm.te.placeholder((8, 8), name="B")
        c = tvm.te.compute((8, 8), lambda i, j: compare(a[i, j], b[i, j]), name="C")
        return tvm.IRModule({"main": tvm.te.create_prim_func([a, b, c])})

    reference, impostor = mask(lambda x, y: x > y), mask(lambda x, y: x < y)
    ref_build, impostor_build = _build(builder, [reference, impostor])
    runner = PersistentRunner(TimingConfig(repeat=1, min_repeat_ms=1), check_correctness=True)
    try:
        runner.add_reference(_signature(reference), ref_build.artifact_path)
        (wrong,) = _run(runner, [impostor_build.artifact_path],
                        [ArgInfo.from_prim_func(impostor["main"])])  # fmt: skip
    finally:
        runner.close()
    assert classify(None, wrong.error_msg) is Status.WRONG_RESULT, wrong.error_msg


def test_every_output_is_checked_wherever_it_stands_in_the_signature(builder):
    # Only the last argument was compared: an output first, or the first of two, went
    # unchecked (the check compared an input with itself).
    def kernel(first, second, order) -> object:
        a = tvm.te.placeholder((8, 8), name="A")
        b = tvm.te.compute((8, 8), lambda i, j: first(a[i, j]), name="B")
        c = tvm.te.compute((8, 8), lambda i, j: second(a[i, j]), name="C")
        args = {"A": a, "B": b, "C": c}
        return tvm.IRModule({"main": tvm.te.create_prim_func([args[n] for n in order])})

    double, triple = (lambda x: x * 2.0), (lambda x: x * 3.0)
    cases = [("BA", kernel(double, triple, "BA"), kernel(triple, triple, "BA")),  # output first
             ("ABC", kernel(double, triple, "ABC"), kernel(triple, triple, "ABC"))]  # fmt: skip
    runner = PersistentRunner(TimingConfig(repeat=1, min_repeat_ms=1), check_correctness=True)
    try:
        for order, reference, impostor in cases:
            ref_build, impostor_build, same_build = _build(builder, [reference, impostor,
                                                                     reference])  # fmt: skip
            runner.add_reference(_signature(reference), ref_build.artifact_path)
            wrong, right = _run(runner, [impostor_build.artifact_path, same_build.artifact_path],
                                [ArgInfo.from_prim_func(reference["main"])] * 2)  # fmt: skip
            assert classify(None, wrong.error_msg) is Status.WRONG_RESULT, (order, wrong)
            assert right.error_msg is None, (order, right.error_msg)
    finally:
        runner.close()


def test_a_coarse_floats_output_is_checked_to_its_own_precision():
    import ml_dtypes
    import numpy as np

    from tensortune.measure.worker import _mismatch

    rng = np.random.default_rng(0)
    a, b = rng.uniform(-1, 1, (16, 64)), rng.uniform(-1, 1, (64, 16))
    bf16 = ml_dtypes.bfloat16
    # the same products summed in two orders, each sum rounded to bfloat16 as it goes
    terms = (a[:, :, None] * b[None, :, :]).astype(bf16)
    forward, backward = np.zeros((16, 16), bf16), np.zeros((16, 16), bf16)
    for k in range(64):
        forward = (forward + terms[:, k]).astype(bf16)
        backward = (backward + terms[:, 63 - k]).astype(bf16)
    assert _mismatch(forward, forward) is None
    assert (forward != backward).any() and _mismatch(backward, forward) is None
    assert _mismatch((backward * 1.5).astype(bf16), forward) is not None
    # float32 keeps its tolerance: a relative error of 1e-2 is wrong
    want = (a @ b).astype(np.float32)
    assert _mismatch((want * 1.01).astype(np.float32), want) is not None


def test_the_reference_runs_once_per_kernel_not_once_per_candidate(builder, monkeypatch):
    # its unscheduled loops ran again beside every candidate, inside the candidate's time
    from tensortune.measure import worker

    reference = parse_spec("matmul:16,16,16").to_module()
    candidates = sample_candidates(reference, platform(TARGET), 2, seed=3)
    ref_build, *builds = _build(builder, [reference, *(c.sch.mod for c in candidates)])
    calls, load = [], worker._load

    def counting(path: str):
        module = load(path)
        if path != ref_build.artifact_path:
            return module
        return lambda *args: calls.append(path) or module(*args)

    monkeypatch.setattr(worker, "_load", counting)
    monkeypatch.setattr(worker, "_outputs", {})
    for built in builds:
        out = worker.run(built.artifact_path, _signature(reference), number=1, repeat=1,
                         min_repeat_ms=0, cache_flush=False,
                         reference=ref_build.artifact_path)  # fmt: skip
        assert out["mismatch"] is None and len(out["costs"]) == 1
    assert len(calls) == 1


def test_an_ambiguous_reference_disables_the_check_for_that_signature():
    runner = PersistentRunner(check_correctness=True)
    sig = [("float32", [4, 4])] * 3
    runner.add_reference(sig, "/nonexistent/a.so")
    runner.add_reference(sig, "/nonexistent/b.so")
    assert runner._references[repr(sig)] is None
    runner.close()


def test_the_runner_worker_uses_the_requested_thread_count(builder):
    """TVM's run-time pool follows TVM_NUM_THREADS, so the worker must start with it set."""
    mod = parse_spec("matmul:64,64,64").to_module()
    (built,) = _build(builder, [mod])
    runner = PersistentRunner(TimingConfig(repeat=1, min_repeat_ms=1), num_threads=1)
    try:
        _run(runner, [built.artifact_path], [ArgInfo.from_prim_func(mod["main"])])
        pid = runner._pool._workers[0].process.pid
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        assert b"TVM_NUM_THREADS=1" in environ
    finally:
        runner.close()


def test_a_batch_for_another_device_is_refused_not_timed_on_the_cpu(builder):
    # Every RunnerInput said "cpu" and the runner never read it: a GPU target's batch, once
    # allowed, would have been timed as CPU code.
    from tensortune.errors import TensortuneError
    from tensortune.hardware import Platform

    mod = parse_spec("matmul:16,16,16").to_module()
    (built,) = _build(builder, [mod])
    args = ArgInfo.from_prim_func(mod["main"])
    assert platform().device_type == "cpu"
    gpu = Platform({"kind": "cuda", "arch": "sm_90"}, platform().hardware)  # not measurable
    assert gpu.device_type == "cuda"
    runner = PersistentRunner(TimingConfig(repeat=1, min_repeat_ms=1), num_threads=1)
    try:
        cpu, llvm = (RunnerInput(built.artifact_path, d, args) for d in ("cpu", "llvm"))
        # (through TVM's object system, which hands the error back as a RuntimeError)
        with pytest.raises((TensortuneError, RuntimeError), match="not on device 'cuda'"):
            runner.run([cpu, RunnerInput(built.artifact_path, "cuda", args)])
        # MetaSchedule's task scheduler names the device by the target's kind
        assert all(f.result().error_msg is None for f in runner.run([cpu, llvm]))
    finally:
        runner.close()


def _thread_cores(pid: int) -> dict[int, set[int]]:
    tasks = Path(f"/proc/{pid}/task")
    return {int(t.name): os.sched_getaffinity(int(t.name)) for t in tasks.iterdir()}


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="TVM pins no thread on one core")
def test_the_thread_that_launches_kernels_keeps_off_the_pool_threads_cores(builder, tmp_path):
    """TVM pins its pool's threads and leaves the caller free to land on one of their cores,
    where a kernel runs up to twice as slow (``measure.affinity``): after a timing, the
    worker's main thread may run only where no pinned thread does."""
    mod = parse_spec("matmul:128,128,128").to_module()
    (cand,) = sample_candidates(mod, platform(TARGET), 1, seed=1)  # a parallel loop, or more
    (built,) = _build(builder, [cand.sch.mod])
    runner = PersistentRunner(TimingConfig(repeat=1, min_repeat_ms=1), num_threads=2)
    try:
        _run(runner, [built.artifact_path], [cand.args_info])
        pid = runner._pool._workers[0].process.pid
        cores = _thread_cores(pid)
        main = cores.pop(pid)
        pinned = set().union(*(c for c in cores.values() if len(c) == 1))
        assert pinned, "TVM pinned none of its pool threads"
        assert main and not main & pinned
        # Taken over by another pool (builds, say), the worker gets all its cores back.
        runner._pool.map("adopt", [(str(tmp_path), None)], timeout_s=30)
        assert _thread_cores(pid)[pid] == os.sched_getaffinity(0)
    finally:
        runner.close()


class ScriptedCpu:
    """Pressure readings injected into ``measure.contention``: each timing window of 10 ms
    sees the next share of waiting for a CPU from ``shares``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, shares: list[float]) -> None:
        from tensortune.measure import contention

        self.shares, self.clock, self.wait = list(shares), 0.0, 0.0
        self.reads = self.windows = 0
        monkeypatch.setattr(contention, "_psi_wait_s", self._wait)
        monkeypatch.setattr(contention, "_steal_s", lambda: None)
        monkeypatch.setattr(contention, "perf_counter", self._now)

    def _now(self) -> float:
        # Read once when a window opens and once when it closes, before the pressure is.
        self.reads += 1
        if self.reads % 2 == 0:
            self.windows += 1
            self.clock += 0.010
            self.wait += 0.010 * self.shares.pop(0)
        return self.clock

    def _wait(self) -> float:
        return self.wait


def test_the_watch_reports_the_share_of_the_window_spent_waiting(monkeypatch):
    from tensortune.measure import contention

    cpu = ScriptedCpu(monkeypatch, [0.0, 0.5])
    assert contention.CpuWatch().share() == pytest.approx(0.0)
    assert contention.CpuWatch().share() == pytest.approx(0.5)
    # Steal time counts too, spread over every CPU, and the larger of the two is the answer.
    steal = iter([1.0, 1.0 + 0.010 * 0.8 * (os.cpu_count() or 1)])
    monkeypatch.setattr(contention, "_steal_s", lambda: next(steal))
    cpu.shares.append(0.1)
    assert contention.CpuWatch().share() == pytest.approx(0.8)


@pytest.mark.parametrize(("shares", "timings", "contended"), [
    ([0.0], 1, False),  # quiet: timed once, trusted
    ([0.6, 0.0], 2, False),  # contended, then quiet on the retry: the retry is kept
    ([0.6, 0.7], 2, True),  # contended every time: flagged, the faster timing kept
])  # fmt: skip
def test_a_contended_timing_is_retried_then_flagged(builder, monkeypatch, shares, timings,
                                                    contended):  # fmt: skip
    from tensortune.measure import worker

    mod = parse_spec("matmul:16,16,16").to_module()
    (built,) = _build(builder, [mod])
    cpu = ScriptedCpu(monkeypatch, shares)
    out = worker.run(built.artifact_path, _signature(mod), number=1, repeat=2, min_repeat_ms=0,
                     cache_flush=False, reference=None, max_wait_share=0.2, retries=1)  # fmt: skip
    assert cpu.windows == timings and not cpu.shares
    assert out["contended"] is contended and len(out["costs"]) == 2 and out["mismatch"] is None


@pytest.mark.skipif(not Path("/proc/pressure/cpu").exists(), reason="needs Linux PSI")
def test_timings_beside_two_busy_processes_are_flagged(builder):
    """The real check, which busy neighbours can only make more true: two processes spinning
    on two cores make the kernel's threads wait for a CPU about half the time or more."""
    import subprocess
    import sys
    import time

    mod = parse_spec("matmul:128,128,128").to_module()
    (built,) = _build(builder, [mod])
    timing = TimingConfig(repeat=2, min_repeat_ms=20, max_wait_share=0.2, retries=1)
    runner = PersistentRunner(timing, num_threads=2)
    args = [ArgInfo.from_prim_func(mod["main"])]
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.3)
        (busy,) = _run(runner, [built.artifact_path], args)
    finally:
        for b in burners:
            b.kill()
            b.wait()
        runner.close()
    assert busy.error_msg is None and len(busy.run_secs) == 2  # still a measurement
    assert runner.contended == 1


def test_contended_retries_stop_before_the_time_limit(builder, monkeypatch):
    """A timing that keeps meeting a busy machine is retried only while a retry still ends
    within the time given: a candidate is kept with its fastest timing, not killed."""
    import tensortune.measure.contention as contention
    from tensortune.measure import worker

    class Busy(contention.CpuWatch):  # every timing contended
        attempts = 0

        def __init__(self) -> None:
            super().__init__()
            Busy.attempts += 1

        def share(self) -> float:
            return 1.0

    monkeypatch.setattr(contention, "CpuWatch", Busy)
    mod = parse_spec("matmul:32,32,32").to_module()
    (built,) = _build(builder, [mod])
    args = (built.artifact_path, _signature(mod), 1, 2, 1, False, None, 0.2, 3)
    assert worker.run(*args)["contended"] and Busy.attempts == 4  # no limit: every retry
    Busy.attempts = 0
    done = worker.run(*args, 0.0)  # no time for any retry
    assert done["contended"] and len(done["costs"]) == 2 and Busy.attempts == 1


def test_classify_recognises_tvm_local_builder_and_runner_messages():
    assert classify("LocalBuilder: Timeout, killed after 30 seconds", None) is Status.TIMEOUT
    assert classify("LocalBuilder: An exception occurred\nTraceback", None) is Status.BUILD_ERROR
    assert classify(None, "LocalRunner: An exception occurred") is Status.RUN_ERROR
    assert classify(None, None) is Status.OK


@pytest.mark.parametrize(("host", "cpu_env", "stubbed"), [
    ("x86_64", None, {"arm_cpu", "riscv_cpu"}), ("aarch64", None, {"riscv_cpu"}),
    ("arm64", None, {"riscv_cpu"}), ("riscv64", None, {"arm_cpu"}), ("x86_64", "1", set()),
])  # fmt: skip
def test_only_this_hosts_cpu_intrinsics_are_imported(monkeypatch, host, cpu_env, stubbed):
    import platform
    import sys

    from tensortune.compat import stub_unused_intrinsics

    names = ("arm_cpu", "riscv_cpu")
    for name in names:
        monkeypatch.delitem(sys.modules, f"tvm.s_tir.tensor_intrin.{name}", raising=False)
    monkeypatch.setattr(platform, "machine", lambda: host)
    if cpu_env is None:
        monkeypatch.delenv("TENSORTUNE_CPU_INTRINSICS", raising=False)
    else:
        monkeypatch.setenv("TENSORTUNE_CPU_INTRINSICS", cpu_env)
    stub_unused_intrinsics()
    assert {n for n in names if f"tvm.s_tir.tensor_intrin.{n}" in sys.modules} == stubbed


def test_a_worker_is_replaced_after_its_share_of_jobs():
    """A long collection loads tens of thousands of kernels: a fresh runner process every
    ``max_jobs`` keeps one process from running out of memory mappings."""
    from tensortune.measure.pool import WorkerPool

    with WorkerPool(1, max_jobs=3) as pool:
        pids = [o.value for o in pool.map("ping", [()] * 7, timeout_s=60)]
        assert pool.restarts == 2
    assert pids[0] == pids[1] == pids[2] != pids[3] == pids[4] == pids[5] != pids[6]


def test_a_worker_that_died_idle_is_replaced() -> None:
    from tensortune.measure.pool import WorkerPool

    with WorkerPool(1) as pool:
        first = pool.wait_ready()[0].process
        first.kill()  # the OOM killer, say, between two batches
        first.wait()
        outcomes = pool.map("ping", [(), ()], timeout_s=60)
    assert [o.kind for o in outcomes] == ["ok", "ok"]
    assert first.pid not in [o.value for o in outcomes]


def test_a_worker_leaves_hangups_and_terminations_to_the_tuner() -> None:
    # A group SIGHUP (a closed terminal) or SIGTERM (systemd) killed the workers mid-batch,
    # and the tuner, finishing the batch, stored good programs as "worker killed by SIGHUP".
    import signal

    from tensortune.measure.pool import WorkerPool

    with WorkerPool(1) as pool:
        worker = pool.wait_ready()[0].process
        for sig in (signal.SIGHUP, signal.SIGTERM):
            os.kill(worker.pid, sig)
        outcomes = pool.map("ping", [()], timeout_s=60)
    assert [o.kind for o in outcomes] == ["ok"] and outcomes[0].value == worker.pid


def test_a_forked_child_leaves_its_parents_idle_workers_alone() -> None:
    # A child that exited normally ran the atexit close and ended the parent's idle workers.
    from tensortune.measure.pool import _IDLE, WorkerPool

    with WorkerPool(1, reuse=True) as pool:
        worker = pool.wait_ready()[0].process
    assert worker.poll() is None  # idle, kept for the next pool
    pid = os.fork()
    if pid == 0:
        _IDLE.close(final=True)  # what the child's atexit runs
        os._exit(0)
    os.waitpid(pid, 0)
    assert worker.poll() is None
    with WorkerPool(1, reuse=True) as pool:
        assert pool.map("ping", [()], timeout_s=60)[0].value == worker.pid


def test_a_worker_that_died_while_starting_is_replaced() -> None:
    # the OOM killer during its TVM import: the map raised, and so did every later one
    from tensortune.measure.pool import WorkerPool

    for wait_first in (False, True):
        with WorkerPool(1) as pool:
            pool.start()
            starting = pool._workers[0].process
            starting.kill()
            starting.wait()
            if wait_first:  # a caller that waits for the workers before its first batch
                assert pool.wait_ready()[0].process.pid != starting.pid
            outcomes = pool.map("ping", [()], timeout_s=60)
        assert [o.kind for o in outcomes] == ["ok"] and outcomes[0].value != starting.pid


def test_a_worker_still_starting_delays_no_other_job() -> None:
    # The map waited for its TVM import, the other workers' answers unread meanwhile: their
    # jobs were recorded as taking that long (a builder's build times, a deadline kept late).
    import time

    from tensortune.measure.pool import WorkerPool

    with WorkerPool(2) as pool:
        pool.wait_ready()
        began = time.monotonic()
        fresh = pool._replace(pool._workers[0])  # as after a crash: it imports TVM again
        outcomes = pool.map("ping", [()] * 4, timeout_s=60)
        fresh.wait_ready()
        start_took = time.monotonic() - began
    assert [o.kind for o in outcomes] == ["ok"] * 4
    assert max(o.seconds for o in outcomes) < start_took / 4, (outcomes, start_took)


@pytest.mark.timeout(120)
def test_workers_that_keep_dying_before_their_first_job_end_the_map() -> None:
    """A worker killed between batches is replaced; when its replacements die at start too,
    the cause is the environment, not a kernel, and the map says so instead of spinning."""
    from tensortune.measure.pool import WorkerPool

    with WorkerPool(1) as pool:
        first = pool.wait_ready()[0].process
        first.kill()
        first.wait()
        pool.env["PYTHONHOME"] = "/nonexistent"  # every fresh interpreter dies at start
        with pytest.raises(RuntimeError, match="3 measurement workers in a row died"):
            pool.map("ping", [(), ()], timeout_s=60)
        assert pool.restarts == 3  # the one killed while idle is not counted against starts
        del pool.env["PYTHONHOME"]  # the cause gone, the same pool measures again
        assert [o.kind for o in pool.map("ping", [()], timeout_s=60)] == ["ok"]


def test_a_closed_pools_workers_serve_the_next_pool_of_the_same_environment(tmp_path, monkeypatch):
    """Reusing pools (a tuner's) hand their idle workers on: no second TVM import per tune()."""
    from tensortune.measure.pool import WorkerPool, close_idle_workers

    def pids(pool: WorkerPool, jobs: int = 1) -> list[int]:
        return [o.value for o in pool.map("ping", [()] * jobs, timeout_s=60)]

    def taken(pool: WorkerPool) -> int:
        """The worker a map would send its job to (``map`` starts the pool this way), without
        waiting for a fresh one's TVM import."""
        pool.start()
        return pool._workers[0].process.pid

    close_idle_workers()
    env = {"TENSORTUNE_TEST_POOL": "a"}
    with WorkerPool(1, env, str(tmp_path / "a.log"), reuse=True) as pool:
        (first,) = pids(pool)
    # idle, it holds nothing of its last pool's open (a directory its owner may remove)
    assert os.readlink(f"/proc/{first}/cwd") == "/"
    assert os.readlink(f"/proc/{first}/fd/2") == os.devnull
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "b")
    with WorkerPool(1, env, str(tmp_path / "b.log"), reuse=True) as pool:
        assert pids(pool) == [first]
        # as if started here: this process's directory, the new pool's log
        assert os.readlink(f"/proc/{first}/cwd") == str(tmp_path / "b")
        assert os.readlink(f"/proc/{first}/fd/2") == str(tmp_path / "b.log")
    with WorkerPool(1, {"TENSORTUNE_TEST_POOL": "b"}, reuse=True) as pool:
        assert taken(pool) != first  # another environment: another worker
    with WorkerPool(1, env) as pool:
        assert taken(pool) != first  # a pool that does not reuse starts its own
    with WorkerPool(1, env, reuse=True) as pool:
        assert pids(pool) == [first]
        worker = pool.wait_ready()[0].process
        worker.kill()  # dies while idle in the pool: replaced, nothing lost
        worker.wait()
        (second,) = pids(pool)
    assert second != first

    with WorkerPool(1, env, reuse=True) as pool:
        assert pids(pool) == [second]  # its second job
    with WorkerPool(1, env, max_jobs=3, reuse=True) as pool:
        got = pids(pool, 3)
    assert got[0] == second != got[1] == got[2]  # its share of jobs counts over its life
    third = got[1]

    with WorkerPool(1, env, reuse=True) as pool:
        w = pool.wait_ready()[0]
        w.conn.send(("ping", ()))  # an answer left unread: not a worker to hand on
        assert w.conn.poll(60)
    with WorkerPool(1, env, reuse=True) as pool:
        (fourth,) = pids(pool)
        # A map ended by an interrupt that TVM turned into an error the run went on after:
        # the worker still owes an answer, which must not answer the next map's job.
        w = pool.wait_ready()[0]
        w.busy = True
        w.conn.send(("ping", ()))
        assert pids(pool) != [fourth]
    assert fourth != third

    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:  # a process pinned to one core starts workers pinned to it: not reused
        with WorkerPool(1, env, reuse=True) as pool:
            (fifth,) = pids(pool)
        try:
            os.sched_setaffinity(0, cpus[:1])
            with WorkerPool(1, env, reuse=True) as pool:
                assert taken(pool) != fifth
        finally:
            os.sched_setaffinity(0, cpus)
    close_idle_workers()


def test_build_directories_of_dead_processes_are_removed(tmp_path, monkeypatch) -> None:
    import subprocess
    import sys
    import tempfile

    from tensortune.measure.builder import _pid_scope

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    scope = _pid_scope()
    (tmp_path / f"tensortune-build-{gone}-{scope}-abc").mkdir()
    (tmp_path / f"tensortune-build-{os.getpid()}-{scope}-own").mkdir()  # this process's: kept
    # Another pid namespace's (a container sharing /tmp sees its live pids as gone), and a
    # name without a scope: kept (the first was swept from under a live builder).
    kept = [f"tensortune-build-{gone}-n0other-abc", f"tensortune-build-{gone}-abc"]
    for name in kept:
        (tmp_path / name).mkdir()
    builder = PersistentBuilder(max_workers=1)
    names = sorted(p.name for p in tmp_path.iterdir())
    builder.close()
    assert f"tensortune-build-{gone}-{scope}-abc" not in names
    assert f"tensortune-build-{os.getpid()}-{scope}-own" in names
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"tensortune-build-{os.getpid()}-{scope}-own", *kept]
    )


def test_a_cgroup_cpu_quota_bounds_the_cores_used(tmp_path, monkeypatch) -> None:
    # A container limited to 2 CPUs of a 64-core host ran 64 threads and started 64 builders
    # (194 MB each): only the affinity mask was read.
    from tensortune.hardware import fingerprint

    root = tmp_path / "cgroup"
    (root / "job" / "task").mkdir(parents=True)
    (root / "cpu.max").write_text("max 100000\n")
    (root / "job" / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs: 2 threads' worth
    (root / "job" / "task" / "cpu.max").write_text("max 100000\n")
    v2 = tmp_path / "v2"
    v2.write_text("0::/job/task\n")
    assert fingerprint.cgroup_cpu_quota(v2, root) == 2
    (root / "job" / "cpu.max").write_text("max 100000\n")
    assert fingerprint.cgroup_cpu_quota(v2, root) is None
    v1root = tmp_path / "v1"
    (v1root / "cpu,cpuacct" / "job").mkdir(parents=True)
    (v1root / "cpu,cpuacct" / "job" / "cpu.cfs_quota_us").write_text("300000\n")
    (v1root / "cpu,cpuacct" / "job" / "cpu.cfs_period_us").write_text("100000\n")
    v1 = tmp_path / "v1-cgroup"
    v1.write_text("4:memory:/x\n2:cpu,cpuacct:/job\n")
    assert fingerprint.cgroup_cpu_quota(v1, v1root) == 3
    monkeypatch.setattr(fingerprint, "cgroup_cpu_quota", lambda: 1)
    assert fingerprint.usable_cores() == 1
    # The machine keeps its id: the quota bounds the threads, it does not describe the CPU.
    fingerprint.current_hardware.cache_clear()
    try:
        assert fingerprint.current_hardware().cores == len(os.sched_getaffinity(0))
    finally:
        fingerprint.current_hardware.cache_clear()
    b = PersistentBuilder()
    try:
        assert b.max_workers == 1
    finally:
        b.close()


def test_a_cache_whose_size_the_system_leaves_empty_is_not_known(tmp_path) -> None:
    # An empty size file raised ValueError out of current_hardware() (only OSError was caught).
    from tensortune.hardware.fingerprint import _caches

    for name, (level, kind, size) in {"index0": ("1", "Data", "48K"),
                                      "index2": ("2", "Unified", "")}.items():  # fmt: skip
        (tmp_path / name).mkdir()
        for field, value in (("level", level), ("type", kind), ("size", size)):
            (tmp_path / name / field).write_text(value + "\n")
    assert _caches(tmp_path) == {"L1d": 48 * 1024}


def test_a_run_time_is_the_median_of_repeats_that_all_measured_something():
    assert run_seconds([3e-3, 1e-3, 2e-3]) == 2e-3
    # MetaSchedule's failure convention, no repeats, and times no timer reads from a kernel
    # that ran: as a task's best, a 0 made every other program's label 0 / cost.
    for secs in ([1e10], [], None, [0.0], [2e-3, 0.0, 1e-3], [-1e-3], [float("nan"), 1e-3]):
        assert run_seconds(secs) == float("inf"), secs


def test_a_session_refused_for_its_timing_closes_the_builder_it_started(monkeypatch):
    """A notebook's bad ``timing=`` left the builder's workers running (the traceback keeps
    the frame that held them)."""
    from conftest import platform

    import tensortune.measure.session as session
    from tensortune.errors import TensortuneError

    closed = []

    class Builder:
        def __init__(self, **kwargs) -> None:
            pass

        def close(self) -> None:
            closed.append(True)

    monkeypatch.setattr(session, "PersistentBuilder", Builder)
    with pytest.raises(TensortuneError, match="a TimingConfig, not"):
        session.MeasureSession(platform(), timing={"number": 3})
    assert closed == [True]
