"""Cost models by name, and reading a model file back into the right class."""

from __future__ import annotations

import inspect
import json
import lzma
import math
import zipfile
import zlib
from pathlib import Path

from tensortune.costmodel.base import FORMAT, FORMAT_VERSION, CostModel
from tensortune.errors import TensortuneError, last_line, shown


def _classes() -> dict[str, type[CostModel]]:
    from tensortune.costmodel.gbdt import LightGBMModel, XGBoostModel
    from tensortune.costmodel.hwattn import HardwareAttentionModel
    from tensortune.costmodel.nn import MLPModel, TLPModel
    from tensortune.costmodel.pacm import PaCMModel
    from tensortune.costmodel.reference import MetaScheduleXGB

    return {
        c.kind: c
        for c in (
            XGBoostModel,
            LightGBMModel,
            MLPModel,
            TLPModel,
            PaCMModel,
            HardwareAttentionModel,
            MetaScheduleXGB,
        )
    }


def model_class(kind: str) -> type[CostModel]:
    classes = _classes()
    if kind not in classes:
        raise TensortuneError(f"unknown cost model '{kind}'; known: {', '.join(classes)}")
    return classes[kind]


def model_kinds() -> list[str]:
    return list(_classes())


# The values each setting may take, by name (a name means the same in every model), least and
# most, both included.  Sizes and counts are capped far above any useful value: settings come
# from the command line and from model files, and a file must not make a model allocate without
# bound or train for ever.
_SMALL = 1e-12
SETTING_RANGES: dict[str, tuple[float, float]] = {
    "n_rounds": (1, 100_000), "refine_rounds": (0, 100_000), "max_depth": (1, 64),
    "eta": (_SMALL, 1), "learning_rate": (_SMALL, 1), "min_child_weight": (0, 1e9),
    "gamma": (0, 1e9), "num_leaves": (2, 131_072), "min_data_in_leaf": (0, 1e9),
    "threads": (0, 4096), "lowered": (0, 1), "seed": (0, 2**63 - 1),
    "hidden": (1, 16_384), "pattern_hidden": (1, 16_384), "hardware_hidden": (1, 16_384),
    "heads": (1, 256), "max_tokens": (1, 4096), "epochs": (1, 100_000),
    "refine_epochs": (0, 100_000), "lr": (_SMALL, 10), "weight_decay": (0, 10),
    "chunk": (1, 1_000_000), "batch_chunks": (1, 1_000_000), "members": (1, 1000),
    "early_stopping_rounds": (1, 100_000),
}  # fmt: skip


# The width each kind's attention splits among its heads.
_ATTENDED = {"tlp": "hidden", "hwattn": "hidden", "pacm": "pattern_hidden"}


def _check_heads(kind: str, given: dict, defaults: dict) -> None:
    """Attention splits its width evenly among its heads (torch refuses it otherwise, deep
    inside the first fit)."""
    width = _ATTENDED.get(kind)
    if width is None or not {"heads", width} & given.keys():
        return
    heads, dim = given.get("heads", defaults["heads"]), given.get(width, defaults[width])
    if isinstance(heads, int) and isinstance(dim, int) and heads > 0 and dim % heads:
        raise TensortuneError(f"{kind} setting heads={heads} does not divide {width}={dim}")


def _check_range(kind: str, name: str, value: object) -> None:
    low, high = SETTING_RANGES.get(name, (-math.inf, math.inf))
    if isinstance(value, int | float) and not low <= value <= high:
        raise TensortuneError(f"{kind} setting {name}={shown(value)} is out of range "
                              f"[{low:g}, {high:g}]")  # fmt: skip


def model_settings(kind: str, raw: dict[str, str]) -> dict[str, object]:
    """``raw`` text settings (``{"members": "5"}``) of a ``kind`` model, as its ``__init__``'s
    defaults are typed; a one-line error for an unknown name or a value of the wrong type."""
    defaults = {n: p.default for n, p in inspect.signature(model_class(kind)).parameters.items()}
    out: dict[str, object] = {}
    for name, text in raw.items():
        if name not in defaults:
            raise TensortuneError(f"{kind} has no setting '{name}'; its settings: "
                                  f"{', '.join(defaults)}")  # fmt: skip
        kind_of = type(defaults[name])
        if kind_of not in (int, float, str):  # every model's settings are these today
            raise TensortuneError(f"{kind} setting {name} cannot be given as text")
        try:
            out[name] = kind_of(text)
        except ValueError:
            raise TensortuneError(f"{kind} setting {name}={text!r}: expected "
                                  f"{kind_of.__name__}") from None  # fmt: skip
        _check_range(kind, name, out[name])
    return out  # how they go together (heads and width) is checked on them all: check_settings


