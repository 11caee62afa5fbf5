"""The decode step: one query per head against a KV cache, every cached key visible.

Generation runs this once per new token: the step streams every cached key and value once, so it is
memory-bound, and it takes as few passes over the scores as it can (the naive path's extra passes and
allocations cost it 40% at 1024 tokens). With grouped-query attention the query heads of a group are one
(g, d_k) @ (d_k, n_k) matmul against their key/value head: each cached head is read once per group.

With numba (the extra ``attnlab[fast]``) the whole step is one call of a fused kernel
(:func:`attnlab.kernels._fused.decode_tiles`): each key/value head read once for its whole group, in tiles of
``DECODE_TILE`` keys that stay in L2 between their scores and their weighted sum, with FlashAttention's online
softmax across the tiles; no temporaries. numpy takes seven calls and two (h, n_k) temporaries.
``ATTNLAB_NO_NUMBA=1`` (or numba missing) keeps the numpy path.

A float16 cache (:class:`attnlab.layer.cache.KVCache` with ``dtype=float16``, as llama.cpp keeps its own) comes
in with a float32 query, and the step computes as llama.cpp does against its own (flash-attention off, its
default): q rounded to float16 before its dot products with the keys (ggml's F16 ``vec_dot_type``), the
weights normalised and rounded to float16 before their sum of the values, the sums in float32
(:func:`attnlab.kernels._fused.decode_half`: each key and value widened as it is loaded, F16C's
``vcvtph2ps``, reading half the bytes; the numpy path alike on widened copies). Without those two roundings
the q8 mode's greedy tokens left llama.cpp's after 15 of 64 steps on SmolLM2 (at a near-tie), with them
all 64 were llama.cpp's, before the products' fused multiply-add was merged; after it, fed llama.cpp's tokens,
62 of 64 top-1 tokens are its (tests/test_q8_llama_cpp.py, docs/speed.md).
(The q8 mode's parts now take llama.cpp's own attention arithmetic instead, :class:`attnlab.layer.multihead.
LlamaCppAttention`, for its bits: all 64 tokens and every logit; this kernel still serves a float16 cache otherwise.)
A float16 cache with a sink takes the numpy path on widened copies, without them.

Which kernel runs is a rule, :func:`decode_kernel_rule`, never a race: a float16 cache takes the fused kernel
(numpy would copy the whole cache every call); a float32 step stays on numpy unless it passes the fused
kernels' size rule (``FUSED_MIN_SCORES``) with grouped heads, so numba is not loaded for a short call; ``attnlab
tune`` measures both kernels per group kind and context on this machine, and its profile then decides
(:func:`decode_choice`).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from . import _kernels, profile
from ._checks import Checked, cap_scores, fold, unfold


# From this many cached keys the numpy step takes its scores as K qᵀ, (n_k, d_k) @ (d_k, g), rather than q Kᵀ:
# OpenBLAS then streams each key/value head's rows once for its whole group instead of packing a transposed
# copy of them first (SmolLM2's 9 on 3 heads, 30 layers, one thread of a Xeon with AVX-512, loaded machine,
# process time, paired: 0.82x the time at 2,048 keys, 0.83x at 8,192, bit for bit the same output there;
# 1.10x at 64 keys, where the extra call shows). A rule on the shape, never a measurement at run time.
KEYS_FIRST = 256


def takes_decode_path(c: Checked) -> bool:
    """True for one query per head against at least one key, every key visible (causality with the default
    q_offset hides nothing from the last position), no bias."""
    return (c.q.shape[-2] == 1 and c.k.shape[-2] > 0 and c.keep is None and c.bias is None
            and not c.causal_hides_keys)


def decode_kernel_rule(scores: int, groups: int, n_k: int, tuned: dict | None = None, *,
                       half_cache: bool = False) -> tuple[str, str]:
    """The rule for the decode step's kernel, given numba is installed and enabled and the fused kernel fits
    (:func:`fused_fits`): ``("fused" | "numpy", why)``, a pure function of its arguments.

    A float16 cache (``half_cache``) takes the fused kernel, which widens each key as it loads it: the numpy
    path would first widen a copy of the whole cache (a pass writing twice the cache's bytes) every call.
    With a tune profile's table (``tuned``: {"grouped" | "ungrouped": {context: kernel}}, measured at a few
    contexts): the kernel measured at the largest context <= n_k (the smallest measured one below them).
    Else fused only for grouped heads (``groups`` > 1) in a call of at least ``FUSED_MIN_SCORES`` scores;
    numpy otherwise (a decode step is a short call: numba is not loaded for it)."""
    if half_cache:
        return "fused", "rule: a float16 cache, widened as it is loaded (numpy would copy it to float32)"
    kind = "grouped" if groups > 1 else "ungrouped"
    table = None if tuned is None else tuned.get(kind)
    if table:
        sizes = sorted(int(n) for n in table)
        at = max((n for n in sizes if n <= n_k), default=sizes[0])
        kernel = table[str(at)]
        return kernel, f"tune profile: {kernel} measured faster for {kind} heads at {at} keys"
    if groups > 1 and scores >= _kernels.FUSED_MIN_SCORES:
        return "fused", f"rule: grouped heads, {scores:,} scores >= FUSED_MIN_SCORES"
    if groups > 1:
        return "numpy", (f"rule: {scores:,} scores < FUSED_MIN_SCORES ({_kernels.FUSED_MIN_SCORES:,}): numba is not "
                         "worth loading")
    return "numpy", "rule: one query head per key/value head streams faster through BLAS"


def decode_choice(c: Checked, scores: int) -> tuple[str, str]:
    """Which kernel the decode step of ``c`` (``scores`` scores) runs, and why: numpy without numba, with
    ``ATTNLAB_NO_NUMBA`` or where the fused kernel does not fit; ``ATTNLAB_KERNEL`` forces one; else
    :func:`decode_kernel_rule` with the tune profile's table when one applies. Loads numba for "fused"."""
    if _kernels.numba_disabled():
        return "numpy", f"{_kernels.NO_NUMBA_ENV} is set"
    if c.sink is not None:
        return "numpy", "the fused decode kernel takes no sink"
    forced = _kernels.forced_kernel()
    if forced is not None:
        kernel, reason = _kernels.kernel_choice(scores)            # the forced kernel, numba loaded or refused
    elif not _kernels.numba_installed():
        return "numpy", "numba is not installed"
    else:
        kernel, reason = decode_kernel_rule(scores, c.groups, c.k.shape[-2], profile.choice("decode"),
                                            half_cache=half_cache(c))
    if kernel == "fused" and not fused_fits(c):
        return "numpy", "the fused decode kernel does not take broadcast heads or d_head 0"
    if kernel == "fused" and _kernels.load_fused() is None:
        return "numpy", "numba failed to import"
    return kernel, reason


