"""AttentionMap: the weights of every layer and head for one input, with its tokens.

This is what the pictures draw (PNG, HTML, terminal) and what the model commands return. It is data only:
the views import it, never the other way round (in Jupyter, ``attnlab.viz.show(amap)`` displays the HTML view).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import as_bool_array, as_float_array


@dataclass(frozen=True, eq=False)
class AttentionMap:
    """Attention weights ``(n_layers, n_heads, n_q, n_k)`` for ``tokens``.

    ``keep`` (n_q, n_k) says which cells a query could attend to (False = masked, e.g. above the causal
    diagonal); None means every cell was visible. ``source`` says where the weights came from.
    """
    tokens: tuple[str, ...]
    weights: np.ndarray                 # (n_layers, n_heads, n_q, n_k)
    keep: np.ndarray | None = None      # (n_q, n_k) bool
    source: str = ""

    def __post_init__(self):
        if isinstance(self.tokens, str) or not all(isinstance(t, str) for t in self.tokens):
            raise TypeError("tokens must be a sequence of str")
        object.__setattr__(self, "tokens", tuple(self.tokens))
        w = as_float_array("weights", self.weights)
        if w.ndim == 2:
            w = w[None, None]                                   # (1, 1, n_q, n_k) one head
        elif w.ndim == 3:
            w = w[None]                                         # (1, h, n_q, n_k) one layer
        if w.ndim != 4:
            raise ValueError(f"weights must be (n_layers, n_heads, n_q, n_k), got shape {w.shape}")
        if w.shape[-1] != len(self.tokens):
            raise ValueError(f"weights have {w.shape[-1]} keys but there are {len(self.tokens)} tokens")
        object.__setattr__(self, "weights", w)
        if self.keep is not None:
            keep = as_bool_array("keep", self.keep)
            if keep.shape != w.shape[-2:]:
                raise ValueError(f"keep must have shape {w.shape[-2:]}, got {keep.shape}")
            object.__setattr__(self, "keep", keep)

    @property
    def n_layers(self) -> int:
        return self.weights.shape[0]

    @property
    def n_heads(self) -> int:
        return self.weights.shape[1]

    @property
    def q_tokens(self) -> tuple[str, ...]:
        """Query labels: the last n_q tokens (all of them for self-attention)."""
        return self.tokens[len(self.tokens) - self.weights.shape[2]:]

    def head(self, layer: int, head: int) -> np.ndarray:
        """One head's (n_q, n_k) grid, with a clear error for an index out of range."""
        for name, i, n in (("layer", layer, self.n_layers), ("head", head, self.n_heads)):
            if not isinstance(i, (int, np.integer)) or isinstance(i, bool) or not 0 <= i < n:
                raise ValueError(f"{name} must be an integer from 0 to {n - 1}, got {i!r}")
        return self.weights[layer, head]                        # (n_q, n_k)
