"""tensortune: fast auto-tuning of tensor programs on Apache TVM MetaSchedule.

The public API, importable from the package (TVM is loaded on first use, not at import)::

    import tensortune as tt
    result = tt.tune(["matmul:512,512,512"], trials=64, records="sqlite:///records.db")
    report = tt.compile_model("resnet18", records="sqlite:///records.db")
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "tune": "tensortune.tuning.tune",
    "TuneResult": "tensortune.tuning.tune",
    "resolve_tasks": "tensortune.tuning.tune",
    "compile_model": "tensortune.deploy.compile",
    "CompileReport": "tensortune.deploy.compile",
    "load_model": "tensortune.workloads.models",
    "parse_spec": "tensortune.workloads.ops",
    "Task": "tensortune.workloads.task",
    "open_records": "tensortune.records.storage",
    "RecordStore": "tensortune.records.storage",
    "Record": "tensortune.records.schema",
    "StoreDatabase": "tensortune.records.ms_database",
    "export_records": "tensortune.records.interop",
    "import_records": "tensortune.records.interop",
    "PersistentBuilder": "tensortune.measure.builder",
    "PersistentRunner": "tensortune.measure.runner",
    "TimingConfig": "tensortune.measure.runner",
    "current_hardware": "tensortune.hardware",
    "default_target": "tensortune.hardware",
    "TensortuneError": "tensortune.errors",
    "bench_tune": "tensortune.bench.tune",
    "BenchResult": "tensortune.bench.tune",
    "summarize_seeds": "tensortune.bench.tune",
    "DraftThenVerify": "tensortune.search.draft_verify",
    "DraftModel": "tensortune.draft.analyzer",
    "draft_quality": "tensortune.draft.quality",
}

__all__ = [
    "BenchResult",
    "CompileReport",
    "DraftModel",
    "DraftThenVerify",
    "PersistentBuilder",
    "PersistentRunner",
    "Record",
    "RecordStore",
    "StoreDatabase",
    "Task",
    "TensortuneError",
    "TimingConfig",
    "TuneResult",
    "__version__",
    "bench_tune",
    "compile_model",
    "current_hardware",
    "default_target",
    "draft_quality",
    "export_records",
    "import_records",
    "load_model",
    "open_records",
    "parse_spec",
    "resolve_tasks",
    "summarize_seeds",
    "tune",
]

if TYPE_CHECKING:
    from tensortune.bench.tune import BenchResult, bench_tune, summarize_seeds
    from tensortune.deploy.compile import CompileReport, compile_model
    from tensortune.draft.analyzer import DraftModel
    from tensortune.draft.quality import draft_quality
    from tensortune.errors import TensortuneError
    from tensortune.hardware import current_hardware, default_target
    from tensortune.measure.builder import PersistentBuilder
    from tensortune.measure.runner import PersistentRunner, TimingConfig
    from tensortune.records.interop import export_records, import_records
    from tensortune.records.ms_database import StoreDatabase
    from tensortune.records.schema import Record
    from tensortune.records.storage import RecordStore, open_records
    from tensortune.search.draft_verify import DraftThenVerify
    from tensortune.tuning.tune import TuneResult, resolve_tasks, tune
    from tensortune.workloads.models import load_model
    from tensortune.workloads.ops import parse_spec
    from tensortune.workloads.task import Task


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'tensortune' has no attribute {name!r}")
