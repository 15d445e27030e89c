"""A stored trace and argument list checked before TVM reads them.

TVM's readers of a trace (``Trace.apply_json_to_schedule``, ``TuningRecord.from_json``) and of
an argument list (``ArgInfo.from_json``) trust their input: a null where an attribute, a
decision or a shape should be is followed into memory that is not there, and the process dies
of a segfault.  Traces reach TVM from files users share (MetaSchedule databases, records
stores, datasets), so every path that hands one to TVM asks here first: the shape TVM writes,
and no null where TVM would read through it.  The checks read parsed JSON only (no TVM), so a
command refuses a damaged file before TVM loads.
"""

from __future__ import annotations

import json

# Instructions whose decision is a list of tile sizes.
_TILINGS = ("SamplePerfectTile", "SamplePartitionedTile")
# Attributes that may be null: TransformLayout's pad value (none: the layout needs no padding),
# which MetaSchedule's RewriteLayout writes into every record of a kernel with weights.
_OPTIONAL_ATTRS = {"TransformLayout": (2,)}


def trace_problem(trace: object) -> str | None:
    """What is wrong with ``trace`` (parsed JSON: ``[instructions, decisions]``, each
    instruction ``[kind, inputs, attrs, outputs]``, each decision ``[index of an instruction,
    value]``), or None."""
    if not (
        isinstance(trace, list) and len(trace) == 2 and all(isinstance(p, list) for p in trace)
    ):
        return "the trace is not [instructions, decisions]"
    instructions, decisions = trace
    for k, inst in enumerate(instructions):
        if not (
            isinstance(inst, list)
            and len(inst) == 4
            and type(inst[0]) is str
            and all(isinstance(part, list) for part in inst[1:])
            and all(type(name) is str for name in inst[3])
        ):
            return f"trace instruction {k} is not [kind, inputs, attrs, outputs]"
        # TVM type-checks most inputs, but takes a null attribute, or a null for the block or
        # loop that an instruction acts on (its first input), for a value it can use.
        optional = _OPTIONAL_ATTRS.get(inst[0], ())
        attrs = [a for i, a in enumerate(inst[2]) if i not in optional or a is not None]
        if holds_null(attrs) or (inst[1] and inst[1][0] is None):
            return f"trace instruction {k} has a null attribute or acts on null"
    for decision in decisions:
        if not (
            isinstance(decision, list)
            and len(decision) == 2
            and type(decision[0]) is int
            and 0 <= decision[0] < len(instructions)
        ):
            return "a trace decision is not [index of an instruction, value]"
        if holds_null(decision[1]):
            return f"the decision of trace instruction {decision[0]} is null"
        # Tile sizes divide loop extents: TVM divides by a zero one (the process dies).
        kind = instructions[decision[0]][0]
        if kind in _TILINGS and not (
            isinstance(decision[1], list) and all(type(f) is int and f >= 1 for f in decision[1])
        ):
            return (f"the {kind} decision of trace instruction {decision[0]} is not a list of "
                    "tile sizes of at least 1")  # fmt: skip
    return None


def args_info_problem(args_info: object) -> str | None:
    """What is wrong with ``args_info`` (parsed JSON: one ``["TENSOR", dtype, shape]`` per
    argument, as MetaSchedule writes them), or None."""
    if not (isinstance(args_info, list) and all(
            isinstance(a, list) and a and type(a[0]) is str for a in args_info)):  # fmt: skip
        return "args_info is not a list of argument descriptions"
    for k, arg in enumerate(args_info):
        if holds_null(arg):  # TVM reads a null shape or dimension as a container (a segfault)
            return f"argument {k} of args_info holds a null"
        if arg[0] == "TENSOR" and not (
            len(arg) == 3
            and type(arg[1]) is str
            and isinstance(arg[2], list)
            and all(type(d) is int and d >= 0 for d in arg[2])
        ):
            return f'argument {k} of args_info is not ["TENSOR", dtype, shape]'
    return None


def parsed(value: object) -> object:
    """``value`` parsed if it is JSON text, as it is otherwise; None for text that is not JSON
    (or nests past Python's parser), which the checks above refuse."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return None


def holds_null(value: object) -> bool:
    """Whether ``value`` (parsed JSON) is or contains a null, at any depth."""
    stack = [value]
    while stack:
        item = stack.pop()
        if item is None:
            return True
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return False
