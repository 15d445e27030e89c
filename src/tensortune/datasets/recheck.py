"""``tensortune dataset recheck``: find a dataset's untrustworthy timings, re-measure or drop them.

Two signs that a row's cost is not the program's:

- ``tick``: every timing repeat is a whole number of kernel scheduler ticks (1, 4 or 10 ms:
  ``HZ`` = 1000, 250, 100), to within ``TICK_TOLERANCE`` of a tick, on a hardware where that
  happens far more often than by chance.  A kernel whose threads must all run for every call
  waits a tick per call when another process holds one of its cores (``benchmarks/RESULTS.md``:
  47 of 250 re-measured ``avx512-2c`` rows of ttset-cpu-v2 were over 2x slow, their stored
  times near multiples of 4 ms).  A clean kernel's repeats agree closely, so they land on a
  multiple together by chance: in ttset-cpu-v2, 0.1-0.8% of the rows at least a tick long on
  the two unaffected hardware, against 18% of ``avx512-2c``'s rows at the 4 ms tick.  So a
  tick counts on a hardware only where more than ``TICK_EXCESS`` of its rows that long sit on
  its multiples.
- ``spread``: the repeats disagree by more than ``SPREAD`` times: the machine changed while
  the row was timed.

A suspect measured on this machine (same hardware fingerprint) is rebuilt from its trace and
timed again with the runner's contention guard (``measure/contention.py``), in the row's own
target and thread count; the new timing replaces the old one when the guard found the CPU
free and it shows neither sign itself.  Every other suspect is dropped (a cost that cannot be
trusted teaches the model a wrong ranking; a missing one teaches nothing).  Labels are
recomputed per task and hardware and the card says what changed, per hardware and reason.

Re-measuring takes minutes, so each batch's outcome goes to a journal in the output directory
(``JOURNAL``, JSON lines naming the source table's checksum) before the next batch starts: a
killed recheck run again re-measures only the rows the journal lacks, and the journal goes once
the dataset is written.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from tensortune.errors import TensortuneError, check_flags

TICKS = (10e-3, 4e-3, 1e-3)  # longest first: a multiple of 4 ms is one of 1 ms too
TICK_TOLERANCE = 0.01  # of a tick
TICK_EXCESS = 0.03  # four times the highest chance rate seen
SPREAD = 2.0
BATCH = 32
JOURNAL = ".recheck-journal.jsonl"

Progress = Callable[[str], None]


def on_ticks(run_secs: Sequence[float], tick: float) -> bool:
    """Whether every repeat is a whole number (at least one) of ``tick``s."""
    ticks = np.asarray(run_secs, dtype=float) / tick
    whole = np.abs(ticks - np.round(ticks)) <= TICK_TOLERANCE
    return bool(len(ticks)) and bool(((ticks >= 1 - TICK_TOLERANCE) & whole).all())


def spread(run_secs: Sequence[float]) -> bool:
    """Whether the repeats lie more than ``SPREAD`` times apart."""
    secs = np.asarray(run_secs, dtype=float)
    return len(secs) > 1 and secs.min() > 0 and secs.max() / secs.min() > SPREAD


def inflated_ticks(run_secs: Sequence[Sequence[float]]) -> list[float]:
    """The ticks that one hardware's timings sit on far more often than by chance."""
    out = []
    for tick in TICKS:
        long = [s for s in run_secs if min(s) >= tick * (1 - TICK_TOLERANCE)]
        hits = sum(on_ticks(s, tick) for s in long)
        if hits >= 5 and hits > TICK_EXCESS * len(long):
            out.append(tick)
    return out


def find_suspects(columns: dict) -> dict[int, str]:
    """Row index -> reason (``tick`` or ``spread``), for every suspect successful row of a
    dataset's columns."""
    rows_of: dict[str, list[int]] = defaultdict(list)
    for i, (secs, cost) in enumerate(zip(columns["run_secs"], columns["cost"], strict=True)):
        if cost is not None and secs:
            rows_of[columns["hardware"][i]].append(i)
    out = {}
    for rows in rows_of.values():
        ticks = inflated_ticks([columns["run_secs"][i] for i in rows])
        for i in rows:
            secs = columns["run_secs"][i]
            if any(on_ticks(secs, t) for t in ticks):
                out[i] = "tick"
            elif spread(secs):
                out[i] = "spread"
    return out


