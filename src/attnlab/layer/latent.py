"""Multi-head latent attention (MLA; DeepSeek-AI, DeepSeek-V2, 2024, §2.1): K and V from a small latent that
all heads share, RoPE on a separate slice.

The layer, for x (..., n, d_model), h heads, a latent of width r (``kv_lora_rank``)::

    q      = rms(x W_DQ + b_DQ) W_UQ             (or x W_Q without a query latent)   (..., h, n, d_nope + d_rope)
    [c | k_r] = x W_DKV + b_DKV,  c = rms(c)     the latent c_KV and the shared RoPE key   (..., n, r), (..., n, d_rope)
    k_h    = [c W_UK_h | rope(k_r)]               every head's key: its own nope part, the one rotated slice
    v_h    = c W_UV_h                                                                   (..., h, n, d_v)
    q_h    = [q_nope_h | rope(q_rope_h)]
    y      = concat_h(softmax(q_h k_hᵀ · scale + M) v_h) W_O + b_O

``scale`` is (d_nope + d_rope)^-½, times YaRN's mscale² where the checkpoint says so. The KV cache
(:class:`LatentCache`) keeps only ``[c | rope(k_r)]`` per token: r + d_rope numbers, against 2·h·d_head for
plain multi-head attention. A decode step can then skip rebuilding K and V (the *absorbed* form): since
``q_nope_h · (c W_UK_h) = (q_nope_h W_UK_hᵀ) · c``, the query is folded into the latent's space once and
attends to the cached latent directly, one key/value head for all h query heads (multi-query attention
through the one front door, with key ``[c | k_r]`` and value ``c``), and W_UV is applied after the weighted
sum: ``z_h = (Σ_j a_hj c_j) W_UV_h``.

Shapes: ``B`` a batch's leading axes, ``h`` heads, ``n`` new tokens, ``n_k`` every token attended to, ``r``
the latent, ``r_q`` the query latent.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from ..kernels._checks import as_float_array, as_positive_int, check_finite, check_rng, surely_fits
from ..kernels.attention import Saved, attend, attention, attention_backward, attention_forward
from .cache import KVCache
from .config import AttentionConfig
from .positions import PositionScheme, RoPE
from .hookpoints import NO_HOOKS
from .multihead import _attention_on_the_grid, _heads, merge_heads
from .tape import Tape


@dataclass(frozen=True)
class LatentConfig(AttentionConfig):
    """The sizes of one MLA layer. ``d_head`` is the width q and k are scored at (d_nope + d_rope, set here);
    every head has its own key and value (``n_kv_heads`` = ``n_heads``), made from the one latent. The
    position scheme, RoPE, turns the d_rope-wide slices only. Defaults are DeepSeek-V3's."""
    positions: PositionScheme = field(default_factory=RoPE)   # RoPE (with YaRN, DeepSeek's): the rope slices only
    q_lora_rank: int | None = 1536   # the query's latent; None = q straight from x (DeepSeek-V2-Lite)
    kv_lora_rank: int = 512          # r: the latent c_KV each token keeps in the cache
    d_nope: int = 128                # each head's key/query features without position (qk_nope_head_dim)
    d_rope: int = 64                 # the rotated features, one key slice shared by all heads (qk_rope_head_dim)
    d_v: int = 128                   # each head's value width (v_head_dim)
    latent_eps: float = 1e-6         # the eps of the two latents' RMSNorms (DeepSeek's modules keep its default)

    def __post_init__(self):
        for name in ("kv_lora_rank", "d_nope", "d_rope", "d_v"):
            as_positive_int(name, getattr(self, name))
        as_positive_int("q_lora_rank", self.q_lora_rank, allow_none=True)
        if self.d_head is not None and self.d_head != self.d_nope + self.d_rope:
            raise ValueError(f"d_head must be d_nope + d_rope = {self.d_nope + self.d_rope} for latent attention "
                             f"(or None), got {self.d_head}")
        if self.n_kv_heads not in (None, self.n_heads):
            raise ValueError(f"n_kv_heads must be n_heads ({self.n_heads}) for latent attention: every head has its "
                             f"own key and value, made from the one latent; got {self.n_kv_heads}")
        object.__setattr__(self, "d_head", self.d_nope + self.d_rope)
        if (self.window is not None or self.softcap is not None or getattr(self, "qk_norm", None) is not None
                or getattr(self, "sinks", False)):
            raise ValueError("latent attention here has no sliding window, soft-cap, QK-norm or sinks (DeepSeek has "
                             "none: its latents have their own norms)")
        super().__post_init__()
        if not self.positions.rotates:
            raise ValueError(f"positions must be RoPE for latent attention (it turns the d_rope slices; K and V come "
                             f"from a latent without position), got {self.positions.name}")
        self.positions.check(self.d_model, self.d_rope)     # RoPE turns the d_rope-wide slices

    @property
    def softmax_scale(self) -> float:
        """What the scores are multiplied by: ``scale``, or (d_nope + d_rope)^-½ (the absorbed form's query is
        wider, so the scale is always stated)."""
        return self.d_head ** -0.5 if self.scale is None else self.scale

    @property
    def options(self) -> dict:
        return {"window": None, "scale": self.softmax_scale, "softcap": None}

    @property
    def cache_width(self) -> int:
        """Numbers each token keeps in the cache: the latent and the shared rotated key, r + d_rope."""
        return self.kv_lora_rank + self.d_rope

    @property
    def n_params(self) -> int:
        return sum(int(np.prod(s)) for s in param_shapes(self).values())

    def to_json(self) -> dict:
        return {**super().to_json(), "kind": "latent", **{f.name: getattr(self, f.name) for f in fields(self)
                                                          if f.name in LATENT_FIELDS}}


