"""``attnlab bench --model smollm2``'s long-context rows: decode ms/token at contexts of 512, 2,048 and 8,192
tokens (SmolLM2 was trained to 8,192), float32 and quantized, and where the step's time goes.

A decode step reads every weight once and every cached key and value once. The weights are the same at
every context (SmolLM2: 538 MB in float32, 102 MB in Q4_1); the KV cache grows with it: 2 (k, v) × 30 layers ×
3 key/value heads × 64 features × 4 bytes = 46 KB a token in float32, so 377 MB at 8,192 tokens, more than
the quantized weights; half that in float16, as llama.cpp keeps it and as the 8-bit-activation mode does
(:func:`attnlab.layer.cache.kv_dtype_rule`). Each row gives the step's ms, the ms of its attention alone (the
decode kernel of every layer against the cache, :func:`attention_step`: the KV cache's share), and the rest
(the weights' products and the fixed cost), for the exact quantized mode (float32 cache) and, when given, the
8-bit-activation mode (float16 cache).

The caches are filled with random keys and values (N(0, 1)), not by a prefill: a step's time depends on how
many keys it reads, not on what they hold, and an 8,192-token prefill would cost the benchmark minutes. The
grouped-query decode kernel (:mod:`attnlab.kernels.decode`, chosen by its rule in
:mod:`attnlab.kernels._kernels`) reads each key/value head once for its group of query heads.

llama.cpp's rows (when ``llama_cpp``, the package llama-cpp-python, is importable; it is never a dependency):
the same file at the same context, its cache filled by a prefill of random tokens, flash-attention on and off,
in a process of its own that times its own steps (:func:`attnlab.cli.llama_process.llama_step`).

Every time is process time on one thread (BLAS pinned to one thread, llama.cpp's ``n_threads=1``), so a loaded
machine's other work is not counted, and every ratio is the median of per-round ratios, the two sides alternating.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from .bench_harness import Decoder, cpu_call, cpu_seconds, paired, reported
from .llama_process import llama_step

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


def kv_bytes(model, context: int, kv_dtype=np.float32) -> int:
    """Bytes of keys and values a decode step reads at ``context`` tokens: 2 · layers · h_kv · context · d_head
    numbers of ``kv_dtype``."""
    a = model.config.attention
    return 2 * model.config.n_layers * a.n_kv_heads * context * a.d_head * np.dtype(kv_dtype).itemsize


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


def mode_row(decoder: FilledDecoder, att: dict, context: int) -> dict:
    """One mode's share of a row: its step's ms and its attention's (paired ``att``), its cache's dtype and MB."""
    dtype = decoder.caches[0].k.dtype
    return {"ms": att["b_ms"], "attention_ms": att["a_ms"], "attention_share": att["ratio"], "kv_dtype": str(dtype),
            "kv_mb": kv_bytes(decoder.model, context, dtype) / 1e6}


def context_rows(f32, q, path, *, rounds: int, contexts=LONG_CONTEXTS, llama: bool = True, q8=None) -> list[dict]:
    """One row per context: float32 and quantized ms/token (paired, process time), the attention's share, the
    KV cache's and the weights' bytes; with ``q8`` (the 8-bit-activation model) its step and attention against
    its float16 cache too; and llama.cpp's ms/token with flash-attention on and off against the q8 step (the
    exact quantized one without ``q8``) when ``llama`` and llama_cpp is importable (else None)."""
    from ..kernels._threads import one_blas_thread

    rows = []
    with one_blas_thread():
        for n in contexts:
            rng = np.random.default_rng(n)
            df, dq = FilledDecoder(f32, n, rng), FilledDecoder(q, n, rng)
            d8 = None if q8 is None else FilledDecoder(q8, n, rng)
            pair = paired_cpu(df.step, dq.step, rounds)
            att = paired_cpu(attention_step(dq), dq.step, rounds)
            row = {"context": n, "float32_ms": pair["a_ms"], "quantized_ms": pair["b_ms"],
                   "quantized_vs_float32": 1 / pair["ratio"], "attention_ms": att["a_ms"],
                   "attention_share": att["ratio"], "kv_mb": kv_bytes(f32, n) / 1e6,
                   "weights_mb_float32": weight_bytes(f32) / 1e6, "weights_mb_quantized": weight_bytes(q) / 1e6,
                   "q8": None if d8 is None else mode_row(d8, paired_cpu(attention_step(d8), d8.step, rounds), n),
                   "llama_cpp": None}
            if llama:
                ours = dq if d8 is None else d8
                found = {"against": "quantized" if d8 is None else "q8"}
                for fa in (True, False):
                    got = llama_step(path, n, flash_attn=fa, fill_threads=len(os.sched_getaffinity(0)))
                    if got is None:
                        break
                    llama, step = got
                    with llama:
                        p = paired(cpu_seconds(ours.step), step, rounds, clock=reported)
                    found["flash_attn_on" if fa else "flash_attn_off"] = {
                        "ms_per_token": p.b_ms, "quantized_ratio": p.ratio, "ratio_min": p.ratio_min,
                        "ratio_max": p.ratio_max, "attnlab_ms": p.a_ms}
                row["llama_cpp"] = found if len(found) > 1 else None
            rows.append(row)
            del df, dq, d8
    return rows


def growth(rows: list[dict], ms, share) -> str:
    """How a mode's step grows with the context, and where its time goes at the longest: a text line."""
    first, last = rows[0], rows[-1]
    grow = (ms(last) - ms(first)) / (last["context"] - first["context"]) * 1000
    return (f"{grow:.2f} ms per 1,000 tokens of context; at {last['context']} tokens the attention (the KV cache) "
            f"is {share(last):.0%} of the step, the weights and the fixed cost the rest")


