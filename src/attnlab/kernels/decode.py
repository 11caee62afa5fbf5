"""The decode step: one query per head against a KV cache, every cached key visible.

Generation runs this once per new token: the step streams every cached key and value once, so it is
memory-bound, and it takes as few passes over the scores as it can (the naive path's extra passes and
allocations cost it 40% at 1024 tokens). With grouped-query attention the query heads of a group are one
(g, d_k) @ (d_k, n_k) matmul against their key/value head: each cached head is read once per group.
"""

from __future__ import annotations

import numpy as np

from ._checks import Checked, cap_scores, fold, unfold


def takes_decode_path(c: Checked) -> bool:
    """True for one query per head against at least one key, every key visible (causality with the default
    q_offset hides nothing from the last position), no bias."""
    return (c.q.shape[-2] == 1 and c.k.shape[-2] > 0 and c.keep is None and c.bias is None
            and not c.causal_hides_keys)


def decode_attention(c: Checked) -> np.ndarray:
    """The decode step's output (..., h, 1, d_v) in the compute dtype.

    Every key is visible, so the row max is finite and the sum is at least 1; the output is divided by the
    sum instead of the weights.
    """
    g = c.groups
    qs = fold(c.q * c.scale, g)                          # (..., h_kv, g, d_k) scaled once, not the scores
    s = qs @ np.swapaxes(c.k, -1, -2)                    # (..., h_kv, g, n_k) S = q Kᵀ/√d_k
    s = cap_scores(s, c.softcap)                         # (..., h_kv, g, n_k) cap · tanh(S / cap), or S
    s -= s.max(axis=-1, keepdims=True)                   # (..., h_kv, g, n_k)
    p = np.exp(s, out=s)                                 # (..., h_kv, g, n_k) unnormalised weights
    out = p @ c.v                                        # (..., h_kv, g, d_v)
    out /= p.sum(axis=-1, keepdims=True)                 # (..., h_kv, g, d_v) out = Σ_j a_j v_j
    return unfold(out, g)                                # (..., h, 1, d_v)
