"""Export to and import from MetaSchedule JSON database directories, checked with TVM's own
JSONDatabase."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
from conftest import TARGET, fill, make_records, other_hardware, sampled, trace_text

from tensortune.compat import ms, structural_equal, tvm
from tensortune.errors import RecordsError
from tensortune.hardware import current_hardware, target_key
from tensortune.records import open_records
from tensortune.records.interop import copy_records, export_records, import_records
from tensortune.records.ms_database import StoreDatabase
from tensortune.workloads.ops import parse_spec
from tensortune.workloads.sources import NAMES_FILE

MM = "matmul:16,16,16"
SM = "softmax:4,8"


@pytest.fixture
def store(tmp_path: Path):
    with open_records("sqlite:///" + str(tmp_path / "a.db")) as s:
        yield s


@pytest.fixture
def fresh(tmp_path: Path):
    with open_records("sqlite:///" + str(tmp_path / "b.db")) as s:
        yield s


@pytest.fixture
def filled(store):
    mm = fill(store, MM, [3e-3, 1e-3, None, 2e-3])
    sm = fill(store, SM, [5e-4])
    fill(store, MM, [1e-6, 2e-6], hardware=other_hardware(), seed=1)  # never exported by default
    return store, mm, sm


def _load(directory: Path):
    return ms.database.JSONDatabase(work_dir=str(directory), allow_missing=False)


def _trace(tuning_record) -> str:
    from tensortune.records.convert import to_plain

    return json.dumps(to_plain(tuning_record.trace.as_json(remove_postproc=False)))


# ---- export ------------------------------------------------------------------------------------


def test_export_loads_in_tvm(filled, tmp_path: Path) -> None:
    store, mm, sm = filled
    out = tmp_path / "export"
    done = export_records(store, out)
    assert (done.workloads, done.records, done.hardware_id) == (2, 5, current_hardware().id)

    db = _load(out)
    assert len(db) == 5
    assert len(db.get_all_tuning_records()) == 5
    mod = parse_spec(MM).to_module()
    assert db.has_workload(mod)
    workload = db.commit_workload(mod)
    top = db.get_top_k(workload, 10)
    assert [float(t.run_secs[0]) for t in top] == pytest.approx([1e-3, 2e-3, 3e-3])
    assert _trace(top[0]) == mm[1].trace  # TVM's top-1 is our best
    assert [float(s) for s in top[0].run_secs] == pytest.approx(list(mm[1].run_secs))
    assert target_key(top[0].target) == target_key(TARGET)

    # MetaSchedule applies our best schedule
    got = db.query_ir_module(mod, tvm.target.Target(TARGET), "main")
    sch = tvm.s_tir.Schedule(mod)
    tvm.s_tir.Trace.apply_json_to_schedule(json.loads(mm[1].trace), sch)
    assert structural_equal(got, sch.mod)

    sm_top = db.get_top_k(db.commit_workload(parse_spec(SM).to_module()), 10)
    assert [_trace(t) for t in sm_top] == [sm[0].trace]


def test_a_record_that_no_longer_replays_is_left_out_of_an_export(filled, tmp_path) -> None:
    store, mm, sm = filled
    # a softmax trace stored under the matmul: it fetches blocks the matmul does not have
    store.add([dataclasses.replace(sm[0], workload_id=mm[0].workload_id, id=None, uid="")])
    done = export_records(store, tmp_path / "export")
    assert (done.workloads, done.records, done.skipped) == (2, 5, 1)
    assert len(_load(tmp_path / "export")) == 5
    assert [p.name for p in (tmp_path / "export").iterdir() if p.name.startswith(".")] == []


def test_a_record_that_no_longer_replays_is_passed_over_by_the_database(filled) -> None:
    """It was the fastest of its workload: MetaSchedule's queries (a resumed search, a build)
    raised TVM's replay error and ended the search or the build of the whole workload."""
    store, mm, sm = filled
    store.add([dataclasses.replace(sm[0], workload_id=mm[0].workload_id, id=None, uid="")])
    db = StoreDatabase(store, target=TARGET)
    mod = parse_spec(MM).to_module()
    target = tvm.target.Target(TARGET)
    top = db.get_top_k(db.commit_workload(mod), 2)
    assert [_trace(t) for t in top] == [mm[1].trace, mm[3].trace]  # 1e-3 and 2e-3 s
    assert _trace(db.query_tuning_record(mod, target, "main")) == mm[1].trace
    assert db.chosen_record(mod, target).trace == mm[1].trace  # the one a build applies
    assert db.query_schedule(mod, target, "main") is not None
    assert len(db.get_all_tuning_records()) == 4 + 1  # mm's four and softmax's one
    assert [ok for _, ok in db.outcomes(mod)] == [True, True, True, False]
    # pinned (the fastest when the best few were timed again), it is passed over as well
    broken = next(r for r in store.query(workload_id=mm[0].workload_id) if r.trace == sm[0].trace)
    pinned = StoreDatabase(store, target=TARGET, pinned={broken.workload_id: broken})
    assert pinned.chosen_record(mod, target).trace == mm[1].trace
    assert _trace(pinned.query_tuning_record(mod, target, "main")) == mm[1].trace


