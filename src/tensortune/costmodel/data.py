"""The inputs every cost model learns from: features of a set of programs, and their labels."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tensortune.errors import TensortuneError


@dataclass
class ProgramSet:
    """Features of ``n`` programs.

    ``groups`` says which programs are comparable (same task on the same hardware): ranking
    losses and TenSet's labels only make sense within a group.  ``labels`` are TenSet's
    normalised throughput (best cost in the group / cost; 0 for failures), when known.
    """

    per_store: list[np.ndarray]  # (blocks_i, 164) each
    tokens: list[np.ndarray]  # (instructions_i, TOKEN_WIDTH) each
    workload: np.ndarray  # (n, WORKLOAD_WIDTH)
    hardware: np.ndarray  # (n, HARDWARE_WIDTH)
    groups: np.ndarray  # (n,) int
    labels: np.ndarray | None = None
    lowered: np.ndarray | None = None  # (n, LOWERED_WIDTH): features.lowered, when computed

    def __len__(self) -> int:
        return len(self.per_store)

    def subset(self, index: np.ndarray) -> ProgramSet:
        index = np.flatnonzero(index) if index.dtype == bool else index
        return ProgramSet(
            [self.per_store[i] for i in index],
            [self.tokens[i] for i in index],
            self.workload[index],
            self.hardware[index],
            self.groups[index],
            None if self.labels is None else self.labels[index],
            None if self.lowered is None else self.lowered[index],
        )

    def require_labels(self) -> np.ndarray:
        if self.labels is None:
            raise TensortuneError("these programs have no labels to learn from")
        if len(self) == 0:
            raise TensortuneError("no programs to learn from (empty training set)")
        if not np.any(self.labels > 0):
            raise TensortuneError("no successful measurement among these programs")
        return self.labels

    def require_lowered(self) -> np.ndarray:
        """The lowered-loop features, or the one-line refusal of a model that reads them."""
        if self.lowered is None:
            raise TensortuneError(
                "this model reads lowered-loop features, which these programs lack "
                "(for a dataset: `tensortune dataset lower --dataset D`)"
            )
        return self.lowered

    def blocks(self, lowered: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """One row per block, ``[per-store | workload | hardware]``, and each row's program.

        ``lowered``: a ``lowered`` column block too, NaN on the block rows, and one more row
        per program with the program's lowered-loop features (NaN per-store features).  A
        model summing its rows' outputs then adds one term per program for them, not one per
        block (a program of three blocks would count them three times).
        """
        counts = np.array([len(p) for p in self.per_store], dtype=np.int64)  # int when empty
        program_of_row = np.repeat(np.arange(len(self)), counts)
        rows = np.concatenate(self.per_store) if len(self) else np.zeros((0, 164), np.float32)
        context = np.concatenate([self.workload, self.hardware], axis=1)
        out = np.concatenate([rows, context[program_of_row]], axis=1).astype(np.float32)
        if not lowered:
            return out, program_of_row
        low = self.require_lowered()
        n, width = len(self), low.shape[1]
        blank_store = np.full((n, rows.shape[1]), np.nan, np.float32)
        extra = np.concatenate([blank_store, context, low], axis=1)
        out = np.concatenate([out, np.full((len(out), width), np.nan, np.float32)], axis=1)
        return (np.concatenate([out, extra]).astype(np.float32),
                np.concatenate([program_of_row, np.arange(n)]))  # fmt: skip

    @classmethod
    def from_columns(cls, columns: dict, index: np.ndarray | None = None) -> ProgramSet:
        """From a dataset table's columns (``pyarrow.Table.to_pydict()`` or lists)."""
        n = len(columns["per_store"])
        rows = range(n) if index is None else (np.flatnonzero(index) if index.dtype == bool
                                              else index)  # fmt: skip
        keep = [i for i in rows if columns["per_store"][i] is not None]
        keys = [(columns["task_id"][i], columns["hardware"][i]) for i in keep]
        codes = {k: j for j, k in enumerate(dict.fromkeys(keys))}

        from tensortune import features as F

        def arr(name: str, width: int) -> list[np.ndarray]:
            # A program without blocks or tokens is (0, width): reshape(0, -1) is ambiguous.
            values = [np.asarray(columns[name][i], dtype=np.float32) for i in keep]
            return [v.reshape(len(v), -1) if len(v) else v.reshape(0, width) for v in values]

        def table(name: str, width: int) -> np.ndarray:
            if not keep:  # (0, width), as models and concatenation expect
                return np.zeros((0, width), np.float32)
            return np.asarray([columns[name][i] for i in keep], np.float32)

        lowered = columns.get("lowered")
        return cls(
            lowered=None if lowered is None else np.asarray(lowered, np.float32)[keep],
            per_store=arr("per_store", F.PER_STORE_WIDTH),
            tokens=arr("trace_tokens", F.TOKEN_WIDTH),
            workload=table("workload_embedding", F.WORKLOAD_WIDTH),
            hardware=table("hardware_vector", F.HARDWARE_WIDTH),
            groups=np.array([codes[k] for k in keys], dtype=np.int64),
            labels=np.asarray([columns["label"][i] for i in keep], dtype=np.float64),
        )


def concat_programs(sets: list[ProgramSet]) -> ProgramSet:
    """The programs of ``sets`` in order, groups as they are (labels and lowered-loop features
    only if all have them)."""
    if not sets:
        raise ValueError("nothing to concatenate")
    labels = None if any(s.labels is None for s in sets) else np.concatenate(
        [s.labels for s in sets])  # fmt: skip
    lowered = None if any(s.lowered is None for s in sets) else np.concatenate(
        [s.lowered for s in sets])  # fmt: skip
    return ProgramSet([p for s in sets for p in s.per_store], [t for s in sets for t in s.tokens],
                      np.concatenate([s.workload for s in sets]),
                      np.concatenate([s.hardware for s in sets]),
                      np.concatenate([s.groups for s in sets]), labels, lowered)  # fmt: skip


def one_program() -> ProgramSet:
    """One program of one block and one trace instruction, all zeros: what a model's input
    width is measured on, to check a model file against the features computed here."""
    from tensortune import features as F
    from tensortune.features.lowered import LOWERED_WIDTH

    def zeros(*shape: int) -> np.ndarray:
        return np.zeros(shape, np.float32)

    return ProgramSet([zeros(1, F.PER_STORE_WIDTH)], [zeros(1, F.TOKEN_WIDTH)],
                      zeros(1, F.WORKLOAD_WIDTH), zeros(1, F.HARDWARE_WIDTH),
                      np.zeros(1, np.int64), lowered=zeros(1, LOWERED_WIDTH))  # fmt: skip