LATENT_FIELDS = ("q_lora_rank", "kv_lora_rank", "d_nope", "d_rope", "d_v", "latent_eps")


def param_shapes(c: LatentConfig) -> dict[str, tuple]:
    """The shape of each array of an MLA layer, in pass order (the query's latent path only with q_lora_rank)."""
    d, h, r, d_qk = c.d_model, c.n_heads, c.kv_lora_rank, c.d_nope + c.d_rope
    q = ({"W_DQ": (d, c.q_lora_rank), "b_DQ": (c.q_lora_rank,), "q_norm": (c.q_lora_rank,),
          "W_UQ": (c.q_lora_rank, h * d_qk)} if c.q_lora_rank else {"W_Q": (d, h * d_qk)})
    return {**q, "W_DKV": (d, r + c.d_rope), "b_DKV": (r + c.d_rope,), "kv_norm": (r,), "W_UK": (r, h * c.d_nope),
            "W_UV": (r, h * c.d_v), "W_O": (h * c.d_v, d), "b_O": (d,)}


@dataclass(frozen=True, eq=False)
class LatentAttention:
    """The arrays of one MLA layer and its config; calling it runs :func:`latent_attention`.

    Each head's query columns in W_UQ (W_Q) are its d_nope features then its d_rope ones; W_DKV's columns are
    the latent's r then the shared key's d_rope; W_UK and W_UV hold head i in columns i·d … (i+1)·d − 1."""
    W_DQ: np.ndarray | None      # (d_model, r_q) the query's down-projection (q_a_proj)
    b_DQ: np.ndarray | None      # (r_q,)
    q_norm: np.ndarray | None    # (r_q,) the query latent's RMSNorm weight (q_a_layernorm)
    W_UQ: np.ndarray | None      # (r_q, h·(d_nope + d_rope)) its up-projection (q_b_proj)
    W_Q: np.ndarray | None       # (d_model, h·(d_nope + d_rope)) without a query latent (q_proj)
    W_DKV: np.ndarray            # (d_model, r + d_rope) the latent and the shared RoPE key (kv_a_proj_with_mqa)
    b_DKV: np.ndarray            # (r + d_rope,)
    kv_norm: np.ndarray          # (r,) the latent's RMSNorm weight (kv_a_layernorm)
    W_UK: np.ndarray             # (r, h·d_nope) the latent up to each head's key (kv_b_proj's k rows)
    W_UV: np.ndarray             # (r, h·d_v) the latent up to each head's value (kv_b_proj's v rows)
    W_O: np.ndarray              # (h·d_v, d_model)
    b_O: np.ndarray              # (d_model,)
    config: LatentConfig
    HOOKS = ()                   # set below: the layer's points

    def __post_init__(self):
        if not isinstance(self.config, LatentConfig):
            raise TypeError(f"config must be a LatentConfig, got {type(self.config).__name__}")
        want = param_shapes(self.config)
        for f in fields(self):
            if f.name == "config":
                continue
            a = getattr(self, f.name)
            if (a is None) != (f.name not in want):
                raise ValueError(f"{f.name} must be {'given' if f.name in want else 'None'} for q_lora_rank "
                                 f"{self.config.q_lora_rank}")
            if a is not None:
                a = as_float_array(f.name, a)
                object.__setattr__(self, f.name, a)
                if a.shape != want[f.name]:
                    c = self.config
                    raise ValueError(f"{f.name} has shape {a.shape}, the config (d_model {c.d_model}, n_heads "
                                     f"{c.n_heads}, kv_lora_rank {c.kv_lora_rank}, q_lora_rank {c.q_lora_rank}, "
                                     f"d_nope {c.d_nope}, d_rope {c.d_rope}, d_v {c.d_v}) asks for {want[f.name]}")

    @classmethod
    def from_params(cls, p: dict, config: LatentConfig) -> "LatentAttention":
        """From arrays named as :meth:`params` names them."""
        return cls(**{f.name: p.get(f.name) for f in fields(cls) if f.name != "config"}, config=config)

    @classmethod
    def init(cls, config: LatentConfig, *, rng: np.random.Generator, std: float = 0.02,
             dtype=np.float32) -> "LatentAttention":
        """Random weights from N(0, std²), zero biases, norms the identity."""
        check_rng(rng)
        p = {n: (rng.normal(0.0, std, s) if n.startswith("W") else np.ones(s) if n.endswith("norm") else np.zeros(s))
             for n, s in param_shapes(config).items()}
        return cls.from_params({k: v.astype(dtype) for k, v in p.items()}, config)

    def params(self) -> dict[str, np.ndarray]:
        """The arrays by name, in pass order (the arrays themselves)."""
        return {n: getattr(self, n) for n in param_shapes(self.config)}

    @property
    def n_params(self) -> int:
        return sum(a.size for a in self.params().values())

    def new_cache(self, capacity: int, *, batch_shape: tuple = (), kv_dtype=None) -> "LatentCache":
        """An empty cache of ``capacity`` tokens, each r + d_rope numbers, in the layer's dtype (``kv_dtype``:
        None or that dtype; the latent cache has no float16 form)."""
        dtype = np.result_type(self.W_DKV, np.float32)
        if kv_dtype is not None and np.dtype(kv_dtype) != dtype:
            raise TypeError(f"kv_dtype must be None or {dtype} for a latent (MLA) cache, got {np.dtype(kv_dtype)}")
        return LatentCache.empty(1, capacity, self.config.cache_width, batch_shape=batch_shape,
                                 dtype=dtype, r=self.config.kv_lora_rank)

    def __call__(self, x, *, mask=None, is_causal=False, cache=None) -> np.ndarray:
        return latent_attention(self, x, mask=mask, is_causal=is_causal, cache=cache)


