"""Positions: telling attention where each token sits.

Attention without positions is blind to order (the guide's reversal check). Four ways to fix it:

- **learned** — a table ``W_P`` with one trained row per position, added to the token embeddings
  (GPT-2: 1,024 rows, so position 1,024 counted from 0 has no row; Radford et al., 2019);
- **sinusoidal** — fixed rows ``PE[pos, 2i] = sin(pos / 10000^(2i/d_model))``,
  ``PE[pos, 2i+1] = cos(pos / 10000^(2i/d_model))``, added the same way (Vaswani et al., 2017);
- **rope** — rotary embeddings: each pair of q and k features (2i, 2i+1) is rotated by the angle
  ``pos · θ_i`` with ``θ_i = 10000^(-2i/d_head)``, so the score ``q_m · k_n`` depends only on m − n
  (Su et al., 2021, RoFormer);
- **alibi** — no vectors at all: an additive bias ``−m_h · (i − j)`` on the scores of head h, with one
  slope m_h per head (Press et al., 2022, "Train short, test long").

Positions are absolute and start at ``start``: with a KV cache holding ``start`` tokens, the new tokens
sit at ``start, start + 1, …`` (bottom-right alignment, as :func:`attnlab.causal_mask` has it).
"""

from __future__ import annotations

import numpy as np

from ._checks import as_choice, as_float_array, as_positive_int

POSITION_SCHEMES = ("learned", "sinusoidal", "rope", "alibi")
ROPE_BASE = 10000.0        # θ's base in Su et al. (2021), the same 10,000 as the sinusoids'


def check_scheme(positions: str) -> str:
    """``positions`` if it names a scheme in :data:`POSITION_SCHEMES`, else a ValueError listing them."""
    return as_choice("positions", positions, POSITION_SCHEMES)


def position_ids(n: int, *, start: int = 0, n_max: int | None = None) -> np.ndarray:
    """The absolute positions ``start … start + n − 1``; with ``n_max``, refuse any past the table.

    >>> position_ids(3, start=2)
    array([2, 3, 4])
    >>> position_ids(2, start=1023, n_max=1024)
    Traceback (most recent call last):
    ...
    ValueError: position 1024 has no row: the table holds 1,024 positions (0 to 1023)
    """
    n = as_positive_int("n", n)
    if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or start < 0:
        raise ValueError(f"start must be a non-negative integer, got {start!r}")
    if n_max is not None and start + n > n_max:
        raise ValueError(f"position {max(start, n_max)} has no row: the table holds {n_max:,} positions "
                         f"(0 to {n_max - 1})")
    return np.arange(start, start + n)                      # (n,)


def learned_positions(W_P, n: int, *, start: int = 0) -> np.ndarray:
    """Rows ``start … start + n − 1`` of the learned table ``W_P`` (n_max, d_model): the guide's W_P[0, …, n−1]."""
    W_P = as_float_array("W_P", W_P, min_ndim=2)
    return W_P[position_ids(n, start=start, n_max=W_P.shape[0])]   # (n, d_model)


def sinusoidal_positions(n: int, d_model: int, *, start: int = 0, dtype=np.float64) -> np.ndarray:
    """The fixed sinusoids of Vaswani et al. (2017), (n, d_model); d_model must be even.

    >>> sinusoidal_positions(2, 4).round(4)
    array([[0.    , 1.    , 0.    , 1.    ],
           [0.8415, 0.5403, 0.01  , 1.    ]])
    """
    d_model = as_positive_int("d_model", d_model)
    if d_model % 2:
        raise ValueError(f"d_model must be even for sinusoidal positions (sin and cos pairs), got {d_model}")
    pos = position_ids(n, start=start)[:, None]              # (n, 1)
    rate = ROPE_BASE ** (-np.arange(0, d_model, 2) / d_model)   # (d_model/2,) 1/10000^(2i/d_model)
    pe = np.empty((n, d_model))                              # (n, d_model)
    pe[:, 0::2] = np.sin(pos * rate)                         # (n, d_model/2) even features
    pe[:, 1::2] = np.cos(pos * rate)                         # (n, d_model/2) odd features
    return pe.astype(dtype, copy=False)


