"""``bench tune``: methods on the same tasks and budget, curves, speedups, resume, CLI."""

from __future__ import annotations

import itertools
import json
import shutil
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tensortune.cli.app import app
from tensortune.compare.plots import plot_curves
from tensortune.compare.search_methods import BenchResult, MethodRun, bench_tune, run_order
from tensortune.compare.seeds import summarize_seeds
from tensortune.errors import TensortuneError
from tensortune.records.sqlite import SQLiteStore

SPEC = "matmul:64,64,64"


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> tuple[Path, BenchResult]:
    from conftest import TARGET

    work = tmp_path_factory.mktemp("bench")
    result = bench_tune([SPEC], trials_per_task=8, work_dir=work, target=TARGET,
                        methods=["default", "draft"])  # fmt: skip
    return work, result


@pytest.fixture
def bench(measured, tmp_path) -> tuple[Path, BenchResult]:
    """The measured run in a directory of this test's own: a rerun that rewrites it leaves the
    other tests' copy as it was, in whatever order they run."""
    work, result = measured
    own = tmp_path / "bench"
    shutil.copytree(work, own)
    return own, result


def test_every_method_tunes_the_same_budget(bench):
    _, result = bench
    assert set(result.runs) == {"default", "draft"}
    for run in result.runs.values():
        assert run.trials == 8 and run.final_latency and run.final_latency > 0
        times = [t for t, _, _ in run.curve]
        assert times == sorted(times) and run.wall_s >= times[-1]
        lats = [lat for _, _, lat in run.curve if lat is not None]
        assert lats == sorted(lats, reverse=True)  # best-so-far never gets worse
        assert run.breakdown["build"] > 0 and run.breakdown["run"] > 0
    assert result.runs["draft"].breakdown["analyzer"] > 0


def test_speedup_is_time_to_reach_the_defaults_final_latency(bench):
    _, result = bench
    base = result.runs["default"]
    for name, s in result.speedup.items():
        t = result.runs[name].time_to_reach(base.final_latency)
        assert (s is None and t is None) or s == pytest.approx(base.wall_s / t)
    # The default against itself: its whole run over the moment its curve first showed its
    # final latency, read off the curve here rather than through time_to_reach.
    first = min(t for t, _, lat in base.curve if lat is not None and lat <= base.final_latency)
    assert result.speedup["default"] == pytest.approx(base.wall_s / first)


def test_every_curve_is_retimed_on_one_clock_from_its_record_breakers(bench):
    from tensortune.compare.retime import record_breakers

    work, result = bench
    assert result.retimed
    for name, run in result.runs.items():
        # The same points, at the same moments and trials; only the latencies are re-timed.
        assert [p[:2] for p in run.retimed] == [p[:2] for p in run.curve]
        assert [p[2] is None for p in run.retimed] == [p[2] is None for p in run.curve]
        lats = [lat for _, _, lat in run.retimed if lat is not None]
        assert lats == sorted(lats, reverse=True) and lats[-1] > 0
        assert run.final(retimed=True) == lats[-1]
        # The last record-breaker of the one task is the store's best record.
        store = SQLiteStore(str(work / name / "records.db"), create=False)
        ids = sorted(r.id for r in store.query())
        (best,) = store.query(ok_only=True, best_first=True, limit=1)
        store.close()
        breakers = record_breakers(work / name / "records.db")
        assert len({task for _, task, _ in breakers}) == 1
        assert breakers[-1][0] == ids.index(best.id) and breakers[-1][2] == best.trace
    data = json.loads((work / "results.json").read_text())
    assert data["retimed"]["final_latency"] == {k: r.final(True) for k, r in result.runs.items()}
    assert set(data["retimed"]["speedup"]) == set(data["retimed"]["trial_ratio"]) == set(
        result.runs)  # fmt: skip


