"""Several heads at once: multi-head attention on GPT-2 small's shapes, with the guide's random numbers.

The guide draws X (5, 768) from default_rng(0) and then W_Q, W_K, W_V, W_O from N(0, 0.02²), runs the
12 heads with the causal mask, and prints the shapes on the way: (12, 5, 64) (12, 5, 5) (12, 5, 64)
(5, 768) (5, 768).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels._checks import as_positive_int, check_rng
from ..layer.config import GPT2_SMALL, AttentionConfig
from ..layer.multihead import MultiHeadAttention, merge_heads, split_heads

SEED = 0                     # the guide's seed for X and the four matrices
STD = 0.02                   # GPT-2's initial scale


@dataclass(frozen=True, eq=False)
class HeadsRun:
    config: AttentionConfig
    q: np.ndarray            # (h, n, d_head) queries, one slice per head
    weights: np.ndarray      # (h, n, n) one grid of weights per head
    heads_out: np.ndarray    # (h, n, d_head) each head's AV
    joined: np.ndarray       # (n, h·d_head) heads side by side
    y: np.ndarray            # (n, d_model) after W_O
    n_params: int            # the layer's W_Q, W_K, W_V, W_O and biases, counted from its arrays

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The guide's printed line: Q, S (and A), AV, joined, joined @ W_O."""
        return {"Q": self.q.shape, "S": self.weights.shape, "AV": self.heads_out.shape,
                "joined": self.joined.shape, "output": self.y.shape}


def run_heads(n: int = 5, config: AttentionConfig = GPT2_SMALL, *, rng: np.random.Generator) -> HeadsRun:
    """Draw X (n, d_model) then W_Q, W_K, W_V, W_O as the guide does, and run causal multi-head attention.

    >>> list(run_heads(rng=np.random.default_rng(SEED)).shapes.values())
    [(12, 5, 64), (12, 5, 5), (12, 5, 64), (5, 768), (5, 768)]
    """
    check_rng(rng)
    n = as_positive_int("n", n)
    d, width = config.d_model, config.n_heads * config.d_head
    x = rng.normal(size=(n, d))                                           # (n, d_model) stand-in tokens
    W_Q, W_K, W_V = (rng.normal(0, STD, (d, width)) for _ in range(3))    # (d_model, h·d_head) each
    W_O = rng.normal(0, STD, (width, d))                                  # (h·d_head, d_model)
    layer = MultiHeadAttention(W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, b_Q=np.zeros(width), b_K=np.zeros(width),
                               b_V=np.zeros(width), b_O=np.zeros(d), config=config)
    y, a = layer.with_weights(x, is_causal=True)                          # (n, d_model), (h, n, n)
    q = split_heads(x @ W_Q, config.n_heads)                              # (h, n, d_head)
    v = split_heads(x @ W_V, config.n_heads)                              # (h, n, d_head)
    heads_out = a @ v                                                     # (h, n, d_head)
    joined = merge_heads(heads_out)                                       # (n, h·d_head)
    assert np.allclose(joined @ W_O, y)
    return HeadsRun(config=config, q=q, weights=a, heads_out=heads_out, joined=joined, y=y,
                    n_params=layer.n_params)
