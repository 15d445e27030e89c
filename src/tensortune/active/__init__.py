"""Active learning: measure only the programs that teach a cost model the most (BALTO, ALT).

- ``Pool`` (``pool.py``): the programs a learner may choose from, with distance vectors.
- ``make_selector`` / ``SELECTORS`` (``selectors.py``): random, diversity, balto,
  balto-weighted, uncertainty and alt, all behind ``Selector.select(pool, labelled, model,
  batch)``.
- ``grow`` (``loop.py``): the loop that grows a measured set with a selector, round by round.
- ``ValidityFilter`` (``validity.py``): ALT's classifier of programs that will fail.

Built on them: the offline study (``tensortune.compare.active_learning.study``, ``bench al``),
``tensortune.train.selection.select_dataset`` (``dataset select``) and the online collection
``tensortune.collect.active.collect_active`` (``dataset collect --sampler``).
"""

from __future__ import annotations

from tensortune.active.loop import FRACTIONS, ROUNDS_PER_STEP, grow, study_sizes
from tensortune.active.pool import Pool, pool_from_programs, pooled, program_vectors
from tensortune.active.selectors import SELECTORS, Selector, make_selector
from tensortune.active.validity import ValidityFilter

__all__ = ["FRACTIONS", "ROUNDS_PER_STEP", "SELECTORS", "Pool", "Selector", "ValidityFilter",
           "grow", "make_selector", "pool_from_programs", "pooled", "program_vectors",
           "study_sizes"]  # fmt: skip
