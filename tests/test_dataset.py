"""dataset build / info: one row per program with TenSet labels, cached features and a card."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import args_text, fill, sampled, trace_text

from tensortune import features as F
from tensortune.datasets.build import CARD, TABLE, build_dataset, load_table, read_card
from tensortune.errors import TensortuneError
from tensortune.records import open_records
from tensortune.records.schema import Record
from tensortune.tuning.tune import tune

TARGET = {"kind": "llvm", "num-cores": 2}


@pytest.fixture(scope="module")
def store_url(tmp_path_factory):
    path = tmp_path_factory.mktemp("ds") / "r.db"
    url = f"sqlite:///{path}"
    tune(["matmul:32,32,32", "softmax:8,64"], trials=12, records=url,
         work_dir=path.parent / "w", trials_per_round=3, strategy="replay-trace",
         cost_model="random", target=TARGET)  # fmt: skip
    with open_records(url) as store:  # one failure of a program not measured yet, as the
        # runner would record it
        mod, cands = sampled("matmul:32,32,32", 16, seed=7)
        r = next(store.query(workload_id=store.workload_id(mod, create=False), ok_only=True))
        stored = {x.trace for x in store.query()}
        failed = next(c for c in cands if trace_text(c) not in stored)
        store.add([Record(r.workload_id, r.hardware_id, r.target, trace_text(failed),
                          args_text(failed), (), "run_error", "boom", "x", r.tvm_version,
                          1.0)])  # fmt: skip
    return url


@pytest.fixture(scope="module")
def dataset(store_url, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "d"
    card = build_dataset(store_url, out, description="test")
    return out, card


def test_a_program_measured_twice_is_one_row(tmp_path):
    """Two collections of a shared task draw the same programs; as two rows, a random split
    put one in training and its twin in the test set."""
    with open_records(f"sqlite:///{tmp_path / 'r.db'}") as store:
        fill(store, "matmul:16,16,16", [2e-3, 1e-3, None])
        fill(store, "matmul:16,16,16", [None, 3e-3, 4e-3])  # the same three programs again
        build_dataset(store.url, tmp_path / "d")
    table = load_table(tmp_path / "d").to_pydict()
    # the first measurement that ran of each: 2e-3, 1e-3, then 4e-3 (its first failed)
    assert table["cost"] == pytest.approx([2e-3, 1e-3, 4e-3])
    assert table["label"] == pytest.approx([0.5, 1.0, 0.25])


def test_targets_that_build_other_code_have_other_hardware_names():
    """Labels are each task's best per target: two targets under one name were one group to
    every reader (training, subsets), with two programs at 1.0."""
    from tensortune.datasets.build import hardware_label
    from tensortune.hardware import target_key

    hw = "ab" * 8
    skx = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}
    assert hardware_label(target_key(skx), hw) == "avx512-2c@abababab"
    assert hardware_label(target_key({**skx, "mcpu": "znver3"}), hw) == "znver3-2c@abababab"
    names = {hardware_label(target_key({**skx, **more}), hw)
             for more in ({"mattr": ["-avx512f"]}, {"mattr": ["-avx512bw"]},
                          {"mattr": ["+avx512f"]}, {"opt-level": 2})}  # fmt: skip
    # with mattr it is none of our configurations; with opt-level, avx512-2c's plus a digest
    assert len(names) == 4 and all("-2c+" in n and n.endswith("@abababab") for n in names)


def test_one_row_per_program_with_tenset_labels(dataset, store_url):
    out, card = dataset
    table = load_table(out).to_pydict()
    with open_records(store_url) as store:
        assert len(table["program_id"]) == store.count() == card.data["programs"] == 13
    for task in set(table["task_id"]):
        rows = [i for i, t in enumerate(table["task_id"]) if t == task]
        costs = [table["cost"][i] for i in rows if table["cost"][i] is not None]
        labels = [table["label"][i] for i in rows]
        assert max(labels) == pytest.approx(1.0)
        for i in rows:
            if table["cost"][i] is None:
                assert table["label"][i] == 0.0 and table["status"][i] == "run_error"
            else:
                assert table["label"][i] == pytest.approx(min(costs) / table["cost"][i])
    assert card.data["successful"] == 12


def test_features_have_their_documented_widths(dataset):
    out, card = dataset
    t = load_table(out, columns=["per_store", "trace_tokens", "workload_embedding",
                                  "hardware_vector"]).to_pydict()  # fmt: skip
    for per_store, tokens, wl, hw in zip(*t.values(), strict=True):
        assert np.asarray(per_store).shape[1] == F.PER_STORE_WIDTH
        assert np.asarray(tokens).shape[1] == F.TOKEN_WIDTH and len(tokens) > 0
        assert len(wl) == F.WORKLOAD_WIDTH and len(hw) == F.HARDWARE_WIDTH
    assert card.data["widths"]["trace_tokens"] == F.TOKEN_WIDTH
    assert card.feature_schema == F.schema_hash()


def test_table_columns_are_the_tables_values_with_features_as_arrays(dataset):
    import pyarrow as pa

    from tensortune.datasets.build import table_columns

    out, _ = dataset
    table = load_table(out)
    per_store = table.column("per_store").to_pylist()
    per_store[1] = None  # a program without features
    table = table.set_column(table.schema.get_field_index("per_store"), "per_store",
                             pa.array(per_store, table.schema.field("per_store").type))  # fmt: skip
    plain, fast = table.to_pydict(), table_columns(table)
    assert fast.keys() == plain.keys()
    for name, values in plain.items():
        got = fast[name]
        assert len(got) == len(values)
        if name in ("per_store", "trace_tokens", "workload_embedding", "hardware_vector"):
            for a, b in zip(got, values, strict=True):
                assert (a is None) == (b is None)
                if a is not None:
                    ndim = 2 if name in ("per_store", "trace_tokens") else 1
                    assert a.dtype == np.float32 and a.ndim == ndim
                    np.testing.assert_array_equal(a, np.asarray(b, np.float32))
        else:
            assert got == values
    assert fast["per_store"][1] is None and fast["per_store"][0].shape[1] == F.PER_STORE_WIDTH


def test_trace_tokens_encode_kinds_and_decisions():
    trace = [[["GetSBlock", [], ["C", "main"], ["b0"]],
              ["SamplePerfectTile", ["l1"], [4, 64], ["v2", "v3"]],
              ["Annotate", ["b0", 16], ["meta_schedule.parallel"], []],
              ["EnterPostproc", [], [], []], ["Parallel", ["l9"], [], []]],
             [[1, [8, 4]]]]  # fmt: skip
    tokens = F.trace_tokens(trace)
    assert tokens.shape == (3, F.TOKEN_WIDTH)  # the postproc part is left out
    kinds = tokens[:, : len(F.INSTRUCTION_KINDS)].argmax(axis=1)
    assert [F.INSTRUCTION_KINDS[k] for k in kinds] == ["GetSBlock", "SamplePerfectTile", "Annotate"]
    decision_at = len(F.INSTRUCTION_KINDS) + 1 + len(F.ANNOTATIONS) + 1
    assert tokens[1, decision_at : decision_at + 2] == pytest.approx([np.log2(9), np.log2(5)])
    assert tokens[2, len(F.INSTRUCTION_KINDS) + 1] == 1.0  # annotation key: parallel


def test_the_hardware_vector_reflects_the_target_isa_not_the_host():
    from conftest import platform

    avx2 = F.hardware_vector(platform({"kind": "llvm", "mcpu": "haswell", "num-cores": 1}))
    avx512 = F.hardware_vector(platform({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}))
    lanes = len(F._ISA_FEATURES)
    assert (avx2[lanes], avx512[lanes]) == (8, 16)
    assert (avx2[lanes + 1], avx512[lanes + 1]) == (1, 2)


def test_info_json(dataset):
    out, _ = dataset
    cmd = [sys.executable, "-m", "tensortune.cli.app", "dataset", "info", str(out), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    info = json.loads(proc.stdout)
    assert info["programs"] == 13 and info["tasks"] == 2
    assert len(info["hardware"]) == 1 and info["networks"] == []


def test_a_dataset_from_another_feature_schema_is_refused(dataset, tmp_path):
    out, _ = dataset
    other = tmp_path / "other"
    other.mkdir()
    card = json.loads((out / CARD).read_text())
    card["feature_schema"] = "0000000000000000"
    (other / CARD).write_text(json.dumps(card))
    (other / TABLE).write_bytes((out / TABLE).read_bytes())
    with pytest.raises(TensortuneError, match=r"feature schema 0000000000000000.*rebuild"):
        read_card(other)


def test_a_modified_table_fails_its_checksum(dataset, tmp_path):
    out, _ = dataset
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / CARD).write_text((out / CARD).read_text())
    (copy / TABLE).write_bytes((out / TABLE).read_bytes()[:-10] + b"0123456789")
    with pytest.raises(TensortuneError, match="checksum"):
        load_table(copy)


def test_a_dataset_is_replaced_only_when_asked_and_never_over_other_files(dataset, store_url,
                                                                        tmp_path, cli):  # fmt: skip
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "README.md").write_text("my project")
    with pytest.raises(TensortuneError, match=r"is not a dataset but holds README\.md"):
        build_dataset(store_url, mine)
    code, _, err = cli("dataset", "build", str(mine), "--records", store_url)
    assert code == 2 and err.startswith("error: ") and "README.md" in err, err
    assert len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in mine.iterdir()) == ["README.md"]
    assert (mine / "README.md").read_text() == "my project"
    again = tmp_path / "again"
    shutil.copytree(dataset[0], again)
    (again / "note.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in again.iterdir()}
    with pytest.raises(TensortuneError, match="already holds a dataset"):
        build_dataset(store_url, again)  # the only copy, maybe, of a store since deleted
    code, _, err = cli("dataset", "build", str(again), "--records", store_url)
    assert code == 2 and "--overwrite" in err and len(err.strip().splitlines()) == 1, err
    assert {p.name: p.read_bytes() for p in again.iterdir()} == before
    assert build_dataset(store_url, again, overwrite=True).data["programs"] == 13
    code, out, _ = cli("dataset", "build", str(again), "--records", store_url, "--overwrite")
    assert code == 0 and "13 programs" in out
    assert (again / "note.txt").read_text() == "mine"  # a file of no dataset's name stays
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    code, _, err = cli("dataset", "build", str(a_file), "--records", store_url)
    assert code == 2 and "is a file, not a directory" in err, err
    # A write killed between its renames: the table in place, the card still staged.
    cut = tmp_path / "cut"
    cut.mkdir()
    shutil.copy(dataset[0] / TABLE, cut / TABLE)
    shutil.copy(dataset[0] / CARD, cut / f".{CARD}.partial")
    assert build_dataset(store_url, cut).data["programs"] == 13


def test_an_empty_store_gives_a_clear_error(tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    open_records(url).close()
    with pytest.raises(TensortuneError, match="holds no records"):
        build_dataset(url, tmp_path / "d")


def test_workloads_table_replays_every_trace_and_feeds_the_draft_check(dataset):
    from tensortune.compat import tvm
    from tensortune.datasets.build import load_workloads
    from tensortune.search.analyzer.quality import draft_quality

    out, _ = dataset
    modules = load_workloads(out)
    table = load_table(out, ["task_id", "trace"]).to_pydict()
    assert set(modules) == set(table["task_id"])
    for task, trace in zip(table["task_id"], table["trace"], strict=True):
        tvm.s_tir.Trace.apply_json_to_schedule(json.loads(trace), tvm.s_tir.Schedule(modules[task]))
    q = draft_quality(out, share=0.5, min_programs=4)
    assert q.groups >= 1 and q.programs >= 8
    assert all(0.0 <= r <= 1.0 for r in q.recall.values()) and 0 < q.best_in_draft <= 1.0
    with pytest.raises(TensortuneError, match="no task"):
        draft_quality(out, min_programs=10_000)


def test_held_out_networks_must_be_the_datasets_and_a_card_must_list_them_as_names(
    dataset, store_url, tmp_path
):
    with pytest.raises(TensortuneError, match="held-out network nosuch has no records here"):
        build_dataset(store_url, tmp_path / "d", held_out=["nosuch"])
    out, _ = dataset
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    card = json.loads((copy / "card.json").read_text())
    (copy / "card.json").write_text(json.dumps({**card, "held_out": 5}))
    with pytest.raises(TensortuneError, match="held_out is not a list of network names"):
        read_card(copy)


def test_a_dataset_is_built_from_a_store_that_grows_meanwhile(tmp_path, monkeypatch):
    """A collector on another machine registers its hardware while a build reads the store
    (minutes of features): its records reached the build with no hardware known for them, a
    KeyError."""
    from conftest import fill, other_hardware

    url = f"sqlite:///{tmp_path / 'r.db'}"
    with open_records(url) as store:
        fill(store, "matmul:16,16,16", [1e-3, 2e-3])
        fill(store, "matmul:16,16,16", [3e-3, 4e-3], hardware=other_hardware(), seed=1)
        newcomer = other_hardware().id
        read = store.hardware

        def before_the_newcomer() -> dict:  # the build's first look, then the store as it is
            known = read()
            monkeypatch.setattr(store, "hardware", read)
            return {k: v for k, v in known.items() if k != newcomer}

        monkeypatch.setattr(store, "hardware", before_the_newcomer)
        card = build_dataset(store, tmp_path / "ds")
    assert card.data["programs"] == 4
    assert any(h.endswith("@" + newcomer[:8]) for h in card.data["hardware"])
