"""TenSet's MLP cost model (PyTorch, CPU): a per-block encoder, summed over the program's
blocks, then residual layers; trained with LambdaRank within each task."""

from __future__ import annotations

import io

import numpy as np

from tensortune.costmodel.base import CostModel, to_bytes
from tensortune.costmodel.data import ProgramSet


def lambda_rank_loss(scores, labels, groups):
    """LambdaRank (NDCG-weighted pairwise logistic loss) summed over the groups in a batch."""
    import torch

    total = scores.new_zeros(())
    for g in torch.unique(groups):
        idx = groups == g
        s, y = scores[idx], labels[idx]
        if len(s) < 2:
            continue
        order = torch.argsort(s, descending=True)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(1, len(s) + 1)
        discount = 1.0 / torch.log2(rank.float() + 1.0)
        gain = torch.pow(2.0, y) - 1.0
        ideal = (torch.sort(gain, descending=True).values / torch.log2(
            torch.arange(2, len(s) + 2, dtype=torch.float32))).sum().clamp_min(1e-9)  # fmt: skip
        better = (y[:, None] > y[None, :]).float()
        delta = (gain[:, None] - gain[None, :]).abs() * (
            discount[:, None] - discount[None, :]
        ).abs()
        pair = torch.nn.functional.softplus(-(s[:, None] - s[None, :]))
        total = total + (better * delta.detach() / ideal * pair).sum()
    return total


class MLPModel(CostModel):
    kind = "mlp"

    def __init__(
        self,
        hidden: int = 256,
        epochs: int = 30,
        lr: float = 7e-4,
        weight_decay: float = 1e-6,
        chunk: int = 64,
        batch_chunks: int = 4,
        seed: int = 0,
    ) -> None:
        self.hidden = hidden
        self.epochs = epochs
        self.lr = lr
        self.weight_decay = weight_decay
        self.chunk = chunk
        self.batch_chunks = batch_chunks
        self.seed = seed

    def _net(self, width: int):
        import torch
        from torch import nn

        h = self.hidden

        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.encode = nn.Sequential(nn.Linear(width, h), nn.ReLU(), nn.Linear(h, h),
                                            nn.ReLU())  # fmt: skip
                self.res = nn.ModuleList([nn.Linear(h, h) for _ in range(2)])
                self.out = nn.Linear(h, 1)

            def forward(self, rows, program_of_row, n_programs):
                x = torch.zeros(n_programs, h).index_add_(0, program_of_row, self.encode(rows))
                for layer in self.res:
                    x = x + torch.relu(layer(x))
                return self.out(x).squeeze(-1)

        return Net()

    def _tensors(self, data: ProgramSet):
        import torch

        rows, program_of_row = data.blocks()
        rows = rows / self.scale_
        return torch.from_numpy(rows), torch.from_numpy(program_of_row)

    def fit(self, data: ProgramSet) -> MLPModel:
        import torch

        data.require_labels()
        torch.manual_seed(self.seed)
        rows, _ = data.blocks()
        # TenSet scales each feature by its maximum over the training set.
        self.scale_ = np.maximum(np.abs(rows).max(axis=0), 1e-6).astype(np.float32)
        self.width_ = rows.shape[1]
        self.net_ = self._net(self.width_)
        opt = torch.optim.Adam(self.net_.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        rng = np.random.default_rng(self.seed)
        for _ in range(self.epochs):
            # A step ranks a few chunks of programs, each chunk from a single task.
            chunks = []
            for g in np.unique(data.groups):
                members = rng.permutation(np.flatnonzero(data.groups == g))
                chunks += [members[i : i + self.chunk] for i in range(0, len(members), self.chunk)]
            order = rng.permutation(len(chunks))
            for k in range(0, len(order), self.batch_chunks):
                picked = [chunks[i] for i in order[k : k + self.batch_chunks]]
                batch = data.subset(np.concatenate(picked))
                x, seg = self._tensors(batch)
                scores = self.net_(x, seg, len(batch))
                loss = lambda_rank_loss(scores, torch.from_numpy(labels_of(batch)),
                                        torch.from_numpy(batch.groups))  # fmt: skip
                if not loss.requires_grad:
                    continue
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.net_.parameters(), 0.5)
                opt.step()
        return self

    def predict(self, data: ProgramSet) -> np.ndarray:
        import torch

        with torch.no_grad():
            x, seg = self._tensors(data)
            return self.net_(x, seg, len(data)).double().numpy()

    def _state(self) -> bytes:
        import torch

        return to_bytes(lambda f: torch.save({"net": self.net_.state_dict(), "scale": self.scale_,
                                              "width": self.width_}, f))  # fmt: skip

    def _restore(self, state: bytes) -> None:
        import torch

        saved = torch.load(io.BytesIO(state), weights_only=False)
        self.scale_, self.width_ = saved["scale"], saved["width"]
        self.net_ = self._net(self.width_)
        self.net_.load_state_dict(saved["net"])


def labels_of(data: ProgramSet) -> np.ndarray:
    return data.require_labels().astype(np.float32)
