"""The PostgreSQL records store on a real server (``postgres_server.py``): what differs from
SQLite (the store's own tests run on both, in ``test_records.py``), copies between any two URLs,
passwords kept out of every output, and two tuners sharing one database and one budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from conftest import Cli, fill, make_records
from postgres_server import PASSWORD

from tensortune.errors import RecordsError
from tensortune.records import open_records
from tensortune.records.schema import SCHEMA_VERSION

MM = "matmul:16,16,16"
SM = "softmax:4,8"


def _sql(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def test_the_password_never_shows(postgres_url: str, cli: Cli) -> None:
    with open_records(postgres_url) as store:
        assert PASSWORD not in store.url and "***" in store.url
        fill(store, MM, [1e-3])
    code, out, err = cli("records", "stats", "--records", postgres_url, "--json")
    assert code == 0 and PASSWORD not in out + err
    assert json.loads(out)["records"] == 1
    code, out, err = cli("records", "stats", "--records", postgres_url)
    assert code == 0 and PASSWORD not in out + err and "***" in out
    wrong = postgres_url.replace(PASSWORD, PASSWORD + "-wrong")
    code, out, err = cli("records", "stats", "--records", wrong)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: --records:")
    assert "password authentication failed" in err and PASSWORD not in err


def test_a_password_libpq_reads_otherwise_than_urlsplit_never_shows(postgres_server,
                                                                     cli: Cli) -> None:  # fmt: skip
    """libpq reads the user part up to the first ``@`` or ``/`` and takes ``password=`` from
    the query; ``urlsplit`` read ``u:1234#x@h`` as no password, ``u:pa#ss@h`` as a host
    ``u`` with a port ``pa`` (its message showed ``pa``), and ignored the query."""
    from tensortune.records.postgres import redact

    for secret in ("1234#x9", "pa#s?s"):
        admin = postgres_server.new_database()  # the role owns the database's schema
        port, database = admin.split("@127.0.0.1:")[1].split("/")
        role = "r" + secret[:2].replace("#", "h") + "x"
        _sql(admin, f"DROP ROLE IF EXISTS {role}", f"CREATE ROLE {role} LOGIN PASSWORD "
             f"'{secret}'", f"ALTER SCHEMA public OWNER TO {role}")  # fmt: skip
        for url in (
            f"postgresql://{role}:{secret}@127.0.0.1:{port}/{database}",
            f"postgresql://127.0.0.1:{port}/{database}?user={role}&password={secret}",
        ):
            assert secret not in redact(url) and "***" in redact(url)
            with open_records(url) as store:  # libpq connects with it
                assert secret not in store.url
            wrong = url.replace(secret, secret + "-wrong")
            code, out, err = cli("records", "stats", "--records", wrong)
            assert code == 2 and err.count("\n") == 1 and "password authentication" in err
            assert secret not in out + err and "wrong" not in out + err


def test_run_times_read_back_whole_whatever_the_servers_float_digits(postgres_url: str):
    """At ``extra_float_digits`` 0 the server sent 15 digits: every record whose cost is not
    exactly the median of its times read as damaged."""
    database = postgres_url.rsplit("/", 1)[1]
    _sql(postgres_url, f"ALTER DATABASE {database} SET extra_float_digits = 0")
    with open_records(postgres_url) as store:
        (added,) = fill(store, MM, [1.2345678901234567e-05])
        (got,) = store.query()
    assert got.run_secs == added.run_secs and got.cost == added.cost


def test_a_server_that_is_not_there_is_one_line(cli: Cli) -> None:
    code, _, err = cli("records", "stats", "--records", "postgresql://u:sekrit@127.0.0.1:1/db")
    assert code == 2 and err.count("\n") == 1 and "cannot connect" in err
    assert "sekrit" not in err


def test_a_database_of_another_application_is_refused(postgres_url: str) -> None:
    _sql(postgres_url, "CREATE TABLE records (id int)")
    with pytest.raises(RecordsError, match="another application"):
        open_records(postgres_url)
    with psycopg.connect(postgres_url) as conn:  # and left as it was
        tables = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        assert [t for (t,) in tables] == ["records"]


def test_a_newer_schema_is_refused(postgres_url: str) -> None:
    open_records(postgres_url).close()
    _sql(postgres_url, f"UPDATE meta SET value = '{SCHEMA_VERSION + 1}' "
                       "WHERE key = 'schema_version'")  # fmt: skip
    with pytest.raises(RecordsError, match=f"schema v{SCHEMA_VERSION + 1}.*upgrade tensortune"):
        open_records(postgres_url)


def _downgrade_to_v3(url: str) -> None:
    """Make a store as tensortune wrote it at schema v3: no ``records.origin``."""
    _sql(url, "ALTER TABLE records DROP COLUMN origin",
         "UPDATE meta SET value = '3' WHERE key = 'schema_version'")  # fmt: skip


def _schema(url: str) -> tuple[str, int]:
    """The version ``meta`` states and how many ``origin`` columns ``records`` has."""
    with psycopg.connect(url) as conn:
        (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'"
                                  ).fetchone()  # fmt: skip
        (columns,) = conn.execute(
            "SELECT count(*) FROM information_schema.columns "
            "WHERE table_name = 'records' AND column_name = 'origin'"
        ).fetchone()
    return version, columns


def test_a_version_3_store_is_upgraded_in_place(postgres_url: str) -> None:
    import dataclasses

    with open_records(postgres_url) as store:
        fill(store, MM, [1e-3, None])
        before = [(r.uid, r.cost, r.status) for r in store.query()]
    _downgrade_to_v3(postgres_url)
    assert _schema(postgres_url) == ("3", 0)
    with open_records(postgres_url) as store:
        assert [(r.uid, r.cost, r.status, r.origin) for r in store.query()] == [
            (*b, "") for b in before
        ]
        origin = json.dumps({"kind": "transfer", "from": "sqlite:///elsewhere.db", "uid": "x"})
        (new,) = make_records(store, SM, [2e-3])
        store.add([dataclasses.replace(new, origin=origin)])
        assert [r.origin for r in store.query()] == ["", "", origin]
    assert _schema(postgres_url) == (str(SCHEMA_VERSION), 1)


def test_processes_opening_a_version_3_store_at_once_upgrade_it_once(postgres_url: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with open_records(postgres_url) as store:
        fill(store, MM, [1e-3])
    _downgrade_to_v3(postgres_url)

    def open_and_count(_: int) -> int:
        with open_records(postgres_url) as store:
            return store.count()

    # Threads, each with its own connection: the server sees separate sessions racing.
    with ThreadPoolExecutor(6) as pool:
        assert list(pool.map(open_and_count, range(6))) == [1] * 6
    assert _schema(postgres_url) == (str(SCHEMA_VERSION), 1)


def test_a_version_2_store_is_refused(postgres_url: str) -> None:
    open_records(postgres_url).close()
    _sql(postgres_url, "UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    with pytest.raises(RecordsError, match="unknown old records schema v2"):
        open_records(postgres_url)
    assert _schema(postgres_url) == ("2", 1)  # left as it was


def test_reading_an_empty_database_writes_nothing(postgres_url: str) -> None:
    from tensortune.errors import NoStoreError

    # not there yet, as a missing SQLite file: the torch backend builds untuned on it
    with pytest.raises(NoStoreError, match="no tensortune records store"):
        open_records(postgres_url, create=False)
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
                            ).fetchone() == (0,)  # fmt: skip


def test_transactions_read_committed_whatever_the_server_default(postgres_url: str) -> None:
    """A claim must see what other workers committed while it waited on their locks: under a
    server default of SERIALIZABLE, colliding claims and commits failed the run instead."""
    db = postgres_url.rsplit("/", 1)[1].split("?")[0]
    _sql(postgres_url, f"ALTER DATABASE {db} SET default_transaction_isolation = 'serializable'")
    try:
        with open_records(postgres_url) as store:
            level = store._write(lambda cur: cur.execute("SHOW transaction_isolation").fetchone())
            assert level == ("read committed",)
    finally:
        _sql(postgres_url, f"ALTER DATABASE {db} RESET default_transaction_isolation")


def test_a_transaction_aborted_for_a_conflict_is_run_again(postgres_url: str) -> None:
    from tensortune.records import postgres

    def aborted(conflict: type, times: int):
        """A transaction that another one wins against ``times`` times, and how often it ran."""
        runs: list = []

        def write(cur):
            runs.append(cur.execute("SELECT 1").fetchone())
            if len(runs) <= times:
                raise conflict("aborted: a conflict with another transaction")
            return "committed"

        return write, runs

    with open_records(postgres_url) as store:
        for conflict in (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
            write, runs = aborted(conflict, 2)
            assert store._write(write) == "committed" and len(runs) == 3
        write, runs = aborted(psycopg.errors.DeadlockDetected, 10**6)
        with pytest.raises(RecordsError, match="a conflict with another"):  # not for ever
            store._write(write)
        assert len(runs) == 1 + postgres.CONFLICT_RETRIES


def test_records_copy_between_sqlite_and_postgresql_both_ways(postgres_url: str, cli: Cli,
                                                             tmp_path: Path) -> None:  # fmt: skip
    import dataclasses

    from conftest import other_hardware

    from tensortune.records.schema import TaskSource

    src = f"sqlite:///{tmp_path / 'a.db'}"
    with open_records(src) as store:
        fill(store, MM, [3e-3, None, 1e-3])
        (transferred,) = make_records(store, SM, [5e-4], hardware=other_hardware())
        store.add([dataclasses.replace(transferred, origin='{"kind": "transfer"}')])
        store.add_task_sources([TaskSource("net", 1, "mm", 2)])
        want = sorted((r.uid, r.cost, r.status, r.hardware_id, r.origin) for r in store.query())
    code, out, err = cli("records", "export", postgres_url, "--records", src)
    assert code == 0, err
    assert "exported 4 records of 2 workloads" in out and PASSWORD not in out
    code, out, _ = cli("records", "export", postgres_url, "--records", src)  # again: nothing new
    assert code == 0 and "exported 0 records" in out and "(4 already there)" in out
    back = f"sqlite:///{tmp_path / 'b.db'}"
    code, out, err = cli("records", "import", postgres_url, "--records", back)
    assert code == 0, err
    for url in (postgres_url, back):
        with open_records(url, create=False) as store:
            got = sorted((r.uid, r.cost, r.status, r.hardware_id, r.origin) for r in store.query())
            assert got == want
            assert len(store.hardware()) == 2
            assert [s.task_name for s in store.task_sources()] == ["mm"]


def _tune(url: str, work: Path, trials: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tensortune.cli.app", "tune", "--workload", "matmul:64,64,64",
         "--workload", "softmax:4,256", "--trials", str(trials), "--trials-per-round", "8",
         # MetaSchedule's cheapest strategy: what is tested is the sharing, not the search
         "--strategy", "replay-trace", "--cost-model", "random",
         # one thread a kernel: the two tuners' timings compete less for the 2 cores
         "--target", json.dumps({"kind": "llvm", "num-cores": 1}),
         "--records", url, "--work-dir", str(work), "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "TVM_NUM_THREADS": "1"},
    )  # fmt: skip


def test_two_tuners_on_one_database_share_the_budget_and_measure_nothing_twice(
    postgres_url: str, tmp_path: Path
) -> None:
    trials = 32
    runs = [_tune(postgres_url, tmp_path / f"w{i}", trials) for i in range(2)]
    outs = [p.communicate(timeout=240) for p in runs]
    for p, (out, err) in zip(runs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
        assert PASSWORD not in out + err
    results = [json.loads(out) for out, _ in outs]
    with psycopg.connect(postgres_url) as conn:
        total, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT (workload_id, trace_hash)) FROM records"
        ).fetchone()
        per_worker = dict(conn.execute("SELECT run_id, count(*) FROM records GROUP BY run_id"))
        leases = conn.execute("SELECT count(*) FROM claims").fetchone()[0]
    assert distinct == total  # no candidate measured twice
    # N together: each claim counts the budget's room as it leases, though both tuners read it
    # before drafting their rounds
    assert total == trials
    assert sorted(per_worker) == sorted(r["run_id"] for r in results)  # both measured
    assert all(n > 0 for n in per_worker.values())
    assert leases == 0  # every lease ended with its commit or the run
    logs = [f for f in tmp_path.rglob("*") if f.is_file()]
    assert logs and not [f for f in logs if PASSWORD.encode() in f.read_bytes()]


# Two operators, not a network: the leases are the same, without torch's import and export
# in each collector.
_COLLECTOR = """
import sys
from tensortune.collect import collect
from tensortune.hardware import HardwareConfig
config = HardwareConfig("one-core", {"kind": "llvm", "num-cores": 1}, "1 core")
result = collect(workloads=["matmul:16,16,16", "matmul:16,32,16"], configs=[config],
                 programs_per_task=12, records=sys.argv[1], work_dir=sys.argv[2], worker=True)
print(result.measured)
"""


def test_collectors_on_one_database_split_the_work(postgres_url: str, tmp_path: Path) -> None:
    from tensortune.collect.programs import BATCH

    runs = [
        subprocess.Popen([sys.executable, "-c", _COLLECTOR, postgres_url, str(tmp_path / f"w{i}")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "TVM_NUM_THREADS": "1"})
        for i in range(2)
    ]  # fmt: skip
    measured = 0
    for p in runs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-2000:]
        measured += int(out.split()[-1])
    with psycopg.connect(postgres_url) as conn:
        per_task = conn.execute(
            "SELECT workload_id, count(*), count(DISTINCT trace_hash) FROM records "
            "GROUP BY workload_id"
        ).fetchall()
        workers = conn.execute("SELECT count(DISTINCT run_id) FROM records").fetchone()[0]
        tasks = conn.execute("SELECT count(*) FROM workloads").fetchone()[0]
    assert len(per_task) == tasks >= 2
    for _, n, distinct in per_task:
        assert n == distinct  # no program measured by both
        assert 6 <= n <= 12 + BATCH  # the random half at least; a batch over at most
    assert workers == 2
    # each counts what it measured, not what the other added to its tasks meanwhile
    assert measured == sum(n for _, n, _ in per_task)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
