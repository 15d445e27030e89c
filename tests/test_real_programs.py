"""The central claim on real programs: the shipped model ranks measured TVM programs far better
than chance, its scores steer the search, and tuning online or with MoA changes it.

Chance is measured, not assumed: a random scorer is scored on the same tasks many times, and the
model must beat its mean by ``SIGMAS`` standard deviations (one-sided, a normal tail of 3e-5).
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import platform

from tensortune.costmodel.data import ProgramSet
from tensortune.costmodel.factory import cost_model_from
from tensortune.costmodel.registry import load_cost_model
from tensortune.costmodel.shipped import CARD, SHIPPED_DIR, checked, shipped_card, shipped_model
from tensortune.datasets.build import build_dataset, load_table, read_card, table_columns
from tensortune.datasets.shipped import DATASET_DIR, POOL_DIR, dataset_path
from tensortune.errors import TensortuneError
from tensortune.features import schema_hash
from tensortune.hardware import resolve_platform
from tensortune.train.metrics import score_predictions
from tensortune.train.trainer import scored_rows
from tensortune.tuning.tune import tune

SIGMAS = 4.0
METRICS = ("pca", "top1_score", "top5_score")


def chance(rows: dict, draws: int = 200, seed: int = 0) -> dict[str, tuple[float, float]]:
    """Mean and standard deviation of each metric for a scorer that guesses at random."""
    rng = np.random.default_rng(seed)
    scores = [score_predictions(rows, rng.random(len(rows["label"]))) for _ in range(draws)]
    return {k: (float(np.mean([s[k] for s in scores])), float(np.std([s[k] for s in scores])))
            for k in METRICS}  # fmt: skip


def assert_far_above_chance(rows: dict, pred: np.ndarray, metrics=METRICS) -> dict:
    model = score_predictions(rows, pred)
    base = chance(rows)
    for k in metrics:
        mean, sd = base[k]
        assert model[k] > mean + SIGMAS * sd, f"{k}: {model[k]:.3f}, chance {mean:.3f} ± {sd:.3f}"
    return model


# ---- the shipped files are what their cards say --------------------------------------------


def test_every_shipped_model_matches_its_card_and_loads():
    files = shipped_card()["files"]
    assert sorted(files) == sorted(p.name for p in SHIPPED_DIR.glob("*.ttm"))
    for name, entry in files.items():
        path = SHIPPED_DIR / name
        model = load_cost_model(checked(path))
        assert model.fitted and model.kind == entry["kind"]
        meta = json.loads(zipfile.ZipFile(path).read("meta.json"))
        assert meta["feature_schema"] == schema_hash()  # what this tensortune computes
        trained = {k: v for k, v in entry["trained_on"].items() if k != "test"}
        assert meta["provenance"] == trained


def test_the_shipped_models_are_fitted_on_the_default_dataset_and_dataset_info_says_so():
    card = read_card(DATASET_DIR).data
    out = subprocess.run([sys.executable, "-m", "tensortune.cli.app", "dataset", "info",
                          "--json"], capture_output=True, text=True, check=True)  # fmt: skip
    listed = json.loads(out.stdout)["shipped_models"]
    assert sorted(listed) == sorted(shipped_card()["files"])  # every one, none left on old data
    for name, entry in listed.items():
        held = set(entry["split"].removeprefix("by-hardware:").split(","))
        # trained on exactly the rows of the configurations its name lists
        assert held == {
            h for h in card["hardware"] if h.split("@")[0] not in entry["configurations"]
        }
        assert name == "+".join(entry["configurations"]) + ".ttm"
        assert 0.5 < entry["test"]["pca"] <= 1 and entry["test"]["programs"] > 1000


def test_a_shipped_model_that_differs_from_its_card_is_refused(tmp_path, monkeypatch):
    import tensortune.costmodel.shipped as shipped

    name = "avx512-2c.ttm"
    copy = tmp_path / name
    data = bytearray((SHIPPED_DIR / name).read_bytes())
    data[-1] ^= 1  # one bit
    copy.write_bytes(bytes(data))
    with pytest.raises(TensortuneError, match=f"{name} does not match its checksum"):
        checked(copy)
    monkeypatch.setattr(shipped, "SHIPPED_DIR", tmp_path)
    with pytest.raises(TensortuneError, match="does not match its checksum"):
        shipped_model(platform({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}))
    assert CARD.is_file()


def test_a_broken_shipped_model_is_said_not_replaced_by_a_cold_one(tmp_path, monkeypatch):
    """The searches fall back to a model learned from scratch only where none is shipped: a
    shipped file that fails its checksum is a broken install, and they say so."""
    import tensortune.costmodel.shipped as shipped
    from tensortune.costmodel.gbdt import XGBoostModel
    from tensortune.search.draft_verify import DraftThenVerify
    from tensortune.search.factory import default_verifier
    from tensortune.transfer.run import _ranker

    target = platform({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
    monkeypatch.setattr(shipped, "SHIPPED_DIR", tmp_path)  # none shipped
    assert isinstance(default_verifier(DraftThenVerify(), target), XGBoostModel)
    assert _ranker(target) is None
    data = bytearray((SHIPPED_DIR / "avx512-2c.ttm").read_bytes())
    data[-1] ^= 1
    (tmp_path / "avx512-2c.ttm").write_bytes(bytes(data))
    for call in (lambda: default_verifier(DraftThenVerify(), target), lambda: _ranker(target)):
        with pytest.raises(TensortuneError, match="does not match its checksum"):
            call()


def test_the_shipped_datasets_match_their_cards():
    for directory in (DATASET_DIR, DATASET_DIR.parent / "ttset-cpu-v1", POOL_DIR):
        card = read_card(directory).data
        table = load_table(directory, ["task_id", "hardware"])  # checks the sha256
        assert table.num_rows == card["programs"]
        assert len(set(table.column("hardware").to_pylist())) == len(card["hardware"])


def test_a_shipped_dataset_answers_to_its_name_unless_a_directory_has_it(tmp_path, monkeypatch):
    assert dataset_path("ttset-cpu-v1") == DATASET_DIR.parent / "ttset-cpu-v1"
    assert dataset_path(DATASET_DIR.name) == dataset_path("default") == DATASET_DIR
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ttset-cpu-v1").mkdir()  # the user's own directory of that name wins
    assert dataset_path("ttset-cpu-v1") == Path("ttset-cpu-v1")
    assert dataset_path("no-such-dataset") == Path("no-such-dataset")
    for short in ("pool", "default"):  # the short names too: ./pool is the user's own data
        assert dataset_path(short) != Path(short)
        (tmp_path / short).mkdir()
        assert dataset_path(short) == Path(short)


def test_the_pool_keeps_its_held_out_networks_kernels_apart():
    card = read_card(POOL_DIR).data
    cols = load_table(POOL_DIR, ["task", "networks"]).to_pydict()
    held = set(card["held_out"])
    assert held == {"resnet50", "gpt2-block"}
    tasks: dict[str, set[str]] = {}
    for task, nets in zip(cols["task"], cols["networks"], strict=True):
        tasks.setdefault(task, set()).update(nets)
    assert all(not (nets & held) or nets <= held for nets in tasks.values())
    sizes = Counter(t for t, nets in zip(cols["task"], cols["networks"], strict=True)
                    if not set(nets) & held)  # fmt: skip
    # 800 programs a pool task, but where a design space holds a single program (GELU).
    assert all(n >= 800 for n in sizes.values() if n > 1) and len(sizes) >= 24


# ---- ranking real programs -----------------------------------------------------------------


def test_the_default_model_ranks_held_out_programs_of_the_shipped_dataset():
    model = load_cost_model(shipped_model(resolve_platform(None)))  # what users get here
    assert model.provenance_["dataset"] == read_card(DATASET_DIR).data["name"]
    held = model.provenance_["split"].removeprefix("by-hardware:").split(",")
    columns = table_columns(load_table(DATASET_DIR))
    hardware, task = np.asarray(columns["hardware"]), np.asarray(columns["task_id"])
    trained = ~np.isin(hardware, held)
    mask = ~trained & ~np.isin(task, task[trained])  # hardware and tasks it never saw
    rows = scored_rows(columns, mask)
    assert len(set(rows["task_id"])) >= 30  # a slice of tens of tasks, not a lucky few
    assert_far_above_chance(rows, model.predict(ProgramSet.from_columns(columns, mask)))


SPECS = ["conv2d_nchw_bias_relu:1,28,28,64,64,3", "dense_bias_relu:64,768,768",
         "matmul:256,256,256"]  # fmt: skip
PER_TASK = 24


@pytest.fixture(scope="module")
def measured_here(tmp_path_factory) -> tuple[Path, str]:
    """Random programs of three tasks, measured now on this CPU, for the target users get."""
    root = tmp_path_factory.mktemp("here")
    url = f"sqlite:///{root / 'r.db'}"
    tune(SPECS, trials=PER_TASK * len(SPECS), max_trials_per_task=PER_TASK, records=url,
         work_dir=root / "w", trials_per_round=PER_TASK, task_scheduler="round-robin",
         strategy="replay-trace", cost_model="random")  # fmt: skip
    build_dataset(url, root / "d")
    return root / "d", url


def test_the_default_model_ranks_programs_measured_here(measured_here):
    directory, _ = measured_here
    columns = table_columns(load_table(directory))
    everything = np.ones(len(columns["task_id"]), bool)
    rows = scored_rows(columns, everything)
    assert len(rows["label"]) == PER_TASK * len(SPECS)
    model = load_cost_model(shipped_model(resolve_platform(None)))
    pred = model.predict(ProgramSet.from_columns(columns, everything))
    # Top-k over three tasks is too coarse to separate from chance; the pairs are not.
    assert_far_above_chance(rows, pred, metrics=("pca",))


# ---- the model in the search ---------------------------------------------------------------


def _reversed(model):
    """The same fitted model, scoring every program with the opposite sign."""
    forward = model.predict
    model.predict = lambda data: -forward(data)
    return model


def test_the_default_models_scores_steer_the_search(tmp_path):
    """Tuned once with the default model and once with its scores reversed, on the same seed:
    the programs measured differ, and the model's own choice is the one it predicts faster.

    Whether the model's picks also *run* faster is a timing claim: the margin on this task is
    1-2% of the latency, under the noise of a loaded 2-core machine, so it lives in
    ``benchmarks/scorer_picks.py`` (how each scorer's ranking matches measured speed)."""
    here = resolve_platform(None)
    spec = "matmul:256,256,256"
    picked = {}
    for name, model in (("default", load_cost_model(shipped_model(here))),
                        ("reversed", _reversed(load_cost_model(shipped_model(here))))):  # fmt: skip
        url = f"sqlite:///{tmp_path / name}.db"
        tune([spec], trials=16, trials_per_round=16, records=url, work_dir=tmp_path / "w",
             strategy="draft-verify", cost_model=model, online_cost_model=False)  # fmt: skip
        build_dataset(url, tmp_path / name)
        picked[name] = table_columns(load_table(tmp_path / name))
    scorer = load_cost_model(shipped_model(here))

    def scores(columns: dict) -> np.ndarray:
        return scorer.predict(ProgramSet.from_columns(columns, np.ones(len(columns["cost"]), bool)))

    default, reverse = picked["default"], picked["reversed"]
    assert set(default["trace"]) != set(reverse["trace"])
    assert np.median(scores(default)) > np.median(scores(reverse))


@pytest.mark.parametrize("online", [True, "moa"])
def test_tuning_online_or_with_moa_changes_the_models_parameters(tmp_path, online):
    here = resolve_platform(None)
    mine = load_cost_model(shipped_model(here))
    given = {k: v.clone() for k, v in mine.net_.state_dict().items()}
    adapter = cost_model_from(mine, here, online=online)
    net = adapter.model.model.net_ if online == "moa" else adapter.model.net_
    before = {k: v.clone() for k, v in net.state_dict().items()}
    # MoA retrains every 4th batch: four batches of 4 make one retraining.
    tune(["matmul:128,128,128"], trials=16, trials_per_round=4, records=f"sqlite:///{tmp_path}/r.db",
         work_dir=tmp_path / "w", strategy="draft-verify", cost_model=adapter)  # fmt: skip
    after = net.state_dict()
    changed = [k for k, v in before.items() if v.is_floating_point() and not v.equal(after[k])]
    assert changed, "no parameter moved"
    # The model object the caller gave is left as given: the search refined a copy.
    assert all(v.equal(mine.net_.state_dict()[k]) for k, v in given.items())
    if online == "moa":
        assert adapter.model.retrains_ >= 1
