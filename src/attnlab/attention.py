"""Scaled dot-product attention, the guide's equation:

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V

This module holds the naive reference, which builds the whole (n_q, n_k) grid of scores, and the
dispatch that hands big inputs to the tiled kernel in :mod:`attnlab.tiled`, which never does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import (as_bool_array, as_float_array, as_int, as_positive_float, as_positive_int, broadcast_to,
                      check_finite, check_flag, compute_dtype)
from .masks import causal_mask
from .softmax import softmax


@dataclass(frozen=True)
class Checked:
    """Validated attention inputs, in the dtype the math runs in (at least float32)."""
    q: np.ndarray            # (..., n_q, d_k)
    k: np.ndarray            # (..., n_k, d_k)
    v: np.ndarray            # (..., n_k, d_v)
    keep: np.ndarray | None  # (..., n_q, n_k) bool, or None when every key is visible
    bias: np.ndarray | None  # (..., n_q, n_k) additive, or None
    scale: float
    out_dtype: np.dtype      # what the caller gets back


def check_attention_args(query, key, value, *, mask=None, bias=None, is_causal=False, window=None, q_offset=None,
                         scale=None, require_finite: bool = True) -> Checked:
    """Validate the arguments that every attention path shares; raise with names and shapes."""
    check_flag("is_causal", is_causal)
    window = as_positive_int("window", window, allow_none=True)
    if window is not None and not is_causal:
        raise ValueError(f"window={window} needs is_causal=True: it keeps the last `window` keys up to each query")
    query = as_float_array("query", query, min_ndim=2)
    key = as_float_array("key", key, min_ndim=2)
    value = as_float_array("value", value, min_ndim=2)
    if key.shape[-1] != query.shape[-1]:
        raise ValueError(f"key has width {key.shape[-1]}, query has width {query.shape[-1]}; they must match")
    if value.shape[-2] != key.shape[-2]:
        raise ValueError(f"value has {value.shape[-2]} rows, key has {key.shape[-2]}; "
                         "there must be one value per key")
    try:
        batch = np.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except ValueError:
        raise ValueError(f"the leading axes of query {query.shape}, key {key.shape} and value {value.shape} "
                         "do not broadcast") from None
    if require_finite:
        for name, arr in (("query", query), ("key", key), ("value", value)):
            check_finite(name, arr)
    n_q, n_k = query.shape[-2], key.shape[-2]
    grid = (*batch, n_q, n_k)
    keep = None
    if mask is not None:
        keep = broadcast_to("mask", as_bool_array("mask", mask), grid, "the score grid (..., n_q, n_k) =")
    q_offset = n_k - n_q if q_offset is None else as_int("q_offset", q_offset)
    if is_causal and n_q and n_k and hides_keys(n_q, n_k, window, q_offset):
        c = causal_mask(n_q, n_k, window=window, q_offset=q_offset)   # (n_q, n_k)
        keep = c if keep is None else keep & c                 # (..., n_q, n_k)
    if bias is not None:
        bias = broadcast_to("bias", as_float_array("bias", bias), grid, "the score grid (..., n_q, n_k) =")
        if require_finite and (np.isnan(bias).any() or np.isposinf(bias).any()):
            raise ValueError("bias must be finite or -inf (to drop a score), got NaN or +inf")
    scale = 1.0 / np.sqrt(query.shape[-1]) if scale is None else as_positive_float("scale", scale)
    dt = compute_dtype(query, key, value)
    return Checked(q=query.astype(dt, copy=False), k=key.astype(dt, copy=False), v=value.astype(dt, copy=False),
                   keep=keep, bias=bias, scale=float(scale), out_dtype=np.result_type(query, key, value))


def hides_keys(n_q: int, n_k: int, window: int | None, q_offset: int) -> bool:
    """Whether the causal mask (with ``window``, query 0 at key ``q_offset``) hides any of the n_q × n_k scores:
    the first query must see the last key, and the last query the first key."""
    return q_offset < n_k - 1 or (window is not None and n_q - 1 + q_offset - window >= 0)


def attention(query, key, value, *, mask=None, bias=None, is_causal=False, window=None, q_offset=None, scale=None,
              return_weights=False, check_finite=True):
    """Scaled dot-product attention: ``softmax(q kᵀ · scale + bias, masked) v``.

    Parameters
    ----------
    query : float array (..., n_q, d_k)
    key : float array (..., n_k, d_k)
    value : float array (..., n_k, d_v)
        Leading axes (batch, heads) broadcast against each other.
    mask : bool array broadcasting to (..., n_q, n_k), optional
        True = the query may attend to that key.
    bias : float array broadcasting to (..., n_q, n_k), optional
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
        Multiplies the scores. Defaults to ``1/√d_k`` (Vaswani et al., 2017).
    return_weights : bool
        Also return the weights ``(..., n_q, n_k)``.
    check_finite : bool
        Refuse NaN/inf in the inputs (default), or let them propagate.

    Returns
    -------
    out : (..., n_q, d_v), in the inputs' dtype (float16 is computed in float32)
    weights : (..., n_q, n_k), only with ``return_weights=True``

    Raises
    ------
    TypeError
        When an input is not a float array (integer input is refused) or ``is_causal`` is not a bool.
    ValueError
        When the shapes do not line up (named, with both shapes), or an input holds NaN/inf.

    A query with no key left to attend to gets output 0 and weights 0: no NaN, no warning.

    From ``TILED_MIN_QUERIES`` queries and ``TILED_MIN_SCORES`` scores per head (without ``bias`` or
    ``return_weights``) the work goes to :func:`attnlab.tiled.tiled_attention`, which gives the same
    result without building the grid.

    Examples
    --------
    The guide's hand example: the query of "sat" against the keys of "the cat sat".

    >>> k = np.array([[0., 0.], [2., 0.], [1., 1.]])
    >>> v = np.array([[1., 0.], [0., 1.], [1., 1.]])
    >>> out, a = attention(np.array([[1., 0.]]), k, v, scale=1.0, return_weights=True)
    >>> a.round(3), out.round(3)
    (array([[0.09 , 0.665, 0.245]]), array([[0.335, 0.91 ]]))
    """
    if takes_tiled_path(query, key, bias=bias, return_weights=return_weights):
        from .tiled import tiled_attention
        return tiled_attention(query, key, value, mask=mask, is_causal=is_causal, window=window,
                               q_offset=q_offset, scale=scale, check_finite=check_finite)
    c = check_attention_args(query, key, value, mask=mask, bias=bias, is_causal=is_causal, window=window,
                             q_offset=q_offset, scale=scale, require_finite=check_finite)
    if takes_decode_path(c, return_weights=return_weights):
        return decode_attention(c).astype(c.out_dtype, copy=False)
    out, a = naive_attention(c)
    out = out.astype(c.out_dtype, copy=False)
    return (out, a.astype(c.out_dtype, copy=False)) if return_weights else out


def naive_attention(c: Checked) -> tuple[np.ndarray, np.ndarray]:
    """The reference: build the whole grid of scores, mask, softmax, mix the values."""
    s = c.q @ np.swapaxes(c.k, -1, -2)                   # (..., n_q, n_k) raw scores
    s *= c.scale                                         # (..., n_q, n_k) S = QKᵀ/√d_k
    if c.bias is not None:
        s = s + c.bias                                   # (..., n_q, n_k)
    if c.keep is not None and s.shape == np.broadcast_shapes(s.shape, c.keep.shape):
        np.copyto(s, -np.inf, where=~c.keep)             # (..., n_q, n_k) S + M, in place
    elif c.keep is not None:
        s = np.where(c.keep, s, -np.inf)                 # (..., n_q, n_k) S + M, a mask with more batch axes
    a = softmax(s)                                       # (..., n_q, n_k) A, rows with no key are 0
    return a @ c.v, a                                    # (..., n_q, d_v), (..., n_q, n_k)


def decode_attention(c: Checked) -> np.ndarray:
    """The naive reference for one query per head and no mask or bias (a decode step against a KV cache),
    with as few passes over the scores as it takes: the step streams every cached key and value once, so
    it is memory-bound, and the naive path's extra passes and allocations cost it 40% at 1024 tokens.

    Every key is visible (``is_causal`` hides nothing from the last position), so the row max is finite
    and the sum is at least 1; the output is divided by the sum instead of the weights.
    """
    qs = c.q * c.scale                                   # (..., 1, d_k) scaled once, not the scores
    s = qs @ np.swapaxes(c.k, -1, -2)                    # (..., 1, n_k) S = q Kᵀ/√d_k
    s -= s.max(axis=-1, keepdims=True)                   # (..., 1, n_k)
    p = np.exp(s, out=s)                                 # (..., 1, n_k) unnormalised weights
    out = p @ c.v                                        # (..., 1, d_v)
    out /= p.sum(axis=-1, keepdims=True)                 # (..., 1, d_v) out = Σ_j a_j v_j
    return out


def attention_grad(query, key, value, dout, *, mask=None, bias=None, is_causal=False, window=None, q_offset=None,
                   scale=None):
    """Backward of :func:`attention`: the gradients ``(dq, dk, dv)`` of a loss L.

    The forward is run once (:func:`attention_forward`), then its backward (:func:`attention_backward`).
    Above the crossover size that is FlashAttention-2's tiled backward (:mod:`attnlab.tiled`; Dao, 2023);
    below it, the naive reference that holds the (n_q, n_k) grid of weights.

    Parameters
    ----------
    query, key, value, mask, bias, is_causal, scale
        As in :func:`attention`. ``bias`` is treated as a constant: no gradient flows into it.
    dout : float array (..., n_q, d_v)
        dL/d(out), the shape of :func:`attention`'s output.

    Returns
    -------
    dq, dk, dv : arrays
        dL/dquery, dL/dkey, dL/dvalue, each in the shape and dtype of its input; leading axes that were
        broadcast in the forward pass are summed back.

    Raises
    ------
    ValueError, TypeError
        As :func:`attention` does, and when ``dout`` does not have the output's shape.
    """
    _, saved = attention_forward(query, key, value, mask=mask, bias=bias, is_causal=is_causal, window=window,
                                 q_offset=q_offset, scale=scale)
    return attention_backward(saved, dout)


def naive_attention_grad(c: Checked, do: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The reference backward: (dq, dk, dv) over the broadcast batch, from the whole grid of weights."""
    out, a = naive_attention(c)                          # (..., n_q, d_v), (..., n_q, n_k)
    return naive_attention_backward(c, out, a, do)


