"""bench splits: the same model under every split kind of a dataset."""

from __future__ import annotations

import numpy as np
import pytest

from tensortune.compare.splits import measurement_ceiling, split_study
from tensortune.errors import TensortuneError
from tensortune.train.trainer import dataset_columns, split_masks


def test_every_split_kind_has_its_folds_and_by_network_is_the_reference():
    # A smaller shipped dataset (half the rows, 5 networks, 3 hardware of 2 CPUs): what is
    # checked is the folds of each kind, not the figures.
    dataset = "ttset-cpu-v2"
    result = split_study(dataset, models=["xgb"], seeds=[0], params={"xgb": {"n_rounds": 2}})
    columns, card = dataset_columns(dataset)
    folds = {e["split"]: e["folds"] for e in result.summary()}
    machines = {h.split("@")[1] for h in columns["hardware"]}  # a fold per machine
    assert len(machines) >= 2 and len(card["networks"]) >= 2  # folds to hold out, each kind
    assert folds == {"within-task": 1, "by-task": 1, "by-network": len(card["networks"]),
                     "by-hardware": len(machines)}  # fmt: skip
    for e in result.summary():
        assert 0 <= e["pca"] <= 1 and 0 <= e["top1_score"] <= 1
    by_network = next(e for e in result.summary() if e["split"] == "by-network")
    others = [e for e in result.summary() if e["split"] != "by-network"]
    assert others  # every other split's PCA is told against by-network's
    for e in [by_network, *others]:
        assert e["pca_over_by_network"] == pytest.approx(e["pca"] - by_network["pca"])
    with pytest.raises(TensortuneError, match="unknown split sideways"):
        split_study("default", splits=["sideways"])


def test_a_split_the_dataset_cannot_make_is_left_out_before_any_fit() -> None:
    # ttset-cpu-v1 holds one CPU's data: its by-hardware fold trains on nothing.  The study
    # failed after every other fold had been fitted, and printed none of them.
    fits = []
    result = split_study(
        "ttset-cpu-v1",
        splits=["by-task", "by-hardware"],
        models=["xgb"],
        seeds=[0],
        params={"xgb": {"n_rounds": 2}},
        progress=fits.append,
    )
    assert [e["split"] for e in result.summary()] == ["by-task"]
    assert "empty train set" in result.setup["skipped"]["by-hardware"]
    assert fits[0].startswith("by-hardware: left out")  # said before the first fit
    with pytest.raises(TensortuneError, match=r"^splits: this dataset makes none"):
        split_study("ttset-cpu-v1", splits=["by-hardware"], models=["xgb"], seeds=[0])


def test_by_task_takes_a_seed():
    columns, _ = dataset_columns("default")
    _, a = split_masks(columns, "by-task")
    _, b = split_masks(columns, "by-task:0")
    _, c = split_masks(columns, "by-task:1")
    assert (a == b).all() and (a != c).any()
    with pytest.raises(TensortuneError, match="unknown split"):
        split_masks(columns, "by-task:x")
    with pytest.raises(TensortuneError, match="unknown split 'within-task:5'"):
        split_masks(columns, "within-task:5")  # takes nothing: not ignored


def _timed(repeats: list[list[float]], task: list[int]) -> dict:
    n = len(repeats)
    return {"run_secs": repeats, "status": ["ok"] * n, "task_id": task, "hardware": ["h"] * n}


def test_the_measurement_ceiling_is_how_well_one_repeat_ranks_the_others():
    rng = np.random.default_rng(0)
    true = rng.uniform(1e-3, 2e-3, 200)
    task = [i % 4 for i in range(200)]
    agreeing = _timed([[t, t * 1.001, t * 0.999] for t in true], task)
    assert measurement_ceiling(agreeing, {})["pca"] == 1.0
    # a first repeat unrelated to the others ranks them like a coin
    noisy = _timed([[f, t, t] for f, t in zip(rng.permutation(true), true, strict=True)], task)
    assert 0.4 < measurement_ceiling(noisy, {})["pca"] < 0.6
    assert measurement_ceiling(_timed([[t] for t in true], task), {}) is None


