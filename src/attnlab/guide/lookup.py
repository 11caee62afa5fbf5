"""The soft lookup: a query against every key, a softmax of the scores, a weighted sum of the values.

The guide's hand example is the query of "sat" against the keys of "the cat sat"; a dictionary's hard
lookup is the limit where one score towers over the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels._checks import as_finite_float, as_float_array
from ..kernels.attention import attention, attention_weights
from ..kernels.softmax import softmax

TOKENS = ("the", "cat", "sat")
QUERY = np.array([1., 0.])                                # (2,) query of sat
KEYS = np.array([[0., 0.], [2., 0.], [1., 1.]])           # (3, 2) keys of the, cat, sat
VALUES = np.array([[1., 0.], [0., 1.], [1., 1.]])         # (3, 2) values of the, cat, sat
HARD_SCORE = 20.0                                         # the guide pushes cat's score from 2 to this


@dataclass(frozen=True, eq=False)
class Lookup:
    """Every step of one soft lookup."""
    query: np.ndarray        # (d_k,)
    keys: np.ndarray         # (n, d_k)
    values: np.ndarray       # (n, d_v)
    products: np.ndarray     # (n, d_k) query · key slot by slot; each row sums to a score
    scores: np.ndarray       # (n,) q · k_j, times scale
    scale: float             # 1, or 1/√d_k
    weights: np.ndarray      # (n,) softmax(scores)
    output: np.ndarray       # (d_v,) weights @ values


def soft_lookup(query=QUERY, keys=KEYS, values=VALUES, *, scaled: bool = False) -> Lookup:
    """One query against ``keys``; with ``scaled=True`` the scores are divided by √d_k.

    Examples
    --------
    >>> r = soft_lookup()
    >>> r.scores.tolist(), r.weights.round(3).tolist(), r.output.round(3).tolist()
    ([0.0, 2.0, 1.0], [0.09, 0.665, 0.245], [0.335, 0.91])
    >>> soft_lookup(scaled=True).weights.round(3).tolist()
    [0.14, 0.576, 0.284]
    """
    q = as_float_array("query", query, finite=True)
    if q.ndim != 1:
        raise ValueError(f"query must be one vector (d_k,), got shape {q.shape}")
    k = as_float_array("keys", keys, finite=True)
    v = as_float_array("values", values, finite=True)
    for name, arr in (("keys", k), ("values", v)):
        if arr.ndim != 2:
            raise ValueError(f"{name} must be a matrix with one row per token, got shape {arr.shape}")
    scale = 1 / np.sqrt(q.shape[0]) if scaled else 1.0
    out = attention(q[None], k, v, scale=scale)                             # (1, d_v)
    a = attention_weights(q[None], k, scale=scale)                          # (1, n)
    products = k * q                                                        # (n, d_k)
    return Lookup(query=q, keys=k, values=v, products=products, scores=products.sum(axis=1) * scale,
                  scale=float(scale), weights=a[0], output=out[0])


def hard_lookup(lookup: Lookup | None = None, *, index: int | None = None,
                score: float = HARD_SCORE) -> tuple[np.ndarray, np.ndarray]:
    """Push one score up to ``score`` (default: the top score, to 20) and redo the softmax and the sum.

    Returns the weights (n,) and the output (d_v,). The guide's cat at 20 takes more than 0.999999.

    >>> w, out = hard_lookup()
    >>> bool(w[1] > 0.999999), out.round(6).tolist()
    (True, [0.0, 1.0])
    """
    r = soft_lookup() if lookup is None else lookup
    score = as_finite_float("score", score)
    s = r.scores.copy()                                                     # (n,)
    index = int(np.argmax(s)) if index is None else index
    if not -len(s) <= index < len(s):
        raise ValueError(f"index must pick one of the {s.size} scores, got {index}")
    s[index] = score                                                        # (n,)
    a = softmax(s)                                                          # (n,)
    return a, a @ r.values                                                  # (n,), (d_v,)
