"""dataset collect: random + evolved programs per task, on every hardware configuration, resumable,
with each workload's networks recorded."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tensortune.collect import collect  # noqa: E402
from tensortune.compat import tvm  # noqa: E402
from tensortune.errors import TensortuneError  # noqa: E402
from tensortune.hardware import (  # noqa: E402
    CONFIGS,
    HardwareConfig,
    target_key,
)
from tensortune.records import open_records  # noqa: E402
from tensortune.select.samplers import RandomSampler  # noqa: E402
from tensortune.workloads.models import load_model  # noqa: E402
from tensortune.workloads.ops import parse_spec  # noqa: E402

SMALL = [
    HardwareConfig("a", {"kind": "llvm", "num-cores": 2}, "2 cores"),
    HardwareConfig("b", {"kind": "llvm", "num-cores": 1}, "1 core"),
]


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return load_model(Tiny().eval(), example_inputs=(torch.randn(2, 16),),
                      target=tvm.target.Target(SMALL[0].target), name="tiny")  # fmt: skip


def test_collect_fills_every_task_on_every_configuration_and_resumes(tiny, tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    first = collect([tiny], configs=SMALL, programs_per_task=4, records=url,
                    work_dir=tmp_path / "w")  # fmt: skip
    assert first.tasks == len(tiny.tasks)
    with open_records(url) as store:
        sources = store.task_sources("tiny")
        assert {s.task_name for s in sources} == {t.name for t in tiny.tasks}
        counts = {}
        for config in SMALL:
            for s in sources:
                key = (s.workload_id, target_key(config.target))
                counts[key] = store.count(workload_id=key[0], target=key[1])
                assert counts[key] >= 2  # the random half at least; tiny spaces may run dry
        total = store.count()
    again = collect([tiny], configs=SMALL, programs_per_task=4, records=url,
                    work_dir=tmp_path / "w")  # fmt: skip
    with open_records(url) as store:
        assert store.count() == total + again.measured
        # A rerun only tops tasks up: a full task is not measured again.
        assert again.measured <= sum(max(0, 4 - n) for n in counts.values())
        for (wid, target), n in counts.items():
            if n >= 4:
                assert store.count(workload_id=wid, target=target) == n


def test_random_sampler_never_repeats_a_measured_program():
    mod = parse_spec("matmul:32,32,32").to_module()
    from conftest import platform

    target = platform({"kind": "llvm", "num-cores": 2})
    sampler = RandomSampler()
    first = sampler.sample(mod, target, 6, seed=0, exclude=set())
    from tensortune.records.convert import trace_text

    seen = {trace_text(c.sch.trace) for c in first}
    assert len(seen) == len(first) == 6
    second = sampler.sample(mod, target, 6, seed=0, exclude=seen)
    assert not seen & {trace_text(c.sch.trace) for c in second}


def test_the_shipped_configurations_differ_in_isa_and_threads():
    a, b = CONFIGS["avx512-2c"], CONFIGS["avx2-1c"]
    assert (a.threads, b.threads) == (2, 1)
    assert a.target["mcpu"] != b.target["mcpu"]
    with pytest.raises(TensortuneError, match="unknown hardware configuration"):
        collect(["gpt2-block"], configs=["no-such-config"], records="sqlite:///:memory:")


def test_a_selector_collects_its_budget_in_rounds_and_resumes(tiny, tmp_path):
    from tensortune.collect.active import collect_active

    url = f"sqlite:///{tmp_path / 'a.db'}"
    steps = []
    first = collect_active([tiny], config=SMALL[0], selector="balto", budget=4, rounds=2,
                           records=url, work_dir=tmp_path / "w", progress=steps.append)  # fmt: skip
    key = target_key(SMALL[0].target)
    with open_records(url) as store:
        counts = {s.task_name: store.count(workload_id=s.workload_id, target=key)
                  for s in store.task_sources("tiny")}  # fmt: skip
        assert all(2 <= n <= 4 for n in counts.values()), counts  # tiny spaces may run dry
        assert first.measured == sum(counts.values()) == store.count()
        assert all(r.run_id.startswith("collect-balto-") for r in store.query())
    assert [s.have for s in steps][:1] == [0] and max(s.have for s in steps) >= 2
    # After a round there is a model to choose with.
    from tensortune.collect.active import _Features, _fit
    from tensortune.costmodel.gbdt import XGBoostModel
    from tensortune.hardware import resolve_platform

    platform = resolve_platform(SMALL[0].target)
    with open_records(url) as store:
        by_name = {t.name: t for t in tiny.tasks}
        feats = {s.workload_id: _Features(by_name[s.task_name], platform)
                 for s in store.task_sources("tiny")}  # fmt: skip
        assert _fit(XGBoostModel, store, platform, feats, 0).fitted
    # A larger budget tops every task up; the same budget again measures nothing.
    more = collect_active([tiny], config=SMALL[0], selector="balto", budget=6, rounds=2,
                          records=url, work_dir=tmp_path / "w")  # fmt: skip
    again = collect_active([tiny], config=SMALL[0], selector="balto", budget=6, rounds=2,
                           records=url, work_dir=tmp_path / "w")  # fmt: skip
    assert more.measured > 0 and again.measured == 0
    # Another selector on the same store would find its budget met by balto's picks.
    with open_records(url) as store:
        before = store.count()
    with pytest.raises(TensortuneError, match="not made by sampler uncertainty"):
        collect_active([tiny], config=SMALL[0], selector="uncertainty", budget=6, rounds=2,
                       records=url, work_dir=tmp_path / "w")  # fmt: skip
    # So would a plain collection (it measured none of its random programs there).
    with pytest.raises(TensortuneError, match="not made by a plain collection"):
        collect([tiny], configs=SMALL[:1], programs_per_task=8, records=url,
                work_dir=tmp_path / "w")  # fmt: skip
    with open_records(url) as store:
        assert store.count() == before
    # balto-weighted's run ids begin as balto's do: they are not balto's own either.
    other = f"sqlite:///{tmp_path / 'w.db'}"
    collect_active([tiny], config=SMALL[0], selector="balto-weighted", budget=1, rounds=1,
                   records=other, work_dir=tmp_path / "w")  # fmt: skip
    with pytest.raises(TensortuneError, match="not made by sampler balto;"):
        collect_active([tiny], config=SMALL[0], selector="balto", budget=2, rounds=1,
                       records=other, work_dir=tmp_path / "w")  # fmt: skip
    with pytest.raises(TensortuneError, match="unknown selector"):
        collect_active([tiny], config=SMALL[0], selector="nosuch", records=url)
    # One name is one network, not a list of its letters (as collect takes it).
    with pytest.raises(TensortuneError, match="unknown network 'nosuch-net'"):
        collect_active("nosuch-net", config=SMALL[0], records=url)


def test_a_selectors_collection_stops_after_the_batch_in_flight(monkeypatch):
    """Ctrl-C once: what is measured is recorded, and no further batch is measured."""
    from tensortune import errors
    from tensortune.collect.active import _measure
    from tensortune.records import convert

    monkeypatch.setattr(convert, "measured_records", lambda batch, *a, **k: list(batch))
    added: list = []

    class Session:
        def measure(self, batch):
            errors._interrupted.set()  # what the first Ctrl-C leaves (errors.interruptible)
            return [None] * len(batch), [None] * len(batch)

    class Store:
        def add(self, records):
            added.extend(records)

    try:
        with pytest.raises(KeyboardInterrupt):
            _measure(Store(), Session(), list(range(64)), {}, "run")
    finally:
        errors._interrupted.clear()
    assert added == list(range(16))  # the first batch of 16, recorded; none after it


def test_every_configuration_is_checked_before_a_selector_measures(cli, tmp_path):
    db = tmp_path / "r.db"
    code, _, err = cli("dataset", "collect", "-w", "softmax:128,768", "--sampler", "balto",
                       "--config", "avx2-1c", "--config", "nosuch", "--records",
                       f"sqlite:///{db}", "--work-dir", str(tmp_path / "w"))  # fmt: skip
    assert code == 2 and "unknown hardware configuration 'nosuch'" in err, err
    assert len(err.strip().splitlines()) == 1
    assert not db.exists()  # nothing measured for avx2-1c first


def test_a_setting_out_of_range_is_refused_whichever_sampler_reads_it(cli, tmp_path):
    db = tmp_path / "r.db"
    for args, param in ((("--sampler", "balto", "--evolved-share", "7"), "--evolved-share"),
                        (("--rounds", "-3"), "--rounds")):  # fmt: skip
        code, _, err = cli("dataset", "collect", "-w", "softmax:128,768", *args, "--records",
                           f"sqlite:///{db}", "--work-dir", str(tmp_path / "w"))  # fmt: skip
        assert code == 2 and param in err and len(err.strip().splitlines()) == 1, err
    assert not db.exists()


def test_collection_can_keep_the_heaviest_tasks_and_leave_out_a_held_out_network(tiny):
    from tensortune.collect.programs import chosen_tasks

    by_net = {"tiny": tiny.tasks}
    heaviest = chosen_tasks(by_net, heaviest=1)["tiny"]
    assert heaviest == [max(tiny.tasks, key=lambda t: t.flop)]
    with pytest.raises(TensortuneError, match="every task occurs in an excluded network"):
        chosen_tasks(by_net, exclude={"same": tiny.tasks})
    with pytest.raises(TensortuneError, match="must be positive"):
        chosen_tasks(by_net, heaviest=0)
    assert chosen_tasks(by_net) == by_net  # the model's own order when nothing is asked


def test_standalone_operators_are_collected_as_the_network_ops(tiny, tmp_path):
    url = f"sqlite:///{tmp_path / 'o.db'}"
    specs = ["softmax:4,16", "layernorm:4,16"]
    # Random programs only: where a task comes from is tested, not how its programs are found.
    result = collect(workloads=specs, configs=SMALL[:1], programs_per_task=2, records=url,
                     work_dir=tmp_path / "w", evolved_share=0)  # fmt: skip
    assert result.tasks == 2  # only the operators: no --network means none, not the whole zoo
    with open_records(url) as store:
        assert {s.task_name for s in store.task_sources("ops")} == set(specs)
        assert store.count() == result.measured >= 2
    # beside a network, each keeps its own name
    collect([tiny], workloads=specs[:1], configs=SMALL[:1], programs_per_task=2, records=url,
            work_dir=tmp_path / "w", evolved_share=0)  # fmt: skip
    with open_records(url) as store:
        assert {s.task_name for s in store.task_sources("tiny")} == {t.name for t in tiny.tasks}
    with pytest.raises(TensortuneError, match="workloads"):
        collect(workloads=["softmax:4"], configs=SMALL[:1], records=url)


def test_a_collection_naming_no_configuration_takes_those_this_cpu_runs(monkeypatch, cli, tmp_path):
    # On an AVX2-only CPU (a Zen 3) the default named avx512-2c, and every `dataset collect`
    # without --config was refused.
    from tensortune.collect import DEFAULT_CONFIGS, default_configs
    from tensortune.hardware import get_config, target

    avx2_only = target.target_isa(get_config("avx2-1c").target)  # a haswell's
    monkeypatch.setattr(target, "cpu_isa", lambda: avx2_only)
    assert default_configs() == ["avx2-1c"]
    monkeypatch.setattr(target, "cpu_isa", lambda: set())
    assert default_configs() == []
    with pytest.raises(TensortuneError, match="avx512-2c, avx2-1c, this CPU runs none"):
        collect(["resnet18"])
    for sampler in ((), ("--sampler", "balto")):  # a selector's collection raised IndexError
        code, _, err = cli("dataset", "collect", "--network", "resnet18", *sampler,
                           "--records", f"sqlite:///{tmp_path / 'c.db'}")  # fmt: skip
        assert code == 2 and "this CPU runs none" in err and len(err.strip().splitlines()) == 1, err
    assert DEFAULT_CONFIGS == ("avx512-2c", "avx2-1c")


def test_a_plain_collection_counts_older_collections_and_imports_as_its_own():
    # Collections before 7c76140 measured their evolved share through tune (12 hex digits):
    # the shipped data/collect store holds such rows, and topping it up must not be refused.
    from tensortune.collect.programs import PLAIN_RUN

    for own in ("collect-0123abcd", "0123456789ab", ""):
        assert PLAIN_RUN.fullmatch(own), own
    for other in ("collect-balto-0123abcd", "transfer-0123abcd", "collect-0123abc"):
        assert not PLAIN_RUN.fullmatch(other), other


def _named_filler(store, record, tmp_path, monkeypatch, measured: list, n: int):
    """A ``_Filler`` of ``record``'s task whose programs are names (``p{seed}-{i}``), measured
    into ``measured`` without TVM, ``n`` random programs a task."""
    import importlib
    from types import SimpleNamespace

    import tensortune.records.convert as convert

    programs = importlib.import_module("tensortune.collect.programs")  # `collect` is a function
    monkeypatch.setattr(programs, "candidate_hash", str)
    monkeypatch.setattr(convert, "measured_records", lambda *a, **k: [])
    hardware = SimpleNamespace(id=record.hardware_id)
    session = SimpleNamespace(
        platform=SimpleNamespace(hardware=hardware, key=record.target),
        measure=lambda batch: (measured.extend(batch), (None, None))[1],
    )
    sampler = SimpleNamespace(sample=lambda mod, platform, n, seed, exclude:
                              [f"p{seed}-{i}" for i in range(n)])  # fmt: skip
    return programs._Filler(store, session, sampler, want=n, n_random=n, work=tmp_path, seed=0)


def test_collectors_share_the_random_share_and_lease_a_batch_for_as_long_as_it_takes(
    tmp_path, monkeypatch
):
    """A collector arriving later samples other random programs than the first (its seed
    follows the count): leases alone let both measure a full share.  And a batch's lease
    must outlast the batch, or a third collector takes the same programs over."""
    from types import SimpleNamespace

    from conftest import make_records

    from tensortune.search.leases import LEASE_SECONDS_PER_CANDIDATE

    store = open_records(f"sqlite:///{tmp_path / 'r.db'}")
    done = make_records(store, "matmul:16,16,16", [1e-3, 2e-3])
    store.add(done)
    wid, hw, tgt = done[0].workload_id, done[0].hardware_id, done[0].target
    store.claim(wid, hw, tgt, ["x1", "x2"], worker="remote-host/1/1/x", seconds=600)  # in flight
    leases, measured = [], []
    claim = store.claim
    monkeypatch.setattr(store, "claim", lambda *a, **k: (leases.append(k["seconds"]),
                                                          claim(*a, **k))[1])  # fmt: skip
    filler = _named_filler(store, done[0], tmp_path, monkeypatch, measured, 16)
    evolved = []
    monkeypatch.setattr(filler, "_evolve", lambda *a: evolved.append(a) or 0)
    filler.fill(wid, SimpleNamespace(mod=None), lambda have: None)
    assert len(measured) == 16 - 2 - 2  # what the records and the other's leases leave
    assert not evolved  # the rest of the random share is the other's: not evolved over
    assert leases == [14 * LEASE_SECONDS_PER_CANDIDATE]  # one batch of the 14 sampled
    store.close()


def test_a_collector_killed_mid_batch_leaves_no_lease_that_keeps_its_rerun_short(
    tmp_path, monkeypatch
):
    """The random share claims directly: a killed collector's leases held its batch's
    programs for 1,600 s, and the rerun measured the rest of the share less that batch."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from conftest import make_records

    from tensortune.search import leases

    store = open_records(f"sqlite:///{tmp_path / 'r.db'}")
    done = make_records(store, "matmul:16,16,16", [1e-3, 2e-3])
    store.add(done)
    wid, hw, tgt = done[0].workload_id, done[0].hardware_id, done[0].target
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    dead = f"{leases._machine()}/{ended}/1/abcdef/t"  # killed here, mid-batch
    store.claim(wid, hw, tgt, ["p2-0", "p2-1", "p2-2"], worker=dead, seconds=1600)
    measured: list[str] = []
    filler = _named_filler(store, done[0], tmp_path, monkeypatch, measured, 8)
    monkeypatch.setattr(filler, "_evolve", lambda *a: 0)
    filler.fill(wid, SimpleNamespace(mod=None), lambda have: None)
    assert measured == [f"p2-{i}" for i in range(6)]  # the whole rest of the share
    store.close()