def _trustworthy(secs: Sequence[float]) -> bool:
    """A re-measurement is kept when it shows neither sign (any tick: one timing is too few
    to judge a rate by)."""
    return bool(secs) and not spread(secs) and not any(on_ticks(secs, t) for t in TICKS)


def recheck_dataset(
    dataset: str | Path,
    out: str | Path,
    *,
    remeasure: bool = True,
    progress: Progress | None = None,
    overwrite: bool = False,
) -> dict:
    """Write ``dataset`` with its suspect rows re-measured (where they were measured on this
    machine and ``remeasure``) or dropped to ``out`` (a dataset there is replaced only with
    ``overwrite``); returns the report the card keeps."""
    from tensortune.datasets.build import check_out_dir, load_table, read_card
    from tensortune.datasets.shipped import dataset_path
    from tensortune.datasets.subset import write_subset
    from tensortune.errors import about

    check_flags(remeasure=remeasure, overwrite=overwrite)
    tell = progress or (lambda _: None)
    source = dataset_path(dataset)
    if Path(out).resolve() == source.resolve():
        raise TensortuneError("recheck would overwrite its own dataset: give another directory",
                              param="out")  # fmt: skip
    check_out_dir(out, overwrite=overwrite)  # before the minutes of re-measuring, not after
    with about("dataset"):
        found = read_card(source)
        card = found.data
        # The columns recheck reads: the features and tokens would take ~70 KB a row as Python
        # objects (write_subset copies the whole table on its own).
        columns = load_table(source, ["program_id", "task_id", "hardware", "target",
                                      "run_secs", "cost", "trace"]).to_pydict()  # fmt: skip
    suspects = find_suspects(columns)
    tell(f"{len(suspects)} suspect rows of {len(columns['cost'])}")
    here = _rows_measured_here(columns, suspects, card) if remeasure else []
    journal = _Journal(Path(out) / JOURNAL, found.table_sha256 or "")
    if here and journal.done:
        tell(f"resuming: {len(journal.done)} rows re-measured by an earlier run")
    retimed = _remeasure(source, columns, here, tell, journal) if here else {}
    dropped = sorted(set(suspects) - set(retimed))
    keep = np.setdiff1d(np.arange(len(columns["cost"])), dropped)
    report = _report(columns, suspects, retimed, card.get("name"))
    tell(f"re-measured {len(retimed)}, dropped {len(dropped)}")
    note = (f"{card.get('name')} after `tensortune dataset recheck`: {len(suspects)} suspect "
            f"rows (timings on whole scheduler ticks, or repeats more than {SPREAD:g}x apart), "
            f"{len(retimed)} re-measured on the same hardware, {len(dropped)} dropped; labels "
            "are against the best program kept of each task.")  # fmt: skip
    previous = card.get("recheck")
    extra = {"recheck": [*(previous if isinstance(previous, list) else []), report]}
    write_subset(source, keep, out, description=f"{card.get('description', '')} {note}".strip(),
                 extra=extra, costs=retimed, overwrite=overwrite)  # fmt: skip
    journal.path.unlink(missing_ok=True)
    return report


class _Journal:
    """Outcomes of rows re-measured so far (program id -> trustworthy repeats, or None where
    the new timing was not), kept in ``path`` for the source table with checksum ``table``.
    A journal of another table, or one that does not parse (it is this module's scratch, not
    a user's data), is started afresh."""

    def __init__(self, path: Path, table: str) -> None:
        self.path, self.table = path, table
        self.done: dict[int, list[float] | None] = {}
        try:
            lines = path.read_text().splitlines()
            ours = bool(lines) and json.loads(lines[0]) == {"table": table}
        except (OSError, ValueError):
            return
        for line in lines[1:] if ours else []:
            try:  # a line a kill cut short is skipped: its row is measured again
                entry = json.loads(line)
                secs = entry["secs"]
                self.done[int(entry["program_id"])] = (None if secs is None
                                                       else [float(x) for x in secs])  # fmt: skip
            except (ValueError, KeyError, TypeError):
                continue

    def add(self, outcomes: dict[int, list[float] | None]) -> None:
        new = not self.path.exists() or not self.done
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("w" if new else "a") as f:
            if new:
                f.write(json.dumps({"table": self.table}) + "\n")
            for pid, secs in outcomes.items():
                f.write(json.dumps({"program_id": pid, "secs": secs}) + "\n")
            f.flush()
        self.done.update(outcomes)


