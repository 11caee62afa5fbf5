"""SmolLM2-135M's prefill (float32, from its GGUF) against transformers reading the same file (issue 33: goal
<= 0.8x), in one process, alternating, the median of per-round ratios; both sides on the same cores and threads
(BLAS and torch), process time by default (steadier than the wall on a loaded machine; with two threads it sums
both threads' CPU time, so ``--clock wall`` is printed beside it there).

    PYTHONPATH=src python benchmarks/smollm2_prefill.py [--tokens 512 2048] [--rounds 7] [--cores 1]
                                                        [--clock process|wall] [--keep 1 0] [--profile]

``--keep``: ``logits_to_keep`` on both sides, 1 (a prefill for generation: transformers' ``generate`` keeps the
last position's logits only, and so does attnlab's) and/or 0 (every position's). ``--profile`` adds where each
side's prefill spends its process time, by class of operation: attnlab's part by part over the 30 layers (medians
of the rounds) and torch's from ``torch.profiler`` (self CPU time of each aten op, summed into the same classes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from attnlab.cli import bench_harness as bench
from attnlab.cli.bench_model import prefill_pair, smollm2_file_model, smollm2_gguf_path, transformers_model

# torch's aten ops -> the classes attnlab's parts are summed into (anything else: "other")
TORCH_CLASSES = {"aten::mm": "products (sgemm)", "aten::addmm": "products (sgemm)", "aten::bmm": "products (sgemm)",
                 "aten::_scaled_dot_product_flash_attention_for_cpu": "attention (causal)",
                 "aten::silu": "SiLU * up", "aten::mul": "elementwise mul (RoPE, norms, SiLU * up)",
                 "aten::add": "adds (residuals, RoPE)", "aten::cat": "RoPE (rotate_half's cat, neg)",
                 "aten::neg": "RoPE (rotate_half's cat, neg)", "aten::pow": "norms", "aten::mean": "norms",
                 "aten::rsqrt": "norms", "aten::embedding": "embedding", "aten::index_select": "embedding"}


def parts(model, ids: np.ndarray, rounds: int) -> dict:
    """Process-time milliseconds of each part of attnlab's prefill, summed over the layers, medians of ``rounds``;
    inside one model step, as :func:`attnlab.stack.transformer.forward` runs its layers (the same kernels: the
    fused bias and RoPE of q|k|v, ``qkv_rope_rows``, where the forward takes it, and the gated MLP's own
    silu(gate) · up)."""
    from attnlab.kernels._step import one_step
    from attnlab.kernels.attention import attention
    from attnlab.kernels.matmul import linear
    from attnlab.layer.multihead import _output, _project, _rows_kernels
    from attnlab.stack.transformer import embed, logits_of, pass_scores

    def one() -> dict:
        out = {}

        def clock(name, f):
            t = time.process_time()
            r = f()
            out[name] = out.get(name, 0.0) + 1e3 * (time.process_time() - t)
            return r

        with one_step(pass_scores(model, ids.shape)):
            x = clock("embedding", lambda: embed(model, ids))                      # (n, d_model)
            for b in model.blocks:
                a = b.attn.config
                h = clock("norms", lambda: b.ln_1(x))
                fused = _rows_kernels(b.attn, h)
                if fused is not None:
                    qkv = clock("products (sgemm): q/k/v", lambda: linear(h, b.attn.W_QKV))   # (n, (h + 2·h_kv)·d)
                    q = np.empty((a.n_heads, len(ids), a.d_head), np.float32)        # (h, n, d_head)
                    k, v = (np.empty((a.n_kv_heads, len(ids), a.d_head), np.float32) for _ in range(2))
                    cos, sin = a.positions.turns(a.d_head, 0, len(ids))              # (n, d_head/2, 2)
                    clock("bias, RoPE, heads (qkv_rope_rows)",
                          lambda: fused.qkv_rope_rows(qkv, b.attn.b_QKV, cos, sin, True, q, k, v))
                else:
                    q, k, v, qk = clock("products (sgemm): q/k/v", lambda: _project(b.attn, h))
                    qk = clock("bias, RoPE, heads (qkv_rope_rows)", lambda: a.positions.rotate(qk, start=0))
                    q, k = qk[:a.n_heads], qk[a.n_heads:]                           # (h | h_kv, n, d_head)
                z = clock("attention (causal, tiled)", lambda: attention(q, k, v, is_causal=True))
                o = clock("products (sgemm): W_O, with the heads' merge", lambda: _output(b.attn, z)[1])
                x = clock("residuals", lambda: x + o)
                h = clock("norms", lambda: b.ln_2(x))
                both = clock("products (sgemm): gate/up", lambda: h @ b.mlp.W_gate_in)
                d = b.mlp.W_out.shape[0]
                hid = clock("SiLU * up", lambda: b.mlp.gated(both[..., :d], both[..., d:]))
                o = clock("products (sgemm): W_out", lambda: hid @ b.mlp.W_out)
                x = clock("residuals", lambda: x + o)
            x = clock("norms", lambda: model.ln_final(x))
            clock("unembedding, last row", lambda: logits_of(model, x[-1:]))
        return out

    one()
    runs = [one() for _ in range(rounds)]
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def torch_parts(hf, torch, ids: np.ndarray) -> dict:
    """torch's share of one prefill (``logits_to_keep=1``) by class of operation: each class's self CPU time in
    ``torch.profiler`` (wall time per op, inflated on a loaded machine and by the profiler) over their sum."""
    from torch.profiler import ProfilerActivity, profile

    t_ids = torch.tensor(ids)[None]                                 # (1, n)
    with torch.no_grad():
        hf(t_ids, logits_to_keep=1)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            hf(t_ids, logits_to_keep=1)
    out = {}
    for e in prof.key_averages():
        k = TORCH_CLASSES.get(e.key, "other")
        out[k] = out.get(k, 0.0) + e.self_cpu_time_total / 1e3
    total = sum(out.values())
    return {k: v / total for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[512])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--cores", type=int, default=None)
    ap.add_argument("--clock", choices=("process", "wall"), default="process")
    ap.add_argument("--keep", type=int, nargs="+", default=[1, 0])
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    path = smollm2_gguf_path()
    model = smollm2_file_model(path, quantized=False)
    hf, torch = transformers_model(path)
    if hf is None:
        raise SystemExit("transformers is not importable: nothing to compare against")
    clock = bench.cpu_call if args.clock == "process" else bench.time_call
    out = {"clock": args.clock, "rounds": args.rounds}
    with bench.on_cores(args.cores, torch):
        info = bench.machine_info()
        print(f"{info['cpu']}, SIMD {info['simd']}, BLAS {bench.blas_kernel(info['blas'])}, torch threads "
              f"{torch.get_num_threads()}, {args.clock} time, load average {bench.load_average()}")
        for n in args.tokens:
            ids = np.random.default_rng(0).integers(3, model.config.vocab_size, n)   # (n,)
            for k in args.keep:
                r = out[f"{n}/{k}"] = prefill_pair(model, hf, torch, ids, args.rounds, logits_to_keep=k, clock=clock)
                print(f"prefill {n}, logits_to_keep={k}: attnlab {r['attnlab_ms']:.0f} ms, transformers "
                      f"{r['transformers_ms']:.0f} ms, ratio {r['ratio']:.2f} [{r['ratio_min']:.2f}-{r['ratio_max']:.2f}]")
            if args.profile:
                mine, share = parts(model, ids, args.rounds), torch_parts(hf, torch, ids)
                theirs_ms = out[f"{n}/{args.keep[0]}"]["transformers_ms"]
                out[f"{n}/parts_ms"], out[f"{n}/torch_shares"] = mine, share
                print(f"  attnlab, process time by part (sum {sum(mine.values()):.0f} ms):")
                for name, v in mine.items():
                    print(f"    {name:58s} {v:8.1f} ms")
                print(f"  transformers, torch.profiler's shares by class, times its {theirs_ms:.0f} ms above:")
                for name, v in share.items():
                    print(f"    {name:58s} {v * theirs_ms:8.1f} ms  {100 * v:4.1f}%")
    out["load_average"] = bench.load_average()
    print(json.dumps(out, default=float))


if __name__ == "__main__":
    main()