def naive_attention_backward(c: Checked, out: np.ndarray, a: np.ndarray, do: np.ndarray):
    """(dq, dk, dv) over the broadcast batch from the forward's ``out`` and weights ``a``."""
    # forward: out = a @ v
    dv = np.swapaxes(a, -1, -2) @ do                     # (..., n_k, d_v)
    da = do @ np.swapaxes(c.v, -1, -2)                   # (..., n_q, n_k)
    # forward: a = softmax(s), so ds = a * (da - Σ_j a·da); and Σ_j a·da = Σ_d out·dout
    da -= (out * do).sum(-1, keepdims=True)              # (..., n_q, n_k) in place: da is ours
    ds = np.multiply(a, da, out=da)                      # (..., n_q, n_k) zero wherever a was masked
    # forward: s = (q @ kᵀ) * scale
    dq = ds @ c.k * c.scale                              # (..., n_q, d_k)
    dk = np.swapaxes(ds, -1, -2) @ c.q * c.scale         # (..., n_k, d_k)
    return dq, dk, dv


# ----------------------------------------------------------------------------------------------------
# forward and backward as a pair: the forward keeps what its backward needs (for training)


@dataclass(frozen=True, eq=False)
class Saved:
    """What :func:`attention_forward` keeps for :func:`attention_backward`: the checked inputs, the output in
    the compute dtype, and either the weights (naive path) or the log-sum-exp per query (tiled path)."""
    c: Checked
    inputs: tuple                # the caller's query, key, value: the gradients take their shapes and dtypes
    out: np.ndarray              # (..., n_q, d_v)
    a: np.ndarray | None         # (..., n_q, n_k) naive path
    lse: np.ndarray | None       # (..., n_q) tiled path
    plan: object = None          # the tiled backward's tiles (attnlab.tiled.Plan), tiled path only