# in pass order: the query as projected, the normalised latent, the query as attention sees it (its rope slice
# turned), each head's key and value (the plain form only), then as multi-head attention's
HOOKS = ("hook_q", "hook_kv_latent", "hook_rot_q", "hook_k", "hook_v", "hook_scores", "hook_pattern", "hook_z",
         "hook_result")
LatentAttention.HOOKS = HOOKS
PLAIN_ONLY = ("hook_k", "hook_v", "hook_scores", "hook_pattern")   # points the absorbed form never builds


def hook_points(c: LatentConfig) -> tuple[str, ...]:
    return HOOKS


@dataclass(eq=False)
class LatentCache(KVCache):
    """One MLA layer's cache: ``[c | rope(k_r)]`` per token, one buffer (..., 1, capacity, r + d_rope); the
    ``v`` buffer is a view of its first r columns (the latent), so nothing is stored twice. ``keys`` and
    ``values`` are then the key and value of the absorbed form's multi-query attention."""
    r: int = 0                    # the latent's width: v is k[..., :r]

    @classmethod
    def empty(cls, n_kv_heads: int, capacity: int, d_head: int, *, batch_shape: tuple = (), dtype=np.float32,
              r: int | None = None) -> "LatentCache":
        whole = KVCache.empty(n_kv_heads, capacity, d_head, batch_shape=batch_shape, dtype=dtype).k
        r = d_head if r is None else r
        return cls(k=whole, v=whole[..., :r], r=r)

    @property
    def bytes_per_token(self) -> int:
        """What one token costs the cache: r + d_rope numbers (per batch row)."""
        return self.k.shape[-3] * self.k.shape[-1] * self.k.dtype.itemsize

    def append(self, key, value=None) -> tuple[np.ndarray, np.ndarray]:
        """Write ``key`` = ``[c | rope(k_r)]`` (..., 1, t, r + d_rope) after the cached tokens (``value``, the
        latent, is its first r columns and is not stored again). Returns the keys and values so far, as views."""
        key = as_float_array("key", key, min_ndim=2)
        if key.dtype != self.k.dtype:
            raise TypeError(f"key has dtype {key.dtype}, the cache holds {self.k.dtype}")
        if key.shape[:-2] != self.k.shape[:-2] or key.shape[-1] != self.k.shape[-1]:
            want = (*self.k.shape[:-2], "t", self.k.shape[-1])
            raise ValueError(f"key has shape {key.shape}, the cache expects {want}")
        top = float(np.maximum.reduce(np.abs(key), axis=None)) if key.size else 0.0
        if not top < np.inf:
            raise ValueError("key must be finite to enter the cache, got NaN or inf")
        t = key.shape[-2]
        if self.length + t > self.capacity:
            raise ValueError(f"cannot append {t} tokens: the cache holds {self.length} of its capacity {self.capacity}")
        self.k[..., self.length:self.length + t, :] = key      # (..., 1, t, r + d_rope)
        self.length += t
        self.k_max = max(self.k_max, top)
        self.v_max = self.k_max                                  # the latent is part of the key: one bound
        return self.keys, self.values