def rope(x, *, start: int = 0, inverse: bool = False) -> np.ndarray:
    """Rotate q or k (..., n, d_head) at positions ``start … start + n − 1`` (Su et al., 2021).

    Features (2i, 2i+1) form a pair, turned by the angle ``pos · θ_i`` with ``θ_i = 10000^(−2i/d_head)``.
    A rotation keeps lengths, and rotating q by m·θ and k by n·θ turns their dot product by (m − n)·θ: the
    score sees only the offset. ``inverse=True`` rotates back, which is also RoPE's backward pass (the
    transpose of a rotation is its inverse).

    >>> q = np.array([[1.0, 0.0]])
    >>> rope(q, start=1).round(4)                # one radian at position 1, θ_0 = 1
    array([[0.5403, 0.8415]])
    >>> rope(rope(q, start=1), start=1, inverse=True)
    array([[1., 0.]])
    """
    x = as_float_array("x", x, min_ndim=2)
    n, d_head = x.shape[-2:]
    if d_head % 2:
        raise ValueError(f"rope needs an even head width (features rotate in pairs), got d_head {d_head}")
    angle = position_ids(n, start=start)[:, None] * ROPE_BASE ** (-np.arange(0, d_head, 2) / d_head)  # (n, d/2)
    cos, sin = np.cos(angle).astype(x.dtype), np.sin(angle).astype(x.dtype)    # (n, d_head/2) each
    if inverse:
        sin = -sin                                           # rotate by −pos·θ
    even, odd = x[..., 0::2], x[..., 1::2]                   # (..., n, d_head/2) each
    out = np.empty_like(x)                                   # (..., n, d_head)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def alibi_slopes(n_heads: int) -> np.ndarray:
    """ALiBi's one slope per head (Press et al., 2022): for 8 heads 1/2, 1/4, …, 1/256.

    For a power of two h the slopes are the geometric sequence starting at 2^(−8/h) with that ratio; other
    head counts take the closest smaller power of two and fill in with every other slope of twice that,
    as the paper's code does.

    >>> alibi_slopes(8) * 256
    array([128.,  64.,  32.,  16.,   8.,   4.,   2.,   1.])
    """
    n_heads = as_positive_int("n_heads", n_heads)

    def powers_of_two(h):
        return 2.0 ** (-8.0 / h * np.arange(1, h + 1))     # (h,)

    p = 2 ** int(np.floor(np.log2(n_heads)))
    if p == n_heads:
        return powers_of_two(n_heads)
    return np.concatenate([powers_of_two(p), powers_of_two(2 * p)[0::2][:n_heads - p]])   # (n_heads,)


def alibi_bias(slopes, n_q: int, n_k: int | None = None) -> np.ndarray:
    """The additive ALiBi term (h, n_q, n_k): ``−m_h · |i − j|`` for query position i and key position j.

    With ``n_k > n_q`` the queries are the last n_q positions (bottom-right alignment, as with a KV cache),
    so query row r sits at position ``r + n_k − n_q``. Under a causal mask only j ≤ i is seen, where this is
    the paper's ``−m · (i − j)``.

    >>> alibi_bias([0.5], 1, 3)
    array([[[-1. , -0.5, -0. ]]])
    """
    slopes = as_float_array("slopes", slopes, min_ndim=1)
    if slopes.ndim != 1:
        raise ValueError(f"slopes must be 1-D (n_heads,), got shape {slopes.shape}")
    n_q = as_positive_int("n_q", n_q)
    n_k = n_q if n_k is None else as_positive_int("n_k", n_k)
    if n_k < n_q:
        raise ValueError(f"n_k must be at least n_q (the queries are the last n_q of the n_k positions), "
                         f"got n_q {n_q} and n_k {n_k}")
    distance = np.abs(np.arange(n_q)[:, None] + (n_k - n_q) - np.arange(n_k)[None, :])   # (n_q, n_k)
    return -slopes[:, None, None] * distance                 # (h, n_q, n_k)
