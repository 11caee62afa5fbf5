"""A sink + window KV cache: the first k tokens and the most recent ones, for generation past the window.

StreamingLLM (Xiao et al., 2023, "Efficient Streaming Language Models with Attention Sinks") keeps the keys and
values of the first ``n_sink`` tokens (the attention sinks: heads park their weight there) plus a window of the
``window`` most recent tokens, and drops the middle. Window-only (``n_sink = 0``) is the plain rolling cache.

What to keep is a small policy object, :class:`SinkWindow` (a pure ``keep(length, t)``); the cache that applies
it is :class:`StreamingCache`, a :class:`~attnlab.layer.cache.KVCache` whose :meth:`~StreamingCache.make_room`
drops the tokens the policy lets go.

Positions: re-positioned within the cache, as StreamingLLM does. A key is presented at its slot in the cache
(the sinks at 0 … k−1, the window right after them, the new token at ``length``), not at the position it had in
the text. The stack rotates each new token at ``start = cache.length``, its slot, so nothing in the forward
changes. A kept key that moves down from slot s to slot s' is turned once more by (s' − s)·θ when it is read:
RoPE's rotations compose (turning a key rotated at p by δ·θ gives exactly the key rotated at p + δ), so the
presented key is the one a forward over the kept tokens alone would make at layer 0. Why re-position rather
than keep the original positions: with original positions the query's offset to the sinks grows with the text
and soon passes every offset seen in training (n_ctx); re-positioned, every offset stays below
``n_sink + window``. Position schemes that do not rotate (learned tables, ALiBi, none) present the keys as they
came: ALiBi's bias then counts slots, a learned table's row stays in the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..kernels._checks import as_positive_int
from .cache import KVCache
from .positions import PositionScheme


@dataclass(frozen=True)
class SinkWindow:
    """Keep the first ``n_sink`` tokens and the ``window`` most recent ones (StreamingLLM's policy)."""
    n_sink: int = 4           # StreamingLLM's default: 4 initial tokens recover the full cache's perplexity
    window: int = 256         # recent tokens kept, the new one included

    def __post_init__(self):
        if isinstance(self.n_sink, bool) or not isinstance(self.n_sink, (int, np.integer)) or self.n_sink < 0:
            raise ValueError(f"n_sink must be an int >= 0, got {self.n_sink!r}")
        as_positive_int("window", self.window)

    @property
    def capacity(self) -> int:
        return self.n_sink + self.window

    def keep(self, length: int, t: int) -> np.ndarray:
        """The slots (ascending) to keep of ``length`` cached tokens so that ``t`` more fit in ``capacity``.

        >>> SinkWindow(2, 4).keep(6, 1)          # slots 0, 1 are sinks; slot 2, the oldest of the window, goes
        array([0, 1, 3, 4, 5])
        >>> SinkWindow(0, 3).keep(2, 1)          # room already: keep everything
        array([0, 1])
        """
        t = as_positive_int("t", t)
        if t > self.window:
            raise ValueError(f"t must be at most the window ({self.window}): the {t} new tokens must all fit "
                             "beside the sinks")
        if length + t <= self.capacity:
            return np.arange(length)
        recent = self.window - t                                     # window slots left for the old tokens
        return np.concatenate([np.arange(self.n_sink), np.arange(length - recent, length)])


@dataclass(eq=False)
class StreamingCache(KVCache):
    """One layer's cache under a :class:`SinkWindow` policy, re-positioned within the cache (see the module).

    ``append`` is :class:`KVCache`'s (all or nothing, at most ``capacity`` tokens); call :meth:`make_room` before
    it. ``turn[s]`` is how far slot s's key has moved since it arrived (0 for the sinks and new tokens, −e for a
    window token after e evictions); ``keys`` presents each key turned by it.
    """
    policy: SinkWindow = field(default_factory=SinkWindow)
    positions: PositionScheme = field(default_factory=PositionScheme)   # the layer's: RoPE turns moved keys
    turn: np.ndarray = field(default=None)                           # (capacity,) int

    @classmethod
    def empty(cls, n_kv_heads: int, capacity: int | None = None, d_head: int = 0, *, batch_shape: tuple = (),
              dtype=np.float32, policy: SinkWindow | None = None,
              positions: PositionScheme | None = None) -> "StreamingCache":
        """An empty cache of ``policy.capacity`` tokens (``capacity``, if given, must equal it)."""
        policy = SinkWindow() if policy is None else policy
        if not isinstance(policy, SinkWindow):
            raise TypeError(f"policy must be a SinkWindow, got {type(policy).__name__}")
        if capacity is not None and capacity != policy.capacity:
            raise ValueError(f"capacity must be the policy's n_sink + window = {policy.capacity}, got {capacity}")
        positions = PositionScheme() if positions is None else positions
        if not isinstance(positions, PositionScheme):
            raise TypeError(f"positions must be a PositionScheme, got {type(positions).__name__}")
        base = KVCache.empty(n_kv_heads, policy.capacity, d_head, batch_shape=batch_shape, dtype=dtype)
        return cls(k=base.k, v=base.v, policy=policy, positions=positions,
                   turn=np.zeros(policy.capacity, np.int64))

    @property
    def keys(self) -> np.ndarray:
        k = self.k[..., :self.length, :]                      # (..., h_kv, length, d_head)
        turn = self.turn[:self.length]                        # (length,)
        if not self.positions.rotates or not turn.any():
            return k
        return self.positions.rotate(k, start=0, positions=turn)   # (..., h_kv, length, d_head) at their slots

    def make_room(self, t: int) -> bool:
        """Drop what the policy lets go so that ``t`` more tokens fit; True (a sink + window cache always can).

        The kept tokens move down to fill the gap, in order; their keys are turned to their new slots when read.
        """
        keep = self.policy.keep(self.length, t)               # (m,) slots, ascending
        m = keep.size
        if m == self.length:
            return True
        self.k[..., :m, :] = self.k[..., keep, :]             # (..., h_kv, m, d_head) the index copies first
        self.v[..., :m, :] = self.v[..., keep, :]             # (..., h_kv, m, d_head)
        self.turn[:m] = self.turn[keep] + (np.arange(m) - keep)
        self.turn[m:] = 0
        self.length = m
        if self.positions.rotates and m:                      # a turned key's entries can grow (up to √2·):
            self.k_max = float(np.abs(self.keys).max())       # bound what attention will see, not what came
        return True

    def reset(self) -> None:
        """Forget every cached token (the buffers are kept)."""
        super().reset()
        self.turn[:] = 0