def new_model(kind: str, seed: int, settings: dict | None = None) -> CostModel:
    """An unfitted ``kind`` model with ``settings``, seeded with ``seed`` when it takes one."""
    cls = model_class(kind)
    settings = dict(check_settings(kind, settings or {}))
    if "seed" in inspect.signature(cls).parameters:
        settings.setdefault("seed", seed)
    return cls(**settings)


def load_cost_model(path: str | Path) -> CostModel:
    """Read a model file written by :meth:`CostModel.save`, refusing foreign or stale ones.

    Model files are shared, so everything in one is checked as data before it is used: the
    settings against the kind's, the state by the kind's own reader (which runs nothing from
    the file); whatever is wrong ends in one ``TensortuneError`` naming the file.
    """
    from tensortune.features import schema_hash
    from tensortune.features.lowered import LOWERED_VERSION

    meta, state = _members(path)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise TensortuneError(f"{path} is not a tensortune cost model file")
    if meta.get("format_version") != FORMAT_VERSION:
        raise TensortuneError(f"{path} has model format v{shown(meta.get('format_version'))}; "
                              f"this tensortune reads v{FORMAT_VERSION}")  # fmt: skip
    if meta.get("feature_schema") != schema_hash():
        raise TensortuneError(
            f"{path} was trained on feature schema {shown(meta.get('feature_schema'))}, "
            f"this tensortune computes {schema_hash()}: retrain it"
        )
    kind = shown(meta.get("kind"))
    provenance = meta.get("provenance")
    try:
        model = model_class(kind)(**check_settings(kind, meta.get("params")))
        # evaluate takes the split from here
        if provenance is not None and not (
            isinstance(provenance, dict)
            and all(isinstance(provenance.get(k), str | None) for k in ("dataset", "split"))
        ):
            raise TensortuneError("its provenance is not an object with text dataset and split")
    except TensortuneError as e:
        raise TensortuneError(f"{path}: {e}") from None
    # Lowered-loop features change apart from the schema (only models that read them care);
    # files from before the stamp read version 1.
    lowered_version = meta.get("lowered_version", 1)
    if model.uses_lowered and lowered_version != LOWERED_VERSION:
        raise TensortuneError(
            f"{path} reads lowered-loop features of version {shown(lowered_version)}, this "
            f"tensortune computes version {LOWERED_VERSION}: refit it (`tensortune train "
            "--param lowered=1`)"
        )
    try:
        model._restore(state)
    except TensortuneError as e:
        raise TensortuneError(f"{path}: cannot restore the {kind} model: {e}") from None
    except Exception as e:
        raise TensortuneError(f"{path}: cannot restore the {kind} model ({type(e).__name__}: "
                              f"{last_line(e)})") from None  # fmt: skip
    if provenance:
        model.provenance_ = provenance
    return model


# Far above any model's meta.json and state (a few MB), far below what would exhaust memory: a
# file that claims more is refused before it is decompressed.
_MAX_META, _MAX_STATE = 2**20, 2**30


def _members(path: str | Path) -> tuple[object, bytes]:
    """``meta.json`` (parsed) and the state bytes of a model file."""
    try:
        with zipfile.ZipFile(path) as z:
            for name, limit in (("meta.json", _MAX_META), ("state.bin", _MAX_STATE)):
                if z.getinfo(name).file_size > limit:
                    raise TensortuneError(f"{path}: its {name} is larger than {limit} bytes")
            return json.loads(z.read("meta.json")), z.read("state.bin")
    except (OSError, zipfile.BadZipFile, KeyError, ValueError, EOFError, zlib.error,
            lzma.LZMAError, NotImplementedError, RuntimeError, RecursionError) as e:  # fmt: skip
        # EOFError, zlib.error, lzma.LZMAError: a damaged member; NotImplementedError: a
        # compression zipfile cannot read; RuntimeError: an encrypted member; RecursionError:
        # JSON nested deeper than Python's parser goes.
        raise TensortuneError(f"{path} is not a tensortune cost model file "
                              f"({last_line(e)})") from None  # fmt: skip


def check_settings(kind: str, params: object) -> dict:
    """A ``kind`` model's settings (from a model file, or a caller), checked against the kind's:
    the known names, each of the type of its default and in its range (they size the model,
    and reach numpy, torch and the libraries)."""
    defaults = {n: p.default for n, p in inspect.signature(model_class(kind)).parameters.items()}
    if not isinstance(params, dict):
        raise TensortuneError(f"its {kind} settings are not an object")
    for name, value in params.items():
        if name not in defaults:
            raise TensortuneError(f"{kind} has no setting {shown(name)}")
        kind_of = type(defaults[name])
        fits = type(value) is kind_of or (kind_of is float and type(value) is int)
        if not fits or (isinstance(value, float) and not math.isfinite(value)):
            raise TensortuneError(f"{kind} setting {name}={shown(value)} is not a finite "
                                  f"{kind_of.__name__}")  # fmt: skip
        _check_range(kind, name, value)
    _check_heads(kind, params, defaults)
    return params
