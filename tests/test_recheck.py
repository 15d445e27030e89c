"""dataset recheck: timings on whole scheduler ticks or with repeats far apart are found, and
re-measured here or dropped; labels follow, the card says what changed."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import make_records, other_hardware

from tensortune.datasets.build import build_dataset, read_card
from tensortune.datasets.recheck import TICK_EXCESS, find_suspects, recheck_dataset
from tensortune.errors import TensortuneError
from tensortune.hardware import current_hardware
from tensortune.records import open_records
from tensortune.train.trainer import dataset_columns


def _columns(secs_by_hw: dict[str, list[list[float]]]) -> dict:
    rows = [(hw, s) for hw, all_secs in secs_by_hw.items() for s in all_secs]
    return {"hardware": [hw for hw, _ in rows], "run_secs": [s for _, s in rows],
            "cost": [float(np.median(s)) if s else None for _, s in rows]}  # fmt: skip


def test_ticks_count_only_where_they_are_far_more_common_than_chance():
    rng = np.random.default_rng(0)
    clean = [list(np.full(3, c) * rng.uniform(0.995, 1.005, 3))
             for c in rng.uniform(1e-5, 0.05, 400)]  # fmt: skip
    on_ticks = [[0.008, 0.008, 0.00799], [0.012, 0.01199, 0.012]]
    # 40 inflated rows among 400 clean ones on "busy"; the same 2 on "quiet" are chance.
    cols = _columns({"busy": clean + on_ticks * 20, "quiet": clean + on_ticks,
                     "noisy": [[1e-4, 1e-4, 3e-4], [1e-4, 1.1e-4, 1e-4]]})  # fmt: skip
    found = find_suspects(cols)
    busy = [i for i, h in enumerate(cols["hardware"]) if h == "busy"]
    assert sorted(i for i in found if cols["hardware"][i] == "busy") == busy[400:]
    assert all(found[i] == "tick" for i in busy[400:])
    assert not any(cols["hardware"][i] == "quiet" for i in found)
    assert [found.get(i) for i, h in enumerate(cols["hardware"]) if h == "noisy"] == [
        "spread", None]  # fmt: skip
    assert 2 / 402 < TICK_EXCESS < 40 / 440


@pytest.fixture
def ticked(tmp_path):
    """A dataset of real matmul schedules: 8 measured here with tick-inflated repeats, 8 with
    clean ones, and 8 from another machine with inflated repeats."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with open_records(url) as store:
        records = make_records(store, "matmul:16,16,16", [1e-5] * 16, seed=3)
        records += make_records(store, "matmul:16,16,16", [1e-5] * 8, seed=4,
                                hardware=other_hardware())  # fmt: skip
        ticks = [(0.004 * (1 + i % 3),) * 3 for i in range(8)]
        clean = [(2e-5 * (1 + i), 2.02e-5 * (1 + i), 1.99e-5 * (1 + i)) for i in range(8)]
        store.add([dataclasses.replace(r, run_secs=s)
                   for r, s in zip(records, ticks + clean + ticks, strict=True)])  # fmt: skip
    build_dataset(url, tmp_path / "d")
    return tmp_path / "d"


@pytest.fixture(params=["quiet", "busy"])
def guard_says(request, monkeypatch) -> str:
    """What the runner's contention guard reports for every re-timing: the CPU was free, or
    taken throughout (the timings themselves are real either way)."""
    from tensortune.measure.runner import PersistentRunner

    run = PersistentRunner.run

    def reported(self, inputs):
        futures = run(self, inputs)
        self.last_contended = [request.param == "busy"] * len(futures)
        return futures

    monkeypatch.setattr(PersistentRunner, "run", reported)
    return request.param


