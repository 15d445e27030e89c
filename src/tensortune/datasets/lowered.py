"""Lowered-loop features of a dataset's programs, kept beside its table in ``lowered.parquet``.

Why a file of its own: they derive from the table (workload, trace and target of each row) by
``features.lowered``, which takes minutes over a dataset (7 for v5's 23,186 distinct programs
on two cores), too slow to recompute at every ``train``, and newer than the datasets already
shared, whose table and card stay as they are.  The file is data: its schema, width, feature
version and program ids are checked when read, and a stale or malformed one is refused with one
line.  Computing it resumes: a killed run keeps what it finished (the file is rewritten whole
every few hundred programs, never left half-written).  The file names the table it was
computed for (its checksum) and says whether it is complete: a checkpoint of a run that did
not finish is not read as the features (its missing programs would read as ones that could
not be lowered), and a file from another table is stale.  Files written before these marks
(the shipped datasets') are read as complete.
Programs are lowered in the measurement pool's workers (``features.lowered_features_batch``),
so that one TVM crashes or hangs on costs a NaN row.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tensortune.datasets.build import LOWERED, WORKLOADS, load_table, load_workloads
from tensortune.datasets.shipped import dataset_path
from tensortune.errors import TensortuneError, last_line
from tensortune.features.lowered import (
    LOWERED_VERSION,
    LOWERED_WIDTH,
    lowered_features_batch,
)
from tensortune.files import write_atomically

LOWERED_FILE = LOWERED
_VERSION_KEY = b"tensortune.lowered_version"
_TABLE_KEY = b"tensortune.table_sha256"  # the card's checksum of the table the rows are of
_COMPLETE_KEY = b"tensortune.complete"  # b"0" on a checkpoint
_CHUNK = 16  # programs per worker handed to the pool at once
_SAVE_EVERY = 512  # programs between checkpoints


def read_lowered(dataset: str | Path, program_ids: list[int]) -> np.ndarray | None:
    """``(len(program_ids), LOWERED_WIDTH)`` features of these programs of ``dataset`` (NaN
    where one could not be lowered or the file lacks it); None when the dataset has no
    lowered file, or one that is not the finished features of this table in this feature
    version: another version's, a killed run's checkpoint, another table's (``dataset
    lower`` recomputes it)."""
    rows, complete = _read_current(Path(dataset_path(dataset)))
    if rows is None or not complete:
        return None
    out = np.full((len(program_ids), LOWERED_WIDTH), np.nan, np.float32)
    for i, pid in enumerate(program_ids):
        got = rows.get(int(pid))
        if got is not None:
            out[i] = got
    return out


def lowered_state(dataset: str | Path) -> str:
    """What ``dataset info`` says of the dataset's lowered-loop features."""
    directory = Path(dataset_path(dataset))
    if not (directory / LOWERED_FILE).is_file():
        return "none (`tensortune dataset lower` computes them)"
    rows, complete = _read_current(directory)
    if rows is None:
        return ("stale (another feature version or another table: `tensortune dataset lower` "
                "recomputes them)")  # fmt: skip
    if not complete:
        return f"unfinished, {len(rows)} programs (`tensortune dataset lower` finishes them)"
    return f"{len(rows)} programs ({LOWERED_FILE})"


def lowered_of(dataset: str | Path, program_ids: list[int]) -> Callable[[Path, str], bool]:
    """For ``write_dataset(lowered=)``: a dataset written from some of ``dataset``'s programs
    (``datasets.subset``) gets their lowered-loop features, when ``dataset`` has current ones
    (False: it has none to give)."""

    def write(path: Path, table: str) -> bool:
        rows, complete = _read_current(Path(dataset_path(dataset)))
        if rows is None or not complete:
            return False
        kept = {int(p): rows[int(p)] for p in program_ids if int(p) in rows}
        if kept:
            _write(path, kept, table=table, complete=True)
        return bool(kept)

    return write


def _table_sha(directory: Path) -> str | None:
    from tensortune.datasets.build import read_card

    return read_card(directory).table_sha256


def _read_current(directory: Path) -> tuple[dict[int, np.ndarray] | None, bool]:
    """The dataset's lowered rows, None when there are none of this table and feature
    version; and whether they are complete."""
    return _read(directory / LOWERED_FILE, _table_sha(directory))


