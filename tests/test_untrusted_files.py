"""Files that users share are data: model files, MetaSchedule JSON databases and datasets.

Loading one runs none of its code, and a malformed one ends in one error: a ``TensortuneError``
from the Python API; from the command line one ``error:`` line on stderr and exit status 2, with
the records store left as it was.  Beside crafted files (a pickle that would run a command, trees
whose indices point outside their arrays, records that name a workload the file lacks),
``hypothesis`` draws damaged ones: random bytes, truncations, mutated metadata and state, database
lines, Parquet tables and dataset cards.  Before the checks these tests came with, each crafted
case crashed the process, ended in a traceback or a many-line message, or was silently used.
"""

from __future__ import annotations

import base64
import io
import json
import math
import os
import pickle
import re
import shutil
import sqlite3
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import Cli, fill
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensortune import features as F
from tensortune.costmodel.data import ProgramSet
from tensortune.costmodel.registry import load_cost_model, model_class
from tensortune.datasets.build import checked_file, file_sha256, load_table, read_card
from tensortune.errors import TensortuneError
from tensortune.records import open_records
from tensortune.records.interop import export_records, import_records
from tensortune.train.trainer import evaluate, train

FAST = {"xgb": {"n_rounds": 3}, "lgbm": {"n_rounds": 3, "min_data_in_leaf": 1},
        "mlp": {"hidden": 8, "epochs": 1}}  # fmt: skip