def attention_forward(query, key, value, *, mask=None, bias=None, is_causal=False, window=None, q_offset=None,
                      scale=None):
    """:func:`attention`, and what its backward needs (for training).

    The same crossover as :func:`attention` picks the path: below it the naive grid, whose weights are
    kept; above it the tiled kernel, which keeps one log-sum-exp per query (FlashAttention-2, Dao 2023).

    Parameters
    ----------
    query, key, value, mask, bias, is_causal, scale
        As in :func:`attention`.

    Returns
    -------
    out : (..., n_q, d_v)
        What :func:`attention` returns.
    saved : Saved
        For :func:`attention_backward`, which then gives what :func:`attention_grad` gives without running
        the forward again.

    Raises
    ------
    ValueError, TypeError
        As :func:`attention` does.
    """
    if takes_tiled_path(query, key, bias=bias, return_weights=False):
        from .tiled import forward_for_backward
        c = check_attention_args(query, key, value, mask=mask, scale=scale)
        out, lse, back = forward_for_backward(c, is_causal=is_causal, window=window,
                                              q_offset=q_offset)          # (..., n_q, d_v), (..., n_q)
        saved = Saved(c=c, inputs=(query, key, value), out=out, a=None, lse=lse, plan=back)
    else:
        c = check_attention_args(query, key, value, mask=mask, bias=bias, is_causal=is_causal, window=window,
                                 q_offset=q_offset, scale=scale)
        out, a = naive_attention(c)                      # (..., n_q, d_v), (..., n_q, n_k)
        saved = Saved(c=c, inputs=(query, key, value), out=out, a=a, lse=None)
    return out.astype(c.out_dtype, copy=False), saved


