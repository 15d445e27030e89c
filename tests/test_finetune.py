"""Few-shot fine-tuning on new hardware (train/finetune.py), the CLI over it, and the
held-out-hardware study (compare/hardware.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tensortune import features as F
from tensortune.costmodel.data import ProgramSet, concat_programs
from tensortune.costmodel.registry import load_cost_model, model_class
from tensortune.errors import TensortuneError
from tensortune.train.finetune import PER_TASK, adapt, finetune, sample_rows


def _columns(tasks: int, per_task: int, failed_every: int = 0) -> dict:
    n = tasks * per_task
    label = np.linspace(1.0, 0.1, n)
    if failed_every:
        label[::failed_every] = 0.0
    return {"task_id": np.repeat(np.arange(tasks), per_task), "program_id": np.arange(n)[::-1],
            "label": label, "per_store": [[[0.0]]] * n,
            "hardware": np.where(np.arange(n) % 2, "avx2-1c@aa", "avx512-1c@bb")}  # fmt: skip


def test_first_k_are_the_first_measured_successful_programs():
    cols = _columns(4, 10, failed_every=3)
    rows = sample_rows(cols, 5)
    # program ids run backwards over the rows: the first measured are the last rows.
    ok = [i for i in range(39, -1, -1) if cols["label"][i] > 0]
    assert rows.tolist() == ok[:5]
    assert (cols["label"][sample_rows(cols, 5, hardware="avx2-1c")] > 0).all()
    assert set(cols["hardware"][sample_rows(cols, 6, hardware="avx2-1c")]) == {"avx2-1c@aa"}
    cols["label"][:] = 0.0
    cols["label"][1] = 0.5  # one program ran: nothing to rank, however many are asked for
    with pytest.raises(TensortuneError, match="hold 1 successful program; fine-tuning needs"):
        sample_rows(cols, 64)


def test_a_configuration_name_that_several_machines_share_is_refused():
    from tensortune.train.finetune import same_cpu

    cols = _columns(4, 10)
    cols["hardware"] = np.where(np.arange(40) % 2, "avx512-2c@aa", "avx512-2c@bb")
    with pytest.raises(TensortuneError, match="'avx512-2c' names a configuration of 2 machines"):
        sample_rows(cols, 5, hardware="avx512-2c")
    assert set(cols["hardware"][sample_rows(cols, 5, hardware="avx512-2c@aa")]) == {"avx512-2c@aa"}
    cols["hardware"][:4] = "avx2-1c@aa"
    assert same_cpu(cols, np.array([1])).tolist() == [h.endswith("@aa") for h in cols["hardware"]]


def test_a_seeded_sample_takes_whole_tasks_and_is_reproducible():
    cols = _columns(20, 40)
    rows = sample_rows(cols, 40, seed=3)
    assert len(rows) == 40 and len(set(rows.tolist())) == 40
    per_task = np.bincount(cols["task_id"][rows])
    assert per_task.max() == PER_TASK and (per_task > 0).sum() == 3  # 16 + 16 + 8
    assert rows.tolist() == sample_rows(cols, 40, seed=3).tolist()
    assert rows.tolist() != sample_rows(cols, 40, seed=4).tolist()


def test_bad_samples_are_refused():
    cols = _columns(2, 4)
    with pytest.raises(TensortuneError, match="at least 2 programs"):
        sample_rows(cols, 1)
    with pytest.raises(TensortuneError, match="no successful program measured on 'sve'"):
        sample_rows(cols, 4, hardware="sve")
    # and by finetune before anything is read: these records do not exist
    for bad, match in (({"samples": 1}, "at least 2 programs"), ({"steps": -1}, "at least 1")):
        with pytest.raises(TensortuneError, match=match) as e:
            finetune("no-such.ttm", "no-such-records", **{"samples": 8, **bad})
        assert e.value.param == next(iter(bad))


def _machine(n: int, seed: int, sign: float) -> ProgramSet:
    """Programs whose speed depends on two features; ``sign`` says how much the second one
    helps or hurts on this machine, and the machine's hardware vector is ``sign`` too."""
    rng = np.random.default_rng(seed)
    per_store = [np.zeros((2, F.PER_STORE_WIDTH), np.float32) for _ in range(n)]
    for p in per_store:
        p[:, :10] = rng.uniform(0, 5, size=(2, 10))
    speed = np.array([p[:, 3].sum() + sign * p[:, 7].sum() for p in per_store])
    groups = np.arange(n) // 20
    labels = np.zeros(n)
    for g in np.unique(groups):
        s = np.exp(speed[groups == g] / 3)
        labels[groups == g] = s / s.max()
    hardware = np.zeros((n, F.HARDWARE_WIDTH), np.float32)
    hardware[:, 0] = sign
    return ProgramSet(per_store, [np.zeros((1, F.TOKEN_WIDTH), np.float32)] * n,
                      np.zeros((n, F.WORKLOAD_WIDTH), np.float32), hardware, groups,
                      labels)  # fmt: skip