def _read(path: Path, table: str | None = None) -> tuple[dict[int, np.ndarray] | None, bool]:
    """program id -> features (NaN: it did not lower), None without a current file (none, of
    another feature version, or of a table other than the one whose checksum is ``table``);
    and whether the file is complete (not a checkpoint)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        return None, False
    try:
        meta = pq.read_schema(path).metadata or {}
        if meta.get(_VERSION_KEY) != str(LOWERED_VERSION).encode():
            return None, False  # another version's: stale, recomputed by `dataset lower`
        if table is not None and meta.get(_TABLE_KEY, table.encode()) != table.encode():
            return None, False  # another table's programs under the same ids: stale too
        table = pq.read_table(path, columns=["program_id", "lowered"])
    except (pa.ArrowException, OSError, ValueError) as e:
        raise TensortuneError(f"{path} is not a readable Parquet table ({last_line(e)})") from None
    ids, lowered = table.column("program_id"), table.column("lowered")
    if not (pa.types.is_integer(ids.type) and pa.types.is_list(lowered.type)
            and pa.types.is_floating(lowered.type.value_type)) or ids.null_count:  # fmt: skip
        raise TensortuneError(f"{path}: its columns are not program_id (integers) and lowered "
                              "(lists of numbers)")  # fmt: skip
    values = lowered.to_pylist()
    if any(v is None or len(v) != LOWERED_WIDTH for v in values):
        raise TensortuneError(f"{path}: a row's lowered features are not {LOWERED_WIDTH} numbers")
    matrix = np.asarray(values, np.float32).reshape(-1, LOWERED_WIDTH)
    if np.isinf(matrix).any():  # NaN says a program did not lower; an infinity says nothing
        raise TensortuneError(f"{path}: a row's lowered features hold an infinity")
    rows = dict(zip(ids.to_pylist(), matrix, strict=True))
    return rows, meta.get(_COMPLETE_KEY, b"1") != b"0"


def _write(path: Path, done: dict[int, np.ndarray], *, table: str | None,
           complete: bool) -> None:  # fmt: skip
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = sorted(done)
    meta = {_VERSION_KEY: str(LOWERED_VERSION).encode(), _COMPLETE_KEY: b"1" if complete else b"0"}
    if table is not None:
        meta[_TABLE_KEY] = table.encode()
    schema = pa.schema([("program_id", pa.int64()), ("lowered", pa.list_(pa.float32()))],
                       metadata=meta)  # fmt: skip
    table = pa.table({"program_id": ids, "lowered": [done[i].tolist() for i in ids]},
                     schema=schema)  # fmt: skip
    # Whole or not at all: a full disk leaves the last checkpoint, and no partial file.
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer, compression="zstd", compression_level=9)
    write_atomically(path, buffer.getvalue().to_pybytes())


def lower_dataset(dataset: str | Path, *, workers: int = 1,
                  progress: Callable[[int, int], None] | None = None) -> dict:  # fmt: skip
    """Compute the lowered-loop features of every program of ``dataset`` that lacks them and
    write ``lowered.parquet`` into its directory; returns what was done."""
    directory = Path(dataset_path(dataset))
    path = directory / LOWERED_FILE
    columns = load_table(directory, ["program_id", "task_id", "target", "trace"]).to_pydict()
    table = _table_sha(directory)
    try:
        done = _read(path, table)[0] or {}
    except TensortuneError:  # a damaged file of derived data: computed again
        done = {}
    keys = list(zip(columns["task_id"], columns["target"], columns["trace"], strict=True))
    first: dict[tuple, int] = {}  # a program measured on several machines is lowered once
    todo: list[int] = []
    for i, (pid, key) in enumerate(zip(columns["program_id"], keys, strict=True)):
        if pid not in done and key not in first:
            todo.append(i)
        first.setdefault(key, i)
    if todo:
        _compute(directory, columns, todo, done, path, workers, progress, table)
    for pid, key in zip(columns["program_id"], keys, strict=True):  # copies lowered once
        if pid not in done:
            done[pid] = done[columns["program_id"][first[key]]]
    _write(path, done, table=table, complete=True)
    failed = sum(bool(np.isnan(v[0])) for v in done.values())
    return {"dataset": str(directory), "programs": len(done), "lowered_now": len(todo),
            "failed": failed, "file": str(path)}  # fmt: skip


def _compute(directory: Path, columns: dict, todo: list[int], done: dict, path: Path,
             workers: int, progress: Callable[[int, int], None] | None,
             table: str | None) -> None:  # fmt: skip
    """Lower the ``todo`` rows in ``workers`` processes of the measurement pool."""
    from tensortune.measure.pool import WorkerPool

    modules = load_workloads(directory)
    missing = sorted({int(columns["task_id"][i]) for i in todo} - modules.keys())
    if missing:  # the table and its workloads file disagree (both pass their checksums)
        raise TensortuneError(f"{directory / WORKLOADS}: no module for task {missing[0]}, "
                              "which the programs table uses")  # fmt: skip
    pool = WorkerPool(workers, reuse=True)
    finished = since_save = 0
    try:
        for start in range(0, len(todo), _CHUNK * pool.size):
            chunk = todo[start : start + _CHUNK * pool.size]
            jobs = [(replayed(modules[columns["task_id"][i]], columns["trace"][i]),
                     json.loads(columns["target"][i])) for i in chunk]  # fmt: skip
            for i, row in zip(chunk, lowered_features_batch(jobs, pool), strict=True):
                done[columns["program_id"][i]] = row
            finished += len(chunk)
            since_save += len(chunk)
            if progress is not None:
                progress(finished, len(todo))
            if since_save >= _SAVE_EVERY:
                _write(path, done, table=table, complete=False)
                since_save = 0
    except BaseException:
        if since_save:  # an interrupted run keeps what it finished since the last checkpoint
            with contextlib.suppress(Exception):  # never in place of the error that stopped it
                _write(path, done, table=table, complete=False)
        raise
    finally:
        pool.close()


def replayed(module: object, trace: str) -> object | None:
    """``module`` scheduled by a dataset row's trace (JSON text); None for a trace this TVM
    cannot replay (a damaged one too: ``records.convert.replay_trace``)."""
    from tensortune.compat import tvm
    from tensortune.records.convert import replay_trace

    sch = tvm.s_tir.Schedule(module)
    try:
        replay_trace(trace, sch)
    except Exception:  # TVM raises its own error types for a trace it cannot replay
        return None
    return sch.mod
