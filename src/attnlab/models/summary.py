"""Per-head facts about an attention map: where each query looks most, how spread out, how far.

These are what people read off bertviz and TransformerLens: a head whose queries all pick the previous
token has mean distance 1 and low entropy; a head that spreads evenly over n keys has entropy log n.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..attnmap import AttentionMap


@dataclass(frozen=True, eq=False)
class HeadSummary:
    """Facts for every head of an :class:`~attnlab.AttentionMap`.

    Entropy is in nats, averaged over the queries; distance is ``Σ_j a_ij |i − j|`` in positions, averaged
    over the queries (query i sits at position ``i + n_k − n_q``).
    """
    tokens: tuple[str, ...]
    top_key: np.ndarray      # (n_layers, n_heads, n_q) int: the most-attended key of each query
    top_weight: np.ndarray   # (n_layers, n_heads, n_q): its weight
    entropy: np.ndarray      # (n_layers, n_heads) mean over queries of −Σ a log a
    distance: np.ndarray     # (n_layers, n_heads) mean over queries of Σ a·|i − j|

    def rows(self) -> list[dict]:
        """One dict per head, for printing and JSON."""
        n_layers, n_heads, n_q = self.top_key.shape
        q_tokens = self.tokens[len(self.tokens) - n_q:]
        return [{"layer": layer, "head": head, "entropy": float(self.entropy[layer, head]),
                 "mean_distance": float(self.distance[layer, head]),
                 "top_keys": [{"query": q_tokens[i], "key": self.tokens[j], "weight": float(w)}
                              for i, (j, w) in enumerate(zip(self.top_key[layer, head], self.top_weight[layer, head]))]}
                for layer in range(n_layers) for head in range(n_heads)]


def summarize_heads(amap: AttentionMap) -> HeadSummary:
    """Most-attended key per query, entropy and mean attention distance of every head.

    Examples
    --------
    A head that looks only at the previous token (the first token looks at itself):

    >>> a = np.array([[1., 0., 0.], [1., 0., 0.], [0., 1., 0.]])
    >>> s = summarize_heads(AttentionMap(("the", "cat", "sat"), a))
    >>> s.top_key[0, 0].tolist(), s.entropy[0, 0].round(3), s.distance[0, 0].round(3)
    ([0, 0, 1], np.float64(0.0), np.float64(0.667))
    """
    if not isinstance(amap, AttentionMap):
        raise TypeError(f"amap must be an attnlab.AttentionMap, got {type(amap).__name__}")
    a = amap.weights.astype(np.float64)                            # (L, h, n_q, n_k)
    n_q, n_k = a.shape[-2:]
    pos_q = np.arange(n_q)[:, None] + (n_k - n_q)                  # (n_q, 1) absolute positions
    pos_k = np.arange(n_k)[None, :]                                # (1, n_k)
    plogp = np.where(a > 0, a * np.log(np.where(a > 0, a, 1.0)), 0.0)   # (L, h, n_q, n_k) 0·log 0 = 0
    top = a.argmax(axis=-1)                                        # (L, h, n_q)
    return HeadSummary(tokens=amap.tokens, top_key=top,
                       top_weight=np.take_along_axis(a, top[..., None], axis=-1)[..., 0],   # (L, h, n_q)
                       entropy=0.0 - plogp.sum(axis=-1).mean(axis=-1),                      # (L, h) 0.0 -, not -0.0
                       distance=(a * np.abs(pos_q - pos_k)).sum(axis=-1).mean(axis=-1))    # (L, h)
