"""Per-head facts about an attention map: where each query looks most, how spread out, how far.

These are what people read off bertviz and TransformerLens: a head whose queries all pick the previous
token has mean distance 1, a "prev" weight near 1 and low entropy; a head that spreads evenly over n keys
has entropy log n. The CLI's ``attend --summary``, the tour and the HTML view's table all use this.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .attnmap import AttentionMap

# The (n_layers, n_heads) numbers of HeadSummary.table(), with what each means.
SUMMARY_FIELDS = {
    "entropy": "mean entropy of a query's weights, in nats (0 = all on one key, log n = spread evenly)",
    "distance": "mean attention distance Σ a·|i − j|, in positions",
    "max": "mean of each query's largest weight",
    "self": "mean weight a query puts on its own token",
    "prev": "mean weight on the token just before",
    "first": "mean weight on the first token",
}


@dataclass(frozen=True, eq=False)
class HeadSummary:
    """Facts for every head of an :class:`~attnlab.AttentionMap`, averaged over the queries.

    Query i sits at position ``i + n_k − n_q`` (bottom-right alignment, as the causal mask has it).
    A query that sees nothing (all weights 0) counts with entropy 0, distance 0 and max 0.
    """
    tokens: tuple[str, ...]
    top_key: np.ndarray       # (n_layers, n_heads, n_q) int: the most-attended key of each query
    top_weight: np.ndarray    # (n_layers, n_heads, n_q): its weight
    entropy: np.ndarray       # (n_layers, n_heads) −Σ a log a, nats
    distance: np.ndarray      # (n_layers, n_heads) Σ a·|i − j|
    max_weight: np.ndarray    # (n_layers, n_heads)
    self_weight: np.ndarray   # (n_layers, n_heads)
    prev_weight: np.ndarray   # (n_layers, n_heads)
    first_weight: np.ndarray  # (n_layers, n_heads)

    def table(self) -> dict[str, np.ndarray]:
        """The numbers named in ``SUMMARY_FIELDS``, each (n_layers, n_heads)."""
        return {"entropy": self.entropy, "distance": self.distance, "max": self.max_weight,
                "self": self.self_weight, "prev": self.prev_weight, "first": self.first_weight}

    def rows(self) -> list[dict]:
        """One dict per head, for printing and JSON."""
        n_layers, n_heads, n_q = self.top_key.shape
        q_tokens = self.tokens[len(self.tokens) - n_q:]
        return [{"layer": layer, "head": head, "entropy": float(self.entropy[layer, head]),
                 "mean_distance": float(self.distance[layer, head]),
                 "top_keys": [{"query": q_tokens[i], "key": self.tokens[j], "weight": float(w)}
                              for i, (j, w) in enumerate(zip(self.top_key[layer, head],
                                                             self.top_weight[layer, head]))]}
                for layer in range(n_layers) for head in range(n_heads)]


def summarize_heads(amap: AttentionMap) -> HeadSummary:
    """Most-attended key per query, entropy, mean attention distance and typical weights of every head.

    Examples
    --------
    A head that looks only at the previous token (the first token looks at itself):

    >>> a = np.array([[1., 0., 0.], [1., 0., 0.], [0., 1., 0.]])
    >>> s = summarize_heads(AttentionMap(("the", "cat", "sat"), a))
    >>> s.top_key[0, 0].tolist(), s.entropy[0, 0].round(3), s.distance[0, 0].round(3)
    ([0, 0, 1], np.float64(0.0), np.float64(0.667))
    >>> {k: round(float(v[0, 0]), 3) for k, v in s.table().items()}
    {'entropy': 0.0, 'distance': 0.667, 'max': 1.0, 'self': 0.333, 'prev': 1.0, 'first': 0.667}
    """
    if not isinstance(amap, AttentionMap):
        raise TypeError(f"amap must be an attnlab.AttentionMap, got {type(amap).__name__}")
    n_q, n_k = amap.weights.shape[-2:]
    q = np.arange(n_q)                                             # (n_q,)
    me = q + n_k - n_q                                             # (n_q,) each query's own key
    dist = np.abs(me[:, None] - np.arange(n_k)[None, :])           # (n_q, n_k) |i − j|
    layers = [_layer_facts(a.astype(np.float64), q, me, dist) for a in amap.weights]   # a: (h, n_q, n_k)
    return HeadSummary(tokens=amap.tokens, **{k: np.stack([f[k] for f in layers])   # (n_layers, h, ...) each
                                              for k in layers[0]})


def _layer_facts(a: np.ndarray, q, me, dist) -> dict[str, np.ndarray]:
    """One layer's (h, n_q, n_k) weights summed up (a layer at a time: less memory for long inputs)."""
    log_a = np.log(a, out=np.zeros_like(a), where=a > 0)           # (h, n_q, n_k), 0 where a = 0
    top = a.argmax(-1)                                             # (h, n_q)
    has_prev = me >= 1                                             # (n_q,)
    prev = a[:, q[has_prev], me[has_prev] - 1]                     # (h, n_prev)
    return {
        "top_key": top,
        "top_weight": np.take_along_axis(a, top[..., None], -1)[..., 0],   # (h, n_q)
        "entropy": 0.0 - (a * log_a).sum(-1).mean(-1),                     # (h,) 0.0 −: never −0.0
        "distance": (a * dist).sum(-1).mean(-1),                           # (h,)
        "max_weight": a.max(-1).mean(-1),                                  # (h,)
        "self_weight": a[:, q, me].mean(-1),                               # (h,)
        "prev_weight": prev.mean(-1) if prev.shape[-1] else np.zeros(a.shape[0]),   # (h,)
        "first_weight": a[..., 0].mean(-1),                                # (h,)
    }