def context_table(rows: list[dict]) -> list[str]:
    """The rows as text lines."""
    if not rows:
        return []
    q8 = rows[0].get("q8") is not None
    lines = ["", "long contexts (process time on one thread, the caches filled with random keys and values; "
                 "ratios to llama.cpp: median of per-round ratios, attnlab's " + ("q8" if q8 else "quantized") +
                 " step over llama.cpp's)",
             f"{'context':>8} {'float32':>9} {'exact':>9} {'attention':>10} {'KV f32':>7}"
             + (f" {'q8':>9} {'attention':>10} {'KV f16':>7}" if q8 else "")
             + f" {'llama.cpp FA on':>17} {'FA off':>17}"]
    for r in rows:
        ll = r["llama_cpp"] or {}
        cell = lambda k: (f"{ll[k]['ms_per_token']:6.1f} ms {ll[k]['quantized_ratio']:5.2f}x" if k in ll   # noqa: E731
                          else "not importable")
        eight = (f" {r['q8']['ms']:6.1f} ms {r['q8']['attention_ms']:7.1f} ms {r['q8']['kv_mb']:4.0f} MB" if q8 else "")
        lines.append(f"{r['context']:>8} {r['float32_ms']:6.1f} ms {r['quantized_ms']:6.1f} ms {r['attention_ms']:7.1f} ms "
                     f"{r['kv_mb']:4.0f} MB{eight} {cell('flash_attn_on'):>17} {cell('flash_attn_off'):>17}")
    last = rows[-1]
    lines.append(f"weights: {last['weights_mb_quantized']:.0f} MB quantized, {last['weights_mb_float32']:.0f} MB float32 "
                 "('attention' runs only each layer's decode kernel against its cache)")
    lines.append("exact quantized (float32 cache): " + growth(rows, lambda r: r["quantized_ms"],
                                                             lambda r: r["attention_share"]))
    if q8:
        lines.append("q8 (float16 cache): " + growth(rows, lambda r: r["q8"]["ms"], lambda r: r["q8"]["attention_share"]))
    if not rows[0]["llama_cpp"]:
        lines.append("llama.cpp: llama_cpp not importable (see docs/speed.md to add it)")
    return lines
