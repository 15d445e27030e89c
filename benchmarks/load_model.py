"""What importing a zoo network costs: ``load_model`` with the weights folded in NumPy (the
default) against relax's ``FoldConstant`` alone, which compiles each folded call with LLVM.

For each network, in alternating order, ``--repeats`` loads of each way in one process (the
PyTorch export and TVM's import included; the first load of each network is a warm-up and not
counted).  Reports median seconds, their ratio, and whether both ways gave structurally equal
modules (same graph, bit-identical weights).

Run:  .venv/bin/python benchmarks/load_model.py [--networks resnet18,mobilenetv2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

NETWORKS = ("resnet18", "resnet50", "mobilenetv2", "bert-layer", "vit-tiny")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--networks", default=",".join(NETWORKS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from tensortune.compat import structural_equal, tvm
    from tensortune.hardware import resolve_platform
    from tensortune.workloads import inference
    from tensortune.workloads.models import load_model

    platform = resolve_platform(None)
    target = platform.tvm_target
    ours = inference.fold_constants
    ways = {"numpy": ours, "FoldConstant": tvm.relax.transform.FoldConstant}
    rows = []
    for net in args.networks.split(","):
        load_model(net, target=target)  # warm-up: first imports, the zoo's module built once
        seconds: dict[str, list[float]] = {w: [] for w in ways}
        mods = {}
        for _ in range(args.repeats):
            for way, make in ways.items():
                inference.fold_constants = make
                start = time.perf_counter()
                mods[way] = load_model(net, target=target).mod
                seconds[way].append(time.perf_counter() - start)
        inference.fold_constants = ours
        med = {w: statistics.median(s) for w, s in seconds.items()}
        rows.append({"network": net, **{f"{w}_s": round(m, 2) for w, m in med.items()},
                     "speedup": round(med["FoldConstant"] / med["numpy"], 2),
                     "equal": structural_equal(mods["numpy"], mods["FoldConstant"])})  # fmt: skip
    print(f"load_model on {platform.hardware.cpu_model} ({target}), median of {args.repeats} "
          "loads each, alternating, after one warm-up load")  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'network':14s} {'NumPy fold':>11s} {'FoldConstant':>13s} {'speedup':>8s}  same module")
    for r in rows:
        print(f"{r['network']:14s} {r['numpy_s']:10.2f}s {r['FoldConstant_s']:12.2f}s "
              f"{r['speedup']:7.2f}x  {r['equal']}")  # fmt: skip


if __name__ == "__main__":
    main()