def test_export_top_k(filled, tmp_path: Path) -> None:
    store, mm, _ = filled
    done = export_records(store, tmp_path / "top2", top_k=2)
    assert (done.workloads, done.records) == (2, 3)  # 2 of matmul (the failure is left out), 1
    db = _load(tmp_path / "top2")
    assert len(db) == 3
    top = db.get_top_k(db.commit_workload(parse_spec(MM).to_module()), 10)
    assert [_trace(t) for t in top] == [mm[1].trace, mm[3].trace]

    done = export_records(store, tmp_path / "top1", top_k=1)
    assert done.records == 2
    assert len(_load(tmp_path / "top1")) == 2


def test_export_top_k_counts_per_target(store, tmp_path: Path) -> None:
    fill(store, MM, [1e-3, 2e-3, 3e-3])
    fill(store, MM, [4e-3, 5e-3, 6e-3], target={"kind": "llvm", "num-cores": 1}, seed=1)
    done = export_records(store, tmp_path / "out", top_k=2)
    assert done.records == 4
    secs = sorted(float(t.run_secs[0]) for t in _load(tmp_path / "out").get_all_tuning_records())
    assert secs == pytest.approx([1e-3, 2e-3, 4e-3, 5e-3])


def test_export_other_hardware(filled, tmp_path: Path) -> None:
    store, _, _ = filled
    done = export_records(store, tmp_path / "other", hardware_id=other_hardware().id)
    assert (done.workloads, done.records, done.hardware_id) == (1, 2, other_hardware().id)
    secs = sorted(float(t.run_secs[0]) for t in _load(tmp_path / "other").get_all_tuning_records())
    assert secs == pytest.approx([1e-6, 2e-6])


def test_export_into_existing_database(filled, tmp_path: Path) -> None:
    store, _, _ = filled
    out = tmp_path / "export"
    export_records(store, out)
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    with pytest.raises(RecordsError, match="already holds a MetaSchedule database"):
        export_records(store, out)
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before


def test_an_export_that_stops_half_way_leaves_no_database_without_its_names(
    filled, tmp_path: Path, monkeypatch
) -> None:
    """The files are moved in one at a time: the names first, the records last, so that a
    directory whose records file is there is a whole export (an import of one without its
    names renamed every workload after the directory), and a part of one is named as such."""
    import tensortune.records.interop as interop

    store, _, _ = filled
    moved: list[str] = []
    replace = os.replace

    def stops_after_two(src, dst) -> None:
        if len(moved) == 2:
            raise KeyboardInterrupt
        moved.append(Path(dst).name)
        replace(src, dst)

    monkeypatch.setattr(interop.os, "replace", stops_after_two)
    with pytest.raises(KeyboardInterrupt):
        export_records(store, tmp_path / "export")
    monkeypatch.undo()
    assert moved == [NAMES_FILE, "database_workload.json"]
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == sorted(moved)
    with pytest.raises(RecordsError, match=r"holds part of a MetaSchedule database \(database_"
                       r"workload.json without database_tuning_record.json: an export that "
                       r"stopped half way\?\)"):  # fmt: skip
        export_records(store, tmp_path / "export")


def test_export_into_existing_database_with_one_file(store, tmp_path: Path) -> None:
    fill(store, SM, [1e-3])
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "database_tuning_record.json").write_text("")
    with pytest.raises(RecordsError, match="already holds"):
        export_records(store, tmp_path / "half")


# ---- import ------------------------------------------------------------------------------------


