"""MetaSchedule's measure callback that writes every measured candidate to the records store."""

from __future__ import annotations

from collections.abc import Callable

from tensortune.compat import PyMeasureCallback, derived_object
from tensortune.records.convert import measured_records
from tensortune.records.schema import Record
from tensortune.records.storage import RecordStore


@derived_object
class RecordToStore(PyMeasureCallback):
    """Commits each measured batch as one transaction, with its status and error message.

    It replaces MetaSchedule's AddToDatabase, which keeps only a 1e10 run time for a failure
    and loses why it failed.  ``on_batch(task_id, records)`` reports progress.
    """

    def __init__(
        self,
        store: RecordStore,
        *,
        workload_ids: list[int],
        hardware_id: str,
        target: str,
        run_id: str,
        on_batch: Callable[[int, list[Record]], None] | None = None,
    ) -> None:
        super().__init__()
        self.store = store
        self.workload_ids = workload_ids
        self.hardware_id = hardware_id
        self.target = target
        self.run_id = run_id
        self.on_batch = on_batch
        # What stopped a commit: TVM turns an exception raised in a callback into a plain
        # RuntimeError, so the caller re-raises this one (e.g. "disk full") instead.
        self.error: Exception | None = None

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        records = measured_records(
            measure_candidates, builder_results, runner_results,
            workload_id=self.workload_ids[task_id], hardware_id=self.hardware_id,
            target=self.target, run_id=self.run_id,
        )  # fmt: skip
        try:
            self.store.add(records)
        except Exception as e:
            self.error = e
            raise
        if self.on_batch is not None:
            self.on_batch(task_id, records)
