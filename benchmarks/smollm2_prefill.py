"""A 512-token prefill of SmolLM2-135M (float32, from its GGUF) against transformers reading the same file
(issue 21: goal <= 0.8x), in one process, alternating, the median of per-round ratios; both sides on the same
cores and threads (BLAS and torch).

    PYTHONPATH=src python benchmarks/smollm2_prefill.py [--rounds 9] [--cores 2] [--profile]

Two pairs: ``logits_to_keep=1`` on both sides (a prefill for generation: transformers' ``generate`` keeps the
last position's logits only, and so does attnlab's), and every position's logits on both sides. ``--profile``
adds where attnlab's prefill spends its time, part by part over the 30 layers (medians of the rounds).
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

from attnlab.cli import bench_harness as bench
from attnlab.cli.bench_model import PREFILL_TOKENS, prefill_pair, smollm2_file_model, smollm2_gguf_path, transformers_model


def parts(model, ids: np.ndarray, rounds: int) -> dict:
    """Milliseconds of each part of attnlab's prefill, summed over the layers, medians of ``rounds``."""
    from attnlab.kernels.attention import attention
    from attnlab.layer.multihead import _output, _project
    from attnlab.stack.layers import ACTIVATIONS
    from attnlab.stack.transformer import embed, logits_of

    def one() -> dict:
        out = {}
        clock = bench.part_clock(out)

        x = clock("embedding", lambda: embed(model, ids))                          # (n, d_model)
        for b in model.blocks:
            h = clock("norms", lambda: b.ln_1(x))
            q, k, v = clock("q/k/v product + RoPE", lambda: _project(b.attn, h))
            z = clock("attention (causal, tiled)", lambda: attention(q, k, v, is_causal=True))
            o = clock("W_O", lambda: _output(b.attn, z)[1])
            x = clock("residuals", lambda: x + o)
            h = clock("norms", lambda: b.ln_2(x))
            both = clock("gate/in product", lambda: h @ b.mlp.W_gate_in)
            d = b.mlp.W_out.shape[0]
            hid = clock("SiLU * up", lambda: ACTIVATIONS["silu"](both[..., :d]) * both[..., d:])
            o = clock("W_out product", lambda: hid @ b.mlp.W_out)
            x = clock("residuals", lambda: x + o)
        x = clock("norms", lambda: model.ln_final(x))
        clock("unembedding, last row", lambda: logits_of(model, x[-1:]))
        clock("unembedding, all 512 rows (not run by a prefill for generation)", lambda: logits_of(model, x))
        return out

    one()
    runs = [one() for _ in range(rounds)]
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--cores", type=int, default=None)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    path = smollm2_gguf_path()
    model = smollm2_file_model(path, quantized=False)
    hf, torch = transformers_model(path)
    if hf is None:
        raise SystemExit("transformers is not importable: nothing to compare against")
    ids = np.random.default_rng(0).integers(3, model.config.vocab_size, PREFILL_TOKENS)   # (512,)
    with bench.on_cores(args.cores, torch):
        info = bench.machine_info()
        print(f"{info['cpu']}, {info['simd']}, BLAS {bench.blas_kernel(info['blas'])}, torch threads "
              f"{torch.get_num_threads()}, load average {bench.load_average()}")
        out = {k: prefill_pair(model, hf, torch, ids, args.rounds, logits_to_keep=k) for k in (1, 0)}
        for k, r in out.items():
            print(f"prefill {PREFILL_TOKENS}, logits_to_keep={k}: attnlab {r['attnlab_ms']:.0f} ms, transformers "
                  f"{r['transformers_ms']:.0f} ms, ratio {r['ratio']:.2f} [{r['ratio_min']:.2f}-{r['ratio_max']:.2f}]")
        if args.profile:
            out["parts_ms"] = parts(model, ids, args.rounds)
            for k, v in out["parts_ms"].items():
                print(f"  {k:66s} {v:8.1f} ms")
    print(json.dumps(out, default=float))


if __name__ == "__main__":
    main()