_FUZZ = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def programs(n: int = 12) -> ProgramSet:
    rng = np.random.default_rng(0)
    return ProgramSet([rng.random((2, F.PER_STORE_WIDTH), dtype=np.float32) for _ in range(n)],
                      [rng.random((3, F.TOKEN_WIDTH), dtype=np.float32) for _ in range(n)],
                      rng.random((n, F.WORKLOAD_WIDTH), dtype=np.float32),
                      rng.random((n, F.HARDWARE_WIDTH), dtype=np.float32),
                      np.repeat([0, 1], n // 2), rng.random(n))  # fmt: skip


def refused(call: Callable[[], object]) -> str | None:
    """The one-line message of the ``TensortuneError`` that ``call`` raises (None: it did not
    raise); any other exception fails the test."""
    try:
        call()
    except TensortuneError as e:
        assert len(str(e).splitlines()) == 1, str(e)  # what a terminal shows as one line
        return str(e)
    return None


def one_error(result: tuple[int, str, str], start: str = "error: ") -> str:
    code, out, err = result
    assert code == 2, (code, out, err)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), err
    return lines[0]


# ---- model files -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A small fitted model file of each kind of state: XGBoost, LightGBM, torch."""
    out = tmp_path_factory.mktemp("models")
    files = {}
    for kind, params in FAST.items():
        files[kind] = out / f"{kind}.ttm"
        model_class(kind)(**params).fit(programs()).save(files[kind])
    return files


def parts(path: Path) -> tuple[dict, bytes]:
    with zipfile.ZipFile(path) as z:
        return json.loads(z.read("meta.json")), z.read("state.bin")


def model_file(path: Path, meta: object, state: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("meta.json", meta if isinstance(meta, str | bytes) else json.dumps(meta))
        z.writestr("state.bin", state)
    return path


def check_model_file(cli: Cli, path: Path, dataset: Path) -> None:
    """Loaded, the model predicts and is scored; refused, it is one line from the API and the
    command line."""
    message = refused(lambda: load_cost_model(path).predict(programs()))
    result = cli("evaluate", "--cost-model", str(path), "--dataset", str(dataset), "--split",
                 "within-task", "--json")  # fmt: skip
    if message is not None:
        assert str(path) in one_error(result, "error: --cost-model: ")
    elif result[0] != 0:
        one_error(result)  # e.g. damaged weights that predict NaN


class _RunsCommand:
    """Unpickled, runs a shell command: a model file must never get that far."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class _Evaluates:
    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self):
        return (eval, (self.code,))


def _torch_bytes(obj: object, **kwargs) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf, **kwargs)
    return buf.getvalue()


_PAYLOADS: dict[str, Callable[[Path], bytes]] = {
    "torch file, os.system": lambda m: _torch_bytes(
        {"net": _RunsCommand(f"touch {m}"), "scale": 1, "width": 1}),
    "legacy torch file": lambda m: _torch_bytes(
        {"net": _RunsCommand(f"touch {m}")}, _use_new_zipfile_serialization=False),
    "plain pickle": lambda m: pickle.dumps({"net": _RunsCommand(f"touch {m}")}),
    "plain pickle, protocol 0": lambda m: pickle.dumps(_RunsCommand(f"touch {m}"), protocol=0),
    "eval in the scale": lambda m: _torch_bytes(
        {"net": {}, "scale": _Evaluates(f"open({str(m)!r}, 'w')"), "width": 1}),
    "inside a numpy object array": lambda m: _torch_bytes(
        {"net": {}, "scale": np.array([_RunsCommand(f"touch {m}")], dtype=object), "width": 1}),
}  # fmt: skip


@pytest.mark.parametrize("payload", list(_PAYLOADS))
def test_a_model_file_that_would_run_code_is_refused_before_it_runs(
    cli: Cli, models: dict[str, Path], dataset: Path, tmp_path: Path, payload: str
) -> None:
    # torch's weights-only unpickler builds tensors and plain containers and calls nothing else:
    # kept (files stay torch's format), and proven here rather than trusted.
    marker = tmp_path / "code-ran"
    meta, _ = parts(models["mlp"])
    evil = model_file(tmp_path / "evil.ttm", meta, _PAYLOADS[payload](marker))
    message = refused(lambda: load_cost_model(evil))
    assert message is not None and "cannot restore the mlp model" in message
    assert "weights_only" not in message  # torch's advice: load it anyway (and run the code)
    records = f"sqlite:///{tmp_path / 'r.db'}"
    tune = ["tune", "-w", "matmul:16,16,16", "--trials", "4", "--records", records]
    for command in (["evaluate", "--dataset", str(dataset)], tune):
        one_error(cli(*command, "--cost-model", str(evil)), "error: --cost-model: ")
    assert not marker.exists()


def test_the_refusal_names_what_the_pickle_would_call(models: dict[str, Path], tmp_path: Path):
    meta, _ = parts(models["mlp"])
    state = _PAYLOADS["torch file, os.system"](tmp_path / "x")
    message = refused(lambda: load_cost_model(model_file(tmp_path / "e.ttm", meta, state)))
    assert message is not None and "would call posix.system: refused before anything ran" in message


def _ubjson(value: object) -> bytes:
    """UBJSON as XGBoost writes it (untyped containers): to craft XGBoost model files."""
    if isinstance(value, dict):
        return b"{" + b"".join(b"L" + struct.pack(">q", len(k)) + k.encode() + _ubjson(v)
                               for k, v in value.items()) + b"}"  # fmt: skip
    if isinstance(value, list):
        return b"[" + b"".join(_ubjson(v) for v in value) + b"]"
    if isinstance(value, str):
        return b"SL" + struct.pack(">q", len(value.encode())) + value.encode()
    if isinstance(value, bool):
        return b"T" if value else b"F"
    if isinstance(value, int):
        return b"L" + struct.pack(">q", value)
    if isinstance(value, float):
        return b"D" + struct.pack(">d", value)
    return b"Z"


def _xgb_json(path: Path) -> dict:
    import xgboost as xgb

    booster = xgb.Booster()
    booster.load_model(bytearray(parts(path)[1]))
    return json.loads(bytes(booster.save_raw("json")))


def _tree0(model: dict) -> dict:
    return model["learner"]["gradient_booster"]["model"]["trees"][0]


def _set(**changes):
    def edit(model: dict) -> None:
        for key, (index, value) in changes.items():
            _tree0(model)[key][index] = value

    return edit


# Each of these crashed the process (or read memory it should not) in XGBoost's loader or its
# predictor before the trees were checked.
_XGB_CRAFTED: dict[str, Callable[[dict], None]] = {
    "child out of range": _set(left_children=(0, 200)),
    "child is the root (a cycle)": _set(right_children=(0, 0)),
    "child of another parent": _set(parents=(1, 2)),
    "split on a feature out of range": _set(split_indices=(0, 10**6)),
    "arrays shorter than num_nodes": lambda m: _tree0(m)["left_children"].pop(),
    "num_nodes larger than the arrays": lambda m: _tree0(m)["tree_param"].update(num_nodes="99"),
    "more features than computed here": lambda m: m["learner"]["learner_model_param"].update(
        num_feature="500"),
    "iterations past the trees": lambda m: m["learner"]["gradient_booster"]["model"][
        "iteration_indptr"].append(99),
    # This loaded, and predicting then crashed the process (XGBoost files a tree by its id).
    "two trees of one id": lambda m: m["learner"]["gradient_booster"]["model"]["trees"][1].update(
        id=0),
    # This loaded, and predicting then raised XGBoost's own many-line error.
    "a multi-class objective": lambda m: m["learner"].update(
        objective={"name": "multi:softprob", "softmax_multiclass_param": {"num_class": "2"}}),
    # These loaded and predicted NaN for every program.
    "a NaN leaf value": _set(split_conditions=(0, math.nan), base_weights=(0, math.nan)),
    "a base score that is no number": lambda m: m["learner"]["learner_model_param"].update(
        base_score="[nan]"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(_XGB_CRAFTED))
def test_crafted_xgboost_trees_are_refused(
    cli: Cli, models: dict[str, Path], dataset: Path, tmp_path: Path, case: str
) -> None:
    model = _xgb_json(models["xgb"])
    _XGB_CRAFTED[case](model)
    path = model_file(tmp_path / "m.ttm", parts(models["xgb"])[0], _ubjson(model))
    message = refused(lambda: load_cost_model(path))
    assert message is not None and "its trees are damaged or foreign" in message
    check_model_file(cli, path, dataset)


@pytest.mark.parametrize("damage", ["a NaN weight", "a zero input scale"])
def test_network_weights_that_predict_nan_are_refused(
    cli: Cli, models: dict[str, Path], dataset: Path, tmp_path: Path, damage: str
) -> None:
    import torch

    from tensortune.costmodel.nn import _NUMPY_ARRAY_GLOBALS

    meta, state = parts(models["mlp"])
    with torch.serialization.safe_globals(_NUMPY_ARRAY_GLOBALS):
        saved = torch.load(io.BytesIO(state), weights_only=True)
    if damage == "a NaN weight":
        next(v for v in saved["net"].values() if v.is_floating_point())[0] = math.nan
    else:
        saved["scale"][3] = 0
    path = model_file(tmp_path / "m.ttm", meta, _torch_bytes(saved))
    message = refused(lambda: load_cost_model(path))
    named = "weights hold NaN" if damage == "a NaN weight" else "input scale"
    assert message is not None and named in message, message
    check_model_file(cli, path, dataset)


def test_network_weights_viewing_one_storage_are_refused(
    cli: Cli, models: dict[str, Path], dataset: Path, tmp_path: Path
) -> None:
    # torch.save writes a storage once, and loading built every member anew: 100 members of
    # views of one small storage loaded from a 25 kB file into 340 MB (any size, at the limits).
    import torch

    meta, _ = parts(models["mlp"])
    meta["params"]["members"] = 100
    meta["params"]["hidden"] = 64
    model = load_cost_model(models["mlp"])
    model.members, model.hidden = 100, 64
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in model._new_net(model.width_).state_dict().items()}
    storage = torch.zeros(max(s.numel() for s in shapes.values()))
    net = {k: storage[: s.numel()].view(s) for k, s in shapes.items()}
    state = _torch_bytes({"net": net, "scale": model.scale_, "width": model.width_})
    assert sum(v.numel() * v.element_size() for v in net.values()) > len(state)
    path = model_file(tmp_path / "m.ttm", meta, state)
    assert "sharing their storage" in (refused(lambda: load_cost_model(path)) or "")
    check_model_file(cli, path, dataset)


def test_a_truncated_xgboost_state_is_refused(models: dict[str, Path], tmp_path: Path) -> None:
    # XGBoost's own reader ran past the end of this buffer and allocated without bound.
    meta, state = parts(models["xgb"])
    path = model_file(tmp_path / "m.ttm", meta, state[:-40])
    assert "ends early" in (refused(lambda: load_cost_model(path)) or "")


def _lgbm(find: str, replace: str, count: int = 1) -> Callable[[str], str]:
    def edit(text: str) -> str:
        assert find in text
        return text.replace(find, replace, count)

    return edit


def _lgbm_line(key: str, index: int, value: str) -> Callable[[str], str]:
    """Set value ``index`` of the first line ``key=...`` of the model text."""

    def change(text: str) -> str:
        start = text.index(f"\n{key}=") + len(key) + 2
        end = text.index("\n", start)
        values = text[start:end].split(" ")
        values[index] = value
        return text[:start] + " ".join(values) + text[end:]

    return change


# Each of these crashed or aborted the process in LightGBM's parser or predictor.
_LGBM_CRAFTED: dict[str, Callable[[str], str]] = {
    "truncated in a tree": lambda t: t[: t.index("Tree=1") + 60],
    "a token LightGBM cannot parse": _lgbm_line("split_gain", 1, "0.0<23"),
    "tree_sizes pointing past the text": _lgbm_line("tree_sizes", 0, "9999"),
    "child out of range": _lgbm_line("left_child", 0, "40"),
    "leaf out of range": _lgbm_line("right_child", 0, "-40"),
    "split on a feature out of range": _lgbm_line("split_feature", 0, "100000"),
    "a categorical split without categories": _lgbm_line("decision_type", 0, "1"),
    "a NUL byte": _lgbm("num_leaves=", "num_le\x00aves="),
    "fewer features than computed here": _lgbm("max_feature_idx=192", "max_feature_idx=3"),
    # Loaded, and predicted NaN (its tree_sizes rewritten to fit, as a crafted file would be).
    "a NaN leaf value": lambda t: _sized(_lgbm_line("leaf_value", 0, "nan")(t)),
}


def _sized(text: str) -> str:
    """LightGBM model text with ``tree_sizes`` stating its trees' lengths again."""
    trees = re.split(r"(?=Tree=\d+\n)", text[text.index("Tree=0") : text.index("end of trees")])
    sizes = " ".join(str(len(b)) for b in trees[1:])
    return re.sub(r"(?m)^tree_sizes=.*$", f"tree_sizes={sizes}", text, count=1)


@pytest.mark.parametrize("case", list(_LGBM_CRAFTED))
def test_crafted_lightgbm_trees_are_refused(
    cli: Cli, models: dict[str, Path], dataset: Path, tmp_path: Path, case: str
) -> None:
    meta, state = parts(models["lgbm"])
    text = _LGBM_CRAFTED[case](state.decode())
    path = model_file(tmp_path / "m.ttm", meta, text.encode())
    message = refused(lambda: load_cost_model(path))
    assert message is not None and "its trees are damaged or foreign" in message
    check_model_file(cli, path, dataset)


def test_a_model_file_compressed_another_way_and_damaged_is_refused_in_one_line(
    cli: Cli, models: dict[str, Path], dataset: Path, tmp_path: Path
) -> None:
    """Zip members may be LZMA- or bzip2-compressed, or claim a method zipfile cannot read:
    a damaged one raises lzma's or zipfile's own errors, which must not escape as such."""
    meta, state = parts(models["xgb"])
    for how in ("lzma options", "lzma stream", "bzip2 stream", "unknown method"):
        path = tmp_path / f"{how.replace(' ', '-')}.ttm"
        method = zipfile.ZIP_BZIP2 if how.startswith("bzip2") else zipfile.ZIP_LZMA
        with zipfile.ZipFile(path, "w", compression=method) as z:
            z.writestr("meta.json", json.dumps(meta))
            z.writestr("state.bin", state)
        data = bytearray(path.read_bytes())
        with zipfile.ZipFile(path) as z:
            info = z.getinfo("state.bin")
        # The member's data starts after its 30-byte local header, name and extra field.
        start = info.header_offset + 30 + len(info.filename) + len(info.extra)
        if how == "lzma options":
            data[start + 4] = 0xFF  # the LZMA properties byte: lc/lp/pb out of range
        elif how == "unknown method":
            data[info.header_offset + 8] = 99  # the local header's compression method
            central = data.rfind(b"PK\x01\x02")  # the last member's central record
            data[central + 10] = 99
        else:
            for i in range(start + 20, min(start + 400, start + info.compress_size)):
                data[i] ^= 0x5A
        path.write_bytes(bytes(data))
        message = refused(lambda p=path: load_cost_model(p))
        assert message is not None and str(path) in message, how
        check_model_file(cli, path, dataset)


def test_saving_over_a_model_file_is_all_or_nothing(tmp_path: Path, monkeypatch) -> None:
    """A save that fails half-way (full disk, Ctrl-C) leaves the file it was replacing whole."""
    model = model_class("xgb")(**FAST["xgb"]).fit(programs())
    model.save(tmp_path / "m.ttm")
    before = (tmp_path / "m.ttm").read_bytes()

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(type(model), "_state", interrupted)
    with pytest.raises(KeyboardInterrupt):
        model.save(tmp_path / "m.ttm")
    assert (tmp_path / "m.ttm").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ttm"]
    monkeypatch.undo()
    (tmp_path / "link.ttm").symlink_to(tmp_path / "m.ttm")  # saved through a link: its target
    model.save(tmp_path / "link.ttm")
    assert (tmp_path / "link.ttm").is_symlink()  # not replaced by a file of its own
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.ttm", "m.ttm"]
    assert load_cost_model(tmp_path / "link.ttm").kind == "xgb"


def test_model_files_written_here_and_shipped_still_load(tmp_path: Path) -> None:
    import lightgbm as lgb

    from tensortune.costmodel.shipped import SHIPPED_DIR, checked

    data = programs()
    small = {"hidden": 8, "heads": 2, "epochs": 1}
    cases = [("xgb", FAST["xgb"]), ("lgbm", FAST["lgbm"]), ("ms-xgb", {}), ("tlp", small),
             ("pacm", {**small, "pattern_hidden": 8, "members": 2})]  # fmt: skip
    models = [model_class(kind)(**params).fit(data) for kind, params in cases]
    # Trees of one leaf (no split gains enough), whose other fields LightGBM writes empty.
    one_leaf = model_class("lgbm")()
    settings = {"objective": lambda pred, _: (pred - 1, np.ones_like(pred)),
                "min_gain_to_split": 1e9, "min_data_in_leaf": 1, "verbosity": -1}  # fmt: skip
    one_leaf.booster_ = lgb.train(settings, lgb.Dataset(data.blocks()[0]), num_boost_round=2)
    assert "\nnum_leaves=1\n" in one_leaf.booster_.model_to_string()
    for model in [*models, one_leaf]:
        model.save(tmp_path / "m.ttm")
        again = load_cost_model(tmp_path / "m.ttm")
        assert np.array_equal(again.predict(data), model.predict(data)), model.kind
    for path in sorted(SHIPPED_DIR.glob("*.ttm")):
        assert np.all(np.isfinite(load_cost_model(checked(path)).predict(data)))


def _with(**changes):
    return lambda meta, state: ({**meta, **changes}, state)


def _with_params(**changes):
    return lambda meta, state: ({**meta, "params": {**meta["params"], **changes}}, state)


# What a crafted meta.json or zip can claim, each refused before anything is built from it,
# and what the refusal names.
_ZIP_CRAFTED = {
    "a meta.json larger than any model's": (lambda m, s: (" " * 2**21 + json.dumps(m), s),
                                            "meta.json is larger than"),
    "a meta.json nested deeper than Python parses": (lambda m, s: ("[" * 100_000, s),
                                                     "not a tensortune cost model file"),
    "a network far larger than its weights": (_with_params(hidden=10**9), "hidden="),
    "more ensemble members than weights": (_with_params(members=10**9), "members="),
    "a setting of another type": (_with_params(hidden="8"), "hidden=8 is not a finite int"),
    "a chunk of zero programs": (_with_params(chunk=0), "chunk=0 is out of range"),
    "a negative learning rate": (_with_params(lr=-1.0), "lr=-1.0 is out of range"),
    "refinement that would train for ever": (_with_params(refine_epochs=10**9),
                                             "refine_epochs="),
    "a setting the kind does not have": (_with_params(nosuch=1), "no setting nosuch"),
    "another kind's state": (_with(kind="tlp"), "cannot restore the tlp model"),
    "GBDT kind, torch state": (_with(kind="xgb"), "xgb has no setting"),
    "a provenance that is not an object": (_with(provenance="by-task"), "provenance"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(_ZIP_CRAFTED))
def test_crafted_model_metadata_is_refused(
    cli: Cli, models: dict[str, Path], dataset: Path, tmp_path: Path, case: str
) -> None:
    craft, named = _ZIP_CRAFTED[case]
    meta, state = craft(*parts(models["mlp"]))
    path = model_file(tmp_path / "m.ttm", meta, state)
    message = refused(lambda: load_cost_model(path))
    assert message is not None and named in message, message
    check_model_file(cli, path, dataset)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


@_FUZZ
@given(
    data=st.data(),
    kind=st.sampled_from(list(FAST)),
    how=st.sampled_from(["random bytes", "truncated", "bytes flipped"]),
)
def test_any_damaged_model_file_is_loaded_or_refused_in_one_line(
    cli: Cli, models: dict[str, Path], dataset: Path, tmp_path: Path, data, kind: str, how: str
) -> None:
    whole = models[kind].read_bytes()
    if how == "random bytes":
        damaged = data.draw(st.binary(max_size=300))
    elif how == "truncated":
        damaged = whole[: data.draw(st.integers(0, len(whole) - 1))]
    else:
        flips = data.draw(st.lists(st.integers(0, len(whole) - 1), min_size=1, max_size=6))
        damaged = bytes(b ^ 0xA5 if i in flips else b for i, b in enumerate(whole))
    path = tmp_path / "damaged.ttm"
    path.write_bytes(damaged)
    check_model_file(cli, path, dataset)


@_FUZZ
@given(
    data=st.data(),
    kind=st.sampled_from(list(FAST)),
    how=st.sampled_from(["drop a key", "replace a value", "a setting", "format"]),
)
def test_any_mutated_meta_json_is_loaded_or_refused_in_one_line(
    cli: Cli, models: dict[str, Path], dataset: Path, tmp_path: Path, data, kind: str, how: str
) -> None:
    meta, state = parts(models[kind])
    if how == "drop a key":
        meta.pop(data.draw(st.sampled_from(sorted(meta))))
    elif how == "replace a value":
        meta[data.draw(st.sampled_from(sorted(meta)))] = data.draw(_json_values)
    elif how == "a setting":
        name = data.draw(st.sampled_from([*sorted(meta["params"]), "nosuch"]))
        meta["params"][name] = data.draw(
            _json_values | st.sampled_from([0, -1, 10**12, 2, 1.5, "8", True, *FAST])
        )
    else:
        meta["format_version"] = data.draw(st.sampled_from([2, 0, "1", 1.0, None]))
        meta["kind"] = data.draw(st.sampled_from([*FAST, "pacm", "tlp", "ms-xgb", "nope"]))
    path = model_file(tmp_path / "m.ttm", meta, state)
    check_model_file(cli, path, dataset)


@_FUZZ
@given(
    data=st.data(),
    kind=st.sampled_from(list(FAST)),
    how=st.sampled_from(["flip", "truncate", "insert", "random"]),
)
def test_any_mutated_model_state_is_loaded_or_refused_in_one_line(
    cli: Cli, models: dict[str, Path], dataset: Path, tmp_path: Path, data, kind: str, how: str
) -> None:
    meta, state = parts(models[kind])
    at = data.draw(st.integers(0, len(state) - 1))
    if how == "flip":
        state = state[:at] + bytes([data.draw(st.integers(0, 255))]) + state[at + 1 :]
    elif how == "truncate":
        state = state[:at]
    elif how == "insert":
        state = state[:at] + data.draw(st.binary(min_size=1, max_size=12)) + state[at:]
    else:
        state = data.draw(st.binary(max_size=200))
    check_model_file(cli, model_file(tmp_path / "m.ttm", meta, state), dataset)


# ---- MetaSchedule JSON databases ---------------------------------------------------------------


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A MetaSchedule JSON database of two workloads, five records."""
    base = tmp_path_factory.mktemp("db")
    with open_records(f"sqlite:///{base / 'src.db'}") as store:
        fill(store, "matmul:16,16,16", [3e-3, 1e-3, None, 2e-3])
        fill(store, "softmax:4,8", [5e-4])
        export_records(store, base / "export")
    return base / "export"


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A records store with one measured workload: what an import must not damage."""
    path = tmp_path / "r.db"
    with open_records(f"sqlite:///{path}") as s:
        fill(s, "matmul:16,16,16", [2e-3, 1e-3])
    return path


def check_import(cli: Cli, directory: Path, store: Path) -> None:
    """Imported, or refused in one line by the API and the command line, the store unchanged."""
    before = store.read_bytes()
    with open_records(f"sqlite:///{store}") as s:
        count = s.count()
        message = refused(lambda: import_records(s, directory))
        if message is not None:
            assert s.count() == count
    if message is None:
        return
    assert store.read_bytes() == before
    one_error(cli("records", "import", str(directory), "--records", f"sqlite:///{store}"),
              "error: DIR|URL: ")  # fmt: skip
    assert store.read_bytes() == before


_WORKLOADS, _RECORDS = "database_workload.json", "database_tuning_record.json"


def _edit_record(edit: Callable[[list], None], line: int = 0) -> Callable[[Path], None]:
    def change(directory: Path) -> None:
        lines = (directory / _RECORDS).read_text().splitlines()
        entry = json.loads(lines[line])
        edit(entry)
        lines[line] = json.dumps(entry)
        (directory / _RECORDS).write_text("\n".join(lines) + "\n")

    return change


def _trace(entry: list) -> list:
    return entry[1][0]


def _first_tiling(entry: list) -> list:
    """The decision of the first SamplePerfectTile of a record's trace."""
    insts, decisions = _trace(entry)
    return next(d for d in decisions if insts[d[0]][0] == "SamplePerfectTile")


def _workload_bytes(directory: Path, edit: Callable[[bytes], bytes]) -> None:
    lines = (directory / _WORKLOADS).read_text().splitlines()
    shash, blob = json.loads(lines[0])
    lines[0] = json.dumps([shash, base64.b64encode(edit(base64.b64decode(blob))).decode()])
    (directory / _WORKLOADS).write_text("\n".join(lines) + "\n")


# Each of these crashed TVM's reader (segmentation fault, division by zero, unbounded
# allocation) before the lines were checked.
_DB_CRAFTED: dict[str, Callable[[Path], None]] = {
    "a workload index past the end": _edit_record(lambda e: e.__setitem__(0, 99)),
    "a negative workload index": _edit_record(lambda e: e.__setitem__(0, -1)),
    "a decision for an instruction the trace lacks": _edit_record(
        lambda e: _trace(e)[1].append([999, 1])),
    "a null decision": _edit_record(lambda e: _first_tiling(e).__setitem__(1, None)),
    "a tile size of zero": _edit_record(lambda e: _first_tiling(e)[1].__setitem__(0, 0)),
    "a null attribute": _edit_record(lambda e: _trace(e)[0][0].__setitem__(2, [None, "main"])),
    "an annotation of null": _edit_record(lambda e: _trace(e)[0][2][1].__setitem__(0, None)),
    "a null run time": _edit_record(lambda e: e[1].__setitem__(1, [None])),
    "a workload of a huge stated length": lambda d: _workload_bytes(
        d, lambda b: struct.pack("<Q", 2**60) + b[8:]),
    "a workload that is not base64": lambda d: (d / _WORKLOADS).write_text('["1", "@@@"]\n'),
    "a workload graph with a cycle": lambda d: _workload_bytes(d, _cyclic_blob),
    "a null in an argument's shape": _edit_record(lambda e: e[1][3][0].__setitem__(2, [None, 16])),
    # Acyclic, but TVM's reader recurses along references until its stack runs out.
    "a workload graph nested 20,000 deep": lambda d: _workload_bytes(d, lambda _: _deep_blob()),
}  # fmt: skip


def _deep_graph(depth: int = 20_000) -> str:
    nodes = [{"type": "ffi.Array", "data": []}]
    nodes += [{"type": "ffi.Array", "data": [i]} for i in range(depth - 1)]
    return json.dumps({"root_index": depth - 1, "nodes": nodes,
                       "metadata": {"tvm_version": "0.27.0"}})  # fmt: skip


def _deep_blob() -> bytes:
    graph = _deep_graph().encode()
    return struct.pack("<Q", len(graph)) + graph


def _cyclic(text: str | bytes) -> str:
    """TVM's JSON graph of a module with its first non-empty array made to contain itself."""
    graph = json.loads(text)
    i = next(i for i, n in enumerate(graph["nodes"]) if n["type"] == "ffi.Array" and n["data"])
    graph["nodes"][i]["data"][0] = i
    return json.dumps(graph)


def _cyclic_blob(blob: bytes) -> bytes:
    graph = _cyclic(blob[8:]).encode()
    return struct.pack("<Q", len(graph)) + graph


@pytest.mark.parametrize("case", ["a workload graph with a cycle",
                                  "a workload of a huge stated length"])  # fmt: skip
def test_crafted_databases_are_refused_as_workloads_to_tune(
    cli: Cli, database: Path, tmp_path: Path, case: str
) -> None:
    # `tune --workloads-from` reads the workloads without importing them: the same checks.
    directory = tmp_path / "db"
    shutil.copytree(database, directory)
    _DB_CRAFTED[case](directory)
    message = one_error(cli("tune", "--workloads-from", str(directory), "--dry-run"))
    assert "database_workload.json:1" in message


@pytest.mark.parametrize("case", list(_DB_CRAFTED))
def test_crafted_database_lines_are_refused_naming_the_line(
    cli: Cli, database: Path, store: Path, tmp_path: Path, case: str
) -> None:
    directory = tmp_path / "db"
    shutil.copytree(database, directory)
    _DB_CRAFTED[case](directory)
    with open_records(f"sqlite:///{store}") as s:
        message = refused(lambda: import_records(s, directory))
    assert message is not None and str(directory) in message
    check_import(cli, directory, store)


def _leaf_paths(value: object, path: tuple = ()) -> list[tuple]:
    """Every position in parsed JSON, containers included."""
    out = [path]
    if isinstance(value, list):
        for i, v in enumerate(value):
            out += _leaf_paths(v, (*path, i))
    elif isinstance(value, dict):
        for k, v in value.items():
            out += _leaf_paths(v, (*path, k))
    return out


@_FUZZ
@given(
    data=st.data(),
    name=st.sampled_from([_WORKLOADS, _RECORDS]),
    how=st.sampled_from(["random line", "truncated line", "replace a part", "shuffle"]),
)
def test_any_mutated_database_is_imported_or_refused_in_one_line(
    cli: Cli, database: Path, store: Path, tmp_path: Path, data, name: str, how: str
) -> None:
    directory = tmp_path / "db"
    shutil.rmtree(directory, ignore_errors=True)
    shutil.copytree(database, directory)
    lines = (directory / name).read_text().splitlines()
    k = data.draw(st.integers(0, len(lines) - 1))
    if how == "random line":
        lines.insert(k, data.draw(st.text(max_size=40) | _json_values.map(json.dumps)))
    elif how == "truncated line":
        lines[k] = lines[k][: data.draw(st.integers(0, len(lines[k]) - 1))]
    elif how == "replace a part":
        # Valid JSON of the wrong shape or type anywhere in a record (in a workload: in its
        # outer list; the module's own graph is TVM's to check).
        entry = json.loads(lines[k])
        paths = _leaf_paths(entry)
        where = data.draw(st.sampled_from(paths))
        value = data.draw(_json_values | st.sampled_from([0, -1, 99, 10**9, "b0", "l2", [0]]))
        if not where:
            entry = value
        else:
            parent = entry
            for step in where[:-1]:
                parent = parent[step]
            parent[where[-1]] = value
        lines[k] = json.dumps(entry)
    else:
        lines = data.draw(st.permutations(lines))
    (directory / name).write_text("\n".join(lines) + "\n")
    check_import(cli, directory, store)


# ---- datasets ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two tasks of the shipped dataset on one hardware, 16 programs each, as a dataset."""
    from tensortune.datasets.shipped import DATASET_DIR

    out = tmp_path_factory.mktemp("dataset") / "tiny"
    out.mkdir()
    table = load_table(DATASET_DIR)
    hardware = table.column("hardware")[0].as_py()
    tasks = [1, 3]
    keep = pc.and_(pc.equal(table.column("hardware"), hardware),
                   pc.is_in(table.column("task_id"), value_set=pa.array(
                       tasks, type=table.schema.field("task_id").type)))  # fmt: skip
    rows = table.filter(keep)
    rows = rows.take(np.concatenate([np.flatnonzero(rows.column("task_id").to_numpy() == t)[:16]
                                     for t in tasks]))  # fmt: skip
    pq.write_table(rows, out / "programs.parquet")
    workloads = pq.read_table(DATASET_DIR / "workloads.parquet")
    pq.write_table(workloads.filter(pc.is_in(workloads.column("task_id"),
                                             value_set=pa.array(tasks))),
                   out / "workloads.parquet")  # fmt: skip
    card = read_card(DATASET_DIR).data
    card.update(name="tiny", programs=rows.num_rows, tasks=len(tasks),
                successful=int(pc.sum(pc.greater(rows.column("label"), 0)).as_py()),
                hardware={hardware: card["hardware"][hardware]},
                files={"programs.parquet": file_sha256(out / "programs.parquet"),
                       "workloads.parquet": file_sha256(out / "workloads.parquet")})  # fmt: skip
    (out / "card.json").write_text(json.dumps(card))
    assert train(out, cost_model="xgb", params={"n_rounds": 2}).test_programs > 0
    return out


def check_dataset(cli: Cli, directory: Path, model: Path) -> None:
    """Read, trained on and scored, or refused in one line by the API and the command line."""
    messages = [
        refused(lambda: checked_file(directory, read_card(directory))),  # dataset info's check
        refused(lambda: train(directory, cost_model="xgb", params={"n_rounds": 2})),
        refused(lambda: evaluate(str(model), dataset=directory, split="within-task")),
    ]
    commands = [("dataset", "info", str(directory)),
                ("train", "--dataset", str(directory), "--cost-model", "xgb", "--param",
                 "n_rounds=2", "--json"),
                ("evaluate", "--cost-model", str(model), "--dataset", str(directory), "--split",
                 "within-task", "--json")]  # fmt: skip
    for message, command in zip(messages, commands, strict=True):
        result = cli(*command)
        if message is None:
            assert result[0] == 0, result
        else:
            one_error(result, "error: DATASET: " if command[0] == "dataset" else "error: ")


def _rewrite_table(directory: Path, edit, *, checksum: bool = True) -> None:
    """Replace programs.parquet by ``edit(table)`` (a table, or raw bytes), with the card's
    checksum made to match unless ``checksum`` is false: a crafted file would match."""
    path = directory / "programs.parquet"
    new = edit(pq.read_table(path), path.read_bytes())
    if isinstance(new, bytes):
        path.write_bytes(new)
    else:
        pq.write_table(new, path)
    if checksum:
        card = json.loads((directory / "card.json").read_text())
        card["files"]["programs.parquet"] = file_sha256(path)
        (directory / "card.json").write_text(json.dumps(card))


def _cast(name: str, kind):
    def edit(table, _):
        i = table.schema.get_field_index(name)
        return table.set_column(i, pa.field(name, kind), table.column(name).cast(kind))

    return edit


def _replace_column(name: str, make):
    def edit(table, _):
        i = table.schema.get_field_index(name)
        return table.set_column(i, table.schema.field(name), make(table))

    return edit


def _first_row(name: str, value: object):
    """Set the first row's value of column ``name``."""
    return _replace_column(name, lambda t: pa.array([value, *t.column(name).to_pylist()[1:]],
                                                    type=t.schema.field(name).type))  # fmt: skip


def _every_row(name: str, value: object):
    return _replace_column(name, lambda t: pa.array([value] * t.num_rows,
                                                    type=t.schema.field(name).type))  # fmt: skip


# Each of these ended in a traceback (KeyError, ArrowInvalid, ValueError from numpy) before the
# tables were checked.
def _values_of(kind) -> st.SearchStrategy:
    """Values of an Arrow type, the odd ones included (NaN, infinities, empty lists)."""
    if pa.types.is_integer(kind):
        return st.integers(-(2**31), 2**31 - 1)
    if pa.types.is_floating(kind):
        return st.floats(width=32 if kind == pa.float32() else 64)
    if pa.types.is_string(kind):
        return st.text(max_size=10)
    return st.lists(_values_of(kind.value_type), max_size=4)


_DATASET_CRAFTED = {
    "truncated table": lambda t, raw: raw[: len(raw) // 2],
    "garbage table": lambda t, raw: b"PAR1" + b"\x00" * 64 + b"PAR1",
    "a column missing": lambda t, raw: t.drop_columns(["label"]),
    "a column of another type": _cast("label", pa.string()),
    "an empty label": _first_row("label", None),
    "a label of NaN": _first_row("label", float("nan")),
    "features of another width": _every_row("per_store", [[1.0] * 5]),
    "a program without features rows": _first_row("trace_tokens", []),
    "an empty row inside features": _first_row("per_store", [None]),
    "a short hardware vector": _every_row("hardware_vector", [0.0]),
    "a NaN among the features": _first_row("per_store", [[float("nan")] * F.PER_STORE_WIDTH]),
    "an infinite hardware value": _first_row("hardware_vector", [float("inf")] * F.HARDWARE_WIDTH),
    "a cost of zero": _first_row("cost", 0.0),
    "a cost of NaN": _first_row("cost", float("nan")),
    "an infinite run time": _first_row("run_secs", [float("inf")]),
    "a target that is not JSON": _first_row("target", "nope"),
}


@pytest.mark.parametrize("case", list(_DATASET_CRAFTED))
def test_crafted_dataset_tables_are_refused(
    cli: Cli, dataset: Path, models: dict[str, Path], tmp_path: Path, case: str
) -> None:
    directory = tmp_path / "ds"
    shutil.copytree(dataset, directory)
    _rewrite_table(directory, _DATASET_CRAFTED[case])
    message = refused(lambda: train(directory, cost_model="xgb", params={"n_rounds": 2}))
    assert message is not None and "programs.parquet" in message
    check_dataset(cli, directory, models["xgb"])


def test_a_card_whose_hardware_is_not_described_is_refused_before_anything_is_written(
    cli: Cli, dataset: Path, tmp_path: Path
) -> None:
    directory = tmp_path / "ds"
    shutil.copytree(dataset, directory)
    card = json.loads((directory / "card.json").read_text())
    card["hardware"] = {label: {} for label in card["hardware"]}
    (directory / "card.json").write_text(json.dumps(card))
    out = tmp_path / "pruned"
    message = one_error(cli("dataset", "prune", "--dataset", str(directory), "--out", str(out),
                            "--keep", "0.5", "--method", "random"))  # fmt: skip
    assert "card.json" in message and "hardware" in message
    assert not out.exists() or not any(out.iterdir())


def test_lowered_features_of_other_types_or_other_programs_are_not_read(
    cli: Cli, dataset: Path, tmp_path: Path
) -> None:
    from tensortune.datasets.subset import write_subset

    directory = tmp_path / "ds"
    shutil.copytree(dataset, directory)
    ids = pq.read_table(directory / "programs.parquet", columns=["program_id"]).column(0)
    meta = {b"tensortune.lowered_version": b"2"}
    schema = pa.schema([("program_id", pa.int64()), ("lowered", pa.list_(pa.string()))],
                       metadata=meta)  # fmt: skip
    pq.write_table(pa.table({"program_id": ids, "lowered": [["x"]] * len(ids)}, schema=schema),
                   directory / "lowered.parquet")  # fmt: skip
    message = one_error(cli("dataset", "info", str(directory)))
    assert "lowered.parquet" in message
    # A dataset written over another one keeps none of the old programs' features.
    (directory / "lowered.parquet").unlink()
    (directory / "lowered.parquet").write_bytes(b"stale")
    write_subset(dataset, [0, 1, 2], directory, description="three programs", overwrite=True)
    assert not (directory / "lowered.parquet").exists()


def test_lowered_features_unfinished_or_of_another_table_are_not_read(
    cli: Cli, dataset: Path, tmp_path: Path
) -> None:
    """A checkpoint of a killed ``dataset lower`` lacks programs that would read as ones that
    could not be lowered; a file copied from another dataset has its ids but not its programs."""
    from tensortune.datasets.lowered import LOWERED_FILE, _write, lower_dataset, read_lowered
    from tensortune.features.lowered import LOWERED_WIDTH

    directory = tmp_path / "ds"
    shutil.copytree(dataset, directory)
    ids = pq.read_table(directory / "programs.parquet", columns=["program_id"]).column(0)
    ids = ids.to_pylist()
    rows = {i: np.ones(LOWERED_WIDTH, np.float32) for i in ids}
    table = json.loads((directory / "card.json").read_text())["files"]["programs.parquet"]
    _write(directory / LOWERED_FILE, rows, table=table, complete=False)
    assert read_lowered(directory, ids) is None
    code, out, _ = cli("dataset", "info", str(directory))
    assert code == 0 and "unfinished" in out
    assert lower_dataset(directory, workers=1)["lowered_now"] == 0  # all there: finished
    assert np.array_equal(read_lowered(directory, ids), np.ones((len(ids), LOWERED_WIDTH)))
    _write(directory / LOWERED_FILE, rows, table="0" * 64, complete=True)
    assert read_lowered(directory, ids) is None
    code, out, _ = cli("dataset", "info", str(directory))
    assert code == 0 and "stale" in out
    # NaN says a program did not lower; an infinity is refused (XGBoost fails on it natively)
    rows[ids[0]] = np.where(np.arange(LOWERED_WIDTH) == 0, np.nan, 1).astype(np.float32)
    rows[ids[1]] = np.full(LOWERED_WIDTH, np.inf, np.float32)
    _write(directory / LOWERED_FILE, rows, table=table, complete=True)
    with pytest.raises(TensortuneError, match="infinity"):
        read_lowered(directory, ids)


def test_a_workloads_file_without_a_task_the_table_uses_is_refused_in_one_line(
    cli: Cli, dataset: Path, tmp_path: Path
) -> None:
    """Both files pass their checksums (a crafted card), but a program's task has no module."""
    from tensortune.datasets.build import file_sha256

    directory = tmp_path / "ds"
    shutil.copytree(dataset, directory)
    first = pq.read_table(directory / "programs.parquet", columns=["task_id"]).column(0)[0]
    workloads = pq.read_table(directory / "workloads.parquet")
    pq.write_table(workloads.filter(pc.not_equal(workloads.column("task_id"), first)),
                   directory / "workloads.parquet")  # fmt: skip
    card = json.loads((directory / "card.json").read_text())
    card["files"]["workloads.parquet"] = file_sha256(directory / "workloads.parquet")
    (directory / "card.json").write_text(json.dumps(card))
    message = one_error(cli("dataset", "lower", "--dataset", str(directory)))
    assert f"no module for task {first.as_py()}" in message


@_FUZZ
@given(
    data=st.data(),
    how=st.sampled_from(["drop a key", "replace a value", "not an object", "task weights"]),
)
def test_any_mutated_dataset_card_is_read_or_refused_in_one_line(
    cli: Cli, dataset: Path, models: dict[str, Path], tmp_path: Path, data, how: str
) -> None:
    directory = tmp_path / "ds"
    shutil.rmtree(directory, ignore_errors=True)
    shutil.copytree(dataset, directory)
    card = json.loads((directory / "card.json").read_text())
    if how == "drop a key":
        card.pop(data.draw(st.sampled_from(sorted(card))))
    elif how == "replace a value":
        card[data.draw(st.sampled_from(sorted(card)))] = data.draw(_json_values)
    elif how == "not an object":
        card = data.draw(_json_values)
    else:
        card["task_weights"] = data.draw(st.dictionaries(
            st.text(max_size=4), _json_values | st.dictionaries(
                st.sampled_from(["1", "3", "x"]), _json_values), max_size=2))  # fmt: skip
    (directory / "card.json").write_text(json.dumps(card))
    check_dataset(cli, directory, models["xgb"])


@_FUZZ
@given(
    data=st.data(),
    how=st.sampled_from(["truncate", "flip bytes", "drop a column", "cast a column", "a value"]),
    checksum=st.booleans(),
)
def test_any_damaged_dataset_table_is_read_or_refused_in_one_line(
    cli: Cli, dataset: Path, models: dict[str, Path], tmp_path: Path, data, how: str,
    checksum: bool,
) -> None:  # fmt: skip
    directory = tmp_path / "ds"
    shutil.rmtree(directory, ignore_errors=True)
    shutil.copytree(dataset, directory)
    names = pq.read_schema(directory / "programs.parquet").names
    if how == "truncate":
        size = (directory / "programs.parquet").stat().st_size
        at = data.draw(st.integers(0, size - 1))
        edit = lambda t, raw: raw[:at]  # noqa: E731
    elif how == "flip bytes":
        size = (directory / "programs.parquet").stat().st_size
        flips = data.draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=4))
        edit = lambda t, raw: bytes(b ^ 0x5A if i in flips else b  # noqa: E731
                                    for i, b in enumerate(raw))  # fmt: skip
    elif how == "drop a column":
        gone = data.draw(st.sampled_from(names))
        edit = lambda t, raw: t.drop_columns([gone])  # noqa: E731
    elif how == "cast a column":
        edit = _cast(
            data.draw(st.sampled_from(names)),
            data.draw(st.sampled_from([pa.string(), pa.float64(), pa.int64()])),
        )
    else:
        name = data.draw(st.sampled_from(names))
        kind = pq.read_schema(directory / "programs.parquet").field(name).type
        value = data.draw(st.none() | _values_of(kind))
        row = data.draw(st.integers(0, 31))

        def edit(table, _):
            values = table.column(name).to_pylist()
            values[row] = value
            return _replace_column(name, lambda t: pa.array(values, type=kind))(table, _)

    try:
        _rewrite_table(directory, edit, checksum=checksum)
    except (pa.ArrowException, ValueError):
        return  # pyarrow cannot make such a table: nothing to read
    check_dataset(cli, directory, models["xgb"])


# ---- records stores: rows written by another tool, or by hand ----------------------------------


def _sql(statement: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        db = sqlite3.connect(path)
        with db:
            db.executescript(statement)
        db.close()

    return damage


def _cyclic_module(path: Path) -> None:
    db = sqlite3.connect(path)
    with db:
        (text,) = db.execute("SELECT mod_json FROM workloads WHERE id = 1").fetchone()
        db.execute("UPDATE workloads SET mod_json = ? WHERE id = 1", (_cyclic(text),))
    db.close()


# Before the rows were checked: a segmentation fault (the cycle), tracebacks (KeyError,
# JSONDecodeError), a tune that stopped with exit status 0, a negative "best" time shown.
_STORE_DAMAGED: dict[str, Callable[[Path], None]] = {
    "a module graph with a cycle": _cyclic_module,
    "run times that are not JSON": _sql("UPDATE records SET run_secs = 'oops' WHERE id = 1"),
    "run times that are text": _sql("""UPDATE records SET run_secs = '["a"]' WHERE id = 1"""),
    "a negative cost": _sql("UPDATE records SET cost = -1 WHERE cost IS NOT NULL"),
    # the least cost is the best record: one that is not its run times' median would be chosen
    "a cost that is not the median of its run times": _sql(
        "UPDATE records SET cost = cost / 10 WHERE id = 1"),
    "a cost on a failed run": _sql(
        "UPDATE records SET status = 'run_error', run_secs = '[]' WHERE id = 1"),
    "a target that is not JSON": _sql("UPDATE records SET target = 'nope'"),
    "hardware described without a CPU": _sql(
        """UPDATE hardware SET description = '{"arch": "x"}'"""),
    "a record of hardware the store does not describe": _sql(
        "PRAGMA foreign_keys = OFF; UPDATE records SET hardware_id = 'deadbeef'"),
}  # fmt: skip


def _each_record(column: str, edit: Callable[[list], None]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        db = sqlite3.connect(path)
        with db:
            for rid, text in db.execute(f"SELECT id, {column} FROM records").fetchall():
                value = json.loads(text)
                edit(value)
                db.execute(f"UPDATE records SET {column} = ? WHERE id = ?",
                           (json.dumps(value), rid))  # fmt: skip
        db.close()

    return damage


def _first_tile(trace: list) -> list:
    insts, decisions = trace
    return next(d for d in decisions if insts[d[0]][0] == "SamplePerfectTile")


_STORE_TRACES: dict[str, Callable[[Path], None]] = {
    "a trace with a null attribute": _each_record(
        "trace", lambda t: t[0][0].__setitem__(2, [None, "main"])),
    "a null tile decision": _each_record("trace", lambda t: _first_tile(t).__setitem__(1, None)),
    "args_info with a null shape": _each_record("args_info", lambda a: a[0].__setitem__(2, None)),
}  # fmt: skip


@pytest.mark.parametrize("case", list(_STORE_TRACES))
def test_store_rows_whose_traces_would_crash_tvm_never_reach_it(
    cli: Cli, store: Path, tmp_path: Path, case: str
) -> None:
    # Each of these killed `records export`, `dataset build` and a tune's warm start with a
    # segmentation fault; exported into another store, the row crashed that store's readers too.
    _STORE_TRACES[case](store)
    url = f"sqlite:///{store}"
    other = tmp_path / "mine.db"
    with open_records(f"sqlite:///{other}") as s:
        fill(s, "matmul:16,16,16", [3e-3])
    before = other.read_bytes()
    assert "is damaged" in one_error(cli("records", "export", f"sqlite:///{other}", "--records",
                                         url))  # fmt: skip
    assert other.read_bytes() == before
    tune = ("tune", "--workload", "matmul:16,16,16", "--trials", "1", "--work-dir",
            str(tmp_path / "w"))  # fmt: skip
    for command in (("records", "export", str(tmp_path / "ms")),
                    ("dataset", "build", str(tmp_path / "ds")), tune):  # fmt: skip
        result = cli(*command, "--records", url)
        if result[0] != 0:
            one_error(result)


def test_a_record_whose_arguments_are_not_json_is_named_for_them(store: Path) -> None:
    # Its trace was blamed ("the trace is not [instructions, decisions]").
    import dataclasses

    from tensortune.errors import RecordsError
    from tensortune.records.convert import to_tuning_record

    with open_records(f"sqlite:///{store}") as s:
        record = next(iter(s.query()))
    with pytest.raises(RecordsError, match="args_info is not a list"):
        to_tuning_record(dataclasses.replace(record, args_info="oops"), None)


def test_a_damaged_dataset_trace_is_a_row_that_does_not_replay(store: Path) -> None:
    from tensortune.datasets.lowered import replayed
    from tensortune.records.convert import candidate_from_trace

    with open_records(f"sqlite:///{store}") as s:
        (workload,) = s.workloads()
        trace = next(iter(s.query())).trace_json()
    mod = workload.mod()
    assert replayed(mod, json.dumps(trace)) is not None
    _first_tile(trace)[1] = None  # TVM's replay read through it (a segmentation fault)
    assert replayed(mod, json.dumps(trace)) is None
    with pytest.raises(ValueError, match="is null"):
        candidate_from_trace(mod, trace)


@pytest.mark.parametrize("case", list(_STORE_DAMAGED))
def test_damaged_store_rows_are_read_or_refused_in_one_line(
    cli: Cli, store: Path, case: str
) -> None:
    _STORE_DAMAGED[case](store)
    url = f"sqlite:///{store}"
    before = store.read_bytes()
    with open_records(url, create=False) as s:
        messages = [refused(call) for call in (
            lambda: list(s.query()), s.hardware, s.summary,
            lambda: [w.mod() for w in s.workloads()])]  # fmt: skip
    assert any(messages) or case == "a record of hardware the store does not describe"
    tune = ("tune", "--workload", "matmul:16,16,16", "--trials", "1", "--work-dir",
            str(store.parent / "w"))  # fmt: skip
    for command in (("records", "stats"), ("records", "show", "--json"), tune):
        result = cli(*command, "--records", url)
        if result[0] != 0:
            assert "no such option" not in result[2]
            one_error(result)
        elif "--json" in command:
            json.loads(result[1])
        if command[0] == "records":
            assert store.read_bytes() == before
