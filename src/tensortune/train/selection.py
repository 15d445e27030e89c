"""Which programs of a dataset a model trains on: the pool on one hardware less the held-out
networks' tasks, and one active-learning selector's picks of it written as a dataset
(``tensortune dataset select``), so that anyone can check a selection on their own test tasks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tensortune.active import FRACTIONS, grow, make_selector, pool_from_programs, study_sizes
from tensortune.costmodel.data import ProgramSet
from tensortune.costmodel.registry import new_model
from tensortune.errors import TensortuneError, about


def held_out_networks(dataset: str | Path, given: str) -> list[str]:
    """The networks named in ``given`` (comma-separated), else the dataset card's
    ``held_out`` (what ``dataset build --held-out`` recorded)."""
    from tensortune.datasets.build import read_card
    from tensortune.datasets.shipped import dataset_path

    held = [n for n in given.split(",") if n]
    if held:
        return held
    with about("dataset"):
        return list(read_card(dataset_path(dataset)).data.get("held_out") or [])


def pool_mask(columns: dict, held_out: Sequence[str],
              hardware: str | None) -> tuple[np.ndarray, str]:  # fmt: skip
    """The rows (with features) of one hardware, ``hardware`` or the dataset's only one, whose
    tasks occur in none of the ``held_out`` networks; and that hardware."""
    hw = np.asarray(columns["hardware"])
    choices = sorted(set(hw.tolist()))
    if not choices:  # e.g. a recheck that dropped every row
        raise TensortuneError("the dataset holds no programs")
    if hardware is None and len(choices) > 1:
        raise TensortuneError(f"the dataset holds several hardware ({', '.join(choices)}): "
                              "name one", param="hardware")  # fmt: skip
    hardware = hardware or choices[0]
    if hardware not in choices:
        raise TensortuneError(f"no rows on {hardware}; the dataset has {', '.join(choices)}",
                              param="hardware")  # fmt: skip
    held = set(held_out)
    held_tasks = {t for t, ns in zip(columns["task"], columns["networks"], strict=True)
                  if held & set(ns)}  # fmt: skip
    keep = [
        i
        for i in np.flatnonzero(hw == hardware)
        if columns["per_store"][i] is not None and columns["task"][i] not in held_tasks
    ]
    if not keep:
        raise TensortuneError(f"no programs left on {hardware} once the held-out networks' "
                              "tasks are out")  # fmt: skip
    return np.array(keep, dtype=int), hardware


def select_dataset(dataset: str | Path, selector: str, fraction: float, out: str | Path, *,
                   seed: int = 0, hardware: str | None = None,
                   held_out: Sequence[str] | None = None,
                   acquisition: str = "xgb", params: dict | None = None,
                   steps: Sequence[float] = FRACTIONS,
                   overwrite: bool = False) -> dict:  # fmt: skip
    """Write ``selector``'s picks of ``fraction`` of ``dataset``'s programs on one hardware
    (less the tasks of ``held_out`` networks; by default those the dataset's card holds out,
    its test networks, as ``dataset select`` does) to ``out`` as a dataset that ``train`` reads.
    The selection grows through the fractions of ``steps`` below ``fraction`` first, as the
    offline study does, so the picks are the study's at that fraction for the same seed and
    fractions (``grow``, an ``acquisition`` model with ``params``, seeded with ``seed``; by
    default ``bench al``'s fractions).  A dataset already in ``out`` is replaced only with
    ``overwrite``.  Returns the new card."""
    from tensortune.datasets.build import check_out_dir
    from tensortune.datasets.shipped import dataset_path
    from tensortune.datasets.subset import write_subset
    from tensortune.train.trainer import dataset_columns

    if not 0 < fraction <= 1:
        raise TensortuneError(f"must lie in (0, 1], not {fraction}", param="fraction")
    if seed < 0:
        raise TensortuneError(f"must not be negative, not {seed}", param="seed")
    with about("selector"):
        make_selector(selector)
    with about("acquisition"):
        new_model(acquisition, seed, params)
    source = dataset_path(dataset)
    if Path(out).resolve() == source.resolve():
        raise TensortuneError("the selection would overwrite its own dataset: give another "
                              "directory", param="out")  # fmt: skip
    check_out_dir(out, overwrite=overwrite)  # before the selection, not after
    columns, card = dataset_columns(dataset)
    if held_out is None:
        held_out = tuple(card.get("held_out") or [])
    elif isinstance(held_out, str):  # "a,b" as the command line takes it, not its letters
        held_out = tuple(n for n in held_out.split(",") if n)
    else:
        held_out = tuple(held_out)
    # A network the source was already held out from (a selection's card names them) has no
    # tasks left to remove: holding it out again is what the card's default asks.
    gone = set(card.get("held_out") or [])
    unknown = [n for n in held_out if n not in card["networks"] and n not in gone]
    if unknown:
        raise TensortuneError(f"{unknown[0]} is not a network of {card.get('name')}; it has: "
                              f"{', '.join(card['networks'])}", param="held_out")  # fmt: skip
    rows, hardware = pool_mask(columns, held_out, hardware)
    pool = pool_from_programs(ProgramSet.from_columns(columns, rows))
    sizes = study_sizes([*(f for f in steps if f < fraction), fraction], len(pool))
    picked = np.arange(len(pool)) if fraction == 1 else grow(
        selector, pool, sizes, seed=seed,
        acquisition=lambda: new_model(acquisition, seed, params))  # fmt: skip
    chosen = np.sort(rows[picked])
    provenance = {"selection": {"source": card.get("name"), "selector": selector,
                                "fraction": fraction, "seed": seed, "hardware": hardware,
                                "held_out": list(held_out), "acquisition": acquisition,
                                "acquisition_params": dict(params or {}),
                                "programs": len(chosen), "of": len(pool)}}  # fmt: skip
    note = (f"{len(chosen)} of the {len(pool)} programs of {card.get('name')} on {hardware}"
            f"{' less the tasks of ' + ', '.join(held_out) if held_out else ''}, chosen by "
            f"`tensortune dataset select --selector {selector} --fraction {fraction:g} "
            f"--seed {seed}`; labels are against the best program kept of each task.")  # fmt: skip
    # The networks this selection held out, not the source's: the picks may hold those.
    return write_subset(source, chosen, out, description=note,
                        extra={"held_out": list(held_out), **provenance},
                        overwrite=overwrite).data  # fmt: skip
