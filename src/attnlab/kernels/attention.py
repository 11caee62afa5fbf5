"""Scaled dot-product attention, the guide's equation, through one front door:

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V

This module is the one place that picks the path: the naive reference (:mod:`attnlab.kernels.naive`, the whole
grid of scores), the tiled kernel (:mod:`attnlab.kernels.tiled`, FlashAttention's online softmax, never the grid),
or the decode step (:mod:`attnlab.kernels.decode`, one query against a KV cache). Every path takes the same
checked inputs (:mod:`attnlab.kernels._checks`) and gives the same result.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from . import _kernels, decode, naive, tiled
from ._checks import check_attention_args, check_dout, grads_like
from .naive import NaiveSaved
from .tiled import TiledSaved

# What attention_forward keeps for attention_backward: the naive path's weights, or the tiled path's lse.
Saved = NaiveSaved | TiledSaved

# attention(), attention_forward() and attention_grad() take the tiled path when each head has at least
# this many queries and scores. Below, the naive grid is small and one batched numpy call per step beats the
# tiled loop's per-tile overhead. Measured on 2 cores, 12 heads, d_head 64, float32 (tiled time / naive
# time, min of 15): n = 128: 1.0-1.6; n = 160: 0.84-2.0; n = 192: 0.67-0.78; n = 256: 0.6-0.7; n = 512: 0.5.
TILED_MIN_QUERIES = 128
TILED_MIN_SCORES = 192 * 192


def takes_tiled_path(query, key, *, bias) -> bool:
    """True when the tiled kernel is the faster path and computes everything that was asked for."""
    if bias is not None:
        return False                  # the tiled kernel takes no additive bias
    q_shape, k_shape = np.shape(query), np.shape(key)
    if len(q_shape) < 2 or len(k_shape) < 2:
        return False                  # the naive path's checks will say what is wrong
    n_q, n_k = q_shape[-2], k_shape[-2]
    return n_q >= TILED_MIN_QUERIES and n_q * n_k >= TILED_MIN_SCORES


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Path:
    """Which path a call takes: ``name`` "naive", "tiled" or "decode", and its ``kernel``, "fused" (numba) or
    "numpy" (:func:`attnlab.kernels._kernels.tile_kernel`; the naive path's softmax is fused only without a
    bias); ``scores``: how many scores the call computes at most, what the rent-or-buy rule counts."""
    name: str
    kernel: str = "numpy"
    scores: int = 0

    def __str__(self) -> str:
        if self.name == "tiled":
            return f"tiled, {_kernels.kernel_name(self.kernel)}"
        if self.name == "naive" and self.kernel == "fused":
            return "naive, fused softmax (numba, polynomial exp2, one pass per row)"
        if self.name == "decode" and self.kernel == "fused":
            return "decode, fused (numba, one call for every head and its group) or numpy, the faster measured here"
        return f"{self.name}, numpy softmax (exp)"


def choose_path(c, *, training: bool = False, weights: bool = False) -> Path:
    """The one place that decides which path runs, for checked inputs ``c``; ``training``: the forward of
    a training step (attention_forward), which has no decode path; ``weights``: the whole grid of weights is
    asked for (attention_weights), which only the naive path holds. Logs the choice at DEBUG level."""
    scores = c.q.shape[-2] * c.k.shape[-2]
    for n in c.batch:
        scores *= n                                      # (a product of Python ints: no numpy call)
    if not weights and takes_tiled_path(c.q, c.k, bias=c.bias):
        path = Path("tiled", _kernels.tile_kernel(scores), scores)
    elif not (weights or training) and decode.takes_decode_path(c):
        path = Path("decode", _kernels.tile_kernel(scores), scores)
    else:
        path = Path("naive", _kernels.tile_kernel(scores) if c.bias is None else "numpy", scores)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("attention path: %s; q %s, k %s", path, c.q.shape, c.k.shape)
    return path


def attention_path(query, key, value, *, mask=None, bias=None, is_causal=False, window=None, q_offset=None,
                   softcap=None, training=False) -> Path:
    """The path :func:`attention` (or, with ``training``, :func:`attention_forward`) takes for these
    arguments: what ``attnlab bench`` reports beside each figure."""
    c = check_attention_args(query, key, value, mask=mask, bias=bias, is_causal=is_causal, window=window,
                             q_offset=q_offset, softcap=softcap, require_finite=False)
    return choose_path(c, training=training)


def attention(query, key, value, *, mask=None, bias=None, is_causal=False, window=None, q_offset=None, scale=None,
              softcap=None, check_finite=True) -> np.ndarray:
    """Scaled dot-product attention: ``softmax(q kᵀ · scale + bias, masked) v``; with ``softcap``,
    ``softmax(cap · tanh(q kᵀ · scale / cap) + bias, masked) v``.

    Parameters
    ----------
    query : float array (..., h, n_q, d_k)
    key : float array (..., h_kv, n_k, d_k)
    value : float array (..., h_kv, n_k, d_v)
        Leading axes (batch, heads) broadcast against each other. Grouped-query attention: when the
        query has more heads (axis -3) than the key and value, ``h`` must be a multiple of ``h_kv`` and
        query head i uses key/value head ``i // (h // h_kv)`` (torch's ``enable_gqa``); the key/value
        heads are read once per group, never repeated in memory.
    mask : bool array broadcasting to (..., h, n_q, n_k), optional
        True = the query may attend to that key.
    bias : float array broadcasting to (..., h, n_q, n_k), optional
        Added to the scaled scores before the softmax (ALiBi, relative positions, ``-inf`` to drop).
    is_causal : bool
        AND the causal mask into ``mask``. With ``n_k > n_q`` the queries are the last ``n_q``
        positions (bottom-right alignment).
    window : int, optional
        With ``is_causal``: each query sees only the last ``window`` keys up to itself (sliding window).
    q_offset : int, optional
        The key index that query 0 sits at (default ``n_k - n_q``, bottom-right): query ``i`` may see key
        ``j`` when ``j <= i + q_offset`` (causal) and ``j > i + q_offset - window``.
    scale : float, optional
        Multiplies the scores. Defaults to ``1/√d_k`` (Vaswani et al., 2017); Gemma-2 states its own
        (``query_pre_attn_scalar^-1/2``).
    softcap : float, optional
        Soft-caps the scaled scores to ``cap · tanh(s / cap)`` before the bias and the mask, so none exceeds
        ``cap`` (Gemma-2's ``attn_logit_softcapping``). Every path (naive, tiled, fused, decode) and the
        backward take it.
    check_finite : bool
        Refuse NaN/inf in the inputs (default), or let them propagate.

    Returns
    -------
    out : (..., h, n_q, d_v), in the inputs' dtype (float16 is computed in float32)

    Raises
    ------
    TypeError
        When an input is not a float array (integer input is refused) or ``is_causal`` is not a bool.
    ValueError
        When the shapes do not line up (named, with both shapes), the query heads are not a multiple of
        the key/value heads, or an input holds NaN/inf.

    A query with no key left to attend to gets output 0: no NaN, no warning. The weights themselves come
    from :func:`attention_weights`.

    From ``TILED_MIN_QUERIES`` queries and ``TILED_MIN_SCORES`` scores per head (without ``bias``) the work
    goes to :func:`attnlab.kernels.tiled.tiled_attention`, which gives the same result without building the grid;
    one query per head with every key visible goes to the decode step (:mod:`attnlab.kernels.decode`).

    Examples
    --------
    The guide's hand example: the query of "sat" against the keys of "the cat sat".

    >>> k = np.array([[0., 0.], [2., 0.], [1., 1.]])
    >>> v = np.array([[1., 0.], [0., 1.], [1., 1.]])
    >>> attention(np.array([[1., 0.]]), k, v, scale=1.0).round(3)
    array([[0.335, 0.91 ]])
    """
    c = check_attention_args(query, key, value, mask=mask, bias=bias, is_causal=is_causal, window=window,
                             q_offset=q_offset, scale=scale, softcap=softcap, require_finite=check_finite)
    path = choose_path(c)
    t0 = time.perf_counter()
    if path.name == "tiled":
        out, _ = tiled.tiled_forward(c, tiled.make_plan(c), kernel=path.kernel)     # (..., h, n_q, d_v)
    elif path.name == "decode":
        out = decode.decode_step(c, path.kernel)         # (..., h, 1, d_v)
    else:
        out = naive.naive_attention_out(c, path.kernel)  # (..., h, n_q, d_v)
    _kernels.pay_rent(path.kernel, time.perf_counter() - t0, path.scores)
    return out.astype(c.out_dtype, copy=False)


def attention_weights(query, key, *, mask=None, bias=None, is_causal=False, window=None, q_offset=None,
                      scale=None, softcap=None) -> np.ndarray:
    """The attention weights ``a = softmax(q kᵀ · scale + bias, masked)``: the whole (n_q, n_k) grid.

    Parameters
    ----------
    query, key, mask, bias, is_causal, window, q_offset, scale, softcap
        As in :func:`attention` (grouped-query heads too).

    Returns
    -------
    a : (..., h, n_q, n_k), in the inputs' dtype; each row sums to 1, or is 0 for a query that sees no key.

    Raises
    ------
    TypeError, ValueError
        As :func:`attention` does.

    For a few rows of a grid too big to hold, see :func:`attnlab.kernels.tiled.attention_weights_rows`.

    Examples
    --------
    The guide's hand example: how much "sat" attends to "the", "cat" and "sat".

    >>> k = np.array([[0., 0.], [2., 0.], [1., 1.]])
    >>> attention_weights(np.array([[1., 0.]]), k, scale=1.0).round(3)
    array([[0.09 , 0.665, 0.245]])
    """
    c = check_attention_args(query, key, key, mask=mask, bias=bias, is_causal=is_causal, window=window,
                             q_offset=q_offset, scale=scale, softcap=softcap)
    path = choose_path(c, weights=True)
    t0 = time.perf_counter()
    a = naive.naive_weights(c, path.kernel)              # (..., h, n_q, n_k)
    _kernels.pay_rent(path.kernel, time.perf_counter() - t0, path.scores)
    return a.astype(c.out_dtype, copy=False)


# ----------------------------------------------------------------------------------------------------
# forward and backward as a pair: the forward keeps what its backward needs (for training)


def attention_forward(query, key, value, *, mask=None, bias=None, is_causal=False, window=None, q_offset=None,
                      scale=None, softcap=None) -> tuple[np.ndarray, Saved]:
    """:func:`attention`, and what its backward needs (for training).

    The same crossover as :func:`attention` picks the path: below it the naive grid, whose weights are
    kept (:class:`attnlab.kernels.naive.NaiveSaved`); above it the tiled kernel, which keeps one log-sum-exp per
    query (:class:`attnlab.kernels.tiled.TiledSaved`; FlashAttention-2, Dao 2023).

    Parameters
    ----------
    query, key, value, mask, bias, is_causal, window, q_offset, scale, softcap
        As in :func:`attention`.

    Returns
    -------
    out : (..., h, n_q, d_v)
        What :func:`attention` returns.
    saved : NaiveSaved or TiledSaved
        For :func:`attention_backward`, which then gives what :func:`attention_grad` gives without running
        the forward again.

    Raises
    ------
    ValueError, TypeError
        As :func:`attention` does.
    """
    c = check_attention_args(query, key, value, mask=mask, bias=bias, is_causal=is_causal, window=window,
                             q_offset=q_offset, scale=scale, softcap=softcap)
    path = choose_path(c, training=True)
    t0 = time.perf_counter()
    if path.name == "tiled":
        out, saved = tiled.tiled_forward_saved(c, (query, key, value), kernel=path.kernel)   # (..., h, n_q, d_v)
    else:
        out, saved = naive.naive_forward(c, (query, key, value), path.kernel)   # (..., h, n_q, d_v), NaiveSaved
    _kernels.pay_rent(path.kernel, time.perf_counter() - t0, path.scores)
    return out.astype(c.out_dtype, copy=False), saved


def attention_backward(saved: Saved, dout) -> tuple:
    """Backward of :func:`attention_forward`: ``(dq, dk, dv)``, as :func:`attention_grad` returns them.

    Parameters
    ----------
    saved : NaiveSaved or TiledSaved
        What :func:`attention_forward` returned.
    dout : float array (..., h, n_q, d_v)
        dL/d(out).

    Returns
    -------
    dq, dk, dv : arrays
        Each in the shape and dtype of its input; broadcast leading axes are summed back, and with
        grouped-query attention dk and dv are summed over each group of query heads.

    Raises
    ------
    TypeError
        When ``saved`` did not come from :func:`attention_forward`.
    ValueError
        When ``dout`` does not have the output's shape.
    """
    if not isinstance(saved, (NaiveSaved, TiledSaved)):
        raise TypeError(f"saved must be what attention_forward returned (NaiveSaved or TiledSaved), "
                        f"got {type(saved).__name__}")
    c = saved.c
    do = check_dout(c, dout)                             # (..., h, n_q, d_v)
    if isinstance(saved, TiledSaved):
        grads = tiled.tiled_backward(c, saved.plan, saved.out, saved.lse, do, kernel=saved.kernel)
    else:
        grads = naive.naive_backward(c, saved.out, saved.a, do)
    return grads_like(grads, saved.inputs)


def attention_grad(query, key, value, dout, *, mask=None, bias=None, is_causal=False, window=None, q_offset=None,
                   scale=None, softcap=None) -> tuple:
    """Backward of :func:`attention`: the gradients ``(dq, dk, dv)`` of a loss L.

    The forward is run once (:func:`attention_forward`), then its backward (:func:`attention_backward`).
    Above the crossover size that is FlashAttention-2's tiled backward (:mod:`attnlab.kernels.tiled`; Dao, 2023);
    below it, the naive reference that holds the (n_q, n_k) grid of weights.

    Parameters
    ----------
    query, key, value, mask, bias, is_causal, window, q_offset, scale, softcap
        As in :func:`attention`. ``bias`` is treated as a constant: no gradient flows into it.
    dout : float array (..., h, n_q, d_v)
        dL/d(out), the shape of :func:`attention`'s output.

    Returns
    -------
    dq, dk, dv : arrays
        dL/dquery, dL/dkey, dL/dvalue, each in the shape and dtype of its input; leading axes that were
        broadcast in the forward pass are summed back, and with grouped-query attention dk and dv are summed
        over each group of query heads.

    Raises
    ------
    ValueError, TypeError
        As :func:`attention` does, and when ``dout`` does not have the output's shape.
    """
    _, saved = attention_forward(query, key, value, mask=mask, bias=bias, is_causal=is_causal, window=window,
                                 q_offset=q_offset, scale=scale, softcap=softcap)
    return attention_backward(saved, dout)
