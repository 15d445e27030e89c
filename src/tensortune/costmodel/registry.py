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


def model_kinds() -> list[str]:
    return list(_classes())