def test_a_retimed_curve_takes_each_tasks_fastest_record_breaker_so_far():
    from tensortune.compare.retime import retimed_curve

    curve = [(1.0, 2, 9.0), (2.0, 4, 8.0), (3.0, 6, 7.0)]
    breakers = [(0, "a", 3.0), (1, "b", 5.0), (2, "a", 4.0), (4, "b", None), (5, "a", 1.0)]
    again = retimed_curve(curve, breakers, {"a": 1.0, "b": 2.0})
    # After 2 trials: a 3, b 5; the slower re-timing of a's second breaker does not count,
    # nor b's that failed now; after 6: a's third breaker, 1.
    assert again == [(1.0, 2, 13.0), (2.0, 4, 13.0), (3.0, 6, 11.0)]
    assert retimed_curve(curve[:1], breakers[:1], {"a": 1.0, "b": 2.0}) == [(1.0, 2, None)]


def test_a_retiming_round_that_reads_no_time_is_skipped(bench, monkeypatch):
    from conftest import platform

    import tensortune.measure.session as session
    from tensortune.compare.retime import retime_methods
    from tensortune.compat import ms
    from tensortune.workloads.sources import task_from_spec

    class Done:
        def __init__(self, result: object) -> None:
            self.result = lambda: result

    class ReadsZero:  # a timer that read 0 (or less) on every round: nothing was measured
        def __init__(self, *args, **kwargs) -> None:
            self.reads = iter([[0.0], [-1e-6], [0.0, 0.0]] * 1000)

        def run(self, inputs: list) -> list:
            return [Done(ms.runner.RunnerResult(next(self.reads), None)) for _ in inputs]

        def close(self) -> None:
            pass

    work, _ = bench
    monkeypatch.setattr(session, "PersistentRunner", ReadsZero)
    stores = {name: work / name / "records.db" for name in ("default", "draft")}
    breakers = retime_methods(stores, [task_from_spec(SPEC)], platform(), rounds=3)
    assert all(rows for rows in breakers.values())
    assert {seconds for rows in breakers.values() for _, _, seconds in rows} == {None}


def test_retimed_runs_are_kept_and_compared_on_their_own_curves(bench, monkeypatch):
    from conftest import TARGET

    from tensortune.compare import retime

    work, result = bench

    def not_again(*args, **kwargs):
        raise AssertionError("a rerun that measured nothing re-timed again")

    monkeypatch.setattr(retime, "retime_methods", not_again)
    again = bench_tune([SPEC], trials_per_task=8, work_dir=work, target=TARGET,
                       methods=["default", "draft"])  # fmt: skip
    assert {k: r.retimed for k, r in again.runs.items()} == {
        k: r.retimed for k, r in result.runs.items()}  # fmt: skip
    r = BenchResult(["t"], 4, {}, seed=0)
    r.runs["default"] = MethodRun("default", 10.0, 4, 1.0, [(10.0, 4, 1.0)])
    r.runs["other"] = MethodRun("other", 10.0, 4, 0.9, [(2.0, 2, 0.9), (4.0, 4, 0.9)])
    assert not r.retimed and r.speedup_within(0.0, retimed=True) == {}
    assert "retimed_speedup" not in summarize_seeds([r])
    # Timed side by side, the default's programs ran faster than in its run, the other's
    # slower: the other now gets there only with its second batch.
    r.runs["default"].retimed = [(10.0, 4, 0.8)]
    r.runs["other"].retimed = [(2.0, 2, 0.85), (4.0, 4, 0.8)]
    assert r.speedup["other"] == pytest.approx(5.0)
    assert r.speedup_within(0.0, retimed=True)["other"] == pytest.approx(2.5)
    assert r.trial_ratio["other"] == 2.0 and r.trials_over_default(True)["other"] == 1.0
    summary = summarize_seeds([r])
    assert summary["retimed_speedup"]["other"]["seeds"] == [pytest.approx(2.5)]
    assert summary["retimed_speedup_within_3pct"]["other"]["seeds"] == [pytest.approx(2.5)]
    assert summary["retimed_trial_ratio"]["other"]["seeds"] == [1.0]
    with pytest.raises(TensortuneError, match="whole number of rounds"):
        bench_tune([SPEC], trials_per_task=8, work_dir=work, target=TARGET, retime=-1)


