"""How well the analyzer's drafts recall good programs: Pruner's draft-quality check.

For every (task, hardware) group, the analyzer ranks the group's programs and keeps its top
``share``; we report what fraction of the truly fastest 1 / 5 / 20 programs that drafted set
holds (random drafting would hold ``share`` of them), and the best true label inside it
(TenSet's top-1 score of the draft).
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from tensortune.errors import TensortuneError

TOPS = (1, 5, 20)


@dataclass
class DraftQuality:
    share: float
    groups: int = 0
    programs: int = 0
    recall: dict[int, float] = field(default_factory=dict)  # true top-N -> mean recall
    best_in_draft: float = 0.0  # mean over groups of max label inside the draft
    seconds_per_program: float = 0.0  # analyzer only (replaying traces not counted)

    def to_dict(self) -> dict:
        return {"share": self.share, "groups": self.groups, "programs": self.programs,
                "recall": {f"top{n}": r for n, r in self.recall.items()},
                "random_recall": self.share, "best_in_draft": self.best_in_draft,
                "analyzer_ms_per_program": self.seconds_per_program * 1e3}  # fmt: skip


def draft_quality(dataset: str, *, share: float = 0.25, min_programs: int = 48,
                  hardware: str | None = None) -> DraftQuality:  # fmt: skip
    """Recall of each group's true best programs inside the analyzer's top ``share``."""
    from tensortune.compat import tvm
    from tensortune.datasets.build import load_table, load_workloads
    from tensortune.datasets.shipped import dataset_path
    from tensortune.hardware import Platform, current_hardware
    from tensortune.records.convert import replay_trace
    from tensortune.search.analyzer.machine import machine_for
    from tensortune.search.analyzer.roofline import Analyzer

    if not 0 < share <= 1:
        raise TensortuneError("share must be in (0, 1]")
    dataset = dataset_path(dataset)  # a shipped dataset's name, or a directory
    cols = load_table(dataset, ["task_id", "hardware", "target", "trace", "label"]).to_pydict()
    modules = load_workloads(dataset)
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    for i, (task, hw) in enumerate(zip(cols["task_id"], cols["hardware"], strict=True)):
        if hardware is None or hw.startswith(hardware):
            groups[(task, hw)].append(i)
    out = DraftQuality(share)
    recalls: dict[int, list[float]] = {n: [] for n in TOPS}
    best: list[float] = []
    spent = 0.0
    machines: dict[str, object] = {}
    for (task, _), rows in groups.items():
        labels = np.array([cols["label"][i] for i in rows])
        if len(rows) < min_programs or not (labels > 0).any():
            continue
        target = cols["target"][rows[0]]
        if target not in machines:  # the dataset's targets, as they would run on this host
            machines[target] = machine_for(Platform(json.loads(target), current_hardware()))
        draft = Analyzer(machines[target])  # one per task: it caches the task's structure
        lat = np.full(len(rows), math.inf)
        for k, i in enumerate(rows):
            sch = tvm.s_tir.Schedule(modules[task])
            try:
                replay_trace(cols["trace"][i], sch)
            except Exception:
                continue
            t0 = time.perf_counter()
            lat[k] = draft.latency(sch.mod)
            spent += time.perf_counter() - t0
        keep = max(1, math.ceil(share * len(rows)))
        drafted = set(np.argsort(lat, kind="stable")[:keep].tolist())
        truth = np.argsort(-labels, kind="stable")
        for n in TOPS:
            top = [j for j in truth[:n] if labels[j] > 0]
            if top:
                recalls[n].append(sum(j in drafted for j in top) / len(top))
        best.append(float(max(labels[j] for j in drafted)))
        out.groups += 1
        out.programs += len(rows)
    if not out.groups:
        raise TensortuneError(f"no task in {dataset} has {min_programs}+ programs to check")
    out.recall = {n: float(np.mean(r)) for n, r in recalls.items() if r}
    out.best_in_draft = float(np.mean(best))
    out.seconds_per_program = spent / out.programs
    return out
