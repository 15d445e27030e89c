"""One conformance test for every cost model: it learns a ranking, round-trips through its file,
keeps its settings, and refuses what it cannot use."""

from __future__ import annotations

import copy
import dataclasses
import json
import zipfile

import numpy as np
import pytest

from tensortune import features as F
from tensortune.costmodel.data import ProgramSet
from tensortune.costmodel.registry import load_cost_model, model_class, model_kinds
from tensortune.errors import TensortuneError
from tensortune.features.lowered import LOWERED_WIDTH

FAST = {
    "xgb": {"n_rounds": 60},
    "lgbm": {"n_rounds": 60},
    "mlp": {"epochs": 40, "chunk": 16},
    "tlp": {"epochs": 50, "chunk": 16, "hidden": 32, "heads": 2, "lr": 3e-3},
    "pacm": {"epochs": 40, "chunk": 16, "pattern_hidden": 32, "heads": 2},
    "hwattn": {"epochs": 40, "chunk": 16, "hidden": 64, "hardware_hidden": 16, "heads": 2},
}


def synthetic(n: int, seed: int) -> ProgramSet:
    """Programs whose speed is a known function of two features, in 4 tasks."""
    rng = np.random.default_rng(seed)
    per_store, tokens, speed = [], [], []
    lowered = rng.uniform(size=(n, LOWERED_WIDTH)).astype(np.float32)
    for i in range(n):
        blocks = rng.uniform(0, 5, size=(rng.integers(1, 4), F.PER_STORE_WIDTH)).astype(np.float32)
        per_store.append(blocks)
        toks = rng.uniform(0, 1, size=(rng.integers(3, 9), F.TOKEN_WIDTH)).astype(np.float32)
        # The same two quantities are visible to trace-based models, in the first token.
        toks[0, -2:] = blocks[:, 3].sum(), blocks[:, 7].sum()
        tokens.append(toks)
        lowered[i, :2] = blocks[:, 3].sum(), blocks[:, 7].sum()  # and to lowered-loop readers
        speed.append(blocks[:, 3].sum() - 0.5 * blocks[:, 7].sum())
    groups = rng.integers(0, 4, size=n)
    speed = np.asarray(speed)
    labels = np.zeros(n)
    for g in range(4):
        s = np.exp(speed[groups == g] / 3)
        labels[groups == g] = s / s.max()
    return ProgramSet(per_store, tokens, rng.uniform(size=(n, F.WORKLOAD_WIDTH)).astype(np.float32),
                      np.ones((n, F.HARDWARE_WIDTH), np.float32), groups, labels,
                      lowered)  # fmt: skip


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


@pytest.fixture(scope="module")
def train():
    return synthetic(240, seed=1)


@pytest.fixture(scope="module")
def test():
    # 100 programs a task: random scores give a Spearman of 0 ± 0.1 on each.
    return synthetic(400, seed=2)


# Every kind with its fast settings, and a neural model as an ensemble of members.
CASES = {k: (k, FAST.get(k, {})) for k in model_kinds()}
CASES["mlp-members"] = ("mlp", {**FAST["mlp"], "members": 2})
CASES["xgb-lowered"] = ("xgb", {**FAST["xgb"], "lowered": 1})
CASES["lgbm-lowered"] = ("lgbm", {**FAST["lgbm"], "lowered": 1})
CASES["pacm-lowered"] = ("pacm", {**FAST["pacm"], "lowered": 1})


@pytest.fixture(scope="module", params=list(CASES))
def fitted(request, train):
    kind, settings = CASES[request.param]
    return model_class(kind)(**settings).fit(train)


def test_every_model_learns_the_ranking(fitted, test):
    pred = fitted.predict(test)
    assert pred.shape == (len(test),) and np.all(np.isfinite(pred))
    per_task = [_spearman(pred[test.groups == g], test.labels[test.groups == g]) for g in range(4)]
    # Above 0.4 on every one of the 4 tasks: four standard deviations of a random scorer, each.
    assert min(per_task) > 0.4, (fitted.kind, per_task)


def test_every_model_round_trips_through_its_file(fitted, test, tmp_path):
    path = tmp_path / f"model.{fitted.kind}"
    fitted.save(path)
    again = load_cost_model(path)
    assert type(again) is type(fitted) and again.get_params() == fitted.get_params()
    assert np.allclose(again.predict(test), fitted.predict(test))
    # Settings given as numpy numbers (a seed drawn from a generator) or True for an integer:
    # the file holds them as the types loading demands.
    model = copy.deepcopy(fitted)
    ints = {k: v for k, v in model.get_params().items() if type(v) is int}
    model.set_params(**{k: np.int64(v) for k, v in ints.items()})
    if "lowered" in ints and not ints["lowered"]:
        model.lowered = False
    model.save(path)
    assert load_cost_model(path).get_params() == fitted.get_params()


