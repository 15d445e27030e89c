"""``pacm``: a pattern-aware cost model for CPUs (Pruner's PaCM idea, re-designed for LLVM code).

Pruner's verifier adds to TenSet's per-block MLP a second branch that reads the data-movement
pattern of the GPU tiling (global -> shared -> local).  On CPUs there are no such memory
scopes; what a multi-level-tiled block's speed depends on is how its buffer accesses stride and
reuse, and what the stages around it (padding / cache reads before, write-back after) touch.
So the pattern is the sequence of buffer accesses of the block doing most of the arithmetic and
of its two neighbours in program order: MetaSchedule's per-buffer access features (18 per
buffer, up to 5 buffers per block) tagged with the stage's role, under self-attention, summed.
"""

from __future__ import annotations

import numpy as np

from tensortune.costmodel.data import ProgramSet
from tensortune.costmodel.nn import MLPModel, residual_head

# PerStoreFeature's layout: 57 arithmetic/loop features, then 5 buffers x 18 access features.
_GROUP1, _BUFFERS, _PER_BUFFER = 57, 5, 18
_FLOAT_OPS = slice(0, 4)  # mad, add/sub, mul, div/mod (log-scaled counts)
_ROLES = 3  # stage before the main block, the main block, the stage after
PATTERN_LEN = _ROLES * _BUFFERS
PATTERN_WIDTH = _PER_BUFFER + _ROLES


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
                 members: int = 1) -> None:  # fmt: skip
        super().__init__(hidden, epochs, lr, weight_decay, chunk, batch_chunks, refine_epochs,
                         seed, members)  # fmt: skip
        self.pattern_hidden = pattern_hidden
        self.heads = heads

    @staticmethod
    def _patterns(data: ProgramSet) -> np.ndarray:
        if not len(data):
            return np.zeros((0, PATTERN_LEN, PATTERN_WIDTH), np.float32)
        return np.stack([access_pattern(p) for p in data.per_store])

    def _rows(self, data: ProgramSet) -> np.ndarray:
        # One scale vector for both inputs: block rows, then the pattern tokens' columns.
        rows = data.blocks()[0]
        tokens = self._patterns(data).reshape(-1, PATTERN_WIDTH)
        width = rows.shape[1]
        both = np.zeros((len(rows) + len(tokens), width + PATTERN_WIDTH), np.float32)
        both[: len(rows), :width] = rows
        both[len(rows) :, width:] = tokens
        return both

    def _build(self, width: int):
        import torch
        from torch import nn

        h, ph, heads = self.hidden, self.pattern_hidden, self.heads
        block_width = width - PATTERN_WIDTH

        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.blocks = nn.Sequential(nn.Linear(block_width, h), nn.ReLU(),
                                            nn.Linear(h, h), nn.ReLU())  # fmt: skip
                self.pattern = nn.Sequential(nn.Linear(PATTERN_WIDTH, 64), nn.ReLU(),
                                             nn.Linear(64, ph), nn.ReLU())  # fmt: skip
                self.attention = nn.MultiheadAttention(ph, heads, batch_first=True)
                self.fuse = nn.Sequential(nn.Linear(h + ph, h), nn.ReLU())
                self.res = nn.ModuleList([nn.Linear(h, h) for _ in range(2)])
                self.out = nn.Linear(h, 1)

            def forward(self, rows, program_of_row, n_programs, tokens, mask):
                x = torch.zeros(n_programs, h).index_add_(0, program_of_row, self.blocks(rows))
                z = self.pattern(tokens)
                attended, _ = self.attention(z, z, z, key_padding_mask=~mask)
                z = ((z + attended) * mask.unsqueeze(-1)).sum(dim=1)
                return residual_head(self.fuse(torch.cat([x, z], dim=1)), self.res, self.out)

        return Net()

    def _inputs(self, data: ProgramSet) -> tuple:
        import torch

        rows, program_of_row = data.blocks()
        width = rows.shape[1]
        tokens = self._patterns(data)
        mask = tokens.any(axis=2)
        mask[:, 0] = True  # attention needs one unmasked key per program
        x = torch.from_numpy(rows / self.scale_[:width])
        t = torch.from_numpy(tokens / self.scale_[width:])
        return x, torch.from_numpy(program_of_row), len(data), t, torch.from_numpy(mask)
