"""Multi-head attention: h copies of attention side by side on the same x, mixed by W_O.

Shapes: the four projections are stored for all heads at once, as GPT-2 does:
W_Q, W_K, W_V are (d_model, n_heads·d_head) with head i in columns i·d_head … (i+1)·d_head − 1,
and W_O is (n_heads·d_head, d_model).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import as_float_array, as_positive_int, check_finite, check_rng
from .attention import Saved, attention, attention_backward, attention_forward, attention_weights
from .cache import KVCache
from .config import AttentionConfig
from .positions import rope as rotate


def split_heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """(..., n, n_heads·d_head) -> (..., n_heads, n, d_head): one slice per head."""
    n_heads = as_positive_int("n_heads", n_heads)
    if np.ndim(x) < 2 or np.shape(x)[-1] % n_heads:
        raise ValueError(f"x must be (..., n, n_heads·d_head) with a width n_heads={n_heads} divides, "
                         f"got shape {np.shape(x)}")
    *lead, n, width = x.shape
    x = x.reshape(*lead, n, n_heads, width // n_heads)   # (..., n, h, d_head)
    return np.swapaxes(x, -2, -3)                        # (..., h, n, d_head)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(..., n_heads, n, d_head) -> (..., n, n_heads·d_head): heads side by side."""
    if np.ndim(x) < 3:
        raise ValueError(f"x must be (..., n_heads, n, d_head), at least 3 axes, got shape {np.shape(x)}")
    *lead, h, n, d_head = x.shape
    return np.swapaxes(x, -2, -3).reshape(*lead, n, h * d_head)   # (..., n, h·d_head)