def _forget_retiming(work: Path, only: str | None = None) -> None:
    """The saved runs (or ``only`` that one) as if never re-timed: a rerun re-times them."""
    saved = json.loads((work / "results.json").read_text())
    for name, run in saved["methods"].items():
        if only in (None, name):
            run["retimed"] = []
    (work / "results.json").write_text(json.dumps(saved))


def test_a_program_that_no_longer_replays_or_a_store_that_is_not_the_runs_is_left_out(
        bench, monkeypatch):  # fmt: skip
    from conftest import TARGET

    from tensortune.compare.retime import record_breakers, retime_methods
    from tensortune.hardware import resolve_platform
    from tensortune.records import convert
    from tensortune.workloads.resolve import resolve_tasks

    work, result = bench
    platform = resolve_platform(TARGET)
    tasks = resolve_tasks([SPEC], platform=platform)
    replay, calls = convert.candidate_from_trace, []

    def first_fails(mod, trace):
        calls.append(trace)
        if len(calls) == 1:
            raise ValueError("this trace does not fit")
        return replay(mod, trace)

    monkeypatch.setattr(convert, "candidate_from_trace", first_fails)
    stores = {name: work / name / "records.db" for name in result.runs}
    timed = retime_methods(stores, tasks, platform, rounds=1)
    monkeypatch.undo()
    pairs = [(trace, seconds) for name, path in stores.items()
             for (_, _, trace), (_, _, seconds) in zip(record_breakers(path), timed[name],
                                                       strict=True)]  # fmt: skip
    assert len(pairs) > 1
    for trace, seconds in pairs:  # the one that failed to replay, wherever it was found
        assert (seconds is None) == (trace == calls[0]) and (seconds is None or seconds > 0)
    # A method's store gone: the others are re-timed, the seed gets no re-timed verdict.
    (work / "draft" / "records.db").unlink()
    _forget_retiming(work)
    with pytest.warns(UserWarning, match="draft's saved run: its curve is not re-timed"):
        again = bench_tune([SPEC], trials_per_task=8, work_dir=work, target=TARGET,
                           methods=["default", "draft"], retime=1)  # fmt: skip
    assert again.runs["default"].retimed and not again.runs["draft"].retimed
    assert not again.retimed and "retimed" not in json.loads((work / "results.json").read_text())


def test_a_run_whose_best_program_no_longer_runs_gets_no_retimed_verdict(bench, monkeypatch):
    # Its curve would end on a slower program (the default's made every goal easier); and
    # the curve it was re-timed to by an earlier session is on another clock.
    from conftest import TARGET

    from tensortune.compare.retime import record_breakers
    from tensortune.records import convert

    work, result = bench
    assert result.runs["draft"].retimed  # the earlier session's
    *_, (_, _, best) = record_breakers(work / "draft" / "records.db")
    replay = convert.candidate_from_trace

    def fails_on_best(mod, trace):
        if trace == best:
            raise ValueError("this trace does not fit")
        return replay(mod, trace)

    monkeypatch.setattr(convert, "candidate_from_trace", fails_on_best)
    _forget_retiming(work, only="default")  # so that the rerun re-times
    with pytest.warns(UserWarning, match="draft.s best program of .* no longer builds"):
        again = bench_tune([SPEC], trials_per_task=8, work_dir=work, target=TARGET,
                           methods=["default", "draft"], retime=1)  # fmt: skip
    assert not again.runs["draft"].retimed and not again.retimed


