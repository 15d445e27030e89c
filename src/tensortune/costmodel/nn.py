"""Neural cost models (PyTorch, CPU), trained with LambdaRank within each task.

- ``mlp``: TenSet's MLP: a per-block encoder summed over the program's blocks, then residual
  layers (per-store features + workload and hardware vectors on every block).
- ``tlp``: TLP's idea on MetaSchedule traces: each trace instruction is a token; an encoder,
  one self-attention layer and residual layers, a per-token decoder summed over tokens.

Each takes ``members``: that many networks from different initial weights, each trained on its
own order of the programs, predicting their mean score.  One network's ranking of programs from
other hardware depends a good deal on its seed; five members ranked them about as well as an
average seed and tuned slower (benchmarks/RESULTS.md, tenth session): one network is the default.
"""

from __future__ import annotations

import io
import re
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from tensortune import features as F
from tensortune.costmodel.base import CostModel, to_bytes
from tensortune.costmodel.data import ProgramSet, one_program
from tensortune.costmodel.progress import report
from tensortune.errors import TensortuneError, shown

if TYPE_CHECKING:
    from torch import nn


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
        positions = torch.log2(torch.arange(2, len(s) + 2, dtype=torch.float32))
        ideal = (torch.sort(gain, descending=True).values / positions).sum().clamp_min(1e-9)
        better = (y[:, None] > y[None, :]).float()
        delta = (gain[:, None] - gain[None, :]).abs() * (
            discount[:, None] - discount[None, :]
        ).abs()
        pair = torch.nn.functional.softplus(-(s[:, None] - s[None, :]))
        total = total + (better * delta.detach() / ideal * pair).sum()
    return total


def residual_head(x, layers, out):
    """Residual ReLU layers then a linear score: the head TenSet's MLP and its relatives share."""
    import torch

    for layer in layers:
        x = x + torch.relu(layer(x))
    return out(x).squeeze(-1)


