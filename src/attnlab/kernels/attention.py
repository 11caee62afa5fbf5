"""Scaled dot-product attention, the guide's equation, through one front door:

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V

This module is the one place that picks the path: the naive reference (:mod:`attnlab.kernels.naive`, the whole
grid of scores), the tiled kernel (:mod:`attnlab.kernels.tiled`, FlashAttention's online softmax, never the grid),
or the decode step (:mod:`attnlab.kernels.decode`, one query against a KV cache), and its kernel, numpy or
the numba fused one. Every path takes the same checked inputs (:mod:`attnlab.kernels._checks`) and gives the
same result to float rounding.

The choice is a rule (:func:`choose_path`): a pure function of the call's shapes, dtypes and options, the
CPU's features, the installed extras, the environment and the tune profile (``attnlab tune``), never of a time
measured while the program runs; so the same call gives the same bits every time. ``implementation=`` and
``kernel=`` force one; :func:`attention_path` says which would run and why, computing nothing.

Public callers come in through :func:`attention`, which validates every argument; the stack's layers, whose
arrays are their own and already checked, come in through :func:`attend`, which skips those checks.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

import numpy as np

from . import _kernels, decode, naive, sinks, tiled
from ._step import answers
from ._checks import Checked, as_choice, as_positive_int, check_attention_args, check_dout, check_flag, grads_like
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
    return tiled_sizes(q_shape[-2], k_shape[-2])


def tiled_sizes(n_q: int, n_k: int) -> bool:
    """The size rule of the tiled path: at least TILED_MIN_QUERIES queries and TILED_MIN_SCORES scores per head."""
    return n_q >= TILED_MIN_QUERIES and n_q * n_k >= TILED_MIN_SCORES


log = logging.getLogger(__name__)


IMPLEMENTATIONS = ("naive", "tiled", "decode")
KERNELS = ("numpy", "fused")


@dataclass(frozen=True)
class Path:
    """Which path a call takes: ``name`` "naive", "tiled" or "decode", and its ``kernel``, "fused" (numba) or
    "numpy"; ``scores``: how many scores the call computes at most, what the size rules count; ``reason``: the
    rule (or the argument, the environment, the tune profile) that decided the path, then the kernel."""
    name: str
    kernel: str = "numpy"
    scores: int = 0
    reason: str = ""

    def __str__(self) -> str:
        if self.name == "tiled":
            return f"tiled, {_kernels.kernel_name(self.kernel)}"
        if self.name == "naive" and self.kernel == "fused":
            return "naive, fused softmax (numba, polynomial exp2, one pass per row)"
        if self.name == "decode" and self.kernel == "fused":
            return "decode, fused (numba, one call for every head and its group)"
        return f"{self.name}, numpy softmax (exp)"


def path_rule(c: Checked, *, training: bool = False, weights: bool = False, lse: bool = False) -> tuple[str, str]:
    """The rule for the path, ``(name, why)``: the tiled kernel from ``TILED_MIN_QUERIES`` queries and
    ``TILED_MIN_SCORES`` scores per head without a bias (or whenever ``lse`` is asked for), the decode step
    for one query per head that sees every key (not in training, not for the weights), else the naive grid."""
    if not weights and c.bias is None and lse:
        return "tiled", "return_lse: the tiled kernel keeps the lse"
    if not weights and c.bias is None and tiled_sizes(c.q.shape[-2], c.k.shape[-2]):
        return "tiled", (f"rule: n_q >= TILED_MIN_QUERIES ({TILED_MIN_QUERIES}) and n_q·n_k >= TILED_MIN_SCORES "
                         f"({TILED_MIN_SCORES}) per head, no bias")
    if not (weights or training) and decode.takes_decode_path(c):
        return "decode", "rule: one query per head, every key visible, no bias"
    if c.bias is not None:
        return "naive", "rule: a bias (only the naive grid takes one)"
    return "naive", "rule: below the tiled kernel's sizes"


def forced_path(c: Checked, name: str, *, training: bool, weights: bool) -> str:
    """Check that ``implementation=name`` can run these inputs; ValueError saying why not."""
    name = as_choice("implementation", name, IMPLEMENTATIONS)
    if weights and name != "naive":
        raise ValueError(f"implementation={name!r} cannot give the weights: only 'naive' holds the whole grid")
    if name == "tiled" and c.bias is not None:
        raise ValueError("implementation='tiled' takes no bias: pass the bias to implementation='naive' (or None)")
    if name == "decode":
        if training:
            raise ValueError("implementation='decode' has no backward: a training forward takes 'naive' or 'tiled'")
        if not decode.takes_decode_path(c):
            raise ValueError(f"implementation='decode' needs one query per head (n_q == 1, got {c.q.shape[-2]}) "
                             f"that sees every key (no mask, no bias, nothing hidden by causality or a window)")
    return f"implementation={name!r}"


def forced_kernel(c: Checked, path: str, kernel: str) -> str:
    """Check that ``kernel=kernel`` can run on ``path``; ValueError saying why not."""
    kernel = as_choice("kernel", kernel, KERNELS)
    if kernel == "fused":
        if _kernels.numba_disabled():
            raise ValueError(f"kernel='fused' needs numba, and {_kernels.NO_NUMBA_ENV} is set")
        if not _kernels.numba_installed() or _kernels.load_fused() is None:
            raise ValueError("kernel='fused' needs numba (pip install 'attnlab[fast]'), which is not installed")
        if path == "naive" and c.bias is not None:
            raise ValueError("kernel='fused' takes no bias on the naive path: its fused softmax has none")
        if path in ("naive", "decode") and c.sink is not None:
            raise ValueError(f"kernel='fused' takes no sink on the {path} path (the tiled path's does)")
        if path == "decode" and not decode.fused_fits(c):
            raise ValueError("kernel='fused' on the decode path needs the key/value heads' leading axes to be the "
                             "query's (no broadcasting) and d_head > 0")
    return f"kernel={kernel!r}"


def choose_path(c: Checked, *, training: bool = False, weights: bool = False, implementation: str | None = None,
                kernel: str | None = None, lse: bool = False) -> Path:
    """The one place that decides which path and kernel run, for checked inputs ``c``; ``training``: the
    forward of a training step (attention_forward), which has no decode path; ``weights``: the whole grid of
    weights is asked for (attention_weights), which only the naive path holds; ``lse``: the log-sum-exp is
    asked for, which the tiled path keeps. ``implementation`` and ``kernel`` force one (ValueError when it
    cannot run); else :func:`path_rule` and the kernel rules decide
    (:func:`attnlab.kernels._kernels.kernel_choice`, :func:`attnlab.kernels.decode.decode_choice`).
    Logs the choice at DEBUG level."""
    scores = c.q.shape[-2] * c.k.shape[-2]
    for n in c.batch:
        scores *= n                                      # (a product of Python ints: no numpy call)
    if implementation is None:
        name, why = path_rule(c, training=training, weights=weights, lse=lse)
    else:
        name, why = implementation, forced_path(c, implementation, training=training, weights=weights)
        if lse and name != "tiled":
            raise ValueError(f"return_lse=True needs implementation='tiled' (or None), got {name!r}")
    if kernel is not None:
        kernel_why = forced_kernel(c, name, kernel)
    elif name == "decode":
        kernel, kernel_why = decode.decode_choice(c, scores)
    elif name == "naive" and c.bias is not None:
        kernel, kernel_why = "numpy", "the fused softmax takes no bias"
    elif name == "naive" and c.sink is not None:
        kernel, kernel_why = "numpy", "the fused softmax takes no sink"
    else:
        kernel, kernel_why = _kernels.kernel_choice(scores, masked=c.is_causal or c.keep is not None)
    path = Path(name, kernel, scores, f"{why}; {kernel_why}")
    if log.isEnabledFor(logging.DEBUG):
        log.debug("attention path: %s; q %s, k %s; %s", path, c.q.shape, c.k.shape, path.reason)
    return path


def attention_path(query, key, value, *, mask=None, bias=None, is_causal=False, window=None, q_offset=None,
                   scale=None, softcap=None, sink=None, implementation=None, kernel=None,
                   return_lse=False, training=False) -> Path:
    """The path and kernel :func:`attention` (or, with ``training``, :func:`attention_forward`) takes for these
    arguments, and why (``Path.reason``), computing no attention: what ``attnlab bench`` reports beside each
    figure. Raises what :func:`attention` raises for arguments it refuses, and ValueError for an
    ``implementation`` or ``kernel`` that cannot run them.

    Examples
    --------
    >>> q = np.zeros((2, 1, 8))
    >>> path = attention_path(q, np.zeros((2, 5, 8)), np.zeros((2, 5, 8)))
    >>> path.name, path.reason.split(";")[0]
    ('decode', 'rule: one query per head, every key visible, no bias')
    """
    c = check_attention_args(query, key, value, mask=mask, bias=bias, is_causal=is_causal, window=window,
                             q_offset=q_offset, scale=scale, softcap=softcap, sink=sink, require_finite=False)
    return choose_path(c, training=check_flag("training", training), implementation=implementation, kernel=kernel,
                       lse=check_flag("return_lse", return_lse))


def run_path(c: Checked, path: Path, *, workers=None, lse: bool = False):
    """Run ``path`` on checked inputs: the output (..., h, n_q, d_v) in the caller's dtype, with ``lse``
    also the log-sum-exp (..., h, n_q) (the tiled path only)."""
    if path.name == "tiled":
        out, l = tiled.tiled_forward(c, tiled.make_plan(c, workers=workers), kernel=path.kernel,
                                     workers=workers)    # (..., h, n_q, d_v), (..., h, n_q)
        if c.sink is not None:
            out, l = sinks.rescale(out, l, c.sink)       # the sink in each row's denominator, once per row
        out = out.astype(c.out_dtype, copy=False)
        return (out, l) if lse else out
    if path.name == "decode":
        out = decode.decode_attention(c, path.kernel)    # (..., h, 1, d_v)
    else:
        out = naive.naive_attention_out(c, path.kernel, workers=workers)   # (..., h, n_q, d_v)
    return out.astype(c.out_dtype, copy=False)


def attention(query, key, value, *, mask=None, bias=None, is_causal=False, window=None, q_offset=None, scale=None,
              softcap=None, sink=None, check_finite=True, implementation=None, kernel=None, return_lse=False,
              workers=None):
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
    sink : float array broadcasting to (..., h), optional
        Learned attention sinks (gpt-oss): one logit per head that joins each row's softmax denominator and
        has no value, ``a_ij = exp(s_ij) / (exp(sink_h) + Σ_j exp(s_ij))`` (:mod:`attnlab.kernels.sinks`).
        Every path takes it (the fused kernel on the tiled path only); :func:`attention_grad` then returns a
        fourth gradient, dL/dsink in the sink's shape.
    check_finite : bool
        Refuse NaN/inf in the inputs (default), or let them propagate.
    implementation : {None, "naive", "tiled", "decode"}
        Force a path (as JAX's ``dot_product_attention(implementation=)``): "naive" (the whole grid of scores),
        "tiled" (FlashAttention's online softmax; no bias), "decode" (one query per head that sees every key).
        None (default): the rule decides (:func:`path_rule`).
    kernel : {None, "numpy", "fused"}
        Force the kernel: "fused" needs numba (``attnlab[fast]``, ``ATTNLAB_NO_NUMBA`` unset). None (default):
        the size rule, or the tune profile (``attnlab tune``), decides.
    return_lse : bool
        Also return ``lse = log Σ_j exp(s_j)`` per query (..., h, n_q), ``-inf`` for a query that sees no key
        (what :func:`attnlab.kernels.tiled.attention_weights_rows` and the distributed merge need). Runs the
        tiled path, which keeps it.
    workers : int, optional
        Threads the naive and tiled paths split their work over (default: the usable cores; the result does
        not depend on it).

    Returns
    -------
    out : (..., h, n_q, d_v), in the inputs' dtype (float16 is computed in float32)
    lse : (..., h, n_q), in the compute dtype, only with ``return_lse=True``

    Raises
    ------
    TypeError
        When an input is not a float array (integer input is refused) or ``is_causal`` is not a bool.
    ValueError
        When the shapes do not line up (named, with both shapes), the query heads are not a multiple of
        the key/value heads, an input holds NaN/inf, or a forced ``implementation``/``kernel`` cannot run
        these inputs (decode needs n_q == 1, fused needs numba, tiled takes no bias, ...).

    A query with no key left to attend to gets output 0: no NaN, no warning. The weights themselves come
    from :func:`attention_weights`.

    From ``TILED_MIN_QUERIES`` queries and ``TILED_MIN_SCORES`` scores per head (without ``bias``) the work
    goes to the tiled kernel (:mod:`attnlab.kernels.tiled`), which gives the same result without building the
    grid; one query per head with every key visible goes to the decode step (:mod:`attnlab.kernels.decode`).
    :func:`attention_path` says which path and kernel a call takes, and why.

    Examples
    --------
    The guide's hand example: the query of "sat" against the keys of "the cat sat".

    >>> k = np.array([[0., 0.], [2., 0.], [1., 1.]])
    >>> v = np.array([[1., 0.], [0., 1.], [1., 1.]])
    >>> attention(np.array([[1., 0.]]), k, v, scale=1.0).round(3)
    array([[0.335, 0.91 ]])
    """
    c = check_attention_args(query, key, value, mask=mask, bias=bias, is_causal=is_causal, window=window,
                             q_offset=q_offset, scale=scale, softcap=softcap, sink=sink,
                             require_finite=check_flag("check_finite", check_finite))
    lse = check_flag("return_lse", return_lse)
    workers = as_positive_int("workers", workers, allow_none=True)
    path = choose_path(c, implementation=implementation, kernel=kernel, lse=lse)
    return run_path(c, path, workers=workers, lse=lse)


