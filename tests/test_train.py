"""train / evaluate: splits, TenSet metrics, model files, and records measured elsewhere."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tensortune.costmodel.registry import load_cost_model
from tensortune.datasets.build import build_dataset, read_card
from tensortune.datasets.shipped import DATASET_DIR
from tensortune.errors import TensortuneError
from tensortune.records import open_records
from tensortune.records.interop import export_records
from tensortune.train.metrics import METRIC_KEYS
from tensortune.train.trainer import evaluate, train
from tensortune.tuning.tune import tune

TARGET = {"kind": "llvm", "num-cores": 2}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    url = f"sqlite:///{root / 'r.db'}"
    tune(["matmul:32,32,32", "matmul:16,64,32", "softmax:8,64"], trials=30, records=url,
         work_dir=root / "w", trials_per_round=5, strategy="replay-trace", cost_model="random",
         target=TARGET, check_correctness=False)  # fmt: skip
    build_dataset(url, root / "d")
    return root, url


def test_train_reports_every_metric_and_evaluate_reproduces_it(built):
    root, _ = built
    result = train(root / "d", cost_model="xgb", split="within-task", out=root / "m.ttm",
                   params={"n_rounds": 30})  # fmt: skip
    assert set(METRIC_KEYS) <= set(result.metrics)
    # Tasks of 10 programs leave one each to the test: no pair, so no PCA (not 0.5).
    assert math.isnan(result.metrics["pca"])
    assert 0.0 < result.metrics["top1_score"] <= 1.0
    assert result.train_programs + result.test_programs == 30
    again = evaluate(root / "m.ttm", dataset=root / "d")  # the split comes from the file
    assert again == pytest.approx(result.metrics, nan_ok=True)


def test_evaluate_says_when_the_model_was_trained_on_another_dataset(built, tmp_path):
    """The split the model file names, applied to another dataset (another version), is
    another set of test rows: programs the model trained on may be scored as unseen."""
    import warnings

    root, _ = built
    result = train(root / "d", cost_model="xgb", split="by-task", out=tmp_path / "m.ttm",
                   params={"n_rounds": 10})  # fmt: skip
    model = load_cost_model(tmp_path / "m.ttm")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its own dataset: nothing to say
        assert evaluate(model, dataset=root / "d") == pytest.approx(result.metrics, nan_ok=True)
    model.provenance_ = {**model.provenance_, "dataset": "ttset-cpu-v1"}
    with pytest.warns(UserWarning, match="trained on ttset-cpu-v1, not on .*: programs both"):
        evaluate(model, dataset=root / "d")
    from tensortune.train.trainer import other_dataset

    v1, v6 = {"dataset": "ttset-cpu-v1"}, {"name": "ttset-cpu-v6"}
    for split in ("by-network:resnet18", "by-hardware:avx2-1c@eab22ab1"):  # rows by name
        assert other_dataset(v1, v6, split) is None
    assert other_dataset(v1, v6, "by-task") and other_dataset(v1, v6, "within-task")
    assert other_dataset({}, v6, "by-task") is None and other_dataset(v1, {}, "by-task") is None


def test_by_task_keeps_whole_tasks_apart(built):
    root, _ = built
    result = train(root / "d", cost_model="lgbm", split="by-task", params={"n_rounds": 20})
    assert result.metrics["tasks"] >= 1 and result.test_programs % 10 == 0
    assert 0.0 <= result.metrics["pca"] <= 1.0  # whole tasks: every pair of each counts


def test_records_measured_elsewhere_can_be_the_test_set(built, tmp_path):
    root, url = built
    train(root / "d", cost_model="xgb", split="within-task", out=tmp_path / "m.ttm",
          params={"n_rounds": 20})  # fmt: skip
    with open_records(url) as store:
        export_records(store, tmp_path / "msdb")
    scores = evaluate(tmp_path / "m.ttm", test_records=tmp_path / "msdb")
    assert scores["programs"] == 30 and scores["tasks"] == 3


def test_bad_requests_are_explained(built, tmp_path):
    root, _ = built
    with pytest.raises(TensortuneError, match="unknown split 'sideways'"):
        train(root / "d", split="sideways")
    with pytest.raises(TensortuneError, match="unknown network"):
        train(root / "d", split="by-network:nope")
    with pytest.raises(TensortuneError, match="unknown cost model 'svm'"):
        train(root / "d", cost_model="svm")
    with pytest.raises(TensortuneError, match="not a tensortune dataset"):
        train(tmp_path, cost_model="xgb")


def test_cli_train_and_evaluate_json(built, tmp_path, cli):
    root, _ = built

    def ok(*args: str) -> dict:
        code, out, err = cli(*args)
        assert code == 0, err
        return json.loads(out)

    trained = ok("train", "--dataset", str(root / "d"), "--cost-model", "xgb", "--out",
                 str(tmp_path / "m.ttm"), "--json")  # fmt: skip
    scores = ok("evaluate", "--cost-model", str(tmp_path / "m.ttm"), "--dataset",
                str(root / "d"), "--json")  # fmt: skip
    for key in ("pca", "top1_score", "top5_score", "a_peak@1", "a_peak@5", "r2"):
        assert scores[key] == pytest.approx(trained[key])
    # Model settings from the command line (the model by its old option name, --model): a
    # two-member network, and a setting it lacks.
    ok("train", "--dataset", str(root / "d"), "--model", "mlp", "--param", "members=2",
       "--param", "epochs=1", "--out", str(tmp_path / "e.ttm"), "--json")  # fmt: skip
    ensemble = load_cost_model(tmp_path / "e.ttm")
    assert (ensemble.members, ensemble.epochs, len(ensemble.net_)) == (2, 1, 2)
    code, _, err = cli("train", "--dataset", str(root / "d"), "--model", "mlp", "--param",
                       "width=3")  # fmt: skip
    assert code == 2 and "Traceback" not in err, err
    assert err.strip().splitlines() == [err.strip()]
    assert "mlp has no setting 'width'" in err


def test_tuning_with_a_pretrained_model_frozen_and_online(built, tmp_path):
    from tensortune.costmodel.ms_adapter import LearnedCostModel

    root, _ = built
    train(root / "d", cost_model="xgb", split="within-task", out=tmp_path / "m.ttm",
          params={"n_rounds": 20, "refine_rounds": 5})  # fmt: skip
    url = f"sqlite:///{tmp_path / 't.db'}"
    for online in (False, True):
        result = tune(["matmul:16,32,32"], trials=4 if not online else 8, records=url,
                      work_dir=tmp_path / "w", trials_per_round=4, target=TARGET,
                      cost_model=str(tmp_path / "m.ttm"), online_cost_model=online,
                      check_correctness=False)  # fmt: skip
        assert result.tasks[0].trials == (4 if not online else 8)
    adapter = LearnedCostModel(str(tmp_path / "m.ttm"), TARGET, online=True)
    assert adapter.model.provenance_["split"] == "within-task"


def test_a_model_of_lowered_loops_trains_on_a_lowered_dataset_and_tunes(built, tmp_path, cli):
    import shutil

    import numpy as np
    import pyarrow.parquet as pq

    from tensortune.datasets.lowered import LOWERED_FILE, lower_dataset, read_lowered
    from tensortune.features.lowered import LOWERED_WIDTH

    root, _ = built
    d = tmp_path / "d"
    shutil.copytree(root / "d", d)
    settings = {"n_rounds": 20, "refine_rounds": 5, "lowered": 1}
    with pytest.raises(TensortuneError, match="tensortune dataset lower"):
        train(d, cost_model="xgb", split="by-task", params=settings)
    code, out, err = cli("dataset", "lower", "--dataset", str(d), "--workers", "1", "--json")
    assert code == 0, err
    report = json.loads(out)
    ids = pq.read_table(d / "programs.parquet", columns=["program_id"]).column(0).to_pylist()
    assert report["programs"] == len(ids) and report["lowered_now"] > 0
    lowered = read_lowered(d, ids)
    assert lowered.shape == (len(ids), LOWERED_WIDTH) and np.isfinite(lowered).all()
    assert lower_dataset(d, workers=1)["lowered_now"] == 0  # all there: nothing recomputed
    result = train(d, cost_model="xgb", split="by-task", out=tmp_path / "m.ttm", params=settings)
    assert 0 <= result.metrics["pca"] <= 1
    out = tune(["matmul:16,32,32"], trials=4, records=f"sqlite:///{tmp_path / 't.db'}",
               work_dir=tmp_path / "w", trials_per_round=4, target=TARGET,
               cost_model=str(tmp_path / "m.ttm"), check_correctness=False)  # fmt: skip
    assert out.tasks[0].trials == 4
    (d / LOWERED_FILE).write_bytes(b"PAR1 broken")
    with pytest.raises(TensortuneError, match="not a readable Parquet table"):
        read_lowered(d, ids)
    assert lower_dataset(d, workers=1)["lowered_now"] > 0  # derived data: computed again
    assert np.array_equal(read_lowered(d, ids), lowered)


def test_default_model_is_refused_when_none_is_shipped_for_the_target(tmp_path):
    with pytest.raises(TensortuneError, match="no pre-trained cost model is shipped"):
        tune(["matmul:8,8,8"], trials=2, records=f"sqlite:///{tmp_path / 'r.db'}",
             work_dir=tmp_path / "w", target={"kind": "llvm", "num-cores": 3},
             cost_model="default")  # fmt: skip


def test_evaluate_draws_its_plot(built, tmp_path):
    root, _ = built
    train(root / "d", cost_model="lgbm", split="by-task", out=tmp_path / "m.ttm",
          params={"n_rounds": 10})  # fmt: skip
    evaluate(tmp_path / "m.ttm", dataset=root / "d", plot=tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_shipped_models_load_and_serve_the_nearest_configuration():
    from conftest import platform

    from tensortune.costmodel.registry import load_cost_model
    from tensortune.costmodel.shipped import shipped_model
    from tensortune.hardware import config_of, nearest_config

    def shipped(mcpu: str, cores: int) -> str:
        return shipped_model(platform({"kind": "llvm", "mcpu": mcpu, "num-cores": cores}))

    assert shipped("haswell", 1).endswith("avx2-1c.ttm")
    near = shipped("icelake-server", 2)
    assert near.endswith("avx512-2c.ttm")
    # avx512-1c is a configuration of ours with no shipped model: the nearest shipped one serves
    assert shipped("skylake-avx512", 1).endswith("avx512-2c.ttm")
    # AVX-512 turned off (a guest's default target when it hides it): AVX2 code, AVX2's model
    off = ["-avx512f", "-avx512bw", "-avx512cd", "-avx512dq", "-avx512vl"]
    hidden = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2, "mattr": off}
    assert config_of(hidden) is None and nearest_config(hidden) == "avx2-2c"
    assert config_of({"kind": "llvm", "mcpu": "haswell", "num-cores": 1, "mattr": []}) == "avx2-1c"
    assert shipped_model(platform(hidden)).endswith("avx2-1c.ttm")
    model = load_cost_model(near)
    assert model.fitted and model.provenance_["train_programs"] > 1000


def test_moa_starts_from_the_shipped_model_of_the_most_other_configurations():
    from conftest import platform

    from tensortune.costmodel.registry import load_cost_model
    from tensortune.costmodel.shipped import shipped_source

    def source(mcpu: str, cores: int) -> str:
        return Path(
            shipped_source(platform({"kind": "llvm", "mcpu": mcpu, "num-cores": cores}))
        ).name

    assert source("skylake-avx512", 2) == "avx2-1c+avx512-1c.ttm"
    assert source("haswell", 1) == "avx512-2c.ttm"  # the two-configuration model knows avx2-1c
    assert source("skylake-avx512", 1) == "avx512-2c.ttm"  # a tie goes to the nearest config
    model = load_cost_model(shipped_source(platform({"kind": "llvm", "mcpu": "skylake-avx512",
                                                     "num-cores": 2})))  # fmt: skip
    card = read_card(DATASET_DIR).data
    assert model.provenance_["dataset"] == card["name"]
    held = model.provenance_["split"].removeprefix("by-hardware:").split(",")
    # it never saw the target's configuration, on any machine of the dataset
    assert sorted(held) == sorted(h for h in card["hardware"] if h.startswith("avx512-2c@"))


def test_a_network_held_out_is_the_one_its_top_k_scores_are_of():
    """bert-base shares kernels with gpt2-block: holding bert-base out, gpt2-block is not a
    network of the test rows, only of some of their kernels, and is not scored."""
    import numpy as np

    from tensortune import features as F
    from tensortune.costmodel.data import ProgramSet
    from tensortune.costmodel.registry import new_model
    from tensortune.train import metrics
    from tensortune.train.trainer import (
        card_networks,
        dataset_columns,
        score_model,
        scored_rows,
        split_masks,
        split_networks,
    )

    columns, card = dataset_columns("default")
    train_rows, test = split_masks(columns, "by-network:bert-base")
    weights = card_networks(card)
    present = set(np.asarray(columns["task_id"])[test].tolist())
    assert present & set(weights["gpt2-block"])  # a shared kernel: the case under test
    some = np.flatnonzero(train_rows)[:400]
    model = new_model("xgb", 0, {"n_rounds": 20, "threads": 1})
    model.fit(ProgramSet.from_columns(columns, some))
    scores, _ = score_model(model, columns, test, card, held_out=["bert-base"])
    pred = model.predict(ProgramSet.from_columns(columns, test))
    alone = metrics.score_predictions(scored_rows(columns, test), pred,
                                      networks={"bert-base": weights["bert-base"]})  # fmt: skip
    assert scores["top1_score"] == alone["top1_score"]
    assert scores["top5_score"] == alone["top5_score"]
    assert split_networks("by-network:bert-base") == ["bert-base"]
    # A program without tokens (or blocks) is an empty list in the table, not a (0, ?) mystery.
    tokenless = {**columns, "trace_tokens": [[] for _ in columns["trace_tokens"]]}
    bare = ProgramSet.from_columns(tokenless, some[:5])
    assert [t.shape for t in bare.tokens] == [(0, F.TOKEN_WIDTH)] * 5
    featureless = {**columns, "per_store": [None] * len(columns["per_store"])}
    with pytest.raises(TensortuneError, match="no test rows with features"):
        score_model(model, featureless, test, card)
    # evaluate scores a model on its split as train did
    from tensortune.train.trainer import evaluate

    scored = evaluate(model, dataset="default", split="by-network:bert-base")
    assert scored["top1_score"] == alone["top1_score"]
    assert split_networks("by-task:1") is None