def test_import_uses_a_stand_in_hardware(filled, fresh, tmp_path: Path) -> None:
    store, mm, sm = filled
    out = tmp_path / "export"
    export_records(store, out)

    done = import_records(fresh, out)
    here = current_hardware().id
    assert (done.workloads, done.records, done.skipped) == (2, 5, 0)
    assert done.hardware_id != here
    assert set(fresh.hardware()) == {done.hardware_id}
    assert fresh.hardware()[done.hardware_id].cpu_model.startswith("unknown (imported from")
    assert fresh.count() == 5
    assert fresh.count(hardware_id=done.hardware_id) == 5
    assert fresh.count(hardware_id=here) == 0

    # the records are the same measurements
    key = lambda r: (r.trace, r.args_info, r.target, r.status, r.run_secs)  # noqa: E731
    imported = sorted(map(key, fresh.query()), key=repr)
    assert imported == sorted(map(key, [*mm, *sm]), key=repr)
    failed = [r for r in fresh.query() if not r.ok]
    assert len(failed) == 1 and failed[0].status != "ok" and failed[0].run_secs == ()

    # never used when tuning here
    db = StoreDatabase(fresh, target=TARGET)
    assert len(db) == 0
    assert db.get_top_k(ms.database.Workload(parse_spec(MM).to_module()), 5) == []


def test_a_names_file_nested_past_the_parsers_depth_is_no_names(filled, fresh, tmp_path):
    store, *_ = filled
    export_records(store, tmp_path / "export")
    (tmp_path / "export" / NAMES_FILE).write_text("[" * 100_000)
    done = import_records(fresh, tmp_path / "export")  # named after the directory instead
    assert done.records == 5
    assert {w.name for w in fresh.workloads()} == {"export.w"}


def test_export_and_import_take_a_stores_url(filled, tmp_path: Path) -> None:
    # As every other function of the API that reads or writes records; a URL was an
    # AttributeError from deep inside.
    source = f"sqlite:///{tmp_path / 'a.db'}"
    assert export_records(source, tmp_path / "export").records == 5
    target = f"sqlite:///{tmp_path / 'new.db'}"
    assert import_records(target, tmp_path / "export").records == 5
    with open_records(target, create=False) as s:
        assert s.count() == 5
    with pytest.raises(RecordsError, match=r"^store: no records store at"):
        export_records(f"sqlite:///{tmp_path / 'none.db'}", tmp_path / "export2")
    assert not (tmp_path / "none.db").exists() and not (tmp_path / "export2").exists()


def test_a_directory_that_is_a_url_or_an_empty_name_is_refused(filled, fresh, tmp_path,
                                                                monkeypatch):  # fmt: skip
    # A URL became a local folder (``postgresql:/me@db/tuning``), an empty name the working
    # directory; the CLI refused both, the API wrote into them.
    store, _, _ = filled
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    for where in ("postgresql://me@db/tuning", "sqlite:///c.db", "", "  "):
        with pytest.raises(RecordsError, match=r"^directory: .*(records store|empty name)"):
            export_records(store, where)
        with pytest.raises(RecordsError, match=r"^directory: .*(records store|empty name)"):
            import_records(fresh, where)
    assert not list((tmp_path / "cwd").iterdir())


def test_a_target_is_matched_as_given_or_as_its_canonical_text(store, tmp_path) -> None:
    # A target dict or short JSON text matched no record: ``best_programs`` came back empty.
    from tensortune.hardware import resolve_platform
    from tensortune.tuning.best import best_programs

    one = {"kind": "llvm", "num-cores": 1}
    fill(store, MM, [1e-3, 2e-3])
    fill(store, MM, [4e-3], target=one, seed=1)
    key = resolve_platform(one, measurable=False).key
    for given in (one, json.dumps(one), key, resolve_platform(one, measurable=False)):
        (found,) = best_programs(store, target=given)
        assert found.target == key and found.trials == 1
    assert export_records(store, tmp_path / "one", target=one).records == 1
    # measured elsewhere with no num-cores: the store's key, not the one tuning here would give
    bare = {"kind": "llvm", "mcpu": "znver3"}
    fill(store, MM, [5e-3, 6e-3, 7e-3], target=bare, seed=2)
    (found,) = best_programs(store, target=bare)
    assert found.trials == 3 and found.target == target_key(bare)


def test_import_again_skips_everything(filled, fresh, tmp_path: Path) -> None:
    store, _, _ = filled
    export_records(store, tmp_path / "export")
    first = import_records(fresh, tmp_path / "export")
    again = import_records(fresh, tmp_path / "export")
    assert (again.workloads, again.records, again.skipped) == (0, 0, 5)
    assert again.hardware_id == first.hardware_id
    assert fresh.count() == 5


