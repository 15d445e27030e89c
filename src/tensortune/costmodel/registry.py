"""Cost models by name."""

from __future__ import annotations

from tensortune.errors import TensortuneError


def _classes() -> dict[str, type]:
    from tensortune.costmodel.gbdt import LightGBMModel, XGBoostModel
    from tensortune.costmodel.nn import MLPModel, TLPModel
    from tensortune.costmodel.pacm import PaCMModel
    from tensortune.costmodel.reference import MetaScheduleXGB

    return {
        c.kind: c
        for c in (XGBoostModel, LightGBMModel, MLPModel, TLPModel, PaCMModel, MetaScheduleXGB)
    }


def model_class(kind: str) -> type:
    classes = _classes()
    if kind not in classes:
        raise TensortuneError(f"unknown cost model '{kind}'; known: {', '.join(classes)}")
    return classes[kind]


def model_settings(kind: str, raw: dict[str, str]) -> dict[str, object]:
    """``raw`` text settings (``{"members": "5"}``) of a ``kind`` model, as its ``__init__``'s
    defaults are typed; a one-line error for an unknown name or a value of the wrong type."""
    import inspect

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


def model_kinds() -> list[str]:
    return list(_classes())
