"""``pacm``: a pattern-aware cost model for CPUs (Pruner's PaCM idea, re-designed for LLVM code).

Pruner's verifier adds to TenSet's per-block MLP a second branch that reads the data-movement
pattern of the GPU tiling (global -> shared -> local).  On CPUs there are no such memory
scopes; what a multi-level-tiled block's speed depends on is how its buffer accesses stride and
reuse, and what the stages around it (padding / cache reads before, write-back after) touch.
So the pattern is the sequence of buffer accesses of the block doing most of the arithmetic and
of its two neighbours in program order: MetaSchedule's per-buffer access features (18 per
buffer, up to 5 buffers per block) tagged with the stage's role, under self-attention, summed.

``lowered=1`` adds a third branch: the program's lowered-loop features (``features.lowered``:
the register tile LLVM will receive), log-scaled (they are counts spanning five decades) with
a flag for a program whose lowering failed or timed out.  Candidates in a search then pay the
lowering (~13 ms each, mean), as they do for ``xgb``'s setting of the same name.
"""

from __future__ import annotations

import numpy as np

from tensortune.costmodel.data import ProgramSet
from tensortune.costmodel.nn import MLPModel, residual_head
from tensortune.features.lowered import LOWERED_WIDTH

# PerStoreFeature's layout: 57 arithmetic/loop features, then 5 buffers x 18 access features.
_GROUP1, _BUFFERS, _PER_BUFFER = 57, 5, 18
_FLOAT_OPS = slice(0, 4)  # mad, add/sub, mul, div/mod (log-scaled counts)
_ROLES = 3  # stage before the main block, the main block, the stage after
PATTERN_LEN = _ROLES * _BUFFERS
PATTERN_WIDTH = _PER_BUFFER + _ROLES
LOWERED_INPUTS = LOWERED_WIDTH + 1  # the features, then "missing"
_LOWERED_HIDDEN = 64


def access_pattern(per_store: np.ndarray) -> np.ndarray:
    """``(PATTERN_LEN, PATTERN_WIDTH)`` buffer-access tokens around the main block (zeros pad)."""
    out = np.zeros((PATTERN_LEN, PATTERN_WIDTH), np.float32)
    if len(per_store) == 0:
        return out
    main = int(np.argmax(per_store[:, _FLOAT_OPS].sum(axis=1)))
    k = 0
    for role, row in enumerate((main - 1, main, main + 1)):
        if not 0 <= row < len(per_store):
            continue
        for b in range(_BUFFERS):
            start = _GROUP1 + b * _PER_BUFFER
            access = per_store[row, start : start + _PER_BUFFER]
            if not access.any():
                continue
            out[k, :_PER_BUFFER] = access
            out[k, _PER_BUFFER + role] = 1.0
            k += 1
    return out


class PaCMModel(MLPModel):
    kind = "pacm"

    def __init__(self, hidden: int = 256, pattern_hidden: int = 128, heads: int = 4,
                 epochs: int = 30, lr: float = 7e-4, weight_decay: float = 1e-6, chunk: int = 64,
                 batch_chunks: int = 4, refine_epochs: int = 5, seed: int = 0,
                 members: int = 1, lowered: int = 0) -> None:  # fmt: skip
        super().__init__(hidden, epochs, lr, weight_decay, chunk, batch_chunks, refine_epochs,
                         seed, members)  # fmt: skip
        self.pattern_hidden = pattern_hidden
        self.heads = heads
        self.lowered = lowered

    def _lowered(self, data: ProgramSet) -> np.ndarray:
        """``(n, LOWERED_INPUTS)``: log1p of the lowered-loop features (all non-negative), 0
        and the missing flag where a program has none; no columns without ``lowered``."""
        if not self.uses_lowered:
            return np.zeros((len(data), 0), np.float32)
        raw = np.asarray(data.require_lowered(), np.float32)
        missing = ~np.isfinite(raw).all(axis=1)
        out = np.zeros((len(data), LOWERED_INPUTS), np.float32)
        out[~missing, :LOWERED_WIDTH] = np.log1p(np.maximum(raw[~missing], 0.0))
        out[missing, LOWERED_WIDTH] = 1.0
        return out

    @staticmethod
    def _patterns(data: ProgramSet) -> np.ndarray:
        if not len(data):
            return np.zeros((0, PATTERN_LEN, PATTERN_WIDTH), np.float32)
        return np.stack([access_pattern(p) for p in data.per_store])

    def _rows(self, data: ProgramSet) -> np.ndarray:
        # One scale vector for all inputs: block rows, the pattern tokens' columns, then the
        # lowered-loop features' (with ``lowered``).
        rows = data.blocks()[0]
        tokens = self._patterns(data).reshape(-1, PATTERN_WIDTH)
        lowered = self._lowered(data)
        width, n_rows, n_tokens = rows.shape[1], len(rows), len(tokens)
        out = np.zeros((n_rows + n_tokens + len(lowered),
                        width + PATTERN_WIDTH + lowered.shape[1]), np.float32)  # fmt: skip
        out[:n_rows, :width] = rows
        out[n_rows : n_rows + n_tokens, width : width + PATTERN_WIDTH] = tokens
        out[n_rows + n_tokens :, width + PATTERN_WIDTH :] = lowered
        return out

    def _build(self, width: int):
        import torch
        from torch import nn

        h, ph, heads = self.hidden, self.pattern_hidden, self.heads
        lw = LOWERED_INPUTS if self.uses_lowered else 0
        lh = _LOWERED_HIDDEN if lw else 0
        block_width = width - PATTERN_WIDTH - lw

        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.blocks = nn.Sequential(nn.Linear(block_width, h), nn.ReLU(),
                                            nn.Linear(h, h), nn.ReLU())  # fmt: skip
                self.pattern = nn.Sequential(nn.Linear(PATTERN_WIDTH, 64), nn.ReLU(),
                                             nn.Linear(64, ph), nn.ReLU())  # fmt: skip
                self.attention = nn.MultiheadAttention(ph, heads, batch_first=True)
                if lw:
                    self.loops = nn.Sequential(nn.Linear(lw, lh), nn.ReLU(),
                                               nn.Linear(lh, lh), nn.ReLU())  # fmt: skip
                self.fuse = nn.Sequential(nn.Linear(h + ph + lh, h), nn.ReLU())
                self.res = nn.ModuleList([nn.Linear(h, h) for _ in range(2)])
                self.out = nn.Linear(h, 1)

            def forward(self, rows, program_of_row, n_programs, tokens, mask, lowered):
                x = torch.zeros(n_programs, h).index_add_(0, program_of_row, self.blocks(rows))
                z = self.pattern(tokens)
                attended, _ = self.attention(z, z, z, key_padding_mask=~mask)
                z = ((z + attended) * mask.unsqueeze(-1)).sum(dim=1)
                parts = [x, z, self.loops(lowered)] if lw else [x, z]
                return residual_head(self.fuse(torch.cat(parts, dim=1)), self.res, self.out)

        return Net()

    def _inputs(self, data: ProgramSet) -> tuple:
        import torch

        rows, program_of_row = data.blocks()
        width = rows.shape[1]
        tokens = self._patterns(data)
        mask = tokens.any(axis=2)
        mask[:, 0] = True  # attention needs one unmasked key per program
        x = torch.from_numpy(rows / self.scale_[:width])
        t = torch.from_numpy(tokens / self.scale_[width : width + PATTERN_WIDTH])
        lowered = torch.from_numpy(self._lowered(data) / self.scale_[width + PATTERN_WIDTH :])
        return x, torch.from_numpy(program_of_row), len(data), t, torch.from_numpy(mask), lowered
