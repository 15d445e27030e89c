"""The one place a search strategy is made from what a user names, and the verifier each
strategy gets when the user names none."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from tensortune.errors import TensortuneError

if TYPE_CHECKING:
    from tensortune.hardware import Platform

# MetaSchedule's own strategies, by the names its TuneContext takes.
MS_STRATEGIES = ("evolutionary", "replay-trace", "replay-func")
STRATEGIES = ("draft-verify", "alt", *MS_STRATEGIES)


def strategy_from(spec: object, options: Mapping[str, object] | None = None) -> object:
    """A search strategy from its name (``STRATEGIES``) or a strategy object (ours or
    MetaSchedule's).  It is a prototype: every task searches with a clone of it.
    ``options`` sets draft-then-verify's settings by name (``OPTION_RANGES``), over those
    ``alt`` implies; only the two names take them."""
    from tensortune.compat import ms

    if spec in ("draft-verify", "alt"):
        from tensortune.search.draft_verify import (
            DraftThenVerify,
            check_options,
            option_defaults,
        )

        # alt: ALT's validity filter and uncertainty/score ping-pong (search/alt.py)
        implied = {"validity": 1, "pingpong": 1} if spec == "alt" else {}
        changed, defaults = check_options(options or {}), option_defaults()  # checked
        # one given at its default still overrides what alt implies (check_options drops it)
        given = {key: changed.get(key, defaults[key]) for key in options or {}}
        return DraftThenVerify(**{**implied, **given})
    if options:
        raise TensortuneError("draft-then-verify options apply to the strategies "
                              "draft-verify and alt only", param="draft_options")  # fmt: skip
    if isinstance(spec, str):
        if spec not in MS_STRATEGIES:
            raise TensortuneError(f"'{spec}' is not a search strategy; known: "
                                  f"{', '.join(STRATEGIES)}", param="strategy")  # fmt: skip
        return ms.search_strategy.SearchStrategy.create(spec)
    if not hasattr(spec, "generate_measure_candidates"):
        raise TensortuneError(f"{type(spec).__name__} is not a search strategy", param="strategy")
    return spec


def strategy_for_task(prototype: object, builder: object, records: object | None = None,
                      verifier: object | None = None) -> object:  # fmt: skip
    """A fresh copy of ``prototype`` for one task; ours may watch what ``builder``'s builds
    take (``DraftThenVerify.watch_builder``), read earlier runs' outcomes from ``records``
    (a ``StoreDatabase``: ``DraftThenVerify.read_records``) and learn how ``verifier``, the
    cost model, scores (``DraftThenVerify.watch_verifier``)."""
    if hasattr(prototype, "watch_builder"):
        prototype.watch_builder(builder)
    if records is not None and hasattr(prototype, "read_records"):
        prototype.read_records(records)
    if verifier is not None and hasattr(prototype, "watch_verifier"):
        prototype.watch_verifier(verifier)
    return copy_of(prototype)


def copy_of(strategy: object) -> object:
    """A fresh copy of ``strategy``: through its ``copy`` where it has one (ours: TVM hands a
    ``clone`` back as the bare C++ object, our Python attributes out of reach), else
    ``clone``; a strategy with neither is shared."""
    copy = getattr(strategy, "copy", None)
    if callable(copy):
        return copy()
    return strategy.clone() if hasattr(strategy, "clone") else strategy


def default_verifier(strategy: object, platform: Platform) -> object:
    """The cost model that ``strategy`` gets when none is named (how it learns online is
    ``cost_model_from``'s rule for the model it is).

    MetaSchedule's strategies get MetaSchedule's ``XGBModel``, as its ``tune_tasks`` gives them.
    Draft-then-verify gets the model shipped for the platform, adapted as the search benchmark
    found best (``costmodel.factory``), or, when none is shipped for its ISA, our XGBoost model
    learned online from scratch.
    """
    from tensortune.search.draft_verify import DraftThenVerify

    if not isinstance(strategy, DraftThenVerify):
        return "xgb"
    from tensortune.costmodel.shipped import NoShippedModel, shipped_model

    try:
        return shipped_model(platform)
    except NoShippedModel:
        from tensortune.costmodel.gbdt import XGBoostModel

        return XGBoostModel()
