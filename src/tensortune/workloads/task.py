"""A tuning task: one TIR workload to tune, with how often it occurs in its model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tvm


@dataclass(frozen=True)
class Task:
    """One workload to tune.

    ``weight`` is the number of times the workload occurs in its model (1 for a lone operator);
    ``flop`` is the floating-point operation count of one execution (0: unknown), for GFLOP/s
    reports and for which tasks a budget too small for all tunes first.
    ``exact`` is the workload before approximations (fast math) replaced some of its functions,
    when they did: candidates' outputs are checked against it.
    """

    name: str
    # The modules' TVMScript would make a repr of thousands of lines (a notebook prints it).
    mod: tvm.IRModule = field(repr=False)
    weight: int = 1
    flop: float = 0.0
    source: str = ""
    exact: tvm.IRModule | None = field(default=None, repr=False)

    @property
    def reference(self) -> tvm.IRModule:
        """The module whose unscheduled build is the reference for checking outputs."""
        return self.mod if self.exact is None else self.exact