class _RankModel(CostModel):
    """Training loop shared by the neural models: Adam, gradient clipping at 0.5, steps over a
    few single-task chunks of programs at a time."""

    epochs: int
    lr: float
    weight_decay: float
    chunk: int
    batch_chunks: int
    refine_epochs: int
    seed: int
    members: int
    # The top-level modules that fine-tuning on a new machine trains (train/finetune.py);
    # empty: all of them.
    adapted: ClassVar[tuple[str, ...]] = ()

    def _rows(self, data: ProgramSet) -> np.ndarray:
        """The unscaled inputs whose per-feature maxima scale the model's inputs."""
        raise NotImplementedError

    def _build(self, width: int):
        raise NotImplementedError

    def _inputs(self, data: ProgramSet) -> tuple:
        """The network's arguments for ``data`` (``predict`` computes them once for all members)."""
        raise NotImplementedError

    def fit(self, data: ProgramSet) -> _RankModel:
        import torch

        data.require_labels()
        if self.members < 1:
            raise TensortuneError(f"members must be at least 1, not {self.members}")
        with torch.random.fork_rng(devices=[]):  # seeded here; the caller's generator untouched
            torch.manual_seed(self.seed)
            return self._fit(data)

    def _fit(self, data: ProgramSet) -> _RankModel:
        rows = self._finite_rows(data)
        # TenSet scales each feature by its maximum over the training set.  A feature that is
        # zero throughout (an ISA feature none of the training machines has) keeps its own
        # magnitude: scaled by a tiny floor, a new machine that has it would feed the network
        # inputs near 1e6.
        peak = np.abs(rows).max(axis=0) if len(rows) else np.zeros(rows.shape[1])
        self.scale_ = np.where(peak > 0, np.maximum(peak, 1e-6), 1.0).astype(np.float32)
        self.width_ = rows.shape[1]
        self.net_ = self._new_net(self.width_)
        return self._train(data, self.epochs)

    def _new_net(self, width: int) -> nn.Module:
        """One network, or (``members`` > 1) a ``ModuleList`` of them from different weights."""
        from torch import nn

        if self.members == 1:
            return self._build(width)
        return nn.ModuleList([self._build(width) for _ in range(self.members)])

    def _nets(self) -> list[nn.Module]:
        from torch import nn

        return list(self.net_) if isinstance(self.net_, nn.ModuleList) else [self.net_]

    def _refine(self, data: ProgramSet) -> _RankModel:
        """A few more epochs from the trained weights (input scaling unchanged)."""
        self._finite_rows(data)
        return self._train(data, self.refine_epochs)

    def _finite_rows(self, data: ProgramSet) -> np.ndarray:
        """``_rows(data)``, refused when one is not finite: one NaN reaches every weight
        through the loss, and the model then predicts NaN for every program."""
        rows = self._rows(data)
        if not np.isfinite(rows).all():
            bad = int((~np.isfinite(rows)).any(axis=1).sum())
            raise TensortuneError(f"{self.kind}: {bad} feature rows hold NaN or infinite values "
                                  "(a neural model cannot learn from them)")  # fmt: skip
        return rows

    def _train(self, data: ProgramSet, epochs: int) -> _RankModel:
        for _ in self._train_stages(data, [epochs]):
            pass
        return self

    def _train_stages(self, data: ProgramSet, stages: Sequence[int]) -> Iterator[int]:
        """Train up to the largest of ``stages`` (epochs) and yield each stage once the model has
        trained that long: the model at a stage is the one ``_train(data, stage)`` makes (the
        members train one epoch each in turn; each has its own optimizer and order of programs,
        and nothing they draw is shared), so nested lengths cost one training."""
        # Each member sees the programs in its own order (a shared one made the members agree
        # more and help less); member 0 draws the order a single network always drew, the others
        # streams of their own (seed + k would repeat the order of the model with seed + k).
        import torch

        nets = self._nets()
        rngs = [np.random.default_rng(self.seed if k == 0 else [self.seed, k])
                for k in range(len(nets))]  # fmt: skip
        opts = [torch.optim.Adam(net.parameters(), lr=self.lr, weight_decay=self.weight_decay)
                for net in nets]  # fmt: skip
        stages = sorted(set(stages))
        total = max(stages, default=0)
        if stages and stages[0] <= 0:
            yield stages.pop(0)
        for epoch in range(total):
            for k, net in enumerate(nets):
                self._epoch(net, opts[k], data, rngs[k])
                report(epoch * len(nets) + k + 1, total * len(nets))
            if epoch + 1 == stages[0]:
                yield stages.pop(0)

    def _epoch(self, net: nn.Module, opt, data: ProgramSet, rng: np.random.Generator) -> None:
        """One pass over the programs, in steps of a few single-task chunks."""
        import torch

        chunks = []
        for g in np.unique(data.groups):
            rows = rng.permutation(np.flatnonzero(data.groups == g))
            chunks += [rows[i : i + self.chunk] for i in range(0, len(rows), self.chunk)]
        order = rng.permutation(len(chunks))
        for k in range(0, len(order), self.batch_chunks):
            picked = [chunks[i] for i in order[k : k + self.batch_chunks]]
            batch = data.subset(np.concatenate(picked))
            if not np.any(batch.labels > 0):  # only failures here: no order to learn
                continue
            labels = torch.from_numpy(batch.labels.astype(np.float32))
            loss = lambda_rank_loss(net(*self._inputs(batch)), labels,
                                    torch.from_numpy(batch.groups))  # fmt: skip
            if not loss.requires_grad:
                continue
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
            opt.step()

    def predict(self, data: ProgramSet) -> np.ndarray:
        import torch

        self._require_fitted()
        self.net_.eval()
        with torch.no_grad():
            inputs = self._inputs(data)
            out = torch.stack([net(*inputs) for net in self._nets()]).mean(dim=0)
        self.net_.train()
        return out.double().numpy()

    def _state(self) -> bytes:
        import torch

        return to_bytes(lambda f: torch.save({"net": self.net_.state_dict(), "scale": self.scale_,
                                              "width": self.width_}, f))  # fmt: skip

    def _restore(self, state: bytes) -> None:
        import torch

        # weights_only: torch's restricted unpickler builds tensors and plain containers and
        # calls nothing else (a pickle that names any other callable is refused before it
        # runs); the numpy names let it rebuild the (float) scale array that model files store
        # beside the weights.
        try:
            # torch warns about pickle protocols it was not written with: stderr noise here
            with torch.serialization.safe_globals(_NUMPY_ARRAY_GLOBALS), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                saved = torch.load(io.BytesIO(state), weights_only=True)
        except Exception as e:
            reason = _torch_load_failure(e)
            raise TensortuneError(f"its weights cannot be read ({reason})") from None
        self._check_saved(saved, len(state))
        self.scale_, self.width_ = saved["scale"], saved["width"]
        # Initial weights are drawn and then replaced: loading leaves the caller's generator be.
        with torch.random.fork_rng(devices=[]):
            self.net_ = self._new_net(self.width_)
        self.net_.load_state_dict(saved["net"])

    def _check_saved(self, saved: object, size: int) -> None:
        """Refuse saved state (``size`` bytes) that does not fit this model's settings and the
        features computed here, before building the network: its settings (``hidden``,
        ``members``) come from the file too, and a network built from wrong ones could be any
        size."""
        import torch

        width = self._rows(one_program()).shape[1]
        if not isinstance(saved, dict) or not {"net", "scale", "width"} <= saved.keys():
            raise TensortuneError("its state is not weights, input scale and width")
        net, scale = saved["net"], saved["scale"]
        if type(saved["width"]) is not int or saved["width"] != width:
            raise TensortuneError(f"it reads {shown(saved['width'])} features per row, this "
                                  f"tensortune computes {width}")  # fmt: skip
        if not (isinstance(scale, np.ndarray) and scale.dtype == np.float32
                and scale.shape == (width,)):  # fmt: skip
            raise TensortuneError(f"its input scale is not {width} float32 numbers")
        if not np.all(np.isfinite(scale) & (scale > 0)):  # fit makes each at least 1e-6
            raise TensortuneError("its input scale holds a number that is not finite and positive")
        # Each member has weights of its own: more members than tensors is a lie, and building
        # them could take any time.
        if not isinstance(net, dict) or not 1 <= self.members <= len(net):
            raise TensortuneError("its weights do not fit its settings")
        with torch.device("meta"):  # shapes only: nothing allocated
            expected = self._new_net(width).state_dict()
        if {k: (v.shape, v.dtype) for k, v in expected.items()} != {
            k: (getattr(v, "shape", None), getattr(v, "dtype", None)) for k, v in net.items()
        }:
            raise TensortuneError("its weights do not fit its settings")
        # torch.save writes a storage once however many tensors view it, and the network built
        # next gives every tensor its own: tensors that all view one small storage would make a
        # file of kilobytes allocate gigabytes.  tensortune's networks share no weights.
        if sum(v.numel() * v.element_size() for v in net.values()) > size:
            raise TensortuneError("its weights hold more numbers than the file does (tensors "
                                  "sharing their storage)")  # fmt: skip
        if not all(torch.isfinite(v).all() for v in net.values() if v.is_floating_point()):
            raise TensortuneError("its weights hold NaN or infinite numbers")


