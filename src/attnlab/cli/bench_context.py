"""``attnlab bench --model smollm2``'s long-context rows: decode ms/token at contexts of 512, 2,048 and 8,192
tokens (SmolLM2 was trained to 8,192), float32 and quantized, and where the step's time goes.

A decode step reads every weight once and every cached key and value once. The weights are the same at
every context (SmolLM2: 538 MB in float32, 102 MB in Q4_1); the KV cache grows with it: 2 (k, v) × 30 layers ×
3 key/value heads × 64 features × 4 bytes = 46 KB a token in float32, so 377 MB at 8,192 tokens, more than
the quantized weights. Each row gives the step's ms, the ms of its attention alone (the decode kernel of every
layer against the cache, :func:`attention_ms`: the KV cache's share), and the rest (the weights' products and
the fixed cost).

The caches are filled with random keys and values (N(0, 1)), not by a prefill: a step's time depends on how
many keys it reads, not on what they hold, and an 8,192-token prefill would cost the benchmark minutes. The
grouped-query decode kernel (:mod:`attnlab.kernels.decode`, chosen by its rule in
:mod:`attnlab.kernels._kernels`) reads each key/value head once for its group of query heads.

llama.cpp's rows (when ``llama_cpp``, the package llama-cpp-python, is importable; it is never a dependency):
the same file at the same context, its cache filled by a prefill of random tokens, flash-attention on and off.

Every time is process time on one thread (BLAS pinned to one thread, llama.cpp's ``n_threads=1``), so a loaded
machine's other work is not counted, and every ratio is the median of per-round ratios, the two sides alternating.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .bench_harness import Decoder, cpu_call, paired

LONG_CONTEXTS = (512, 2048, 8192)


class FilledDecoder(Decoder):
    """A :class:`~attnlab.cli.bench_harness.Decoder` whose caches hold ``context`` tokens of random keys and
    values, written directly (no prefill: a long context in a moment)."""

    def __init__(self, model, context: int, rng: np.random.Generator):
        self.rng = rng
        super().__init__(model, context)

    def fill(self) -> None:
        for cache in self.caches:
            cache.k[..., :self.context, :] = self.rng.standard_normal(cache.k[..., :self.context, :].shape, np.float32)
            cache.v[..., :self.context, :] = self.rng.standard_normal(cache.v[..., :self.context, :].shape, np.float32)
            cache.length = self.context
            cache.k_max = float(np.abs(cache.k).max())
            cache.v_max = float(np.abs(cache.v).max())


def weight_bytes(model) -> int:
    """Bytes of every weight a step reads (quantized ones as stored)."""
    return int(sum(getattr(a, "nbytes", 0) for a in model.params().values()))


def kv_bytes(model, context: int) -> int:
    """Bytes of keys and values a decode step reads at ``context`` tokens: 2 · layers · h_kv · context · d_head."""
    a = model.config.attention
    return 2 * model.config.n_layers * a.n_kv_heads * context * a.d_head * np.dtype(np.float32).itemsize


def attention_step(decoder: FilledDecoder):
    """A callable running only the attention of every layer against its cache, as the step runs it
    (:func:`attnlab.kernels.attention.attend` with the layer's options; the query random): the KV cache's share."""
    from ..kernels.attention import attend

    a = decoder.model.config.attention
    q = np.random.default_rng(1).standard_normal((a.n_heads, 1, a.d_head), np.float32)   # (h, 1, d_head)
    kv = [(c.keys, c.values) for c in decoder.caches]              # (h_kv, n_k, d_head) each, views

    def run():
        for k, v in kv:
            attend(q, k, v, check_finite=False, is_causal=True, **a.options)   # (h, 1, d_head)
    return run


def paired_cpu(a, b, rounds: int) -> dict:
    """``a`` against ``b`` in process time, alternating (:func:`attnlab.cli.bench_harness.paired`), as a dict."""
    return dataclasses.asdict(paired(a, b, rounds, clock=cpu_call))


def llama_cpp_model(path, **options):
    """``llama_cpp.Llama(model_path=path, verbose=False, **options)`` with its weights in the CPU's plain
    buffers (llama.cpp's ``use_extra_bufts`` off: no repacking at load), or None when ``llama_cpp`` cannot be
    imported. On the Xeon the figures come from, llama.cpp repacked the Q4_1 weights for AMX by default
    (1.8 s of its load) and then died of SIGILL on its first batch of more than one token; its plain kernels
    run everywhere."""
    try:
        import llama_cpp
        import llama_cpp.llama_cpp as low
    except ImportError:
        return None
    defaults = low.llama_model_default_params

    def plain():
        params = defaults()
        params.use_extra_bufts = False
        return params
    low.llama_model_default_params = plain
    try:
        return llama_cpp.Llama(model_path=str(path), verbose=False, **options)
    finally:
        low.llama_model_default_params = defaults


def llama_cpp_at(path, context: int, *, flash_attn: bool):
    """A llama.cpp decode step at ``context`` tokens on one thread (its cache filled by a prefill of random
    tokens on every usable core: one thread took minutes at 8,192 with flash-attention), as a callable; None
    when ``llama_cpp`` cannot be imported."""
    import os
    llm = llama_cpp_model(path, n_ctx=context + 8, n_threads=1, n_threads_batch=len(os.sched_getaffinity(0)),
                          n_batch=512, flash_attn=flash_attn)
    if llm is None:
        return None
    prompt = [int(i) for i in np.random.default_rng(0).integers(3, llm.n_vocab(), context)]
    llm.eval(prompt)

    def step():
        llm.n_tokens = context                    # rewind to the same context, as the Decoder does
        llm.eval([prompt[-1]])
    return step


def context_rows(f32, q, path, *, rounds: int, contexts=LONG_CONTEXTS, llama: bool = True) -> list[dict]:
    """One row per context: float32 and quantized ms/token (paired, process time), the attention's share, the
    KV cache's and the weights' bytes, and llama.cpp's ms/token with flash-attention on and off against the
    quantized step when ``llama`` and llama_cpp is importable (else None)."""
    from ..kernels._threads import one_blas_thread

    rows = []
    with one_blas_thread():
        for n in contexts:
            rng = np.random.default_rng(n)
            df, dq = FilledDecoder(f32, n, rng), FilledDecoder(q, n, rng)
            pair = paired_cpu(df.step, dq.step, rounds)
            att = paired_cpu(attention_step(dq), dq.step, rounds)
            row = {"context": n, "float32_ms": pair["a_ms"], "quantized_ms": pair["b_ms"],
                   "quantized_vs_float32": 1 / pair["ratio"], "attention_ms": att["a_ms"],
                   "attention_share": att["ratio"], "kv_mb": kv_bytes(f32, n) / 1e6,
                   "weights_mb_float32": weight_bytes(f32) / 1e6, "weights_mb_quantized": weight_bytes(q) / 1e6,
                   "llama_cpp": None}
            if llama:
                found = {}
                for fa in (True, False):
                    step = llama_cpp_at(path, n, flash_attn=fa)
                    if step is None:
                        break
                    p = paired_cpu(dq.step, step, rounds)
                    found["flash_attn_on" if fa else "flash_attn_off"] = {
                        "ms_per_token": p["b_ms"], "quantized_ratio": p["ratio"], "ratio_min": p["ratio_min"],
                        "ratio_max": p["ratio_max"]}
                    del step
                row["llama_cpp"] = found or None
            rows.append(row)
            del df, dq
    return rows


def context_table(rows: list[dict]) -> list[str]:
    """The rows as text lines."""
    if not rows:
        return []
    lines = ["", "long contexts (process time on one thread, the caches filled with random keys and values; "
                 "quantized/llama.cpp: median of per-round ratios)",
             f"{'context':>8} {'float32':>9} {'quantized':>10} {'attention':>10} {'KV cache':>9} "
             f"{'llama.cpp FA on':>16} {'FA off':>15}"]
    for r in rows:
        ll = r["llama_cpp"] or {}
        cell = lambda k: (f"{ll[k]['ms_per_token']:6.1f} ms {ll[k]['quantized_ratio']:4.2f}x" if k in ll   # noqa: E731
                          else "not importable")
        lines.append(f"{r['context']:>8} {r['float32_ms']:6.1f} ms {r['quantized_ms']:7.1f} ms {r['attention_ms']:7.1f} ms "
                     f"{r['kv_mb']:6.0f} MB {cell('flash_attn_on'):>16} {cell('flash_attn_off'):>15}")
    first, last = rows[0], rows[-1]
    grow = (last["quantized_ms"] - first["quantized_ms"]) / (last["context"] - first["context"]) * 1000
    lines.append(f"the quantized step grows {grow:.2f} ms per 1,000 tokens of context; at {last['context']} tokens "
                 f"its attention (the KV cache, {last['kv_mb']:.0f} MB) is {last['attention_share']:.0%} of it, the "
                 f"weights ({last['weights_mb_quantized']:.0f} MB quantized, {last['weights_mb_float32']:.0f} MB "
                 "float32) and the fixed cost the rest ('attention' runs only each layer's decode kernel)")
    if not rows[0]["llama_cpp"]:
        lines.append("llama.cpp: llama_cpp not importable (see docs/speed.md to add it)")
    return lines
