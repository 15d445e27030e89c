"""The measure callback that writes every measured candidate to the records store."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from tensortune.compat import TVM_VERSION, PyMeasureCallback, derived_object
from tensortune.measure.status import Status, classify
from tensortune.records.ms_database import to_plain
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

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        now = time.time()
        records = []
        for cand, built, ran in zip(measure_candidates, builder_results, runner_results,
                                    strict=True):  # fmt: skip
            status = classify(built.error_msg, ran.error_msg)
            secs = tuple(float(s) for s in ran.run_secs or []) if status is Status.OK else ()
            records.append(
                Record(
                    workload_id=self.workload_ids[task_id],
                    hardware_id=self.hardware_id,
                    target=self.target,
                    trace=json.dumps(to_plain(cand.sch.trace.as_json(remove_postproc=False))),
                    args_info=json.dumps([to_plain(a.as_json()) for a in cand.args_info]),
                    run_secs=secs,
                    status=status.value,
                    error=None if status is Status.OK else (built.error_msg or ran.error_msg),
                    run_id=self.run_id,
                    tvm_version=TVM_VERSION,
                    created_at=now,
                )
            )
        self.store.add(records)
        if self.on_batch is not None:
            self.on_batch(task_id, records)