def _pairwise(pred: np.ndarray, data: ProgramSet) -> float:
    from tensortune.train.metrics import pairwise_accuracy

    return float(np.mean([pairwise_accuracy(pred[data.groups == g], data.labels[data.groups == g])
                          for g in np.unique(data.groups)]))  # fmt: skip


@pytest.mark.parametrize("kind", ["hwattn", "xgb"])
def test_fine_tuning_learns_what_the_new_machine_does_differently(kind):
    settings = {"hwattn": {"epochs": 60, "chunk": 20, "hidden": 64, "hardware_hidden": 16,
                           "heads": 2},
                "xgb": {"n_rounds": 60, "refine_rounds": 60}}[kind]  # fmt: skip
    # Two machines to learn from: on one the second feature hurts, on the other it is neutral.
    seen = concat_programs([_machine(400, 0, sign=-1.0), _machine(400, 3, sign=0.0)])
    seen.groups = np.arange(len(seen)) // 20
    model = model_class(kind)(**settings).fit(seen)
    new_machine = _machine(400, 1, sign=+1.0)
    before = _pairwise(model.predict(new_machine), new_machine)
    # hwattn trains its hardware branch alone: it learns the new machine more slowly (300
    # steps: +0.10 to +0.17 over three draws of these machines' programs).
    adapt(model, _machine(64, 2, sign=+1.0), steps=300 if kind == "hwattn" else 100)
    after = _pairwise(model.predict(new_machine), new_machine)
    # On the new machine the second feature helps: the old ranking is partly wrong, 64
    # programs of the new machine teach it.  0.05 is about 7 standard errors of a PCA over
    # these 3,800 pairs.
    assert after > before + 0.05, (before, after)
    # The held-out tasks of the sample showed that: the validation chose to train.
    assert model.finetune_["steps"] > 0, model.finetune_


def test_the_validation_scores_each_length_as_if_trained_that_long_alone():
    """The validation trains one copy to the longest length and scores it on the way: each
    stage must be the model a training of that length alone makes (two members, each with
    its own optimizer and order of programs)."""
    import copy

    settings = {"epochs": 3, "chunk": 20, "hidden": 16, "hardware_hidden": 4, "heads": 2,
                "members": 2}  # fmt: skip
    model = model_class("hwattn")(**settings).fit(_machine(60, 0, sign=0.0))
    data, probe = _machine(60, 1, sign=1.0), _machine(40, 2, sign=1.0)
    staged = copy.deepcopy(model)
    seen = {}
    for stage in staged._train_stages(data, [0, 2, 5]):
        seen[stage] = staged.predict(probe)
    assert list(seen) == [0, 2, 5]
    for epochs, pred in seen.items():
        alone = copy.deepcopy(model)._train(data, epochs)
        assert np.array_equal(alone.predict(probe), pred), epochs
    assert not np.array_equal(seen[2], seen[5])
    assert np.array_equal(model.predict(probe), seen[0])  # the copies trained, not the model


