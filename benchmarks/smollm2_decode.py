"""Decode ms/token of a random float32 model of SmolLM2-135M's sizes, against the float32 bound (issue 21).

    PYTHONPATH=src python benchmarks/smollm2_decode.py [--rounds 15] [--heads 9 --kv-heads 3] [--layers 30] [--cores N]

The bound is the weights' bytes divided by numpy's matrix-vector streaming rate, measured in the same
process, alternating with the decode step (attnlab.cli.bench_model.decode_row); the goal is <= 1.3x. Also
prints cProfile's count of numpy/numba calls per layer in one step (run it with other --heads to see that the
count does not depend on the head count).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from attnlab.cli import bench_harness as bench
from attnlab.cli.bench_model import decode_row, smollm2_shaped


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--cores", type=int, default=None, help="pin to this many cores, BLAS threads as many")
    args = ap.parse_args()
    info = bench.machine_info()
    print(f"{info['cpu']}, {info['simd']}, BLAS {bench.blas_kernel(info['blas'])}, numba {info['numba']} "
          f"(disabled: {info['numba_disabled']}), load average {bench.load_average()}")
    model = smollm2_shaped(rng=np.random.default_rng(0), n_layers=args.layers, n_heads=args.heads,
                           n_kv_heads=args.kv_heads)
    with bench.on_cores(args.cores):
        r = decode_row(model, rounds=args.rounds, context=args.context)
    print(f"decode float32: {r['ms_per_token']:.1f} ms/token; bound {r['bound_ms']:.1f} ms ({r['weight_mb']:.0f} MB "
          f"at {r['stream_gb_s']:.1f} GB/s); ratio to the bound {r['ratio_to_bound']:.2f}x "
          f"[{r['ratio_min']:.2f}, {r['ratio_max']:.2f}] over {args.rounds} rounds")
    c = r["calls"]
    print(f"calls per layer: {c['per_layer']:.1f} numpy/numba, {c['python_per_layer']:.1f} Python "
          f"({c['numpy_numba']} and {c['python']} in the step)")
    print(json.dumps(r, default=float))


if __name__ == "__main__":
    main()