def test_a_rerun_keeps_finished_methods_and_the_cli_prints_json(bench, tmp_path):
    from conftest import TARGET

    work, result = bench
    out = CliRunner().invoke(app, ["bench", "tune", "-w", SPEC, "--trials-per-task", "8",
                                   "--work-dir", str(work), "--target", json.dumps(TARGET),
                                   "--method", "default", "--method", "draft", "--json", "--plot",
                                   str(tmp_path / "c.png")])  # fmt: skip
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["final_latency"] == {k: r.final_latency for k, r in result.runs.items()}
    assert set(data["speedup"]) == {"default", "draft"}
    assert data["methods"]["draft"]["curve"]
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_the_cli_prints_a_table_of_each_methods_result(bench, cli):
    from conftest import TARGET

    work, result = bench
    code, out, err = cli("bench", "tune", "-w", SPEC, "--trials-per-task", "8", "--work-dir",
                         str(work), "--target", json.dumps(TARGET), "--method", "default",
                         "--method", "draft")  # fmt: skip
    assert code == 0, err
    assert "1 task(s) x 8 trials, seed 0" in out
    header = next(line for line in out.splitlines() if "final latency" in line)
    assert "speedup" in header and "trial ratio" in header
    for name, run in result.runs.items():  # the saved runs, not measured again
        row = next(line for line in out.splitlines() if line.strip("│┃ ").startswith(name + " "))
        assert f"{run.final_latency * 1e6:.1f} µs" in row, row
        speedup = result.speedup[name]
        assert (f"{speedup:.2f}x" if speedup is not None else "not reached") in row, row
    retimed = out[out.index("re-timed side by side:") :]
    for name, run in result.runs.items():
        assert f"{name} {run.final(True) * 1e6:.1f} µs" in " ".join(retimed.split()), retimed


def test_a_rerun_with_other_draft_options_runs_only_draft_then_verify_again(bench):
    from conftest import TARGET

    work, result = bench
    with pytest.warns(UserWarning, match="saved run.s. of draft do not match"):
        again = bench_tune([SPEC], trials_per_task=8, work_dir=work, target=TARGET,
                           methods=["default", "draft"], retime=0,
                           draft_options={"per_round": "4", "build_cost_weight": 0})  # fmt: skip
    assert again.runs["default"].curve == result.runs["default"].curve  # kept, not re-measured
    draft = again.runs["draft"]
    assert draft.draft_options == {"per_round": 4}  # a default's value is no option
    assert [n for _, n, _ in draft.curve] == [4, 8]  # two rounds of 4 instead of one of 8
    # Asking for the default alone keeps the saved draft run, whatever its options.
    kept = bench_tune([SPEC], trials_per_task=8, work_dir=work, target=TARGET, methods=["default"],
                      retime=0)  # fmt: skip
    assert kept.runs["draft"].curve == draft.curve
    for bad, match in (({"speed": 2}, "unknown draft-then-verify option"),
                       ({"redraft_every": 0}, "redraft_every=0: expected a whole number"),
                       ({"population": "2.5"}, "whole number"), ({"eps": "x"}, "not a number"),
                       ({"eps": 1.5}, "from 0 to 1")):  # fmt: skip
        with pytest.raises(TensortuneError, match=match):
            bench_tune([SPEC], trials_per_task=8, work_dir=work, target=TARGET, draft_options=bad)


def test_a_rerun_with_another_seed_measures_again(bench):
    from conftest import TARGET

    import tensortune.errors as errors

    work, result = bench
    before = (work / "results.json").read_text()
    stores = {m: (work / m / "records.db").read_bytes() for m in ("default", "draft")}

    def killed(*_) -> None:
        errors._interrupted.set()  # as the first Ctrl-C does

    try:
        with pytest.warns(UserWarning, match="default, draft do not match .*replaced-1"), \
                pytest.raises(KeyboardInterrupt):  # fmt: skip
            bench_tune([SPEC], trials_per_task=8, work_dir=work, target=TARGET,
                       methods=["default"], seed=1, retime=0, progress=killed)  # fmt: skip
    finally:
        errors._interrupted.clear()
    # killed in its first batch: the file lists nothing that is not here (seed 0's runs are
    # in replaced-1 with their stores, and a seed 0 rerun must not take them for its own)
    assert json.loads((work / "results.json").read_text())["methods"] == {}
    with pytest.warns(UserWarning, match=r"default did not finish.*replaced-2"):
        again = bench_tune([SPEC], trials_per_task=8, work_dir=work, target=TARGET,
                           methods=["default"], seed=1, retime=0)  # fmt: skip
    assert (work / "replaced-2" / "default" / "records.db").is_file()  # the killed run's batch
    assert again.seed == 1 and set(again.runs) == {"default"}  # seed 0's runs were not reused
    assert again.runs["default"].curve != result.runs["default"].curve
    saved = json.loads((work / "results.json").read_text())
    assert saved["seed"] == 1
    # seed 0's runs were moved aside, not deleted: file and stores as they were
    aside = work / "replaced-1"
    assert (aside / "results.json").read_text() == before
    assert {m: (aside / m / "records.db").read_bytes() for m in stores} == stores
    assert not (work / "draft").exists()
    # The next one never overwrites them (killed in its first batch: moving aside comes first).
    try:
        with pytest.warns(UserWarning, match="replaced-3"), pytest.raises(KeyboardInterrupt):
            bench_tune([SPEC], trials_per_task=8, work_dir=work, target=TARGET,
                       methods=["default"], seed=2, retime=0, progress=killed)  # fmt: skip
    finally:
        errors._interrupted.clear()
    assert (aside / "results.json").read_text() == before
    assert json.loads((work / "replaced-3" / "results.json").read_text())["seed"] == 1