def attention_backward(saved: Saved, dout) -> tuple:
    """Backward of :func:`attention_forward`: ``(dq, dk, dv)``, as :func:`attention_grad` returns them.

    Parameters
    ----------
    saved : Saved
        What :func:`attention_forward` returned.
    dout : float array (..., n_q, d_v)
        dL/d(out).

    Returns
    -------
    dq, dk, dv : arrays
        Each in the shape and dtype of its input; broadcast leading axes are summed back.

    Raises
    ------
    ValueError
        When ``dout`` does not have the output's shape.
    """
    c = saved.c
    do = check_dout(c, dout)                             # (..., n_q, d_v)
    if saved.a is None:
        from .tiled import tiled_backward
        grads = tiled_backward(c, saved.plan, saved.out, saved.lse, do)
    else:
        grads = naive_attention_backward(c, saved.out, saved.a, do)
    return grads_like(grads, saved.inputs)


def check_dout(c: Checked, dout) -> np.ndarray:
    """``dout`` as an array of the output's shape (..., n_q, d_v), in the compute dtype."""
    out_shape = (*np.broadcast_shapes(c.q.shape[:-2], c.k.shape[:-2], c.v.shape[:-2]),
                 c.q.shape[-2], c.v.shape[-1])
    do = as_float_array("dout", dout)
    if do.shape != out_shape:
        raise ValueError(f"dout must have the output's shape {out_shape}, got {do.shape}")
    return do.astype(c.q.dtype, copy=False)


def grads_like(grads, inputs) -> tuple:
    """Each gradient summed back over broadcast axes to its input's shape, in its input's dtype."""
    return tuple(unbroadcast(g, np.shape(x)).astype(np.asarray(x).dtype, copy=False)
                 for g, x in zip(grads, inputs))


# ----------------------------------------------------------------------------------------------------
# dispatch: the naive reference below the crossover, the tiled kernel above it

# attention(), attention_forward() and attention_grad() take the tiled path when each head has at least this many queries and
# scores. Below, the naive grid is small and one batched numpy call per step beats the tiled loop's
# per-tile overhead. Measured on 2 cores, 12 heads, d_head 64, float32 (tiled time / naive time, min of 15):
# n = 128: 1.0-1.6; n = 160: 0.84-2.0; n = 192: 0.67-0.78; n = 256: 0.6-0.7; n = 512: 0.5.
TILED_MIN_QUERIES = 128
TILED_MIN_SCORES = 192 * 192


def takes_tiled_path(query, key, *, bias, return_weights) -> bool:
    """True when the tiled kernel is the faster path and computes everything that was asked for."""
    if bias is not None or return_weights:
        return False                  # the tiled kernel takes no additive bias and never builds the weights
    q_shape, k_shape = np.shape(query), np.shape(key)
    if len(q_shape) < 2 or len(k_shape) < 2:
        return False                  # the naive path's checks will say what is wrong
    n_q, n_k = q_shape[-2], k_shape[-2]
    return n_q >= TILED_MIN_QUERIES and n_q * n_k >= TILED_MIN_SCORES


def takes_decode_path(c: Checked, *, return_weights: bool) -> bool:
    """True for one query per head against at least one key, every key visible, no bias, no weights asked
    for: :func:`decode_attention` computes that with fewer passes than the naive path."""
    return (c.q.shape[-2] == 1 and c.k.shape[-2] > 0 and c.keep is None and c.bias is None
            and not return_weights)


def unbroadcast(g: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum ``g`` over the axes that broadcasting added or stretched, back to ``shape``."""
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead))) if lead else g                       # drop added axes
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=stretched, keepdims=True) if stretched else g         # (shape)
