"""Cost models by name, and reading a model file back into the right class."""

from __future__ import annotations

import inspect
import json
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
    return out


def new_model(kind: str, seed: int, settings: dict | None = None) -> CostModel:
    """An unfitted ``kind`` model with ``settings``, seeded with ``seed`` when it takes one."""
    cls = model_class(kind)
    settings = dict(settings or {})
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
        model = model_class(kind)(**_saved_settings(kind, meta.get("params")))
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
            RuntimeError, RecursionError) as e:  # fmt: skip
        # EOFError, zlib.error: a damaged member; RuntimeError: an encrypted one;
        # RecursionError: JSON nested deeper than Python's parser goes.
        raise TensortuneError(f"{path} is not a tensortune cost model file "
                              f"({last_line(e)})") from None  # fmt: skip


def _saved_settings(kind: str, params: object) -> dict:
    """A model file's settings, checked against the kind's: the known names, each of the type
    of its default (they size the model, and reach numpy, torch and the libraries)."""
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
    return params