def half_cache(c: Checked) -> bool:
    """Whether the keys and values are a float16 cache's, kept so for a float32 query (:func:`attnlab.kernels.
    attention.attend` keeps them for the decode path only)."""
    return c.k.dtype != c.q.dtype


def widened(c: Checked) -> Checked:
    """``c`` with its keys and values in the compute dtype (a float16 cache's copied to float32)."""
    if not half_cache(c):
        return c
    return replace(c, k=c.k.astype(c.q.dtype), v=c.v.astype(c.q.dtype))   # (..., h_kv, n_k, d) copies


def fused_fits(c: Checked) -> bool:
    """Whether the fused kernel takes these inputs: the key/value heads' leading axes are the query's (no
    broadcasting), and d_head > 0 (d_head 0, the uniform average, stays with numpy)."""
    return c.q.shape[:-3] == c.k.shape[:-3] == c.v.shape[:-3] and c.q.ndim >= 3 and c.q.shape[-1] > 0


def decode_attention(c: Checked, kernel: str | None = None) -> np.ndarray:
    """The decode step's output (..., h, 1, d_v) in the compute dtype: the fused kernel when ``kernel`` is
    "fused" (None: :func:`decode_choice` decides) and the key/value heads' leading axes
    are the query's (no broadcasting), else numpy.

    Every key is visible, so the row max is finite and the sum is at least 1; the output is divided by the
    sum instead of the weights.
    """
    kernel = decode_choice(c, 0)[0] if kernel is None else kernel
    if kernel == "fused" and fused_fits(c) and c.sink is None:
        return _decode_fused(c)
    if half_cache(c) and c.sink is None:
        return _decode_half_numpy(c)
    c = widened(c)                                       # numpy computes in one dtype
    if c.sink is not None:
        return _decode_with_sink(c)
    g = c.groups
    qs = fold(c.q * c.scale, g)                          # (..., h_kv, g, d_k) scaled once, not the scores
    if c.k.shape[-2] >= KEYS_FIRST:                      # K (q)ᵀ: BLAS streams the cache's rows as they lie
        s = np.ascontiguousarray((c.k @ qs.swapaxes(-1, -2)).swapaxes(-1, -2))   # (..., h_kv, g, n_k)
    else:
        s = qs @ c.k.swapaxes(-1, -2)                    # (..., h_kv, g, n_k) S = q Kᵀ/√d_k
    s = cap_scores(s, c.softcap)                         # (..., h_kv, g, n_k) cap · tanh(S / cap), or S
    s -= np.maximum.reduce(s, axis=-1, keepdims=True)    # (..., h_kv, g, n_k) (s.max, without its Python layer)
    p = np.exp(s, out=s)                                 # (..., h_kv, g, n_k) unnormalised weights
    out = p @ c.v                                        # (..., h_kv, g, d_v)
    out /= np.add.reduce(p, axis=-1, keepdims=True)      # (..., h_kv, g, d_v) out = Σ_j a_j v_j
    return unfold(out, g)                                # (..., h, 1, d_v)


