"""The issue-11 goal table on this machine: attnlab against torch SDPA, each pair alone, with the SIMD level.

    PYTHONPATH=src python benchmarks/fast_vs_torch.py [--quick] [--sizes N ...] [--cores N]
                                                      [--kernels fused numpy] [--json FILE]

Runs ``attnlab bench`` (:func:`attnlab.cli.bench_harness.run_bench`) once per tile kernel asked for: "fused" (numba) and
"numpy" (the same process with ATTNLAB_NO_NUMBA=1), then prints each table and the goals. Every ratio is
the median of per-round ratios attnlab / torch, the pair alternating alone; min-max beside it.
"""

from __future__ import annotations

import argparse
import json
import os

from attnlab.cli import bench_harness as bench
from attnlab.kernels._kernels import NO_NUMBA_ENV
from attnlab.cli.bench import print_goals, print_table


def main() -> None:
    ap = argparse.ArgumentParser(allow_abbrev=False)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--sizes", type=int, nargs="+", help="the forward rows' n (as attnlab bench --sizes)")
    ap.add_argument("--cores", type=int, help="both sides on the same N cores (as attnlab bench --cores)")
    ap.add_argument("--kernels", nargs="+", default=["fused", "numpy"], choices=["fused", "numpy"])
    ap.add_argument("--json", help="also write every result to this file")
    args = ap.parse_args()
    results = {}
    for kernel in args.kernels:
        os.environ[NO_NUMBA_ENV] = "1" if kernel == "numpy" else "0"
        print(f"=== tile kernel: {kernel} ===")
        r = bench.run_bench(quick=args.quick, progress=lambda step: print(f"  ... {step}", flush=True),
                            cores=args.cores, sizes=args.sizes)
        print_table(r)
        print_goals(r)
        print()
        results[kernel] = r
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
