"""``hwattn``: attention over a program's statements, conditioned on the hardware (Verma et al.).

Verma et al. 2023 learn *joint* workload and hardware features so that one model serves several
machines and transfers to a new one (``../shared/research/algorithms.md`` §5, §13).  The MLP
already appends the hardware vector to every block's row, where it can only shift each block's
embedding by the same amount on every machine.  Here the hardware vector is encoded on its own
and *scales and shifts* every statement's embedding (feature-wise modulation), so what a
feature is worth can differ per machine (vector width, cores, caches); the statements of one
program then attend to each other (a padding stage next to its compute block, a write-back
after it), and their sum is scored, trained with LambdaRank like the other neural models.
"""

from __future__ import annotations

import numpy as np

from tensortune import features as F
from tensortune.costmodel.data import ProgramSet
from tensortune.costmodel.nn import MLPModel, residual_head


def padded_blocks(rows: np.ndarray, program_of_row: np.ndarray,
                  n_programs: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """``(n_programs, most_blocks, width)`` block rows per program, and the mask of real ones."""
    counts = np.bincount(program_of_row, minlength=n_programs)
    most = max(int(counts.max()) if n_programs else 0, 1)
    starts = np.cumsum(counts) - counts
    position = np.arange(len(rows)) - starts[program_of_row]
    x = np.zeros((n_programs, most, rows.shape[1]), np.float32)
    mask = np.zeros((n_programs, most), bool)
    x[program_of_row, position] = rows
    mask[program_of_row, position] = True
    mask[:, 0] = True  # attention needs one unmasked key per program
    return x, mask


class HardwareAttentionModel(MLPModel):
    kind = "hwattn"
    # A few measurements of a new machine retrain how the hardware modulates the statements;
    # what the statements are worth in general was learned on all the other machines.
    adapted = ("hardware",)

    def __init__(self, hidden: int = 256, hardware_hidden: int = 64, heads: int = 4,
                 epochs: int = 30, lr: float = 7e-4, weight_decay: float = 1e-6, chunk: int = 64,
                 batch_chunks: int = 4, refine_epochs: int = 5, seed: int = 0,
                 members: int = 1) -> None:  # fmt: skip
        super().__init__(hidden, epochs, lr, weight_decay, chunk, batch_chunks, refine_epochs,
                         seed, members)  # fmt: skip
        self.hardware_hidden = hardware_hidden
        self.heads = heads

    def _build(self, width: int):
        from torch import nn

        h, hh, heads = self.hidden, self.hardware_hidden, self.heads
        # Block rows are [per-store | workload | hardware] (ProgramSet.blocks).
        statement = width - F.HARDWARE_WIDTH

        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.encode = nn.Sequential(nn.Linear(statement, h), nn.ReLU(), nn.Linear(h, h),
                                            nn.ReLU())  # fmt: skip
                self.hardware = nn.Sequential(nn.Linear(F.HARDWARE_WIDTH, hh), nn.ReLU(),
                                              nn.Linear(hh, 2 * h))  # fmt: skip
                self.attention = nn.MultiheadAttention(h, heads, batch_first=True)
                self.res = nn.ModuleList([nn.Linear(h, h) for _ in range(2)])
                self.out = nn.Linear(h, 1)

            def forward(self, x, mask):
                scale, shift = self.hardware(x[:, 0, statement:]).chunk(2, dim=-1)
                z = self.encode(x[..., :statement])
                z = z * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)
                attended, _ = self.attention(z, z, z, key_padding_mask=~mask)
                z = ((z + attended) * mask.unsqueeze(-1)).sum(dim=1)
                return residual_head(z, self.res, self.out)

        return Net()

    def _inputs(self, data: ProgramSet) -> tuple:
        import torch

        rows, program_of_row = data.blocks()
        x, mask = padded_blocks(rows / self.scale_, program_of_row, len(data))
        return torch.from_numpy(x), torch.from_numpy(mask)
