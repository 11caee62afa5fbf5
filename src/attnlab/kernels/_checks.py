"""Argument checks shared by the public entry points, and the validated attention inputs.

Every check raises ``TypeError`` (wrong kind of thing) or ``ValueError`` (right kind, bad value),
and every message names the argument, what was expected, and what arrived. This module sits below every
attention path (naive, tiled, decode) and imports nothing of attnlab.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

FLOAT_DTYPES = (np.float16, np.float32, np.float64)


def as_float_array(name: str, x, *, min_ndim: int = 0, finite: bool = False) -> np.ndarray:
    """``x`` as a float16/32/64 array of at least ``min_ndim`` axes; ints, bools, complex, objects refused."""
    if isinstance(x, (str, bytes)) or x is None:
        raise TypeError(f"{name} must be a float array, got {type(x).__name__}")
    arr = np.asarray(x)
    if arr.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a float array (float16, float32 or float64), got dtype {arr.dtype}")
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} axes, got shape {arr.shape}")
    if finite:
        check_finite(name, arr)
    return arr


def check_finite(name: str, arr: np.ndarray) -> float:
    """Refuse NaN and ±inf, saying where the first one is; returns the largest magnitude (0 if empty)."""
    if arr.size == 0:
        return 0.0
    # two passes, no temporary, no Python wrapper (ndarray.min's); NaN propagates through both
    lo, hi = np.minimum.reduce(arr, axis=None), np.maximum.reduce(arr, axis=None)
    if -np.inf < lo and hi < np.inf:    # False for NaN too (operators: no calls on the decode step's path)
        return float(hi) if hi > -lo else float(-lo)
    bad = ~np.isfinite(arr)
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    raise ValueError(
        f"{name} must be finite, got {arr[where]} at index {where} "
        f"({int(bad.sum())} non-finite values); pass check_finite=False to let them propagate")


# Every path shifts the scores by a row's maximum before the exponential, so only the scores themselves (and
# the weighted sums of values) can overflow. A score stays below max/SCORE_ROOM (room for log₂e folded into
# the scale, a bias, and a shift of the same size); a weighted sum of n_k values, each weighed by at most
# 2^44 (the tiled kernels' e^30 of slack before they rescale), below the dtype's max.
SCORE_ROOM, VALUE_WEIGHT = 8.0, 2.0 ** 44
LIMITS = {np.dtype(t): float(np.finfo(t).max) for t in (np.float32, np.float64)}   # by compute dtype
LIMITS[np.dtype(np.float16)] = LIMITS[np.dtype(np.float32)]                         # float16 computes in float32


def check_ranges(c: "Checked", q_max: float, k_max: float, v_max: float, bias_max: float = 0.0) -> None:
    """Refuse inputs whose scores, or weighted sums of values, would overflow the compute dtype, naming the
    scale and the largest score. ``*_max``: the inputs' largest magnitudes (from :func:`check_finite`).

    The cheap test bounds every score by ``d_k · max|q| · max|k|`` (times the scale, or not, as the naive
    paths form q kᵀ before scaling); only when that bound is too large are the scores computed, in float64."""
    limit = LIMITS[c.q.dtype]
    d_k, n_k = c.q.shape[-1], c.k.shape[-2]
    if v_max * max(n_k, 1) * VALUE_WEIGHT > limit:
        raise ValueError(f"value holds {v_max:.3g}: a weighted sum of its {n_k} rows could overflow {c.q.dtype} "
                         f"(max {limit:.3g}); scale value down, or pass float64 arrays")
    if surely_fits(c.q.dtype, d_k, n_k, c.scale, q_max, k_max, v_max, bias_max):
        return
    raw = largest_score(c)                                              # |q·k| at most, in float64
    largest = raw * c.scale + bias_max
    if max(raw, largest) * SCORE_ROOM > limit or not np.isfinite(raw):
        raise ValueError(f"the attention scores overflow {c.q.dtype}: scale {c.scale:.3g} times the largest "
                         f"query·key {raw:.3g} gives a largest score of {largest:.3g}, and {c.q.dtype} holds "
                         f"scores up to {limit / SCORE_ROOM:.3g} here; scale query or key down, or pass float64")


def surely_fits(dtype, d_k: int, n_k: int, scale: float, q_max: float, k_max: float, v_max: float,
                bias_max: float = 0.0) -> bool:
    """Whether inputs of these largest magnitudes cannot overflow ``dtype`` on any path (the cheap test of
    :func:`check_ranges`; False means "look closer", not "overflows")."""
    limit = LIMITS[dtype]                                       # Python floats: no overflow warning, no call
    bound = d_k * q_max * k_max * (scale if scale > 1.0 else 1.0)
    return (bound + bias_max) * SCORE_ROOM <= limit and v_max * (n_k if n_k > 1 else 1) * VALUE_WEIGHT <= limit


def largest_score(c: "Checked", rows: int = 256) -> float:
    """max |q·k| over the whole grid, in float64, ``rows`` folded query rows at a time (the slow path of
    :func:`check_ranges`, for inputs of huge magnitude only)."""
    q = fold(c.q, c.groups).astype(np.float64)                          # (..., h_kv, g·n_q, d_k)
    kT = np.swapaxes(c.k, -1, -2).astype(np.float64)                    # (..., h_kv, d_k, n_k)
    largest = 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(0, q.shape[-2], rows):
            s = q[..., i:i + rows, :] @ kT                                  # (..., h_kv, ≤rows, n_k)
            if s.size:
                largest = max(largest, float(np.max(np.abs(s))))
    return largest if np.isfinite(largest) else np.inf


def check_flag(name: str, v) -> bool:
    """A True/False option; 1, "yes" or None are refused rather than read as truthy."""
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {type(v).__name__} {v!r}")
    return bool(v)


def as_bool_array(name: str, x) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype != np.bool_:
        raise TypeError(f"{name} must be a bool array (True = may attend), got dtype {arr.dtype}")
    return arr


def as_positive_int(name: str, v, *, allow_none: bool = False) -> int | None:
    if v is None and allow_none:
        return None
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer, got {type(v).__name__} {v!r}")
    if v < 1:
        raise ValueError(f"{name} must be a positive integer, got {v}")
    return int(v)


def as_positive_float(name: str, v) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a positive number, got {type(v).__name__} {v!r}")
    if not (np.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a positive finite number, got {v}")
    return float(v)


def as_finite_float(name: str, v) -> float:
    """``v`` as a float that is neither NaN nor ±inf; bools and non-numbers refused."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a finite number, got {type(v).__name__} {v!r}")
    if not np.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v}")
    return float(v)


