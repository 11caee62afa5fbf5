"""Causal attention at n = 65,536 (12 heads, d_head 64, float32) on the tiled path: time and peak memory.

The naive grid would need 12 · 65,536² · 4 bytes = 192 GiB; the tiled kernel holds O(n · block) per worker.
Same as ``attnlab bench --scale``. Run: PYTHONPATH=src python benchmarks/bench_scale.py [n]
"""

import json
import sys

from attnlab.cli.bench_harness import SCALE_N, blas_info, run_scale

if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else SCALE_N
    print(json.dumps({**run_scale(n), "blas": blas_info()}, indent=2))
