"""What ``attnlab bench --model smollm2`` measures: a real model's decode and prefill, against what bounds them.

- Decode ms/token: one token through the whole model against its KV caches (greedy decode's step).
- The float32 bound: the bytes of the weights a step reads, divided by numpy's measured matrix-vector
  streaming rate (``x @ W`` for one float32 W several times the size of the last-level cache, so it comes
  from memory as the model's weights do). No decode can read its weights faster than numpy streams them.
- The numpy/numba call count of a decode step, per layer: counted by :mod:`cProfile`, which sees every
  call of a Python function and of a numpy or numba function (``np.exp``, a ufunc's ``reduce``, a numba
  dispatcher), but not operators such as ``@`` or ``+`` (those go straight to C). It does not depend on the
  head count (the per-head work is inside the matmuls and the fused decode kernel).

Every ratio is measured in one process, alternating, as :func:`attnlab.cli.bench_harness.paired` does.
"""

from __future__ import annotations

import cProfile
import pstats
import time

import numpy as np

from . import bench_harness as bench

STREAM_BYTES = 256 * 2**20        # the streaming probe's matrix: 256 MiB, 8× a 32 MiB L3
# SmolLM2-135M's shapes (its config.json and GGUF metadata): the random stand-in for speed work
SMOLLM2_SHAPE = dict(n_layers=30, d_model=576, n_heads=9, n_kv_heads=3, d_head=64, d_mlp=1536, vocab_size=49152)


def smollm2_shaped(*, rng: np.random.Generator, n_layers: int = SMOLLM2_SHAPE["n_layers"],
                   n_heads: int = SMOLLM2_SHAPE["n_heads"], n_kv_heads: int = SMOLLM2_SHAPE["n_kv_heads"]):
    """A random float32 Llama of SmolLM2-135M's sizes (tied embeddings, RoPE θ 100,000, SiLU gated MLP)."""
    from ..layer.config import AttentionConfig
    from ..layer.positions import RoPE
    from ..stack.layers import RMSNorm
    from ..stack.transformer import ModelConfig, Transformer

    s = SMOLLM2_SHAPE
    att = AttentionConfig(d_model=s["d_model"], n_heads=n_heads, n_kv_heads=n_kv_heads, d_head=s["d_head"],
                          n_ctx=8192, positions=RoPE(100000.0))
    cfg = ModelConfig(vocab_size=s["vocab_size"], n_layers=n_layers, attention=att, d_mlp=s["d_mlp"],
                      activation="silu", mlp="gated", norm=RMSNorm, norm_eps=1e-5, tied_embeddings=True,
                      family="llama")
    return Transformer.init(cfg, rng=rng)


def weight_bytes(model) -> int:
    """Bytes a decode step reads: every weight once (the tied embedding as the unembedding; the row of
    W_E it looks up is negligible), biases and norms included."""
    return int(sum(getattr(a, "nbytes", 0) for a in model.params().values()))


def stream_rate(rounds: int = 7, nbytes: int = STREAM_BYTES) -> float:
    """numpy's float32 matrix-vector streaming rate in bytes/s: ``x @ W`` for a (d, d) W of ``nbytes``,
    the fastest of ``rounds``."""
    d = int(np.sqrt(nbytes // 4))
    W = np.random.default_rng(0).standard_normal((d, d), dtype=np.float32)   # (d, d)
    x = np.ones((1, d), np.float32)                                           # (1, d)
    best = min(bench.time_call(lambda: x @ W) for _ in range(rounds))
    return W.nbytes / best


class Decoder:
    """A model, its caches filled with a ``context``-token prompt, and :meth:`step`: one decode step,
    rewound afterwards so every step sees the same context."""

    def __init__(self, model, context: int = 64):
        from ..stack.transformer import forward, new_caches

        self.model, self.forward = model, forward
        self.caches = new_caches(model, context + 1)
        forward(model, np.arange(context) % model.config.vocab_size, caches=self.caches)
        self.context = context

    def step(self) -> np.ndarray:
        logits = self.forward(self.model, np.array([self.context % self.model.config.vocab_size]),
                              caches=self.caches).logits             # (1, vocab)
        for cache in self.caches:
            cache.length = self.context
        return logits


def decode_calls(decoder: Decoder) -> dict:
    """cProfile's count of one decode step's calls: ``per_layer`` numpy/numba calls (C functions: numpy's
    functions and methods, ufunc methods, numba dispatchers), ``python_per_layer`` Python-level calls, and
    the totals; the layers' share is the total divided by n_layers."""
    decoder.step()
    prof = cProfile.Profile()
    prof.enable()
    decoder.step()
    prof.disable()
    stats = pstats.Stats(prof).stats
    native = python = 0
    for (file, _, name), (_, ncalls, *_rest) in stats.items():
        if file == "~":
            if "isinstance" in name or "len" == name.strip("<>").split()[-1] or "disable" in name:
                continue
            native += ncalls
        else:
            python += ncalls
    n_layers = decoder.model.config.n_layers
    return {"numpy_numba": native, "python": python, "per_layer": native / n_layers,
            "python_per_layer": python / n_layers}


def decode_row(model, *, rounds: int, context: int = 64) -> dict:
    """Decode ms/token of ``model`` paired with numpy's streaming probe: the ratio to the float32 bound."""
    decoder = Decoder(model, context)
    nbytes = weight_bytes(model)
    d = int(np.sqrt(STREAM_BYTES // 4))
    W = np.random.default_rng(0).standard_normal((d, d), dtype=np.float32)   # (d, d) the streaming probe
    x = np.ones((1, d), np.float32)                                           # (1, d)
    probe_scale = nbytes / W.nbytes                                          # the bound's time per probe time
    pair = bench.paired(decoder.step, lambda: x @ W, rounds)
    t0 = time.perf_counter()
    calls = decode_calls(decoder)
    return {"ms_per_token": pair.a_ms, "bound_ms": pair.b_ms * probe_scale,
            "ratio_to_bound": pair.ratio / probe_scale, "ratio_min": pair.ratio_min / probe_scale,
            "ratio_max": pair.ratio_max / probe_scale, "stream_gb_s": W.nbytes / pair.b_ms / 1e6,
            "weight_mb": nbytes / 1e6, "calls": calls, "profile_s": time.perf_counter() - t0}
