"""The contract every cost model follows, and its version-stamped file format.

Settings go to ``__init__`` and are kept as given; ``fit`` learns from scratch, ``update`` adds
new measurements to what was learned; learned state lives in attributes ending in ``_``.
``save`` writes one zip file (``meta.json`` + the model's own state bytes) that
``registry.load_cost_model`` checks before trusting: format version, feature schema, model kind
and settings; ``_restore`` reads the state as data (torch's weights-only unpickler, trees checked
in ``trees.py``), refusing what does not fit.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
import io
import json
import zipfile
from pathlib import Path
from typing import ClassVar

import numpy as np

from tensortune.costmodel.data import ProgramSet, concat_programs
from tensortune.errors import TensortuneError
from tensortune.files import write_atomically

FORMAT = "tensortune-cost-model"
FORMAT_VERSION = 1


class CostModel(abc.ABC):
    """Predicts a score per program: higher means faster, comparable within a task."""

    kind: ClassVar[str]
    # Which per-program features the model reads: callers skip computing the others.
    uses_tokens: ClassVar[bool] = False

    @property
    def uses_lowered(self) -> bool:
        """Whether the model reads ``features.lowered`` (a setting of the models that can)."""
        return bool(getattr(self, "lowered", 0))

    def get_params(self, deep: bool = True) -> dict:
        """The settings given to ``__init__`` (``deep``: scikit-learn's signature; a setting
        holds no estimator whose own settings could be listed)."""
        names = [p for p in inspect.signature(type(self).__init__).parameters if p != "self"]
        return {n: getattr(self, n) for n in names}

    def set_params(self, **params: object) -> CostModel:
        """Change settings, as scikit-learn's estimators do; learned state is kept until the
        next ``fit``."""
        unknown = sorted(set(params) - set(self.get_params()))
        if unknown:
            raise TensortuneError(f"{self.kind} has no setting {unknown[0]!r}", param="params")
        for name, value in params.items():
            setattr(self, name, value)
        return self

    @abc.abstractmethod
    def fit(self, data: ProgramSet) -> CostModel: ...

    def update(self, data: ProgramSet, *, seen: ProgramSet | None = None) -> CostModel:
        """Learn from new measurements too, starting from what the model already knows.

        Everything passed to ``update`` is kept (``seen_``); a fitted model is refined on it
        (see :meth:`_refine`), an unfitted one fitted.  ``seen``: everything measured so far,
        ``data`` among it, as the caller labels it now; it replaces what was kept (a search
        relabels its earlier measurements by each task's best so far, and groups them by task).
        """
        kept = _kept(self, data, seen)
        out = self._refine(kept) if self.fitted else self.fit(kept)
        self.seen_ = kept  # only once learned: the data of a failed update is not kept
        return out

    def _refine(self, data: ProgramSet) -> CostModel:
        """Default refinement: refit from scratch."""
        return self.fit(data)

    @abc.abstractmethod
    def predict(self, data: ProgramSet) -> np.ndarray: ...

    @abc.abstractmethod
    def _state(self) -> bytes: ...

    @abc.abstractmethod
    def _restore(self, state: bytes) -> None: ...

    @property
    def fitted(self) -> bool:
        bookkeeping = {"seen_", "provenance_"}
        return any(k.endswith("_") and not k.startswith("_") and k not in bookkeeping
                   for k in vars(self))  # fmt: skip

    def _require_fitted(self) -> None:
        """For ``predict``: a one-line error, not a missing attribute, before ``fit``."""
        if not self.fitted:
            raise TensortuneError(f"the {self.kind} model has not been fitted: fit it, or "
                                  "load a model file, before it predicts")  # fmt: skip

    def _saved_params(self) -> dict:
        """The settings as a model file holds them, in the types loading demands (each of its
        default's type): a numpy number as JSON's, ``True`` for an integer setting as 1."""
        defaults = {n: p.default for n, p in inspect.signature(type(self)).parameters.items()}
        out = {}
        for name, value in self.get_params().items():
            value = value.item() if isinstance(value, np.generic) else value
            wanted = type(defaults.get(name))
            if wanted is int and isinstance(value, bool):
                value = int(value)
            out[name] = value
        return out

    def save(self, path: str | Path) -> None:
        from importlib.metadata import version

        from tensortune.features import schema_hash
        from tensortune.features.lowered import LOWERED_VERSION

        if not self.fitted:
            raise TensortuneError("save: the model has not been fitted")
        meta = {"format": FORMAT, "format_version": FORMAT_VERSION, "kind": self.kind,
                "params": self._saved_params(), "feature_schema": schema_hash(),
                "lowered_version": LOWERED_VERSION if self.uses_lowered else None,
                "tensortune": version("tensortune"),
                "provenance": getattr(self, "provenance_", None)}  # fmt: skip
        # Staged beside the target: an interrupted save never destroys the file it replaces.
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("meta.json", json.dumps(meta))
            z.writestr("state.bin", self._state())
        write_atomically(path, buffer.getvalue())


def _kept(model: CostModel, data: ProgramSet, seen: ProgramSet | None) -> ProgramSet:
    """What ``model`` keeps after an update with ``data`` (``CostModel.update``)."""
    if seen is not None:
        return seen
    before = getattr(model, "seen_", None)
    return data if before is None else _concat(before, data)


def _concat(a: ProgramSet, b: ProgramSet) -> ProgramSet:
    """``b``'s programs after ``a``'s, its groups numbered after ``a``'s."""
    offset = int(a.groups.max()) + 1 if len(a) else 0
    return concat_programs([a, dataclasses.replace(b, groups=b.groups + offset)])


def to_bytes(save) -> bytes:
    """Bytes written by ``save(file_like)``."""
    buf = io.BytesIO()
    save(buf)
    return buf.getvalue()


def pair_accuracy(scores: np.ndarray, latencies: np.ndarray) -> float:
    """Share of program pairs with different latencies whose scores order them right (higher
    score = faster; tied scores count half); 0.5 when there is no such pair."""
    s = np.asarray(scores, np.float64)
    lat = np.asarray(latencies, np.float64)
    faster = lat[:, None] < lat[None, :]
    pairs = faster.sum()
    if pairs == 0:
        return 0.5
    ds = s[:, None] - s[None, :]
    right = ((ds > 0) & faster).sum() + 0.5 * ((ds == 0) & faster).sum()
    return float(right / pairs)
