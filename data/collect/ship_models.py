"""Refit the shipped cost models on the default dataset and rewrite their card.

Maintainers run this after the default dataset changes (``python data/collect/ship_models.py``:
3 minutes on a 2-core Zen 5 at v5, 10 on a 2-core Xeon at v6).  Each shipped file is a ``pacm``
model fitted on the rows of the hardware configurations its name lists; the rows of every other
configuration are its test split, so its card entry says how well it ranks programs on
configurations it was not trained on (some measured on a machine it was trained on in another
configuration: ``by-hardware`` holds out names, not machines).  The card keeps each file's
sha256, which ``costmodel/shipped.py`` checks before loading it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tensortune.costmodel.shipped import CARD, SHIPPED_DIR
from tensortune.datasets.build import file_sha256, read_card
from tensortune.datasets.shipped import DATASET_DIR
from tensortune.train.metrics import RANK_METRICS
from tensortune.train.trainer import train

# One file per set of configurations: each configuration alone that tune serves by default,
# and the widest set MoA adapts to the remaining one.
SHIPPED = (("avx512-2c",), ("avx2-1c",), ("avx2-1c", "avx512-1c"))
KIND = "pacm"  # the best ranker of the cost-model benchmark (README, "Learned cost models")
SETTINGS: dict[str, object] = {}  # the shipped models' settings other than the defaults


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, default=DATASET_DIR)
    parser.add_argument("--out", type=Path, default=SHIPPED_DIR)
    args = parser.parse_args()
    card = read_card(args.dataset).data
    hardware = sorted(card["hardware"])  # "config@fingerprint"
    files = {}
    for configs in SHIPPED:
        held = [h for h in hardware if h.split("@")[0] not in configs]
        split = "by-hardware:" + ",".join(held)
        path = args.out / f"{'+'.join(configs)}.ttm"
        result = train(args.dataset, cost_model=KIND, split=split, out=path, params=SETTINGS)
        test = {k: round(float(result.metrics[k]), 4) for k in RANK_METRICS}
        files[path.name] = {
            "sha256": file_sha256(path),
            "bytes": path.stat().st_size,
            "kind": KIND,
            "configurations": list(configs),
            "trained_on": {"dataset": card["name"], "split": split,
                           "train_programs": result.train_programs,
                           "test": {**test, "programs": result.test_programs}},
        }  # fmt: skip
        print(f"{path.name}: {result.train_programs} programs; on held-out hardware {test}")
    out_card = args.out / CARD.name
    kept = json.loads(out_card.read_text()) if out_card.is_file() else {}  # name, description
    kept["files"] = dict(sorted(files.items()))
    out_card.write_text(json.dumps(kept, indent=1) + "\n")


if __name__ == "__main__":
    main()
