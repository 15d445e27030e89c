"""TenSet's offline metrics and dataset splits, against values computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tensortune.train import splits
from tensortune.train.metrics import (
    METRIC_KEYS,
    WeightedTask,
    average_peak_score,
    network_weights,
    pairwise_accuracy,
    r2,
    rmse,
    score_predictions,
    task_weighted,
    top_k_recall,
    top_k_score,
)

approx = pytest.approx  # relative 1e-6: every expected value below is exact arithmetic


# --- pairwise comparison accuracy -------------------------------------------------------


def test_pca_mixed_case():
    # pairs (i<j): (0,1) ok, (0,2) wrong, (0,3) ok, (1,2) ok, (1,3) ok, (2,3) wrong -> 4/6
    pred = [0.1, 0.4, 0.3, 0.2]
    label = [0.2, 1.0, 0.0, 0.5]
    assert pairwise_accuracy(pred, label) == approx(4 / 6)


def test_pca_perfect_and_reversed():
    label = [0.9, 0.5, 0.1]
    assert pairwise_accuracy([3, 2, 1], label) == 1.0
    assert pairwise_accuracy([1, 2, 3], label) == 0.0


def test_pca_ties_are_not_greater():
    # equal labels: correct only if p_i - p_j > 0 is also false, i.e. p_i <= p_j
    assert pairwise_accuracy([2.0, 1.0], [0.5, 0.5]) == 0.0
    assert pairwise_accuracy([1.0, 2.0], [0.5, 0.5]) == 1.0
    # equal predictions: correct only if y_i <= y_j
    assert pairwise_accuracy([1.0, 1.0], [0.9, 0.1]) == 0.0
    assert pairwise_accuracy([1.0, 1.0], [0.1, 0.9]) == 1.0
    # both tied: "not greater" on both sides agrees
    assert pairwise_accuracy([1.0, 1.0], [0.3, 0.3]) == 1.0


def test_pca_one_program_or_none_is_half():
    assert pairwise_accuracy([0.3], [1.0]) == 0.5
    assert pairwise_accuracy([], []) == 0.5


def test_pca_large_task_crosses_blocks():
    # increasing predictions: pair (i<j) is correct iff y_i <= y_j; with m ones then zeros the
    # wrong pairs are exactly the m * (n - m) (one, zero) pairs.
    n, m = 2500, 1000
    label = np.r_[np.ones(m), np.zeros(n - m)]
    pairs = n * (n - 1) // 2
    assert pairwise_accuracy(np.arange(n), label) == approx((pairs - m * (n - m)) / pairs)


# --- average peak score -------------------------------------------------------------------


def test_a_peak_best_so_far_curve():
    # picks by prediction: labels 0.5, 0.25, 0.0, 1.0 -> best so far 0.5, 0.5, 0.5, 1.0
    pred = [0.9, 0.8, 0.1, 0.5]
    label = [0.5, 0.25, 1.0, 0.0]
    assert average_peak_score(pred, label, 1) == approx(0.5)
    assert average_peak_score(pred, label, 3) == approx(0.5)
    assert average_peak_score(pred, label, 4) == approx(2.5 / 4)


def test_a_peak_k_above_n_averages_the_picks_there_are():
    pred = [0.9, 0.8, 0.1, 0.5]
    label = [0.5, 0.25, 1.0, 0.0]
    assert average_peak_score(pred, label, 5) == approx(2.5 / 4)
    assert average_peak_score([0.2], [0.7], 5) == 1.0


def test_a_peak_divides_by_the_best_label_present():
    # the same task with every label halved: the ratios are unchanged
    pred = [0.9, 0.8, 0.1, 0.5]
    assert average_peak_score(pred, [0.25, 0.125, 0.5, 0.0], 1) == approx(0.5)


def test_a_peak_ties_pick_the_worst_first():
    # pred ties between rows 0 and 1: the lower label (0.2) is picked first
    assert average_peak_score([1, 1, 0], [1.0, 0.2, 0.5], 1) == approx(0.2)
    assert average_peak_score([1, 1, 0], [1.0, 0.2, 0.5], 2) == approx(0.6)
    assert average_peak_score([1, 1, 0], [0.2, 1.0, 0.5], 1) == approx(0.2)


def test_a_peak_all_failed_is_nan():
    assert math.isnan(average_peak_score([0.3, 0.1], [0.0, 0.0], 1))


# --- top-k recall -------------------------------------------------------------------------


def test_recall():
    pred = [4, 3, 2, 1]
    label = [0.2, 1.0, 0.5, 0.1]  # truth order: 1, 2, 0, 3
    assert top_k_recall(pred, label, 1) == 0.0
    assert top_k_recall(pred, label, 2) == 0.5
    assert top_k_recall(pred, label, 3) == 1.0
    assert top_k_recall(pred, label, 10) == 1.0  # k capped at n = 4
    # a task whose programs all failed has no top-k to find: no figure, not a perfect one
    assert math.isnan(top_k_recall(pred, [0.0] * 4, 2))


def test_recall_ties_fill_only_their_places():
    # truth top-2 = {row 0, one of the two 0.5s}: both picked 0.5s cannot both count
    assert top_k_recall([0, 2, 1], [1.0, 0.5, 0.5], 2) == 0.5
    # failures tie at 0: one failure fills the second place, the other does not count
    label = [1.0, 0.0, 0.0, 0.0]
    assert top_k_recall([0, 3, 2, 1], label, 2) == 0.5
    assert top_k_recall([0, 3, 2, 1], label, 1) == 0.0
    assert top_k_recall([3, 0, 2, 1], label, 2) == 1.0


# --- R² and RMSE --------------------------------------------------------------------------


def test_r2_and_rmse():
    pred, label = [0.5, 0.5, 1.0], [0.0, 0.5, 1.0]  # s_tot = 0.5, s_res = 0.25
    assert r2(pred, label) == approx(0.5)
    assert rmse(pred, label) == approx(math.sqrt(0.25 / 3))
    assert rmse([0.0, 1.0], [1.0, 1.0]) == approx(math.sqrt(0.5))


def test_r2_flat_labels_is_one_as_in_tenset():
    assert r2([0.0, 1.0], [0.3, 0.3]) == 1.0
    assert r2([0.0, 1.0], [0.0, 0.0]) == 1.0


def test_per_task_metrics_reject_bad_input():
    with pytest.raises(ValueError, match="entries"):
        rmse([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="empty"):
        rmse([], [])
    with pytest.raises(ValueError, match="NaN"):
        pairwise_accuracy([1.0, np.nan], [0.5, 1.0])
    with pytest.raises(ValueError, match="positive integer"):
        average_peak_score([1.0], [1.0], 0)
    with pytest.raises(ValueError, match="positive integer"):
        top_k_recall([1.0], [1.0], 0)


# --- task weighting -----------------------------------------------------------------------


def test_task_weighted_mean_and_rms():
    assert task_weighted({"a": 1.0, "b": 0.0}, {"a": 3, "b": 1}) == approx(0.75)
    # RMSE: sqrt of the weighted mean of squares, not the weighted mean of RMSEs (1.25)
    assert task_weighted({"a": 2.0, "b": 1.0}, {"a": 1, "b": 3}, rms=True) == approx(
        math.sqrt(7 / 4)
    )


def test_task_weighted_leaves_nan_tasks_out():
    assert task_weighted({"a": math.nan, "b": 0.4}, {"a": 10, "b": 1}) == approx(0.4)
    assert math.isnan(task_weighted({"a": math.nan}, {"a": 1}))
    with pytest.raises(ValueError, match="no test-set size"):
        task_weighted({"a": 1.0}, {})
    with pytest.raises(ValueError, match="positive"):
        task_weighted({"a": 1.0}, {"a": 0})


# --- network top-k score ------------------------------------------------------------------

# Heavy task A (weight 10, best 1.0) and light task B (weight 1, best 3.0).
HEAVY_COSTS = [1.0, 2.0, 4.0]
LIGHT_COSTS = [3.0, 6.0, None]


def test_top_k_score_best_in_heavy_task_only():
    tasks = [
        WeightedTask(10, HEAVY_COSTS, [0.9, 0.5, 0.1]),  # top-1 = cost 1.0 (the best)
        WeightedTask(1, LIGHT_COSTS, [0.2, 0.7, 0.1]),  # top-1 = 6.0, top-2 holds 3.0
    ]
    assert top_k_score(tasks, 1) == approx((10 * 1 + 3) / (10 * 1 + 6))  # 13/16
    assert top_k_score(tasks, 2) == 1.0


def test_top_k_score_best_in_light_task_only():
    tasks = [
        (10, HEAVY_COSTS, [0.1, 0.9, 0.5]),  # top-1 = 2.0
        (1, LIGHT_COSTS, [0.7, 0.2, 0.1]),  # top-1 = 3.0 (the best)
    ]
    assert top_k_score(tasks, 1) == approx(13 / 23)


def test_top_k_score_failed_picks_cost_1e5_times_the_best():
    # best 2.0; the top-1 failed: latency 2 / 1e-5; top-2 adds the 5.0 program
    task = WeightedTask(2, [2.0, None, 5.0], [0.1, 0.9, 0.2])
    assert top_k_score([task], 1) == approx(4 / (2 * 2e5))
    assert top_k_score([task], 2) == approx(4 / 10)
    # inf and NaN mark failures too
    assert top_k_score([(1, [2.0, np.inf], [0, 1])], 1) == approx(1e-5)
    assert top_k_score([(1, [2.0, np.nan], [0, 1])], 1) == approx(1e-5)


def test_top_k_score_clamps_very_slow_successes():
    # y = 1e-6 < 1e-5: latency is 1.0 / 1e-5, not 1e6
    assert top_k_score([(1, [1.0, 1e6], [0, 1])], 1) == approx(1e-5)


def test_top_k_score_skips_tasks_without_success_and_ties_pick_worst():
    heavy = WeightedTask(10, HEAVY_COSTS, [0.1, 0.9, 0.5])
    dead = WeightedTask(100, [None, np.inf], [0.5, 0.1])
    assert top_k_score([heavy, dead], 1) == approx(0.5)
    assert math.isnan(top_k_score([dead], 1))
    assert math.isnan(top_k_score([], 1))
    assert top_k_score([(1, [1.0, 2.0], [0.5, 0.5])], 1) == approx(0.5)
    assert top_k_score([(1, [1.0, 2.0], [0.5, 0.5])], 5) == 1.0  # k > n: every program


def test_top_k_score_rejects_bad_tasks():
    with pytest.raises(ValueError, match="weight"):
        top_k_score([(0, [1.0], [0.0])], 1)
    with pytest.raises(ValueError, match="positive"):
        top_k_score([(1, [0.0, 1.0], [0.0, 1.0])], 1)
    with pytest.raises(ValueError, match="predictions"):
        top_k_score([(1, [1.0, 2.0], [0.0])], 1)
    with pytest.raises(ValueError, match="positive integer"):
        top_k_score([(1, [1.0], [0.0])], 0)


def test_network_weights_from_task_sources():
    from tensortune.records.schema import TaskSource

    sources = [
        TaskSource("resnet", 1, "conv_a", 3),
        TaskSource("resnet", 1, "conv_b", 2),
        TaskSource("resnet", 2, "dense", 1),
        TaskSource("bert", 2, "dense", 12),
    ]
    assert network_weights(sources) == {"resnet": {1: 5, 2: 1}, "bert": {2: 12}}


# --- evaluate -----------------------------------------------------------------------------

# Task 1: costs 1, 2, 4, failed; task 2: costs 3, 6.  Rows interleaved on purpose.
ROWS = {
    "task_id": np.array([1, 2, 1, 1, 2, 1]),
    "label": np.array([1.0, 1.0, 0.5, 0.25, 0.5, 0.0]),
    "cost": np.array([1.0, 3.0, 2.0, 4.0, 6.0, None], dtype=object),
}
PRED = np.array([0.9, 0.2, 0.5, 0.1, 0.7, 0.7])

# By hand.  Task 1: pred [.9 .5 .1 .7], label [1 .5 .25 0] (4 rows):
#   PCA 4/6; a-peak@1 1, @5 1; recall@1 1, @5 1; s_tot .546875, s_res .5225.
# Task 2: pred [.2 .7], label [1 .5] (2 rows):
#   PCA 0; a-peak@1 .5, @5 .75; recall@1 0, @5 1; s_tot .125, s_res .68.
R2_1 = 1 - 0.5225 / 0.546875
R2_2 = 1 - 0.68 / 0.125


def test_evaluate_by_hand():
    out = score_predictions(ROWS, PRED)
    assert tuple(out) == METRIC_KEYS
    assert out["pca"] == approx((4 * 4 / 6 + 2 * 0) / 6)
    assert out["a_peak@1"] == approx((4 * 1 + 2 * 0.5) / 6)
    assert out["a_peak@5"] == approx((4 * 1 + 2 * 0.75) / 6)
    assert out["top1_recall"] == approx(4 / 6)
    assert out["top5_recall"] == 1.0
    assert out["r2"] == approx((4 * R2_1 + 2 * R2_2) / 6)
    assert out["rmse"] == approx(math.sqrt((0.5225 + 0.68) / 6))
    # every task its own network: task 1 picks its best (1), task 2 picks 6 of best 3 (0.5)
    assert out["top1_score"] == approx(0.75)
    assert out["top5_score"] == 1.0
    assert (out["tasks"], out["programs"]) == (2, 6)


def test_evaluate_with_networks():
    networks = {"net": {1: 10, 2: 1}, "other": {2: 1, 99: 3}, "absent": {77: 1}}
    out = score_predictions(ROWS, PRED, networks=networks)
    # net: (10·1 + 1·3) / (10·1 + 1·6) = 13/16; other: 3/6; absent holds no test task
    assert out["top1_score"] == approx((13 / 16 + 0.5) / 2)
    assert out["top5_score"] == 1.0
    assert out["pca"] == approx(4 / 9)  # task metrics do not depend on networks


def test_evaluate_accepts_a_pyarrow_table():
    pa = pytest.importorskip("pyarrow")
    table = pa.table({
        "task_id": pa.array(ROWS["task_id"], pa.int32()),
        "label": ROWS["label"],
        "cost": pa.array(list(ROWS["cost"]), pa.float64()),
    })  # fmt: skip
    assert score_predictions(table, PRED) == score_predictions(ROWS, PRED)


def test_evaluate_splits_tasks_by_hardware():
    rows = {
        "task_id": np.array([1, 1, 1, 1]),
        "hardware": np.array(["a", "a", "b", "b"]),
        "label": np.array([1.0, 0.5, 0.5, 1.0]),
        "cost": np.array([1.0, 2.0, 10.0, 5.0]),
    }
    out = score_predictions(rows, [0.0, 1.0, 0.0, 1.0], networks={"net": {1: 1}})
    # (net, a) picks 2 of best 1; (net, b) picks its best
    assert out["top1_score"] == approx(0.75)
    assert out["tasks"] == 2
    assert out["pca"] == approx(0.5)


def test_a_task_with_one_test_program_does_not_count_in_pca():
    # A within-task split leaves small tasks one test program: a model that ranks every pair
    # right scored PCA 0.8 here, the lone task's 0.5 weighed in as if it were a measure.
    rows = {
        "task_id": np.array([1, 1, 1, 1, 2]),
        "label": np.array([1.0, 0.5, 0.25, 0.2, 1.0]),
        "cost": np.array([1.0, 2.0, 4.0, 5.0, 3.0]),
    }
    assert score_predictions(rows, rows["label"])["pca"] == 1.0
    assert score_predictions(rows, -rows["label"])["pca"] == 0.0
    alone = {key: values[4:] for key, values in rows.items()}
    assert math.isnan(score_predictions(alone, [0.3])["pca"])  # no pair: undefined


def test_a_task_whose_programs_all_failed_does_not_count_in_pca():
    # Its pairs all tie at 0, and TenSet's rule credits a tie by row order: the same model
    # scored 0.667 or 0.167 as the failed task's predictions came in one order or the other.
    rows = {
        "task_id": np.array([1, 1, 1, 2, 2, 2]),
        "label": np.array([0.5, 1.0, 0.2, 0.0, 0.0, 0.0]),
        "cost": np.array([2.0, 1.0, 5.0, math.inf, math.inf, math.inf]),
    }
    scores = [score_predictions(rows, [1, 2, 3, *failed])["pca"]
              for failed in ([1, 2, 3], [3, 2, 1])]  # fmt: skip
    assert scores == [approx(1 / 3)] * 2  # task 1 alone: one pair of three right
    failed_only = {key: values[3:] for key, values in rows.items()}
    assert math.isnan(score_predictions(failed_only, [1, 2, 3])["pca"])


def test_evaluate_errors():
    empty = {"task_id": np.array([], int), "label": np.array([]), "cost": np.array([])}
    with pytest.raises(ValueError, match="empty test set"):
        score_predictions(empty, [])
    with pytest.raises(ValueError, match="predictions contain NaN"):
        score_predictions(ROWS, np.r_[PRED[:-1], np.nan])
    with pytest.raises(ValueError, match="5 predictions for 6"):
        score_predictions(ROWS, PRED[:-1])
    with pytest.raises(ValueError, match="no 'cost' column"):
        score_predictions({"task_id": ROWS["task_id"], "label": ROWS["label"]}, PRED)
    with pytest.raises(ValueError, match="none of the 1 networks"):
        score_predictions(ROWS, PRED, networks={"elsewhere": {42: 1}})


# --- splits -------------------------------------------------------------------------------


def test_within_task_tests_the_earliest_programs():
    # task 1: 10 rows -> 9 train, 1 test; task 2: 20 rows -> 18 / 2; task 3: 1 row -> test
    rng = np.random.default_rng(7)
    pid1 = rng.permutation(np.arange(100, 110))
    pid2 = rng.permutation(np.arange(200, 220))
    task = np.r_[np.full(10, 1), np.full(20, 2), [3]]
    pid = np.r_[pid1, pid2, [300]]
    train, test = splits.within_task(task, pid)
    assert sorted(pid[test]) == [100, 200, 201, 300]
    assert train.sum() == 27
    assert np.array_equal(train, ~test)


def test_within_task_per_hardware():
    task = np.ones(20, int)
    hw = np.r_[np.full(10, "a"), np.full(10, "b")]
    pid = np.arange(20)  # every b program measured after every a program
    _, test = splits.within_task(task, pid)
    assert sorted(pid[test]) == [0, 1]
    _, test = splits.within_task(task, pid, hardware=hw)
    assert sorted(pid[test]) == [0, 10]


def test_within_task_empty_sides():
    with pytest.raises(ValueError, match="empty train"):
        splits.within_task([1, 2], [5, 6])  # one row per task: all test
    with pytest.raises(ValueError, match="empty dataset"):
        splits.within_task([], [])
    with pytest.raises(ValueError, match="train_ratio"):
        splits.within_task([1], [1], train_ratio=1.0)


def test_by_task_whole_tasks_and_sizes():
    task = np.repeat(np.arange(10), 10)  # 10 tasks of 10 rows: budget 90 = 9 tasks
    train, test = splits.by_task(task, seed=3)
    assert (train.sum(), test.sum()) == (90, 10)
    assert not set(task[train]) & set(task[test])


def test_by_task_stops_at_the_first_task_past_the_budget():
    # counts 60, 35, 5 (budget 90).  Seed 1 keeps sorted order (documented: a permutation
    # from default_rng(seed) of the sorted ids): 60 trains, 95 > 90 tests, and so does the
    # 5-row task after it even though 65 would fit.
    assert list(np.random.default_rng(1).permutation(3)) == [0, 1, 2]
    task = np.r_[np.full(60, 7), np.full(35, 8), np.full(5, 9)]
    train, test = splits.by_task(task, seed=1)
    assert set(task[train]) == {7}
    assert set(task[test]) == {8, 9}


def test_by_task_is_deterministic_per_seed():
    task = np.repeat(np.arange(20), np.arange(1, 21))
    a = splits.by_task(task, seed=5)
    b = splits.by_task(task, seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    others = [splits.by_task(task, seed=s)[1] for s in range(6, 10)]
    assert any(not np.array_equal(a[1], o) for o in others)


NETS = [["resnet", "bert"], ["resnet", "bert"], ["bert"], ["resnet"], ["mobilenet"], ["bert"]]
NET_TASKS = np.array([1, 1, 2, 3, 4, 2])


def test_by_network_holds_out_every_task_of_the_network():
    train, test = splits.by_network(NETS, ["resnet"])
    # task 1 is also in bert, which trains: it still tests
    assert list(test) == [True, True, False, True, False, False]
    assert not set(NET_TASKS[train]) & set(NET_TASKS[test])
    train, test = splits.by_network(NETS, ["resnet", "mobilenet"])
    assert set(NET_TASKS[train]) == {2}


def test_by_network_task_level_and_pyarrow_column():
    pa = pytest.importorskip("pyarrow")
    nets = [["resnet"], [], ["bert"]]  # task 1's second row lost its network list
    _, test = splits.by_network(nets, ["resnet"], task_id=[1, 1, 2])
    assert list(test) == [True, True, False]
    column = pa.chunked_array([pa.array(NETS, pa.list_(pa.string()))])
    assert np.array_equal(
        splits.by_network(column, ["resnet"])[1], splits.by_network(NETS, ["resnet"])[1]
    )


def test_by_network_errors():
    with pytest.raises(ValueError, match="unknown network"):
        splits.by_network(NETS, ["vgg"])
    with pytest.raises(ValueError, match="empty train"):
        splits.by_network(NETS, ["resnet", "bert", "mobilenet"])
    with pytest.raises(ValueError, match="list of network names"):
        splits.by_network(NETS, "resnet")


def test_by_hardware():
    hw = np.array(["x86", "arm", "x86", "gpu"])
    train, test = splits.by_hardware(hw, ["arm", "gpu"])
    assert list(test) == [False, True, False, True]
    assert list(train) == [True, False, True, False]
    with pytest.raises(ValueError, match="unknown hardware"):
        splits.by_hardware(hw, ["riscv"])
    with pytest.raises(ValueError, match="empty train"):
        splits.by_hardware(hw, ["x86", "arm", "gpu"])


def test_min_records():
    task = np.r_[np.full(48, 1), np.full(47, 2), np.full(50, 3)]
    keep = splits.min_records(task)
    assert set(task[keep]) == {1, 3}
    assert keep.sum() == 98
    hw = np.r_[np.full(24, "a"), np.full(24, "b"), np.full(47, "a"), np.full(50, "a")]
    assert set(task[splits.min_records(task, 25, hardware=hw)]) == {2, 3}
    with pytest.raises(ValueError, match="empty selection"):
        splits.min_records(task, 51)


def test_the_plots_top_k_curve_ranks_each_machines_programs_apart():
    from tensortune.train.plots import top_k_curve

    # Machine a's programs ranked right, b's wrong.  Taken as one task, a's top score hid b's
    # miss: a's best came first and the curve was all 1.
    task, hw = np.array([7, 7, 7, 7]), np.array(["a", "a", "b", "b"])
    pred, label = np.array([0.9, 0.8, 0.3, 0.2]), np.array([1.0, 0.5, 0.2, 1.0])
    assert top_k_curve(task, label, pred, hw, k=3).tolist() == [0.6, 1.0, 1.0]
    assert top_k_curve(task, label, pred, k=3).tolist() == [1.0, 1.0, 1.0]
    # tied scores: the worse program first, as the metrics pick
    assert top_k_curve(np.array([1, 1]), np.array([1.0, 0.5]), np.array([0.5, 0.5]),
                       k=2).tolist() == [0.5, 1.0]  # fmt: skip
    assert top_k_curve(np.array([1]), np.array([0.0]), np.array([0.3])) is None