def attend(query, key, value, *, mask=None, bias=None, is_causal=False, window=None, q_offset=None, scale=None,
           softcap=None, sink=None, check_finite=True):
    """:func:`attention` for the stack's own arrays, checked once at the public door: the internal entry.

    A layer's q, k and v are float arrays of one dtype, (..., h, n_q, d) and (..., h_kv, n_k, d) with the same
    leading axes and h a multiple of h_kv, and its options come from a validated config: so when nothing
    needs a check (``check_finite=False``: the layer has bounded its inputs, no ``mask``, no ``bias``, float32
    or float64) this builds the checked inputs directly and runs the path the rule picks, skipping the argument
    checks (a decode step's 54 of 196 Python calls for 2 layers). Anything else goes through
    :func:`attention`. Same result as :func:`attention` on the same arguments, bit for bit.

    A float16 KV cache's keys and values with a float32 query stay float16 for the decode path, which computes
    as llama.cpp does against its float16 cache (:mod:`attnlab.kernels.decode`), checked or not; any other path
    gets float32 copies, as :func:`attention` makes (which computes mixed dtypes in float32 throughout).
    """
    half_cache = query.dtype == np.float32 and key.dtype == value.dtype == np.float16   # a float16 KV cache's
    if half_cache and check_finite and mask is None and bias is None:
        check_attention_args(query, key, value, is_causal=is_causal, window=window, q_offset=q_offset, scale=scale,
                             softcap=softcap, sink=sink)   # refuses what attention would; the step stays the cache's
        check_finite = False
    if (check_finite or mask is not None or bias is not None
            or (query.dtype != key.dtype and not half_cache) or key.dtype != value.dtype
            or query.dtype == np.float16 or query.ndim < 3
            or query.shape[:-3] != key.shape[:-3] or key.shape[:-3] != value.shape[:-3]):
        return attention(query, key, value, mask=mask, bias=bias, is_causal=is_causal, window=window,
                         q_offset=q_offset, scale=scale, softcap=softcap, sink=sink, check_finite=check_finite)
    h, h_kv, n_q, n_k, d_k = query.shape[-3], key.shape[-3], query.shape[-2], key.shape[-2], query.shape[-1]
    assert h % h_kv == 0 and key.shape[-1] == d_k and value.shape[-2] == n_k, (query.shape, key.shape, value.shape)
    c = Checked(q=query, k=key, v=value, keep=None, bias=None,
                scale=(1.0 / math.sqrt(d_k) if d_k else 1.0) if scale is None else float(scale), out_dtype=query.dtype,
                batch=query.shape[:-2], is_causal=is_causal, window=window,
                q_offset=n_k - n_q if q_offset is None else q_offset,
                groups=h // h_kv if h > h_kv > 1 else 1, softcap=softcap,
                sink=None if sink is None else sink.astype(query.dtype, copy=False))
    chosen = answers()                                     # inside a step: each kind of call chosen once
    if chosen is None:
        path = choose_path(c)
    else:
        kind = ("attention path", query.shape, key.shape, value.shape, query.dtype, key.dtype, is_causal, window,
                c.q_offset, c.scale, softcap, sink is None)   # everything choose_path reads of c, as a key
        path = chosen.get(kind)
        if path is None:
            path = chosen[kind] = choose_path(c)
    if half_cache and path.name != "decode":
        c = decode.widened(c)                              # only the decode step reads float16 as it is
    return run_path(c, path)


