"""Dataset pruning: one conformance test every method passes, what each method is for
(cluster spreads out, low-perf keeps the fast ones and drops slow programs in dense regions,
shape-dedup drops shape variants first), the study, and ``dataset prune`` → ``train``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_active import FAST_XGB, HW, _spread_out
from test_costmodels import synthetic

from tensortune.active import pool_from_programs
from tensortune.active.selectors import _distances
from tensortune.compare.pruning import prune_study
from tensortune.errors import TensortuneError
from tensortune.train.pruning import METHODS, prune, prune_dataset, task_family


@pytest.fixture(scope="module")
def pool():
    return pool_from_programs(synthetic(400, seed=3))


def _families(pool) -> list[str]:
    """Tasks 0 and 1 are shape variants of one operator, 2 and 3 of another."""
    return [f"op{t // 2}" for t in pool.task]


@pytest.mark.parametrize("method", METHODS)
def test_every_method_keeps_a_share_of_each_group_and_a_seed_fixes_it(method, pool):
    families = _families(pool)
    for keep in (0.1, 0.45, 0.8):
        kept = prune(pool, method, keep, seed=1, families=families)
        assert len(kept) == len(set(kept.tolist())) and np.all(np.diff(kept) > 0)
        assert kept.min() >= 0 and kept.max() < len(pool)
        assert abs(len(kept) - keep * len(pool)) <= 0.15 * len(pool) + 4, (keep, len(kept))
        again = prune(pool, method, keep, seed=1, families=families)
        assert np.array_equal(kept, again)
        if method == "cluster-global":  # one radius for all groups: `keep` of the whole
            assert len(kept) == round(keep * len(pool))
            assert set(pool.task[kept].tolist()) == set(pool.task.tolist())
        elif method != "shape-dedup":  # the others keep `keep` of every group (±1 rounding)
            for t in np.unique(pool.task):
                size = (pool.task == t).sum()
                assert abs((pool.task[kept] == t).sum() - keep * size) <= 1
    assert np.array_equal(prune(pool, method, 1.0, families=families), np.arange(len(pool)))
    for bad in (0, 1.5, float("nan")):
        with pytest.raises(TensortuneError, match="must lie in"):
            prune(pool, method, bad, families=families)


def test_unknown_method_names_the_known_ones_and_auto_is_one_of_them(pool):
    with pytest.raises(TensortuneError, match="known: random, cluster, cluster-global, low-perf"):
        prune(pool, "nosuch", 0.5)
    from tensortune.train.pruning import AUTO

    families = _families(pool)
    assert np.array_equal(prune(pool, "auto", 0.5, seed=1, families=families),
                          prune(pool, AUTO, 0.5, seed=1, families=families))  # fmt: skip


def test_cluster_keeps_programs_farther_apart_than_random(pool):
    def gap(method: str, seed: int) -> float:
        return _spread_out(pool, prune(pool, method, 0.1, seed=seed))

    assert np.mean([gap("cluster", s) for s in range(3)]) > 1.2 * np.mean(
        [gap("random", s) for s in range(3)])  # fmt: skip


def test_cluster_global_keeps_few_of_a_group_of_near_duplicates(pool):
    from dataclasses import replace

    vectors = pool.vectors.copy()
    crowded = pool.task == pool.task[0]
    rng = np.random.default_rng(0)
    vectors[crowded] = vectors[crowded][0] + rng.normal(0, 1e-3, vectors[crowded].shape)
    squeezed = replace(pool, vectors=vectors)
    kept = prune(squeezed, "cluster-global", 0.3, seed=0)
    share = {
        t: np.mean(np.isin(np.flatnonzero(pool.task == t), kept)) for t in np.unique(pool.task)
    }
    assert (
        share[pool.task[0]] < 0.05 and min(v for t, v in share.items() if t != pool.task[0]) > 0.3
    )
    # Within each group, what is kept lies far apart, as `cluster` keeps it.
    assert _spread_out(pool, prune(pool, "cluster-global", 0.1, seed=0)) > 1.2 * np.mean(
        [_spread_out(pool, prune(pool, "random", 0.1, seed=s)) for s in range(3)])  # fmt: skip


def test_low_perf_keeps_each_groups_fastest_and_drops_slow_programs_first(pool):
    kept = prune(pool, "low-perf", 0.3, seed=0)
    for t in np.unique(pool.task):
        members = np.flatnonzero(pool.task == t)
        mine = kept[pool.task[kept] == t]
        top = members[np.argsort(-pool.labels[members])[: len(mine) // 2]]
        assert set(top.tolist()) <= set(mine.tolist())  # the fast half of its quota
    slow = np.zeros(len(pool), dtype=bool)
    crowding = np.zeros(len(pool))  # distance to the nearest other program of the task
    for t in np.unique(pool.task):
        members = np.flatnonzero(pool.task == t)
        slow[members] = pool.labels[members] < np.median(pool.labels[members])
        x = pool.vectors[members].astype(np.float64)
        for i, m in enumerate(members):
            crowding[m] = _distances(x[i : i + 1], np.delete(x, i, axis=0))[0]
    assert slow[kept].mean() < slow[prune(pool, "random", 0.3, seed=0)].mean()
    dropped = np.setdiff1d(np.arange(len(pool)), kept)
    # The slow programs it keeps stand alone; those it drops had close neighbours.
    assert crowding[kept[slow[kept]]].mean() > 1.1 * crowding[dropped[slow[dropped]]].mean()


def test_shape_dedup_drops_the_closest_variant_whole_before_anything_else(pool):
    families = _families(pool)
    sizes = np.bincount(pool.task)
    keep = (len(pool) - min(sizes)) / len(pool)  # room to drop exactly one whole task
    kept = prune(pool, "shape-dedup", keep, seed=0, families=families)
    gone = set(np.unique(pool.task).tolist()) - set(np.unique(pool.task[kept]).tolist())
    assert len(gone) == 1 and len(kept) == len(pool) - sizes[gone.pop()]
    with pytest.raises(TensortuneError, match="family"):
        prune(pool, "shape-dedup", 0.5)
    # Every family down to one task: the rest is random within the survivors.
    kept = prune(pool, "shape-dedup", 0.2, seed=0, families=families)
    assert len(np.unique(pool.task[kept])) == 2
    assert abs(len(kept) - 0.2 * len(pool)) <= 3


def test_task_families_drop_tvms_numbering_not_the_operators():
    assert task_family("fused_conv2d8_add4_add61") == "fused_conv2d_add_add"
    assert task_family("fused_nn_conv2d_add") == "fused_nn_conv2d_add"
    assert task_family("matmul3") == task_family("matmul") == "matmul"


def test_the_pruning_study_scores_each_method_and_the_whole_pool():
    result = prune_study("default", held_out=["gpt2-block"], hardware=HW,
                         methods=["random", "low-perf", "shape-dedup"], keeps=[0.35, 1],
                         seeds=[0], params={"xgb": FAST_XGB})  # fmt: skip
    summary = {(e["selector"], e["fraction"]): e for e in result.summary()}
    assert set(summary) == {("all", 1.0), ("random", 0.35), ("low-perf", 0.35),
                            ("shape-dedup", 0.35)}  # fmt: skip
    for e in summary.values():
        assert 0.3 < e["pca"] < 1
    n = result.setup["pool_programs"]
    assert abs(summary[("random", 0.35)]["measured"] - 0.35 * n) < 0.02 * n
    with pytest.raises(TensortuneError, match="unknown pruning method"):
        prune_study("default", held_out=["gpt2-block"], hardware=HW, methods=["nosuch"])


def test_the_pruning_study_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    import tensortune.compare.pruning as study

    args = {
        "held_out": ["gpt2-block"],
        "hardware": HW,
        "keeps": [0.35],
        "seeds": np.arange(1),
        "params": {"xgb": FAST_XGB},
    }  # numpy's seeds are saved too
    first = prune_study("default", methods=["random"], checkpoint=tmp_path / "prune.json",
                        **args)  # fmt: skip
    pruned, prune = [], study.prune

    def counted(pool, name, *a, **k):
        pruned.append(name)
        return prune(pool, name, *a, **k)

    monkeypatch.setattr(study, "prune", counted)
    # a method more: only its units run, the file's are read
    again = prune_study("default", methods=["random", "low-perf"],
                        checkpoint=tmp_path / "prune.json", **args)  # fmt: skip
    assert pruned == ["low-perf"] and again.rows[0] == first.rows[0] and len(again.rows) == 2
    with pytest.raises(TensortuneError, match="shares kept"):
        prune_study("default", held_out=["gpt2-block"], hardware=HW, keeps=[0])


def test_a_subset_killed_before_its_card_is_whole_when_run_again(tmp_path, monkeypatch):
    # Its lowered-loop features were copied after the card was in place: a kill between left
    # a dataset without them, which a plain rerun refused to replace.
    from tensortune.datasets.build import load_table, read_card
    from tensortune.datasets.lowered import read_lowered
    from tensortune.datasets.shipped import dataset_path
    from tensortune.datasets.subset import write_subset

    # Every 20th row of the shipped dataset: what is tested is the order the files are
    # written in, which a twentieth of the rows shows as well in a quarter of the time.
    source = tmp_path / "default-20th"
    rows = np.arange(0, read_card(dataset_path("default")).data["programs"], 20)
    write_subset(dataset_path("default"), rows, source, description="every 20th row")
    replace = Path.replace

    def killed_at_the_card(self, target):
        if Path(target).name == "card.json":
            raise KeyboardInterrupt
        return replace(self, target)

    monkeypatch.setattr(Path, "replace", killed_at_the_card)
    with pytest.raises(KeyboardInterrupt):
        prune_dataset(source, "random", 0.1, tmp_path / "p", seed=0)
    monkeypatch.undo()
    assert (tmp_path / "p" / "lowered.parquet").is_file()  # in place before the card
    prune_dataset(source, "random", 0.1, tmp_path / "p", seed=0)  # a plain rerun
    ids = load_table(tmp_path / "p", ["program_id"]).to_pydict()["program_id"]
    np.testing.assert_array_equal(read_lowered(tmp_path / "p", ids), read_lowered(source, ids))
    # Replacing it, killed the same way: the old card is gone with the old files, not left to
    # vouch for the new ones, and a plain rerun goes on.
    monkeypatch.setattr(Path, "replace", killed_at_the_card)
    with pytest.raises(KeyboardInterrupt):
        prune_dataset(source, "random", 0.2, tmp_path / "p", seed=0, overwrite=True)
    monkeypatch.undo()
    assert not (tmp_path / "p" / "card.json").exists()
    card = prune_dataset(source, "random", 0.2, tmp_path / "p", seed=0)
    assert card["pruning"]["keep"] == 0.2


def test_a_pruned_dataset_is_one_that_train_reads(tmp_path, cli):
    from tensortune.datasets.build import load_table, read_card
    from tensortune.datasets.lowered import read_lowered
    from tensortune.datasets.shipped import dataset_path
    from tensortune.train.trainer import train

    card = prune_dataset("default", "low-perf", 0.4, tmp_path / "pruned", seed=2)
    p = card["pruning"]
    assert p["method"] == "low-perf" and card["programs"] == p["programs"]
    assert abs(p["programs"] - 0.4 * p["of"]) < 0.02 * p["of"]
    # every hardware of the dataset is pruned, none dropped
    assert card["hardware"].keys() == read_card(dataset_path("default")).data["hardware"].keys()
    # Only the columns read: the feature columns as Python lists took seconds and gigabytes.
    table = load_table(tmp_path / "pruned", ["task_id", "hardware", "label",
                                            "program_id"]).to_pydict()  # fmt: skip
    best: dict[tuple, float] = {}
    for t, h, y in zip(table["task_id"], table["hardware"], table["label"], strict=True):
        best[(t, h)] = max(y, best.get((t, h), 0.0))
    assert all(y == pytest.approx(1.0) for y in best.values())
    # the kept programs keep their lowered-loop features (the shipped dataset has them)
    ids = table["program_id"]
    np.testing.assert_array_equal(read_lowered(tmp_path / "pruned", ids),
                                  read_lowered("default", ids))  # fmt: skip
    result = train(tmp_path / "pruned", cost_model="xgb", params=FAST_XGB, split="by-task")
    assert 0 < result.metrics["pca"] <= 1
    code, out, err = cli("dataset", "prune", "--keep", "0.3", "--method", "random", "--out",
                         str(tmp_path / "r"))  # fmt: skip
    assert code == 0 and "kept" in out, err
    code, out, err = cli("dataset", "info", str(tmp_path / "r"), "--json")
    assert code == 0, err
    assert abs(json.loads(out)["programs"] - 0.3 * p["of"]) < 0.02 * p["of"]
    # Refused before the dataset loads: the missing dataset would be the error otherwise.
    missing = ["--dataset", str(tmp_path / "none")]
    for extra, says in ((["--method", "nosuch"], "unknown pruning method"),
                        (["--keep", "2", *missing], "must lie in"),
                        (["--seed", "-1", *missing], "must not be negative")):  # fmt: skip
        code, _, err = cli("dataset", "prune", "--keep", "0.3", "--out", str(tmp_path / "x"),
                           *extra)  # fmt: skip
        assert code != 0 and says in err
        assert len(err.strip().splitlines()) == 1


def test_pruning_the_pool_keeps_its_test_networks_whole_and_named(tmp_path):
    """The pool's card holds out networks to score on: a pruned pool keeps their rows as they
    were (labels too) and still names them, so ``dataset select`` of it keeps away from them."""
    from tensortune.datasets.build import load_table, read_card
    from tensortune.datasets.shipped import dataset_path

    held = read_card(dataset_path("pool")).data["held_out"]
    card = prune_dataset("pool", "random", 0.1, tmp_path / "p", seed=0)
    assert card["held_out"] == held
    columns = ["program_id", "label", "networks"]
    before, after = (load_table(d, columns).to_pydict() for d in (dataset_path("pool"),
                                                                   tmp_path / "p"))  # fmt: skip

    def scored(t):
        return {pid: y for pid, y, nets in zip(t["program_id"], t["label"], t["networks"],
                                               strict=True) if set(nets) & set(held)}  # fmt: skip

    assert scored(after) == scored(before) and scored(before)
    others = len(after["program_id"]) - len(scored(after))
    assert abs(others - 0.1 * card["pruning"]["of"]) < 0.02 * card["pruning"]["of"]
    # Pruned again into it: refused before any work, unless asked to replace it.
    with pytest.raises(TensortuneError, match="already holds a dataset"):
        prune_dataset("pool", "random", 0.05, tmp_path / "p", seed=0)
    assert load_table(tmp_path / "p", ["program_id"]).num_rows == len(after["program_id"])
    again = prune_dataset("pool", "random", 0.05, tmp_path / "p", seed=0, overwrite=True)
    assert (
        load_table(tmp_path / "p", ["program_id"]).num_rows
        == again["programs"]
        < len(after["program_id"])
    )


def test_bench_prune_prints_json_and_draws_its_plot(tmp_path, cli):
    code, out, err = cli("bench", "prune", "--dataset", "default", "--held-out", "gpt2-block",
                         "--hardware", HW, "--keep", "0.5,1", "--seeds", "1", "--method",
                         "cluster", "--param", "xgb.n_rounds=30", "--json", "--plot",
                         str(tmp_path / "p.png"))  # fmt: skip
    assert code == 0, err
    report = json.loads(out)
    assert {e["selector"] for e in report["summary"]} == {"all", "cluster"}
    assert (tmp_path / "p.png").stat().st_size > 10_000
