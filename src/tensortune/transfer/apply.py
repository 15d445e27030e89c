"""Replay a schedule tuned for one kernel on another kernel of the same class.

A MetaSchedule trace names blocks and loops by their place in the loop nest, so it replays on
any kernel of the same class (``transfer.classes``).  What breaks is the tile sizes:
``SamplePerfectTile`` decisions whose product was the source loop's extent.  TVM repairs such a
decision by itself, badly (from the innermost tile out, a factor that does not divide what is
left becomes all of it: an innermost tile of 16 on a loop of 1000 becomes 1000).  We re-fit the
decision first, tile by tile from the innermost out, each to the divisor of what is left that is
nearest to the source's factor (on a log scale), the innermost kept within the instruction's
``max_innermost_factor``; the outermost takes the rest.  So the register tile and the vector
width survive, and only the outer tiles absorb the new extent.

Other decisions do not depend on extents (unroll depth, vectorization) and are kept; a compute
location that no longer exists is sampled afresh (TVM draws a new one when the decision is
dropped).  The postprocessors then run on the result as they do on every searched candidate.
Outcomes are counted: exact (nothing changed), refit, or invalid with the reason.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tensortune.errors import last_line

if TYPE_CHECKING:
    from tensortune.compat import MeasureCandidate

EXACT, REFIT, INVALID = "exact", "refit", "invalid"


@dataclass
class Transferred:
    """A source trace replayed on a target kernel: the candidate, or why there is none."""

    candidate: MeasureCandidate | None
    refitted: int = 0  # tile decisions re-fitted to the target's extents
    resampled: int = 0  # decisions that no longer applied, drawn afresh
    error: str | None = None

    @property
    def outcome(self) -> str:
        if self.candidate is None:
            return INVALID
        return EXACT if not (self.refitted or self.resampled) else REFIT


def refit_tiles(decision: list[int], extent: int, max_innermost: int | None = None) -> list[int]:
    """Tile factors for a loop of ``extent``, as close to ``decision`` as divisors allow; the
    product of the result is ``extent``.  ``decision`` is outermost first, like MetaSchedule's."""
    if extent <= 0:
        return list(decision)
    out = [1] * len(decision)
    left = extent
    for i in range(len(decision) - 1, 0, -1):
        cap = left if i < len(decision) - 1 or not max_innermost else min(left, max_innermost)
        out[i] = _nearest_divisor(left, max(int(decision[i]), 1), cap)
        left //= out[i]
    out[0] = left
    return out


def _nearest_divisor(n: int, want: int, cap: int) -> int:
    divisors = [d for d in range(1, min(n, cap) + 1) if n % d == 0]
    # ties go to the smaller factor: a smaller tile never exceeds the source's registers
    return min(divisors, key=lambda d: (abs(math.log(d / want)), d))


def transfer_trace(source_mod: object, trace: list | str, target_mod: object,
                   postprocs: list, *, seed: int = 0,
                   inline: Sequence[str] = ()) -> Transferred:  # fmt: skip
    """``trace`` (a record's trace JSON, tuned on ``source_mod``) replayed on ``target_mod``
    with re-fitted tiles, then finished by ``postprocs`` (the target context's).  ``seed``
    draws the decisions that must be drawn afresh, so a replay gives the same program again.
    ``inline`` names target blocks inlined into their consumers first: the leading blocks of a
    longer elementwise epilogue than the source's (``KernelClass.core``), so that the blocks
    left line up with the source's one for one."""
    from tensortune.compat import ArgInfo, MeasureCandidate, block_names, tvm
    from tensortune.records.convert import replay_trace

    try:
        src = tvm.s_tir.Schedule(source_mod)
        replay_trace(trace, src)
    except Exception as e:  # TVM's own errors: the record does not fit its workload
        return Transferred(None, error=f"source trace does not replay: {last_line(e)}")
    try:
        shaped = _inlined(tvm.s_tir.Schedule(target_mod), inline).mod
    except Exception as e:
        return Transferred(None, error=f"epilogue does not inline: {last_line(e)}")
    source_trace = _renamed(src.trace, block_names(source_mod), block_names(shaped))
    for resample in (False, True):
        sch = _inlined(tvm.s_tir.Schedule(target_mod, seed=seed + 1), inline)  # seed >= 1
        counts = {"refitted": 0, "resampled": 0}
        try:
            provider = _provider(sch, counts, resample)
            source_trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=provider)
        except Exception as e:  # an illegal step: try again with fresh compute locations
            error = last_line(e)
            continue
        # Marked as MetaSchedule marks them: a replay that removes postprocessing (the
        # evolutionary search a warm start seeds, a transfer from this store) removes these.
        sch.enter_postproc()
        for post in postprocs:
            try:
                accepted = post.apply(sch)
            except Exception as e:  # some postprocessors raise where others return False
                return Transferred(None, error=f"postprocessor {_kind(post)}: {last_line(e)}")
            if not accepted:
                return Transferred(None, error=f"postprocessor {_kind(post)} refused it")
        cand = MeasureCandidate(sch, ArgInfo.from_entry_func(sch.mod, remove_preproc=True))
        return Transferred(cand, counts["refitted"], counts["resampled"])
    return Transferred(None, error=f"does not apply: {error}")


def _provider(sch: object, counts: dict[str, int], resample: bool) -> object:
    def provide(inst: object, inputs: list, attrs: list, decision: object) -> object:
        kind = inst.kind.name
        if kind == "SamplePerfectTile" and decision is not None:
            extent = _int(sch.get(inputs[0]).extent)
            old = [int(d) for d in decision]
            if extent is None or math.prod(old) == extent:
                return decision
            new = refit_tiles(old, extent, _int(attrs[1]) if len(attrs) > 1 else None)
            counts["refitted"] += 1
            return new
        if kind == "SampleComputeLocation" and resample:
            counts["resampled"] += 1
            return None
        return decision

    return provide


def _int(value: object) -> int | None:
    v = getattr(value, "value", value)
    return int(v) if isinstance(v, int) and v > 0 else None


def _kind(post: object) -> str:
    return type(post).__name__


def _inlined(sch: object, names: Sequence[str]) -> object:
    for name in names:
        sch.compute_inline(sch.get_sblock(name))
    return sch


def _renamed(trace: object, source_names: list[str], target_names: list[str]) -> object:
    """``trace`` with its block names changed to the target's, block by block in order: one
    class may name its blocks differently (``lv88_red`` / ``lv227_red``)."""
    from tensortune.compat import tvm

    names = dict(zip(source_names, target_names, strict=False))
    if all(a == b for a, b in names.items()):
        return trace
    Instruction = tvm.s_tir.schedule.Instruction
    insts, decisions = [], {}
    for inst in trace.insts:
        new = inst
        if inst.kind.name == "GetSBlock" and str(inst.attrs[0]) in names:
            attrs = [names[str(inst.attrs[0])], *inst.attrs[1:]]
            new = Instruction(inst.kind, inst.inputs, attrs, inst.outputs)
        insts.append(new)
        if inst in trace.decisions:
            decisions[new] = trace.decisions[inst]
    return tvm.s_tir.Trace(insts, decisions)