def test_settings_live_in_init_and_learned_state_in_trailing_underscores(fitted):
    clone = type(fitted)(**fitted.get_params())
    assert clone.get_params() == fitted.get_params()
    assert not clone.fitted and fitted.fitted
    assert all(not k.endswith("_") for k in vars(clone))


def test_settings_change_as_in_scikit_learn(fitted):
    clone = type(fitted)(**fitted.get_params(deep=True))
    name, value = next(iter(clone.get_params().items()))
    assert clone.set_params(**{name: value}) is clone
    with pytest.raises(TensortuneError, match="no setting 'nosuch'"):
        clone.set_params(nosuch=1)


def test_every_model_refuses_data_it_cannot_learn_from(fitted, train, tmp_path):
    cls = type(fitted)
    with pytest.raises(TensortuneError, match="not been fitted"):
        cls(**fitted.get_params()).save(tmp_path / "x")
    with pytest.raises(TensortuneError, match="not been fitted"):
        cls(**fitted.get_params()).predict(train)
    unlabeled = ProgramSet(train.per_store, train.tokens, train.workload, train.hardware,
                           train.groups, None)  # fmt: skip
    with pytest.raises(TensortuneError, match="no labels"):
        cls(**fitted.get_params()).fit(unlabeled)
    failed = ProgramSet(train.per_store, train.tokens, train.workload, train.hardware,
                        train.groups, np.zeros(len(train)))  # fmt: skip
    with pytest.raises(TensortuneError, match="no successful"):
        cls(**fitted.get_params()).fit(failed)


def test_every_model_learns_where_most_tasks_only_failed(fitted, train):
    """Online, a round of timeouts is a task of failures: training steps that hold only
    those have no order to learn and are passed over, not refused."""
    labels = np.where(train.groups == 0, train.labels, 0.0)
    mostly_failed = ProgramSet(train.per_store, train.tokens, train.workload, train.hardware,
                               train.groups, labels, train.lowered)  # fmt: skip
    model = type(fitted)(**fitted.get_params()).fit(mostly_failed)
    assert np.all(np.isfinite(model.predict(train)))
    # It learned the task of successes: its failures, whole tasks of them, are no order.
    ran = train.groups == 0
    assert _spearman(model.predict(train)[ran], train.labels[ran]) > 0.4, fitted.kind


def test_update_adds_new_measurements(fitted, train, test):
    # What is tested is what an update keeps, not how well it learns: the shortest training.
    params = fitted.get_params()
    model = type(fitted)(**{**params, **{k: 2 for k in ("epochs", "n_rounds") if k in params}})
    model.update(train.subset(np.arange(120)))
    model.update(train.subset(np.arange(120, 240)))
    assert len(model.seen_) == len(train)
    assert np.all(np.isfinite(model.predict(test)))


def test_every_model_learns_from_a_handful_of_programs(fitted, test):
    """A few-shot fine-tuning or a search's first batch: a dozen programs, fitted anew or
    added to what a fitted model knows."""
    few = synthetic(12, seed=11)
    fresh = type(fitted)(**fitted.get_params()).fit(few)
    assert _spearman(fresh.predict(few), few.labels) > 0, fitted.kind  # not a constant
    updated = copy.deepcopy(fitted).update(few)
    assert len(updated.seen_) == len(few)
    assert not np.allclose(updated.predict(test), fitted.predict(test))  # it moved
    for model in (fresh, updated):
        assert np.all(np.isfinite(model.predict(test)))


def test_a_model_set_to_refine_by_nothing_keeps_what_it_learned(fitted, test):
    """``refine_rounds=0`` / ``refine_epochs=0`` are allowed (a frozen model online): an
    update then changes nothing (LightGBM refused zero rounds with its own ValueError)."""
    setting = next((s for s in ("refine_rounds", "refine_epochs") if s in fitted.get_params()),
                   None)  # fmt: skip
    if setting is None:
        pytest.skip(f"{fitted.kind} refits on everything it has seen (no refine setting)")
    model = copy.deepcopy(fitted)
    setattr(model, setting, 0)
    before = model.predict(test)
    model.update(synthetic(40, seed=12))
    np.testing.assert_allclose(model.predict(test), before, rtol=1e-5, atol=1e-6)