def test_a_folder_with_a_methods_name_is_moved_aside_not_deleted(tmp_path):
    from conftest import TARGET

    (tmp_path / "default").mkdir()
    (tmp_path / "default" / "notes.txt").write_text("mine")
    with pytest.warns(UserWarning, match="default did not finish"):
        bench_tune([SPEC], trials_per_task=4, work_dir=tmp_path, target=TARGET,
                   methods=["default"], retime=0)  # fmt: skip
    assert (tmp_path / "replaced-1" / "default" / "notes.txt").read_text() == "mine"
    assert (tmp_path / "default" / "records.db").is_file()


def test_runs_saved_with_the_other_fast_math_setting_are_measured_again(bench, tmp_path):
    """Approximating exp/tanh/erf keeps the tasks' names: a saved run of the other setting
    would otherwise be compared with runs of other kernels."""
    import shutil

    from conftest import TARGET

    work, _ = bench
    shutil.copy(work / "results.json", tmp_path / "results.json")
    with pytest.warns(UserWarning, match="default, draft do not match"):
        again = bench_tune([SPEC], trials_per_task=8, work_dir=tmp_path, target=TARGET,
                           methods=["default"], retime=0, fast_math=False)  # fmt: skip
    assert set(again.runs) == {"default"}  # the saved draft run was dropped, not kept
    assert json.loads((tmp_path / "results.json").read_text())["fast_math"] is False


def test_runs_saved_by_another_version_of_the_benchmark_are_measured_again(bench, tmp_path):
    from conftest import TARGET

    work, result = bench
    saved = json.loads((work / "results.json").read_text())
    del saved["version"]  # as written before the clock started after the one-off costs
    (tmp_path / "results.json").write_text(json.dumps(saved))
    with pytest.warns(UserWarning, match="default, draft do not match"):
        again = bench_tune([SPEC], trials_per_task=8, work_dir=tmp_path, target=TARGET,
                           methods=["default"], retime=0)  # fmt: skip
    assert set(again.runs) == {"default"}  # the saved draft run was dropped, not kept
    assert again.runs["default"].curve != result.runs["default"].curve


def test_a_saved_run_with_another_verifier_is_measured_again(bench, tmp_path):
    from conftest import TARGET

    _, result = bench
    saved = result.to_dict()
    saved["methods"]["moa"] = {**saved["methods"]["draft"], "method": "moa",
                               "draft_options": {}, "verifier": "elsewhere.ttm"}  # fmt: skip
    written = json.dumps(saved)
    (tmp_path / "results.json").write_text(written)
    with pytest.warns(UserWarning, match="of moa do not match"):
        again = bench_tune([SPEC], trials_per_task=8, work_dir=tmp_path, target=TARGET,
                           methods=["moa"], retime=0)  # fmt: skip
    # only the replaced run is set aside; the others stay where the rerun reads them
    assert (tmp_path / "replaced-1" / "results.json").read_text() == written
    moa = again.runs["moa"]
    assert moa.verifier is None  # the shipped source, not the saved run's
    assert moa.trials == 8 and moa.curve != saved["methods"]["moa"]["curve"]
    assert json.loads((tmp_path / "results.json").read_text())["methods"]["moa"]["verifier"] is None
    kept = bench_tune([SPEC], trials_per_task=8, work_dir=tmp_path, target=TARGET, methods=["moa"],
                      retime=0)  # fmt: skip
    assert kept.runs["moa"].curve == moa.curve  # same verifier: the saved run stands


