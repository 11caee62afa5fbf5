"""Per-head summary numbers: how spread out each head's weights are and where they usually go."""

from __future__ import annotations

import numpy as np

from ..attnmap import AttentionMap

SUMMARY_FIELDS = {
    "entropy": "mean entropy of a query's weights, in bits (0 = all on one key)",
    "max": "mean of each query's largest weight",
    "self": "mean weight a query puts on its own token",
    "prev": "mean weight on the token just before",
    "first": "mean weight on the first token",
}


def head_summary(amap: AttentionMap) -> dict[str, np.ndarray]:
    """For every layer and head, the numbers in ``SUMMARY_FIELDS``, each an (n_layers, n_heads) array.

    Queries are aligned bottom-right with the keys, as the causal mask is: query i is token
    ``i + n_k - n_q``. A query that sees nothing (all weights 0) counts with entropy 0 and max 0.

    >>> m = AttentionMap(tokens=("a", "b"), weights=np.array([[1.0, 0.0], [0.5, 0.5]]))
    >>> {k: round(float(v[0, 0]), 3) for k, v in head_summary(m).items()}
    {'entropy': 0.5, 'max': 0.75, 'self': 0.75, 'prev': 0.5, 'first': 0.75}
    """
    if not isinstance(amap, AttentionMap):
        raise TypeError(f"amap must be an attnlab.AttentionMap, got {type(amap).__name__}")
    n_q, n_k = amap.weights.shape[-2:]
    q = np.arange(n_q)                                                   # (n_q,)
    me = q + n_k - n_q                                                   # (n_q,) each query's own key
    has_prev = me >= 1                                                   # (n_q,)
    rows = [_layer_summary(a.astype(np.float64), q, me, has_prev) for a in amap.weights]   # a: (h, n_q, n_k)
    return {k: np.stack([r[k] for r in rows]) for k in SUMMARY_FIELDS}  # (L, h) each


def _layer_summary(a: np.ndarray, q, me, has_prev) -> dict[str, np.ndarray]:
    """The summary of one layer's (h, n_q, n_k) weights, each an (h,) array (one layer at a time: less memory)."""
    log2a = np.log2(a, out=np.zeros_like(a), where=a > 0)               # (h, n_q, n_k), 0 where a = 0
    prev = a[:, q[has_prev], me[has_prev] - 1]                           # (h, n_prev)
    return {
        "entropy": -(a * log2a).sum(-1).mean(-1),                        # (h,)
        "max": a.max(-1).mean(-1),                                       # (h,)
        "self": a[:, q, me].mean(-1),                                    # (h,)
        "prev": prev.mean(-1) if prev.shape[-1] else np.zeros(a.shape[0]),
        "first": a[..., 0].mean(-1),                                     # (h,)
    }