def test_every_model_scores_programs_without_trace_tokens(fitted, test):
    """A search caches features without tokens until a token-reading model comes in."""
    bare = dataclasses.replace(test, tokens=[t[:0] for t in test.tokens])
    assert np.all(np.isfinite(fitted.predict(bare)))


def test_every_model_scores_no_programs(fitted, test):
    assert fitted.predict(test.subset(np.zeros(len(test), bool))).shape == (0,)


def test_a_neural_model_refuses_features_it_would_learn_nan_from(fitted, train):
    if not hasattr(fitted, "net_"):
        pytest.skip(f"{fitted.kind}'s trees take NaN for a missing value")
    for value in (np.inf, np.nan):
        workload = train.workload.copy()  # read by every neural model, per block or token
        workload[7, 0] = value
        bad = dataclasses.replace(train, workload=workload)
        with pytest.raises(TensortuneError, match=r"\d+ feature rows hold NaN or infinite"):
            type(fitted)(**fitted.get_params()).fit(bad)
        online = copy.deepcopy(fitted)  # refined online (a search's batches): refused too,
        before = online.predict(train)  # the network as it was
        with pytest.raises(TensortuneError, match=r"\d+ feature rows hold NaN or infinite"):
            online.update(bad)
        np.testing.assert_array_equal(online.predict(train), before)


def test_loading_a_model_leaves_the_callers_random_numbers_be(fitted, tmp_path):
    """A neural model's network is built, from random weights, before its own load in."""
    import torch

    fitted.save(tmp_path / "m")
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    load_cost_model(tmp_path / "m")
    assert torch.equal(torch.rand(3), expected)


def test_files_from_elsewhere_are_refused(fitted, tmp_path):
    path = tmp_path / "m"
    fitted.save(path)
    with zipfile.ZipFile(path) as z:
        meta, state = json.loads(z.read("meta.json")), z.read("state.bin")

    def rewrite(name: str, drop: tuple[str, ...] = (), **changes) -> str:
        out = tmp_path / name
        with zipfile.ZipFile(out, "w") as z:
            kept = {k: v for k, v in {**meta, **changes}.items() if k not in drop}
            z.writestr("meta.json", json.dumps(kept))
            z.writestr("state.bin", state)
        return str(out)

    with pytest.raises(TensortuneError, match="format v99"):
        load_cost_model(rewrite("v", format_version=99))
    with pytest.raises(TensortuneError, match=r"feature schema 0000.*retrain"):
        load_cost_model(rewrite("s", feature_schema="0000"))
    with pytest.raises(TensortuneError, match="unknown cost model 'nope'"):
        load_cost_model(rewrite("k", kind="nope"))
    if fitted.uses_lowered:  # features counted another way than this tensortune counts them
        with pytest.raises(TensortuneError, match=r"lowered-loop features of version 1.*refit"):
            load_cost_model(rewrite("l", lowered_version=1))
        with pytest.raises(TensortuneError, match=r"lowered-loop features of version 1.*refit"):
            load_cost_model(rewrite("l0", drop=("lowered_version",)))  # saved before the stamp
    else:  # a model that never reads them does not care
        load_cost_model(rewrite("l", lowered_version=1))
    (tmp_path / "junk").write_bytes(b"not a zip")
    with pytest.raises(TensortuneError, match="not a tensortune cost model"):
        load_cost_model(tmp_path / "junk")
    with zipfile.ZipFile(tmp_path / "broken", "w") as z:
        z.writestr("meta.json", json.dumps(meta))
        z.writestr("state.bin", b"\x00garbage")
    with pytest.raises(TensortuneError, match="cannot restore"):
        load_cost_model(tmp_path / "broken")


