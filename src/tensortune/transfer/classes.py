"""Kernel classes: which tasks may borrow each other's schedules.

Transfer-tuning (Gibson & Cano, PACT 2022) only moves a schedule between kernels of the same
*class*: the same operators with the same fused epilogue, whatever the shapes.  Their classes
are parsed from Ansor's compute-DAG text; ours are read from the PrimFunc itself, so any
workload MetaSchedule can tune gets one.

A class is the sequence of the function's blocks, each described by what a MetaSchedule trace
names or depends on and a shape change leaves alone:

- the block's name, without numbering (``T_add1``) or the input's name TOPI puts in some
  (``lv88_red``, ``x_sum``): a trace finds blocks by name, and transfer renames them in order
  (``transfer.apply``),
- its iterators' kinds (spatial ``S`` / reduction ``R``): the loop nest a trace splits,
- for every buffer it reads or writes, which of its iterators index each dimension (a function
  parameter or an intermediate): the layout and broadcast pattern (a bias add is not a residual
  add, NCHW is not NHWC, a stride is not visible),
- the intrinsics its body calls (an ``exp`` is not a ``tanh``).

Extents, strides, paddings and dilations are left out: they are what transfer adapts to.

A class also has a *core*: the same signature cut after the last block that reduces.  Kernels
with one core differ only in their elementwise epilogue (a residual add more), and a schedule
of the shorter epilogue fits the longer once its extra blocks are inlined (``transfer.apply``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tvm

# Numbers that tell blocks of one function apart (``T_add1``) or come from the graph's variable
# names (``lv88_red``); the ``2`` of ``conv2d`` is part of the name.
_NUMBERS = re.compile(r"\d+(?=_|$)")
_KINDS = {0: "S", 2: "R"}  # IterVar.DataPar, IterVar.CommReduce; anything else "O"


@dataclass(frozen=True)
class KernelClass:
    """``name``: the blocks' names, readable; ``key``: a digest of the full signature, which is
    what decides whether two kernels are of one class; ``signature`` is that signature."""

    name: str
    key: str
    signature: str
    # The kernel without its elementwise epilogue: a digest of the blocks up to the last one
    # that reduces (None where none does), and how many blocks follow it.  Kernels with one
    # core but different epilogues (a residual add more) can still share a schedule once the
    # longer epilogue is inlined to the shorter one's length (``transfer.apply``).
    core: str | None = None
    epilogue: int = 0

    def __str__(self) -> str:
        return f"{self.name}#{self.key[:6]}"


def kernel_class(mod: tvm.IRModule) -> KernelClass:
    """The class of a task's unscheduled module (its ``main`` function)."""
    from tensortune.compat import sblocks, task_func

    func = task_func(mod)
    found = sblocks(func.body)
    # Buffers the function allocates are intermediates; the rest are its parameters.
    local = {buf.name for b in found for buf in b.alloc_buffers}
    buffers = {r.source.name for b in found for r in [*b.reads, *b.writes]} - local
    params = sorted(buffers, key=len, reverse=True)  # the longest prefix wins
    blocks = [_block_signature(b, local, params) for b in found if b.name_hint != "root"]
    signature = ";".join(s for _, s, _ in blocks)
    names = []
    for name, _, _ in blocks:
        if name not in names:
            names.append(name)
    anchor = _anchor([reduces for _, _, reduces in blocks])
    core = None
    if anchor is not None:
        core = _digest(";".join(s for _, s, _ in blocks[: anchor + 1]))
    epilogue = 0 if anchor is None else len(blocks) - anchor - 1
    return KernelClass("+".join(names), _digest(signature), signature, core, epilogue)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _anchor(reduces: list[bool]) -> int | None:
    """The index of the last block that reduces: what follows it is the epilogue."""
    return max((i for i, r in enumerate(reduces) if r), default=None)


def epilogue_blocks(mod: tvm.IRModule) -> list[str]:
    """The names of the blocks after the last reducing one, in order (see ``KernelClass``)."""
    from tensortune.compat import sblocks, task_func

    func = task_func(mod)
    found = [b for b in sblocks(func.body) if b.name_hint != "root"]
    anchor = _anchor([any(int(iv.iter_type) == 2 for iv in b.iter_vars) for b in found])
    return [] if anchor is None else [b.name_hint for b in found[anchor + 1 :]]


def _block_signature(block: object, local: set, params: list[str]) -> tuple[str, str, bool]:
    """The block's class name, its signature, and whether it reduces."""
    from tensortune.compat import tvm, walk_tir

    undefined_vars = tvm.tirx.analysis.undefined_vars
    name = block.name_hint
    # TOPI names some blocks after the function's input (``lv88_red``, ``x_mean``): the
    # graph's variable name, not the operator
    for param in params:
        if name.startswith(f"{param}_") and len(name) > len(param) + 1:
            name = "in_" + name[len(param) + 1 :]
            break
    name = _NUMBERS.sub("", name)
    position = {iv.var: i for i, iv in enumerate(block.iter_vars)}
    kinds = "".join(_KINDS.get(int(iv.iter_type), "O") for iv in block.iter_vars)

    def access(region: object) -> str:
        where = "t" if region.source.name in local else "p"
        dims = []
        for rng in region.region:
            used = sorted({position[v] for v in undefined_vars(rng.min) if v in position})
            dims.append(".".join(str(i) for i in used) or "c")
        return where + "[" + ",".join(dims) + "]"

    calls: set[str] = set()

    def call(node: object) -> None:
        if hasattr(node, "args") and hasattr(getattr(node, "op", None), "name"):
            calls.add(str(node.op.name))

    walk_tir(block.body, call)
    reads = " ".join(access(r) for r in block.reads)
    writes = " ".join(access(w) for w in block.writes)
    intrinsics = ",".join(sorted(calls))
    return name, f"{name}({kinds}) {reads} -> {writes} {{{intrinsics}}}", "R" in kinds