def test_a_broken_verifier_file_fails_before_anything_is_tuned(tmp_path):
    from conftest import TARGET

    broken = tmp_path / "m.ttm"
    broken.write_text("not a model")
    for method, option in (("moa", "moa_source"), ("pretrained", "pretrained")):
        with pytest.raises(TensortuneError, match="not a tensortune cost model file"):
            bench_tune([SPEC], trials_per_task=8, work_dir=tmp_path / "w", target=TARGET,
                       methods=["default", method], **{option: str(broken)})  # fmt: skip
    assert not (tmp_path / "w" / "results.json").exists()


def test_a_plot_that_cannot_be_written_is_refused_before_any_seed_runs(tmp_path):
    from tensortune.compare.seeds import bench_seeds

    # An unknown method would be refused too, later: the plot must be judged first.  Found
    # after a whole seed's runs, it cost the call (the CLI checked it; the API did not).
    with pytest.raises(TensortuneError) as e:
        bench_seeds([SPEC], seeds=[0, 1], work_dir=tmp_path / "w", trials_per_task=8,
                    methods=["nosuch"], plot=tmp_path / "missing" / "b.png")  # fmt: skip
    assert e.value.param == "plot" and "no directory" in str(e.value)


def test_a_results_file_that_is_not_ours_is_refused_not_written_over(tmp_path):
    from conftest import TARGET

    for text in ("not json", "[1, 2]", '{"methods": []}'):
        (tmp_path / "results.json").write_text(text)
        with pytest.raises(TensortuneError, match="results") as e:
            bench_tune([SPEC], trials_per_task=4, work_dir=tmp_path, target=TARGET,
                       methods=["default"])  # fmt: skip
        assert e.value.param == "work_dir"
        assert (tmp_path / "results.json").read_text() == text


def test_unknown_methods_are_refused(tmp_path):
    with pytest.raises(TensortuneError, match="unknown method"):
        bench_tune([SPEC], trials_per_task=4, work_dir=tmp_path, methods=["fastest"])


def test_a_method_that_never_reaches_the_baseline_has_no_speedup(tmp_path):
    result = BenchResult(["t"], 4, {})
    result.runs["default"] = MethodRun("default", 10.0, 4, 1.0, [(5.0, 2, 2.0), (10.0, 4, 1.0)])
    result.runs["slow"] = MethodRun("slow", 10.0, 4, 1.5, [(2.0, 2, 1.5)])
    result.runs["fast"] = MethodRun("fast", 10.0, 4, 0.5, [(2.5, 1, 0.9), (8.0, 4, 0.5)])
    assert result.speedup == {"default": 1.0, "slow": None, "fast": 4.0}
    assert result.trial_ratio == {"default": 1.0, "slow": None, "fast": 4.0}
    plot_curves(result, tmp_path / "p.png")
    assert (tmp_path / "p.png").is_file()


