"""An AttentionMap from untrained random layers, for trying the pictures without a trained model.

The weights mean nothing (as in the guide's own random examples); they only have the right shape,
the causal mask, and enough contrast to see.
"""

from __future__ import annotations

import numpy as np

from ..kernels._checks import as_positive_float, as_positive_int, check_rng
from .attnmap import AttentionMap
from ..layer.config import AttentionConfig
from ..kernels.masks import causal_mask
from ..stack.layers import layer_norm
from ..layer.multihead import MultiHeadAttention

DEMO_CONFIG = AttentionConfig(d_model=32, n_heads=4, n_ctx=1024)   # small: fast in tests, enough heads to see


def demo_map(tokens, *, rng: np.random.Generator, n_layers: int = 2,
             config: AttentionConfig = DEMO_CONFIG, std: float | None = None) -> AttentionMap:
    """Causal attention weights of ``n_layers`` random layers run one after another on random inputs.

    Each layer reads the residual stream normalised row by row (as GPT-2's layer norm does before
    attention) and adds its output to it. ``std`` defaults to 1.4/√d_model, far above GPT-2's 0.02, so
    that the random heads are peaked enough to look at without all being one-hot.

    >>> m = demo_map(["The", " cat", " sat"], rng=np.random.default_rng(0))
    >>> m.weights.shape, bool(m.keep[0, 1])
    ((2, 4, 3, 3), False)
    """
    check_rng(rng)
    tokens = tuple(tokens)
    n_layers = as_positive_int("n_layers", n_layers)
    if not isinstance(config, AttentionConfig):
        raise TypeError(f"config must be an AttentionConfig, got {type(config).__name__}")
    if not tokens:
        raise ValueError("tokens must hold at least one token, got none")
    std = 1.4 / np.sqrt(config.d_model) if std is None else as_positive_float("std", std)
    x = rng.normal(size=(len(tokens), config.d_model))           # (n, d_model)
    grids = []
    for _ in range(n_layers):
        layer = MultiHeadAttention.init(config, rng=rng, std=std, dtype=np.float64)
        x_norm = layer_norm(x, 1.0, 0.0, eps=0.0)                  # (n, d_model) no learned scale or shift
        y, a = layer.with_weights(x_norm, is_causal=True)          # (n, d_model), (h, n, n)
        x = x + y                                                 # (n, d_model)
        grids.append(a)
    return AttentionMap(tokens=tokens, weights=np.stack(grids),  # (n_layers, h, n, n)
                        keep=causal_mask(len(tokens)), source="demo: random untrained layers")