def _torch_load_failure(e: Exception) -> str:
    """The gist of what ``torch.load`` refused, in a few words: its own text runs over many
    lines, and advises loading without ``weights_only``, which would run the file's code."""
    text = str(e)
    called = re.search(r"GLOBAL ([\w.]+)", text)
    if called:
        return f"it would call {called.group(1)}: refused before anything ran"
    boilerplate = ("Weights only load failed", "Check the documentation", "Please file an issue")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    gist = [ln for ln in lines if not ln.startswith(boilerplate)] or [type(e).__name__]
    return gist[0].split(". ")[0][:200]


_multiarray = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray  # numpy 1.x
_NUMPY_ARRAY_GLOBALS = [_multiarray._reconstruct, np.ndarray, np.dtype,
                        type(np.dtype(np.float64)), type(np.dtype(np.float32))]  # fmt: skip


class MLPModel(_RankModel):
    kind = "mlp"

    def __init__(self, hidden: int = 256, epochs: int = 30, lr: float = 7e-4,
                 weight_decay: float = 1e-6, chunk: int = 64, batch_chunks: int = 4,
                 refine_epochs: int = 5, seed: int = 0, members: int = 1) -> None:  # fmt: skip
        self.hidden = hidden
        self.epochs = epochs
        self.lr = lr
        self.weight_decay = weight_decay
        self.chunk = chunk
        self.batch_chunks = batch_chunks
        self.refine_epochs = refine_epochs
        self.seed = seed
        self.members = members

    def _rows(self, data: ProgramSet) -> np.ndarray:
        return data.blocks()[0]

    def _build(self, width: int):
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
                return residual_head(x, self.res, self.out)

        return Net()

    def _inputs(self, data: ProgramSet) -> tuple:
        import torch

        rows, program_of_row = data.blocks()
        return torch.from_numpy(rows / self.scale_), torch.from_numpy(program_of_row), len(data)


