"""What the first attention call in a fresh process costs, in memory and time, and where it goes.

    PYTHONPATH=src python benchmarks/first_call.py [--n 1024] [--heads 12]

Each figure comes from a fresh interpreter (a subprocess), so nothing is loaded yet:
1. numba's own costs, apart: ``import numba``; importing ``attnlab.kernels._fused``; the first call of its tile
   kernel when numba has to compile it (an empty ``NUMBA_CACHE_DIR``) and when it loads the machine code from
   that cache (a second process on the same directory); then the first call of a second kernel.
2. ``attention`` (12 heads, d_head 64, causal, float32) called twice: the first call against the second, as it
   runs by default (numba loads only for calls of at least ``FUSED_MIN_SCORES`` scores, a size rule:
   :mod:`attnlab.kernels._kernels`), with ``ATTNLAB_NO_NUMBA=1``, and with the fused kernels loaded first.
Memory is the resident set (/proc/self/statm) and tracemalloc's count of Python and numpy allocations.
Prints the CPU and SIMD level first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

PROBE = r'''
import json, sys, time, tracemalloc
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20
steps = []
def step(name, f):
    r0, t0 = rss(), time.perf_counter()
    a0 = tracemalloc.get_traced_memory()[0]
    out = f()
    steps.append({"step": name, "ms": 1e3 * (time.perf_counter() - t0), "rss_mib": rss() - r0,
                  "traced_mib": (tracemalloc.get_traced_memory()[0] - a0) / 2**20})
    return out
tracemalloc.start()
import numpy as np
mode, n, heads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if mode == "numba":
    step("import numba", lambda: __import__("numba"))
    step("import attnlab.kernels._fused", lambda: __import__("attnlab.kernels._fused"))
    from attnlab.kernels import _fused
    s = np.zeros((8, 16), np.float32); m = np.full(8, -np.inf, np.float32); z = np.zeros(8, np.float32)
    acc = np.zeros((8, 4), np.float32)
    step("first tile_softmax call", lambda: _fused.tile_softmax(s, m, z.copy(), z.copy(), acc, 99, -99, True, True))
    q = np.ones((1, 1, 1, 4), np.float32); k = np.ones((1, 1, 3, 4), np.float32)
    step("then the first decode_tiles call", lambda: _fused.decode_tiles(q, k, k, np.float32(1), q.copy(),
                                                                        np.float32(0), _fused.DECODE_TILE))
else:
    from attnlab import attention
    from attnlab.kernels import _kernels
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, heads, n, 64), dtype=np.float32) for _ in range(3))
    if mode == "fused first":
        step("load the fused kernels", _kernels.load_fused)
    for i in (1, 2, 3):
        step(f"call {i}", lambda: attention(q, k, v, is_causal=True))
    steps.append({"step": "kernel", "kernel": _kernels.kernel_in_use()})
print(json.dumps(steps))
'''


def probe(mode: str, n: int, heads: int, env: dict | None = None) -> list[dict]:
    run = subprocess.run([sys.executable, "-c", PROBE, mode, str(n), str(heads)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(SRC), **(env or {})}, check=True)
    return json.loads(run.stdout)


def show(title: str, steps: list[dict]) -> None:
    print(title)
    for s in steps:
        if "kernel" in s:
            print(f"  {'tile kernel after the calls':34} {s['kernel']}")
        else:
            print(f"  {s['step']:34} {s['ms']:8.1f} ms   RSS +{s['rss_mib']:6.1f} MiB   "
                  f"tracemalloc +{s['traced_mib']:6.1f} MiB")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--heads", type=int, default=12)
    args = p.parse_args(argv)
    from attnlab.cli import bench_harness as bench
    info = bench.machine_info()
    print(f"cpu {info['cpu']} | simd {info['simd']} | blas {bench.blas_kernel(info['blas'])} | numba {info['numba']}")
    with tempfile.TemporaryDirectory() as cache:
        show("numba, compiling (an empty cache):", probe("numba", args.n, args.heads, {"NUMBA_CACHE_DIR": cache}))
        show("numba, loading that cache:", probe("numba", args.n, args.heads, {"NUMBA_CACHE_DIR": cache}))
    shape = f"{args.heads} heads × {args.n} tokens, causal"
    show(f"attention, {shape}, by default:", probe("default", args.n, args.heads))
    show(f"attention, {shape}, ATTNLAB_NO_NUMBA=1:", probe("default", args.n, args.heads, {"ATTNLAB_NO_NUMBA": "1"}))
    show(f"attention, {shape}, the fused kernels loaded first:", probe("fused first", args.n, args.heads))


if __name__ == "__main__":
    main()