def test_seeds_are_summarized_by_their_median_speedup():
    def seed(s: int, fast_reach: float | None) -> BenchResult:
        r = BenchResult(["t"], 4, {}, seed=s)
        r.runs["default"] = MethodRun("default", 10.0, 4, 1.0, [(10.0, 4, 1.0)])
        curve = [(fast_reach, 2, 1.0)] if fast_reach else [(9.0, 4, 1.2)]
        r.runs["fast"] = MethodRun("fast", 10.0, 4, curve[-1][2], curve)
        return r

    summary = summarize_seeds([seed(0, 2.0), seed(1, 5.0), seed(2, None)])
    assert summary["seeds"] == [0, 1, 2]
    fast = summary["speedup"]["fast"]
    assert (fast["seeds"], fast["median"], fast["reached"]) == ([5.0, 2.0, None], 2.0, 2)
    assert fast["mean"] == pytest.approx(7 / 3)  # the unreached seed counts as 0
    assert fast["sem"] == pytest.approx(statistics.stdev([5.0, 2.0, 0.0]) / 3**0.5)
    assert summary["speedup"]["default"]["median"] == 1.0
    assert summary["final_latency"]["fast"] == [1.0, 1.0, 1.2]
    never = summarize_seeds([seed(0, None), seed(1, None), seed(2, 2.0)])
    assert never["speedup"]["fast"]["median"] is None  # most seeds never reached it
    # Over two seeds, one that got there: not a median of 2.0, half of a speedup of 4.0.
    half = summarize_seeds([seed(0, 2.5), seed(1, None)])["speedup"]["fast"]
    assert (half["median"], half["mean"], half["reached"]) == (None, 2.0, 1)
    # A method an earlier run saved in one seed's directory only is not judged on that seed.
    partial = [seed(0, 2.0), seed(1, 5.0), seed(2, None)]
    partial[0].runs["alt"] = MethodRun("alt", 10.0, 4, 1.0, [(1.0, 2, 1.0)])
    summary = summarize_seeds(partial)
    assert "alt" not in summary["speedup"] and "alt" not in summary["final_latency"]
    assert summary["speedup"]["fast"]["reached"] == 2


def test_a_seed_whose_default_set_no_goal_counts_as_unreached_not_as_missing():
    def seed(s: int, default_final: float | None) -> BenchResult:
        r = BenchResult(["t"], 4, {}, seed=s)
        r.runs["default"] = MethodRun("default", 10.0, 4, default_final,
                                      [(10.0, 4, default_final)])  # fmt: skip
        r.runs["fast"] = MethodRun("fast", 10.0, 4, 1.0, [(2.0, 4, 1.0)])
        return r

    summary = summarize_seeds([seed(0, 1.0), seed(1, None), seed(2, 1.0)])
    fast = summary["speedup"]["fast"]
    assert fast["seeds"] == [5.0, None, 5.0] and fast["reached"] == 2
    assert fast["mean"] == pytest.approx(10 / 3)


def test_a_run_ending_just_above_the_defaults_latency_counts_within_a_tolerance():
    r = BenchResult(["t"], 4, {}, seed=0)
    r.runs["default"] = MethodRun("default", 10.0, 4, 1.0, [(10.0, 4, 1.0)])
    r.runs["near"] = MethodRun("near", 10.0, 4, 1.02, [(2.0, 2, 1.05), (4.0, 4, 1.02)])
    assert r.speedup["near"] is None
    assert r.speedup_within(0.01)["near"] is None
    assert r.speedup_within(0.03)["near"] == pytest.approx(10.0 / 4.0)
    summary = summarize_seeds([r])
    assert summary["speedup_within_3pct"]["near"]["reached"] == 1
    assert summary["speedup_within_1pct"]["near"]["reached"] == 0
    assert summary["speedup_within_1pct"]["near"]["sem"] is None  # one seed: no spread


def test_within_a_tolerance_the_default_is_timed_to_the_same_easier_goal():
    # Over the default's whole run, the default itself was "2x faster" to within 3% of its
    # own final latency, and a method that matched it step for step scored the same 2x.
    r = BenchResult(["t"], 8, {}, seed=0)
    curve = [(2.0, 2, 1.2), (5.0, 4, 1.02), (10.0, 8, 1.0)]
    r.runs["default"] = MethodRun("default", 10.0, 8, 1.0, curve)
    r.runs["same"] = MethodRun("same", 10.0, 8, 1.0, list(curve))
    r.runs["quick"] = MethodRun("quick", 10.0, 8, 1.0, [(2.5, 2, 1.02), (6.0, 8, 1.0)])
    assert r.speedup_within(0.03) == {"default": 1.0, "same": 1.0, "quick": 2.0}
    # the exact goal stays over the default's whole run: its final is known when it ends
    assert r.speedup == {"default": 1.0, "same": 1.0, "quick": pytest.approx(10 / 6)}


