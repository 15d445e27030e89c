"""MoA: momentum online adaptation of a neural cost model pre-trained on other hardware.

Fine-tuning a pre-trained network on a handful of new measurements forgets what it knew;
never adapting it keeps the other hardware's biases.  MoA (from Pruner) keeps a slow-moving
copy of the weights (momentum ``m``): every ``every`` updates it retrains a network *starting
from that copy* on all measurements so far, predicts with the result, and moves the copy a
step ``1 - m`` towards it.

Adapting can also make things worse: a few measurements of one task can pull the network away
from what the other hardware taught it about every task (fine-tuning on 16 to 64 programs lost
1 to 5 points of PCA on each machine held out of ttset-cpu-v3 to v5, benchmarks/RESULTS.md).
So, with ``gate`` (the default), MoA keeps the pre-trained network beside the adapted one and
scores both on each new batch *before* training on it (a prequential test: each batch is data
neither has seen).  It predicts with the adapted network only once that has put more of the
measured pairs in the right order than the pre-trained one has, summed over the batches so far.
"""

from __future__ import annotations

import copy

import numpy as np

from tensortune.costmodel.base import CostModel, _kept, pair_accuracy
from tensortune.costmodel.data import ProgramSet
from tensortune.costmodel.nn import _RankModel
from tensortune.costmodel.registry import load_cost_model
from tensortune.errors import TensortuneError


def can_adapt(model: object) -> bool:
    """Whether MoA can adapt ``model``: a fitted neural cost model."""
    return isinstance(model, _RankModel) and model.fitted


class MomentumAdapted(CostModel):
    """Wraps a fitted neural model (``mlp``, ``tlp``, ``pacm``) for online adaptation.

    Saving writes the network it predicts with (``trusted``: the adapted one, unless the gate
    has seen the pre-trained one rank new measurements better), as a plain model file of its
    own kind.
    """

    kind = "moa"

    def __init__(self, model: _RankModel | str, momentum: float = 0.99, every: int = 4,
                 epochs: int = 10, gate: bool = True) -> None:  # fmt: skip
        # A copy: adapting retrains this network, and the caller's model must stay as given.
        self.model = load_cost_model(model) if isinstance(model, str) else copy.deepcopy(model)
        if not can_adapt(self.model):
            raise TensortuneError(
                "MoA adapts a fitted neural cost model (mlp, tlp, pacm or hwattn)"
            )
        if not 0 <= momentum < 1:
            raise TensortuneError("momentum must be in [0, 1)")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise TensortuneError(f"every (batches between retrainings) must be a whole number "
                                  f"of at least 1, not {every!r}")  # fmt: skip
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
            raise TensortuneError(f"epochs must be a whole number of at least 0, not {epochs!r}")
        self.momentum = momentum
        self.every = every
        self.epochs = epochs
        self.gate = gate
        self.momentum_state_ = copy.deepcopy(self.model.net_.state_dict())
        self.pretrained_ = copy.deepcopy(self.model) if gate else None
        self.updates_ = 0
        self.retrains_ = 0
        # Pairs of newly measured programs each network ordered right, before training on them.
        self.right_pairs_ = {"adapted": 0.0, "pretrained": 0.0}

    @property
    def uses_tokens(self) -> bool:  # type: ignore[override]
        return self.model.uses_tokens

    @property
    def uses_lowered(self) -> bool:
        return self.model.uses_lowered

    def fit(self, data: ProgramSet) -> MomentumAdapted:
        data.require_labels()
        self.seen_ = data
        self._retrain()
        return self

    def update(self, data: ProgramSet, *, seen: ProgramSet | None = None) -> MomentumAdapted:
        if data.labels is None or (seen is not None and seen.labels is None):
            raise TensortuneError("these programs have no labels to learn from")
        if self.pretrained_ is not None and self.retrains_:
            for name, net in (("adapted", self.model), ("pretrained", self.pretrained_)):
                self.right_pairs_[name] += _right_pairs(net.predict(data), data)
        self.seen_ = _kept(self, data, seen)
        self.updates_ += 1
        if self.updates_ % self.every == 0 and np.any(self.seen_.labels > 0):
            self._retrain()
        return self

    def _retrain(self) -> None:
        import torch

        self.model._finite_rows(self.seen_)  # before the network is touched
        self.model.net_.load_state_dict(self.momentum_state_)
        self.model._train(self.seen_, self.epochs)
        new = self.model.net_.state_dict()
        m = self.momentum
        with torch.no_grad():
            self.momentum_state_ = {
                k: (m * v + (1 - m) * new[k]) if v.is_floating_point() else new[k].clone()
                for k, v in self.momentum_state_.items()
            }
        self.retrains_ += 1

    @property
    def trusted(self) -> _RankModel:
        """The network MoA predicts with: the adapted one, unless the gate has seen the
        pre-trained one rank new measurements better."""
        if self.pretrained_ is None:
            return self.model
        right = self.right_pairs_
        return self.model if right["adapted"] > right["pretrained"] else self.pretrained_

    def predict(self, data: ProgramSet) -> np.ndarray:
        return self.trusted.predict(data)

    def save(self, path) -> None:
        self.trusted.save(path)

    def _state(self) -> bytes:
        return self.trusted._state()

    def _restore(self, state: bytes) -> None:
        self.model._restore(state)


def _right_pairs(scores: np.ndarray, data: ProgramSet) -> float:
    """Pairs of successfully measured programs of one task in ``data`` that ``scores`` order
    right (a tie counts half)."""
    right = 0.0
    ok = data.labels > 0
    for g in np.unique(data.groups[ok]):
        mine = ok & (data.groups == g)
        labels = data.labels[mine]
        pairs = int((labels[:, None] > labels[None, :]).sum())
        right += pair_accuracy(scores[mine], 1.0 / labels) * pairs
    return right
