"""Partial softmaxes and their merge by log-sum-exp: the arithmetic under every distributed path.

Attention over keys split into parts K₁ … K_m is exact if each part returns its normalised output and
its log-sum-exp, ``(out_i, lse_i)`` with ``lse_i = log Σ_{j∈K_i} exp(s_j)``; two partials merge as::

    lse = logaddexp(lse₁, lse₂)
    out = e^(lse₁ − lse) · out₁ + e^(lse₂ − lse) · out₂

which is associative, so partials merge in any tree (Flash-Decoding, Ring Attention). A part where a
query saw no key has ``lse = −inf`` and out 0 and weighs nothing; a query that saw no key anywhere keeps
out 0 and lse −inf. Plain numpy: this module imports nothing of Dask and runs on the workers.
"""

from __future__ import annotations

import numpy as np

from ..kernels._checks import fold, unfold
from ..kernels.attention import attention
from ..kernels.tiled import Plan


def merge_partials(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]):
    """Merge two partials ``(out, lse)`` of the same queries over disjoint keys; returns ``(out, lse)``.

    out (..., n_q, d_v) and lse (..., n_q), both in the compute dtype.

    >>> one = (np.array([[1.0, 0.0]]), np.array([0.0]))        # a part whose Σ exp(s) is 1
    >>> two = (np.array([[0.0, 1.0]]), np.array([np.log(3)]))  # one whose Σ exp(s) is 3
    >>> out, lse = merge_partials(one, two)
    >>> out, np.exp(lse)
    (array([[0.25, 0.75]]), array([4.]))
    """
    (out_a, lse_a), (out_b, lse_b) = a, b
    lse = np.logaddexp(lse_a, lse_b)                         # (..., n_q) -inf only if both are -inf
    seen = lse > -np.inf                                     # (..., n_q)
    ref = np.where(seen, lse, 0)                             # (..., n_q) a row that saw nothing: weights 0
    w_a = np.exp(lse_a - ref)[..., None]                     # (..., n_q, 1) e^(lse₁ − lse)
    w_b = np.exp(lse_b - ref)[..., None]                     # (..., n_q, 1) e^(lse₂ − lse)
    out = w_a * out_a                                        # (..., n_q, d_v)
    out += w_b * out_b                                       # (..., n_q, d_v)
    return out, lse


def merge_tree(partials: list, merge=merge_partials):
    """Merge a list of partials pairwise, as a balanced tree: each level merges neighbours two by two, an
    odd last one moves up as it is. ``merge(a, b)`` merges two of them: by default :func:`merge_partials`
    on ``(out, lse)`` arrays; :func:`attnlab.distributed.sequence.submit_pairs` passes one that submits
    that merge as a Dask task on futures, so the workers merge in this same order."""
    while len(partials) > 1:
        partials = [merge(*partials[i:i + 2]) if i + 1 < len(partials) else partials[i]
                    for i in range(0, len(partials), 2)]
    return partials[0]


def attend_part(query, key, value, *, is_causal, window, q_offset, scale, workers=1):
    """One (query block, key shard) pair: the front door's tiled path with the shard's offset, returning
    ``(out, lse)`` in the compute dtype (float16 inputs are lifted to float32 before, not after)."""
    dt = np.result_type(np.float32, query, key, value)
    return attention(np.asarray(query, dt), key, value, is_causal=is_causal, window=window, q_offset=q_offset,
                     scale=scale, implementation="tiled", return_lse=True, workers=workers)


def decode_part(query, key, value, *, scale: float, groups: int = 1):
    """A decode step's partial against one shard where every key is visible: ``(out, lse)``.

    query (..., h, t, d_k), key and value (..., h_kv, n, d) with h = groups · h_kv; the same arithmetic
    as the single-process decode step, plus the lse that the merge needs. No copy of the keys is made.
    """
    qs = fold(query * query.dtype.type(scale), groups)        # (..., h_kv, g·t, d_k) scaled once, its dtype
    s = qs @ np.swapaxes(key, -1, -2)                         # (..., h_kv, g·t, n) S = q Kᵀ/√d_k
    m = s.max(axis=-1, keepdims=True)                         # (..., h_kv, g·t, 1)
    s -= m
    p = np.exp(s, out=s)                                      # (..., h_kv, g·t, n) unnormalised weights
    l = p.sum(axis=-1, keepdims=True)                         # (..., h_kv, g·t, 1) ≥ 1
    out = p @ value                                           # (..., h_kv, g·t, d_v)
    out /= l
    lse = (m + np.log(l))[..., 0]                             # (..., h_kv, g·t)
    return unfold(out, groups), unfold(lse[..., None], groups)[..., 0]   # (..., h, t, d_v), (..., h, t)


def split_even(n: int, parts: int) -> list[tuple[int, int]]:
    """[0, n) in ``parts`` contiguous pieces whose sizes differ by at most one (none empty when n >= parts)."""
    edges = [n * i // parts for i in range(parts + 1)]
    return [(a, b) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def pair_cost(n_q: int, n_k: int, q_block: tuple[int, int], k_shard: tuple[int, int], *, is_causal: bool,
              window: int | None) -> int:
    """How many scores of the global (n_q, n_k) grid (bottom-right causal, optional window) fall in the
    pair (query rows ``q_block``, keys ``k_shard``): 0 for a pair that causality or the window hides."""
    (i0, i1), (s0, s1) = q_block, k_shard
    if not is_causal:
        return (i1 - i0) * (s1 - s0)
    plan = Plan(n_q=n_q, n_k=n_k, block_q=max(1, n_q), block_k=max(1, n_k), is_causal=True, window=window)
    lo, hi = plan.key_span(i0, i1)
    if hi <= s0 or lo >= s1 or hi <= lo:
        return 0
    pos = np.arange(i0, i1, dtype=np.int64) + plan.offset              # (bq,) each query's key position
    first = np.zeros_like(pos) if window is None else pos - window + 1  # (bq,) its first visible key
    seen = np.minimum(pos + 1, s1) - np.maximum(first, s0)             # (bq,) visible keys in the shard
    return int(np.clip(seen, 0, None).sum())