def _rms(x: np.ndarray, w: np.ndarray, eps: float):
    """RMSNorm of the rows of x (..., d) with weight w (d,), the mean of squares in at least float32:
    ``(y, (xhat, scale))``, the second what :func:`_rms_backward` needs."""
    x32 = x if x.dtype.itemsize >= 4 else x.astype(np.float32)
    scale = np.sqrt(np.vecdot(x32, x32)[..., None] / x.shape[-1] + eps)   # (..., 1)
    xhat = (x32 / scale).astype(x.dtype, copy=False)            # (..., d)
    return xhat * w, (xhat, scale)


def _rms_backward(saved, dy: np.ndarray, w: np.ndarray):
    """Backward of :func:`_rms`: ``(dx, dw)``."""
    xhat, scale = saved                                          # (..., d), (..., 1)
    # forward: y = xhat · w
    dw = (dy * xhat).reshape(-1, xhat.shape[-1]).sum(0)          # (d,)
    dxhat = dy * w                                               # (..., d)
    # forward: xhat = x / √(mean(x²) + eps)
    dx = (dxhat - xhat * (dxhat * xhat).mean(-1, keepdims=True)) / scale   # (..., d)
    return dx.astype(dy.dtype, copy=False), dw


@dataclass(frozen=True, eq=False)
class SavedLatent:
    """What :func:`latent_attention` keeps on a tape for :func:`latent_attention_backward_named`."""
    x: np.ndarray                 # (..., n, d_model)
    q_lat: np.ndarray | None      # (..., n, r_q) the normalised query latent (before its weight: see q_rms)
    q_rms: tuple | None           # the query latent's norm's saved forward
    c: np.ndarray                 # (..., n, r) the normalised latent
    kv_rms: tuple                 # its norm's saved forward
    merged: np.ndarray            # (..., n, h·d_v) the heads side by side, before W_O
    attn: Saved                   # the attention's own saved forward
    positions: np.ndarray | None  # (..., n) a padded batch's positions


