"""``tensortune dataset build``: records → one Parquet table (zstd), one row per measured program,
with labels and cached features, plus a dataset card.

Labels follow TenSet: ``y = best cost of the task on that hardware / cost``, 0 for failures.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensortune import features as F
from tensortune.errors import TensortuneError
from tensortune.hardware import Platform, config_of
from tensortune.records import RecordStore, open_records

TABLE = "programs.parquet"
WORKLOADS = "workloads.parquet"  # task_id -> the workload module, to replay traces on
CARD = "card.json"


@dataclass(frozen=True)
class Card:
    """What a dataset holds and how it was made (``card.json`` beside the table)."""

    data: dict

    @property
    def feature_schema(self) -> str:
        return self.data["feature_schema"]


def hardware_label(target: str, hardware_id: str) -> str:
    """A readable hardware name: the configuration's name when the target is one of ours."""
    t = json.loads(target)
    name = config_of(t)
    if name is not None:
        return f"{name}@{hardware_id[:8]}"
    return f"{t.get('mcpu', t.get('kind'))}-{t.get('num-cores', '?')}c@{hardware_id[:8]}"


def build_dataset(
    records: str | RecordStore, out_dir: str | Path, *, description: str = ""
) -> Card:
    """Write ``programs.parquet`` and ``card.json`` into ``out_dir`` from every record."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tensortune.compat import TVM_VERSION
    from tensortune.workloads.sources import estimate_flop

    store = open_records(records, create=False) if isinstance(records, str) else records
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
        for r in records_of:
            groups[(r.hardware_id, r.target)].append(r)
        for (hw_id, target), group in groups.items():
            label = hardware_label(target, hw_id)
            platform = Platform(json.loads(target), hardware[hw_id])  # as measured: no checks
            hw_vec = F.hardware_vector(platform)
            hw_seen[label] = {"fingerprint": json.loads(hardware[hw_id].to_json()),
                              "target": json.loads(target), "vector": hw_vec.tolist()}  # fmt: skip
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
                columns["per_store"].append(None if feats is None else feats.tolist())
                columns["trace_tokens"].append(F.trace_tokens(r.trace_json()).tolist())
                columns["workload_embedding"].append(embedding)
                columns["hardware_vector"].append(hw_vec.tolist())
    if not columns:
        raise TensortuneError(f"{store.url} holds no records to build a dataset from")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = pa.table(dict(columns), schema=_schema())
    pq.write_table(table, out / TABLE, compression="zstd", compression_level=9)
    pq.write_table(pa.table(dict(modules)), out / WORKLOADS, compression="zstd",
                   compression_level=9)  # fmt: skip
    labels = np.array(columns["label"])
    present = {n for ns in columns["networks"] for n in ns}
    card = {
        "name": out.name,
        "description": description,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tvm_version": TVM_VERSION,
        "feature_schema": F.schema_hash(),
        "widths": {"per_store": F.PER_STORE_WIDTH, "trace_tokens": F.TOKEN_WIDTH,
                   "workload_embedding": F.WORKLOAD_WIDTH, "hardware_vector": F.HARDWARE_WIDTH},
        "programs": len(labels),
        "successful": int((labels > 0).sum()),
        "tasks": len(set(columns["task"])),
        "networks": sorted(present),
        "task_weights": {n: w for n, w in weights.items() if n in present},
        "hardware": hw_seen,
        "files": {TABLE: file_sha256(out / TABLE), WORKLOADS: file_sha256(out / WORKLOADS)},
    }  # fmt: skip
    (out / CARD).write_text(json.dumps(card, indent=1))
    (out / "README.md").write_text(card_markdown(card, columns))
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
    except (OSError, ValueError) as e:
        raise TensortuneError(
            f"{directory} is not a tensortune dataset ({path.name}: {e})"
        ) from None
    if data.get("feature_schema") != F.schema_hash():
        raise TensortuneError(
            f"{directory} was built with feature schema {data.get('feature_schema')}; this "
            f"tensortune computes schema {F.schema_hash()}: rebuild it with `dataset build`"
        )
    return Card(data)


def load_table(directory: str | Path, columns: list[str] | None = None, *,
               table: str = TABLE):  # fmt: skip
    """The dataset's table (pyarrow), after checking its card and file checksum."""
    import pyarrow.parquet as pq

    card = read_card(directory)
    path = Path(directory) / table
    if not path.is_file() or file_sha256(path) != card.data["files"].get(table):
        raise TensortuneError(f"{path} is missing or does not match its card's checksum")
    return pq.read_table(path, columns=columns)


def load_workloads(directory: str | Path) -> dict[int, object]:
    """Each task's workload module (``task_id -> IRModule``), to replay the dataset's traces."""
    from tensortune.compat import tvm

    cols = load_table(directory, table=WORKLOADS).to_pydict()
    return {int(i): tvm.ir.load_json(j) for i, j in zip(cols["task_id"], cols["mod_json"],
                                                         strict=True)}  # fmt: skip
