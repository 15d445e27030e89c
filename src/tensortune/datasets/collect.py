"""``tensortune dataset collect``: measure programs of every task of a set of networks, on each
hardware configuration, into the records store (resumable: it tops up what is there).

Like TenSet, each task gets a share of random programs from its design space (the sampler) and
the rest from MetaSchedule's evolutionary search, which starts from the best programs measured
so far.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tensortune.datasets.hwconfig import HardwareConfig, get_config
from tensortune.hardware import current_hardware, target_key
from tensortune.records.schema import TaskSource
from tensortune.records.storage import DEFAULT_URL, RecordStore, open_records
from tensortune.workloads.task import Task

DEFAULT_CONFIGS = ("avx512-2c", "avx2-1c")
BATCH = 16


@dataclass
class CollectResult:
    records_url: str
    configs: list[str]
    tasks: int
    measured: int = 0
    per_config: dict[str, int] = field(default_factory=dict)


Progress = Callable[[str, int, int, Task, int, int], None]  # config, i, n, task, have, want


def network_tasks(networks: Sequence[object], target: dict) -> dict[str, list[Task]]:
    """Each network's tasks (a zoo name, an .onnx path or a loaded ``Model``)."""
    from tensortune.compat import tvm
    from tensortune.workloads.models import Model, load_model

    out = {}
    for net in networks:
        m = net if isinstance(net, Model) else load_model(net, target=tvm.target.Target(target))
        out[m.name] = m.tasks
    return out


def _evolution() -> object:
    """MetaSchedule's evolutionary search with a smaller population: collection needs evolved
    programs, not the best possible ones, and a default round costs 10-35 s on 2 cores."""
    from tensortune.compat import ms

    return ms.search_strategy.EvolutionarySearch(population_size=128)


def collect(
    networks: Sequence[object] | None = None,
    *,
    configs: Sequence[str | HardwareConfig] = DEFAULT_CONFIGS,
    programs_per_task: int = 64,
    evolved_share: float = 0.5,
    sampler: object | None = None,
    records: str | RecordStore = DEFAULT_URL,
    work_dir: str | os.PathLike = "tensortune-work",
    seed: int = 0,
    timing: object | None = None,
    progress: Progress | None = None,
) -> CollectResult:
    """Measure ``programs_per_task`` programs of each distinct task, on every configuration.

    ``timing`` (a ``TimingConfig``) defaults to 3 repeats of at least 10 ms: random programs of
    large tasks run for tens of milliseconds each, and the dataset needs many of them.
    """
    from tensortune.measure.batch import measure_batch
    from tensortune.measure.builder import PersistentBuilder
    from tensortune.measure.runner import PersistentRunner, TimingConfig
    from tensortune.records.convert import measured_records
    from tensortune.select.samplers import RandomSampler
    from tensortune.tuning.tune import tune
    from tensortune.workloads.networks import NETWORKS

    sampler = sampler or RandomSampler()
    hw_configs = [c if isinstance(c, HardwareConfig) else get_config(c) for c in configs]
    store = open_records(records) if isinstance(records, str) else records
    hw_id = store.register_hardware(current_hardware())
    by_network = network_tasks(list(networks or NETWORKS), hw_configs[0].target)
    tasks: dict[int, Task] = {}
    sources = []
    for net, net_tasks in by_network.items():
        for t in net_tasks:
            wid = store.workload_id(t.mod, t.name)
            tasks.setdefault(wid, t)
            sources.append(TaskSource(net, wid, t.name, t.weight))
    store.add_task_sources(sources)
    result = CollectResult(store.url, [c.name for c in hw_configs], len(tasks))
    n_random = round(programs_per_task * (1 - evolved_share))
    work = Path(work_dir)
    for config in hw_configs:
        tkey = target_key(config.target)
        run_id = f"collect-{uuid.uuid4().hex[:8]}"
        logs = work / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        builder = PersistentBuilder(log_path=str(logs / "builder-workers.log"))
        runner = PersistentRunner(timing or TimingConfig(repeat=3), num_threads=config.threads,
                                  log_path=str(logs / "runner-worker.log"))  # fmt: skip
        measured = 0
        try:
            for i, (wid, task) in enumerate(tasks.items()):
                where = {"workload_id": wid, "hardware_id": hw_id, "target": tkey}
                have = store.count(**where)
                if progress is not None:
                    progress(config.name, i, len(tasks), task, have, programs_per_task)
                dry = False  # the design space has no new program left to draw
                if have < n_random:  # random share first, so a resume knows which phase it is in
                    seen = {r.trace for r in store.query(**where)}
                    cands = sampler.sample(task.mod, config.target, n_random - have,
                                           seed=seed + have, exclude=seen)  # fmt: skip
                    dry = len(cands) < n_random - have
                    for k in range(0, len(cands), BATCH):
                        batch = cands[k : k + BATCH]
                        built, ran = measure_batch(builder, runner, batch, config.target)
                        store.add(measured_records(batch, built, ran, workload_id=wid,
                                                   hardware_id=hw_id, target=tkey,
                                                   run_id=run_id))  # fmt: skip
                        measured += len(batch)
                    have = store.count(**where)
                if have < programs_per_task and not dry:  # evolution cannot beat a dry space
                    done = tune([task], trials=programs_per_task, records=store,
                                work_dir=work / config.name, target=config.target,
                                builder=builder, runner=runner, check_correctness=False,
                                trials_per_round=BATCH, seed=seed,
                                strategy=_evolution())  # fmt: skip
                    measured += done.tasks[0].trials - have
        finally:
            builder.close()
            runner.close()
        result.per_config[config.name] = measured
        result.measured += measured
    if isinstance(records, str):
        store.close()
    return result
