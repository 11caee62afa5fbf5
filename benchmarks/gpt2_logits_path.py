"""GPT-2 logits with and without the attention weights: the weights force the naive path, logits alone may
take the tiled one.

    PYTHONPATH=src python benchmarks/gpt2_logits_path.py [--layers 2] [--rounds 5]

A random GPT-2 small-shaped network (12 heads, d_model 768, n_ctx 1024, float32; fewer layers, so it runs in
seconds) is built in memory, and ``attnlab.stack.transformer.forward`` runs on n random tokens with ``return_weights=False`` and
``=True`` alternately; medians of the rounds. The logits of the two must agree.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_info

from attnlab.models.checkpoint import Tensors
from attnlab.models.gpt2 import gpt2_config, gpt2_from_tensors
from attnlab.stack.transformer import forward


def random_gpt2(n_layers: int, rng: np.random.Generator, *, d: int = 768, n_heads: int = 12, n_ctx: int = 1024,
                vocab_size: int = 1000):
    """GPT-2 small's shapes with random float32 weights (std 0.02, as GPT-2 initialises)."""
    draw = lambda *shape: rng.normal(0.0, 0.02, shape).astype(np.float32)   # noqa: E731
    w = {"wte.weight": draw(vocab_size, d), "wpe.weight": draw(n_ctx, d),
         "ln_f.weight": 1 + draw(d), "ln_f.bias": draw(d)}
    for i in range(n_layers):
        for ln in ("ln_1", "ln_2"):
            w[f"h.{i}.{ln}.weight"], w[f"h.{i}.{ln}.bias"] = 1 + draw(d), draw(d)
        for name, shape in (("attn.c_attn", (d, 3 * d)), ("attn.c_proj", (d, d)),
                            ("mlp.c_fc", (d, 4 * d)), ("mlp.c_proj", (4 * d, d))):
            w[f"h.{i}.{name}.weight"], w[f"h.{i}.{name}.bias"] = draw(*shape), draw(shape[1])
    config = {"model_type": "gpt2", "n_layer": n_layers, "n_head": n_heads, "n_embd": d, "n_positions": n_ctx,
              "vocab_size": vocab_size, "activation_function": "gelu_new"}
    return gpt2_from_tensors(Tensors(w, "random GPT-2"), gpt2_config(config, "random GPT-2"))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024])
    args = p.parse_args()
    print("BLAS:", [(i["internal_api"], i.get("architecture"), i["num_threads"]) for i in threadpool_info()
                    if i["user_api"] == "blas"])
    rng = np.random.default_rng(0)
    model = random_gpt2(args.layers, rng)
    for n in args.sizes:
        ids = rng.integers(0, model.config.vocab_size, n)
        fast, slow = [], []
        for _ in range(args.rounds):                       # alternate, so both see the same machine load
            t = time.perf_counter()
            logits = forward(model, ids).logits
            fast.append(time.perf_counter() - t)
            t = time.perf_counter()
            with_weights = forward(model, ids, return_weights=True)
            slow.append(time.perf_counter() - t)
        gap = float(np.abs(logits - with_weights.logits).max())
        f, s = statistics.median(fast), statistics.median(slow)
        print(f"n = {n:5d}, {args.layers} layers: logits only {f * 1e3:7.1f} ms, with weights {s * 1e3:7.1f} ms, "
              f"ratio {f / s:.2f}; max |Δ logits| {gap:.1e} (|logits| up to {np.abs(logits).max():.1f})")


if __name__ == "__main__":
    main()