def test_the_validation_leaves_out_tasks_whose_programs_all_failed():
    # Their pairs all tie at 0 and PCA's rule credits a tie by row order: a length could win
    # on the order the failed programs came in.
    import math

    from tensortune.train.finetune import validate_lengths

    model = model_class("mlp")(epochs=2, hidden=16).fit(_machine(60, 0, sign=0.0))
    failed = _machine(60, 1, sign=1.0)
    failed.labels[:] = 0.0
    scores = validate_lengths(model, failed, steps=4)
    assert scores and all(math.isnan(v) for v in scores.values()), scores


def test_fine_tuning_that_does_not_carry_to_other_tasks_is_refused():
    settings = {"epochs": 40, "chunk": 20, "hidden": 64, "hardware_hidden": 16, "heads": 2}
    model = model_class("hwattn")(**settings).fit(_machine(400, 0, sign=0.0))
    # Two tasks of the sample favour the second feature and two penalize it: whichever way
    # three of them teach, the fourth, held out, goes the other way.
    sample = concat_programs([_machine(20, 5 + t, sign=3.0 if t < 2 else -3.0) for t in range(4)])
    sample.groups = np.arange(len(sample)) // 20
    sample.hardware[:] = 0.0
    probe = _machine(200, 9, sign=0.0)
    before = model.predict(probe)
    adapt(model, sample, steps=400)
    chosen, scores = model.finetune_, model.finetune_["validation"]
    # The model as it came is kept: the whole length is far worse on the held-out tasks.
    assert chosen["steps"] == 0 and scores[400] < scores[0] - 0.1
    assert np.array_equal(model.predict(probe), before)  # the model is as it came
    adapt(model, sample, steps=400, validate=False)
    assert model.finetune_["steps"] == 400 and not np.array_equal(model.predict(probe), before)