@dataclass(frozen=True, eq=False)
class MultiHeadAttention:
    """The parameters of one multi-head attention layer; calling it runs the forward pass."""
    W_Q: np.ndarray   # (d_model, h·d_head)
    W_K: np.ndarray   # (d_model, h·d_head)
    W_V: np.ndarray   # (d_model, h·d_head)
    W_O: np.ndarray   # (h·d_head, d_model)
    b_Q: np.ndarray   # (h·d_head,)
    b_K: np.ndarray   # (h·d_head,)
    b_V: np.ndarray   # (h·d_head,)
    b_O: np.ndarray   # (d_model,)
    n_heads: int

    def __post_init__(self):
        as_positive_int("n_heads", self.n_heads)
        for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
            object.__setattr__(self, name, as_float_array(name, getattr(self, name)))
        d_model, width = self.W_Q.shape if self.W_Q.ndim == 2 else (None, None)
        if d_model is None:
            raise ValueError(f"W_Q must be 2-D (d_model, n_heads·d_head), got shape {self.W_Q.shape}")
        if width % self.n_heads:
            raise ValueError(f"W_Q has {width} columns, which n_heads={self.n_heads} does not divide")
        expected = {"W_Q": (d_model, width), "W_K": (d_model, width), "W_V": (d_model, width),
                    "W_O": (width, d_model), "b_Q": (width,), "b_K": (width,), "b_V": (width,),
                    "b_O": (d_model,)}
        for name, shape in expected.items():
            got = getattr(self, name).shape
            if got != shape:
                raise ValueError(f"{name} must have shape {shape} to match W_Q {self.W_Q.shape}, got {got}")

    @classmethod
    def init(cls, config: AttentionConfig, *, rng: np.random.Generator, std: float = 0.02,
             dtype=np.float32) -> "MultiHeadAttention":
        """Random weights from N(0, std²), as GPT-2 initialises them; zero biases."""
        if not isinstance(config, AttentionConfig):
            raise TypeError(f"config must be an AttentionConfig, got {type(config).__name__}")
        check_rng(rng)
        d, w = config.d_model, config.n_heads * config.d_head
        draw = lambda *shape: rng.normal(0.0, std, shape).astype(dtype)   # noqa: E731
        zeros = lambda n: np.zeros(n, dtype)                               # noqa: E731
        return cls(W_Q=draw(d, w), W_K=draw(d, w), W_V=draw(d, w), W_O=draw(w, d),
                   b_Q=zeros(w), b_K=zeros(w), b_V=zeros(w), b_O=zeros(d), n_heads=config.n_heads)

    @classmethod
    def from_gpt2(cls, c_attn_weight, c_attn_bias, c_proj_weight, c_proj_bias, n_heads: int):
        """From GPT-2's fused layout: c_attn (d_model, 3·d_model) holds W_Q | W_K | W_V side by side."""
        c_attn_weight = as_float_array("c_attn_weight", c_attn_weight)
        c_attn_bias = as_float_array("c_attn_bias", c_attn_bias)
        if c_attn_weight.ndim != 2 or c_attn_weight.shape[1] % 3:
            raise ValueError(f"c_attn_weight must be (d_model, 3·width), got shape {c_attn_weight.shape}")
        if c_attn_bias.shape != (c_attn_weight.shape[1],):
            raise ValueError(f"c_attn_bias must have shape ({c_attn_weight.shape[1]},) to match c_attn_weight, "
                             f"got {c_attn_bias.shape}")
        W_Q, W_K, W_V = np.split(c_attn_weight, 3, axis=1)   # (d_model, width) each
        b_Q, b_K, b_V = np.split(c_attn_bias, 3)               # (width,) each
        return cls(W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=c_proj_weight, b_Q=b_Q, b_K=b_K, b_V=b_V,
                   b_O=c_proj_bias, n_heads=n_heads)

    @property
    def config(self) -> AttentionConfig:
        d_model, width = self.W_Q.shape
        return AttentionConfig(d_model=d_model, n_heads=self.n_heads, d_head=width // self.n_heads)

    @property
    def n_params(self) -> int:
        """Every number in the layer: four matrices and four biases."""
        return sum(getattr(self, n).size for n in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"))

    def new_cache(self, capacity: int, *, batch_shape: tuple = ()) -> KVCache:
        """An empty KV cache for this layer, with room for ``capacity`` tokens."""
        return KVCache.empty(self.n_heads, capacity, self.W_Q.shape[1] // self.n_heads,
                             batch_shape=batch_shape, dtype=np.result_type(self.W_K, np.float32))

    def __call__(self, x, *, mask=None, bias=None, is_causal=False, rope=False, return_weights=False,
                 cache: KVCache | None = None):
        return multihead_attention(self, x, mask=mask, bias=bias, is_causal=is_causal, rope=rope,
                                   return_weights=return_weights, cache=cache)


def multihead_attention(p: MultiHeadAttention, x, *, mask=None, bias=None, is_causal=False, rope=False,
                        return_weights=False, cache: KVCache | None = None):
    """Multi-head attention (Vaswani et al., 2017, §3.2.2):
    ``y = concat_i(attention(x W_Qᵢ + b_Qᵢ, x W_Kᵢ + b_Kᵢ, x W_Vᵢ + b_Vᵢ)) W_O + b_O``.

    Parameters
    ----------
    p : MultiHeadAttention
        The layer's weights.
    x : float array (..., n, d_model)
    mask : bool array broadcasting to (..., n_heads, n, n_k), optional
        True = may attend.
    bias : float array broadcasting to (..., n_heads, n, n_k), optional
        Added to the scaled scores (ALiBi: :func:`attnlab.positions.alibi_bias`).
    is_causal : bool
    rope : bool
        Rotate every head's q and k at their absolute positions (:func:`attnlab.positions.rope`).
    return_weights : bool
        Also return the weights (..., n_heads, n, n_k).
    cache : KVCache, optional
        The new tokens sit after the ``cache.length`` cached ones: they are rotated at those positions,
        their keys and values are appended, and the n queries attend to all n_k cached tokens
        (bottom-right causal alignment: the queries are the last n positions). A step that raises
        leaves the cache as it was.

    Returns
    -------
    y : (..., n, d_model)
    weights : (..., n_heads, n, n_k), only with ``return_weights=True``

    Raises
    ------
    ValueError, TypeError
        When ``x`` is not (..., n, d_model), and as :func:`attnlab.attention` or :meth:`KVCache.append` do.
    """
    x = _check_x(p, x)
    start = 0 if cache is None else cache.length
    q, k, v = _project(p, x, rope=rope, start=start)   # (..., h, n, d_head) each
    if cache is None:
        heads = attention(q, k, v, mask=mask, bias=bias, is_causal=is_causal)   # (..., h, n, d_head)
    else:
        k, v = cache.append(k, v)                    # (..., h, n_k, d_head) each: every token so far
        try:
            check_finite("query", q)                 # the cached keys and values were checked on append
            heads = attention(q, k, v, mask=mask, bias=bias, is_causal=is_causal, check_finite=False)
        except Exception:
            cache.length = start                     # a failed step leaves the cache as it was
            raise
    _, y = _output(p, heads)                         # (..., n, d_model)
    if return_weights:
        a = attention_weights(q, k, mask=mask, bias=bias, is_causal=is_causal)   # (..., h, n, n_k)
    return (y, a) if return_weights else y


def multihead_attention_grad(p: MultiHeadAttention, x, dy, *, mask=None, bias=None, is_causal=False,
                             rope=False):
    """Backward of :func:`multihead_attention` (no cache): returns ``(dx, grads)``.

    The forward is recomputed here, once. To keep the forward instead of recomputing it, use
    :func:`multihead_attention_forward` and :func:`multihead_attention_backward`.

    Parameters
    ----------
    p, x, mask, bias, is_causal, rope
        As given to :func:`multihead_attention`. ``bias`` is treated as a constant (ALiBi's is fixed).
    dy : float array (..., n, d_model)
        dL/dy.

    Returns
    -------
    dx, grads
        As :func:`multihead_attention_backward`: dL/dx (..., n, d_model), and dL/dW_Q, …, dL/db_O as a
        MultiHeadAttention, so it can be used like the parameters themselves (an optimizer walks both alike).

    Raises
    ------
    ValueError, TypeError
        As :func:`multihead_attention` does, and when ``dy`` does not have the shape of ``x``.
    """
    _, saved = multihead_attention_forward(p, x, mask=mask, bias=bias, is_causal=is_causal, rope=rope)
    return multihead_attention_backward(p, saved, dy)


@dataclass(frozen=True, eq=False)
class SavedLayer:
    """What :func:`multihead_attention_forward` keeps for :func:`multihead_attention_backward`."""
    x: np.ndarray            # (..., n, d_model) the layer's input
    merged: np.ndarray       # (..., n, h·d_head) the heads side by side, before W_O
    attn: Saved              # the attention's own saved forward
    rope: bool


def multihead_attention_forward(p: MultiHeadAttention, x, *, mask=None, bias=None, is_causal=False,
                                rope=False):
    """:func:`multihead_attention` without a cache, and what its backward needs.

    Parameters
    ----------
    p, x, mask, bias, is_causal, rope
        As in :func:`multihead_attention`.

    Returns
    -------
    y : (..., n, d_model)
        What :func:`multihead_attention` returns.
    saved : SavedLayer
        For :func:`multihead_attention_backward`: the input, the merged heads, the attention's own
        saved forward (its weights below the crossover, one log-sum-exp per query above it).
    """
    x = _check_x(p, x)
    q, k, v = _project(p, x, rope=rope)                    # (..., h, n, d_head) each
    heads, attn = attention_forward(q, k, v, mask=mask, bias=bias, is_causal=is_causal)   # (..., h, n, d_head)
    merged, y = _output(p, heads)                          # (..., n, h·d_head), (..., n, d_model)
    return y, SavedLayer(x=x, merged=merged, attn=attn, rope=rope)


def multihead_attention_backward(p: MultiHeadAttention, saved: SavedLayer, dy):
    """Backward of :func:`multihead_attention_forward`: ``(dx, grads)`` as :func:`multihead_attention_grad`.

    Parameters
    ----------
    p : MultiHeadAttention
        The weights the forward ran with.
    saved : SavedLayer
        What :func:`multihead_attention_forward` returned.
    dy : float array (..., n, d_model)
        dL/dy.

    Returns
    -------
    dx : (..., n, d_model)
        dL/dx.
    grads : MultiHeadAttention
        dL/dW_Q, …, dL/db_O in the layout of the parameters.

    Raises
    ------
    ValueError
        When ``dy`` does not have the shape of ``x``.
    """
    x = saved.x                                            # (..., n, d_model)
    dy = as_float_array("dy", dy)
    if dy.shape != x.shape:
        raise ValueError(f"dy must have the shape of x {x.shape}, got {dy.shape}")
    d_model, width = p.W_Q.shape
    # forward: y = merged @ W_O + b_O
    dy2 = dy.reshape(-1, d_model)                          # (N, d_model), N = all tokens
    dW_O = saved.merged.reshape(-1, width).T @ dy2         # (h·d_head, d_model)
    db_O = dy2.sum(0)                                      # (d_model,)
    d_merged = dy @ p.W_O.T                                # (..., n, h·d_head)
    # forward: heads = attention(q, k, v)
    dq, dk, dv = attention_backward(saved.attn, split_heads(d_merged, p.n_heads))   # (..., h, n, d_head) each
    if saved.rope:
        # forward: q = rope(q), k = rope(k); a rotation's transpose is the inverse rotation
        dq, dk = rotate(dq, inverse=True), rotate(dk, inverse=True)   # (..., h, n, d_head) each
    # forward: q = split_heads(x @ W_Q + b_Q), likewise k and v
    x2 = x.reshape(-1, d_model)                            # (N, d_model)
    grads, dx = {}, np.zeros_like(x)                      # dx: (..., n, d_model)
    for name, d in (("Q", dq), ("K", dk), ("V", dv)):
        d_lin = merge_heads(d)                             # (..., n, h·d_head)
        grads[f"W_{name}"] = x2.T @ d_lin.reshape(-1, width)   # (d_model, h·d_head)
        grads[f"b_{name}"] = d_lin.reshape(-1, width).sum(0)   # (h·d_head,)
        dx += d_lin @ getattr(p, f"W_{name}").T            # (..., n, d_model)
    return dx, MultiHeadAttention(**grads, W_O=dW_O, b_O=db_O, n_heads=p.n_heads)


def _output(p: MultiHeadAttention, heads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The heads (..., h, n, d_head) side by side, and the layer's output ``merged W_O + b_O``."""
    merged = merge_heads(heads)                      # (..., n, h·d_head)
    return merged, merged @ p.W_O + p.b_O            # (..., n, h·d_head), (..., n, d_model)


def _project(p: MultiHeadAttention, x: np.ndarray, *, rope: bool, start: int = 0):
    """q, k, v (..., h, n, d_head) of x; with ``rope``, q and k rotated at positions start, start + 1, …"""
    q = split_heads(x @ p.W_Q + p.b_Q, p.n_heads)    # (..., h, n, d_head)
    k = split_heads(x @ p.W_K + p.b_K, p.n_heads)    # (..., h, n, d_head)
    v = split_heads(x @ p.W_V + p.b_V, p.n_heads)    # (..., h, n, d_head)
    if rope:
        q, k = rotate(q, start=start), rotate(k, start=start)   # (..., h, n, d_head) each
    return q, k, v


def _check_x(p: MultiHeadAttention, x) -> np.ndarray:
    x = as_float_array("x", x, min_ndim=2)
    if x.shape[-1] != p.W_Q.shape[0]:
        raise ValueError(f"x has width {x.shape[-1]}, the layer's d_model is {p.W_Q.shape[0]}; they must match")
    return x
