"""The storage interface behind every records store (``open_records`` picks one by URL).

Algorithms keep no durable state: everything a tuning run must not lose lives behind this
interface, so resuming is simply opening the same URL again.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from tensortune.hardware import Hardware
from tensortune.records.schema import Record, StoredWorkload, TaskSource

DEFAULT_URL = "sqlite:///tensortune.db"


@dataclass(frozen=True)
class ClaimBudget:
    """What a claim may not take the records and live leases of a hardware/target past:
    ``total`` over ``workload_ids``, ``per_task`` of the workload claimed."""

    workload_ids: tuple[int, ...]
    total: int
    per_task: int


class RecordStore(abc.ABC):
    """Measurement records, the workloads they belong to and the hardware they ran on."""

    url: str

    @abc.abstractmethod
    def workload_id(self, mod, name: str = "", *, create: bool = True) -> int | None:
        """Id of the structurally equal workload, created when missing (``create``)."""

    @abc.abstractmethod
    def workload(self, workload_id: int) -> StoredWorkload: ...

    @abc.abstractmethod
    def workloads(self) -> list[StoredWorkload]: ...

    @abc.abstractmethod
    def register_hardware(self, hardware: Hardware) -> str:
        """Store a hardware description; returns its id."""

    @abc.abstractmethod
    def hardware(self) -> dict[str, Hardware]: ...

    @abc.abstractmethod
    def add(self, records: Iterable[Record]) -> None:
        """Commit records atomically: all of them or, on any error, none.  A record whose
        ``uid`` the store already holds is not added again; the leases on the candidates
        committed end in the same transaction."""

    @abc.abstractmethod
    def query(
        self,
        *,
        workload_id: int | None = None,
        hardware_id: str | None = None,
        target: str | None = None,
        ok_only: bool = False,
        best_first: bool = False,
        limit: int | None = None,
    ) -> Iterator[Record]: ...

    @abc.abstractmethod
    def count(
        self,
        *,
        workload_id: int | None = None,
        hardware_id: str | None = None,
        target: str | None = None,
        ok_only: bool = False,
    ) -> int: ...

    def counts(self, workload_ids: Sequence[int], hardware_id: str,
               target: str) -> dict[int, int]:  # fmt: skip
        """Per workload of ``workload_ids``, its records on this hardware and target (those
        with none are left out).  A store over SQL answers in one query."""
        found = {w: self.count(workload_id=w, hardware_id=hardware_id, target=target)
                 for w in workload_ids}  # fmt: skip
        return {w: n for w, n in found.items() if n}

    @abc.abstractmethod
    def add_task_sources(self, sources: Iterable[TaskSource]) -> None:
        """Record which networks each workload is a task of (replacing earlier entries)."""

    @abc.abstractmethod
    def task_sources(self, network: str | None = None) -> list[TaskSource]: ...

    @abc.abstractmethod
    def summary(self) -> list[tuple]:
        """Per (workload, hardware, target): name, workload id, hardware id, target, record
        count, successful count, best cost (seconds, None if nothing succeeded)."""

    # -- leases: several workers, one budget, no candidate measured twice ----------------------

    @abc.abstractmethod
    def claim(self, workload_id: int, hardware_id: str, target: str, hashes: Sequence[str], *,
              worker: str, seconds: float,
              budget: ClaimBudget | None = None) -> list[str]:  # fmt: skip
        """Lease the candidates named by ``hashes`` (``schema.trace_hash``) to ``worker`` for
        ``seconds``; returns those it now holds, in the order given, leaving out the ones
        already measured and the ones another worker holds.  With a ``budget``, the first of
        them only, as many as it has room for, counted in the same transaction: workers that
        drafted a round at once cannot each take the last of it."""

    @abc.abstractmethod
    def release(self, worker: str) -> None:
        """End every lease ``worker`` holds (its batch was not measured)."""

    @abc.abstractmethod
    def lease_holders(self) -> set[str]:
        """The workers that hold leases, live or expired."""

    @abc.abstractmethod
    def leased(self, workload_ids: Sequence[int], hardware_id: str, target: str, *,
               worker: str = "") -> dict[int, int]:  # fmt: skip
        """Per workload, the candidates that workers other than ``worker`` hold now."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> RecordStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
