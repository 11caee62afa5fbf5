"""The issue's short-call goals against torch SDPA by process time, for a machine shared with other work.

    PYTHONPATH=src python benchmarks/short_calls.py [256c 256f 1024c 1024f 2048c 2048f batch decode]
        [--cores 1] [--rounds 21] [--clock cpu|wall]

``attnlab bench`` times wall clock on every core, which a loaded machine makes meaningless (its BLAS
contention probe then reads 20x). Here both sides run on ``--cores`` cores (1 by default: no thread waits on
another) and each call is timed by the process's CPU time (``--clock cpu``), alternating attnlab and torch,
the ratio the median of the per-round ratios with its interquartile range. Cases: ``Nc``/``Nf`` the front door
at N tokens causal/full (12 heads, d_head 64, float32), ``batch`` 32 × 128 tokens not causal, ``decode`` one
step against a 1024-token KV cache (views of a 2048-slot buffer, as generation runs it). The fused kernels
are loaded first (``ATTNLAB_NO_NUMBA=1`` keeps numpy). Prints CPU, SIMD, BLAS first.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from attnlab import attention  # noqa: E402
from attnlab.cli import bench_harness as bench  # noqa: E402
from attnlab.kernels import _kernels  # noqa: E402
from attnlab.layer.cache import KVCache  # noqa: E402


def paired(a, b, rounds: int, clock) -> tuple[float, float, float, float, float]:
    """a against b alternating: median ms of each, median ratio a/b, and the ratios' quartiles."""
    a(), b()
    ta, tb = [], []
    for r in range(rounds):
        for f, t in ((a, ta), (b, tb)) if r % 2 == 0 else ((b, tb), (a, ta)):
            t0 = clock()
            f()
            t.append(clock() - t0)
    ratios = np.array(ta) / np.array(tb)
    return (1e3 * float(np.median(ta)), 1e3 * float(np.median(tb)), float(np.median(ratios)),
            float(np.percentile(ratios, 25)), float(np.percentile(ratios, 75)))


def case(name: str, torch, rng):
    """(label, attnlab's call, torch's call, rounds factor) for one case name."""
    f = torch.nn.functional.scaled_dot_product_attention
    if name == "batch":
        q, k, v = (rng.standard_normal((32, 12, 128, 64), dtype=np.float32) for _ in range(3))
        tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
        return "batch 32 x 128", lambda: attention(q, k, v), lambda: f(tq, tk, tv), 1
    if name == "decode":
        q = rng.standard_normal((1, 12, 1, 64), dtype=np.float32)                        # (B, h, 1, d_head)
        k, v = (rng.standard_normal((1, 12, 1024, 64), dtype=np.float32) for _ in range(2))
        keys, values = KVCache.empty(12, 2048, 64, batch_shape=(1,)).append(k, v)        # views, as generation
        tq, tk, tv = (torch.from_numpy(x) for x in (q, keys, values))
        return ("decode, context 1024", lambda: attention(q, keys, values, is_causal=True, check_finite=False),
                lambda: f(tq, tk, tv), 20)
    n, causal = int(name[:-1]), name.endswith("c")
    q, k, v = (rng.standard_normal((1, 12, n, 64), dtype=np.float32) for _ in range(3))
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    return (f"n={n} {'causal' if causal else 'full'}", lambda: attention(q, k, v, is_causal=causal),
            lambda: f(tq, tk, tv, is_causal=causal), 1)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cases", nargs="*", default=["256c", "256f", "1024c", "1024f", "2048c", "2048f", "batch",
                                                 "decode"])
    p.add_argument("--cores", type=int, default=1)
    p.add_argument("--rounds", type=int, default=21)
    p.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    args = p.parse_args(argv)
    import torch
    if not _kernels.numba_disabled() and hasattr(_kernels, "load_fused"):
        _kernels.load_fused()
    info = bench.machine_info(torch)
    print(f"cpu {info['cpu']} | simd {info['simd']} | blas {bench.blas_kernel(info['blas'])} | numba {info['numba']}"
          f" | {args.cores} core(s), {args.clock} time, {args.rounds} rounds")
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    rng = np.random.default_rng(0)
    with bench.on_cores(args.cores, torch):
        for name in args.cases:
            label, ours, theirs, more = case(name, torch, rng)
            a, b, ratio, q1, q3 = paired(ours, theirs, args.rounds * more, clock)
            print(f"{label:22} attnlab {a:8.3f} ms  torch {b:8.3f} ms  ratio {ratio:.2f} (IQR {q1:.2f}-{q3:.2f})",
                  flush=True)


if __name__ == "__main__":
    main()
