"""The Python API refuses bad arguments in one line naming the parameter, before it opens a
store or starts a worker: a notebook gets a TensortuneError, not a TypeError from deep inside
or a run that silently does something else (a review's probes, each of which got through)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import tensortune as tt
from tensortune.errors import TensortuneError


def _cases(tmp: Path) -> list[tuple[str, Callable[[], object], str]]:
    url = f"sqlite:///{tmp / 'r.db'}"
    from tensortune.search.draft_verify import check_options

    return [
        # A zero limit recorded every build as a timeout; NaN never times out.
        ("builder, zero timeout", lambda: tt.PersistentBuilder(timeout_s=0), "timeout_s"),
        ("builder, NaN timeout", lambda: tt.PersistentBuilder(timeout_s=float("nan")),
         "timeout_s"),
        ("builder, 2.5 workers", lambda: tt.PersistentBuilder(max_workers=2.5), "max_workers"),
        ("runner, True threads", lambda: tt.PersistentRunner(num_threads=True), "num_threads"),
        ("runner, negative timeout", lambda: tt.PersistentRunner(timeout_s=-1), "timeout_s"),
        ("runner, timing as a dict", lambda: tt.PersistentRunner(timing={"repeat": 3}),
         "timing"),
        # These measured, or failed after the store opened.
        ("collect, 2.5 programs", lambda: tt.collect(["resnet18"], programs_per_task=2.5,
                                                     records=url), "programs_per_task"),
        ("collect, negative seed", lambda: tt.collect(["resnet18"], seed=-1, records=url),
         "seed"),
        ("collect, a sampler by name", lambda: tt.collect(["resnet18"], sampler="balto",
                                                          records=url), "sampler"),
        ("tune, no store", lambda: tt.tune(["matmul:16,16,16"], trials=3, records=None,
                                           work_dir=tmp / "w"), "records"),
        ("transfer, a number as a source", lambda: tt.transfer(5, ["matmul:16,16,16"],
                                                               records=url), "sources"),
        ("plan_tune, a number", lambda: tt.plan_tune(5), "workloads"),
        ("plan_tune, None in the list", lambda: tt.plan_tune([None]), "workloads"),
        # A string was read letter by letter; True was 1; 10**400 overflowed.
        ("draft options as text", lambda: check_options("seeds=0"), "draft_options"),
        ("a draft option of True", lambda: check_options({"eps": True}), "draft_options"),
        ("a huge draft option", lambda: check_options({"population": 10**400}),
         "draft_options"),
        ("bench_tune, no methods", lambda: tt.bench_tune(["matmul:16,16,16"], methods=[],
                                                         trials_per_task=4,
                                                         work_dir=tmp / "b"), "methods"),
        ("bench_tune, 1.5 tasks", lambda: tt.bench_tune(["matmul:16,16,16"], max_tasks=1.5,
                                                        trials_per_task=4,
                                                        work_dir=tmp / "b"), "max_tasks"),
        *_flag_cases(tmp, url),
    ]  # fmt: skip


def _flag_cases(tmp: Path, url: str) -> list[tuple[str, Callable[[], object], str]]:
    # bool("no") is True: each of these switched its setting on, or off with 0 / "".
    from tensortune.costmodel.factory import cost_model_from
    from tensortune.measure.session import MeasureSession

    mm = ["matmul:16,16,16"]
    return [
        ("tune, check_correctness 'no'", lambda: tt.tune(mm, trials=4, records=url,
                                                         work_dir=tmp / "w",
                                                         check_correctness="no"),
         "check_correctness"),
        ("DraftThenVerify, verifier_screens 'no'", lambda: tt.DraftThenVerify(
            verifier_screens="no"), "verifier_screens"),
        ("tune, fast math 'no'", lambda: tt.tune(mm, trials=4, records=url, work_dir=tmp / "w",
                                                 fast_math="no"), "fast_math"),
        ("plan_tune, winograd 0", lambda: tt.plan_tune(mm, trials=4, winograd=0), "winograd"),
        ("resolve_tasks, winograd 'off'", lambda: tt.resolve_tasks(
            mm, platform=tt.resolve_platform(), winograd="off"), "winograd"),
        ("load_model, channels_last 'no'", lambda: tt.load_model("resnet18", target=None,
                                                                 channels_last="no"),
         "channels_last"),
        ("compile_model, winograd 'no'", lambda: tt.compile_model("resnet18", records=url,
                                                                  winograd="no"), "winograd"),
        ("transfer, end_to_end 'no'", lambda: tt.transfer([url], mm, records=url,
                                                          end_to_end="no"), "end_to_end"),
        ("collect, worker 'no'", lambda: tt.collect(["resnet18"], records=url, worker="no"),
         "worker"),
        ("evaluate, measured_here 1", lambda: tt.evaluate("default", measured_here=1),
         "measured_here"),
        ("finetune, validate 'no'", lambda: tt.finetune("default", tmp / "db", samples=16,
                                                        validate="no"), "validate"),
        ("recheck, overwrite 'no'", lambda: tt.recheck_dataset("default", tmp / "out",
                                                               overwrite="no"), "overwrite"),
        ("bench_tune, fast math 'no'", lambda: tt.bench_tune(mm, trials_per_task=4,
                                                             work_dir=tmp / "b",
                                                             fast_math="no"), "fast_math"),
        ("best_programs, tir 'no'", lambda: tt.best_programs(url, tir="no"), "tir"),
        ("resolve_platform, measurable 'no'", lambda: tt.resolve_platform(measurable="no"),
         "measurable"),
        ("open_records, create 'no'", lambda: tt.open_records(url, create="no"), "create"),
        ("import_records, measured_here 'no'", lambda: tt.import_records(
            url, tmp / "db", measured_here="no"), "measured_here"),
        ("runner, check_correctness 'no'", lambda: tt.PersistentRunner(
            check_correctness="no"), "check_correctness"),
        ("session, check_correctness 'no'", lambda: MeasureSession(
            tt.resolve_platform(), check_correctness="no"), "check_correctness"),
        ("timing, cache_flush 'no'", lambda: tt.TimingConfig(cache_flush="no"), "timing"),
        ("cost model, online 1", lambda: cost_model_from("default", tt.resolve_platform(),
                                                         online=1), "online"),
    ]  # fmt: skip


def test_bad_arguments_are_refused_naming_the_parameter_before_any_work(tmp_path: Path) -> None:
    failures = []
    for name, call, param in _cases(tmp_path):
        try:
            call()
        except TensortuneError as e:
            if e.param != param or len(str(e).splitlines()) != 1:
                failures.append(f"{name}: {e.param!r} {e}")
        except Exception as e:
            failures.append(f"{name}: {type(e).__name__}: {e}")
        else:
            failures.append(f"{name}: accepted")
    assert not failures, failures
    assert not (tmp_path / "r.db").exists()  # no store was made for a refused call
    assert not (tmp_path / "b").exists()


def test_times_may_be_numpy_floats_and_counts_are_python_ints() -> None:
    # As every count the API takes (tune's trials included): a NumPy integer is refused in one
    # line, not half taken; a time limit is any real number.
    import numpy as np

    from tensortune.errors import check_count, check_seconds

    assert check_seconds(np.float32(0.5), "t") == 0.5 and check_count(3, "n") == 3
    for bad in (True, np.int64(2), 2.0):
        with pytest.raises(TensortuneError, match="n: must be a whole number"):
            check_count(bad, "n")
