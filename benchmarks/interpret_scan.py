"""Throughput of `attnlab scan` on MiniLM: a Dask LocalCluster of worker processes against one process.

    PYTHONPATH=src python benchmarks/interpret_scan.py [--lines 120] [--workers 2] [--rounds 3] [--json]

The corpus is the guide's text cut into sentences (the first --lines of them). Each round runs the scan both
ways, alternating which goes first; the cluster is started once, outside the timing, and each worker loads
MiniLM on its first chunk (a warm-up round is not counted). Reports sentences per second for each, the median
of the per-round ratios cluster / single, that both give the same averages, the load average (other processes
on the machine share its cores), and the CPU, SIMD level and BLAS (threadpoolctl).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path

import numpy as np

from attnlab.cli.bench_harness import blas_kernel, load_average, machine_info
from attnlab.interpret.scan import STATS, scan_cluster, scan_corpus

GUIDE = Path("/work/shared/guide/attention-guide.txt")


def sentences(n: int) -> list[str]:
    if GUIDE.is_file():
        text = GUIDE.read_text(encoding="utf-8")
    else:
        from attnlab.guide.toy import TOY_TEXT
        text = TOY_TEXT * 50
    parts = [s.strip() for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if len(s.split()) >= 3]
    return (parts * (n // max(len(parts), 1) + 1))[:n]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=120)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    lines = sentences(a.lines)
    cluster, client = scan_cluster(a.workers)
    try:
        scan_corpus("minilm", lines[:a.workers * a.chunk], client=client, chunk_size=a.chunk)   # load on workers
        scan_corpus("minilm", lines[:a.chunk], chunk_size=a.chunk)                           # and here
        single, spread, ratios = [], [], []
        for r in range(a.rounds):
            order = ("single", "cluster") if r % 2 == 0 else ("cluster", "single")
            t = {}
            for which in order:
                t0 = time.perf_counter()
                out = scan_corpus("minilm", lines, chunk_size=a.chunk, client=client if which == "cluster" else None)
                t[which] = time.perf_counter() - t0
                t[which + "_sums"] = out
            single.append(t["single"])
            spread.append(t["cluster"])
            ratios.append(t["cluster"] / t["single"])
            same = max(float(np.abs(t["cluster_sums"].means()[k] - t["single_sums"].means()[k]).max()) for k in STATS)
    finally:
        client.close()
        cluster.close()
    m = machine_info()
    result = {"lines": len(lines), "workers": a.workers, "rounds": a.rounds, "chunk": a.chunk,
              "single_lines_per_s": len(lines) / statistics.median(single),
              "cluster_lines_per_s": len(lines) / statistics.median(spread),
              "time_ratio_cluster_over_single": statistics.median(ratios), "ratios": ratios,
              "max_abs_difference_of_averages": same, "load_average": load_average(),
              "cpu": m["cpu"], "cores": m["cores"], "simd": m["simd"], "blas": blas_kernel(m["blas"])}
    if a.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{m['cpu']}, {m['cores']} cores, {m['simd']}, BLAS {result['blas']}")
    print(f"scan of {len(lines)} sentences with MiniLM: one process {result['single_lines_per_s']:.1f} sentences/s, "
          f"LocalCluster of {a.workers} workers {result['cluster_lines_per_s']:.1f} sentences/s; time ratio "
          f"cluster / single {result['time_ratio_cluster_over_single']:.2f} (median of {a.rounds} rounds, "
          f"{', '.join(f'{x:.2f}' for x in ratios)})")
    print(f"same averages: largest difference {same:.1e}; load average after the run {result['load_average']}")


if __name__ == "__main__":
    main()
