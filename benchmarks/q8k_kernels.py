"""The K-quants' 8-bit-activation kernels (kernels/_q8k_fused.py) against the exact mode's fused kernel
(kernels/_quant_fused.py), one token, one thread, process time.

    python benchmarks/q8k_kernels.py [--rounds 9]

A (576 × 1536) weight (SmolLM2's ffn_down) of random super-blocks in Q4_K, Q5_K and Q6_K, held in L2 (one
matrix) or streamed from memory (40 matrices cycled); each round times 400 products of one kernel, then of the
other. Printed: G weights/s of each (median, min, max) and the median of the per-round time ratios q8k / exact,
with the CPU, numpy's SIMD level and the BLAS kernel. The exact mode has no Q5_K kernel: its row shows the exact
Q4_K kernel, for scale. Speed only, never a test: the machine's load moves every figure.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def machine() -> str:
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    from threadpoolctl import threadpool_info

    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    simd = [f for f in __cpu_dispatch__ if __cpu_features__.get(f)][-1]
    blas = [f"{i.get('internal_api')} {i.get('architecture')} {i.get('version')}" for i in threadpool_info()
            if i.get("user_api") == "blas"]
    return f"CPU: {cpu} | numpy SIMD: {simd} | BLAS: {', '.join(blas)}"


def random_blocks(rng, qtype: str, rows: int, d_in: int) -> np.ndarray:
    """(rows, bytes) of random super-blocks with finite float16 scales."""
    from attnlab.kernels.quantized import quant_sizes

    block, nbytes = quant_sizes(qtype)
    raw = rng.integers(0, 256, (rows, d_in // block, nbytes), dtype=np.uint8)
    halves = rng.uniform(0, 1e-3, (rows, d_in // block, 2)).astype(np.float16).view(np.uint8).reshape(rows, -1, 4)
    if qtype == "Q6_K":
        raw[..., -2:] = halves[..., :2]
    else:
        raw[..., :4] = halves
    return raw.reshape(rows, -1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    from threadpoolctl import threadpool_limits
    threadpool_limits(1)
    from attnlab.kernels import _q8k_fused, _quant_fused
    from attnlab.kernels.q8k_activations import Q8KActivationMatrix
    from attnlab.kernels.quantized import QuantizedMatrix

    print(machine())
    rng = np.random.default_rng(0)
    d_out, d_in, reps = 576, 1536, 400
    x = rng.standard_normal((1, d_in)).astype(np.float32)                 # (1, d_in)
    out = np.empty((1, d_out), np.float32)                                # (1, d_out)
    for label, n in (("L2-resident (1 matrix)", 1), ("streamed (40 matrices cycled)", 40)):
        for qtype in ("Q4_K", "Q5_K", "Q6_K"):
            exact_type = "Q4_K" if qtype == "Q5_K" else qtype
            q8k = [Q8KActivationMatrix(random_blocks(rng, qtype, d_out, d_in), qtype, d_in) for _ in range(n)]
            exact = [QuantizedMatrix(random_blocks(rng, exact_type, d_out, d_in), exact_type, d_in) for _ in range(n)]
            runs = {"q8k": lambda i: _q8k_fused.matmul(qtype, *q8k[i % n].kernel_planes, x, out),
                    "exact": lambda i: _quant_fused.matvec(exact_type, *exact[i % n].kernel_planes, x, out, 1)}
            for run in runs.values():                                     # compiled / loaded first
                for i in range(5):
                    run(i)
            rate = {k: [] for k in runs}
            ratios = []
            for _ in range(args.rounds):
                seconds = {}
                for k, run in runs.items():
                    t0 = time.process_time()
                    for i in range(reps):
                        run(i)
                    seconds[k] = time.process_time() - t0
                    rate[k].append(reps * d_in * d_out / seconds[k] / 1e9)
                ratios.append(seconds["q8k"] / seconds["exact"])
            text = "; ".join(f"{k} {np.median(v):.1f} G weights/s [{min(v):.1f}, {max(v):.1f}]"
                             for k, v in rate.items())
            print(f"{label} {qtype} ({d_out} x {d_in}): {text}; q8k / exact {np.median(ratios):.2f} "
                  f"[{min(ratios):.2f}, {max(ratios):.2f}]" + (" (exact: Q4_K's kernel)" if qtype == "Q5_K" else ""))


if __name__ == "__main__":
    main()
