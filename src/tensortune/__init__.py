"""tensortune: fast auto-tuning of tensor programs on Apache TVM MetaSchedule.

The public API, importable from the package (TVM is loaded on first use, not at import)::

    import tensortune as tt
    result = tt.tune(["matmul:512,512,512"], trials=64, records="sqlite:///records.db")
    report = tt.compile_model("resnet18", records="sqlite:///records.db")
"""

from __future__ import annotations

import sys
import types
import warnings
from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    # flows
    "tune": "tensortune.tuning.tune",
    "plan_tune": "tensortune.tuning.tune",
    "TuneResult": "tensortune.tuning.tune",
    "TuneProgress": "tensortune.tuning.tune",
    "best_programs": "tensortune.tuning.best",
    "compile_model": "tensortune.deploy.compile",
    "load": "tensortune.deploy.artifact",
    "CompiledModel": "tensortune.deploy.artifact",
    "transfer": "tensortune.transfer.run",
    "TransferResult": "tensortune.transfer.run",
    "kernel_class": "tensortune.transfer.classes",
    "CompileReport": "tensortune.deploy.compile",
    "collect": "tensortune.collect",
    "train": "tensortune.train.trainer",
    "evaluate": "tensortune.train.trainer",
    "finetune": "tensortune.train.finetune",
    "recheck_dataset": "tensortune.datasets.recheck",
    "bench_tune": "tensortune.compare.search_methods",
    "bench_seeds": "tensortune.compare.seeds",
    "BenchResult": "tensortune.compare.search_methods",
    "summarize_seeds": "tensortune.compare.seeds",
    # what to tune, and where
    "resolve_tasks": "tensortune.workloads.resolve",
    "load_model": "tensortune.workloads.models",
    "parse_spec": "tensortune.workloads.ops",
    "Task": "tensortune.workloads.task",
    "Platform": "tensortune.hardware",
    "resolve_platform": "tensortune.hardware",
    "current_hardware": "tensortune.hardware",
    "default_target": "tensortune.hardware",
    # records
    "open_records": "tensortune.records",
    "RecordStore": "tensortune.records",
    "Record": "tensortune.records",
    "StoreDatabase": "tensortune.records.ms_database",
    "copy_records": "tensortune.records.interop",
    "export_records": "tensortune.records.interop",
    "import_records": "tensortune.records.interop",
    # measurement
    "PersistentBuilder": "tensortune.measure.builder",
    "PersistentRunner": "tensortune.measure.runner",
    "TimingConfig": "tensortune.measure.timing",
    "MeasureSession": "tensortune.measure.session",
    # models and search
    "cost_model_from": "tensortune.costmodel.factory",
    "load_cost_model": "tensortune.costmodel.registry",
    "strategy_from": "tensortune.search.factory",
    "DraftThenVerify": "tensortune.search.draft_verify",
    "Analyzer": "tensortune.search.analyzer",
    "draft_quality": "tensortune.search.analyzer.quality",
    "TensortuneError": "tensortune.errors",
}
# Names of an earlier release: still served, with a warning naming the new one.
_RENAMED = {"DraftModel": "Analyzer"}

__all__ = [
    "Analyzer",
    "BenchResult",
    "CompileReport",
    "CompiledModel",
    "DraftThenVerify",
    "MeasureSession",
    "PersistentBuilder",
    "PersistentRunner",
    "Platform",
    "Record",
    "RecordStore",
    "StoreDatabase",
    "Task",
    "TensortuneError",
    "TimingConfig",
    "TransferResult",
    "TuneProgress",
    "TuneResult",
    "__version__",
    "bench_seeds",
    "bench_tune",
    "best_programs",
    "collect",
    "compile_model",
    "copy_records",
    "cost_model_from",
    "current_hardware",
    "default_target",
    "draft_quality",
    "evaluate",
    "export_records",
    "finetune",
    "import_records",
    "kernel_class",
    "load",
    "load_cost_model",
    "load_model",
    "open_records",
    "parse_spec",
    "plan_tune",
    "recheck_dataset",
    "resolve_platform",
    "resolve_tasks",
    "strategy_from",
    "summarize_seeds",
    "train",
    "transfer",
    "tune",
]

if TYPE_CHECKING:
    from tensortune.collect import collect
    from tensortune.compare.search_methods import BenchResult, bench_tune
    from tensortune.compare.seeds import bench_seeds, summarize_seeds
    from tensortune.costmodel.factory import cost_model_from
    from tensortune.costmodel.registry import load_cost_model
    from tensortune.datasets.recheck import recheck_dataset
    from tensortune.deploy.artifact import CompiledModel, load
    from tensortune.deploy.compile import CompileReport, compile_model
    from tensortune.errors import TensortuneError
    from tensortune.hardware import Platform, current_hardware, default_target, resolve_platform
    from tensortune.measure.builder import PersistentBuilder
    from tensortune.measure.runner import PersistentRunner
    from tensortune.measure.session import MeasureSession
    from tensortune.measure.timing import TimingConfig
    from tensortune.records import Record, RecordStore, open_records
    from tensortune.records.interop import copy_records, export_records, import_records
    from tensortune.records.ms_database import StoreDatabase
    from tensortune.search.analyzer import Analyzer
    from tensortune.search.analyzer.quality import draft_quality
    from tensortune.search.draft_verify import DraftThenVerify
    from tensortune.search.factory import strategy_from
    from tensortune.train.finetune import finetune
    from tensortune.train.trainer import evaluate, train
    from tensortune.transfer.classes import kernel_class
    from tensortune.transfer.run import TransferResult, transfer
    from tensortune.tuning.best import best_programs
    from tensortune.tuning.tune import TuneProgress, TuneResult, plan_tune, tune
    from tensortune.workloads.models import load_model
    from tensortune.workloads.ops import parse_spec
    from tensortune.workloads.resolve import resolve_tasks
    from tensortune.workloads.task import Task


# Public functions named like a subpackage: importing ``tensortune.train`` (which anything may
# do first) would set the package's attribute to that module, and ``tt.train(...)`` would then
# call a module.  The package keeps these names for the functions; the subpackages' modules
# are imported with ``from tensortune.train import trainer`` (``import tensortune.train.trainer
# as m`` would look ``trainer`` up on the function).
_SHADOWED = frozenset({"collect", "train", "transfer"})


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: object) -> None:
        if name in _SHADOWED and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    if name in _RENAMED:
        new = _RENAMED[name]
        warnings.warn(f"tensortune.{name} is now tensortune.{new}", DeprecationWarning,
                      stacklevel=2)  # fmt: skip
        name = new
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'tensortune' has no attribute {name!r}")
