"""Shared fixtures: a small CPU target and records made from real sampled schedules."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

TARGET = {"kind": "llvm", "num-cores": 2}

# A stand-in for a machine that is not this one: its records must never be used here.
OTHER_HW_FIELDS = {
    "cpu_model": "Other CPU 9000 (test)",
    "arch": "riscv64",
    "cores": 64,
    "isa": ("sve2",),
    "caches": {"L1d": 65536},
}


@pytest.fixture(autouse=True, scope="session")
def _a_cache_of_the_suites_own(tmp_path_factory: pytest.TempPathFactory):
    """What tensortune keeps in the user's cache (the machine's speeds, timed here under the
    suite's load; the zoo's task counts) goes to a directory of the suite's own."""
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if before is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = before


def pytest_configure(config: pytest.Config) -> None:
    _share_shipped_datasets()


_SHIPPED_READS: dict = {}


def _share_shipped_datasets() -> None:
    """Tests read the shipped datasets (tens of thousands of programs, about 1.5 s a read)
    some forty times: each is read, checked and decoded once for the session, and every
    caller gets columns of its own (the rows' lists in them are shared; nothing writes them).
    The feature arrays they share are read-only, so a caller that wrote into them fails here
    instead of changing what later tests read.  Datasets elsewhere (the ones tests write and
    damage) are read every time."""
    import copy

    import numpy as np

    from tensortune.datasets import shipped
    from tensortune.train import trainer

    read = trainer.dataset_columns
    data = shipped._DATA.resolve()

    def dataset_columns(dataset: str | Path, *, param: str = "dataset") -> tuple[dict, dict]:
        directory = shipped.dataset_path(dataset).resolve()
        if directory.parent != data:
            return read(dataset, param=param)
        if directory not in _SHIPPED_READS:
            if len(_SHIPPED_READS) >= 2:  # a few hundred MB each
                _SHIPPED_READS.pop(next(iter(_SHIPPED_READS)))
            columns, card = read(dataset, param=param)
            for value in columns.values():
                for row in value if isinstance(value, list) else [value]:
                    if isinstance(row, np.ndarray):
                        row.flags.writeable = False
            _SHIPPED_READS[directory] = columns, card
        columns, card = _SHIPPED_READS[directory]
        mine = {k: v.copy() if isinstance(v, np.ndarray) else list(v) for k, v in columns.items()}
        return mine, copy.deepcopy(card)

    trainer.dataset_columns = dataset_columns


# ``cli(*args)`` runs a command line the way the ``tensortune`` script does, in this process:
# (exit status, stdout, stderr).
Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(capfd: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Cli:
    from tensortune.cli.app import run

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")  # tables whole, whatever terminal runs the tests
    monkeypatch.delenv("TENSORTUNE_DEBUG", raising=False)
    capfd.readouterr()

    def call(*args: str) -> tuple[int, str, str]:
        code = run(list(args))
        out, err = capfd.readouterr()
        return code, out, err

    return call


@pytest.fixture(scope="session")
def postgres_server():
    """One real PostgreSQL server for the whole run (``postgres_server.py``)."""
    import os

    import postgres_server as pg

    if not pg.available():
        if os.environ.get("TENSORTUNE_REQUIRE_POSTGRES"):
            pytest.fail("TENSORTUNE_REQUIRE_POSTGRES is set but initdb/pg_ctl are not on PATH")
        pytest.skip("PostgreSQL (initdb, pg_ctl) is not installed")
    server = pg.start_server()
    yield server
    pg.stop_server(server)


@pytest.fixture
def postgres_url(postgres_server) -> str:
    """The URL of a new, empty database on the test server (with its password in it)."""
    return postgres_server.new_database()


@pytest.fixture
def target() -> dict:
    return dict(TARGET)


def platform(target: dict | None = None):
    """The ``Platform`` of a target (default: ``TARGET``) on this machine."""
    return _platform(json.dumps(target or TARGET, sort_keys=True))


@functools.cache
def _platform(text: str):
    from tensortune.hardware import resolve_platform

    return resolve_platform(json.loads(text))


@functools.cache
def _sampled(spec: str, count: int, seed: int) -> tuple:
    from tensortune.search.space import sample_candidates
    from tensortune.workloads.ops import parse_spec

    mod = parse_spec(spec).to_module()
    return mod, tuple(sample_candidates(mod, platform(), count, seed=seed))


def sampled(spec: str, count: int = 4, *, seed: int = 0) -> tuple:
    """``(module, candidates)`` of an operator spec; cached for the whole session."""
    mod, cands = _sampled(spec, count, seed)
    assert len(cands) == count, f"{spec}: only {len(cands)} distinct candidates"
    return mod, list(cands)


def trace_text(cand) -> str:
    from tensortune.records.convert import to_plain

    return json.dumps(to_plain(cand.sch.trace.as_json(remove_postproc=False)))


def args_text(cand) -> str:
    from tensortune.records.convert import to_plain

    return json.dumps([to_plain(a.as_json()) for a in cand.args_info])


def other_hardware():
    from tensortune.hardware import Hardware

    return Hardware(**OTHER_HW_FIELDS)


def make_records(
    store,
    spec: str,
    costs: Sequence[float | None],
    *,
    hardware=None,
    target: dict | None = None,
    seed: int = 0,
    name: str | None = None,
) -> list:
    """Records of ``len(costs)`` distinct sampled schedules of ``spec``, serialized the way
    ``RecordToStore`` does it; a ``None`` cost makes a failed (run_error) record.

    Registers the hardware (default: this machine) and the workload; returns the records
    (not yet added to the store).
    """
    from tensortune.compat import TVM_VERSION
    from tensortune.hardware import current_hardware, target_key
    from tensortune.records.schema import Record

    mod, cands = sampled(spec, len(costs), seed=seed)
    hw_id = store.register_hardware(hardware or current_hardware())
    wid = store.workload_id(mod, name or spec)
    tkey = target_key(target or TARGET)
    out = []
    for cand, cost in zip(cands, costs, strict=True):
        ok = cost is not None
        out.append(
            Record(
                workload_id=wid,
                hardware_id=hw_id,
                target=tkey,
                trace=trace_text(cand),
                args_info=args_text(cand),
                run_secs=(cost, cost * 1.1, cost * 0.9) if ok else (),
                status="ok" if ok else "run_error",
                error=None if ok else "[run_error] fake failure",
                run_id="test",
                tvm_version=TVM_VERSION,
                created_at=1.0,
            )
        )
    return out


def fill(store, spec: str, costs: Sequence[float | None], **kwargs) -> list:
    """``make_records`` and add them to the store."""
    records = make_records(store, spec, costs, **kwargs)
    store.add(records)
    return records


_AFFINITY = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None


@pytest.fixture(autouse=True)
def _cpu_affinity_restored():
    """A test that runs TVM in this process outside ``affinity_kept`` leaves this thread
    pinned to one core; the servers and CLI runs later tests start would inherit it."""
    yield
    if _AFFINITY is not None and os.sched_getaffinity(0) != _AFFINITY:
        os.sched_setaffinity(0, _AFFINITY)