def latent_attention(p: LatentAttention, x, *, mask=None, is_causal=False, cache: LatentCache | None = None,
                     hook=None, tape: Tape | None = None, positions=None, absorb: bool | None = None) -> np.ndarray:
    """Multi-head latent attention on x (..., n, d_model): y (..., n, d_model). See the module's docstring.

    Parameters
    ----------
    p : LatentAttention
    x : float array (..., n, d_model)
    mask : bool array broadcasting to (..., h, n, n_k), optional
        True = may attend.
    is_causal : bool
    cache : LatentCache, optional
        The new tokens continue the cached ones; their ``[c | rope(k_r)]`` is appended.
    hook : callable, optional
        Named activations: ``hook_q`` (..., h, n, d_nope + d_rope) as projected, ``hook_kv_latent`` (..., n, r)
        the normalised latent c_KV, ``hook_rot_q`` the query with its rope slice turned, ``hook_k`` (..., h,
        n_k, d_nope + d_rope) and ``hook_v`` (..., h, n_k, d_v) each head's keys and values (with a cache, of
        every token attended to, rebuilt from the latent), ``hook_scores``, ``hook_pattern``, ``hook_z``
        (..., h, n, d_v) and ``hook_result``.
    tape : Tape, optional
        Keep what :func:`latent_attention_backward_named` needs. Not with a cache.
    positions : int array (..., n), optional
        A padded batch's positions. Not with a cache.
    absorb : bool, optional
        With a cache: attend in the latent's space (W_UK folded into the query, W_UV after the weighted sum)
        instead of rebuilding every head's K and V. None (default): absorbed for a decode step (one new token)
        unless a hook asks for the keys, values, scores or pattern.

    Raises
    ------
    ValueError, TypeError
        When ``x`` is not (..., n, d_model), for a cache that is not a LatentCache, and as
        :func:`attnlab.kernels.attention` or :meth:`LatentCache.append` do.
    """
    if tape is not None and cache is not None:
        raise ValueError("tape is for a pass without a KV cache (a training step's), got both")
    if positions is not None and cache is not None:
        raise ValueError("positions are a padded batch's, for a pass without a KV cache; got both")
    if cache is not None and not isinstance(cache, LatentCache):
        raise TypeError(f"cache must be a LatentCache (LatentAttention.new_cache), got {type(cache).__name__}")
    if absorb not in (None, True, False):
        raise TypeError(f"absorb must be None, True or False, got {absorb!r}")
    if absorb and cache is None:
        raise ValueError("absorb=True attends to a cached latent: it needs a cache")
    hook = NO_HOOKS if hook is None else hook
    x = as_float_array("x", x, min_ndim=2)
    c = p.config
    if x.shape[-1] != c.d_model:
        raise ValueError(f"x has width {x.shape[-1]}, the layer's d_model is {c.d_model}; they must match")
    if absorb is None:
        absorb = cache is not None and x.shape[-2] == 1 and not any(hook.wants(n) for n in PLAIN_ONLY)
    return _latent(p, x, mask=mask, is_causal=is_causal, cache=cache, hook=hook, tape=tape, positions=positions,
                   absorb=absorb)


def _query(p: LatentAttention, x: np.ndarray):
    """Every head's query (..., h, n, d_nope + d_rope), and the query latent's ``(xhat, rms)`` for the backward."""
    c = p.config
    if p.W_Q is not None:
        return _heads(x @ p.W_Q, c.n_heads), None, None          # (..., h, n, d_qk)
    q_lat, q_rms = _rms(x @ p.W_DQ + p.b_DQ, p.q_norm, c.latent_eps)   # (..., n, r_q)
    return _heads(q_lat @ p.W_UQ, c.n_heads), q_lat, q_rms       # (..., h, n, d_qk)


def _turn(c: LatentConfig, x: np.ndarray, start: int, positions, inverse: bool = False) -> np.ndarray:
    """x (..., heads, n, d_nope + d_rope) or (..., heads, n, d_rope) with its last d_rope features turned."""
    at = None if positions is None else positions[..., None, :]  # (..., 1, n)
    out = x.copy()
    out[..., -c.d_rope:] = c.positions.rotate(x[..., -c.d_rope:], start=start, inverse=inverse, positions=at)
    return out


def _expand(p: LatentAttention, latent: np.ndarray, k_rope: np.ndarray):
    """Every head's key (..., h, n_k, d_nope + d_rope) and value (..., h, n_k, d_v) from the latent c (..., n_k, r)
    and the shared turned key (..., 1, n_k, d_rope)."""
    c = p.config
    k_nope = _heads(latent @ p.W_UK, c.n_heads)                  # (..., h, n_k, d_nope)
    v = _heads(latent @ p.W_UV, c.n_heads)                       # (..., h, n_k, d_v)
    k_rope = np.broadcast_to(k_rope, (*k_nope.shape[:-1], c.d_rope))   # (..., h, n_k, d_rope) a view
    return np.concatenate([k_nope, k_rope], axis=-1), v          # (..., h, n_k, d_qk), (..., h, n_k, d_v)


