"""The q8 mode's product of many tokens (issue 33, prefill): the register-blocked GEMM (a group's block
unpacked once for ``_q8_fused.TILE`` tokens) against the same kernels token by token (the decode kernel, as the
prefill ran before it), the exact mode's dequantize + BLAS, and float32 BLAS on the same shape; G MAC/s on one
thread, process time, rounds alternating, medians of the per-round ratios to the GEMM. Every side but BLAS
gives the same bits (checked here).

    PYTHONPATH=src python benchmarks/q8_gemm.py [--tokens 512] [--rounds 9]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from attnlab.cli import bench_harness as bench
from attnlab.cli.bench_q8 import alternate, cpu_seconds, ratios

SHAPES = (("Q4_1", 1536, 576), ("Q4_1", 576, 1536), ("Q8_0", 49152, 576))   # SmolLM2: gate/up, W_out, unembedding


def weight(qtype: str, d_out: int, d_in: int, rng):
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import quantize

    from attnlab.kernels.q8_activations import Q8ActivationMatrix
    from attnlab.kernels.quantized import QuantizedMatrix

    raw = quantize((rng.standard_normal((d_out, d_in)) * 0.05).astype(np.float32), GGMLQuantizationType[qtype])
    return Q8ActivationMatrix(raw, qtype, d_in), QuantizedMatrix(raw, qtype, d_in)


def sides(qtype: str, W, E, x: np.ndarray) -> dict:
    """name -> a function computing x @ W on the calling thread: the GEMM, token by token, dequantize + BLAS,
    float32 BLAS."""
    from attnlab.kernels import _q8_fused as k

    out = np.empty((x.shape[0], W.d_out), np.float32)                       # (N, d_out)
    planes = W.kernel_planes
    off = np.int32(8 if qtype == "Q4_0" else 0)

    def gemm():
        k.matmul(qtype, *planes, x, out)
        return out.copy()

    _, _, _, qt, ys, xdt, xst = k._quantized_tiles(np.ascontiguousarray(x[:0]), qtype == "Q8_0")   # no whole tile

    def by_token():                   # the same kernels, every token through the decode kernel (the prefill before)
        qx, xd, xs = k._quantized(x)
        if qtype == "Q8_0":
            k._int8_groups(planes[0], planes[1], qx, xd, qt, xdt, out, 0, planes[0].shape[0])
        else:
            k._nibbles_groups(planes[0], planes[1], planes[1] if planes[2] is None else planes[2], off, qx, xd, xs,
                              qt, ys, xdt, xst, out, 0, planes[0].shape[0])
        return out.copy()

    dense = np.ascontiguousarray((np.eye(E.d_in, dtype=np.float32) @ E).T)   # (d_out, d_in) the values, float32

    def blas():
        np.matmul(x, dense.T, out=out)
        return out

    return {"gemm": gemm, "by token": by_token, "dequantize+BLAS": lambda: x @ E, "float32 BLAS": blas}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    out = {}
    with bench.on_cores(1):
        from threadpoolctl import threadpool_limits
        info = bench.machine_info()
        print(f"{info['cpu']}, SIMD {info['simd']}, BLAS {bench.blas_kernel(info['blas'])}, one thread, process "
              f"time, load average {bench.load_average()}")
        with threadpool_limits(1):
            for qtype, d_out, d_in in SHAPES:
                W, E = weight(qtype, d_out, d_in, rng)
                x = rng.standard_normal((args.tokens, d_in)).astype(np.float32)   # (N, d_in)
                fs = sides(qtype, W, E, x)
                assert np.array_equal(fs["gemm"](), fs["by token"]())
                times = alternate({name: (lambda f=f: cpu_seconds(f)) for name, f in fs.items()}, args.rounds)
                macs = args.tokens * d_out * d_in
                row = {name: {"ms": 1e3 * float(np.median(t)), "gmacs": macs / float(np.median(t)) / 1e9,
                              **({} if name == "gemm" else {"gemm_vs": ratios(times, "gemm", name)})}
                       for name, t in times.items()}
                out[f"{qtype} {d_out}x{d_in}"] = row
                print(f"{qtype} ({d_out} x {d_in}), {args.tokens} tokens:")
                for name, r in row.items():
                    vs = r.get("gemm_vs")
                    text = "" if vs is None else (f"  gemm / this {vs['ratio']:.2f} "
                                                  f"[{vs['ratio_min']:.2f}-{vs['ratio_max']:.2f}]")
                    print(f"  {name:16s} {r['ms']:8.1f} ms  {r['gmacs']:6.1f} G MAC/s{text}")
    out["load_average"] = bench.load_average()
    print(json.dumps(out, default=float))


if __name__ == "__main__":
    main()
