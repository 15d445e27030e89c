"""The one place a cost model for a search is made from what a user names.

A search takes a MetaSchedule cost model.  Users name one by MetaSchedule's names, by one of our
model files, by ``default`` (the model shipped for the target), or hand over an object: one of
our fitted models, or any MetaSchedule cost model (used as it is).  Ours are frozen, refined
after every measured batch, or adapted with MoA; ``auto`` picks what our benchmark found best.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING

from tensortune.costmodel.base import CostModel
from tensortune.errors import TensortuneError, about

if TYPE_CHECKING:
    from tensortune.hardware import Platform

# MetaSchedule's own cost models, by the names its tune_tasks takes.
MS_COST_MODELS = ("xgb", "random", "mlp")
# How one of our models learns while it tunes: frozen, refined after every batch, momentum
# online adaptation, or "auto": MoA for a neural model, refined otherwise (benchmarks/RESULTS.md,
# ninth session: refining the pre-trained neural verifier after every round reached
# MetaSchedule's latency 1.93x sooner, adapting it as MoA does 5.38x sooner).
ONLINE_MODES = (False, True, "moa", "auto")


def cost_model_from(spec: object, platform: Platform, *, online: bool | str = "auto",
                    screen: object = "auto") -> object:  # fmt: skip
    """A MetaSchedule cost model for searches on ``platform``.

    ``spec``: MetaSchedule's ``xgb``, ``random`` or ``mlp``; ``default`` (the model shipped for
    the platform, see ``costmodel.shipped``); a ``.ttm`` model file; a fitted ``CostModel``; or
    any MetaSchedule cost model object, used as it is.  ``online`` (see ``ONLINE_MODES``) applies
    to our models; MetaSchedule's learn online by themselves.  ``screen`` (one of our models,
    named as ``spec`` is): a cheaper model that passes only its best candidates on to ours
    (``LearnedCostModel``); ``"auto"``: the shipped model screens a model that reads
    lowered-loop features, nothing screens the others; ``None``: no screen.
    """
    from tensortune.compat import ms

    if not isinstance(online, bool | str) or online not in ONLINE_MODES:  # 1 == True
        raise TensortuneError(f"{online!r} is not one of {ONLINE_MODES}", param="online")
    with about("cost_model"):
        model = _ours(spec, platform)
    if model is None:
        if isinstance(spec, str):
            if online not in (True, "auto"):
                raise TensortuneError(
                    f"MetaSchedule's {spec} always learns online; frozen or MoA applies to "
                    "a tensortune model (default or a .ttm file)", param="online"
                )  # fmt: skip
            if spec == "xgb":
                from tensortune.hardware import usable_cores

                return ms.cost_model.XGBModel(num_tuning_cores=usable_cores())
            return ms.cost_model.CostModel.create(spec)
        return spec  # a MetaSchedule cost model object
    from tensortune.costmodel.moa import MomentumAdapted, can_adapt
    from tensortune.costmodel.ms_adapter import LearnedCostModel

    if not model.fitted:  # learns from this search's measurements alone
        if online in (False, "moa"):
            raise TensortuneError(f"the {model.kind} model has not been fitted: it can only "
                                  "learn online, from scratch", param="online")  # fmt: skip
        online = True
    if online == "auto":
        online = "moa" if can_adapt(model) else True
    with about("screen"):
        screening = _screen(screen, model, platform)
    if online == "moa":
        if not can_adapt(model):
            raise TensortuneError(
                f"MoA adapts a fitted neural cost model (mlp, tlp, pacm or hwattn), "
                f"not {model.kind}",
                param="online",
            )
        return LearnedCostModel(MomentumAdapted(model), platform, online=True, screen=screening)
    if online and model is spec:  # learning online refines it: the caller's stays as given
        model = copy.deepcopy(model)
    return LearnedCostModel(model, platform, online=bool(online), screen=screening)


def _screen(spec: object, model: CostModel, platform: Platform) -> CostModel | None:
    """The model that screens candidates for ``model`` (``cost_model_from``'s ``screen``)."""
    if spec is None:
        return None
    if spec == "auto":
        if not model.uses_lowered:
            return None
        from tensortune.costmodel.shipped import NoShippedModel

        try:
            screen = _ours("default", platform)
        except NoShippedModel:  # none shipped for this target: the model scores every one
            return None
        return None if screen is None or screen.uses_lowered else screen
    screen = _ours(spec, platform)
    if screen is None:
        raise TensortuneError("a screen is one of our fitted models: default or a .ttm file")
    return screen


def _ours(spec: object, platform: Platform) -> CostModel | None:
    """Our model that ``spec`` names (``None``: one of MetaSchedule's)."""
    from tensortune.costmodel.registry import load_cost_model
    from tensortune.costmodel.shipped import shipped_model

    if isinstance(spec, CostModel):
        return spec
    if not isinstance(spec, str | Path):
        if not hasattr(spec, "predict"):
            raise TensortuneError(f"{type(spec).__name__} is not a cost model")
        return None
    text = str(spec)
    if text in MS_COST_MODELS:
        return None
    if text == "default":
        return load_cost_model(shipped_model(platform))
    if text.endswith(".ttm") or Path(text).exists():
        if not Path(text).is_file():
            raise TensortuneError(f"model file not found: {text}")
        return load_cost_model(text)
    raise TensortuneError(
        f"'{text}' is not a cost model: give {', '.join(MS_COST_MODELS)} (MetaSchedule's), "
        "default (the pre-trained model shipped for the target) or a .ttm model file"
    )