def _latent(p: LatentAttention, x, *, mask, is_causal, cache, hook, tape, positions, absorb):
    c = p.config
    r = c.kv_lora_rank
    start = 0 if cache is None else cache.length
    q, q_lat, q_rms = _query(p, x)                               # (..., h, n, d_qk)
    q = hook("hook_q", q)
    ckv = x @ p.W_DKV + p.b_DKV                                  # (..., n, r + d_rope)
    latent, kv_rms = _rms(ckv[..., :r], p.kv_norm, c.latent_eps)   # (..., n, r)
    latent = hook("hook_kv_latent", latent)
    q = hook("hook_rot_q", _turn(c, q, start, positions))        # (..., h, n, d_qk)
    k_rope = _turn(c, ckv[..., None, :, r:], start, positions)   # (..., 1, n, d_rope)
    opts = dict(mask=mask, is_causal=is_causal, **c.options)
    if cache is not None:
        joint = np.concatenate([latent[..., None, :, :], k_rope], axis=-1).astype(cache.k.dtype, copy=False)
        keys, _ = cache.append(joint)                            # (..., 1, n_k, r + d_rope) every token so far
        latent_all, k_rope = keys[..., 0, :, :r], keys[..., r:]  # (..., n_k, r), (..., 1, n_k, d_rope)
    saved = None
    try:
        if absorb:
            heads = _absorbed(p, q, keys, cache.k_max, opts)     # (..., h, n, d_v)
        else:
            k, v = _expand(p, latent if cache is None else latent_all, k_rope)   # (..., h, n_k, d_qk | d_v)
            k, v = hook("hook_k", k), hook("hook_v", v)
            if hook.wants("hook_scores") or hook.wants("hook_pattern"):
                heads, saved = _attention_on_the_grid(q, k, v, opts, hook, finite=cache is None)
            elif tape is not None:
                heads, saved = attention_forward(q, k, v, **opts)   # (..., h, n, d_v), the backward's share
            else:
                heads = attention(q, k, v, **opts)               # (..., h, n, d_v)
    except Exception:
        if cache is not None:
            cache.length = start                                 # a failed step leaves the cache as it was
        raise
    heads = hook("hook_z", heads)                                # (..., h, n, d_v)
    merged = merge_heads(heads)                                  # (..., n, h·d_v)
    if hook.wants("hook_result"):
        result = heads @ p.W_O.reshape(c.n_heads, c.d_v, c.d_model)   # (..., h, n, d_model)
        replaced = hook("hook_result", result)
        y = merged @ p.W_O + p.b_O if replaced is result else replaced.sum(axis=-3) + p.b_O
    else:
        y = merged @ p.W_O + p.b_O                               # (..., n, d_model)
    if tape is not None:
        tape.keep(SavedLatent(x=x, q_lat=q_lat, q_rms=q_rms, c=latent, kv_rms=kv_rms, merged=merged, attn=saved,
                              positions=positions))
    return y


def absorbed_weights(p: LatentAttention) -> tuple[np.ndarray, np.ndarray]:
    """W_UK_hᵀ and W_UV_h per head, as the absorbed form multiplies by them: (h, d_nope, r) and (h, r, d_v)."""
    c = p.config
    W_UK = p.W_UK.reshape(c.kv_lora_rank, c.n_heads, c.d_nope).transpose(1, 2, 0)   # (h, d_nope, r) W_UK_hᵀ
    W_UV = p.W_UV.reshape(c.kv_lora_rank, c.n_heads, c.d_v).transpose(1, 0, 2)      # (h, r, d_v)
    return W_UK, W_UV


def _absorbed(p: LatentAttention, q: np.ndarray, keys: np.ndarray, k_max: float, opts: dict) -> np.ndarray:
    """The heads (..., h, n, d_v) by attending in the latent's space: each head's query
    ``[q_nope W_UKᵀ | q_rope]`` (..., h, n, r + d_rope) against the cached ``[c | k_r]`` (..., 1, n_k, r + d_rope),
    the latent c as the value (one key/value head for all h query heads), then W_UV per head."""
    c = p.config
    W_UK_T, W_UV = absorbed_weights(p)                           # (h, d_nope, r), (h, r, d_v)
    q_lat = q[..., :c.d_nope] @ W_UK_T                           # (..., h, n, r) q_nope W_UK_hᵀ
    query = np.concatenate([q_lat, q[..., c.d_nope:]], axis=-1)  # (..., h, n, r + d_rope)
    values = keys[..., :c.kv_lora_rank]                          # (..., 1, n_k, r)
    fits = surely_fits(query.dtype, query.shape[-1], keys.shape[-2], c.softmax_scale, check_finite("query", query),
                       k_max, k_max)                             # the cache bounded its keys on append
    out = attend(query, keys, values, check_finite=not fits, **opts)   # (..., h, n, r) Σ_j a_hj c_j
    return out @ W_UV                                            # (..., h, n, d_v)


