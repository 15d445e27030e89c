"""``tensortune dataset build``: records → one Parquet table (zstd), one row per measured program,
with labels and cached features, plus a dataset card.

Labels follow TenSet: ``y = best cost of the task on that hardware / cost``, 0 for failures.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensortune import features as F
from tensortune.errors import TensortuneError, last_line, shown
from tensortune.hardware import Platform, config_of
from tensortune.hardware.target import is_target_text
from tensortune.records import RecordStore, records_from
from tensortune.records.schema import Record

TABLE = "programs.parquet"
WORKLOADS = "workloads.parquet"  # task_id -> the workload module, to replay traces on
CARD = "card.json"
# Each program's lowered-loop features, written apart by `dataset lower` (datasets/lowered.py).
LOWERED = "lowered.parquet"


@dataclass(frozen=True)
class Card:
    """What a dataset holds and how it was made (``card.json`` beside the table)."""

    data: dict

    @property
    def feature_schema(self) -> str:
        return self.data["feature_schema"]

    @property
    def table_sha256(self) -> str | None:
        """The checksum of the table this card describes (None for a card without them)."""
        return (self.data.get("files") or {}).get(TABLE)


# What a readable hardware name says of its target; anything else the target sets (``mattr``,
# ``opt-level``...) may build other code, and is told apart by a digest of the target.
_NAMED_TARGET_KEYS = {"keys", "kind", "mcpu", "num-cores", "tag"}


def hardware_label(target: str, hardware_id: str) -> str:
    """A readable hardware name: the configuration's name when the target is one of ours,
    else its ``mcpu`` and cores, and a digest of the target when it sets more: each label is
    one group of labels (each task's best), as ``dataset build`` computes them per target."""
    t = json.loads(target)
    name = config_of(t)
    if name is None:
        name = f"{t.get('mcpu', t.get('kind'))}-{t.get('num-cores', '?')}c"
    if any(v not in (None, [], "") for k, v in t.items() if k not in _NAMED_TARGET_KEYS):
        name += "+" + hashlib.sha256(target.encode()).hexdigest()[:6]
    return f"{name}@{hardware_id[:8]}"


def cpu_of(hardware: str) -> str:
    """The machine a ``hardware_label`` was measured on: its fingerprint, after ``@``
    (``avx2-1c@eab22ab1`` and ``avx512-2c@eab22ab1`` are one CPU); a name without one is a
    machine of its own."""
    config, at, cpu = hardware.partition("@")
    return cpu if at else config


def build_dataset(
    records: str | RecordStore,
    out_dir: str | Path,
    *,
    description: str = "",
    held_out: list[str] | None = None,
    overwrite: bool = False,
) -> Card:
    """Write ``programs.parquet`` and ``card.json`` into ``out_dir`` from every record, one
    row per program of a task on a hardware and target (measured twice: the first run that
    succeeded).
    ``held_out``: networks a study of the dataset scores on and never trains on (the card's
    ``held_out``, read by ``bench al`` and ``dataset select``); ``overwrite``: replace a
    dataset already in ``out_dir``."""
    check_out_dir(out_dir, overwrite=overwrite)  # before the features, not after
    with records_from(records, create=False) as store:
        columns, modules, weights, hw_seen = _rows(store)
        if not columns:
            raise TensortuneError(f"{store.url} holds no records to build a dataset from")
    present = {n for ns in columns["networks"] for n in ns}
    unknown = [n for n in held_out or [] if n not in present]
    if unknown:
        named = ", ".join(sorted(present)) or "none (no record names its network)"
        raise TensortuneError(f"held-out network {unknown[0]} has no records here; the "
                              f"networks are: {named}", param="held_out")  # fmt: skip
    return write_dataset(out_dir, columns, modules, description=description,
                         task_weights=weights, hardware=hw_seen,
                         extra={"held_out": list(held_out)} if held_out else None,
                         overwrite=overwrite)  # fmt: skip


def _distinct(records: list[Record]) -> list[Record]:
    """One record per program (trace) of a task on one hardware and target: the first that
    ran, else the first.  Two collections of a shared task draw the same random programs
    from the same seed, and stores copied together keep both measurements; as two rows, a
    random split put one in training and its twin in the test set (ttset-cpu-v6 holds 493
    such rows of 33,413)."""
    kept: dict[tuple[str, str, str], Record] = {}
    for r in sorted(records, key=lambda r: r.id or 0):
        key = (r.hardware_id, r.target, r.trace)
        if key not in kept or (r.ok and not kept[key].ok):
            kept[key] = r
    return sorted(kept.values(), key=lambda r: r.id or 0)


def _rows(store: RecordStore) -> tuple[dict, dict, dict, dict]:
    """Every record of ``store`` as dataset columns (one row per program: ``_distinct``);
    each task's module; each network's task weights; each hardware label's description."""
    from tensortune.workloads.sources import estimate_flop

    networks: dict[int, list[str]] = defaultdict(list)
    weights: dict[str, dict[str, int]] = defaultdict(dict)
    for s in store.task_sources():
        networks[s.workload_id].append(s.network)
        weights[s.network][str(s.workload_id)] = s.weight
    hardware = store.hardware()
    columns: dict[str, list] = defaultdict(list)
    hw_seen: dict[str, dict] = {}
    modules: dict[str, list] = defaultdict(list)
    for w in store.workloads():
        records_of = list(store.query(workload_id=w.id))
        if not records_of:
            continue
        modules["task_id"].append(w.id)
        modules["task_name"].append(w.name)
        modules["mod_json"].append(w.mod_json)
        mod = w.mod()
        embedding = F.workload_embedding(mod, estimate_flop(mod)).tolist()
        groups: dict[tuple[str, str], list] = defaultdict(list)
        for r in _distinct(records_of):
            groups[(r.hardware_id, r.target)].append(r)
        for (hw_id, target), group in groups.items():
            label = hardware_label(target, hw_id)
            if hw_id not in hardware:  # registered by a collector since the build began
                hardware = store.hardware()
            platform = Platform(json.loads(target), hardware[hw_id])  # as measured: no checks
            hw_vec = F.hardware_vector(platform).tolist()  # one list for the group's rows
            hw_seen[label] = {"fingerprint": json.loads(hardware[hw_id].to_json()),
                              "target": json.loads(target), "vector": hw_vec}  # fmt: skip
            best = min((r.cost for r in group if r.ok), default=None)
            per_store = F.per_store_features(mod, platform, [r.trace_json() for r in group])
            for r, feats in zip(group, per_store, strict=True):
                columns["program_id"].append(r.id)
                columns["task_id"].append(w.id)
                columns["task"].append(w.shash)
                columns["task_name"].append(w.name)
                columns["networks"].append(sorted(networks.get(w.id, [])))
                columns["hardware"].append(label)
                columns["target"].append(target)
                columns["status"].append(r.status)
                columns["run_secs"].append(list(r.run_secs))
                columns["cost"].append(r.cost if r.ok else None)
                columns["label"].append(best / r.cost if r.ok and best else 0.0)
                columns["trace"].append(r.trace)
                # Arrays, not lists of Python floats: ~60 KB a row less (10^5 programs took 6 GB)
                columns["per_store"].append(None if feats is None else list(_f32(feats)))
                columns["trace_tokens"].append(list(_f32(F.trace_tokens(r.trace_json()))))
                columns["workload_embedding"].append(embedding)
                columns["hardware_vector"].append(hw_vec)
    return dict(columns), dict(modules), weights, hw_seen


def _f32(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def check_out_dir(out: str | Path, *, overwrite: bool = False) -> None:
    """Refuse to write a dataset into ``out`` when it would replace what is there: a dataset,
    unless ``overwrite`` (one built from a store since deleted may be all that is left of
    it); files of the same names in a directory that holds no dataset, always (they are
    someone's own: ``--out .`` in a project has a README.md)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise TensortuneError(f"{out} is a file, not a directory", param="out")
    if (out / CARD).is_file() and not overwrite:
        raise TensortuneError(f"{out} already holds a dataset: give a new directory, or "
                              "replace it with --overwrite (overwrite=True)",
                              param="out")  # fmt: skip
    clash = [n for n in (TABLE, WORKLOADS, "README.md", LOWERED) if (out / n).exists()]
    # A write killed between its renames leaves the table without the card, staged beside it.
    ours = (out / CARD).is_file() or (out / f".{CARD}.partial").is_file()
    if clash and not ours:
        raise TensortuneError(f"{out} is not a dataset but holds {', '.join(clash)}, which "
                              "writing one would replace: give a new or empty directory",
                              param="out")  # fmt: skip


def write_dataset(out_dir: str | Path, columns: dict, modules: dict, *, description: str,
                  task_weights: dict, hardware: dict, extra: dict | None = None,
                  overwrite: bool = False,
                  lowered: Callable[[Path, str], bool] | None = None) -> Card:  # fmt: skip
    """Write the table, the workloads and the card (``extra`` merged into it); a dataset
    already in ``out_dir`` is replaced only with ``overwrite``.  ``lowered(path, table)``
    writes the programs' lowered-loop features for the table of checksum ``table`` to
    ``path`` (or writes nothing and says False): staged with the rest, they are in place
    before the card, which says the dataset is whole."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tensortune.compat import TVM_VERSION

    out = Path(out_dir)
    check_out_dir(out, overwrite=overwrite)
    out.mkdir(parents=True, exist_ok=True)
    # Every file is written beside its final name and put in place once all are written: a
    # failure half-way leaves the directory as it was, not half a dataset.
    staged = {name: out / f".{name}.partial" for name in (TABLE, WORKLOADS, CARD, "README.md")}
    try:
        pq.write_table(pa.table(columns, schema=_schema()), staged[TABLE], compression="zstd",
                       compression_level=9)  # fmt: skip
        pq.write_table(pa.table(modules, schema=_workloads_schema()), staged[WORKLOADS],
                       compression="zstd", compression_level=9)  # fmt: skip
        labels = np.array(columns["label"])
        present = {n for ns in columns["networks"] for n in ns}
        card = {
            "name": out.name,
            "description": description,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "tvm_version": TVM_VERSION,
            "feature_schema": F.schema_hash(),
            "widths": {"per_store": F.PER_STORE_WIDTH, "trace_tokens": F.TOKEN_WIDTH,
                       "workload_embedding": F.WORKLOAD_WIDTH,
                       "hardware_vector": F.HARDWARE_WIDTH},
            "programs": len(labels),
            "successful": int((labels > 0).sum()),
            "tasks": len(set(columns["task"])),
            "networks": sorted(present),
            "task_weights": {n: w for n, w in task_weights.items() if n in present},
            "hardware": {h: v for h, v in hardware.items() if h in set(columns["hardware"])},
            "files": {TABLE: file_sha256(staged[TABLE]),
                      WORKLOADS: file_sha256(staged[WORKLOADS])},
            **(extra or {}),
        }  # fmt: skip
        staged[CARD].write_text(json.dumps(card, indent=1))
        staged["README.md"].write_text(card_markdown(card, columns))
        staged[LOWERED] = out / f".{LOWERED}.partial"
        if lowered is None or not lowered(staged[LOWERED], card["files"][TABLE]):
            del staged[LOWERED]
    except BaseException:
        for path in staged.values():
            path.unlink(missing_ok=True)
        raise
    # Features of the programs that were here before would be read as the new programs';
    # the card of a dataset replaced would say the new files are whole before they are (the
    # staged card marks the directory as a dataset being written: a rerun goes on).
    (out / LOWERED).unlink(missing_ok=True)
    (out / CARD).unlink(missing_ok=True)
    for name, path in sorted(staged.items(), key=lambda item: item[0] == CARD):  # card last
        path.replace(out / name)
    return Card(card)


def card_markdown(card: dict, columns: dict) -> str:
    """The card for people: what is in the table, per hardware and network, and how it was made."""
    lines = [f"# Dataset card: {card['name']}", "", card["description"] or "(no description)", "",
             f"- {card['programs']} programs ({card['successful']} measured successfully) of "
             f"{card['tasks']} tasks; TVM {card['tvm_version']}; feature schema "
             f"`{card['feature_schema']}`; built {card['created']}.",
             f"- `{TABLE}` sha256 `{card['files'][TABLE]}`; `{WORKLOADS}` (each task's "
             f"module, to replay traces on) sha256 `{card['files'][WORKLOADS]}`.", "",
             "## Hardware", ""]  # fmt: skip
    for label, hw in sorted(card["hardware"].items()):
        n = sum(h == label for h in columns["hardware"])
        fp = hw["fingerprint"]
        machine = f"{fp['cpu_model']} ({fp['cores']} cores, ISA {', '.join(fp['isa'])})"
        lines.append(f"- `{label}`: {n} programs; target `{json.dumps(hw['target'])}` on {machine}")
    lines += ["", "## Networks", ""]
    for net in card["networks"]:
        tasks = {t for t, ns in zip(columns["task_id"], columns["networks"], strict=True)
                 if net in ns}  # fmt: skip
        n = sum(net in ns for ns in columns["networks"])
        lines.append(f"- `{net}`: {len(tasks)} tasks, {n} programs")
    lines += ["", "## Columns", "",
              "program_id, task_id, task (structural hash), task_name, networks, hardware, target, "
              "status, run_secs (every timing repeat, seconds), cost (median), label (best cost "
              "of the task on that hardware / cost; 0 for failures), trace (MetaSchedule JSON), "
              "per_store, trace_tokens, workload_embedding, hardware_vector "
              f"(widths {json.dumps(card['widths'])}).", ""]  # fmt: skip
    return "\n".join(lines)


def _schema():
    import pyarrow as pa

    f32, f64 = pa.float32(), pa.float64()
    return pa.schema([
        ("program_id", pa.int64()), ("task_id", pa.int32()), ("task", pa.string()),
        ("task_name", pa.string()), ("networks", pa.list_(pa.string())),
        ("hardware", pa.string()), ("target", pa.string()), ("status", pa.string()),
        ("run_secs", pa.list_(f64)), ("cost", f64), ("label", f64), ("trace", pa.string()),
        ("per_store", pa.list_(pa.list_(f32))), ("trace_tokens", pa.list_(pa.list_(f32))),
        ("workload_embedding", pa.list_(f32)), ("hardware_vector", pa.list_(f32)),
    ])  # fmt: skip


def _workloads_schema():
    import pyarrow as pa

    return pa.schema([("task_id", pa.int64()), ("task_name", pa.string()),
                      ("mod_json", pa.string())])  # fmt: skip


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_card(directory: str | Path) -> Card:
    path = Path(directory) / CARD
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise TensortuneError(
            f"{directory} is not a tensortune dataset ({path.name}: {last_line(e)})"
        ) from None
    if not isinstance(data, dict):
        raise TensortuneError(f"{path} is not a dataset card (not a JSON object)")
    if data.get("feature_schema") != F.schema_hash():
        raise TensortuneError(
            f"{directory} was built with feature schema {shown(data.get('feature_schema'))}; this "
            f"tensortune computes schema {F.schema_hash()}: rebuild it with `dataset build` "
            "(--overwrite to replace it)"
        )
    problem = _card_problem(data)
    if problem:
        raise TensortuneError(f"{path}: {problem}")
    return Card(data)


def _card_problem(card: dict) -> str | None:
    """What is wrong with the parts of a card that commands read (None: nothing)."""
    for key, kind in (("files", dict), ("hardware", dict), ("networks", list),
                      ("programs", int), ("successful", int), ("tasks", int)):  # fmt: skip
        if not isinstance(card.get(key), kind) or isinstance(card[key], bool):
            return f"{key} is missing or not {'an' if kind is int else 'a'} {kind.__name__}"
    if not all(isinstance(v, str) for v in [*card["files"].values(), *card["networks"]]):
        return "files or networks hold something other than text"
    if not isinstance(card.get("name", ""), str):
        return "name is not text"
    for label, hw in card["hardware"].items():
        fp = hw.get("fingerprint") if isinstance(hw, dict) else None
        if not (isinstance(fp, dict) and isinstance(fp.get("cpu_model"), str)
                and type(fp.get("cores")) is int and isinstance(fp.get("isa"), list)
                and isinstance(hw.get("target"), dict)):  # fmt: skip
            return f"hardware {shown(label)} is not {{fingerprint, target, ...}}"
    held = card.get("held_out", [])
    if not isinstance(held, list) or not all(isinstance(n, str) for n in held):
        return "held_out is not a list of network names"
    weights = card.get("task_weights") or {}
    if not isinstance(weights, dict) or not all(
        isinstance(w, dict)
        and all(t.isdecimal() and type(n) is int and n > 0 for t, n in w.items())
        for w in weights.values()
    ):
        return "task_weights is not {network: {task id: positive weight}}"
    return None


def checked_file(directory: str | Path, card: Card, name: str = TABLE) -> Path:
    """The path of the dataset's file ``name``, once its bytes match the card's checksum."""
    path = Path(directory) / name
    if not path.is_file() or file_sha256(path) != card.data["files"].get(name):
        raise TensortuneError(f"{path} is missing or does not match its card's checksum")
    return path


def load_table(directory: str | Path, columns: list[str] | None = None, *,
               table: str = TABLE):  # fmt: skip
    """The dataset's table (pyarrow), after checking its card, its file's checksum and its
    columns: a shared dataset is data, and what readers take from it must be what they expect."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    card = read_card(directory)
    path = checked_file(directory, card, table)
    schema = _schema() if table == TABLE else _workloads_schema()
    try:
        present = pq.read_schema(path).names
        missing = [n for n in columns or schema.names if n not in present]
        if missing:
            raise TensortuneError(f"{path}: column {missing[0]} is missing")
        out = pq.read_table(path, columns=columns)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise TensortuneError(f"{path} is not a readable Parquet table ({last_line(e)})") from None
    problem = _table_problem(out, schema)
    if problem:
        raise TensortuneError(f"{path}: {problem}")
    return out


def table_columns(table) -> dict[str, list]:
    """A table from ``load_table`` as columns: what ``to_pydict`` gives, except that each
    feature column holds one float32 array a row (2-D for ``per_store`` and ``trace_tokens``;
    None for a program without features).  Making Python floats of millions of feature values
    was most of the time and memory of reading a dataset; ``load_table`` has checked the
    widths these arrays take."""
    out = {}
    for name in table.column_names:
        width = FEATURE_WIDTHS.get(name)
        column = table.column(name)
        out[name] = column.to_pylist() if width is None else _feature_rows(name, column, width)
    return out


def _feature_rows(name: str, column, width: int) -> list:
    import pyarrow.compute as pc

    column = column.combine_chunks()
    nested = name in _PER_ROW_FEATURES
    flat = pc.list_flatten(column)  # a missing row's list is left out
    values = pc.list_flatten(flat) if nested else flat
    matrix = np.array(values.to_numpy(zero_copy_only=False), np.float32).reshape(-1, width)
    present = column.is_valid().to_numpy(zero_copy_only=False)
    if nested:
        sizes = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False)
        ends = np.cumsum(sizes[present])
        pieces = [matrix[e - k : e] for e, k in zip(ends, sizes[present], strict=True)]
    else:
        pieces = list(matrix)
    rows: list = [None] * len(column)
    for i, piece in zip(np.flatnonzero(present), pieces, strict=True):
        rows[i] = piece
    return rows


# Columns whose value may be missing: a program without features, a failed program's cost.
_MAY_BE_NULL = ("per_store", "cost")
# Columns of one feature vector per block or per trace instruction.
_PER_ROW_FEATURES = ("per_store", "trace_tokens")
# The width of each feature column's vectors.
FEATURE_WIDTHS = {
    "per_store": F.PER_STORE_WIDTH,
    "trace_tokens": F.TOKEN_WIDTH,
    "workload_embedding": F.WORKLOAD_WIDTH,
    "hardware_vector": F.HARDWARE_WIDTH,
}


def _table_problem(table, schema) -> str | None:
    """What is wrong with a table's columns (None: nothing): each with the type the schema
    gives it, no empty value where one is needed, feature vectors of the widths computed here
    and labels in [0, 1]."""
    for name in (n for n in table.column_names if n in schema.names):
        problem = _column_problem(name, table.column(name), schema.field(name).type)
        if problem:
            return f"column {name} {problem}"
    return None


def _column_problem(name: str, column, want) -> str | None:
    import pyarrow as pa
    import pyarrow.compute as pc

    if column.type != want:
        return f"is {column.type}, not {want}"
    if name not in _MAY_BE_NULL and column.null_count:
        return "has empty values"
    inner = column
    while pa.types.is_list(inner.type):
        inner = pc.list_flatten(inner)
        if inner.null_count:
            return "has empty values inside its lists"
    if not len(column):
        return None
    width = FEATURE_WIDTHS.get(name)
    if width is not None:
        if name in _PER_ROW_FEATURES:
            if pc.min(pc.list_value_length(column)).as_py() == 0:
                return "has a program without any row of features"
            column = pc.list_flatten(column)
        lengths = pc.min_max(pc.list_value_length(column)).as_py()
        if len(column) and lengths != {"min": width, "max": width}:
            return f"holds vectors of another width than {width}"
        # A NaN or infinity trains a neural model into NaN scores and stops XGBoost with a
        # native traceback: refused here, in one line.
        values = pc.list_flatten(column)
        if len(values) and not pc.all(pc.is_finite(values)).as_py():
            return "holds a value that is not a finite number"
    if name == "label":
        bounds = pc.min_max(column).as_py()
        if pc.any(pc.is_nan(column)).as_py() or bounds["min"] < 0 or bounds["max"] > 1:
            return "holds values outside [0, 1]"
    if name in ("cost", "run_secs"):
        seconds = pc.drop_null(pc.list_flatten(column) if name == "run_secs" else column)
        if len(seconds) and (not pc.all(pc.is_finite(seconds)).as_py()
                             or pc.min(seconds).as_py() <= 0):  # fmt: skip
            return "holds a time that is not a positive number of seconds"
    if name == "target" and not all(map(is_target_text, pc.unique(column).to_pylist())):
        return "holds a target that is not a JSON object with a kind"
    return None


def load_workloads(directory: str | Path) -> dict[int, object]:
    """Each task's workload module (``task_id -> IRModule``), to replay the dataset's traces."""
    from tensortune.compat import load_ir_json

    cols = load_table(directory, table=WORKLOADS).to_pydict()
    modules = {}
    for i, text in zip(cols["task_id"], cols["mod_json"], strict=True):
        try:
            modules[int(i)] = load_ir_json(text)
        except Exception as e:  # TVM's errors have no common base class
            raise TensortuneError(f"{Path(directory) / WORKLOADS}: the module of task {i} "
                                  f"cannot be read ({last_line(e)})") from None  # fmt: skip
    return modules
