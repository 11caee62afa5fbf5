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

Each scheme is also a small frozen object (:class:`Learned`, :class:`Sinusoidal`, :class:`RoPE`,
:class:`ALiBi`) that an :class:`attnlab.AttentionConfig` holds. The object says what the scheme does at
the two places a model asks: ``embed`` (rows added to the token embeddings, or None) and ``rotate`` /
``bias`` inside attention. :data:`POSITION_SCHEMES` maps each name to its class; no other module tests
a scheme's name.
"""

from __future__ import annotations

import functools

from dataclasses import dataclass

import numpy as np

from ..kernels._checks import as_choice, as_float_array, as_positive_float, as_positive_int

ROPE_BASE = 10000.0        # θ's base in Su et al. (2021), the same 10,000 as the sinusoids'


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


def rope(x, *, start: int = 0, inverse: bool = False, theta: float = ROPE_BASE, scaling=None,
         rotary_dim: int | None = None, positions=None) -> np.ndarray:
    """Rotate q or k (..., n, d_head) at positions ``start … start + n − 1`` (Su et al., 2021), or at
    ``start + positions``, an int array broadcasting against (..., n) (a padded batch's rows, each its own).

    Features (2i, 2i+1) form a pair, turned by the angle ``pos · θ_i`` with ``θ_i = theta^(−2i/d_head)``
    (theta = 10,000 in the paper); ``scaling`` as :class:`RoPE` takes it. ``rotary_dim`` (even, at most
    d_head) rotates only the first rotary_dim features, with ``θ_i = theta^(−2i/rotary_dim)``, and passes
    the rest through (partial rotation: GPT-NeoX's ``rotary_pct``, GPT-J's ``rotary_dim``).
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
    d_rot = d_head if rotary_dim is None else rotary_dim
    if d_rot % 2 or d_rot > d_head:
        raise ValueError(f"rope needs an even head width (features rotate in pairs; or an even rotary_dim of at "
                         f"most d_head), got d_head {d_head}, rotary_dim {rotary_dim}")
    if d_rot < d_head:                                        # partial rotation: the rest passes through
        out = x.copy()                                        # (..., n, d_head)
        out[..., :d_rot] = rope(x[..., :d_rot], start=start, inverse=inverse, theta=theta, scaling=scaling,
                                positions=positions)
        return out
    if positions is None:
        cos, sin = _rope_turns(n, start, d_head, theta, _hashable(scaling), bool(inverse), x.dtype)   # (n, d_head/2, 2)
    else:
        cos, sin = _turns_at(start + np.asarray(positions), d_head, theta, scaling, bool(inverse), x.dtype)
    pairs = x.reshape(*x.shape[:-1], d_head // 2, 2)          # (..., n, d_head/2, 2) features (2i, 2i+1)
    out = pairs * cos                                         # (..., n, d_head/2, 2) (x_2i cos, x_2i+1 cos)
    out += pairs[..., ::-1] * sin                             # + (−x_2i+1 sin, x_2i sin)
    return out.reshape(x.shape)                               # (..., n, d_head)


def _hashable(scaling):
    return None if scaling is None else tuple(sorted(dict(scaling).items()))


@functools.lru_cache(maxsize=64)
def _rope_turns(n: int, start: int, d_head: int, theta: float, scaling, inverse: bool, dtype):
    """cos and ±sin of RoPE's angles at positions start … start + n − 1, each (n, d_head/2, 2) so a pair
    (x_2i, x_2i+1) turns as ``pair · cos + reversed(pair) · sin``: the sin row is (−sin, +sin) (+, − to
    rotate back). Kept for the last 64 (n, start) asked: a decode step asks for one position at a time."""
    freq = rope_frequencies(d_head, theta, None if scaling is None else dict(scaling))   # (d_head/2,)
    angle = position_ids(n, start=start)[:, None] * freq      # (n, d_head/2)
    sign = np.array([1.0, -1.0] if inverse else [-1.0, 1.0])  # (2,)
    cos = np.repeat(np.cos(angle)[..., None], 2, axis=-1)     # (n, d_head/2, 2)
    sin = np.sin(angle)[..., None] * sign                     # (n, d_head/2, 2)
    cos, sin = cos.astype(dtype), sin.astype(dtype)
    cos.flags.writeable = sin.flags.writeable = False         # shared between calls
    return cos, sin


def _turns_at(pos: np.ndarray, d_head: int, theta: float, scaling, inverse: bool, dtype):
    """:func:`_rope_turns` at any positions (..., n): cos and ±sin (..., n, d_head/2, 2)."""
    freq = rope_frequencies(d_head, theta, None if scaling is None else dict(scaling))   # (d_head/2,)
    angle = pos[..., None].astype(np.float64) * freq           # (..., n, d_head/2)
    sign = np.array([1.0, -1.0]) if inverse else np.array([-1.0, 1.0])
    cos = np.repeat(np.cos(angle)[..., None], 2, -1)           # (..., n, d_head/2, 2)
    sin = np.sin(angle)[..., None] * sign                      # (..., n, d_head/2, 2)
    return cos.astype(dtype, copy=False), sin.astype(dtype, copy=False)


def rope_frequencies(d_head: int, theta: float = ROPE_BASE, scaling=None) -> np.ndarray:
    """θ_i = theta^(−2i/d_head) for i = 0 … d_head/2 − 1, (d_head/2,); with ``scaling`` stretched as
    Llama 3 (``rope_type`` "llama3": wavelengths past ``original_max_position_embeddings / low_freq_factor``
    divided by ``factor``, those below ``… / high_freq_factor`` kept, a smooth blend between) or linearly
    (``rope_type`` "linear": all divided by ``factor``), or each divided by its own of ``factors`` (``rope_type``
    "factors", the d_head/2 divisors a GGUF file's ``rope_freqs`` tensor holds, Llama 3's scaling worked out).

    >>> rope_frequencies(4, 100.0)
    array([1. , 0.1])
    """
    freq = theta ** (-np.arange(0, d_head, 2) / d_head)         # (d_head/2,)
    if scaling is None:
        return freq
    s = dict(scaling)
    if s.get("rope_type") == "factors":                          # one divisor per pair, as llama.cpp stores them
        return freq / np.asarray(s["factors"], np.float64)       # (d_head/2,)
    factor = float(s["factor"])
    if s.get("rope_type", s.get("type")) == "linear":
        return freq / factor
    low, high = float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
    old = float(s.get("original_max_position_embeddings", 8192))
    wavelength = 2 * np.pi / freq                                # (d_head/2,)
    smooth = np.clip((old / wavelength - low) / (high - low), 0.0, 1.0)   # 0: long waves, 1: short waves
    return (1 - smooth) * freq / factor + smooth * freq          # (d_head/2,)


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


# ----------------------------------------------------------------------------------------------------
# the schemes as objects: what a model asks of its position scheme, in one place


class PositionScheme:
    """What every scheme answers; each scheme overrides the parts it acts in."""
    name = ""
    has_table = False          # whether the model holds a learned table W_P
    rotates = False            # whether attention rotates q and k (RoPE): hook_rot_q, hook_rot_k
    adds_rows = False          # whether embed gives rows to add to the token embeddings (learned, sinusoidal)

    def check(self, d_model: int, d_head: int) -> None:
        """Raise when the sizes do not suit the scheme."""

    def embed(self, W_P, n: int, *, start: int, d_model: int, dtype) -> np.ndarray | None:
        """Rows (n, d_model) added to the token embeddings at positions start …, or None."""
        return None

    def rotate(self, x: np.ndarray, *, start: int, inverse: bool = False, positions=None) -> np.ndarray:
        """q or k (..., n, d_head) as attention sees them at positions start … (or ``start + positions``
        (..., n), a padded batch's); unchanged but for RoPE."""
        return x

    def halves_order(self, d_head: int) -> np.ndarray:
        """Where each feature of a head goes in rotate_half's layout (Hugging Face's, TransformerLens's: i pairs
        with i + r/2) from attnlab's (2i pairs with 2i+1): ``x[..., order]``; every feature in place but for RoPE."""
        return np.arange(d_head)

    def bias(self, n_heads: int, n_q: int, n_k: int, dtype) -> np.ndarray | None:
        """An additive bias (h, n_q, n_k) on the scores (ALiBi), or None."""
        return None

    def to_json(self) -> dict:
        return {"name": self.name}


@dataclass(frozen=True)
class Learned(PositionScheme):
    """A trained table ``W_P`` (n_ctx, d_model), one row per position, added to the token embeddings."""
    name = "learned"
    has_table = True
    adds_rows = True

    def embed(self, W_P, n: int, *, start: int, d_model: int, dtype) -> np.ndarray:
        return learned_positions(W_P, n, start=start)                # (n, d_model)


@dataclass(frozen=True)
class Sinusoidal(PositionScheme):
    """Fixed sinusoid rows (Vaswani et al., 2017), added to the token embeddings; d_model must be even."""
    name = "sinusoidal"
    adds_rows = True

    def check(self, d_model: int, d_head: int) -> None:
        if d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model (sin and cos pairs), got {d_model}")

    def embed(self, W_P, n: int, *, start: int, d_model: int, dtype) -> np.ndarray:
        return sinusoidal_positions(n, d_model, start=start, dtype=dtype)   # (n, d_model)


@dataclass(frozen=True)
class RoPE(PositionScheme):
    """Rotary positions (Su et al., 2021): q and k rotated inside attention by ``pos · θ_i``,
    ``θ_i = theta^(−2i/d_head)``. ``scaling`` (a dict, e.g. Llama 3's ``{"rope_type": "llama3", "factor": 8.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}``, or
    ``{"rope_type": "linear", "factor": f}``, or ``{"rope_type": "factors", "factors": (f_0, …)}``, one divisor
    per pair) stretches the slow frequencies; None leaves them."""
    rotates = True
    theta: float = ROPE_BASE
    scaling: tuple | None = None   # sorted (key, value) pairs of the scaling dict: hashable, frozen
    rotary_dim: int | None = None  # rotate only the first rotary_dim features of a head; None = all of them
    name = "rope"

    def __post_init__(self):
        object.__setattr__(self, "theta", as_positive_float("theta", self.theta))
        if isinstance(self.scaling, dict):
            object.__setattr__(self, "scaling", tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                                             for k, v in self.scaling.items())))
        if self.scaling is not None:
            kind = dict(self.scaling).get("rope_type", dict(self.scaling).get("type"))
            as_choice("scaling rope_type", kind, ("linear", "llama3", "factors"))
        if self.rotary_dim is not None and (as_positive_int("rotary_dim", self.rotary_dim) % 2):
            raise ValueError(f"rotary_dim must be even (features rotate in pairs), got {self.rotary_dim}")

    def check(self, d_model: int, d_head: int) -> None:
        if d_head % 2 and self.rotary_dim is None:
            raise ValueError(f"rope needs an even d_head (features rotate in pairs), got {d_head}")
        if self.rotary_dim is not None and self.rotary_dim > d_head:
            raise ValueError(f"rotary_dim ({self.rotary_dim}) must be at most d_head ({d_head})")

    def rotate(self, x: np.ndarray, *, start: int, inverse: bool = False, positions=None) -> np.ndarray:
        return rope(x, start=start, inverse=inverse, theta=self.theta, scaling=self.scaling, rotary_dim=self.rotary_dim,
                    positions=positions)

    def halves_order(self, d_head: int) -> np.ndarray:
        """The order taking a head's features to rotate_half's layout.

        >>> RoPE().halves_order(6)
        array([0, 2, 4, 1, 3, 5])
        """
        r = d_head if self.rotary_dim is None else self.rotary_dim
        pairs = np.stack([np.arange(r // 2), np.arange(r // 2) + r // 2], axis=1).ravel()   # (r,) pair -> half slot
        return np.concatenate([np.argsort(pairs), np.arange(r, d_head)])   # (d_head,) half slot -> pair slot

    def to_json(self) -> dict:
        out = {"name": self.name, "theta": self.theta, "scaling": None if self.scaling is None else dict(self.scaling)}
        return out if self.rotary_dim is None else {**out, "rotary_dim": self.rotary_dim}


@dataclass(frozen=True)
class ALiBi(PositionScheme):
    """ALiBi (Press et al., 2022): no vectors, a bias ``−m_h · (i − j)`` on each head's scores."""
    name = "alibi"

    def bias(self, n_heads: int, n_q: int, n_k: int, dtype) -> np.ndarray:
        return alibi_bias(alibi_slopes(n_heads), n_q, n_k).astype(dtype)   # (h, n_q, n_k)


POSITION_SCHEMES = {cls.name: cls for cls in (Learned, Sinusoidal, RoPE, ALiBi)}   # name -> class


def check_scheme(positions) -> PositionScheme:
    """``positions`` if it is a scheme object (see :data:`POSITION_SCHEMES`), else a TypeError naming them."""
    if not isinstance(positions, PositionScheme):
        names = ", ".join(f"{c.__name__}()" for c in POSITION_SCHEMES.values())
        raise TypeError(f"positions must be a position scheme object ({names}), got {positions!r}")
    return positions


def scheme_from_json(data) -> PositionScheme:
    """The scheme that :meth:`to_json` wrote (a dict with its ``name``), or one named by a bare string."""
    if isinstance(data, str):
        data = {"name": data}
    if not isinstance(data, dict):
        raise ValueError(f"positions must be a scheme name or a dict with a 'name', got {data!r}")
    name = as_choice("positions", data.get("name"), tuple(POSITION_SCHEMES))
    params = {k: v for k, v in data.items() if k != "name" and v is not None}
    try:
        return POSITION_SCHEMES[name](**params)
    except TypeError:
        raise ValueError(f"positions {name!r} takes no parameters {sorted(params)}") from None