def latent_attention_backward_named(p: LatentAttention, saved: SavedLatent, dy):
    """Backward of :func:`latent_attention` from what it kept on a tape: ``(dx, grads, named)``, grads a dict by
    the names of :meth:`LatentAttention.params`, named the gradients at its points (``hook_q``,
    ``hook_kv_latent``, ``hook_rot_q``, ``hook_k``, ``hook_v``, ``hook_z``, ``hook_result``)."""
    c, x = p.config, saved.x
    h, d_nope = c.n_heads, c.d_nope
    dy = as_float_array("dy", dy)
    if dy.shape != x.shape:
        raise ValueError(f"dy must have the shape of x {x.shape}, got {dy.shape}")
    flat = lambda a: a.reshape(-1, a.shape[-1])                  # noqa: E731  (N, width), N = every token
    g = {}
    # forward: y = merged W_O + b_O
    g["W_O"], g["b_O"] = flat(saved.merged).T @ flat(dy), flat(dy).sum(0)
    dz = _heads(dy @ p.W_O.T, h)                                 # (..., h, n, d_v) dL/d hook_z
    d_result = np.broadcast_to(dy[..., None, :, :], (*dy.shape[:-2], h, *dy.shape[-2:]))   # (..., h, n, d_model)
    # forward: z = attention(q_rot, k, v)
    dq, dk, dv = attention_backward(saved.attn, dz)              # (..., h, n, d_qk | d_qk | d_v)
    named = {"hook_z": dz, "hook_result": d_result, "hook_rot_q": dq, "hook_k": dk, "hook_v": dv}
    # forward: k = [heads(c W_UK) | broadcast(k_rope)], v = heads(c W_UV); the shared slice sums over heads
    dk_nope, dk_rope = merge_heads(dk[..., :d_nope]), dk[..., d_nope:].sum(axis=-3, keepdims=True)
    dv = merge_heads(dv)                                         # (..., n, h·d_v)
    g["W_UK"], g["W_UV"] = flat(saved.c).T @ flat(dk_nope), flat(saved.c).T @ flat(dv)
    dc = dk_nope @ p.W_UK.T + dv @ p.W_UV.T                      # (..., n, r)
    named["hook_kv_latent"] = dc
    # forward: k_rope = rope(ckv[r:]), q_rot = [q_nope | rope(q_rope)]: a rotation's transpose turns back
    dk_rope = _turn(c, dk_rope, 0, saved.positions, inverse=True)[..., 0, :, :]   # (..., n, d_rope)
    dq = _turn(c, dq, 0, saved.positions, inverse=True)          # (..., h, n, d_qk)
    named["hook_q"] = dq
    # forward: c = rms(ckv[:r]) · kv_norm, ckv = x W_DKV + b_DKV
    dc_raw, g["kv_norm"] = _rms_backward(saved.kv_rms, dc, p.kv_norm)   # (..., n, r)
    dckv = np.concatenate([dc_raw, dk_rope], axis=-1)            # (..., n, r + d_rope)
    g["W_DKV"], g["b_DKV"] = flat(x).T @ flat(dckv), flat(dckv).sum(0)
    dx = dckv @ p.W_DKV.T                                        # (..., n, d_model)
    dq = merge_heads(dq)                                         # (..., n, h·d_qk)
    if p.W_Q is not None:
        # forward: q = x W_Q
        g["W_Q"] = flat(x).T @ flat(dq)
        dx += dq @ p.W_Q.T
    else:
        # forward: q = rms(x W_DQ + b_DQ) · q_norm W_UQ
        q_lat = saved.q_lat                                      # (..., n, r_q) after its weight
        g["W_UQ"] = flat(q_lat).T @ flat(dq)
        d_a, g["q_norm"] = _rms_backward(saved.q_rms, dq @ p.W_UQ.T, p.q_norm)   # (..., n, r_q)
        g["W_DQ"], g["b_DQ"] = flat(x).T @ flat(d_a), flat(d_a).sum(0)
        dx += d_a @ p.W_DQ.T
    grads = {k: g[k].astype(p.params()[k].dtype, copy=False) for k in param_shapes(c)}
    return dx, grads, named