def test_a_database_tuned_further_since_its_import_adds_only_its_new_records(
    filled, fresh, tmp_path: Path
) -> None:
    """MetaSchedule appends to its files as it tunes: imported again, the database is the
    same machine's, under the same stand-in; another machine's database gets one of its own."""
    store, mm, _ = filled
    export_records(store, tmp_path / "export")
    first = import_records(fresh, tmp_path / "export")
    mod, cands = sampled(MM, 6)
    new = next(c for c in cands if trace_text(c) not in {r.trace for r in mm})
    db = _load(tmp_path / "export")
    db.commit_tuning_record(ms.database.TuningRecord(
        new.sch.trace, db.commit_workload(mod), run_secs=[4e-3], target=tvm.target.Target(TARGET),
        args_info=new.args_info))  # fmt: skip
    del db
    grown = import_records(fresh, tmp_path / "export")
    assert (grown.records, grown.skipped, grown.hardware_id) == (1, 5, first.hardware_id)
    assert set(fresh.hardware()) == {first.hardware_id} and fresh.count() == 6
    # The other machine's records of the same workload: not a continuation of this one.
    export_records(store, tmp_path / "other", hardware_id=other_hardware().id)
    other = import_records(fresh, tmp_path / "other")
    assert other.records == 2 and other.hardware_id != first.hardware_id


def test_the_same_database_imported_from_another_directory_is_skipped(
    filled, fresh, tmp_path: Path
) -> None:
    """The stand-in hardware is named by the files, not by where they lie: a moved database,
    or a colleague's copy imported into a shared store, adds nothing twice.  A stand-in an
    earlier version registered with its directory in its name is found by the files too."""
    import shutil

    store, _, _ = filled
    export_records(store, tmp_path / "export")
    first = import_records(fresh, tmp_path / "export")
    shutil.copytree(tmp_path / "export", tmp_path / "moved")
    again = import_records(fresh, tmp_path / "moved")
    assert (again.records, again.skipped, again.hardware_id) == (0, 5, first.hardware_id)

    older = fresh.hardware()[first.hardware_id]
    older = dataclasses.replace(older, cpu_model=f"unknown (imported from {tmp_path / 'export'})")
    other = open_records(f"sqlite:///{tmp_path / 'other.db'}")
    old_id = other.register_hardware(older)
    assert old_id != first.hardware_id
    added = import_records(other, tmp_path / "moved")
    assert (added.records, added.hardware_id) == (5, old_id) and set(other.hardware()) == {old_id}
    other.close()


def test_import_measured_here(filled, fresh, tmp_path: Path) -> None:
    store, mm, _ = filled
    export_records(store, tmp_path / "export")
    done = import_records(fresh, tmp_path / "export", measured_here=True, run_id="imp")
    here = current_hardware().id
    assert (done.records, done.hardware_id) == (5, here)
    assert fresh.count(hardware_id=here) == 5
    assert {r.run_id for r in fresh.query()} == {"imp"}
    mod = parse_spec(MM).to_module()
    db = StoreDatabase(fresh, target=TARGET)
    assert len(db) == 5
    best = db.query_tuning_record(mod, tvm.target.Target(TARGET), "main")
    assert _trace(best) == mm[1].trace
    # importing the same files again as this machine's skips them
    assert import_records(fresh, tmp_path / "export", measured_here=True).skipped == 5


def test_import_a_database_written_by_tvm(fresh, tmp_path: Path) -> None:
    mod, cands = sampled(MM, 3)
    work_dir = tmp_path / "tvm"
    work_dir.mkdir()
    db = ms.database.JSONDatabase(work_dir=str(work_dir))
    workload = db.commit_workload(mod)
    tgt = tvm.target.Target(TARGET)
    for cand, secs in zip(cands, ([2e-3], [1e-3, 1e-3], [1e10]), strict=True):
        db.commit_tuning_record(
            ms.database.TuningRecord(
                cand.sch.trace, workload, run_secs=secs, target=tgt, args_info=cand.args_info
            )
        )
    del db
    done = import_records(fresh, work_dir, measured_here=True)
    assert (done.workloads, done.records, done.skipped) == (1, 3, 0)
    wid = fresh.workload_id(mod, create=False)
    assert wid is not None
    best = list(fresh.query(workload_id=wid, best_first=True))
    assert [r.status for r in best] == ["ok", "ok", "run_error"]
    assert [r.run_secs for r in best[:2]] == [(1e-3, 1e-3), (2e-3,)]
    assert best[0].target == target_key(TARGET)
    sch = tvm.s_tir.Schedule(mod)
    tvm.s_tir.Trace.apply_json_to_schedule(json.loads(best[0].trace), sch)
    assert structural_equal(sch.mod, cands[1].sch.mod)


