"""``tensortune dataset collect --sampler balto --budget N``: measure only what a selector picks.

BALTO's online use: per task and round, draw ``POOL_PER_PICK`` fresh random programs per pick
from the design space, score them with a model fitted on everything this collection's tasks
have measured so far on this configuration (the pre-trained model being built), and measure
the ``selector``'s picks among them; between rounds the model is fitted again.  Selectors
that need an ensemble (``uncertainty``, ``alt``) refit it on the task's own measurements.
One collector per store: unlike ``collect``, it claims nothing.  Each task reaches
``budget * (r + 1) / rounds`` programs after round ``r``, so a task's count in the store says
which round it is in: a killed collection resumes where it stopped, like ``collect``.  So the
count must be the collection's own: a store that holds other measurements of these tasks on
this configuration (from ``tune``, ``collect`` or another sampler) is refused, or the budget
would be met by programs the selector never chose.
"""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tensortune.collect.programs import (
    BATCH,
    CollectResult,
    CollectStep,
    Progress,
    as_list,
    check_collected_by,
    check_configs,
    register_tasks,
    tasks_to_collect,
)
from tensortune.costmodel.data import ProgramSet, concat_programs
from tensortune.errors import TensortuneError, about, interrupted, interruptible
from tensortune.hardware import (
    HardwareConfig,
    Platform,
)
from tensortune.records import DEFAULT_URL, RecordStore, records_from
from tensortune.workloads.task import Task

# Fresh random programs the selector chooses from, per pick (the pool a task offers a round).
POOL_PER_PICK = 8


class _Features:
    """Features of programs of one task on one platform, replayed once per trace."""

    def __init__(self, task: Task, platform: Platform) -> None:
        from tensortune import features as F
        from tensortune.workloads.sources import estimate_flop

        self.task, self.platform = task, platform
        self.workload = F.workload_embedding(task.mod, estimate_flop(task.mod))
        self.hardware = F.hardware_vector(platform)
        self._memo: dict[str, np.ndarray | None] = {}

    def of(self, traces: list[str]) -> list[np.ndarray | None]:
        from tensortune import features as F

        missing = [t for t in dict.fromkeys(traces) if t not in self._memo]
        if missing:
            feats = F.per_store_features(self.task.mod, self.platform,
                                         [json.loads(t) for t in missing])  # fmt: skip
            self._memo.update(zip(missing, feats, strict=True))
        return [self._memo[t] for t in traces]

    def programs(self, traces: list[str], group: int, labels: np.ndarray | None, *,
                 tokens: bool = False) -> ProgramSet:  # fmt: skip
        """The programs of ``traces`` that have features (callers keep to those); trace tokens
        only for models that read them."""
        from tensortune import features as F

        feats = self.of(traces)
        keep = [i for i, f in enumerate(feats) if f is not None]
        n = len(keep)
        return ProgramSet([feats[i] for i in keep],
                          [F.trace_tokens(json.loads(traces[i])) for i in keep] if tokens
                          else [np.zeros((0, F.TOKEN_WIDTH), np.float32)] * n,
                          np.tile(self.workload, (n, 1)), np.tile(self.hardware, (n, 1)),
                          np.full(n, group, dtype=np.int64),
                          None if labels is None else np.asarray(labels)[keep])  # fmt: skip