def _rows_measured_here(columns: dict, rows: dict[int, str], card: dict) -> list[int]:
    from tensortune.hardware import current_hardware

    mine = current_hardware().to_json()
    fingerprints = {name: json.dumps(h.get("fingerprint"), sort_keys=True)
                    for name, h in (card.get("hardware") or {}).items()}  # fmt: skip
    return [i for i in rows if fingerprints.get(columns["hardware"][i]) == mine]


def _remeasure(source: Path, columns: dict, rows: list[int], tell: Progress,
               journal: _Journal) -> dict[int, list[float]]:  # fmt: skip
    """New timing repeats of ``rows`` that show no sign of contention themselves (those the
    journal holds are not measured again)."""
    from tensortune.datasets.build import load_workloads
    from tensortune.errors import last_line
    from tensortune.hardware import resolve_platform
    from tensortune.measure.batch import measure_batch
    from tensortune.measure.builder import PersistentBuilder
    from tensortune.measure.runner import PersistentRunner, TimingConfig
    from tensortune.records.convert import candidate_from_trace

    modules = load_workloads(source)
    pids = columns["program_id"]
    out: dict[int, list[float]] = {}
    by_target: dict[str, list[int]] = defaultdict(list)
    for i in rows:
        if pids[i] in journal.done:
            if journal.done[pids[i]] is not None:
                out[i] = journal.done[pids[i]]
        else:
            by_target[columns["target"][i]].append(i)
    for target, picked in by_target.items():
        platform = resolve_platform(json.loads(target))
        builder = PersistentBuilder()
        runner = PersistentRunner(TimingConfig(repeat=3), num_threads=platform.threads)
        try:
            for start in range(0, len(picked), BATCH):
                chunk, cands = [], []
                for i in picked[start : start + BATCH]:
                    try:
                        mod = modules[int(columns["task_id"][i])]
                        cands.append(candidate_from_trace(mod, columns["trace"][i]))
                        chunk.append(i)
                    except Exception as e:  # a trace that no longer replays: dropped
                        tell(f"row {i}: cannot replay its trace ({last_line(e)})")
                if not chunk:
                    continue
                built, ran = measure_batch(builder, runner, cands, platform)
                contended = iter(runner.last_contended)  # one per candidate that built
                outcomes: dict[int, list[float] | None] = {}
                for i, b, r in zip(chunk, built, ran, strict=True):
                    outcomes[pids[i]] = None
                    if b.error_msg is not None or next(contended):
                        continue  # a timing the guard could not get clean is no repair
                    secs = [float(s) for s in r.run_secs or []]
                    if _trustworthy(secs):
                        out[i] = outcomes[pids[i]] = secs
                journal.add(outcomes)
                tell(f"{target}: re-measured {min(start + BATCH, len(picked))} of "
                     f"{len(picked)}")  # fmt: skip
        finally:
            builder.close()
            runner.close()
    return out


def _report(columns: dict, suspects: dict[int, str], retimed: dict[int, list[float]],
            name: str | None) -> dict:  # fmt: skip
    per_hw: dict[str, Counter] = defaultdict(Counter)
    ratios: dict[str, list[float]] = defaultdict(list)
    for i, reason in suspects.items():
        hw = columns["hardware"][i]
        per_hw[hw][reason] += 1
        if i in retimed:
            per_hw[hw]["remeasured"] += 1
            ratios[hw].append(columns["cost"][i] / statistics.median(retimed[i]))
        else:
            per_hw[hw]["dropped"] += 1
    return {"source": name, "ticks_s": list(TICKS), "tick_tolerance": TICK_TOLERANCE,
            "spread": SPREAD, "rows": len(columns["cost"]),
            "hardware": {hw: {**{k: c.get(k, 0) for k in ("tick", "spread", "remeasured",
                                                          "dropped")},
                              "median_old_over_new": (statistics.median(ratios[hw])
                                                      if ratios[hw] else None)}
                         for hw, c in sorted(per_hw.items())}}  # fmt: skip
