"""AttentionMap: the weights of every layer and head for one input, with its tokens.

This is what the pictures draw (PNG, HTML, terminal) and what the model commands return. It is data only:
the views import it, never the other way round (in Jupyter, ``attnlab.viz.show(amap)`` displays the HTML view).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels._checks import as_bool_array, as_float_array


@dataclass(frozen=True, eq=False)
class AttentionMap:
    """Attention weights ``(n_layers, n_heads, n_q, n_k)`` for ``tokens``.

    ``keep`` (n_q, n_k) says which cells a query could attend to (False = masked, e.g. above the causal
    diagonal); None means every cell was visible. ``source`` says where the weights came from.
    ``n_kv_heads`` (grouped-query attention) says how many key/value heads the query heads read: head i
    reads KV head ``i // (n_heads / n_kv_heads)``; None means one KV head per query head.

    ``queries`` (n_layers, n_heads, n_q, d_head) and ``keys`` (n_layers, n_heads, n_k, d_head), one key
    array per *query* head (a GQA group's shared keys repeated), are the q and k the weights came from, as
    attention saw them (after RoPE); the HTML page draws them in its neuron view (bertviz's): for one query,
    q, k and q ∘ k per dimension against each key, and the score ``scale · q·k``. None: no neuron view.
    """
    tokens: tuple[str, ...]
    weights: np.ndarray                 # (n_layers, n_heads, n_q, n_k)
    keep: np.ndarray | None = None      # (n_q, n_k) bool
    source: str = ""
    n_kv_heads: int | None = None       # grouped-query attention: the key/value heads the query heads share
    queries: np.ndarray | None = None   # (n_layers, n_heads, n_q, d_head), for the neuron view
    keys: np.ndarray | None = None      # (n_layers, n_heads, n_k, d_head), per query head
    scale: float | None = None          # the score's factor, 1/√d_head unless the model says otherwise

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
        if self.n_kv_heads is not None:
            kv = self.n_kv_heads
            if isinstance(kv, bool) or not isinstance(kv, (int, np.integer)) or kv < 1 or w.shape[1] % kv:
                raise ValueError(f"n_kv_heads must be a positive integer dividing the {w.shape[1]} heads, got {kv!r}")
            object.__setattr__(self, "n_kv_heads", int(kv))
        self._check_qk(w.shape)

    def _check_qk(self, shape: tuple) -> None:
        if (self.queries is None) != (self.keys is None):
            raise ValueError("queries and keys go together: give both or neither")
        if self.queries is None:
            return
        q, k = as_float_array("queries", self.queries), as_float_array("keys", self.keys)
        L, h, n_q, n_k = shape
        if q.ndim != 4 or q.shape[:3] != (L, h, n_q) or k.shape != (L, h, n_k, q.shape[-1]):
            raise ValueError(f"queries and keys must be {(L, h, n_q, 'd_head')} and {(L, h, n_k, 'd_head')} like the "
                             f"weights {shape}, got {q.shape} and {k.shape}")
        object.__setattr__(self, "queries", q)
        object.__setattr__(self, "keys", k)
        scale = 1.0 / np.sqrt(q.shape[-1]) if self.scale is None else self.scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating)) or not np.isfinite(scale):
            raise ValueError(f"scale must be a finite number, got {self.scale!r}")
        object.__setattr__(self, "scale", float(scale))

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

    @property
    def grouped(self) -> bool:
        """Whether query heads share key/value heads (grouped-query or multi-query attention)."""
        return self.n_kv_heads is not None and self.n_kv_heads < self.n_heads

    def kv_head(self, head: int) -> int:
        """The key/value head that query head ``head`` reads (itself without grouping).

        >>> AttentionMap(("a",), np.ones((1, 4, 1, 1)), n_kv_heads=2).kv_head(3)
        1
        """
        self.head(0, head)                                       # checks the index
        return int(head) // (self.n_heads // (self.n_kv_heads or self.n_heads))

    def kv_note(self, head: int) -> str:
        """Which KV head a query head reads and which heads share it, or "" without grouping.

        >>> AttentionMap(("a",), np.ones((1, 4, 1, 1)), n_kv_heads=2).kv_note(3)
        'reads KV head 1 with heads 2-3'
        >>> AttentionMap(("a",), np.ones((1, 4, 1, 1)), n_kv_heads=1).kv_note(0)
        'reads KV head 0 with heads 0-3'
        """
        if not self.grouped:
            return ""
        kv, g = self.kv_head(head), self.n_heads // self.n_kv_heads
        return f"reads KV head {kv} with heads {kv * g}-{kv * g + g - 1}"
