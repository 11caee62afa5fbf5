"""One fine-tuning step of a SmolLM2-135M-shaped model in numpy: its time and memory, honestly.

    PYTHONPATH=src python benchmarks/finetune_step.py [--batch 1] [--context 128] [--steps 3] [--json]

SmolLM2-135M's shapes (30 layers, d_model 576, 9 heads on 3 KV heads, gated SiLU MLP 1536 wide, a tied
49,152-token unembedding, RoPE θ 100,000): a random ``transformers.LlamaForCausalLM`` of that config written
by ``save_pretrained`` and read by attnlab, so the figures hold for the real checkpoint's shapes (the
weights' values do not change the cost). For each ``--train-only`` choice: the median seconds of a step
(loss_and_grad and Adam on the parameters trained), and the peak of the bytes numpy allocates during a step
(tracemalloc: the backward's tape, every gradient, temporaries), beside the persistent weights and Adam's
two moments. One BLAS thread; the same step in torch (autograd, torch.optim.Adam, same thread count) for
reference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from attnlab.cli.bench_harness import blas_kernel, machine_info
from attnlab.lm.model import loss_and_grad
from attnlab.lm.training import AdamConfig, AdamState, adam_step, trainable_names
from attnlab.models import load_network
from attnlab.stack.transformer import Transformer

SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
               tie_word_embeddings=True, rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import torch
    import transformers
    from threadpoolctl import threadpool_info, threadpool_limits

    torch.set_num_threads(1)
    report = {"shape": SMOLLM2, "batch": args.batch, "context": args.context}
    with tempfile.TemporaryDirectory() as tmp, threadpool_limits(1, user_api="blas"):
        torch.manual_seed(0)
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SMOLLM2, initializer_range=0.02))
        hf.save_pretrained(tmp)
        loaded = load_network(tmp)
        model = Transformer.from_params(loaded.config, {k: np.array(v) for k, v in loaded.params().items()})
        del loaded
        report["params"] = model.n_params
        rng = np.random.default_rng(0)
        ids = rng.integers(0, SMOLLM2["vocab_size"], (args.batch, args.context + 1))
        x, y = ids[:, :-1], ids[:, 1:]
        for train_only in ("all", "attention", "last-k-layers"):
            names = trainable_names(model, train_only, last_k=2)
            params = {n: model.params()[n] for n in names}
            state = AdamState.zeros(params)
            times, peaks = [], []
            for _ in range(args.steps):
                tracemalloc.start()
                t0 = time.perf_counter()
                value, grads = loss_and_grad(model, x, y)
                adam_step(params, grads, state, AdamConfig(lr=1e-5))
                times.append(time.perf_counter() - t0)
                peaks.append(tracemalloc.get_traced_memory()[1])
                tracemalloc.stop()
                del grads
            report[train_only] = {"trained_params": sum(p.size for p in params.values()),
                                  "seconds_per_step": statistics.median(times),
                                  "peak_step_bytes": max(peaks), "adam_bytes": 2 * sum(p.nbytes for p in params.values()),
                                  "loss": value}
        report["weights_bytes"] = sum(p.nbytes for p in model.params().values())
        opt = torch.optim.Adam(hf.parameters(), lr=1e-5)
        t_ids, t_y = torch.from_numpy(x), torch.from_numpy(y)
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(hf(t_ids).logits.reshape(-1, SMOLLM2["vocab_size"]),
                                              t_y.reshape(-1)).backward()
            opt.step()
            times.append(time.perf_counter() - t0)
        report["torch_seconds_per_step"] = statistics.median(times)
        info = machine_info(torch)
        report.update(cpu=info["cpu"], simd=info["simd"], blas=blas_kernel(threadpool_info()))
    if args.json:
        print(json.dumps(report, indent=1))
        return
    r = report
    print(f"{r['cpu']}, SIMD {r['simd']}, BLAS {r['blas']}; SmolLM2-135M shapes, {r['params']:,} parameters "
          f"({r['weights_bytes'] / 2**20:,.0f} MiB float32), batch {args.batch} × {args.context} tokens")
    for k in ("all", "attention", "last-k-layers"):
        s = r[k]
        print(f"--train-only {k:14s} {s['trained_params']:>12,} trained: {s['seconds_per_step']:6.2f} s per step, "
              f"peak {s['peak_step_bytes'] / 2**20:,.0f} MiB allocated in a step, Adam's moments "
              f"{s['adam_bytes'] / 2**20:,.0f} MiB")
    print(f"torch (autograd, all parameters, 1 thread): {r['torch_seconds_per_step']:.2f} s per step")


if __name__ == "__main__":
    main()
