"""Samplers choose which not-yet-measured programs of a task to measure next."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from tensortune.records.convert import trace_text
from tensortune.search.space import sample_candidates

if TYPE_CHECKING:
    from tensortune.hardware import Platform


class Sampler(Protocol):
    """Proposes up to ``count`` candidates of ``mod`` whose traces are not in ``exclude``."""

    name: str

    def sample(
        self, mod, platform: Platform, count: int, *, seed: int, exclude: set[str]
    ) -> list: ...


class RandomSampler:
    """Uniform draws from the design space (TenSet's random share), without repeats.

    Small design spaces run dry: after ``patience`` draws that bring nothing new it returns
    what it has, possibly fewer than asked.
    """

    name = "random"

    def __init__(self, patience: int = 3) -> None:
        self.patience = patience

    def sample(self, mod, platform: Platform, count: int, *, seed: int, exclude: set[str]) -> list:
        chosen: dict[str, object] = {}
        misses = 0
        attempt = 0
        while len(chosen) < count and misses < self.patience:
            fresh = 0
            for cand in sample_candidates(mod, platform, count - len(chosen),
                                          seed=seed * 1000 + attempt):  # fmt: skip
                key = trace_text(cand.sch.trace)
                if key not in exclude and key not in chosen:
                    chosen[key] = cand
                    fresh += 1
            misses = 0 if fresh else misses + 1
            attempt += 1
        return list(chosen.values())