def test_a_split_study_reports_the_ceiling_of_its_dataset():
    result = split_study("default", splits=["by-task"], models=["xgb"], seeds=[0],
                         params={"xgb": {"n_rounds": 5}})  # fmt: skip
    ceiling = result.setup["measurement_ceiling"]
    assert ceiling["programs"] > 0 and 0.5 < ceiling["pca"] <= 1


def test_a_study_runs_each_seed_and_name_once():
    """A seed or name given twice would run twice and be counted as two seeds."""
    from tensortune.compare.summary import study_args
    from tensortune.errors import TensortuneError

    assert study_args([0, 1, 0], models=["xgb", "xgb", "mlp"]) == ([0, 1], ["xgb", "mlp"])
    with pytest.raises(TensortuneError, match="seeds"):
        study_args([], models=["xgb"])
    with pytest.raises(TensortuneError, match="at least one of models"):
        study_args([0], models=[])


def test_the_by_hardware_folds_hold_out_a_machine_with_all_its_configurations():
    """Two configurations of one CPU (``config@fingerprint``) are one machine: a fold holds
    out both, so no model is scored on a machine it trained on."""
    from tensortune.compare.splits import split_specs
    from tensortune.train.trainer import split_masks

    hw = ["avx2-1c@aa", "avx512-2c@aa", "avx512-2c@bb", "avx512-2c@aa", "x86"]
    columns = {"hardware": hw}
    specs = split_specs(columns, {}, "by-hardware", 0)
    assert specs == [
        ("avx2-1c@aa+avx512-2c@aa", "by-hardware:avx2-1c@aa,avx512-2c@aa"),
        ("avx512-2c@bb", "by-hardware:avx512-2c@bb"),
        ("x86", "by-hardware:x86"),
    ]
    train, test = split_masks(columns, specs[0][1])
    assert test.tolist() == [True, True, False, True, False]
    assert train.tolist() == [False, False, True, False, True]


def test_a_studys_spread_is_the_sample_standard_deviation_of_the_runs_that_scored():
    """Three seeds: the sample sd (n - 1), not the population's, which understated it by 18%;
    a run whose metric is undefined counts in no figure of that metric."""
    import statistics

    from tensortune.compare.summary import mean_and_sd

    rows = [{"arm": "a", "pca": v} for v in (0.80, 0.85, 0.90, float("nan"))]
    rows.append({"arm": "b", "pca": 0.7})
    a, b = mean_and_sd(rows, ("arm",), ("pca",))
    assert a["pca"] == pytest.approx(0.85)
    assert a["pca_std"] == pytest.approx(statistics.stdev([0.80, 0.85, 0.90]))
    assert np.isnan(b["pca_std"])  # one run has no spread to speak of


def test_seeds_that_gave_the_same_figures_count_once_in_the_spread():
    """Trees without subsampling ignore their seed: on a fold the seed does not draw, three
    seeds give one result three times, which shrank the spread of the folds' results."""
    import statistics

    from tensortune.compare.summary import mean_and_sd

    rows = [{"split": "by-network", "fold": f, "seed": s, "pca": v}
            for f, v in (("resnet", 0.7), ("bert", 0.9)) for s in range(3)]  # fmt: skip
    rows += [{"split": "by-task", "fold": f"seed {s}", "seed": s, "pca": 0.8} for s in range(3)]
    net, task = mean_and_sd(rows, ("split",), ("pca",))
    assert (net["runs"], net["distinct"]) == (6, 2) and net["pca"] == pytest.approx(0.8)
    assert net["pca_std"] == pytest.approx(statistics.stdev([0.7, 0.9]))
    assert (task["runs"], task["distinct"]) == (3, 3)  # other folds: three results, however alike
    # one fold's seeds agree and another's do not: every run counts, the folds weigh alike
    rows[0]["pca"] = 0.75
    net, _ = mean_and_sd(rows, ("split",), ("pca",))
    assert (net["runs"], net["distinct"]) == (6, 6)
    assert net["pca"] == pytest.approx((0.75 + 0.7 * 2 + 0.9 * 3) / 6)


