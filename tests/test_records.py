"""The records stores (SQLite, and PostgreSQL on a real server: every test taking ``store``
runs on both) and the MetaSchedule ``Database`` adapter over them."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sqlite3
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import TARGET, fill, make_records, other_hardware, sampled

from tensortune.compat import ms, structural_equal, structural_hash, tvm
from tensortune.errors import RecordsError
from tensortune.hardware import current_hardware, target_key
from tensortune.records import open_records
from tensortune.records.ms_database import StoreDatabase
from tensortune.records.schema import SCHEMA_VERSION, Record, origin_of
from tensortune.workloads.ops import parse_spec

MM = "matmul:16,16,16"
SM = "softmax:4,8"
OTHER_TARGET = {"kind": "llvm", "num-cores": 1}


def _url(path: Path) -> str:
    return "sqlite:///" + str(path)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path):
    url = (_url(tmp_path / "r.db") if request.param == "sqlite"
           else request.getfixturevalue("postgres_url"))  # fmt: skip
    with open_records(url) as s:
        yield s


@pytest.fixture
def sqlite_store(tmp_path: Path):
    with open_records(_url(tmp_path / "r.db")) as s:
        yield s


def _costs(records) -> list[float]:
    return [r.cost for r in records]


# ---- creating, workloads, hardware -----------------------------------------------------------


def test_open_creates_store(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    with open_records(_url(path)) as s:
        assert s.count() == 0
        assert list(s.query()) == []
        assert s.summary() == []
        assert s.workloads() == []
        assert s.hardware() == {}
    assert path.is_file()
    with sqlite3.connect(path) as db:
        meta = dict(db.execute("SELECT key, value FROM meta"))
    # the mark that its rows need no check of their run times (made since they are checked)
    assert meta == {"app": "tensortune", "schema_version": str(SCHEMA_VERSION),
                    "run_times_checked": "1"}  # fmt: skip


def test_connections_opening_a_new_file_at_once_all_get_the_store(tmp_path: Path) -> None:
    # Each opener sees an empty file before taking the write lock (tune's worker and a
    # `records` command started beside it); only one of them may create the schema.
    def open_one(url: str) -> str:
        barrier.wait()
        with open_records(url) as s:
            return s.url

    for round_ in range(10):
        url = _url(tmp_path / f"r{round_}.db")
        barrier = threading.Barrier(6)
        with ThreadPoolExecutor(6) as pool:
            assert list(pool.map(open_one, [url] * 6)) == [url] * 6
        with open_records(url) as s:
            assert s.count() == 0


def test_plain_path_is_a_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "plain.db"
    with open_records(str(path)) as s:
        s.register_hardware(current_hardware())
    with open_records(_url(path)) as s:
        assert current_hardware().id in s.hardware()


def test_workload_id_dedupes_structurally_equal_modules(store) -> None:
    a1 = parse_spec("matmul:8,8,8").to_module()
    a2 = parse_spec("matmul:8,8,8").to_module()  # a distinct but equal object
    b = parse_spec("matmul:8,8,4").to_module()
    assert store.workload_id(b, create=False) is None
    wa = store.workload_id(a1, "a")
    assert store.workload_id(a2, "again") == wa
    wb = store.workload_id(b, "b")
    assert wb != wa
    assert store.workload_id(b, create=False) == wb
    assert [w.id for w in store.workloads()] == [wa, wb]
    stored = store.workload(wa)
    assert stored.name == "a"  # the second call did not rename or duplicate it
    assert stored.shash == structural_hash(a1)
    assert structural_equal(stored.mod(), a1)
    with pytest.raises(RecordsError, match="no workload 999"):
        store.workload(999)


def test_workload_id_dedupes_after_reopening(tmp_path: Path) -> None:
    url = _url(tmp_path / "r.db")
    mod = parse_spec("softmax:4,8").to_module()
    with open_records(url) as s:
        wid = s.workload_id(mod, "sm")
    with open_records(url) as s:  # an empty cache: the lookup goes to the file
        assert s.workload_id(parse_spec("softmax:4,8").to_module(), create=False) == wid
        assert s.workload_id(mod) == wid
        assert len(s.workloads()) == 1


def test_a_missed_lookup_sees_a_workload_another_writer_added(tmp_path: Path) -> None:
    url = _url(tmp_path / "r.db")
    mod = parse_spec("matmul:16,16,16").to_module()
    with open_records(url) as reader, open_records(url) as writer:
        assert reader.workload_id(mod, create=False) is None  # a miss is not remembered
        wid = writer.workload_id(mod, "mm")
        assert reader.workload_id(mod, create=False) == wid


def test_hardware_round_trip(store) -> None:
    here = current_hardware()
    other = other_hardware()
    assert store.register_hardware(here) == here.id
    assert store.register_hardware(other) == other.id
    assert store.register_hardware(other) == other.id  # idempotent
    hw = store.hardware()
    assert hw == {here.id: here, other.id: other}
    assert hw[other.id].id == other.id  # the id is stable through JSON
    assert isinstance(hw[other.id].isa, tuple)


# ---- add and query ---------------------------------------------------------------------------


@pytest.fixture
def filled(store):
    """matmul and softmax records on this hardware, plus records on another hardware/target."""
    mm = fill(store, MM, [3e-3, 1e-3, None, 2e-3])
    sm = fill(store, SM, [5e-4, None])
    other_hw = fill(store, MM, [1e-5, 2e-5], hardware=other_hardware(), seed=1)
    other_tgt = fill(store, MM, [4e-4], target=OTHER_TARGET, seed=2)
    return store, {"mm": mm, "sm": sm, "other_hw": other_hw, "other_tgt": other_tgt}


def test_counts_per_workload_agree_with_count_in_one_query(filled) -> None:
    from tensortune.records.storage import RecordStore

    store, recs = filled
    here, tkey = current_hardware().id, target_key(TARGET)
    wmm, wsm = recs["mm"][0].workload_id, recs["sm"][0].workload_id
    counts = store.counts([wmm, wsm, 999], here, tkey)
    assert counts == {wmm: 4, wsm: 2}  # the other hardware's and target's left out
    assert counts == RecordStore.counts(store, [wmm, wsm, 999], here, tkey)  # the generic one
    assert store.counts([], here, tkey) == {}


def test_add_and_query_filters(filled) -> None:
    store, recs = filled
    here, there = current_hardware().id, other_hardware().id
    wmm, wsm = recs["mm"][0].workload_id, recs["sm"][0].workload_id
    tkey = target_key(TARGET)

    everything = list(store.query())
    assert everything == [r for k in ("mm", "sm", "other_hw", "other_tgt") for r in recs[k]]
    assert all(r.id is not None for r in everything)
    assert len({r.id for r in everything}) == 9

    assert list(store.query(workload_id=wsm)) == recs["sm"]
    assert list(store.query(hardware_id=there)) == recs["other_hw"]
    assert list(store.query(workload_id=wmm, hardware_id=here, target=tkey)) == recs["mm"]
    assert list(store.query(target=target_key(OTHER_TARGET))) == recs["other_tgt"]
    assert list(store.query(hardware_id="0000000000000000")) == []

    ok = list(store.query(workload_id=wmm, hardware_id=here, target=tkey, ok_only=True))
    assert _costs(ok) == [3e-3, 1e-3, 2e-3]
    assert all(r.ok and r.status == "ok" for r in ok)

    best = list(store.query(workload_id=wmm, hardware_id=here, target=tkey, best_first=True))
    assert _costs(best) == [1e-3, 2e-3, 3e-3, float("inf")]  # the failure comes last
    assert best[-1].status == "run_error" and best[-1].run_secs == ()
    assert best[-1].error == "[run_error] fake failure"

    top2 = list(store.query(workload_id=wmm, hardware_id=here, best_first=True, limit=2))
    assert _costs(top2) == [4e-4, 1e-3]  # across both targets
    top2 = list(
        store.query(workload_id=wmm, hardware_id=here, target=tkey, best_first=True, limit=2)
    )
    assert _costs(top2) == [1e-3, 2e-3]
    assert _costs(store.query(workload_id=wmm, best_first=True, limit=1)) == [1e-5]
    assert len(list(store.query(limit=3))) == 3


_TRANSFERRED = json.dumps({"kind": "transfer", "from": "postgresql://tuner:***@farm/records",
                           "workload": "matmul:16,16,16 ünïcode", "uid": "0123abcd"})  # fmt: skip


def test_a_records_origin_comes_back_from_the_store(store) -> None:
    measured, transferred = make_records(store, MM, [1e-3, 2e-3])
    store.add([measured, dataclasses.replace(transferred, origin=_TRANSFERRED)])
    got = list(store.query())
    assert [r.origin for r in got] == ["", _TRANSFERRED]
    assert origin_of(got[0]) == {}
    assert origin_of(got[1]) == json.loads(_TRANSFERRED)
    best = list(store.query(ok_only=True, best_first=True))
    assert [(r.cost, r.origin) for r in best] == [(1e-3, ""), (2e-3, _TRANSFERRED)]


@pytest.mark.parametrize(
    "text",
    ["", "not json", "[1, 2]", '"transfer"', "{", "[" * 100_000],
    ids=["empty", "not-json", "a-list", "a-string", "cut-short", "too-deep"],
)
def test_origin_of_a_record_without_a_readable_origin_is_empty(text: str) -> None:
    record = Record(1, "hw", "llvm", "[]", "[]", (1e-3,), "ok", origin=text)
    assert origin_of(record) == {}


def test_best_first_uses_the_median(store) -> None:
    records = make_records(store, MM, [1.0, 1.0, 1.0])
    secs = [(0.001, 0.009, 0.010), (0.005,), (0.004, 0.004, 0.1, 0.1)]
    records = [dataclasses.replace(r, run_secs=s) for r, s in zip(records, secs, strict=True)]
    store.add(records)
    got = list(store.query(best_first=True))
    assert [r.run_secs for r in got] == [secs[1], secs[0], secs[2]]  # medians 5, 9, 52 ms
    assert got[0].cost == 0.005


def test_count(filled) -> None:
    store, recs = filled
    wmm = recs["mm"][0].workload_id
    assert store.count() == 9
    assert store.count(workload_id=wmm) == 7
    assert store.count(hardware_id=current_hardware().id) == 7
    assert store.count(hardware_id=other_hardware().id) == 2
    assert store.count(workload_id=wmm, hardware_id=current_hardware().id) == 5
    assert store.count(target=target_key(TARGET)) == 8
    assert store.count(workload_id=wmm, target=target_key(OTHER_TARGET)) == 1


def test_summary(filled) -> None:
    store, recs = filled
    wmm, wsm = recs["mm"][0].workload_id, recs["sm"][0].workload_id
    here, there = current_hardware().id, other_hardware().id
    tkey, other = target_key(TARGET), target_key(OTHER_TARGET)
    rows = {(r[1], r[2], r[3]): r for r in store.summary()}
    assert rows == {
        (wmm, here, tkey): (MM, wmm, here, tkey, 4, 3, pytest.approx(1e-3)),
        (wmm, there, tkey): (MM, wmm, there, tkey, 2, 2, pytest.approx(1e-5)),
        (wmm, here, other): (MM, wmm, here, other, 1, 1, pytest.approx(4e-4)),
        (wsm, here, tkey): (SM, wsm, here, tkey, 2, 1, pytest.approx(5e-4)),
    }


def test_summary_of_only_failures_has_no_best(store) -> None:
    fill(store, SM, [None, None])
    [(name, _, _, _, n, ok, best)] = store.summary()
    assert (name, n, ok, best) == (SM, 2, 0, None)


def test_data_persists_after_reopening(tmp_path: Path) -> None:
    url = _url(tmp_path / "r.db")
    with open_records(url) as s:
        recs = fill(s, MM, [2e-3, 1e-3])
        other = other_hardware()
        s.register_hardware(other)
    with open_records(url) as s:
        assert list(s.query()) == recs
        assert s.count() == 2
        assert s.hardware()[other.id] == other
        assert structural_equal(s.workload(recs[0].workload_id).mod(), parse_spec(MM).to_module())
    with sqlite3.connect(tmp_path / "r.db") as db:
        (version,) = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    assert version == str(SCHEMA_VERSION)


# ---- the MetaSchedule adapter ------------------------------------------------------------------


def test_store_database_ignores_other_hardware(filled) -> None:
    store, recs = filled
    mod = parse_spec(MM).to_module()
    workload = ms.database.Workload(mod)
    db = StoreDatabase(store, target=TARGET)  # this machine
    assert db.hardware_id == current_hardware().id

    top = db.get_top_k(workload, 10)
    assert [float(t.run_secs[0]) for t in top] == pytest.approx([1e-3, 2e-3, 3e-3])
    ours = {r.trace for r in recs["mm"]}
    for t in top:
        assert json.dumps(_plain_trace(t)) in ours

    best = db.query_tuning_record(mod, tvm.target.Target(TARGET), "main")
    assert float(best.run_secs[0]) == pytest.approx(1e-3)
    assert len(db) == 4 + 2  # matmul and softmax on this hardware and TARGET

    # the other machine's view holds only its records, even though they are faster
    there = StoreDatabase(store, hardware=other_hardware(), target=TARGET)
    assert [float(t.run_secs[0]) for t in there.get_top_k(workload, 10)] == pytest.approx(
        [1e-5, 2e-5]
    )
    assert len(there) == 2
    sm = ms.database.Workload(parse_spec(SM).to_module())
    assert there.get_top_k(sm, 5) == []
    assert there.query_tuning_record(sm.mod, tvm.target.Target(TARGET), "main") is None
    assert there.query_ir_module(sm.mod, tvm.target.Target(TARGET), "main") is None


def test_store_database_only_other_hardware_records(store) -> None:
    fill(store, MM, [1e-5, 2e-5], hardware=other_hardware())
    mod = parse_spec(MM).to_module()
    db = StoreDatabase(store, target=TARGET)
    assert db.has_workload(mod)
    assert db.get_top_k(ms.database.Workload(mod), 3) == []
    assert db.query_tuning_record(mod, tvm.target.Target(TARGET), "main") is None
    assert len(db) == 0
    assert db.get_all_tuning_records() == []
    # Reading registered nothing (compile reads a store it may not be allowed to write);
    # the first record committed registers this machine.
    assert set(store.hardware()) == {other_hardware().id}
    _, (cand,) = sampled(MM, 1, seed=5)
    db.commit_tuning_record(ms.database.TuningRecord(
        cand.sch.trace, db.commit_workload(mod), run_secs=[4e-3],
        target=tvm.target.Target(TARGET)))  # fmt: skip
    assert set(store.hardware()) == {other_hardware().id, current_hardware().id}
    assert [float(t.run_secs[0]) for t in db.get_top_k(ms.database.Workload(mod), 3)] == [4e-3]


def test_store_database_target_filter(filled) -> None:
    store, _ = filled
    mod = parse_spec(MM).to_module()
    db = StoreDatabase(store, target=OTHER_TARGET)
    assert [float(t.run_secs[0]) for t in db.get_top_k(ms.database.Workload(mod), 5)] == [4e-4]
    assert len(db) == 1
    rec = db.query_tuning_record(mod, tvm.target.Target(OTHER_TARGET), "main")
    assert float(rec.run_secs[0]) == pytest.approx(4e-4)
    # unbound: every target of this hardware
    assert len(StoreDatabase(store)) == 4 + 2 + 1


def _plain_trace(tuning_record) -> list:
    from tensortune.records.convert import to_plain

    return to_plain(tuning_record.trace.as_json(remove_postproc=False))


def test_query_ir_module_replays_the_best_record(store) -> None:
    mod, cands = sampled(MM, 4)
    recs = fill(store, MM, [3e-3, 1e-3, 2e-3, 4e-3])
    fill(store, MM, [1e-6], hardware=other_hardware(), seed=3)  # faster, but not ours
    db = StoreDatabase(store, target=TARGET)
    got = db.query_ir_module(mod, tvm.target.Target(TARGET), "main")
    assert got is not None

    sch = tvm.s_tir.Schedule(mod)
    tvm.s_tir.Trace.apply_json_to_schedule(json.loads(recs[1].trace), sch)
    assert structural_equal(got, sch.mod)
    assert structural_equal(got, cands[1].sch.mod)
    assert not structural_equal(got, cands[0].sch.mod)
    sch2 = db.query_schedule(mod, tvm.target.Target(TARGET), "main")
    assert structural_equal(sch2.mod, got)


def test_commit_tuning_record_as_add_to_database_does(store) -> None:
    mod, cands = sampled(MM, 2)
    db = StoreDatabase(store, target=TARGET, run_id="run-7")
    workload = db.commit_workload(mod)
    assert db.has_workload(mod)
    tgt = tvm.target.Target(TARGET)
    for cand, secs in zip(cands, ([2e-4, 3e-4], [1e10]), strict=True):
        db.commit_tuning_record(
            ms.database.TuningRecord(
                cand.sch.trace, workload, run_secs=secs, target=tgt, args_info=cand.args_info
            )
        )
    ok, failed = store.query()
    here = current_hardware().id
    assert (ok.status, ok.run_secs, ok.error) == ("ok", (2e-4, 3e-4), None)
    assert ok.cost == pytest.approx(2.5e-4)
    assert failed.status == "run_error" and failed.run_secs == () and not failed.ok
    assert failed.error
    for r, cand in zip((ok, failed), cands, strict=True):
        assert r.hardware_id == here
        assert r.target == target_key(TARGET)
        assert r.run_id == "run-7"
        assert r.workload_id == store.workload_id(mod, create=False)
        assert r.args_info == json.dumps([_arg(a) for a in cand.args_info])
        sch = tvm.s_tir.Schedule(mod)
        tvm.s_tir.Trace.apply_json_to_schedule(json.loads(r.trace), sch)
        assert structural_equal(sch.mod, cand.sch.mod)
    assert len(db) == 2
    assert [float(t.run_secs[0]) for t in db.get_top_k(workload, 5)] == [2e-4]
    # the failure comes back with MetaSchedule's failure cost
    all_secs = sorted(float(t.run_secs[0]) for t in db.get_all_tuning_records())
    assert all_secs == [2e-4, 1e10]


def test_a_tuning_record_without_target_or_arguments_is_committed_as_metaschedules_are(store):
    """Both are optional in a TuningRecord (TVM's own databases take one without them)."""
    mod, (cand,) = sampled(MM, 1)
    db = StoreDatabase(store, target=TARGET)
    db.commit_tuning_record(ms.database.TuningRecord(cand.sch.trace, db.commit_workload(mod),
                                                     run_secs=[2e-4]))  # fmt: skip
    (r,) = store.query()
    assert r.target == target_key(TARGET) and r.cost == pytest.approx(2e-4)
    assert r.args_info == json.dumps([_arg(a) for a in cand.args_info])
    anywhere = StoreDatabase(store)  # no target to fall back on: one line, nothing stored
    with pytest.raises(RuntimeError, match="without a target"):  # as TVM hands it on
        anywhere.commit_tuning_record(ms.database.TuningRecord(
            cand.sch.trace, anywhere.commit_workload(mod), run_secs=[2e-4]))  # fmt: skip
    assert isinstance(anywhere.error, RecordsError) and store.count() == 1


def _arg(a) -> object:
    from tensortune.records.convert import to_plain

    return to_plain(a.as_json())


# ---- bad files ---------------------------------------------------------------------------------


def test_garbage_file(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    data = b"this is not a database\n" * 500
    path.write_bytes(data)
    with pytest.raises(RecordsError, match=r"garbage\.db is not usable: file is not a database"):
        open_records(_url(path))
    assert path.read_bytes() == data


def test_foreign_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "foreign.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE songs (title TEXT)")
        db.execute("INSERT INTO songs VALUES ('x')")
    db.close()
    with pytest.raises(RecordsError, match="is a SQLite file but not a tensortune records store"):
        open_records(_url(path))
    with sqlite3.connect(path) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    db.close()
    assert tables == {"songs"}  # left untouched


def test_foreign_meta_table(tmp_path: Path) -> None:
    path = tmp_path / "other_app.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute("INSERT INTO meta VALUES ('app', 'someone-else')")
    db.close()
    with pytest.raises(RecordsError, match="not a tensortune records store"):
        open_records(_url(path))


def _set_meta(path: Path, key: str, value: str) -> None:
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE meta SET value = ? WHERE key = ?", (value, key))
    db.close()


def test_newer_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    with open_records(_url(path)) as s:
        fill(s, SM, [1e-3])
    _set_meta(path, "schema_version", str(SCHEMA_VERSION + 1))
    with pytest.raises(RecordsError, match=rf"schema v{SCHEMA_VERSION + 1}.*upgrade tensortune"):
        open_records(_url(path))


def test_older_unknown_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    open_records(_url(path)).close()
    _set_meta(path, "schema_version", "0")
    with pytest.raises(RecordsError, match="unknown old records schema v0"):
        open_records(_url(path))


def test_garbled_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "r.db"
    open_records(_url(path)).close()
    _set_meta(path, "schema_version", "one")
    with pytest.raises(RecordsError, match="unreadable records schema version 'one'"):
        open_records(_url(path))


def test_unsupported_scheme() -> None:
    with pytest.raises(RecordsError, match="unsupported records URL scheme 'mysql'"):
        open_records("mysql://user:secret@localhost/records")
    with pytest.raises(RecordsError) as info:
        open_records("mysql://user:secret@localhost/records")
    assert "secret" not in str(info.value)


def test_url_without_file() -> None:
    with pytest.raises(RecordsError, match="names no file"):
        open_records("sqlite:///")


def test_a_url_missing_its_slashes_is_refused_not_made_a_file(tmp_path: Path, monkeypatch) -> None:
    # sqlite:r.db used to create a SQLite file named "sqlite:r.db" in the working directory.
    monkeypatch.chdir(tmp_path)
    for url in ("sqlite:r.db", "sqlite:/r.db", "postgresql:host/db", "SQLite:r.db"):
        with pytest.raises(RecordsError, match="lacks the '//' after its scheme"):
            open_records(url)
    assert list(tmp_path.iterdir()) == []
    open_records(Path("sqlite:r.db")).close()  # a path object names a file, whatever its name
    assert (tmp_path / "sqlite:r.db").is_file()
    open_records("sqlite").close()  # a file named like a scheme, with no colon: a file
    assert (tmp_path / "sqlite").is_file()


def test_missing_directory(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "dir" / "r.db"
    with pytest.raises(RecordsError, match=r"directory .*dir does not exist"):
        open_records(_url(path))
    assert not (tmp_path / "no").exists()


def test_directory_as_store(tmp_path: Path) -> None:
    with pytest.raises(RecordsError, match="is not usable"):
        open_records(_url(tmp_path))


# ---- atomicity and disk full -------------------------------------------------------------------


def test_batch_with_an_invalid_record_adds_nothing(store) -> None:
    before = fill(store, MM, [1e-3])
    batch = make_records(store, SM, [1e-3, 2e-3, 3e-3])
    batch[1] = dataclasses.replace(batch[1], workload_id=12345)  # no such workload
    with pytest.raises(RecordsError, match=r"(?i)foreign key"):
        store.add(batch)
    assert list(store.query()) == before
    # unknown hardware violates a foreign key too
    batch = make_records(store, SM, [1e-3, 2e-3])
    batch[-1] = dataclasses.replace(batch[-1], hardware_id="not-registered")
    with pytest.raises(RecordsError):
        store.add(batch)
    assert list(store.query()) == before
    store.add(batch[:1])  # the store is still usable
    assert store.count() == 2


@pytest.mark.parametrize("secs", [(0.0,), (-1e-3,), (float("nan"),), (10**400,)])
def test_a_record_every_read_would_refuse_is_not_written(store, secs) -> None:
    """A time that is not positive seconds made every later query of its workload fail
    ("record N is damaged"): refused when added, the store stays readable."""
    before = fill(store, MM, [1e-3])
    batch = make_records(store, MM, [2e-3, 3e-3])
    batch[1] = dataclasses.replace(batch[1], run_secs=secs)
    with pytest.raises(RecordsError, match="not positive seconds"):
        store.add(batch)
    assert list(store.query()) == before and store.summary()


def test_a_timer_that_returns_no_positive_time_records_a_failure(store) -> None:
    """From MetaSchedule (``commit_tuning_record``) or our runner, a zero or negative time is a
    failed run, not a record that would rank first and make the store unreadable."""
    from tensortune.records.convert import measured_records

    mod, cands = sampled(MM, 2)
    db = StoreDatabase(store, target=TARGET, run_id="r")
    workload = db.commit_workload(mod)
    db.commit_tuning_record(ms.database.TuningRecord(
        cands[0].sch.trace, workload, run_secs=[0.0], target=tvm.target.Target(TARGET),
        args_info=cands[0].args_info))  # fmt: skip
    built = ms.builder.BuilderResult("/nowhere.so", None)
    (ran,) = measured_records(
        cands[1:], [built], [ms.runner.RunnerResult([-1e-6], None)],
        workload_id=store.workload_id(mod, create=False), hardware_id=current_hardware().id,
        target=target_key(TARGET), run_id="r",
    )  # fmt: skip
    assert (ran.status, ran.run_secs) == ("run_error", ()) and "timer" in ran.error
    store.add([ran])
    assert [r.status for r in store.query()] == ["run_error", "run_error"]


def test_invalid_record_is_not_reported_as_corruption(store) -> None:
    batch = make_records(store, SM, [1e-3])
    batch[0] = dataclasses.replace(batch[0], workload_id=12345)
    with pytest.raises(RecordsError) as info:
        store.add(batch)
    assert "corrupt" not in str(info.value)


def test_a_commit_that_fails_leaves_no_transaction_open(sqlite_store) -> None:
    """A COMMIT can fail after the writes went through (an I/O error on the log): a
    transaction left open would hold the write lock against every other process."""
    store = sqlite_store
    before = fill(store, MM, [1e-3])
    real = store._db

    class FailingCommit:
        def __getattr__(self, name: str):
            return getattr(real, name)

        def execute(self, sql: str, *args):
            if sql == "COMMIT":
                raise sqlite3.OperationalError("disk I/O error")
            return real.execute(sql, *args)

    store._db = FailingCommit()
    with pytest.raises(RecordsError, match="I/O"):
        store.add(make_records(store, MM, [2e-3], seed=1))
    store._db = real
    assert not real.in_transaction
    assert list(store.query()) == before
    store.add(make_records(store, MM, [3e-3], seed=2))  # the store takes writes again
    assert store.count() == 2


def _fill_disk(store) -> tuple[list[Record], list[Record]]:
    """Records already there, and a batch too large for the pages left."""
    before = fill(store, MM, [1e-3, 2e-3])
    template = make_records(store, SM, [1e-3])[0]
    padded = template.trace + " " * (20 * len(template.trace))  # still the trace's JSON
    big = [dataclasses.replace(template, trace=padded) for _ in range(40)]
    (pages,) = store._db.execute("PRAGMA page_count").fetchone()
    store._db.execute(f"PRAGMA max_page_count = {pages + 2}")
    return before, big


def test_disk_full_keeps_earlier_records(sqlite_store) -> None:
    store = sqlite_store
    before, big = _fill_disk(store)
    with pytest.raises(RecordsError):
        store.add(big)
    assert list(store.query()) == before
    store._db.execute("PRAGMA max_page_count = 1073741823")
    store.add(big[:2])  # usable again once there is room
    assert store.count() == len(before) + 2


def test_disk_full_message(sqlite_store) -> None:
    _, big = _fill_disk(sqlite_store)
    with pytest.raises(RecordsError, match="disk full"):
        sqlite_store.add(big)


# ---- upgrades from stores written by earlier versions -----------------------------------------


def test_a_version_1_store_is_upgraded_in_place_and_keeps_its_records(tmp_path: Path) -> None:
    import shutil

    from tensortune.records.schema import TaskSource

    path = tmp_path / "old.db"
    shutil.copy(Path(__file__).parent / "fixtures" / "records_v1.db", path)
    with open_records(_url(path)) as s:
        records = list(s.query())
        assert [r.status for r in records] == ["ok", "run_error"]
        assert records[0].run_secs == (1e-5, 2e-5) and records[1].error == "boom"
        assert [h.cpu_model for h in s.hardware().values()] == ["fixture CPU"]
        wid = records[0].workload_id
        s.add_task_sources([TaskSource("net", wid, "matmul", 3)])
        assert s.task_sources("net") == [TaskSource("net", wid, "matmul", 3)]
    db = sqlite3.connect(path)
    (version,) = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    db.close()
    assert version == str(SCHEMA_VERSION)


def _v3_store(path: Path) -> tuple[int, str]:
    """A SQLite store as tensortune wrote it at schema v3 (``records`` without ``origin``),
    holding one record of MM; returns its workload id and trace."""
    from conftest import args_text, trace_text

    from tensortune.records.schema import trace_hash
    from tensortune.records.sql import TABLES, statements

    v3 = TABLES.replace(",\n    origin TEXT NOT NULL DEFAULT ''", "")
    assert "origin" not in v3  # the only change from v3 to v4
    mod, (cand,) = sampled(MM, 1)
    here = current_hardware()
    trace = trace_text(cand)
    db = sqlite3.connect(path)
    with db:
        for statement in statements(v3.format(serial="INTEGER PRIMARY KEY", real="REAL")):
            db.execute(statement)
        db.execute("INSERT INTO meta VALUES ('app', 'tensortune'), ('schema_version', '3')")
        db.execute("INSERT INTO hardware VALUES (?, ?)", (here.id, here.to_json()))
        (wid,) = db.execute(
            "INSERT INTO workloads (shash, name, mod_json) VALUES (?, ?, ?) RETURNING id",
            (structural_hash(mod), MM, tvm.ir.save_json(mod)),
        ).fetchone()
        db.execute(
            "INSERT INTO records (workload_id, hardware_id, target, trace, args_info, run_secs, "
            "cost, status, error, run_id, tvm_version, created_at, trace_hash, uid) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, 'ok', NULL, 'old', '0.0', 1.0, ?, 'v3-uid')",
            (wid, here.id, target_key(TARGET), trace, args_text(cand), "[0.002]", 0.002,
             trace_hash(trace)),
        )  # fmt: skip
    db.close()
    return wid, trace


def test_a_version_3_store_is_upgraded_in_place_and_records_say_their_origin(
    tmp_path: Path,
) -> None:
    path = tmp_path / "v3.db"
    wid, trace = _v3_store(path)
    with open_records(_url(path)) as s:
        (old,) = s.query()
        assert (old.workload_id, old.trace, old.uid, old.cost) == (wid, trace, "v3-uid", 0.002)
        assert old.origin == "" and origin_of(old) == {}
        (new,) = make_records(s, SM, [1e-3])
        s.add([dataclasses.replace(new, origin=_TRANSFERRED)])
        assert [r.origin for r in s.query()] == ["", _TRANSFERRED]
    with open_records(_url(path)) as s:  # upgraded once: opening again changes nothing
        assert [r.origin for r in s.query()] == ["", _TRANSFERRED]
        # A second process that read v3 before the first upgraded finds it done under the lock.
        s._migrate()
    db = sqlite3.connect(path)
    (version,) = db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    columns = [row[1] for row in db.execute("PRAGMA table_info(records)")]
    db.close()
    assert version == str(SCHEMA_VERSION) == "4"
    assert columns.count("origin") == 1


def _raw(url: str, sql: str, *params: object) -> None:
    """One statement run on the store's database as another program would."""
    if url.startswith("sqlite"):
        db = sqlite3.connect(url.removeprefix("sqlite:///"))
        with db:
            db.execute(sql, params)
        db.close()
    else:
        import psycopg

        with psycopg.connect(url) as conn:
            conn.execute(sql.replace("?", "%s"), params)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_zero_run_times_older_versions_wrote_become_failed_runs(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = (_url(tmp_path / "r.db") if backend == "sqlite"
           else request.getfixturevalue("postgres_url"))  # fmt: skip
    with open_records(url) as s:
        *_, fine = fill(s, MM, [1e-3, 2e-3, 3e-3])
        ids, uids = zip(*((r.id, r.uid) for r in s.query()), strict=True)
    # As versions before 880b850 kept a timer's 0, in a store they made (no mark of the
    # check): every read of the store refused the rows as damaged.
    _raw(url, "UPDATE records SET run_secs = '[0.0]', cost = 0.0 WHERE id = ?", ids[0])
    _raw(url, "UPDATE records SET run_secs = '[0.0, 0.002, 0.003]', cost = 0.002 WHERE id = ?",
         ids[1])  # fmt: skip
    _raw(url, "DELETE FROM meta WHERE key = 'run_times_checked'")

    def read_only() -> str:  # a process that may only read: it reads the rows as they are
        if backend == "postgresql":
            return url + "?options=-c%20default_transaction_read_only%3Don"
        connect = sqlite3.connect

        def query_only(*args, **kwargs):  # as root, a file's mode would not stop the write
            db = connect(*args, **kwargs)
            db.execute("PRAGMA query_only = 1")
            return db

        monkeypatch.setattr(sqlite3, "connect", query_only)
        return url

    with open_records(read_only(), create=False) as s:
        assert s.count() == 3
        with pytest.raises(RecordsError, match="damaged"):
            list(s.query())
    monkeypatch.undo()

    def as_checked() -> None:
        records = list(s.query())
        assert [(r.status, r.run_secs, r.cost) for r in records] == [
            ("run_error", (), float("inf")), ("run_error", (), float("inf")),
            ("ok", fine.run_secs, 3e-3),
        ]  # fmt: skip
        assert records[0].error.startswith("the timer returned [0.0] ")
        assert records[1].error.startswith("the timer returned [0.0, 0.002, 0.003] ")
        assert tuple(r.uid for r in records) == uids
        ((*_, count, ok, best),) = s.summary()
        assert (count, ok, best) == (3, 1, 3e-3)

    for _ in range(2):  # checked once: the second open finds the mark
        with open_records(url, create=False) as s:
            as_checked()


# ---- leases: several workers on one store ------------------------------------------------------


def _hashes(records) -> list[str]:
    from tensortune.records.schema import trace_hash

    return [trace_hash(r.trace) for r in records]


def test_a_leased_candidate_is_nobody_elses_until_it_is_measured(store) -> None:
    batch = make_records(store, MM, [1e-3, 2e-3, 3e-3])
    key = (batch[0].workload_id, batch[0].hardware_id, batch[0].target)
    hashes = _hashes(batch)
    assert store.claim(*key, hashes[:2], worker="a", seconds=60) == hashes[:2]
    assert store.claim(*key, hashes, worker="b", seconds=60) == hashes[2:]
    assert store.claim(*key, hashes[:1], worker="a", seconds=60) == hashes[:1]  # renewed
    assert store.leased([key[0]], key[1], key[2], worker="a") == {key[0]: 1}
    assert store.leased([key[0]], key[1], key[2], worker="b") == {key[0]: 2}
    assert store.lease_holders() == {"a", "b"}
    store.add(batch[:2])  # a measured its two: their leases end with the commit
    assert store.leased([key[0]], key[1], key[2], worker="b") == {}
    # measured candidates are never handed out again, whoever asks
    assert store.claim(*key, hashes, worker="c", seconds=60) == []
    store.release("b")
    assert store.claim(*key, hashes, worker="c", seconds=60) == hashes[2:]


def test_a_claim_under_a_budget_takes_no_more_than_its_room(store) -> None:
    """Two workers read the budget's room, draft a round each, then claim: the second one's
    claim must see the first one's leases (the budget was checked before the drafting)."""
    from tensortune.records.storage import ClaimBudget

    batch = make_records(store, MM, [1e-3] * 6)
    key = (batch[0].workload_id, batch[0].hardware_id, batch[0].target)
    other = make_records(store, "matmul:8,16,16", [1e-3])[0].workload_id
    hashes = _hashes(batch)
    store.add(batch[:1])
    per_task = ClaimBudget((key[0], other), total=10, per_task=4)
    # one measured: room for three, in the caller's order, the measured one left out
    assert store.claim(*key, hashes[::-1], worker="a", seconds=60, budget=per_task) == \
        hashes[5:2:-1]  # fmt: skip
    assert store.claim(*key, hashes[1:3], worker="b", seconds=60, budget=per_task) == []
    # a worker's own leases are renewed, not counted twice
    assert store.claim(*key, hashes[3:], worker="a", seconds=60, budget=per_task) == hashes[3:]
    store.release("a")
    total = ClaimBudget((key[0], other), total=3, per_task=4)
    store.claim(other, key[1], key[2], hashes[:1], worker="c", seconds=60)  # another task's
    assert store.claim(*key, hashes, worker="b", seconds=60, budget=total) == hashes[1:2]


def test_a_lease_expires_by_the_databases_clock(store) -> None:
    import time

    batch = make_records(store, MM, [1e-3, 2e-3])
    key = (batch[0].workload_id, batch[0].hardware_id, batch[0].target)
    hashes = _hashes(batch)
    assert store.claim(*key, hashes, worker="dead", seconds=0.5) == hashes
    assert store.claim(*key, hashes, worker="alive", seconds=60) == []
    time.sleep(0.8)
    assert store.leased([key[0]], key[1], key[2]) == {}  # expired leases count for nobody
    # in the caller's order, whatever order the locks are taken in
    assert store.claim(*key, hashes[::-1], worker="alive", seconds=60) == hashes[::-1]


def test_a_record_committed_twice_is_kept_once(store) -> None:
    batch = fill(store, MM, [1e-3, 2e-3])
    stored = list(store.query())
    assert all(r.uid for r in stored) and len({r.uid for r in stored}) == 2
    store.add(stored)  # a retried transaction, or a second copy of the same records
    assert store.count() == 2
    store.add(batch)  # no uid yet: new records, even with the same content
    assert store.count() == 4


@functools.cache
def a_dead_workers_name() -> str:
    """The lease name of a process that has ended; one for the session (its start imports
    tensortune, a second or two)."""
    import subprocess

    return subprocess.run([sys.executable, "-c", "from tensortune.search.leases import "
                           "worker_name; print(worker_name())"], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def test_leases_of_a_tuner_that_dies_beside_this_one_are_freed_while_it_runs(
    store, monkeypatch
) -> None:
    import socket

    import tensortune.search.leases as leases
    from tensortune.search.leases import SharedBudget, worker_name

    monkeypatch.setattr(leases, "SWEEP_SECONDS", 0.0)
    batch = make_records(store, MM, [1e-3, 2e-3, 3e-3])
    wid, hw, tgt = batch[0].workload_id, batch[0].hardware_id, batch[0].target
    budget = SharedBudget(store, [wid], hw, tgt, total=3, per_task=3, worker=worker_name())
    # another tuner claims after this one started, then dies (a kill -9)
    dead = a_dead_workers_name()
    # Same host name, another pid namespace (a container, a VM of the same name): its pids
    # mean nothing here, and its leases are not freed.
    host, pid = socket.gethostname(), dead.split("/")[1]
    elsewhere = [f"{host}/{pid}/1/x", f"{dead.split('/')[0]}0/{pid}/1/x"]
    for other, h in zip(elsewhere, _hashes(batch)[1:], strict=True):
        store.claim(wid, hw, tgt, [h], worker=other, seconds=600)
    store.claim(wid, hw, tgt, _hashes(batch)[:1], worker=dead, seconds=600)
    assert budget.left(wid) == 1  # the dead tuner's claim no longer holds the budget back
    assert store.lease_holders() == set(elsewhere)
    budget.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_live_worker_is_not_taken_for_dead_when_the_wall_clock_steps(monkeypatch) -> None:
    """psutil derives a process's start from the boot time, read against the wall clock: after
    an NTP step or a VM's resume every live worker looked like another process, and its
    siblings freed its leases at every sweep."""

    import psutil

    from tensortune.search import leases

    me = leases.worker_name()
    # The start read is the process's: psutil's start less its boot time, in clock ticks.
    ticks = leases._started(os.getpid()) / os.sysconf("SC_CLK_TCK")
    assert abs(ticks - (psutil.Process().create_time() - psutil.boot_time())) < 1
    fields = " ".join(["S", *map(str, range(4, 22)), "777", "0"])
    assert leases._start_field(f"42 (a) b) {fields}") == 777  # a name with ") " in it
    started = psutil.Process.create_time
    monkeypatch.setattr(psutil.Process, "create_time", lambda self: started(self) + 3600.0)
    assert not leases._gone(me)  # the clock moved on by an hour; the process is the same
    dead = a_dead_workers_name()
    assert leases._gone(dead)
    # An earlier version named it with its start in ms since the epoch, four fields: read as
    # alive (its expiry frees it), as that version reads this one's names.
    assert not leases._gone("/".join([*dead.split("/")[:2], "1796600000000", "abcdef"]))


def test_a_task_held_back_only_by_another_workers_leases_waits_for_them(tmp_path: Path) -> None:
    """Ending such a task would be for good (MetaSchedule asks no more), yet the other worker
    may stop and hand its leases back."""
    import threading
    import time

    from tensortune.search.leases import SharedBudget, worker_name

    url = _url(tmp_path / "r.db")
    store = open_records(url)
    batch = make_records(store, MM, [1e-3, 2e-3, 3e-3])
    wid, hw, tgt = batch[0].workload_id, batch[0].hardware_id, batch[0].target
    hashes = _hashes(batch)
    other = "remote-host/1/1/x"  # elsewhere: only its release, commit or expiry frees them
    budget = SharedBudget(store, [wid], hw, tgt, total=3, per_task=3, worker=worker_name())

    def after(seconds: float, action) -> threading.Thread:  # the other worker, meanwhile
        def act() -> None:
            time.sleep(seconds)
            with open_records(url) as s:
                action(s)

        thread = threading.Thread(target=act)
        thread.start()
        return thread

    def waits(b: SharedBudget, w: int) -> float:
        start = time.monotonic()
        b.wait_for_others(w, poll_s=0.05)
        return time.monotonic() - start

    # holding one itself, a worker does not wait: two could wait on each other
    assert budget.claim(wid, hashes[:1], limit=1) == set(hashes[:1])
    store.claim(wid, hw, tgt, hashes[1:], worker=other, seconds=600)
    assert budget.left(wid) == 0 and waits(budget, wid) < 0.5
    budget.close()

    store.claim(wid, hw, tgt, hashes, worker=other, seconds=600)
    assert budget.left(wid) == 0
    thread = after(0.5, lambda s: s.release(other))  # it stopped before measuring them
    assert waits(budget, wid) >= 0.5
    thread.join()
    assert budget.left(wid) == 3

    store.claim(wid, hw, tgt, hashes, worker=other, seconds=600)
    thread = after(0.5, lambda s: s.add(batch))  # it measured them: the budget is spent
    waits(budget, wid)
    thread.join()
    assert budget.left(wid) == 0 and store.count() == 3

    # One that never lets go (died elsewhere: its leases outlast any wait): the worker waits
    # max_wait_s in all over its run, then its tasks end as they used to.
    more = make_records(store, "matmul:8,16,16", [1e-3, 2e-3], name="mm")
    mid = more[0].workload_id
    store.claim(mid, hw, tgt, _hashes(more), worker=other, seconds=600)
    patient = SharedBudget(store, [mid], hw, tgt, total=2, per_task=2, max_wait_s=0.3)
    assert 0.3 <= waits(patient, mid) < 3
    assert waits(patient, mid) < 0.1  # the allowance is spent
    # only the task's own cap leased, budget left for other tasks: the task ends, no wait
    shared = SharedBudget(store, [wid, mid], hw, tgt, total=10, per_task=2)
    assert shared.left(mid) == 0 and waits(shared, mid) < 0.5
    store.close()


def test_under_a_deadline_first_rounds_share_the_time_left(tmp_path: Path) -> None:
    import time

    from tensortune.search.leases import MIN_FIRST_ROUND, SharedBudget

    store = open_records(_url(tmp_path / "r.db"))
    batch = make_records(store, MM, [1e-3, 2e-3])
    store.add(batch)
    hw, tgt = batch[0].hardware_id, batch[0].target
    waiting = [store.workload_id(parse_spec(f"matmul:{n},16,16").to_module(), "mm")
               for n in (4, 8, 12)]  # fmt: skip
    wids = [batch[0].workload_id, *waiting]

    def budget(left_s: float | None, spent_s: float = 100.0) -> SharedBudget:
        """A budget with ``left_s`` of ``spent_s + left_s`` seconds left, spent measuring at
        1 s a candidate."""
        deadline = None if left_s is None else time.monotonic() + left_s
        b = SharedBudget(store, wids, hw, tgt, total=1000, per_task=1000, deadline=deadline)
        b._created = b._started = time.monotonic() - spent_s
        b.measured(int(spent_s))
        return b

    assert budget(None).left(wids[0]) == 998  # no deadline: no share
    # half of 100 s left at 1 s a candidate: the three waiting tasks share it, with this one if
    # it asks for another round meanwhile
    for wid in waiting:
        assert 15 <= budget(100).left(wid) <= 16
    assert 11 <= budget(100).left(wids[0]) <= 12
    assert budget(2).left(waiting[0]) == MIN_FIRST_ROUND
    fresh = SharedBudget(store, wids, hw, tgt, total=1000, per_task=1000,
                         deadline=time.monotonic() + 60)  # fmt: skip
    assert fresh.left(waiting[0]) == 998  # no pace yet: the first round goes as asked
    ended = budget(100)
    ended.ended.update(waiting[1:])  # their searches ended with nothing measured
    assert ended.left(waiting[0]) == 998  # no one else waits
    # past the deadline, within a tenth of the budget: a minimal round for a task with none
    assert budget(-5).left(waiting[0]) == MIN_FIRST_ROUND
    assert budget(-5).left(wids[0]) == 0
    assert budget(-15).left(waiting[0]) == 0
    # a tenth of the whole budget, though this object was made late in it (after a warm start)
    late = SharedBudget(store, wids, hw, tgt, total=1000, per_task=1000,
                        deadline=time.monotonic() - 5, span=100.0)  # fmt: skip
    assert late.left(waiting[0]) == MIN_FIRST_ROUND
    store.add(make_records(store, "matmul:4,16,16", [1e-3], name="mm"))
    store.add(make_records(store, "matmul:8,16,16", [1e-3], name="mm"))
    assert 24 <= budget(100).left(wids[0]) <= 25  # one other waits
    # the last one waiting is held back by no one
    assert budget(100).left(waiting[2]) == 1000 - store.count()
    store.add(make_records(store, "matmul:12,16,16", [1e-3], name="mm"))
    assert budget(100).left(wids[0]) == 1000 - store.count()


def test_leases_of_a_process_that_died_here_are_freed_at_once(store) -> None:
    from tensortune.search.leases import SharedBudget, worker_name

    batch = make_records(store, MM, [1e-3, 2e-3, 3e-3])
    wid, hw, tgt = batch[0].workload_id, batch[0].hardware_id, batch[0].target
    dead = a_dead_workers_name()
    store.claim(wid, hw, tgt, _hashes(batch)[:2], worker=dead, seconds=600)
    store.claim(wid, hw, tgt, _hashes(batch)[2:], worker="remote-host/1/1/x", seconds=600)
    budget = SharedBudget(store, [wid], hw, tgt, total=5, per_task=5, worker=worker_name())
    # the dead process's two are free again; the other machine's one stays until it expires
    assert store.lease_holders() == {"remote-host/1/1/x"}
    assert budget.left(wid) == 4
    assert budget.claim(wid, _hashes(batch), limit=5) == set(_hashes(batch)[:2])
    assert budget.left(wid) == 2  # ours count too: measured, not yet committed
    store.add(batch[:2])  # the commit ends our two leases
    assert budget.left(wid) == 2
    budget.close()


def test_a_module_too_deep_to_read_back_is_not_stored(tmp_path: Path) -> None:
    # The reader's depth bound refused a 600-way concatenation that the store had taken; a
    # store now takes what it can hand back and refuses, in one line, what it could not.
    import tvm
    from tvm import te, topi

    def concat(n: int) -> object:
        xs = [te.placeholder((4,), name=f"x{i}") for i in range(n)]
        return tvm.IRModule({"main": te.create_prim_func([*xs, topi.concatenate(xs)])})

    with open_records(_url(tmp_path / "r.db")) as store:
        wid = store.workload_id(concat(600), "concat600")
        from tensortune.compat import structural_equal

        assert structural_equal(store.workload(wid).mod(), concat(600))  # handed back whole
        with pytest.raises(RecordsError, match=r"concat900 cannot be stored.*deeper than 1500"):
            store.workload_id(concat(900), "concat900")
        assert len(store.workloads()) == 1


def test_a_commit_is_on_disk_when_it_returns(sqlite_store) -> None:
    """WAL mode at synchronous=NORMAL keeps the file whole through a power cut but may take
    back its last commits: measurements the tuner had reported as recorded."""
    mode = sqlite_store._db.execute("PRAGMA journal_mode").fetchone()[0]
    level = sqlite_store._db.execute("PRAGMA synchronous").fetchone()[0]
    assert (mode, level) == ("wal", 2)  # 2: FULL


def test_both_stores_keep_what_a_crashing_kernel_says_and_refuse_a_negative_limit(store):
    """A NUL character in an error message (a compiler's or a kernel's output) made
    PostgreSQL refuse the whole batch, the round's measurements with it, where SQLite kept
    it; a negative limit was no limit on SQLite and an error on PostgreSQL."""
    import dataclasses

    from tensortune.records.schema import TaskSource

    (failed,) = make_records(store, MM, [None])
    store.add([dataclasses.replace(failed, error="[run_error] boom\x00\x00 at 0x0")])
    (got,) = store.query()
    assert got.error == "[run_error] boom\\x00\\x00 at 0x0"
    wid = store.workload_id(parse_spec(SM).to_module(), "soft\x00max")
    store.add_task_sources([TaskSource("net\x00", wid, "t\x00", 1)])
    assert store.workload(wid).name == "soft\\x00max"
    assert store.task_sources() == [TaskSource("net\\x00", wid, "t\\x00", 1)]
    with pytest.raises(RecordsError, match="limit must not be negative"):
        list(store.query(limit=-1))


def test_an_empty_file_is_no_store_as_an_empty_database_is(tmp_path: Path) -> None:
    from tensortune.errors import NoStoreError

    (tmp_path / "empty.db").write_bytes(b"")
    with pytest.raises(NoStoreError, match="is empty, not a tensortune records store"):
        open_records(_url(tmp_path / "empty.db"), create=False)


def test_one_store_object_shared_by_two_threads_takes_both_writers(store):
    """A notebook's background tune and an import into the same store object: the second
    BEGIN ran inside the first's transaction on the one connection."""
    import dataclasses
    import threading

    records = make_records(store, MM, [1e-3, 2e-3])
    failures: list[BaseException] = []

    def writer() -> None:
        try:
            for _ in range(40):
                store.add([dataclasses.replace(r, uid="") for r in records])
                assert store.count() >= 2
        except BaseException as e:  # reported below, with the thread it ended
            failures.append(e)

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert failures == [] and store.count() == 2 * 40 * 2


def test_redact_leaves_a_path_as_it_is_and_hides_every_password_libpq_reads() -> None:
    from tensortune.records.postgres import passwords, redact

    for plain in ("r.db", "/tmp/x/r.db", "sqlite:///r.db", "postgresql://u@h/db"):
        assert redact(plain) == plain  # "r.db" came back as "r.db://"
    url = "postgresql://u:a#b@h:5432/db?sslpassword=k3y&password=p%40ss"
    assert redact(url) == "postgresql://u:***@h:5432/db?sslpassword=***&password=***"
    assert set(passwords(url)) == {"a#b", "k3y", "p%40ss", "p@ss"}
