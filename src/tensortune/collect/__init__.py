"""Dataset collection: measure programs of every task of a set of networks, on each hardware
configuration, into the records store (``datasets`` turns the records into a dataset)."""

from tensortune.collect.programs import (
    DEFAULT_CONFIGS,
    CollectResult,
    CollectStep,
    collect,
    default_configs,
    network_tasks,
)

__all__ = ["DEFAULT_CONFIGS", "CollectResult", "CollectStep", "collect", "default_configs",
           "network_tasks"]  # fmt: skip
