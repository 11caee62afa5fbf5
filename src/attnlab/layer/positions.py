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
import math

from dataclasses import dataclass, fields

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
    transpose of a rotation is its inverse). A scaling with an attention factor m (YaRN) multiplies the
    rotated vector by m, both ways: ``inverse=True`` is then the transpose m·Rᵀ, the backward.

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
        cos, sin = _rope_turns(n, start, d_head, theta, _hashable(scaling), bool(inverse), x.dtype)   # (n, d_head)
    else:
        cos, sin = _turns_at(start + np.asarray(positions), d_head, theta, scaling, bool(inverse), x.dtype)
    complex_dtype = _COMPLEX.get(x.dtype)
    if complex_dtype is None:                                 # float16: pairs through a (..., 2) view
        pairs = x.reshape(*x.shape[:-1], d_head // 2, 2)      # (..., n, d_head/2, 2) features (2i, 2i+1)
        out = pairs[..., ::-1] * sin.reshape(pairs.shape[-3:])   # (..., n, d_head/2, 2) (x_2i+1 s, x_2i s)
        out[..., 0] *= -1                                     # (−x_2i+1 s, x_2i s)
        out += pairs * cos.reshape(pairs.shape[-3:])
        return out.reshape(x.shape)                           # (..., n, d_head)
    if x.strides[-1] != x.itemsize:
        x = np.ascontiguousarray(x)                           # (..., n, d_head) a pair's features side by side
    shape = np.broadcast_shapes(x.shape, cos.shape)
    turned = np.empty((*shape[:-1], d_head // 2), complex_dtype)
    np.multiply(x.view(complex_dtype), 1j, out=turned)        # (..., n, d_head/2) i·(x_2i + i·x_2i+1): exact
    out = turned.view(x.dtype)                                # (..., n, d_head) (−x_2i+1, x_2i), C-contiguous
    out *= sin                                                # (−x_2i+1 s, x_2i s)
    out += x * cos                                            # (x_2i c − x_2i+1 s, x_2i+1 c + x_2i s)
    return out


# a float dtype -> the complex dtype of its pairs: numpy's complex product by i swaps a pair (x_2i, x_2i+1) into
# (−x_2i+1, x_2i) in one vectorised pass, exactly; then two contiguous products turn it. (A strided (..., 2) view
# of the pairs, reversed, ran its products two elements per inner loop: 20x slower at SmolLM2's prefill.)
_COMPLEX = {np.dtype(np.float32): np.dtype(np.complex64), np.dtype(np.float64): np.dtype(np.complex128)}


def _hashable(scaling):
    """The scaling as sorted (key, value) pairs: what the RoPE object stores, and the cache keys on."""
    if scaling is None:
        return None
    if isinstance(scaling, RopeScaling):
        scaling = scaling.to_dict()
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in dict(scaling).items()))


@functools.lru_cache(maxsize=64)
def _rope_turns(n: int, start: int, d_head: int, theta: float, scaling, inverse: bool, dtype):
    """cos and ±sin of RoPE's angles at positions start … start + n − 1, each (n, d_head) with a pair's two
    features side by side, so a pair (x_2i, x_2i+1) turns as ``pair · cos + (−x_2i+1, x_2i) · sin``: +sin to
    rotate, −sin to rotate back. Kept for the last 64 (n, start) asked: a decode step asks for one position at
    a time."""
    cos, sin = _turns_at(position_ids(n, start=start), d_head, theta, scaling, inverse, dtype)   # (n, d_head) each
    cos.flags.writeable = sin.flags.writeable = False         # shared between calls
    return cos, sin


@functools.lru_cache(maxsize=64)
def _pair_turns(n: int, start: int, d_head: int, theta: float, scaling, dtype):
    """:func:`_rope_turns`' tables by pairs, cos and ±sin (n, d_head/2, 2), the sign on sin's slots: a pair turns as
    ``pair · cos + reversed(pair) · sin``, the same products as :func:`rope`'s ``(−x_2i+1, x_2i) · sin`` (a sign
    moved from one factor to the other rounds alike), so the fused decode step keeps rope's bits."""
    cos, sin = _rope_turns(n, start, d_head, theta, scaling, False, dtype)   # (n, d_head) each
    signed = sin.reshape(n, d_head // 2, 2) * np.array([-1, 1], dtype)       # (n, d_head/2, 2) (−s, s)
    signed.flags.writeable = False                                           # shared between calls
    return cos.reshape(n, d_head // 2, 2), signed


def _turns_at(pos: np.ndarray, d_head: int, theta: float, scaling, inverse: bool, dtype):
    """:func:`_rope_turns` at any positions (..., n): cos and ±sin (..., n, d_head), YaRN's attention factor m
    riding on both."""
    freq = rope_frequencies(d_head, theta, scaling)            # (d_head/2,)
    angle = np.asarray(pos)[..., None].astype(np.float64) * freq   # (..., n, d_head/2)
    cos = np.repeat(np.cos(angle), 2, axis=-1)                 # (..., n, d_head) each pair's twice
    sin = np.repeat(np.sin(angle), 2, axis=-1)                 # (..., n, d_head)
    if inverse:
        sin = -sin
    m = 1.0 if scaling is None else rope_attention_factor(scaling)
    if m != 1.0:                                               # YaRN's attention factor rides on cos and sin
        cos *= m
        sin *= m
    return cos.astype(dtype, copy=False), sin.astype(dtype, copy=False)


def rope_frequencies(d_head: int, theta: float = ROPE_BASE, scaling=None) -> np.ndarray:
    """θ_i = theta^(−2i/d_head) for i = 0 … d_head/2 − 1, (d_head/2,); with ``scaling`` (a scaling object of
    :data:`ROPE_SCALINGS`, or its dict: ``{"rope_type": "llama3", …}``) stretched as that object says: Llama 3's
    blend, linear, one divisor per pair ("factors", a GGUF file's ``rope_freqs``), YaRN's ramp ("yarn") or
    NTK-aware's larger base ("dynamic").

    >>> rope_frequencies(4, 100.0)
    array([1. , 0.1])
    >>> rope_frequencies(4, 100.0, {"rope_type": "linear", "factor": 2.0})
    array([0.5 , 0.05])
    """
    if scaling is None:
        return theta ** (-np.arange(0, d_head, 2) / d_head)     # (d_head/2,)
    return rope_scaling(scaling).frequencies(d_head, theta)     # (d_head/2,)


def rope_attention_factor(scaling) -> float:
    """What a scaling multiplies RoPE's cos and sin by (YaRN's attention factor, "mscale"): the rotated q and k
    both grow by it, so the scores by its square. 1 without a scaling, or for a scaling that has none."""
    return 1.0 if scaling is None else rope_scaling(scaling).attention_factor


class RopeScaling:
    """What every RoPE scaling answers: its frequencies for a head width and base, the factor its rotated
    vectors are multiplied by, and its dict (config.json's ``rope_scaling`` / ``rope_parameters`` spelling)."""
    kind = ""
    attention_factor = 1.0

    def frequencies(self, d_rot: int, theta: float) -> np.ndarray:
        raise NotImplementedError

    def to_dict(self) -> dict:
        return {"rope_type": self.kind, **{k: v for k, v in self.__dict__.items() if v is not None}}


def _plain(d_rot: int, theta: float) -> np.ndarray:
    return theta ** (-np.arange(0, d_rot, 2) / d_rot)            # (d_rot/2,)


@dataclass(frozen=True)
class LinearScaling(RopeScaling):
    """Position interpolation (Chen et al., 2023): every frequency divided by ``factor``."""
    factor: float
    kind = "linear"

    def frequencies(self, d_rot: int, theta: float) -> np.ndarray:
        return _plain(d_rot, theta) / self.factor                # (d_rot/2,)


@dataclass(frozen=True)
class Llama3Scaling(RopeScaling):
    """Llama 3's: wavelengths past ``original_max_position_embeddings / low_freq_factor`` divided by
    ``factor``, those below ``… / high_freq_factor`` kept, a smooth blend between."""
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: float = 8192
    kind = "llama3"

    def frequencies(self, d_rot: int, theta: float) -> np.ndarray:
        freq = _plain(d_rot, theta)                              # (d_rot/2,)
        low, high, old = float(self.low_freq_factor), float(self.high_freq_factor), float(self.original_max_position_embeddings)
        wavelength = 2 * np.pi / freq                            # (d_rot/2,)
        smooth = np.clip((old / wavelength - low) / (high - low), 0.0, 1.0)   # 0: long waves, 1: short waves
        return (1 - smooth) * freq / self.factor + smooth * freq   # (d_rot/2,)


@dataclass(frozen=True)
class FactorsScaling(RopeScaling):
    """One divisor per pair, as llama.cpp stores them (a GGUF file's ``rope_freqs``: Llama 3's scaling worked out)."""
    factors: tuple
    kind = "factors"

    def frequencies(self, d_rot: int, theta: float) -> np.ndarray:
        return _plain(d_rot, theta) / np.asarray(self.factors, np.float64)   # (d_rot/2,)


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@dataclass(frozen=True)
class YaRN(RopeScaling):
    """YaRN (Peng et al., 2023), as transformers' ``_compute_yarn_parameters`` computes it: the pairs that turn
    fewer than ``beta_slow`` times over the trained context ``original_max_position_embeddings`` are
    interpolated (divided by ``factor``), those that turn more than ``beta_fast`` times are kept, a linear
    ramp over the pair index between (its ends floored and ceiled unless ``truncate`` is False). The rotated
    q and k are multiplied by ``attention_factor``, default ``0.1 ln(factor) + 1`` (with ``mscale`` and
    ``mscale_all_dim``, DeepSeek's, the ratio of the two such terms), so the scores by its square.

    >>> YaRN(factor=4.0, original_max_position_embeddings=64).attention_factor.__round__(4)
    1.1386
    """
    factor: float
    original_max_position_embeddings: float
    beta_fast: float | None = None           # None = 32, as transformers' default
    beta_slow: float | None = None           # None = 1
    attention_factor: float | None = None    # None = from factor (and mscale, mscale_all_dim), set on init
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool | None = None             # None = True
    kind = "yarn"

    def __post_init__(self):
        as_positive_float("yarn factor", self.factor)
        as_positive_float("yarn original_max_position_embeddings", self.original_max_position_embeddings)
        if self.attention_factor is None:                        # worked out once, then stated
            m, m_all = self.mscale, self.mscale_all_dim
            af = _mscale(self.factor, m) / _mscale(self.factor, m_all) if m and m_all else _mscale(self.factor)
        else:
            af = as_positive_float("yarn attention_factor", self.attention_factor)
        object.__setattr__(self, "attention_factor", float(af))

    def frequencies(self, d_rot: int, theta: float) -> np.ndarray:
        fast, slow = self.beta_fast or 32, self.beta_slow or 1
        old = float(self.original_max_position_embeddings)

        def dim_of(rotations):                                   # the pair index turning `rotations` times in `old`
            return d_rot * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(theta))

        low, high = dim_of(fast), dim_of(slow)
        if self.truncate is None or self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d_rot - 1)
        if low == high:
            high += 0.001                                        # transformers' guard against 0/0
        ramp = np.clip((np.arange(d_rot // 2) - low) / (high - low), 0.0, 1.0)   # (d_rot/2,) 0: kept, 1: divided
        freq = _plain(d_rot, theta)                              # (d_rot/2,)
        return freq / self.factor * ramp + freq * (1 - ramp)     # (d_rot/2,)


@dataclass(frozen=True)
class NTKScaling(RopeScaling):
    """NTK-aware scaling (bloc97, 2023): a larger base ``theta · α^(d/(d−2))`` instead of smaller frequencies,
    with α = ``factor · seq_len / max_position_embeddings − (factor − 1)``: the frequencies transformers'
    "dynamic" RoPE computes for a pass of ``seq_len`` tokens (``_compute_dynamic_ntk_parameters``), here fixed
    once for that length (None or at most the trained context: α = 1, plain RoPE). transformers recomputes them
    per pass past the trained context; attnlab keeps one set for every pass and for the KV cache."""
    factor: float
    max_position_embeddings: float
    seq_len: float | None = None
    kind = "dynamic"

    def frequencies(self, d_rot: int, theta: float) -> np.ndarray:
        trained = float(self.max_position_embeddings)
        n = trained if self.seq_len is None else max(float(self.seq_len), trained)
        base = theta * (self.factor * n / trained - (self.factor - 1)) ** (d_rot / (d_rot - 2))
        return _plain(d_rot, base)                               # (d_rot/2,)


ROPE_SCALINGS = {cls.kind: cls for cls in (LinearScaling, Llama3Scaling, FactorsScaling, YaRN, NTKScaling)}


@functools.lru_cache(maxsize=64)
def _scaling_from_pairs(pairs: tuple) -> RopeScaling:
    s = {k: v for k, v in pairs if k not in ("rope_theta", "partial_rotary_factor")}   # the RoPE's own, not the scaling's
    kind = as_choice("scaling rope_type", s.pop("rope_type", s.pop("type", None)), tuple(ROPE_SCALINGS))
    try:
        return ROPE_SCALINGS[kind](**s)
    except TypeError as e:
        raise ValueError(f"scaling {kind!r} takes {[f.name for f in fields(ROPE_SCALINGS[kind])]}, got "
                         f"{sorted(s)} ({e})") from None


def rope_scaling(scaling) -> RopeScaling:
    """The scaling object of ``scaling``: itself, or built from its dict (or sorted pairs) by ``rope_type``."""
    if isinstance(scaling, RopeScaling):
        return scaling
    return _scaling_from_pairs(_hashable(scaling))


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
    ``θ_i = theta^(−2i/d_head)``. ``scaling`` (a scaling object of :data:`ROPE_SCALINGS`, or its dict, e.g.
    Llama 3's ``{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192}``, ``{"rope_type": "linear", "factor": f}``,
    ``{"rope_type": "factors", "factors": (f_0, …)}`` (one divisor per pair), ``YaRN(factor, original_max_…)``
    or ``NTKScaling(factor, max_position_embeddings, seq_len)``) stretches the slow frequencies; None leaves
    them. It is kept as its dict's sorted pairs (hashable, as it is written to JSON)."""
    rotates = True
    theta: float = ROPE_BASE
    scaling: tuple | None = None   # sorted (key, value) pairs of the scaling dict: hashable, frozen
    rotary_dim: int | None = None  # rotate only the first rotary_dim features of a head; None = all of them
    name = "rope"

    def __post_init__(self):
        object.__setattr__(self, "theta", as_positive_float("theta", self.theta))
        if isinstance(self.scaling, (dict, RopeScaling)):
            object.__setattr__(self, "scaling", _hashable(self.scaling))
        if self.scaling is not None:
            rope_scaling(self.scaling)                           # its kind and fields checked once, here
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

    def turns(self, d_head: int, start: int, n: int = 1, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
        """cos and ±sin (n, d_head/2, 2) of the angles at positions start … start + n − 1, by which :meth:`rotate`
        turns each pair (x_2i, x_2i+1) as ``pair · cos + reversed(pair) · sin`` (read-only arrays, the ones
        :meth:`rotate` uses; the last 64 asked are kept). For a whole rotation only (``rotary_dim`` None)."""
        assert self.rotary_dim is None or self.rotary_dim == d_head, "turns: a partial rotation passes features through"
        return _pair_turns(n, start, d_head, self.theta, _hashable(self.scaling), np.dtype(dtype))

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
class LlamaCppRoPE(RoPE):
    """RoPE as llama.cpp computes it on the CPU (:func:`attnlab.kernels.ggml_arith.rope`): each position's angles
    by the float32 recurrence θ_{i+1} = θ_i · base^(−2/d_head), their cos and sin from the C library, each pair
    turned with GCC's fused multiply-add. The ``q8-activations`` mode's scheme (its values are RoPE's within a
    few ulps; its bits are llama.cpp's). Whole heads, no scaling; ``inverse`` turns back as RoPE does."""
    name = "rope_llama_cpp"

    def __post_init__(self):
        super().__post_init__()
        if self.scaling is not None or self.rotary_dim is not None:
            raise ValueError(f"rope_llama_cpp has no scaling and no rotary_dim, got scaling {self.scaling}, "
                             f"rotary_dim {self.rotary_dim}")

    def rotate(self, x: np.ndarray, *, start: int, inverse: bool = False, positions=None) -> np.ndarray:
        if inverse or positions is not None or x.dtype != np.float32:
            return super().rotate(x, start=start, inverse=inverse, positions=positions)
        from ..kernels import ggml_arith
        at = range(start, start + x.shape[-2])
        fused = ggml_arith.kernels()
        if fused is None:
            return ggml_arith.rope(x, at, self.theta)                             # (..., n, d_head) numpy
        cos, sin = ggml_arith.rope_tables(at, x.shape[-1], self.theta)            # (n, d_head/2) each
        y = np.empty(x.shape, np.float32)                                         # (..., n, d_head)
        rows = (-1,) + x.shape[-2:]
        fused.rope_rows(np.ascontiguousarray(x).reshape(rows), cos, sin, y.reshape(rows))
        return y


@dataclass(frozen=True)
class ALiBi(PositionScheme):
    """ALiBi (Press et al., 2022): no vectors, a bias ``−m_h · (i − j)`` on each head's scores."""
    name = "alibi"

    def bias(self, n_heads: int, n_q: int, n_k: int, dtype) -> np.ndarray:
        return alibi_bias(alibi_slopes(n_heads), n_q, n_k).astype(dtype)   # (h, n_q, n_k)


POSITION_SCHEMES = {cls.name: cls for cls in (Learned, Sinusoidal, RoPE, ALiBi, LlamaCppRoPE)}   # name -> class


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