class TLPModel(_RankModel):
    kind = "tlp"
    uses_tokens = True

    def __init__(self, max_tokens: int = 48, hidden: int = 256, heads: int = 8, epochs: int = 30,
                 lr: float = 7e-4, weight_decay: float = 1e-6, chunk: int = 64,
                 batch_chunks: int = 4, refine_epochs: int = 5, seed: int = 0,
                 members: int = 1) -> None:  # fmt: skip
        self.max_tokens = max_tokens
        self.hidden = hidden
        self.heads = heads
        self.epochs = epochs
        self.lr = lr
        self.weight_decay = weight_decay
        self.chunk = chunk
        self.batch_chunks = batch_chunks
        self.refine_epochs = refine_epochs
        self.seed = seed
        self.members = members

    def _padded(self, data: ProgramSet) -> tuple[np.ndarray, np.ndarray]:
        """``(n, max_tokens, width)`` tokens with workload and hardware context appended to each,
        and the mask of real (not padding) positions."""
        n, t = len(data), self.max_tokens
        context = np.concatenate([data.workload, data.hardware], axis=1)
        width = (data.tokens[0].shape[1] if n else F.TOKEN_WIDTH) + context.shape[1]
        x = np.zeros((n, t, width), np.float32)
        mask = np.zeros((n, t), bool)
        for i, tok in enumerate(data.tokens):
            m = min(len(tok), t)
            x[i, :m, : tok.shape[1]] = tok[:m]
            x[i, :m, tok.shape[1] :] = context[i]
            mask[i, :m] = True
        return x, mask

    def _rows(self, data: ProgramSet) -> np.ndarray:
        x, mask = self._padded(data)
        return x[mask]

    def _build(self, width: int):
        import torch
        from torch import nn

        h, heads = self.hidden, self.heads

        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.encode = nn.Sequential(nn.Linear(width, 64), nn.ReLU(), nn.Linear(64, 128),
                                            nn.ReLU(), nn.Linear(128, h), nn.ReLU())  # fmt: skip
                self.attention = nn.MultiheadAttention(h, heads, batch_first=True)
                self.res = nn.ModuleList([nn.Linear(h, h) for _ in range(2)])
                self.decode = nn.Sequential(nn.Linear(h, 64), nn.ReLU(), nn.Linear(64, 1))

            def forward(self, x, mask):
                z = self.encode(x)
                attended, _ = self.attention(z, z, z, key_padding_mask=~mask)
                z = z + attended
                for layer in self.res:
                    z = z + torch.relu(layer(z))
                return (self.decode(z).squeeze(-1) * mask).sum(dim=1)

        return Net()

    def _inputs(self, data: ProgramSet) -> tuple:
        import torch

        x, mask = self._padded(data)
        # Attention needs one unmasked key per program: a program without tokens (features a
        # search cached before a token-reading model came in) scores its padding, not NaN.
        if len(mask) and mask.shape[1]:
            mask[:, 0] = True
        return torch.from_numpy(x / self.scale_), torch.from_numpy(mask)