class _RunsCode:
    """A pickled object whose loading would call a function: a model file must not do it."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (type(self.marker).touch, (self.marker,))


def test_loading_a_model_file_runs_no_code(fitted, tmp_path):
    torch = pytest.importorskip("torch")
    import io

    path = tmp_path / "m"
    fitted.save(path)
    with zipfile.ZipFile(path) as z:
        meta = json.loads(z.read("meta.json"))
    marker = tmp_path / "code-ran"
    payload = io.BytesIO()
    torch.save({"net": _RunsCode(marker), "scale": _RunsCode(marker)}, payload)
    with zipfile.ZipFile(tmp_path / "evil", "w") as z:
        z.writestr("meta.json", json.dumps(meta))
        z.writestr("state.bin", payload.getvalue())
    with pytest.raises(TensortuneError, match="cannot restore"):
        load_cost_model(tmp_path / "evil")
    assert not marker.exists()


def test_an_ensemble_predicts_the_mean_of_members_trained_apart(train, test):
    """Members start from different weights and see the programs in their own orders, so they
    disagree; the ensemble's score is their mean, and a single member trains as it always did."""
    import torch

    settings = {**FAST["mlp"], "epochs": 5}
    three = model_class("mlp")(**settings, members=3).fit(train)
    one = model_class("mlp")(**settings).fit(train)
    inputs = three._inputs(test)
    with torch.no_grad():
        each = [net(*inputs).numpy() for net in three.net_]
    assert not np.allclose(each[0], each[1]) and not np.allclose(each[1], each[2])
    assert np.allclose(three.predict(test), np.mean(each, axis=0), atol=1e-5)
    # The first member is the plain model: same initial weights, same order of programs.
    assert np.allclose(each[0], one.predict(test), atol=1e-5)
    with pytest.raises(TensortuneError, match="members must be at least 1"):
        model_class("mlp")(members=0).fit(train)


@pytest.mark.parametrize("kind", ["xgb", "lgbm", "pacm"])
def test_lowered_features_are_read_only_by_a_model_told_to(kind, train, test):
    """Speed a function of one lowered feature alone: only ``lowered=1`` can rank it, it
    scores a program whose lowering failed (NaN) and refuses programs without lowered
    features in one line."""

    def relabeled(data: ProgramSet) -> ProgramSet:
        labels = np.exp(data.lowered[:, 5] * 2)
        return ProgramSet(data.per_store, data.tokens, data.workload, data.hardware,
                          data.groups, labels / labels.max(), data.lowered)  # fmt: skip

    fit, check = relabeled(train), relabeled(test)
    reads = model_class(kind)(**FAST[kind], lowered=1).fit(fit)
    blind = model_class(kind)(**FAST[kind]).fit(fit)
    assert reads.uses_lowered and not blind.uses_lowered
    assert _spearman(reads.predict(check), check.labels) > 0.8
    assert abs(_spearman(blind.predict(check), check.labels)) < 0.3
    lowered = test.lowered.copy()
    lowered[:5] = np.nan
    failed = ProgramSet(test.per_store, test.tokens, test.workload, test.hardware, test.groups,
                        lowered=lowered)  # fmt: skip
    assert np.isfinite(reads.predict(failed)).all()
    bare = ProgramSet(test.per_store, test.tokens, test.workload, test.hardware, test.groups)
    with pytest.raises(TensortuneError, match="lowered-loop features, which these programs lack"):
        reads.predict(bare)


def test_model_settings_from_text():
    from tensortune.costmodel.registry import check_settings, model_settings, new_model

    assert model_settings("pacm", {"members": "5", "lr": "1e-3"}) == {"members": 5, "lr": 1e-3}
    assert model_settings("mlp", {"lr": "1"}) == {"lr": 1.0}
    with pytest.raises(TensortuneError, match="pacm has no setting 'nope'"):
        model_settings("pacm", {"nope": "1"})
    for text in ("five", "2.5"):
        with pytest.raises(TensortuneError, match=f"members='{text}': expected int"):
            model_settings("pacm", {"members": text})
    # A negative seed passed here, then stopped a neural model's fit with NumPy's error.
    with pytest.raises(TensortuneError, match=r"seed=-1 is out of range"):
        model_settings("mlp", {"seed": "-1"})
    # Attention splits its width among its heads: torch stopped the first fit otherwise.
    with pytest.raises(TensortuneError, match="heads=3 does not divide hidden=256"):
        new_model("hwattn", 0, model_settings("hwattn", {"heads": "3"}))
    with pytest.raises(TensortuneError, match="heads=4 does not divide pattern_hidden=30"):
        check_settings("pacm", {"pattern_hidden": 30})
    assert new_model("tlp", 0, {"heads": 3, "hidden": 96}).heads == 3
    from tensortune.cli.options import model_params  # one --param at a time, checked as a whole

    assert model_params(["hwattn.hidden=96", "hwattn.heads=3"]) == {
        "hwattn": {"hidden": 96, "heads": 3}}  # fmt: skip
    with pytest.raises(TensortuneError, match="heads=3 does not divide hidden=256"):
        model_params(["hwattn.heads=3"])
