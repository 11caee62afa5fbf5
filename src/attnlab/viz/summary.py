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
    a = amap.weights.astype(np.float64)                                  # (L, h, n_q, n_k)
    n_q, n_k = a.shape[-2:]
    q = np.arange(n_q)                                                   # (n_q,)
    me = q + n_k - n_q                                                   # (n_q,) each query's own key
    plogp = np.where(a > 0, a * np.log2(np.where(a > 0, a, 1.0)), 0.0)   # (L, h, n_q, n_k)
    has_prev = me >= 1                                                   # (n_q,)
    prev = a[..., q[has_prev], me[has_prev] - 1]                         # (L, h, n_prev)
    return {
        "entropy": -plogp.sum(-1).mean(-1),                              # (L, h)
        "max": a.max(-1).mean(-1),                                       # (L, h)
        "self": a[..., q, me].mean(-1),                                  # (L, h)
        "prev": prev.mean(-1) if prev.shape[-1] else np.zeros(a.shape[:2]),
        "first": a[..., 0].mean(-1),                                     # (L, h)
    }
