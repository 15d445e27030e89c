"""``tensortune dataset collect``: measure programs of every task of a set of networks, on each
hardware configuration, into the records store (resumable: it tops up what is there).

Like TenSet, each task gets a share of random programs from its design space (the sampler) and
the rest from MetaSchedule's evolutionary search, which starts from the best programs measured
so far.

Several collectors may fill one store at once (``worker=True``, on one machine or many, on a
PostgreSQL store): they claim each batch before measuring it (``search.leases``), so none
measures a program another has, and each starts at a task of its own.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from tensortune.errors import (
    RecordsError,
    TensortuneError,
    about,
    check_count,
    check_flags,
    check_seed,
    interrupted,
    interruptible,
)
from tensortune.hardware import (
    HardwareConfig,
    Platform,
    current_hardware,
    get_config,
    resolve_platform,
)
from tensortune.records import DEFAULT_URL, RecordStore, records_from
from tensortune.records.schema import TaskSource
from tensortune.records.storage import ClaimBudget
from tensortune.search.leases import (
    SharedBudget,
    candidate_hash,
    lease_seconds,
    release_the_dead,
    worker_name,
)
from tensortune.workloads.task import Task

DEFAULT_CONFIGS = ("avx512-2c", "avx2-1c")
BATCH = 16


def default_configs() -> list[str]:
    """The configurations a collection names none takes: ``DEFAULT_CONFIGS``, less those this
    CPU cannot run (an AVX2-only CPU runs no ``avx512`` code; named, they are refused)."""
    from tensortune.hardware.target import check_runs_here

    def runs(name: str) -> bool:
        try:
            check_runs_here(get_config(name).target)
        except TensortuneError:
            return False
        return True

    return [name for name in DEFAULT_CONFIGS if runs(name)]


@dataclass
class CollectResult:
    records_url: str
    configs: list[str]
    tasks: int
    measured: int = 0
    per_config: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CollectStep:
    """Where a collection stands: reported before each task and after each measured batch."""

    config: str
    index: int  # of the task, among ``tasks``
    tasks: int
    task: Task
    have: int  # the task's programs in the store on this configuration
    want: int


Progress = Callable[[CollectStep], None]


# The network name under which standalone operators' tasks are recorded: a dataset's splits
# by network then treat them as one more network (held out together, or trained on).
OPS_NETWORK = "ops"


def network_tasks(
    networks: Sequence[object], platform: Platform, workloads: Sequence[str | Task] = ()
) -> dict[str, list[Task]]:
    """Each network's tasks (a zoo name, an .onnx path or a loaded ``Model``), and standalone
    operators (specs such as ``softmax:128,768``, or tasks) as the network ``OPS_NETWORK``."""
    from tensortune.workloads.models import Model, load_model
    from tensortune.workloads.resolve import resolve_tasks

    out = {}
    for net in networks:
        m = net if isinstance(net, Model) else load_model(net, target=platform.tvm_target)
        out[m.name] = m.tasks
    if workloads:
        out[OPS_NETWORK] = resolve_tasks(list(workloads), platform=platform)
    return out


def register_tasks(store: RecordStore, by_network: dict[str, list[Task]]) -> dict[int, Task]:
    """Each distinct task by its workload id in ``store``, with this machine and every task's
    networks recorded there."""
    store.register_hardware(current_hardware())
    tasks: dict[int, Task] = {}
    sources = []
    for net, net_tasks in by_network.items():
        for t in net_tasks:
            wid = store.workload_id(t.mod, t.name)
            tasks.setdefault(wid, t)
            sources.append(TaskSource(net, wid, t.name, t.weight))
    store.add_task_sources(sources)
    return tasks


def tasks_to_collect(
    networks: Sequence[object] | None,
    platform: Platform,
    *,
    workloads: Sequence[str | Task] = (),
    heaviest: int | None = None,
    exclude: Sequence[object] = (),
) -> dict[str, list[Task]]:
    """The tasks a collection measures, by network: those of ``networks`` (none given: the
    whole zoo, unless standalone operators are) and of ``workloads``, chosen as
    ``chosen_tasks`` chooses with ``heaviest`` and the tasks of the networks ``exclude``."""
    from tensortune.workloads.networks import NETWORKS

    nets = list(networks or ([] if workloads else NETWORKS))
    with about("exclude"):
        excluded = network_tasks(list(exclude), platform)
    return chosen_tasks(network_tasks(nets, platform, workloads), heaviest=heaviest,
                        exclude=excluded)  # fmt: skip


def chosen_tasks(
    by_network: dict[str, list[Task]],
    *,
    heaviest: int | None = None,
    exclude: dict[str, list[Task]] | None = None,
) -> dict[str, list[Task]]:
    """Each network's tasks less those that also occur in ``exclude``'s networks (held out of
    a study: a shared kernel would leak its labels), then its ``heaviest`` by FLOPs."""
    from tensortune.compat import structural_hash

    banned = {structural_hash(t.mod) for ts in (exclude or {}).values() for t in ts}
    if heaviest is not None and heaviest < 1:
        raise TensortuneError(f"must be positive, not {heaviest}", param="heaviest")
    out = {}
    for net, ts in by_network.items():
        kept = [t for t in ts if structural_hash(t.mod) not in banned]
        if heaviest is not None:
            kept = sorted(kept, key=lambda t: -t.flop)[:heaviest]
        out[net] = kept
    if banned and not any(out.values()):
        raise TensortuneError("every task occurs in an excluded network: nothing to collect")
    return out


def _evolution() -> object:
    """MetaSchedule's evolutionary search with a smaller population: collection needs evolved
    programs, not the best possible ones, and a default round costs 10-35 s on 2 cores."""
    from tensortune.compat import ms

    return ms.search_strategy.EvolutionarySearch(population_size=128)


def as_list(value: object) -> list:
    """``value`` as a list of items; one name (a string or path) is one item, not its letters."""
    return [value] if isinstance(value, str | os.PathLike) else list(value)  # type: ignore[call-overload]


def check_configs(
    configs: Sequence[str | HardwareConfig], *, param: str = "configs"
) -> tuple[list[HardwareConfig], list[Platform]]:
    """The hardware configurations named and their platforms, every one checked to run on this
    machine before anything is measured: a bad last one must not surface after hours spent
    on the first."""
    with about(param):
        if not as_list(configs):
            runs = ", ".join(default_configs()) or "none"
            defaults = ", ".join(DEFAULT_CONFIGS)
            raise TensortuneError(f"no configuration to collect on (of the defaults {defaults}, "
                                  f"this CPU runs {runs})")  # fmt: skip
        hw_configs = [c if isinstance(c, HardwareConfig) else get_config(c)
                      for c in as_list(configs)]  # fmt: skip
        platforms = [resolve_platform(c.target) for c in hw_configs]
        for p in platforms:
            p.check_runs_here()
    return hw_configs, platforms


def collect(
    networks: Sequence[object] | None = None,
    *,
    configs: Sequence[str | HardwareConfig] | None = None,
    programs_per_task: int = 64,
    evolved_share: float = 0.5,
    sampler: object | None = None,
    records: str | RecordStore = DEFAULT_URL,
    work_dir: str | os.PathLike = "tensortune-work",
    seed: int = 0,
    timing: object | None = None,
    progress: Progress | None = None,
    worker: bool = False,
    heaviest: int | None = None,
    exclude: Sequence[object] = (),
    workloads: Sequence[str | Task] = (),
) -> CollectResult:
    """Measure ``programs_per_task`` programs of each distinct task, on every configuration.

    ``networks`` defaults to the whole zoo unless standalone operators are given
    (``workloads``: specs like ``softmax:128,768``; recorded as the network ``"ops"``).

    ``timing`` (a ``TimingConfig``) defaults to 3 repeats of at least 10 ms: random programs of
    large tasks run for tens of milliseconds each, and the dataset needs many of them.
    ``worker``: one of several collectors sharing ``records``; it starts at a task of its own
    (collectors never measure the same program, ``worker`` or not).
    ``heaviest``: only each network's N tasks with the most FLOPs (dense pools for studies);
    ``exclude``: networks whose tasks are left out, e.g. those a study holds out.
    """
    from tensortune.measure.runner import TimingConfig
    from tensortune.measure.session import MeasureSession
    from tensortune.select.samplers import RandomSampler

    # One name where a list is expected is one item (a string is not a list of letters).
    networks = None if networks is None else as_list(networks)
    configs = default_configs() if configs is None else configs
    configs, exclude, workloads = as_list(configs), as_list(exclude), as_list(workloads)
    # All checked before the store opens and the networks load.
    check_count(programs_per_task, "programs_per_task")
    if heaviest is not None:
        check_count(heaviest, "heaviest")
    check_seed(seed)
    check_flags(worker=worker)
    if isinstance(evolved_share, bool) or not (isinstance(evolved_share, numbers.Real)
                                               and 0 <= evolved_share <= 1):  # fmt: skip
        raise TensortuneError(f"must be from 0 to 1, not {evolved_share!r}",
                              param="evolved_share")  # fmt: skip
    if timing is not None and not isinstance(timing, TimingConfig):
        raise TensortuneError(f"a TimingConfig, not {timing!r:.60}", param="timing")
    if sampler is not None and not callable(getattr(sampler, "sample", None)):
        raise TensortuneError(f"a sampler (an object with a sample method), not {sampler!r:.60}"
                              " (a selector by name: collect_active(selector=...))",
                              param="sampler")  # fmt: skip
    sampler = sampler or RandomSampler()
    hw_configs, platforms = check_configs(configs)
    with about("networks"):
        by_network = tasks_to_collect(networks, platforms[0], workloads=workloads,
                                      heaviest=heaviest, exclude=exclude)  # fmt: skip
    with interruptible(graceful=True), records_from(records) as store:
        tasks = register_tasks(store, by_network)
        for platform in platforms:  # before anything is measured
            check_collected_by(store, tasks, platform, PLAIN_RUN, "a plain collection")
        result = CollectResult(store.url, [c.name for c in hw_configs], len(tasks))
        for config, platform in zip(hw_configs, platforms, strict=True):
            with MeasureSession(platform, log_dir=Path(work_dir) / "logs",
                                timing=timing or TimingConfig(repeat=3)) as session:  # fmt: skip
                filler = _Filler(store, session, sampler, programs_per_task,
                                 round(programs_per_task * (1 - evolved_share)),
                                 Path(work_dir) / config.name, seed)  # fmt: skip
                measured = 0
                order = list(tasks.items())
                if worker:  # start where the other workers are unlikely to be
                    start = uuid.uuid4().int % len(order)
                    order = order[start:] + order[:start]
                try:
                    for i, (wid, task) in enumerate(order):
                        step = partial(CollectStep, config.name, i, len(tasks), task,
                                       want=programs_per_task)  # fmt: skip
                        measured += filler.fill(wid, task, partial(_report, progress, step))
                finally:  # drawn, never measured: free for others (or they expire)
                    with contextlib.suppress(RecordsError):
                        store.release(filler.worker)
            result.per_config[config.name] = measured
            result.measured += measured
    return result


# The run ids a plain collection counts as its own: its workers' (``_Filler``), and 12 hex
# digits, which collections before 7c76140 gave their evolved share (measured through
# ``tune``, whose runs are named so too, and cannot be told apart: they count), and none (a
# database imported).  A sampler's (``collect-NAME-…``) and a transfer's picks do not.
PLAIN_RUN = re.compile(r"(?:collect-[0-9a-f]{8}|[0-9a-f]{12})?")


def check_collected_by(store: RecordStore, tasks: dict[int, Task], platform: Platform,
                       own: re.Pattern, who: str) -> None:  # fmt: skip
    """Refuse a store whose records of ``tasks`` on ``platform`` were not all made by runs
    whose id ``own`` matches (``who``): a collection counts what a task has to know what it
    lacks, and others' programs (a sampler's picks, a transfer's) would stand in for its own
    random and evolved ones.  Its own records, from a run it resumes or a worker beside it,
    are fine (``PLAIN_RUN`` says which a plain collection takes for its own)."""
    foreign = sum(1 for wid in tasks
                  for r in store.query(workload_id=wid, hardware_id=platform.hardware.id,
                                       target=platform.key)
                  if not own.fullmatch(r.run_id))  # fmt: skip
    if foreign:
        raise TensortuneError(f"{store.url} already holds {foreign} measurements of these tasks "
                              f"on this configuration not made by {who}; they would count "
                              "toward its programs: collect into a store of its own")  # fmt: skip


def _report(progress: Progress | None, step: Callable[..., CollectStep], have: int) -> None:
    if progress is not None:
        progress(step(have=have))


class _Filler:
    """Tops tasks up to ``want`` programs on one configuration: ``n_random`` random ones first
    (so that a resume knows which phase a task is in), then evolved ones."""

    def __init__(self, store: RecordStore, session, sampler, want: int, n_random: int,
                 work: Path, seed: int) -> None:  # fmt: skip
        self.store, self.session, self.sampler = store, session, sampler
        self.want, self.n_random, self.work, self.seed = want, n_random, work, seed
        self.platform: Platform = session.platform
        self.run_id = f"collect-{uuid.uuid4().hex[:8]}"
        self.worker = worker_name()
        # A collector killed before held its batch's random programs: the random share claims
        # directly, so it would wait out those leases, and leave the task short meanwhile.
        release_the_dead(store, self.worker)

    def fill(self, wid: int, task: Task, report: Callable[[int], object]) -> int:
        """Measure what the task lacks; ``report(have)`` after each batch.  Returns how many
        programs it measured."""
        from tensortune.records.convert import measured_records

        platform, store = self.platform, self.store
        where = {"workload_id": wid, "hardware_id": platform.hardware.id, "target": platform.key}
        have = store.count(**where)
        report(have)
        mine = 0  # what this collector measured: others sharing the store add to the count too
        dry = False  # the design space has no new program left to draw
        if have < self.n_random:
            seen = {r.trace for r in store.query(**where)}
            cands = self.sampler.sample(task.mod, platform, self.n_random - have,
                                        seed=self.seed + have, exclude=seen)  # fmt: skip
            dry = len(cands) < self.n_random - have
            for k in range(0, len(cands), BATCH):
                if interrupted():  # Ctrl-C: what is measured is recorded; stop here
                    raise KeyboardInterrupt
                # The random share is shared too: a collector that arrives later samples
                # other programs (its seed follows the count), which leases alone let through.
                share = ClaimBudget((wid,), self.n_random, self.n_random)
                batch = self._claimed(wid, cands[k : k + BATCH], share)
                if batch:
                    built, ran = self.session.measure(batch)
                    store.add(measured_records(
                        batch, built, ran, workload_id=wid, hardware_id=platform.hardware.id,
                        target=platform.key, run_id=self.run_id))  # fmt: skip
                    mine += len(batch)
                report(store.count(**where))
            have = store.count(**where)
            if have < self.n_random and not dry:
                # Others hold the rest of the random share: the task is theirs for now (a
                # rerun fills what a stopped one left).  Evolving now would evolve from a
                # model of nothing and take the place of their random programs.
                return mine
        if have < self.want and not dry:  # evolution cannot beat a dry space
            mine += self._evolve(task, wid, have, lambda n: report(have + n))
        return mine

    def _claimed(self, wid: int, batch: list, budget: ClaimBudget | None = None) -> list:
        """The candidates of ``batch`` this collector may measure: leased to it now, within
        ``budget``."""
        hashes = [candidate_hash(c) for c in batch]
        held = set(self.store.claim(wid, self.platform.hardware.id, self.platform.key, hashes,
                                    worker=self.worker, seconds=lease_seconds(len(hashes)),
                                    budget=budget))  # fmt: skip
        return [c for c, h in zip(batch, hashes, strict=True) if h in held]

    def _evolve(self, task: Task, wid: int, have: int, measured: Callable[[int], object]) -> int:
        """Evolutionary search up to ``want`` programs; ``measured(n)`` after each batch.
        Returns how many it measured."""
        from tensortune.costmodel.factory import cost_model_from
        from tensortune.search.run import run_search

        remaining = self.want - have
        count = [0]
        # A task all leased to other collectors is theirs: go on to the next one (a rerun
        # fills what a stopped collector left), rather than wait for them.
        budget = SharedBudget(self.store, [wid], self.platform.hardware.id, self.platform.key,
                              self.want, self.want, worker=self.worker, max_wait_s=0)  # fmt: skip

        def on_batch(_: int, batch: list) -> None:
            count[0] += len(batch)
            measured(count[0])

        run_search(self.store, [task], [wid], self.platform, self.session, trials=remaining,
                   max_trials_per_task=self.want, strategy=_evolution(),
                   cost_model=cost_model_from("xgb", self.platform), work_dir=self.work,
                   trials_per_round=min(BATCH, remaining), seed=self.seed, run_id=self.run_id,
                   on_batch=on_batch, budget=budget)  # fmt: skip
        return count[0]