def test_recheck_remeasures_what_was_measured_here_and_drops_the_rest(ticked, tmp_path,
                                                                       guard_says):  # fmt: skip
    report = recheck_dataset(ticked, tmp_path / "out")
    mine = current_hardware().id[:8]
    here, elsewhere = sorted(report["hardware"].items(), key=lambda kv: mine not in kv[0])
    here, elsewhere = here[1], elsewhere[1]
    retimed = here["remeasured"]
    assert here["tick"] == 8 and here["dropped"] == 8 - retimed
    if guard_says == "busy":
        assert retimed == 0  # a contended re-timing is no repair
    else:  # a re-timing whose own repeats lie far apart is dropped too (a noisy machine)
        assert retimed >= 1
    assert (elsewhere["tick"], elsewhere["remeasured"], elsewhere["dropped"]) == (8, 0, 8)
    columns, card = dataset_columns(tmp_path / "out")
    assert len(columns["cost"]) == 8 + retimed
    assert max(columns["cost"]) < 1e-3  # no tick-inflated cost is left
    assert max(columns["label"]) == 1.0 and min(columns["label"]) > 0
    assert card["recheck"][-1] == json.loads(json.dumps(report))
    assert "recheck" in card["description"]
    if retimed:  # milliseconds stored, microseconds re-measured
        assert here["median_old_over_new"] > 50


def test_a_killed_recheck_resumes_without_measuring_again(ticked, tmp_path, monkeypatch):
    import tensortune.datasets.recheck as recheck
    import tensortune.measure.batch as batch

    monkeypatch.setattr(recheck, "BATCH", 4)  # the 8 rows measured here: two batches
    real, measured = batch.measure_batch, []

    def killed_at_the_second(builder, runner, cands, platform):
        measured.append(len(cands))
        if len(measured) == 2:
            raise KeyboardInterrupt
        return real(builder, runner, cands, platform)

    monkeypatch.setattr(batch, "measure_batch", killed_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        recheck_dataset(ticked, tmp_path / "out")
    journal = tmp_path / "out" / recheck.JOURNAL
    lines = journal.read_text().splitlines()
    assert len(lines) == 1 + 4  # its header and the first batch
    journaled = {e["program_id"]: e["secs"] for e in map(json.loads, lines[1:])
                 if e["secs"] is not None}  # fmt: skip
    assert not (tmp_path / "out" / "card.json").exists()
    measured.clear()
    monkeypatch.setattr(batch, "measure_batch", lambda *a: (measured.append(len(a[2])),
                                                            real(*a))[1])  # fmt: skip
    report = recheck_dataset(ticked, tmp_path / "out")
    assert measured == [4]  # only the batch the kill stopped
    assert not journal.exists()
    here = next(v for k, v in report["hardware"].items() if current_hardware().id[:8] in k)
    assert here["tick"] == 8 and here["remeasured"] + here["dropped"] == 8
    # The journal's re-timings are used, not dropped nor measured again.
    columns, _ = dataset_columns(tmp_path / "out")
    cost = dict(zip(columns["program_id"], columns["cost"], strict=True))
    for pid, secs in journaled.items():
        assert cost[pid] == pytest.approx(float(np.median(secs)))
    # A journal of another table is not believed: everything is measured.
    (tmp_path / "out2").mkdir()
    (tmp_path / "out2" / recheck.JOURNAL).write_text(
        '{"table": "another"}\n{"program_id": 1, "secs": [1e-05]}\n'
    )
    measured.clear()
    recheck_dataset(ticked, tmp_path / "out2")
    assert measured == [4, 4]


def test_drop_only_keeps_the_clean_rows_and_refuses_to_overwrite(ticked, tmp_path):
    report = recheck_dataset(ticked, tmp_path / "out", remeasure=False)
    assert sum(r["dropped"] for r in report["hardware"].values()) == 16
    columns, _ = dataset_columns(tmp_path / "out")
    assert len(columns["cost"]) == 8 and read_card(tmp_path / "out").data["programs"] == 8
    with pytest.raises(TensortuneError, match="overwrite its own dataset"):
        recheck_dataset(ticked, ticked)


def test_cli_recheck(ticked, tmp_path, cli):
    code, out, err = cli("dataset", "recheck", "--dataset", str(ticked), "--out",
                         str(tmp_path / "o"), "--drop-only", "--json")  # fmt: skip
    assert code == 0, err
    assert sum(r["tick"] for r in json.loads(out)["hardware"].values()) == 16
    code, _, err = cli("dataset", "recheck", "--dataset", str(tmp_path / "nope"), "--out",
                       str(tmp_path / "o2"))  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1, err
