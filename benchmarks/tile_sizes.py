"""Tile shapes of the tiled forward, measured against each other in one process.

    PYTHONPATH=src python benchmarks/tile_sizes.py [--sizes 256 1024 8192] [--dtypes float32 float64]
        [--rows 64 128] [--blocks 512x512 1024x1024] [--rounds 15] [--workers 2] [--full]

12 heads of d_head 64 (GPT-2 small), causal (and not causal with --full). Each candidate — a height of
the causal diagonal's row strips (``attnlab.kernels.tiled.DIAGONAL_ROWS``, --rows) or a tile shape
(block_q × block_k, --blocks) — is run once per round in turn; the figure is the median over rounds of
its time over the first candidate's in the same round (below 1: faster). Prints CPU, SIMD, BLAS first.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from attnlab.cli import bench_harness as bench
from attnlab.kernels import tiled  # noqa: E402
from attnlab.kernels.tiled import tiled_attention  # noqa: E402

N_HEADS, D_HEAD = 12, 64


def candidates(args) -> list[tuple[str, int, tuple[int, int]]]:
    """(label, strip rows, (block_q, block_k)): every --rows at the first --blocks, then the other blocks."""
    blocks = [tuple(int(x) for x in b.split("x")) for b in args.blocks]
    out = [(f"rows {r}", r, blocks[0]) for r in args.rows]
    out += [(f"{b[0]}x{b[1]}", args.rows[0], b) for b in blocks[1:]]
    return out


def one_size(n: int, dtype: str, is_causal: bool, cands, *, rounds: int, workers: int, rng) -> dict:
    """Median per-round time ratio of each candidate against the first, and the first's median time."""
    q, k, v = (rng.standard_normal((1, N_HEADS, n, D_HEAD)).astype(dtype) for _ in range(3))  # (1, h, n, d_head)

    def run(rows, blocks):
        tiled.DIAGONAL_ROWS = rows
        return tiled_attention(q, k, v, is_causal=is_causal, block_q=blocks[0], block_k=blocks[1],
                               check_finite=False, workers=workers)

    for _, rows, blocks in cands:                   # warm up (numba compile, pool, caches)
        run(rows, blocks)
    times = np.empty((rounds, len(cands)))
    for r in range(rounds):
        for i, (_, rows, blocks) in enumerate(cands):
            t0 = time.perf_counter()
            run(rows, blocks)
            times[r, i] = time.perf_counter() - t0
    ratios = np.median(times / times[:, :1], axis=0)
    return {"ms": 1e3 * float(np.median(times[:, 0])), "ratios": ratios.tolist()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    p.add_argument("--rows", type=int, nargs="+", default=[64, 128])
    p.add_argument("--blocks", nargs="+", default=["512x512"])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--full", action="store_true", help="also not causal")
    args = p.parse_args(argv)
    info = bench.machine_info()
    print(f"cpu {info['cpu']} | simd {info['simd']} | cores {info['cores']} | blas {bench.blas_kernel(info['blas'])}"
          f" | numba {info['numba']} | tile kernel {info['tile_kernel']}")
    cands = candidates(args)
    old = tiled.DIAGONAL_ROWS
    rng = np.random.default_rng(0)
    try:
        for dtype in args.dtypes:
            for is_causal in (True, False) if args.full else (True,):
                for n in args.sizes:
                    rounds = args.rounds if n <= 2048 else max(5, args.rounds // (n // 2048))
                    res = one_size(n, dtype, is_causal, cands, rounds=rounds, workers=args.workers, rng=rng)
                    cells = "  ".join(f"{label}: {x:.3f}" for (label, _, _), x in zip(cands[1:], res["ratios"][1:]))
                    print(f"{dtype} n={n:5d} {'causal' if is_causal else 'full  '} {cands[0][0]} {res['ms']:8.2f} ms"
                          f"  {cells}  ({rounds} rounds)", flush=True)
    finally:
        tiled.DIAGONAL_ROWS = old


if __name__ == "__main__":
    main()