def test_each_pair_of_seeds_runs_every_two_methods_in_both_orders():
    """Later methods of a process run slower: what two methods are compared on must not be
    which of them ran first."""
    methods = ["default", "frozen", "moa"]
    orders = [run_order(methods, seed) for seed in range(6)]
    assert orders[0] == methods
    assert all(sorted(order) == sorted(methods) for order in orders)
    for first in (0, 2, 4):
        for a, b in itertools.combinations(methods, 2):
            before = [o.index(a) < o.index(b) for o in orders[first : first + 2]]
            assert sorted(before) == [False, True], (first, a, b)
    assert len({tuple(order) for order in orders}) == 6  # every order of three, in six seeds
    assert [run_order(["a", "b"], seed) for seed in range(2)] == [["a", "b"], ["b", "a"]]


def test_the_cli_runs_each_seed_in_its_own_directory(tmp_path):
    from conftest import TARGET

    args = ["bench", "tune", "-w", SPEC, "--trials-per-task", "8", "--work-dir", str(tmp_path),
            "--target", json.dumps(TARGET), "--method", "default", "--seed", "3", "--seed",
            "4", "--retime", "0"]  # fmt: skip
    out = CliRunner().invoke(app, [*args, "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert [r["seed"] for r in data["runs"]] == [3, 4]
    assert data["summary"]["seeds"] == [3, 4]
    assert len(data["summary"]["speedup"]["default"]["seeds"]) == 2
    for s in (3, 4):
        assert json.loads((tmp_path / f"seed-{s}" / "results.json").read_text())["seed"] == s
    again = CliRunner().invoke(app, [*args, "--seed", "3"])  # a seed given twice runs once
    assert again.exit_code == 0, again.output  # the saved runs, summarized as text
    text = " ".join(again.output.split())  # the console wraps long lines
    assert "default: median speedup" in text and "over seeds [3, 4]" in text
    assert "in trials 1.00x, 1.00x" in text
    assert "re-timed" not in text and "retimed_speedup" not in data["summary"]  # --retime 0


def test_the_pretrained_verifier_adapts_as_moa_when_it_is_neural(tmp_path):
    from conftest import TARGET, platform
    from test_costmodels import synthetic

    from tensortune.costmodel.factory import cost_model_from
    from tensortune.costmodel.gbdt import XGBoostModel
    from tensortune.costmodel.moa import MomentumAdapted
    from tensortune.costmodel.nn import MLPModel

    data = synthetic(40, seed=1)
    for model, adapted in ((MLPModel(hidden=8, epochs=1, chunk=16), True), (XGBoostModel(), False)):
        path = tmp_path / f"{model.kind}.ttm"
        model.fit(data).save(path)
        verifier = cost_model_from(str(path), platform(TARGET))  # online="auto", as bench's
        assert verifier.online and isinstance(verifier.model, MomentumAdapted) == adapted


def test_the_baselines_of_moas_gate_are_a_frozen_verifier_and_an_ungated_moa(tmp_path):
    from conftest import TARGET, platform
    from test_costmodels import synthetic

    from tensortune.compare.search_methods import _method
    from tensortune.costmodel.moa import MomentumAdapted
    from tensortune.costmodel.nn import MLPModel

    path = tmp_path / "mlp.ttm"
    MLPModel(hidden=8, epochs=1, chunk=16).fit(synthetic(40, seed=1)).save(path)
    here = platform(TARGET)
    _, frozen = _method("frozen", here, str(path), {}, {})
    assert not frozen.online and isinstance(frozen.model, MLPModel)
    for name, gated in (("moa", True), ("moa-ungated", False)):
        _, verifier = _method(name, here, str(path), {}, {})
        assert verifier.online and isinstance(verifier.model, MomentumAdapted)
        assert (verifier.model.pretrained_ is not None) == gated