def attention_weights(query, key, *, mask=None, bias=None, is_causal=False, window=None, q_offset=None,
                      scale=None, softcap=None, sink=None) -> np.ndarray:
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
                             q_offset=q_offset, scale=scale, softcap=softcap, sink=sink)
    path = choose_path(c, weights=True)
    a = naive.naive_weights(c, path.kernel)              # (..., h, n_q, n_k)
    return a.astype(c.out_dtype, copy=False)


# ----------------------------------------------------------------------------------------------------
# forward and backward as a pair: the forward keeps what its backward needs (for training)


def attention_forward(query, key, value, *, mask=None, bias=None, is_causal=False, window=None, q_offset=None,
                      scale=None, softcap=None, sink=None) -> tuple[np.ndarray, Saved]:
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
                             q_offset=q_offset, scale=scale, softcap=softcap, sink=sink)
    path = choose_path(c, training=True)
    if path.name == "tiled":
        out, saved = tiled.tiled_forward_saved(c, (query, key, value), kernel=path.kernel)   # (..., h, n_q, d_v)
        if c.sink is not None:                           # the backward reads the sink-aware out and lse
            out, lse = sinks.rescale(out, saved.lse, c.sink)   # (..., h, n_q, d_v), (..., h, n_q)
            saved = replace(saved, out=out, lse=lse)
    else:
        out, saved = naive.naive_forward(c, (query, key, value), path.kernel)   # (..., h, n_q, d_v), NaiveSaved
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
    grads = grads_like(grads, saved.inputs)
    if c.sink is None:
        return grads
    # forward: the sink is one more score of value 0 in each row: dsink = −Σ_i p_sink,i (dout_i · out_i)
    p_sink = saved.p_sink if isinstance(saved, NaiveSaved) else sinks.sink_weight(saved.lse, c.sink)   # (..., h, n_q)
    return (*grads, sinks.sink_grad(p_sink, saved.out, do, c.sink.shape))


def attention_grad(query, key, value, dout, *, mask=None, bias=None, is_causal=False, window=None, q_offset=None,
                   scale=None, softcap=None, sink=None) -> tuple:
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
        over each group of query heads. With a ``sink``, a fourth: dL/dsink in the sink's shape.

    Raises
    ------
    ValueError, TypeError
        As :func:`attention` does, and when ``dout`` does not have the output's shape.
    """
    _, saved = attention_forward(query, key, value, mask=mask, bias=bias, is_causal=is_causal, window=window,
                                 q_offset=q_offset, scale=scale, softcap=softcap, sink=sink)
    return attention_backward(saved, dout)