def test_a_study_killed_midway_resumes_from_its_checkpoint(tmp_path, monkeypatch) -> None:
    import tensortune.compare.splits as splits

    path = tmp_path / "splits.json"
    fast = {"xgb": {"n_rounds": 2}}
    make, fits = splits.new_model, []

    def killed_at_the_third_fit(*args, **kwargs):
        fits.append(args)
        if len(fits) == 3:
            raise KeyboardInterrupt
        return make(*args, **kwargs)

    monkeypatch.setattr(splits, "new_model", killed_at_the_third_fit)
    with pytest.raises(KeyboardInterrupt):
        split_study("ttset-cpu-v2", splits=["by-network"], models=["xgb"], seeds=[0],
                    params=fast, checkpoint=path)  # fmt: skip
    fits.clear()
    monkeypatch.setattr(splits, "new_model", lambda *a, **k: fits.append(a) or make(*a, **k))
    resumed = split_study("ttset-cpu-v2", splits=["by-network"], models=["xgb"], seeds=[0],
                          params=fast, checkpoint=path)  # fmt: skip
    folds = len(resumed.rows)
    assert folds >= 3 and len(fits) == folds - 2  # the two finished folds were not fitted again
    whole = split_study("ttset-cpu-v2", splits=["by-network"], models=["xgb"], seeds=[0],
                        params=fast)  # fmt: skip
    assert resumed.rows == whole.rows  # a resumed study is the study
    # Other settings: the file is another study's, kept aside, not read.
    fits.clear()
    with pytest.warns(UserWarning, match="splits.json holds another study's rows"):
        split_study("ttset-cpu-v2", splits=["by-network"], models=["xgb"], seeds=[0],
                    params={"xgb": {"n_rounds": 3}}, checkpoint=path)  # fmt: skip
    assert len(fits) == folds and (tmp_path / "replaced-1" / "splits.json").is_file()


def test_a_checkpoint_of_other_features_is_set_aside(tmp_path) -> None:
    # Features computed anew (``dataset lower`` after its version changed) with the same
    # table: rows fitted on the old ones must not be read as the new ones'.
    import shutil

    from tensortune.datasets.shipped import dataset_path

    data = tmp_path / "ds"
    shutil.copytree(dataset_path("ttset-cpu-v2"), data)
    args = {"splits": ["by-task"], "models": ["xgb"], "seeds": [0],
            "params": {"xgb": {"n_rounds": 2}}, "checkpoint": tmp_path / "c.json"}  # fmt: skip
    split_study(data, **args)
    split_study(data, **args)  # the same: read, nothing set aside
    assert not (tmp_path / "replaced-1").exists()
    # (another dataset's file stands in for features computed anew: any change of the file
    # sets the checkpoint aside, whether or not the models read it)
    shutil.copy(dataset_path("ttset-cpu-v6") / "lowered.parquet", data / "lowered.parquet")
    with pytest.warns(UserWarning, match="c.json holds another study's rows"):
        split_study(data, **args)


@pytest.mark.parametrize("name", ["splits", "al", "prune", "hardware"])
def test_every_study_refuses_a_checkpoint_it_cannot_write_before_reading_the_dataset(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensortune.compare.active_learning import study
    from tensortune.compare.hardware import hardware_study
    from tensortune.compare.pruning import prune_study
    from tensortune.train import trainer

    def read(*_args, **_kwargs):
        raise AssertionError("the dataset was read first")

    monkeypatch.setattr(trainer, "dataset_columns", read)
    run = {
        "splits": lambda **kw: split_study("default", **kw),
        "al": lambda **kw: study("default", held_out=["gpt2-block"], **kw),
        "prune": lambda **kw: prune_study("default", held_out=["gpt2-block"], **kw),
        "hardware": lambda **kw: hardware_study(
            "default", hardware="avx2-1c", folds=[["gpt2-block"]], **kw
        ),
    }[name]
    with pytest.raises(TensortuneError, match="no directory") as e:
        run(checkpoint="/nonexistent/study.json")
    assert e.value.param == "checkpoint"
