"""Cost models by name, and reading a model file back into the right class."""

from __future__ import annotations

import inspect
import json
import zipfile
from pathlib import Path

from tensortune.costmodel.base import FORMAT, FORMAT_VERSION, CostModel
from tensortune.errors import TensortuneError


def _classes() -> dict[str, type[CostModel]]:
    from tensortune.costmodel.gbdt import LightGBMModel, XGBoostModel
    from tensortune.costmodel.nn import MLPModel, TLPModel
    from tensortune.costmodel.pacm import PaCMModel
    from tensortune.costmodel.reference import MetaScheduleXGB

    return {
        c.kind: c
        for c in (XGBoostModel, LightGBMModel, MLPModel, TLPModel, PaCMModel, MetaScheduleXGB)
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


def load_cost_model(path: str | Path) -> CostModel:
    """Read a model file written by :meth:`CostModel.save`, refusing foreign or stale ones."""
    from tensortune.features import schema_hash

    try:
        with zipfile.ZipFile(path) as z:
            meta = json.loads(z.read("meta.json"))
            state = z.read("state.bin")
    except (OSError, zipfile.BadZipFile, KeyError, ValueError) as e:
        raise TensortuneError(f"{path} is not a tensortune cost model file ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise TensortuneError(f"{path} is not a tensortune cost model file")
    if meta.get("format_version") != FORMAT_VERSION:
        raise TensortuneError(f"{path} has model format v{meta.get('format_version')}; this "
                              f"tensortune reads v{FORMAT_VERSION}")  # fmt: skip
    if meta.get("feature_schema") != schema_hash():
        raise TensortuneError(
            f"{path} was trained on feature schema {meta.get('feature_schema')}, "
            f"this tensortune computes {schema_hash()}: retrain it"
        )
    kind = str(meta.get("kind"))
    try:
        model = model_class(kind)(**meta["params"])
        model._restore(state)
    except TensortuneError as e:
        raise TensortuneError(f"{path}: {e}") from None
    except Exception as e:
        raise TensortuneError(f"{path}: cannot restore the {kind} model ({e})") from None
    if meta.get("provenance"):
        model.provenance_ = meta["provenance"]
    return model