def test_finetune_writes_a_model_that_remembers_its_sample(tmp_path, cli):
    model = model_class("mlp")(epochs=2, hidden=16).fit(_machine(60, 0, sign=-1.0))
    model.provenance_ = {"dataset": "x", "split": "within-task"}
    model.save(tmp_path / "m.ttm")
    result = finetune(tmp_path / "m.ttm", "default", samples=32, seed=1, hardware="avx512-1c",
                      steps=2, out=tmp_path / "t.ttm")  # fmt: skip
    assert result.samples == 32 and result.tasks >= 2  # up to 16 programs a task
    assert result.steps in result.validation and set(result.validation) == {0, 2}
    tuned = load_cost_model(tmp_path / "t.ttm")
    assert tuned.provenance_["samples"] == 32 and tuned.provenance_["hardware"] == "avx512-1c"
    assert tuned.provenance_["finetuned_from"]["split"] == "within-task"
    code, out, err = cli("finetune", "--model", str(tmp_path / "m.ttm"), "--records", "default",
                         "--samples", "16", "--hardware", "avx2-1c", "--steps", "2",
                         "--out", str(tmp_path / "c.ttm"), "--json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["samples"] == 16
    (tmp_path / "broken.ttm").write_bytes(b"not a zip")
    code, _, err = cli("finetune", "--model", str(tmp_path / "broken.ttm"), "--records",
                       "default", "--samples", "16", "--out", str(tmp_path / "d.ttm"))  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1 and "broken.ttm" in err, err
    code, _, err = cli("finetune", "--model", str(tmp_path / "m.ttm"), "--records",
                       str(tmp_path / "nosuchdir"), "--samples", "16",
                       "--out", str(tmp_path / "e.ttm"))  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--records" in err, err
    # The shipped dataset holds five machines: a sample of all of them adapts to none.
    code, _, err = cli("finetune", "--model", str(tmp_path / "m.ttm"), "--records", "default",
                       "--samples", "16", "--out", str(tmp_path / "f.ttm"))  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--hardware" in err, err
    assert not (tmp_path / "f.ttm").exists()


def test_the_hardware_study_runs_every_arm_on_unseen_hardware_and_networks(monkeypatch, tmp_path):
    from tensortune.compare import hardware
    from tensortune.compare.hardware import hardware_study
    from tensortune.costmodel.moa import MomentumAdapted

    fed: dict[int, tuple[MomentumAdapted, list]] = {}
    update, sample_rows = MomentumAdapted.update, hardware.sample_rows

    def watched(self, data, **kw):
        fed.setdefault(id(self), (self, []))[1].append(data)
        return update(self, data, **kw)

    def uneven(columns, k, seed, **kw):  # 6 rows fewer: a batch of 16 ends inside a task
        return sample_rows(columns, k, seed, **kw)[6:]

    monkeypatch.setattr(MomentumAdapted, "update", watched)
    monkeypatch.setattr(hardware, "sample_rows", uneven)
    tiny = {"epochs": 1, "hidden": 16, "hardware_hidden": 8, "heads": 2}
    result = hardware_study("default", hardware="avx512-1c", folds=[["gpt2-block"]],
                            models=["hwattn"], ks=[16, 32], seeds=[0],
                            params={"hwattn": tiny})  # fmt: skip
    arms = [r["arm"] for r in result.rows]
    # no moa-16: from one batch of 16, MoA's gate keeps the zero-shot model as it is
    assert arms == ["full", "zero-shot", "finetune-16", "scratch-16", "finetune-32",
                    "scratch-32", "moa-32"]  # fmt: skip
    assert all(0 <= r["pca"] <= 1 for r in result.rows)
    assert {e["arm"] for e in result.summary()} == set(arms)
    # MoA learns each task as one ranking group, however its rows fell into batches (a task
    # split by a batch boundary was two groups, its programs never compared across it).
    ((moa, batches),) = fed.values()
    assert len(batches) == 2
    tasks = np.unique(np.concatenate([b.groups for b in batches]))
    assert len(np.unique(moa.seen_.groups)) == len(tasks)
    with pytest.raises(TensortuneError, match="no row of the dataset was measured on 'sve'"):
        hardware_study("default", hardware="sve", folds=[["gpt2-block"]])
    # Run again with a checkpoint, twice: the second fits nothing and gives the same rows.
    path = tmp_path / "hardware.json"
    args = {"hardware": "avx512-1c", "folds": [["gpt2-block"]], "models": ["hwattn"], "ks": [16],
            "seeds": [0], "params": {"hwattn": tiny}, "checkpoint": path}  # fmt: skip
    first = hardware_study("default", **args)
    monkeypatch.setattr(hardware._Run, "arms", lambda *_: pytest.fail("fitted again"))
    assert hardware_study("default", **args).rows == first.rows


def test_finetune_reads_a_metaschedule_database_as_this_machines(tmp_path):
    from conftest import fill

    from tensortune.hardware import current_hardware
    from tensortune.records import open_records
    from tensortune.records.interop import export_records
    from tensortune.train.trainer import records_columns

    with open_records(f"sqlite:///{tmp_path / 'r.db'}") as store:
        fill(store, "matmul:16,16,16", [3e-5, 1e-5, 2e-5, None, 4e-5])
        export_records(store, tmp_path / "db")
    model = model_class("hwattn")(epochs=1, hidden=16, hardware_hidden=8, heads=2)
    model.fit(_machine(40, 0, sign=-1.0)).save(tmp_path / "m.ttm")
    result = finetune(tmp_path / "m.ttm", tmp_path / "db", samples=8, steps=2)
    assert result.samples == 4 and result.tasks == 1  # the failed program is no sample
    first = finetune(tmp_path / "m.ttm", tmp_path / "db", samples=2, steps=2)
    assert first.samples == 2
    # The database's records count as measured here: this machine's hardware, and vector.
    columns, _ = records_columns(tmp_path / "db", measured_here=True)
    assert {h.split("@")[1] for h in columns["hardware"]} == {current_hardware().id[:8]}


def test_finetune_scores_its_test_records_as_this_machines_before_and_after(tmp_path, cli,
                                                                          monkeypatch):  # fmt: skip
    """The sample is read as measured here; the before/after scores must read the test
    database the same way, or a hardware-aware model is scored on another machine's vector."""
    import importlib

    from conftest import fill

    from tensortune.records import open_records
    from tensortune.records.interop import export_records

    for name, costs in (("db", [3e-5, 1e-5, 2e-5, 4e-5]), ("test", [2e-5, 5e-5, 1e-5])):
        with open_records(f"sqlite:///{tmp_path / name}.db") as store:
            fill(store, "matmul:16,16,16", costs)
            export_records(store, tmp_path / name)
    model_class("hwattn")(epochs=1, hidden=16, hardware_hidden=8, heads=2).fit(
        _machine(40, 0, sign=-1.0)).save(tmp_path / "m.ttm")  # fmt: skip
    # by module name: ``tensortune.train`` the attribute is the API's train()
    trainer = importlib.import_module("tensortune.train.trainer")
    seen: list[bool] = []
    real = trainer.records_columns

    def spy(directory, **kw):
        seen.append(kw.get("measured_here", False))
        return real(directory, **kw)

    monkeypatch.setattr(trainer, "records_columns", spy)
    code, out, err = cli("finetune", "--model", str(tmp_path / "m.ttm"), "--records",
                         str(tmp_path / "db"), "--samples", "4", "--steps", "2", "--out",
                         str(tmp_path / "t.ttm"), "--test-records", str(tmp_path / "test"),
                         "--json")  # fmt: skip
    assert code == 0, err
    after = json.loads(out)
    assert {"pca_before", "pca_after"} <= set(after)
    assert seen == [True, True]  # the sample; the test records, once for before and after
    # evaluate scores the written model on them as finetune did, when told where they ran
    code, out, err = cli("evaluate", "--cost-model", str(tmp_path / "t.ttm"), "--test-records",
                         str(tmp_path / "test"), "--measured-here", "--json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["pca"] == pytest.approx(after["pca_after"]) and seen[-1] is True
    # Every argument is judged before the test records are read (and scored): the scoring
    # came first, and a bad --samples was refused only after it.
    seen.clear()
    code, _, err = cli("finetune", "--model", str(tmp_path / "m.ttm"), "--records",
                       str(tmp_path / "db"), "--samples", "1", "--out", str(tmp_path / "u.ttm"),
                       "--test-records", str(tmp_path / "test"))  # fmt: skip
    assert code != 0 and "at least 2 programs" in err and seen == []
    # a test database that is none is refused before the sample is read (and lowered)
    code, _, err = cli("finetune", "--model", str(tmp_path / "m.ttm"), "--records",
                       str(tmp_path / "db"), "--samples", "4", "--out", str(tmp_path / "u.ttm"),
                       "--test-records", str(tmp_path / "nosuch"))  # fmt: skip
    assert code != 0 and "not a MetaSchedule database" in err and seen == []


def test_the_first_k_of_a_metaschedule_database_are_the_first_measured(tmp_path):
    """TVM's reader returns a database's records fastest first; the first K a user asks for
    are the first K lines of its record file, the order they were measured in."""
    import json

    from conftest import fill

    from tensortune.records import open_records
    from tensortune.records.interop import export_records
    from tensortune.train.trainer import records_columns

    with open_records(f"sqlite:///{tmp_path / 'r.db'}") as store:
        fill(store, "matmul:16,16,16", [1e-5, 2e-5, 3e-5, 4e-5, 5e-5])
        export_records(store, tmp_path / "db")
    path = tmp_path / "db" / "database_tuning_record.json"
    lines = path.read_text().splitlines()
    # measured slowest first: the file's order is the reverse of the fastest-first one
    lines.sort(key=lambda line: -sum(json.loads(line)[1][1]))
    path.write_text("\n".join(lines) + "\n")
    columns, _ = records_columns(tmp_path / "db", measured_here=True)
    first = sample_rows(columns, 2)
    assert sorted(np.asarray(columns["cost"], float)[first]) == pytest.approx([4e-5, 5e-5])


def test_a_model_reading_lowered_features_gets_them_from_a_metaschedule_database(tmp_path):
    """MetaSchedule records carry traces, not lowered-loop features: finetune and evaluate
    lower the records' programs for a model that reads them, as ``dataset lower`` does."""
    from conftest import fill

    from tensortune.records import open_records
    from tensortune.records.interop import export_records
    from tensortune.train.finetune import sample_set
    from tensortune.train.trainer import evaluate, records_columns

    with open_records(f"sqlite:///{tmp_path / 'r.db'}") as store:
        fill(store, "matmul:16,16,16", [3e-5, 1e-5, 2e-5, None, 4e-5, 6e-5])
        export_records(store, tmp_path / "db")
    columns, _ = records_columns(tmp_path / "db", measured_here=True, lowered=True)
    ran = np.isfinite(np.asarray(columns["cost"], float))
    assert np.isfinite(columns["lowered"][ran]).all()
    model = model_class("xgb")(n_rounds=5, refine_rounds=2, lowered=1)
    model.fit(sample_set(columns, sample_rows(columns, 5))).save(tmp_path / "m.ttm")
    assert finetune(tmp_path / "m.ttm", tmp_path / "db", samples=5).samples == 5
    assert 0.0 <= evaluate(tmp_path / "m.ttm", test_records=tmp_path / "db")["pca"] <= 1.0
    # where test records ran is said of test records only: a dataset's rows name their machine
    with pytest.raises(TensortuneError, match=r"^measured_here: "):
        evaluate(tmp_path / "m.ttm", dataset="default", measured_here=True)


def _tasks(signs: list[float], seed: int) -> ProgramSet:
    """One task of 20 programs per sign, all on one machine (hardware vector 0)."""
    data = concat_programs([_machine(20, seed + t, sign=s) for t, s in enumerate(signs)])
    data.groups = np.arange(len(data)) // 20
    data.hardware[:] = 0.0
    return data


@pytest.mark.parametrize("teaches", [True, False])
def test_moa_predicts_with_the_adapted_network_only_once_it_ranks_new_batches_better(teaches):
    from tensortune.costmodel.moa import MomentumAdapted

    settings = {"epochs": 40, "chunk": 20, "hidden": 64, "hardware_hidden": 16, "heads": 2}
    pretrained = model_class("hwattn")(**settings).fit(_machine(400, 0, sign=0.0))
    probe = _machine(200, 9, sign=0.0)
    moa = MomentumAdapted(pretrained, momentum=0.5, every=1, epochs=20)
    # Batches that teach: the second feature helps on every task.  Batches that mislead: it
    # helps on one task and hurts on the next, so what one batch teaches the next refutes.
    signs = [4.0] * 8 if teaches else [4.0, -4.0] * 4
    for t, sign in enumerate(signs):
        moa.update(_tasks([sign], seed=20 + t))
    right = moa.right_pairs_
    assert moa.retrains_ == len(signs) and right["pretrained"] > 0
    if teaches:
        assert right["adapted"] > right["pretrained"] and moa.trusted is moa.model
    else:
        assert right["adapted"] <= right["pretrained"] and moa.trusted is moa.pretrained_
        assert np.array_equal(moa.predict(probe), moa.pretrained_.predict(probe))
    ungated = MomentumAdapted(pretrained, every=1, gate=False)
    assert ungated.pretrained_ is None and ungated.trusted is ungated.model


def test_the_hardware_study_holds_out_a_whole_cpu(monkeypatch):
    """A machine held out is every configuration of its CPU: none of them trains the arms
    said to come from other machines.  Arguments are checked before anything is fitted."""
    from tensortune.compare import hardware
    from tensortune.train.trainer import dataset_columns

    seen = []
    monkeypatch.setattr(hardware._Run, "arms", lambda self, target, other, *_: seen.append(
        (target, other)))  # fmt: skip
    columns, _ = dataset_columns("default")
    names = np.asarray(columns["hardware"]).astype(str)
    same = next(h for h in set(names) if h.startswith("avx2-1c@"))
    cpu = same.split("@")[1]
    assert len({h for h in names if h.endswith("@" + cpu)}) > 1  # other configurations
    hardware.hardware_study("default", hardware=same, folds=[["gpt2-block"]], models=["xgb"],
                            ks=[16], seeds=[0])  # fmt: skip
    target, other = seen[0]
    assert set(names[target]) == {same}
    assert other.any() and not any(h.endswith("@" + cpu) for h in names[other])
    with pytest.raises(TensortuneError, match="names a configuration of"):
        hardware.hardware_study("default", hardware="avx512-2c", folds=[["gpt2-block"]])
    for bad in ({"seeds": []}, {"ks": [1]}, {"folds": []}, {"models": ["ms-xgb"]}):
        args = {"hardware": same, "folds": [["gpt2-block"]], "models": ["xgb"]} | bad
        with pytest.raises(TensortuneError) as e:
            hardware.hardware_study("default", **args)
        assert e.value.param == next(iter(bad))  # refused for the argument, not for the data
    assert len(seen) == 1


def test_a_model_that_can_only_be_refitted_is_not_fine_tuned():
    """MetaSchedule's XGBoost has no refinement: "fine-tuned" it would be a new model of the
    sample alone, which the validation could pick without saying so."""
    model = model_class("ms-xgb")().fit(_machine(40, 0, sign=1.0))
    with pytest.raises(TensortuneError, match="ms-xgb model cannot be fine-tuned"):
        adapt(model, _machine(20, 1, sign=-1.0))


def test_a_metaschedule_database_without_records_is_named_in_the_error(tmp_path):
    from conftest import fill

    from tensortune.records import open_records
    from tensortune.records.interop import export_records
    from tensortune.train.trainer import records_columns

    with open_records(f"sqlite:///{tmp_path / 'r.db'}") as store:
        fill(store, "matmul:16,16,16", [1e-5, 2e-5])
        export_records(store, tmp_path / "db")
    (tmp_path / "db" / "database_tuning_record.json").write_text("")
    with pytest.raises(TensortuneError, match=f"{tmp_path / 'db'} holds no tuning records"):
        records_columns(tmp_path / "db")


def test_records_that_make_no_dataset_are_named_not_a_temporary_directory(tmp_path):
    from conftest import fill

    from tensortune.records import open_records
    from tensortune.records.interop import export_records
    from tensortune.train.trainer import records_columns

    with open_records(f"sqlite:///{tmp_path / 'r.db'}") as store:
        fill(store, "matmul:16,16,16", [1e-5, 2e-5])
        export_records(store, tmp_path / "db")
    path = tmp_path / "db" / "database_tuning_record.json"
    lines = []
    for line in path.read_text().splitlines():
        workload, (_trace, *rest) = json.loads(line)
        lines.append(json.dumps([workload, [[[], []], *rest]]))  # no instruction, no decision
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TensortuneError) as e:
        records_columns(tmp_path / "db")
    assert str(tmp_path / "db") in e.value.message and "no usable dataset" in e.value.message
    assert "/tmp" not in e.value.message.replace(str(tmp_path), "")  # no temporary directory
    assert e.value.param is None  # the caller says which option named the records