def _decode_with_sink(c: Checked) -> np.ndarray:
    """:func:`decode_attention` with a learned sink (:mod:`attnlab.kernels.sinks`): the sink joins each row's
    max and sum, and adds no value. (..., h, 1, d_v)."""
    g = c.groups
    qs = fold(c.q * c.scale, g)                          # (..., h_kv, g, d_k)
    s = cap_scores(qs @ c.k.swapaxes(-1, -2), c.softcap)   # (..., h_kv, g, n_k)
    sink = fold(np.broadcast_to(c.sink, c.batch)[..., None, None], g)   # (..., h_kv, g, 1)
    m = np.maximum(np.maximum.reduce(s, axis=-1, keepdims=True), sink)  # (..., h_kv, g, 1)
    s -= m
    p = np.exp(s, out=s)                                 # (..., h_kv, g, n_k)
    out = p @ c.v                                        # (..., h_kv, g, d_v)
    out /= np.add.reduce(p, axis=-1, keepdims=True) + np.exp(sink - m)   # the sink in the sum only
    return unfold(out, g)                                # (..., h, 1, d_v)


def _decode_half_numpy(c: Checked) -> np.ndarray:
    """:func:`decode_attention` against a float16 cache as llama.cpp computes it (:func:`attnlab.kernels._fused.
    decode_half` without numba): q rounded to float16, the weights normalised, then rounded to float16, their
    sum of the widened values in float32. (..., h, 1, d_v)."""
    g = c.groups
    q16 = c.q.astype(np.float16).astype(c.q.dtype)      # (..., h, 1, d_k) q as ggml's F16 vec_dot_type
    qs = fold(q16 * c.scale, g)                          # (..., h_kv, g, d_k)
    s = qs @ c.k.astype(c.q.dtype).swapaxes(-1, -2)      # (..., h_kv, g, n_k)
    s = cap_scores(s, c.softcap)
    s -= np.maximum.reduce(s, axis=-1, keepdims=True)
    p = np.exp(s, out=s)                                 # (..., h_kv, g, n_k) unnormalised
    p /= np.add.reduce(p, axis=-1, keepdims=True)        # normalised, then rounded as llama.cpp's F16 product
    a = p.astype(np.float16).astype(c.q.dtype)           # (..., h_kv, g, n_k)
    return unfold(a @ c.v.astype(c.q.dtype), g)          # (..., h, 1, d_v)


def _decode_fused(c: Checked) -> np.ndarray:
    """:func:`decode_attention` by :func:`attnlab.kernels._fused.decode_tiles`: (..., h, 1, d_v). A float16
    cache goes in as its bits (uint16 views: numba computes no float16), widened in the kernel."""
    *lead, h, _, d_k = c.q.shape
    h_kv, n_k, d_v = c.k.shape[-3], c.k.shape[-2], c.v.shape[-1]
    g, n_b = h // h_kv, math.prod(lead)                  # n_b given, not -1: d_k = 0 has no size to infer
    half = half_cache(c)
    k, v = (c.k.view(np.uint16), c.v.view(np.uint16)) if half else (c.k, c.v)
    q = c.q.reshape(n_b, h_kv, g, d_k)                   # (B, h_kv, g, d_k) the query heads of each group
    k = k.reshape(n_b, h_kv, n_k, d_k)                   # (B, h_kv, n_k, d_k) views of the cache
    v = v.reshape(n_b, h_kv, n_k, d_v)                   # (B, h_kv, n_k, d_v)
    out = np.empty((n_b, h_kv, g, d_v), c.q.dtype)       # (B, h_kv, g, d_v)
    cap2 = 0.0 if c.softcap is None else c.softcap * _kernels.LOG2E   # the cap in base 2; 0 = none
    fused, scale2 = _kernels.fused_module(), c.q.dtype.type(c.scale * _kernels.LOG2E)
    if half:                                             # llama.cpp's arithmetic against its float16 cache
        fused.decode_half(q, k, v, scale2, out, c.q.dtype.type(cap2))
    else:
        fused.decode_tiles(q, k, v, scale2, out, c.q.dtype.type(cap2), fused.DECODE_TILE)
    return out.reshape(*lead, h, 1, d_v)                 # (..., h, 1, d_v)
