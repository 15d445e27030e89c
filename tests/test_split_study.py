"""bench splits: the same model under every split kind of a dataset."""

from __future__ import annotations

import pytest

from tensortune.compare.splits import split_study
from tensortune.errors import TensortuneError
from tensortune.train.trainer import dataset_columns, split_masks


def test_every_split_kind_has_its_folds_and_by_network_is_the_reference():
    result = split_study("default", models=["xgb"], seeds=[0], params={"xgb": {"n_rounds": 5}})
    columns, card = dataset_columns("default")
    folds = {e["split"]: e["folds"] for e in result.summary()}
    assert folds == {"within-task": 1, "by-task": 1, "by-network": len(card["networks"]),
                     "by-hardware": len(set(columns["hardware"]))}  # fmt: skip
    for e in result.summary():
        assert 0 <= e["pca"] <= 1 and 0 <= e["top1_score"] <= 1
    by_network = next(e for e in result.summary() if e["split"] == "by-network")
    assert by_network["pca_over_by_network"] == 0
    with pytest.raises(TensortuneError, match="unknown split sideways"):
        split_study("default", splits=["sideways"])


def test_by_task_takes_a_seed():
    columns, _ = dataset_columns("default")
    _, a = split_masks(columns, "by-task")
    _, b = split_masks(columns, "by-task:0")
    _, c = split_masks(columns, "by-task:1")
    assert (a == b).all() and (a != c).any()
    with pytest.raises(TensortuneError, match="unknown split"):
        split_masks(columns, "by-task:x")
