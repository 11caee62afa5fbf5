"""The decode step: one query per head against a KV cache, every cached key visible.

Generation runs this once per new token: the step streams every cached key and value once, so it is
memory-bound, and it takes as few passes over the scores as it can (the naive path's extra passes and
allocations cost it 40% at 1024 tokens). With grouped-query attention the query heads of a group are one
(g, d_k) @ (d_k, n_k) matmul against their key/value head: each cached head is read once per group.

With numba (the extra ``attnlab[fast]``) the whole step is one call of a fused kernel
(:func:`attnlab.kernels._fused.decode_groups`): scores, the softmax and the weighted sum of every key/value
head and its group, each cached key and value read once, no temporaries; numpy takes seven calls and two
(h, n_k) temporaries. ``ATTNLAB_NO_NUMBA=1`` (or numba missing) keeps the numpy path.
"""

from __future__ import annotations

import numpy as np

from . import _kernels
from ._checks import Checked, cap_scores, fold, unfold


def takes_decode_path(c: Checked) -> bool:
    """True for one query per head against at least one key, every key visible (causality with the default
    q_offset hides nothing from the last position), no bias."""
    return (c.q.shape[-2] == 1 and c.k.shape[-2] > 0 and c.keep is None and c.bias is None
            and not c.causal_hides_keys)


def decode_attention(c: Checked, kernel: str | None = None) -> np.ndarray:
    """The decode step's output (..., h, 1, d_v) in the compute dtype: the fused kernel when ``kernel`` is
    "fused" (None: :func:`attnlab.kernels._kernels.tile_kernel` decides) and the key/value heads' leading axes
    are the query's (no broadcasting), else numpy.

    Every key is visible, so the row max is finite and the sum is at least 1; the output is divided by the
    sum instead of the weights.
    """
    kernel = _kernels.tile_kernel() if kernel is None else kernel
    if (kernel == "fused" and c.q.shape[:-3] == c.k.shape[:-3] == c.v.shape[:-3] and c.q.ndim >= 3
            and c.q.shape[-1] > 0):                      # d_head 0 (the uniform average) stays with numpy
        return _decode_fused(c)
    g = c.groups
    qs = fold(c.q * c.scale, g)                          # (..., h_kv, g, d_k) scaled once, not the scores
    s = qs @ np.swapaxes(c.k, -1, -2)                    # (..., h_kv, g, n_k) S = q Kᵀ/√d_k
    s = cap_scores(s, c.softcap)                         # (..., h_kv, g, n_k) cap · tanh(S / cap), or S
    s -= s.max(axis=-1, keepdims=True)                   # (..., h_kv, g, n_k)
    p = np.exp(s, out=s)                                 # (..., h_kv, g, n_k) unnormalised weights
    out = p @ c.v                                        # (..., h_kv, g, d_v)
    out /= p.sum(axis=-1, keepdims=True)                 # (..., h_kv, g, d_v) out = Σ_j a_j v_j
    return unfold(out, g)                                # (..., h, 1, d_v)


def _decode_fused(c: Checked) -> np.ndarray:
    """:func:`decode_attention` by :func:`attnlab.kernels._fused.decode_groups`: (..., h, 1, d_v)."""
    *lead, h, _, d_k = c.q.shape
    h_kv, n_k, d_v = c.k.shape[-3], c.k.shape[-2], c.v.shape[-1]
    g, n_b = h // h_kv, int(np.prod(lead, dtype=np.int64))   # n_b given, not -1: d_k = 0 has no size to infer
    q = c.q.reshape(n_b, h_kv, g, d_k)                   # (B, h_kv, g, d_k) the query heads of each group
    k = c.k.reshape(n_b, h_kv, n_k, d_k)                 # (B, h_kv, n_k, d_k) views of the cache
    v = c.v.reshape(n_b, h_kv, n_k, d_v)                 # (B, h_kv, n_k, d_v)
    out = np.empty((q.shape[0], h_kv, g, d_v), c.q.dtype)   # (B, h_kv, g, d_v)
    s = np.empty((g, n_k), c.q.dtype)                    # (g, n_k) scratch: one group's scores
    cap2 = 0.0 if c.softcap is None else c.softcap * _kernels.LOG2E   # the cap in base 2; 0 = none
    _kernels.fused_module().decode_groups(q, k, v, c.q.dtype.type(c.scale * _kernels.LOG2E), out, s,
                                          c.q.dtype.type(cap2))
    return out.reshape(*lead, h, 1, d_v)                 # (..., h, 1, d_v)
