"""Kernels with no tuned record, built from the unmeasured program the analyzer ranks first.

Why: on CPUs TVM builds a kernel that has no record from its unscheduled TIR (one thread, no
vectors, no tiles), so a matrix product or a convolution runs hundreds of times slower than
tuned: gpt2-block built with an empty store took 3.1 s a call, against 7 ms tuned.  That
happens whenever the store lacks a task: a model compiled before (or without) tuning, a graph
that the torch.compile backend cuts differently, a store tuned before a rewrite changed the
tasks.  The register-blocked seeds (``search/seeds.py``) are programs of the right shape for
any task with a tiled block, and the analyzer (``search/analyzer``) ranks them without
measuring anything; kernels without a tiled block (Winograd's transforms, copies, reductions)
get a few random programs of their design space instead: parallel loops and vectors where
MetaSchedule's rules put them.  The best, if the analyzer rates it above the bare loops, stands
in for the tuned kernel.  Random programs are not ranked with the seeds: the analyzer rated
one of gpt2-block's 128x768->3072 products above every seed, and it ran at 3 GFLOP/s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tensortune.compat import MeasureCandidate, tvm
from tensortune.search.analyzer import Analyzer
from tensortune.search.analyzer.machine import machine_for
from tensortune.search.seeds import seed_candidates
from tensortune.search.space import RandomSchedules

if TYPE_CHECKING:
    from tensortune.hardware import Platform

# Random programs of the design space of an unrecorded kernel that has no seeds.
SAMPLES = 16


def seed_unrecorded(mod: tvm.IRModule, platform: Platform) -> tvm.IRModule:
    """``mod`` (fused, records applied) with each unscheduled kernel replaced by the program the
    analyzer ranks first among its seeds (``SAMPLES`` random ones where it has none), marked
    scheduled as a tuned kernel is."""
    if platform.simd_bits == 0:  # not a CPU: the GPU pipeline schedules these itself
        return mod
    functions = dict(mod.functions_items())
    replaced = False
    # One kernel at a time: two threads generating design spaces at once got 1 sketch instead
    # of 3 for a gpt2-block product now and then (TVM's space generation is not thread-safe).
    for gv, func in mod.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc) or _scheduled(func):
            continue
        best = _best_program(func, platform)
        if best is not None:
            functions[gv], replaced = best, True
    if not replaced:
        return mod
    return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)


def _best_program(func: tvm.tirx.PrimFunc, platform: Platform) -> tvm.tirx.PrimFunc | None:
    picked = unrecorded_candidate(tvm.IRModule({"main": func}), platform)
    if picked is None:
        return None
    best = picked.sch.mod["main"]
    for key, value in (func.attrs or {}).items():
        best = best.with_attr(key, value)  # the kernel's own attributes, as applied records keep
    return best.with_attr("tirx.is_scheduled", True)


def unrecorded_candidate(task: tvm.IRModule, platform: Platform) -> MeasureCandidate | None:
    """The program a kernel with no record is built with, as a candidate to measure: the
    analyzer's first among the seeds of ``task`` (random programs where it has none); ``None``
    where the analyzer rates the bare loops first or the space generator cannot take ``task``.
    Transfer-tuning measures it beside the transferred schedules, so that a kernel none of them
    fits is not left with the bare loops.  None on GPUs, which build such kernels otherwise."""
    if platform.simd_bits == 0:
        return None
    try:  # one design space for the seeds and the random programs
        # on one thread, so that compiling a model twice builds the same kernels
        sampler = RandomSchedules(task, platform, SAMPLES, limit=SAMPLES, threads=1)
        try:
            postprocs = sampler.context.space_generator.postprocs
            # random programs only where there are no seeds (see the module's docstring)
            candidates = (seed_candidates(sampler.context.mod, sampler.design_spaces, postprocs,
                                          platform)
                          or sampler.take(SAMPLES))  # fmt: skip
        finally:
            sampler.close()
    except Exception:  # a kernel MetaSchedule's space generator cannot take stays as it is
        return None
    # the bare loops compete too: a tiny kernel may not pay for a parallel loop's wake-up
    programs = [task, *(c.sch.mod for c in candidates)]
    scores = Analyzer(machine_for(platform)).scores(programs)
    first = int(np.argmax(scores))
    if scores.max() <= 0 or first == 0:  # nothing better it can estimate
        return None
    return candidates[first - 1]


def _scheduled(func: tvm.tirx.PrimFunc) -> bool:
    return bool(func.attrs is not None and func.attrs.get("tirx.is_scheduled", False))