def collect_active(
    networks: Sequence[object] | None,
    *,
    config: str | HardwareConfig,
    selector: str = "balto",
    budget: int = 32,
    rounds: int = 4,
    model: str = "xgb",
    records: str | RecordStore = DEFAULT_URL,
    work_dir: str | os.PathLike = "tensortune-work",
    seed: int = 0,
    timing: object | None = None,
    progress: Progress | None = None,
    heaviest: int | None = None,
    exclude: Sequence[object] = (),
    workloads: Sequence[str | Task] = (),
) -> CollectResult:
    """Measure ``budget`` programs of each task of ``networks`` (``None``: as ``collect``
    chooses) and of standalone operators ``workloads`` on hardware configuration
    ``config``, chosen by ``selector`` (see ``tensortune.active``) in ``rounds`` rounds, with a
    ``model``-kind cost model refitted between rounds (module docstring)."""
    from tensortune.active import make_selector
    from tensortune.measure.runner import TimingConfig
    from tensortune.measure.session import MeasureSession

    for name, value in (("budget", budget), ("rounds", rounds)):
        if value < 1:
            raise TensortuneError(f"must be positive, not {value}", param=name)
    if heaviest is not None and heaviest < 1:  # before the networks load
        raise TensortuneError(f"must be positive, not {heaviest}", param="heaviest")
    with about("selector"):
        chooser = make_selector(selector)
    with about("model"):
        from tensortune.costmodel.registry import model_class

        model_cls = model_class(model)
    # One name where a list is expected is one item (a string is not a list of letters).
    networks = None if networks is None else as_list(networks)
    exclude, workloads = as_list(exclude), as_list(workloads)
    (hw_config,), (platform,) = check_configs([config], param="config")
    with about("networks"):
        by_network = tasks_to_collect(networks, platform, workloads=workloads,
                                      heaviest=heaviest, exclude=exclude)  # fmt: skip
    run_id = f"collect-{selector}-{uuid.uuid4().hex[:8]}"
    with interruptible(graceful=True), records_from(records) as store:
        tasks = register_tasks(store, by_network)
        with about("records"):
            # Whole ids: "collect-balto-" also begins the ids of a balto-weighted collection.
            own = re.compile(rf"collect-{re.escape(selector)}-[0-9a-f]{{8}}")
            check_collected_by(store, tasks, platform, own, f"sampler {selector}")
        result = CollectResult(store.url, [hw_config.name], len(tasks))
        features = {wid: _Features(t, platform) for wid, t in tasks.items()}
        with MeasureSession(platform, log_dir=Path(work_dir) / "logs",
                            timing=timing or TimingConfig(repeat=3)) as session:  # fmt: skip

            def where(wid: int) -> dict:
                return {"workload_id": wid, "hardware_id": platform.hardware.id,
                        "target": platform.key}  # fmt: skip

            for r in range(rounds):
                want = math.ceil(budget * (r + 1) / rounds)
                if all(store.count(**where(wid)) >= want for wid in tasks):
                    continue  # a round a resumed collection had finished: no model to fit
                fitted = _fit(model_cls, store, platform, features, seed)
                for i, (wid, task) in enumerate(tasks.items()):
                    if interrupted():  # Ctrl-C: what is measured is recorded; stop here
                        raise KeyboardInterrupt
                    have = store.count(**where(wid))
                    if progress is not None:
                        progress(CollectStep(hw_config.name, i, len(tasks), task, have, budget))
                    if have >= want:
                        continue
                    picked = _choose(chooser, store, where(wid), task, platform,
                                     features[wid], fitted, want - have, seed=seed,
                                     round_=r)  # fmt: skip
                    result.measured += _measure(store, session, picked, where(wid), run_id)
                    if progress is not None:
                        progress(CollectStep(hw_config.name, i, len(tasks), task,
                                             store.count(**where(wid)), budget))  # fmt: skip
        result.per_config[hw_config.name] = result.measured
    return result


def _fit(model_cls, store: RecordStore, platform: Platform, features: dict[int, _Features],
         seed: int):  # fmt: skip
    """A model of ``model_cls`` fitted on every program measured so far on ``platform``, each
    task's labels against its best (``None`` before any successful measurement)."""
    parts = []
    for g, (wid, feats) in enumerate(features.items()):
        recs = list(store.query(workload_id=wid, hardware_id=platform.hardware.id,
                                target=platform.key))  # fmt: skip
        best = min((r.cost for r in recs if r.ok), default=None)
        if best is None:
            continue
        labels = np.array([best / r.cost if r.ok else 0.0 for r in recs])
        parts.append(feats.programs([r.trace for r in recs], g, labels,
                                    tokens=model_cls.uses_tokens))  # fmt: skip
    data = concat_programs(parts) if parts else None
    if data is None or not np.any(data.labels > 0):
        return None
    cls_params = model_cls.__init__.__code__.co_varnames
    return model_cls(**({"seed": seed} if "seed" in cls_params else {})).fit(data)


def _choose(chooser, store: RecordStore, where: dict, task: Task, platform: Platform,
            feats: _Features, model, count: int, *, seed: int, round_: int) -> list:  # fmt: skip
    """``count`` fresh programs of ``task`` chosen by ``chooser`` from a new random pool, given
    what the task has measured (its labelled set)."""
    from tensortune.active import pool_from_programs
    from tensortune.records.convert import trace_text
    from tensortune.select.samplers import RandomSampler

    recs = list(store.query(**where))
    seen = {r.trace for r in recs}
    fresh = RandomSampler().sample(task.mod, platform, POOL_PER_PICK * count,
                                   seed=seed * 7919 + round_ * 104729 + len(recs),
                                   exclude=seen)  # fmt: skip
    if not fresh:
        return []
    texts = [trace_text(c.sch.trace) for c in fresh]
    usable = [i for i, f in enumerate(feats.of(texts)) if f is not None]
    best = min((r.cost for r in recs if r.ok), default=None)
    labels = np.array([best / r.cost if r.ok and best else 0.0 for r in recs])
    tokens = model is not None and model.uses_tokens
    known = feats.programs([r.trace for r in recs], 0, labels, tokens=tokens)  # with features
    cands = feats.programs([texts[i] for i in usable], 0, np.full(len(usable), np.nan),
                           tokens=tokens)  # fmt: skip
    pool = pool_from_programs(concat_programs([known, cands]))
    picks = chooser.select(pool, np.arange(len(known)), model, count, seed=seed, round=round_)
    return [fresh[usable[p - len(known)]] for p in picks]


def _measure(store: RecordStore, session, cands: list, where: dict, run_id: str) -> int:
    from tensortune.records.convert import measured_records

    for k in range(0, len(cands), BATCH):
        if interrupted():  # Ctrl-C: what is measured is recorded; stop here
            raise KeyboardInterrupt
        batch = cands[k : k + BATCH]
        built, ran = session.measure(batch)
        store.add(measured_records(batch, built, ran, run_id=run_id, **where))
    return len(cands)