def test_import_not_a_database(fresh, tmp_path: Path) -> None:
    with pytest.raises(RecordsError, match=r"is not a MetaSchedule database \(missing "):
        import_records(fresh, tmp_path)
    (tmp_path / "database_workload.json").write_text("")
    with pytest.raises(RecordsError, match=r"missing database_tuning_record\.json\)"):
        import_records(fresh, tmp_path)
    with pytest.raises(RecordsError, match="not a MetaSchedule database"):
        import_records(fresh, tmp_path / "does-not-exist")
    assert fresh.count() == 0


@pytest.mark.parametrize(
    "content",
    [
        "this is not json\n",
        "[0, [1, 2]]\n",  # not a 4-element record
        '[7, [[[], []], [0.001], {"kind": "llvm"}, []]]\n',  # no workload 7
        # Times that would rank first: a negative, a zero, a NaN beside a real one.
        '[0, [[[], []], [-1.0], {"kind": "llvm"}, []]]\n',
        '[0, [[[], []], [0.0], {"kind": "llvm"}, []]]\n',
        '[0, [[[], []], [0.001, NaN], {"kind": "llvm"}, []]]\n',
    ],
)
def test_import_corrupt_tuning_records(filled, fresh, tmp_path: Path, content: str) -> None:
    store, _, _ = filled
    out = tmp_path / "export"
    export_records(store, out)
    with (out / "database_tuning_record.json").open("a") as f:
        f.write(content)
    with pytest.raises(RecordsError, match="cannot read MetaSchedule database"):
        import_records(fresh, out)
    assert fresh.count() == 0


def test_import_corrupt_workloads(filled, fresh, tmp_path: Path) -> None:
    store, _, _ = filled
    out = tmp_path / "export"
    export_records(store, out)
    (out / "database_workload.json").write_text('["1", "bm90IGEgZ3JhcGg="]\n')
    with pytest.raises(RecordsError, match="cannot read MetaSchedule database"):
        import_records(fresh, out)
    assert fresh.count() == 0


def test_import_keeps_the_same_schedule_on_two_targets(store, fresh, tmp_path: Path) -> None:
    records = fill(store, SM, [1e-3])
    other = target_key({"kind": "llvm", "num-cores": 1})
    store.add([dataclasses.replace(records[0], target=other, run_secs=(2e-3,))])
    done = export_records(store, tmp_path / "out")
    assert done.records == 2
    assert len(_load(tmp_path / "out")) == 2
    imported = import_records(fresh, tmp_path / "out")
    assert (imported.records, imported.skipped) == (2, 0)


# ---- copies between stores ---------------------------------------------------------------------


def test_a_copy_keeps_each_records_origin(store, fresh, tmp_path) -> None:
    origin = json.dumps({"kind": "transfer", "from": "sqlite:///elsewhere.db", "workload": MM,
                         "uid": "0123abcd"})  # fmt: skip
    fill(store, MM, [3e-3])
    store.add([dataclasses.replace(r, origin=origin) for r in make_records(store, SM, [1e-3])])
    want = sorted((r.uid, r.cost, r.origin) for r in store.query())
    assert [o for _, _, o in want].count(origin) == 1
    assert copy_records(store, fresh).records == 2
    assert sorted((r.uid, r.cost, r.origin) for r in fresh.query()) == want
    assert copy_records(store, fresh).records == 0  # copied again: nothing new, origins kept
    assert sorted((r.uid, r.cost, r.origin) for r in fresh.query()) == want
    # URLs too, as export_records and import_records take them (a URL was an AttributeError)
    third = f"sqlite:///{tmp_path / 'c.db'}"
    assert copy_records(store.url, third).records == 2
    with open_records(third, create=False) as copied:
        assert sorted((r.uid, r.cost, r.origin) for r in copied.query()) == want


def test_an_export_lists_records_in_the_order_they_were_measured(tmp_path):
    from conftest import fill

    with open_records(f"sqlite:///{tmp_path / 'r.db'}") as store:
        fill(store, "matmul:16,16,16", [3e-5, 1e-5, 2e-5])
        export_records(store, tmp_path / "db")
        export_records(store, tmp_path / "top", top_k=2)
    for where, costs in (("db", [3e-5, 1e-5, 2e-5]), ("top", [1e-5, 2e-5])):
        lines = (tmp_path / where / "database_tuning_record.json").read_text().splitlines()
        medians = [sorted(json.loads(line)[1][1])[1] for line in lines]  # 3 repeats each
        assert medians == pytest.approx(costs)