def broadcast_to(name: str, arr: np.ndarray, shape: tuple, what: str) -> np.ndarray:
    """``arr`` broadcast to ``shape``, or an error naming both shapes."""
    try:
        return np.broadcast_to(arr, shape)
    except ValueError:
        raise ValueError(f"{name} has shape {arr.shape}, which does not broadcast to {what} {shape}") from None


def compute_dtype(*arrays: np.ndarray) -> np.dtype:
    """The dtype the math runs in: the arrays' common float type, at least float32."""
    return np.result_type(np.float32, *arrays)


def as_nonnegative_int(name: str, v) -> int:
    """``v`` as an int >= 0; bools and floats refused."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an integer >= 0, got {type(v).__name__} {v!r}")
    if v < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {v}")
    return int(v)


def as_int(name: str, v) -> int:
    """``v`` as an int of any sign; bools and floats refused."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(v).__name__} {v!r}")
    return int(v)


def as_choice(name: str, v, choices: tuple[str, ...]) -> str:
    """``v`` as one of ``choices``."""
    if v not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {v!r}")
    return v


def check_rng(rng) -> np.random.Generator:
    """Randomness comes only from an explicit ``numpy.random.Generator``."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng


def as_token_ids(name: str, ids, vocab_size: int) -> np.ndarray:
    """``ids`` as an int64 array of token ids (..., n), n >= 1, each in 0 … vocab_size − 1.

    Text, floats and bools are refused with TypeError; an empty array or an id out of range with ValueError.
    """
    if isinstance(ids, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of integer token ids, got {type(ids).__name__}; "
                        "tokenize text first")
    arr = np.asarray(ids)
    if arr.ndim == 0 or arr.shape[-1] == 0:
        raise ValueError(f"{name} must hold at least one token id, got shape {arr.shape}")
    if arr.dtype.kind not in "iu" and not (arr.dtype == object and all(
            isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in arr.ravel().tolist())):
        raise TypeError(f"{name} must hold integer token ids, got dtype {arr.dtype}")
    bad = (arr < 0) | (arr >= vocab_size)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name} must be in [0, {vocab_size}) (the model's vocab_size), got {arr[where]} at index "
                         f"{where[0] if len(where) == 1 else where}")
    return arr.astype(np.int64, copy=False)


def as_stop_ids(name: str, stop, vocab_size: int) -> np.ndarray:
    """``stop`` (a token id, or a collection of ids, possibly empty) as an int64 array (k,) of ids in
    0 … vocab_size − 1; TypeError for text, floats, bools or a nested collection, ValueError out of range."""
    if isinstance(stop, numbers.Integral) and not isinstance(stop, (bool, np.bool_)):
        stop = [stop]
    if isinstance(stop, (set, frozenset)):
        stop = sorted(stop, key=repr)
    if not isinstance(stop, (list, tuple, np.ndarray)):
        raise TypeError(f"{name} must be a token id or a collection of token ids, got {type(stop).__name__}")
    if len(stop) == 0:
        return np.empty(0, np.int64)                                           # (0,) nothing stops
    ids = as_token_ids(name, stop, vocab_size)                                 # (k,)
    if ids.ndim != 1:
        raise TypeError(f"{name} must be a token id or a flat collection of token ids, got shape {ids.shape}")
    return ids


# ----------------------------------------------------------------------------------------------------
# attention's arguments, checked once for every path


@dataclass(frozen=True)
class Checked:
    """Validated attention inputs, in the dtype the math runs in (at least float32); the one exception, k and v
    of a float16 KV cache under a float32 q, which :func:`attnlab.kernels.attention.attend` keeps for the decode
    path alone (its kernels widen them; :func:`attnlab.kernels.decode.widened` for any other).

    Grouped-query attention (GQA): ``q`` has ``groups`` times as many heads (axis -3) as ``k`` and ``v``;
    query head i uses key/value head ``i // groups``. ``groups`` is 1 otherwise (heads match or broadcast).
    """
    q: np.ndarray            # (..., h, n_q, d_k)
    k: np.ndarray            # (..., h_kv, n_k, d_k)
    v: np.ndarray            # (..., h_kv, n_k, d_v)
    keep: np.ndarray | None  # (..., h, n_q, n_k) bool, the caller's mask broadcast to the grid, or None
    bias: np.ndarray | None  # (..., h, n_q, n_k) additive, or None
    scale: float
    out_dtype: np.dtype      # what the caller gets back
    batch: tuple             # the output's leading axes (..., h)
    is_causal: bool = False
    window: int | None = None  # with is_causal: the last `window` keys up to each query
    q_offset: int = 0        # the key index query 0 sits at (causal and window)
    groups: int = 1          # query heads per key/value head
    softcap: float | None = None   # scores capped to cap · tanh(s / cap) before bias and mask (Gemma-2)
    sink: np.ndarray | None = None  # learned sink logits (gpt-oss), as given: broadcast to (..., h); see kernels.sinks

    @property
    def causal_hides_keys(self) -> bool:
        """Whether causality (or the window) hides any score of the (n_q, n_k) grid."""
        n_q, n_k = self.q.shape[-2], self.k.shape[-2]
        return self.is_causal and n_q > 0 and n_k > 0 and hides_keys(n_q, n_k, self.window, self.q_offset)


def hides_keys(n_q: int, n_k: int, window: int | None, q_offset: int) -> bool:
    """Whether the causal mask (query 0 at key ``q_offset``, optional ``window``) hides any of n_q × n_k
    scores: the first query sees the last key only when ``q_offset >= n_k - 1``, and the last query the
    first key only when it is inside the window."""
    return q_offset < n_k - 1 or (window is not None and n_q - 1 + q_offset - window >= 0)


def check_attention_args(query, key, value, *, mask=None, bias=None, is_causal=False, window=None, q_offset=None,
                         scale=None, softcap=None, sink=None, require_finite: bool = True) -> Checked:
    """Validate the arguments that every attention path shares; raise with names and shapes."""
    is_causal = check_flag("is_causal", is_causal)
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
    groups = head_groups(query, key, value)
    batch = leading_axes(query, key, value, groups)
    if require_finite:
        largest = {name: check_finite(name, arr) for name, arr in (("query", query), ("key", key), ("value", value))}
    n_q, n_k = query.shape[-2], key.shape[-2]
    grid = (*batch, n_q, n_k)
    keep = None
    if mask is not None:
        keep = broadcast_to("mask", as_bool_array("mask", mask), grid, "the score grid (..., n_q, n_k) =")
    if bias is not None:
        given = as_float_array("bias", bias)
        bias = broadcast_to("bias", given, grid, "the score grid (..., n_q, n_k) =")
        if require_finite and (np.isnan(given).any() or np.isposinf(given).any()):   # as given: a broadcast
            raise ValueError("bias must be finite or -inf (to drop a score), got NaN or +inf")   # repeats it
    d_k = query.shape[-1]        # with no width every score is 0 (an empty dot product): any scale, uniform weights
    scale = (1.0 / np.sqrt(d_k) if d_k else 1.0) if scale is None else as_positive_float("scale", scale)
    softcap = None if softcap is None else as_positive_float("softcap", softcap)
    dt = compute_dtype(query, key, value)
    if sink is not None:                                     # one logit per head, joining each row's softmax
        sink = as_float_array("sink", sink)
        broadcast_to("sink", sink, batch, "the heads' axes (..., h) =")
        check_finite("sink", sink)
        sink = sink.astype(dt, copy=False)
    c = Checked(q=query.astype(dt, copy=False), k=key.astype(dt, copy=False), v=value.astype(dt, copy=False),
                   keep=keep, bias=bias, scale=float(scale), out_dtype=np.result_type(query, key, value),
                   batch=batch, is_causal=is_causal, window=window,
                   q_offset=n_k - n_q if q_offset is None else as_int("q_offset", q_offset), groups=groups,
                softcap=softcap, sink=sink)
    if require_finite:
        finite_bias = 0.0 if bias is None else float(np.max(np.abs(given), initial=0.0, where=np.isfinite(given)))
        check_ranges(c, largest["query"], largest["key"], largest["value"], finite_bias)
    return c


def cap_scores(s: np.ndarray, cap: float | None) -> np.ndarray:
    """Soft-capping in place (Gemma-2): ``s = cap · tanh(s / cap)``, which keeps |s| < cap and is the identity
    near 0; ``cap`` None leaves s. Scores in another unit (base 2) cap alike with ``cap`` in that unit."""
    if cap is not None:
        s /= cap
        np.tanh(s, out=s)
        s *= cap
    return s


def cap_slope(s_capped: np.ndarray, cap: float | None) -> np.ndarray | None:
    """d(cap · tanh(s / cap))/ds = 1 − tanh², from the capped scores (..., n_q, n_k) before any mask (they are
    finite); None without a cap."""
    if cap is None:
        return None
    t = s_capped / cap                                       # tanh(s / cap)
    return 1.0 - t * t


def n_heads_of(x: np.ndarray) -> int:
    """The head axis (-3) of a (..., h, n, d) array; 1 without one."""
    return x.shape[-3] if x.ndim >= 3 else 1


def head_groups(query: np.ndarray, key: np.ndarray, value: np.ndarray) -> int:
    """Query heads per key/value head: ``n_heads // n_kv_heads`` for grouped-query attention, else 1.

    Heads that are equal, or 1 on either side, broadcast as any leading axis does (groups = 1); so does a
    query with fewer heads than the key (which then fails to broadcast, naming the shapes).
    """
    n_heads, n_kv_heads = n_heads_of(query), n_heads_of(key)
    if n_heads <= n_kv_heads or n_kv_heads == 1:
        return 1                      # as many heads, or fewer, or one shared: plain broadcasting
    if n_heads % n_kv_heads:
        raise ValueError(
            f"query has {n_heads} heads (axis -3) and key has {n_kv_heads}: grouped-query attention needs "
            f"n_heads to be a multiple of n_kv_heads (query head i uses key/value head i // (n_heads // "
            f"n_kv_heads)); got shapes query {query.shape}, key {key.shape}")
    if n_heads_of(value) not in (1, n_kv_heads):
        raise ValueError(f"value has {n_heads_of(value)} heads (axis -3) and key has {n_kv_heads}; "
                         f"with grouped-query attention they must match (or value has 1)")
    return n_heads // n_kv_heads


def leading_axes(query: np.ndarray, key: np.ndarray, value: np.ndarray, groups: int) -> tuple:
    """The output's leading axes (..., h): query's, key's and value's broadcast, the key/value heads
    counted ``groups`` times."""
    def as_query_heads(x):
        lead = x.shape[:-2]
        return (*lead[:-1], lead[-1] * groups) if groups > 1 and lead and lead[-1] > 1 else lead
    try:
        return np.broadcast_shapes(query.shape[:-2], as_query_heads(key), as_query_heads(value))
    except ValueError:
        raise ValueError(f"the leading axes of query {query.shape}, key {key.shape} and value {value.shape} "
                         "do not broadcast") from None


def fold(x: np.ndarray, groups: int) -> np.ndarray:
    """(..., h, n, d) -> (..., h / groups, groups·n, d): the query heads of a group stacked as rows, so a
    group is one matmul against its key/value head (a view when x is contiguous)."""
    if groups == 1:
        return x
    *lead, h, n, d = x.shape
    return x.reshape(*lead, h // groups, groups * n, d)      # (..., h_kv, g·n, d)


def unfold(x: np.ndarray, groups: int) -> np.ndarray:
    """Undo :func:`fold`: (..., h_kv, groups·n, d) -> (..., h_kv·groups, n, d)."""
    if groups == 1:
        return x
    *lead, h_kv, gn, d = x.shape
    return x.reshape(*lead, h_kv * groups, gn // groups, d)  # (..., h, n, d)


def check_dout(c: Checked, dout) -> np.ndarray:
    """``dout`` as an array of the output's shape (..., n_q, d_v), in the compute dtype."""
    out_shape = (*c.batch, c.q.shape[-2], c.v.shape[-1])
    do = as_float_array("dout", dout)
    if do.shape != out_shape:
        raise ValueError(f"dout must have the output's shape {out_shape}, got {do.shape}")
    return do.astype(c.q.dtype, copy=False)


def grads_like(grads, inputs) -> tuple:
    """Each gradient summed back over broadcast axes to its input's shape, in its input's dtype."""
    return tuple(unbroadcast(g, np.shape(x)).astype(np.asarray(x).dtype, copy=False)
                 for g, x in zip(grads, inputs))


def unbroadcast(g: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum ``g`` over the axes that broadcasting added or stretched, back to ``shape``."""
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead))) if lead else g                       # drop added axes
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=stretched, keepdims=True) if stretched else g         # (shape)
