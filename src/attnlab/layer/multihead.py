"""Multi-head attention: h copies of attention side by side on the same x, mixed by W_O.

Shapes: the four projections are stored for all heads at once, as GPT-2 does:
W_Q is (d_model, n_heads·d_head) with head i in columns i·d_head … (i+1)·d_head − 1, W_K and W_V are
(d_model, n_kv_heads·d_head) (fewer heads with grouped-query attention), and W_O is (n_heads·d_head, d_model).
Every size comes from the layer's :class:`~attnlab.layer.config.AttentionConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..kernels._checks import (as_float_array, as_positive_int, check_attention_args, check_finite, check_rng, fold,
                               surely_fits, unfold)
from ..kernels._kernels import step_kernels
from ..kernels.attention import Saved, attend, attention, attention_backward, attention_forward
from ..kernels.matmul import as_weight, fuse_columns, linear, streamed
from .cache import KVCache, check_kv_dtype, kv_dtype_rule
from .config import AttentionConfig
from .positions import RoPE
from .hookpoints import NO_HOOKS, KeepPattern
from .tape import Tape
from ..kernels.naive import NaiveSaved, naive_scores
from ..kernels.sinks import softmax_with_sink
from ..kernels.softmax import softmax


def split_heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """(..., n, n_heads·d_head) -> (..., n_heads, n, d_head): one slice per head."""
    n_heads = as_positive_int("n_heads", n_heads)
    if np.ndim(x) < 2 or np.shape(x)[-1] % n_heads:
        raise ValueError(f"x must be (..., n, n_heads·d_head) with a width n_heads={n_heads} divides, "
                         f"got shape {np.shape(x)}")
    *lead, n, width = x.shape
    x = x.reshape(*lead, n, n_heads, width // n_heads)   # (..., n, h, d_head)
    return np.swapaxes(x, -2, -3)                        # (..., h, n, d_head)


def _heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """:func:`split_heads` without its checks, for the layer's own arrays (a decode step pays for every call)."""
    return x.reshape(*x.shape[:-1], n_heads, x.shape[-1] // n_heads).swapaxes(-2, -3)   # (..., h, n, d_head)


def merge_heads(x: np.ndarray) -> np.ndarray:
    """(..., n_heads, n, d_head) -> (..., n, n_heads·d_head): heads side by side."""
    if np.ndim(x) < 3:
        raise ValueError(f"x must be (..., n_heads, n, d_head), at least 3 axes, got shape {np.shape(x)}")
    *lead, h, n, d_head = x.shape
    return np.swapaxes(x, -2, -3).reshape(*lead, n, h * d_head)   # (..., n, h·d_head)


@dataclass(frozen=True, eq=False)
class MultiHeadAttention:
    """The parameters of one multi-head attention layer, and the config that states its sizes; calling it
    runs the forward pass. The weights are checked against the config, never the other way round."""
    W_Q: np.ndarray   # (d_model, h·d_head)
    W_K: np.ndarray   # (d_model, h_kv·d_head)
    W_V: np.ndarray   # (d_model, h_kv·d_head)
    W_O: np.ndarray   # (h·d_head, d_model)
    b_Q: np.ndarray   # (h·d_head,)
    b_K: np.ndarray   # (h_kv·d_head,)
    b_V: np.ndarray   # (h_kv·d_head,)
    b_O: np.ndarray   # (d_model,)
    config: AttentionConfig
    sinks: np.ndarray | None = None   # (h,) the learned sink logits, with config.sinks (gpt-oss; kernels.sinks)
    q_norm: np.ndarray | None = None   # (d_head,) or (h·d_head,): QK-norm's weights, with the config's qk_norm only
    k_norm: np.ndarray | None = None   # (d_head,) or (h_kv·d_head,)
    # W_Q | W_K | W_V side by side (d_model, (h + 2·h_kv)·d_head), and b_Q | b_K | b_V: one product projects q, k
    # and v (attnlab.kernels.matmul). Float weights are views of its columns; None when the three differ in type
    W_QKV: object | None = field(init=False, repr=False, default=None)
    b_QKV: np.ndarray | None = field(init=False, repr=False, default=None)

    def __post_init__(self):
        if not isinstance(self.config, AttentionConfig):
            raise TypeError(f"config must be an AttentionConfig, got {type(self.config).__name__}")
        expected = param_shapes(self.config)
        for name in QK_NORM_PARAMS:
            if (getattr(self, name) is None) == (name in expected):
                raise ValueError(f"{name} must be given with the config's qk_norm and only then: the config has "
                                 f"qk_norm {self.config.qk_norm}, {name} is {type(getattr(self, name)).__name__}")
        for name in expected:
            object.__setattr__(self, name, as_weight(name, getattr(self, name)))
        for name, shape in expected.items():
            got = getattr(self, name).shape
            if got != shape:
                c = self.config
                raise ValueError(f"{name} has shape {got}, the config (d_model {c.d_model}, n_heads {c.n_heads}, "
                                 f"n_kv_heads {c.n_kv_heads}, d_head {c.d_head}) asks for {shape}")
        if self.config.sinks or self.sinks is not None:
            object.__setattr__(self, "sinks", as_weight("sinks", self.sinks))
            if self.sinks.shape != expected.get("sinks"):
                raise ValueError(f"sinks has shape {self.sinks.shape}, the config (n_heads {self.config.n_heads}, "
                                 f"sinks {self.config.sinks}) asks for {expected.get('sinks')}")
        object.__setattr__(self, "W_O", streamed(self.W_O))         # in the layout x @ W_O streams fastest
        for fused, names in (("W_QKV", ("W_Q", "W_K", "W_V")), ("b_QKV", ("b_Q", "b_K", "b_V"))):
            whole, parts = fuse_columns(*(getattr(self, n) for n in names))
            object.__setattr__(self, fused, whole)
            for name, part in zip(names, parts):
                object.__setattr__(self, name, part)

    @classmethod
    def init(cls, config: AttentionConfig, *, rng: np.random.Generator, std: float = 0.02,
             dtype=np.float32) -> "MultiHeadAttention":
        """Random weights from N(0, std²), as GPT-2 initialises them; zero biases."""
        if not isinstance(config, AttentionConfig):
            raise TypeError(f"config must be an AttentionConfig, got {type(config).__name__}")
        check_rng(rng)
        shapes = param_shapes(config)
        return cls(**{n: (rng.normal(0.0, std, shape).astype(dtype) if n.startswith("W") else
                          np.ones(shape, dtype) if n in QK_NORM_PARAMS else np.zeros(shape, dtype))
                      for n, shape in shapes.items()}, config=config)

    @classmethod
    def from_gpt2(cls, c_attn_weight, c_attn_bias, c_proj_weight, c_proj_bias, config: AttentionConfig):
        """From GPT-2's fused layout: c_attn (d_model, 3·h·d_head) holds W_Q | W_K | W_V side by side."""
        c_attn_weight = as_float_array("c_attn_weight", c_attn_weight)
        c_attn_bias = as_float_array("c_attn_bias", c_attn_bias)
        width = config.n_heads * config.d_head
        if c_attn_weight.shape != (config.d_model, 3 * width) or c_attn_bias.shape != (3 * width,):
            raise ValueError(f"c_attn_weight {c_attn_weight.shape} and c_attn_bias {c_attn_bias.shape} must be "
                             f"{(config.d_model, 3 * width)} and {(3 * width,)} for the config "
                             f"(d_model {config.d_model}, n_heads {config.n_heads}, d_head {config.d_head})")
        W_Q, W_K, W_V = np.split(c_attn_weight, 3, axis=1)   # (d_model, h·d_head) each
        b_Q, b_K, b_V = np.split(c_attn_bias, 3)               # (h·d_head,) each
        return cls(W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=c_proj_weight, b_Q=b_Q, b_K=b_K, b_V=b_V,
                   b_O=c_proj_bias, config=config)

    @property
    def n_params(self) -> int:
        """Every number in the layer: four matrices and four biases (and QK-norm's two weights)."""
        return sum(a.size for a in self.params().values())

    def params(self) -> dict[str, np.ndarray]:
        """The eight arrays by name (ten with QK-norm; the arrays themselves, not copies)."""
        return {n: getattr(self, n) for n in param_shapes(self.config)}

    def new_cache(self, capacity: int, *, batch_shape: tuple = (), kv_dtype=None) -> KVCache:
        """An empty KV cache for this layer, with room for ``capacity`` tokens of its n_kv_heads heads, holding
        ``kv_dtype`` (None: :func:`attnlab.layer.cache.kv_dtype_rule`; float16 under a float32 layer rounds
        each key and value on append)."""
        rule, _ = kv_dtype_rule(self.W_K)
        dtype = rule if kv_dtype is None else check_kv_dtype(kv_dtype, np.result_type(self.W_K, np.float32))
        return KVCache.empty(self.config.n_kv_heads, capacity, self.config.d_head,
                             batch_shape=batch_shape, dtype=dtype)

    def __call__(self, x, *, mask=None, bias=None, is_causal=False, cache: KVCache | None = None) -> np.ndarray:
        """:func:`multihead_attention` with these weights: y (..., n, d_model)."""
        return multihead_attention(self, x, mask=mask, bias=bias, is_causal=is_causal, cache=cache)

    def with_weights(self, x, *, mask=None, bias=None, is_causal=False,
                     cache: KVCache | None = None) -> tuple[np.ndarray, np.ndarray]:
        """:func:`multihead_attention_with_weights` with these weights: y and the weights (..., h, n, n_k)."""
        return multihead_attention_with_weights(self, x, mask=mask, bias=bias, is_causal=is_causal, cache=cache)

    def attend_heads(self, q, k, v, opts: dict, cache: KVCache | None) -> np.ndarray:
        """The heads (..., h, n, d_head) of the rotated q (..., h, n, d_head) against k and v (..., h_kv, n_k,
        d_head), every token so far with a ``cache``: the attention kernels (:func:`attnlab.kernels.attention.
        attention`; with a cache :func:`~attnlab.kernels.attention.attend`, checked once at the door). ``opts``:
        mask, bias, is_causal and the config's options (and a sink)."""
        if cache is None:
            return attention(q, k, v, **opts)        # (..., h, n, d_head)
        q_max = check_finite("query", q)             # the cached keys and values were checked on append
        d_k = q.shape[-1]
        scale = opts["scale"] if opts.get("scale") is not None else d_k ** -0.5 if d_k else 1.0
        fits = surely_fits(q.dtype, d_k, k.shape[-2], scale, q_max, cache.k_max, cache.v_max)
        return attend(q, k, v, check_finite=not fits, **opts)   # checked once, at the door; huge: in full


@dataclass(frozen=True, eq=False)
class LlamaCppAttention(MultiHeadAttention):
    """A :class:`MultiHeadAttention` whose attention computes as llama.cpp's CPU graph does with flash-attention
    off (:func:`attnlab.kernels.ggml_arith.attention`): keys and values rounded to float16 (its cache's type),
    q and the softmax's weights rounded to float16, its exp, its sums in its orders (one token: ggml_vec_dot_f16's;
    a batch: tinyBLAS's). The ``q8-activations`` mode's attention. It takes causal self-attention on float32
    heads without batch axes, mask, bias, window, softcap or sinks, with no cache or a float16 one (the mode's
    rule, :func:`attnlab.layer.cache.kv_dtype_rule`); anything else, a float32 cache asked for too, is
    MultiHeadAttention's. (The pattern, when a hook asks for it, is computed on the (n, n_k) grid as
    MultiHeadAttention computes it.)"""

    def attend_heads(self, q, k, v, opts: dict, cache: KVCache | None) -> np.ndarray:
        plain = (q.ndim == 3 and q.dtype == np.float32 and opts.get("is_causal") and opts.get("mask") is None
                 and opts.get("bias") is None and opts.get("window") is None and opts.get("softcap") is None
                 and "sink" not in opts and k.shape[-2] >= q.shape[-2]
                 and (cache is None or k.dtype == np.float16))
        if not plain:
            return super().attend_heads(q, k, v, opts, cache)
        from ..kernels import ggml_arith
        d_k = q.shape[-1]
        scale = np.float32(opts["scale"] if opts.get("scale") is not None else np.float32(1) / np.sqrt(np.float32(d_k)))
        check_finite("query", q)
        start = k.shape[-2] - q.shape[-2]
        fused = ggml_arith.kernels()
        if fused is None:
            return ggml_arith.attention(q, k, v, start, scale)                    # (h, n, d_head) numpy
        if cache is not None and cache.k.flags.c_contiguous and cache.v.flags.c_contiguous:
            k, v = cache.k, cache.v                  # the whole buffers (rows past start + n unread): C layout
        bits = lambda a: a.view(np.uint16) if a.dtype == np.float16 else ggml_arith.half(a)   # noqa: E731
        out = np.empty(q.shape, np.float32)                                       # (h, n, d_head)
        fused.attention(q, bits(k), bits(v), start, scale, out)
        return out


PARAMS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")
QK_NORM_PARAMS = ("q_norm", "k_norm")   # with the config's qk_norm only
# in pass order: q, k, v as projected (before QK-norm and RoPE, TransformerLens's meaning), with QK-norm as
# normalised, then, with RoPE only, as rotated
HOOKS = ("hook_q", "hook_k", "hook_v", "hook_q_normed", "hook_k_normed", "hook_rot_q", "hook_rot_k", "hook_scores",
         "hook_pattern", "hook_z", "hook_result")
MultiHeadAttention.HOOKS = HOOKS


def hook_points(c: AttentionConfig) -> tuple[str, ...]:
    """The hook points of a layer with config ``c``: :data:`HOOKS`, ``hook_q_normed``/``hook_k_normed`` with
    QK-norm only, ``hook_rot_q``/``hook_rot_k`` with RoPE only, ``hook_sink`` (..., h, n) after ``hook_pattern``
    with sinks only (the weight each query gave its head's sink)."""
    points = tuple(h for h in HOOKS if not (h.startswith("hook_rot") and not c.positions.rotates)
                   and not (h.endswith("_normed") and c.qk_norm is None))
    if c.sinks:
        i = points.index("hook_pattern") + 1
        points = (*points[:i], "hook_sink", *points[i:])
    return points


def param_shapes(c: AttentionConfig) -> dict[str, tuple]:
    """The shape of each weight of a layer with config ``c`` (QK-norm's two after the eight)."""
    d, w, w_kv = c.d_model, c.n_heads * c.d_head, c.n_kv_heads * c.d_head
    own = {} if c.qk_norm is None else c.qk_norm.shapes(c.n_heads, c.n_kv_heads, c.d_head)
    return {"W_Q": (d, w), "W_K": (d, w_kv), "W_V": (d, w_kv), "W_O": (w, d),
            "b_Q": (w,), "b_K": (w_kv,), "b_V": (w_kv,), "b_O": (d,), **own,
            **({"sinks": (c.n_heads,)} if c.sinks else {})}


def multihead_attention(p: MultiHeadAttention, x, *, mask=None, bias=None, is_causal=False,
                        cache: KVCache | None = None, hook=None, tape: Tape | None = None,
                        positions=None) -> np.ndarray:
    """Multi-head attention (Vaswani et al., 2017, §3.2.2):
    ``y = concat_i(attention(x W_Qᵢ + b_Qᵢ, x W_Kᵢ + b_Kᵢ, x W_Vᵢ + b_Vᵢ)) W_O + b_O``.

    The layer's config says the rest: its QK-norm normalises q and k first, its position scheme rotates q and
    k (RoPE) or biases the scores
    (ALiBi), its ``window`` limits a causal mask, and with ``n_kv_heads < n_heads`` each key/value head
    serves a group of query heads (grouped-query attention; K and V are never repeated).

    Parameters
    ----------
    p : MultiHeadAttention
        The layer's weights and config.
    x : float array (..., n, d_model)
    mask : bool array broadcasting to (..., n_heads, n, n_k), optional
        True = may attend.
    bias : float array broadcasting to (..., n_heads, n, n_k), optional
        Added to the scaled scores, on top of the position scheme's own bias.
    is_causal : bool
    cache : KVCache, optional
        The new tokens sit after the ``cache.length`` cached ones: they take those positions, their keys
        and values are appended, and the n queries attend to all n_k cached tokens (bottom-right causal
        alignment: the queries are the last n positions). A step that raises leaves the cache as it was.
    hook : callable, optional
        Named activations (see :mod:`attnlab.stack.hooks`): ``hook(name, array)`` returns the array to go on
        with, for the names of :func:`hook_points`: ``hook_q``, ``hook_k``, ``hook_v`` as projected, then
        with QK-norm ``hook_q_normed``, ``hook_k_normed`` as normalised (:mod:`attnlab.layer.qknorm`), with
        RoPE ``hook_rot_q``, ``hook_rot_k`` as rotated, ``hook_scores``, ``hook_pattern``, ``hook_z``
        and ``hook_result``; ``hook.wants(name)`` says which it takes. Asking for the scores or the pattern
        takes the path that holds the (n, n_k) grid.
    tape : Tape, optional
        Keep what :func:`multihead_attention_backward` needs (a :class:`SavedLayer`, under the tape's own
        name): the same pass, for training. Not with a cache.
    positions : int array (..., n), optional
        Each row's own positions (a padded batch's: 0 at its first real token), where RoPE rotates q and k;
        default start, start + 1, …. Not with a cache.

    Returns
    -------
    y : (..., n, d_model)
        The weights themselves come from :func:`multihead_attention_with_weights`.

    Raises
    ------
    ValueError, TypeError
        When ``x`` is not (..., n, d_model), and as :func:`attnlab.kernels.attention` or :meth:`KVCache.append` do.
    """
    if tape is not None and cache is not None:
        raise ValueError("tape is for a pass without a KV cache (a training step's), got both")
    if positions is not None and cache is not None:
        raise ValueError("positions are a padded batch's, for a pass without a KV cache; got both")
    return _multihead(p, x, mask=mask, bias=bias, is_causal=is_causal, cache=cache,
                      hook=NO_HOOKS if hook is None else hook, tape=tape, positions=positions)


def multihead_attention_with_weights(p: MultiHeadAttention, x, *, mask=None, bias=None, is_causal=False,
                                     cache: KVCache | None = None, hook=None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`multihead_attention`, and every head's weights: ``(y, weights)``.

    The weights are the whole (n, n_k) grid per head, so this takes the naive path (never the tiled kernel);
    ``y`` is what :func:`multihead_attention` returns on that path.

    Parameters
    ----------
    p, x, mask, bias, is_causal, cache, hook
        As in :func:`multihead_attention`.

    Returns
    -------
    y : (..., n, d_model)
    weights : (..., n_heads, n, n_k)
        Each row sums to 1 (0 for a query that sees no key).

    Raises
    ------
    ValueError, TypeError
        As :func:`multihead_attention` does.
    """
    keep = KeepPattern(NO_HOOKS if hook is None else hook)    # the weights come through the hook_pattern point
    y = _multihead(p, x, mask=mask, bias=bias, is_causal=is_causal, cache=cache, hook=keep)
    return y, keep.pattern.astype(y.dtype, copy=False)


def _multihead(p: MultiHeadAttention, x, *, mask, bias, is_causal, cache, hook, tape=None, positions=None):
    """The one forward: y (..., n, d_model), calling ``hook`` at each of its points, keeping its
    :class:`SavedLayer` on ``tape`` when given one (no cache then)."""
    x = _check_x(p, x)
    start = 0 if cache is None else cache.length
    plain = hook is NO_HOOKS                         # nothing listens: no calls at the points
    fused = _rows_kernels(p, x) if plain and tape is None and positions is None else None
    normed = None
    if fused is not None:                            # a prompt's rows: bias and RoPE in one pass, numpy's bits
        q, k, v = _project_rotated(p, x, start, fused)   # (h, n, d_head), (h_kv, n, d_head) × 2
    else:
        q0, k0, v, qk = _project(p, x)               # (..., h, n, d_head), (..., h_kv, n, d_head) × 2
        q, k, v = (q0, k0, v) if plain else (hook("hook_q", q0), hook("hook_k", k0), hook("hook_v", v))
        if p.config.qk_norm is not None:             # QK-norm: before RoPE, so q and k are new arrays
            q, k, normed = _qk_norm(p, q, k, hook, keep=tape is not None)   # (..., h|h_kv, n, d_head)
        q, k = _rotate(p, q, k, qk if q is q0 and k is k0 else None, hook, start=start, positions=positions)
    if cache is not None:
        k, v = cache.append(k, v)                    # (..., h_kv, n_k, d_head) each: every token so far
    try:
        opts = dict(mask=mask, bias=_bias(p, bias, q.shape[-2], k.shape[-2], q.dtype), is_causal=is_causal,
                    **p.config.options)             # window, scale, softcap
        if p.sinks is not None:
            opts["sink"] = p.sinks                   # (h,) one logit per head in each row's denominator
        saved = None
        if not plain and (hook.wants("hook_scores") or hook.wants("hook_pattern")
                          or (p.sinks is not None and hook.wants("hook_sink"))):
            heads, saved = _attention_on_the_grid(q, k, v, opts, hook, finite=cache is None)   # (..., h, n, d_head)
        elif tape is not None:
            heads, saved = attention_forward(q, k, v, **opts)   # (..., h, n, d_head), the backward's share
        else:
            heads = p.attend_heads(q, k, v, opts, cache)   # (..., h, n, d_head)
    except Exception:
        if cache is not None:
            cache.length = start                     # a failed step leaves the cache as it was
        raise
    if plain:
        merged, y = _output(p, heads)                # (..., n, h·d_head), (..., n, d_model)
        if tape is not None:
            tape.keep(SavedLayer(x=x, merged=merged, attn=saved, positions=positions, qk_normed=normed))
        return y
    heads = hook("hook_z", heads)                    # (..., h, n, d_head) per-head outputs before W_O
    if hook.wants("hook_result"):
        merged, y = _output_by_head(p, heads, hook)  # (..., n, h·d_head), (..., n, d_model)
    else:
        merged, y = _output(p, heads)                # (..., n, h·d_head), (..., n, d_model)
    if tape is not None:
        tape.keep(SavedLayer(x=x, merged=merged, attn=saved, positions=positions, qk_normed=normed))
    return y


def _output_by_head(p: MultiHeadAttention, heads: np.ndarray, hook) -> tuple[np.ndarray, np.ndarray]:
    """The merged heads and the layer's output with each head's own result ``z_h W_O[h]`` (..., h, n, d_model)
    seen at ``hook_result``: ``merged W_O + b_O`` when the hook only looked (so recording changes no bit),
    the sum of the results it returned plus b_O when it replaced them."""
    c = p.config
    W_O = p.W_O.reshape(c.n_heads, c.d_head, c.d_model)   # (h, d_head, d_model) head h's rows of W_O
    result = heads @ W_O                             # (..., h, n, d_model)
    replaced = hook("hook_result", result)           # (..., h, n, d_model)
    merged, y = _output(p, heads)                    # (..., n, h·d_head), (..., n, d_model)
    if replaced is result:
        return merged, y
    return merged, replaced.sum(axis=-3) + p.b_O     # (..., n, d_model)


def _attention_on_the_grid(q, k, v, opts: dict, hook, *, finite: bool):
    """Attention through its (n, n_k) grid, so the scores and the pattern can be seen or replaced: the heads
    (..., h, n, d_head), and what the naive backward needs (the weights the pass went on with);
    ``hook_pattern`` sees the weights (..., h, n, n_k) in the softmax's dtype."""
    c = check_attention_args(q, k, v, require_finite=finite, **opts)
    s = hook("hook_scores", naive_scores(c))         # (..., h, n, n_k) scaled, biased, masked with -inf
    p_sink = None
    if c.sink is None:
        a = hook("hook_pattern", softmax(s))         # (..., h, n, n_k) rows with no key are 0
    else:
        a, p_sink = softmax_with_sink(s, c.sink)     # (..., h, n, n_k) rows sum to 1 − p_sink, (..., h, n)
        a, p_sink = hook("hook_pattern", a), hook("hook_sink", p_sink)
    out = unfold(fold(a, c.groups) @ c.v, c.groups)  # (..., h, n, d_head) a group: one matmul
    return out.astype(c.out_dtype, copy=False), NaiveSaved(c=c, inputs=(q, k, v), out=out, a=a, p_sink=p_sink)


def multihead_attention_grad(p: MultiHeadAttention, x, dy, *, mask=None, bias=None, is_causal=False):
    """Backward of :func:`multihead_attention` (no cache): returns ``(dx, grads)``.

    The forward is recomputed here, once. To keep the forward instead of recomputing it, use
    :func:`multihead_attention_forward` and :func:`multihead_attention_backward`.

    Parameters
    ----------
    p, x, mask, bias, is_causal
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
    _, saved = multihead_attention_forward(p, x, mask=mask, bias=bias, is_causal=is_causal)
    return multihead_attention_backward(p, saved, dy)


@dataclass(frozen=True, eq=False)
class SavedLayer:
    """What :func:`multihead_attention_forward` keeps for :func:`multihead_attention_backward`."""
    x: np.ndarray            # (..., n, d_model) the layer's input
    merged: np.ndarray       # (..., n, h·d_head) the heads side by side, before W_O
    attn: Saved              # the attention's own saved forward
    positions: np.ndarray | None = None   # (..., n) a padded batch's positions, RoPE's angles
    qk_normed: tuple | None = None        # QK-norm's saved forward for q and for k (QKNorm.backward's)


def multihead_attention_forward(p: MultiHeadAttention, x, *, mask=None, bias=None, is_causal=False):
    """:func:`multihead_attention` without a cache, run with a tape of its own, and what it kept.

    Parameters
    ----------
    p, x, mask, bias, is_causal
        As in :func:`multihead_attention`.

    Returns
    -------
    y : (..., n, d_model)
        What :func:`multihead_attention` returns.
    saved : SavedLayer
        For :func:`multihead_attention_backward`: the input, the merged heads, the attention's own
        saved forward (its weights below the crossover, one log-sum-exp per query above it).
    """
    tape = Tape()
    y = multihead_attention(p, x, mask=mask, bias=bias, is_causal=is_causal, tape=tape)   # (..., n, d_model)
    return y, tape.value


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
    dx, grads, _ = multihead_attention_backward_named(p, saved, dy)
    return dx, grads


def multihead_attention_backward_named(p: MultiHeadAttention, saved: SavedLayer, dy):
    """:func:`multihead_attention_backward`, and the gradients of the layer's named activations (the hooks of
    :func:`multihead_attention`): ``(dx, grads, named)`` with ``named`` holding dL/d ``hook_q`` (..., h, n,
    d_head), ``hook_k``, ``hook_v`` (..., h_kv, n, d_head), ``hook_z`` (..., h, n, d_head) and ``hook_result``
    (..., h, n, d_model, a read-only broadcast of dy): what attribution patching multiplies by an activation's
    change."""
    x = saved.x                                            # (..., n, d_model)
    dy = as_float_array("dy", dy)
    if dy.shape != x.shape:
        raise ValueError(f"dy must have the shape of x {x.shape}, got {dy.shape}")
    c = p.config
    d_model, width = c.d_model, c.n_heads * c.d_head
    # forward: y = merged @ W_O + b_O
    dy2 = dy.reshape(-1, d_model)                          # (N, d_model), N = all tokens
    dW_O = saved.merged.reshape(-1, width).T @ dy2         # (h·d_head, d_model)
    db_O = dy2.sum(0)                                      # (d_model,)
    d_merged = dy @ p.W_O.T                                # (..., n, h·d_head)
    # forward: heads = attention(q, k, v); dk, dv summed over each group of query heads
    dz = split_heads(d_merged, c.n_heads)                  # (..., h, n, d_head) dL/d hook_z
    dq, dk, dv, *dsink = attention_backward(saved.attn, dz)   # (..., h|h_kv, n, d_head); (h,) with sinks
    # forward: y = Σ_h result_h + b_O, so every head's result gets dy itself
    d_result = np.broadcast_to(dy[..., None, :, :], (*dy.shape[:-2], c.n_heads, *dy.shape[-2:]))   # (..., h, n, d)
    named = {"hook_v": dv, "hook_z": dz, "hook_result": d_result}
    if c.positions.rotates:
        # forward: q = rotate(q), k = rotate(k); a rotation's transpose is the inverse rotation
        named.update(hook_rot_q=dq, hook_rot_k=dk)
        at = None if saved.positions is None else saved.positions[..., None, :]   # (..., 1, n)
        dq = c.positions.rotate(dq, start=0, inverse=True, positions=at)   # (..., h, n, d_head)
        dk = c.positions.rotate(dk, start=0, inverse=True, positions=at)   # (..., h_kv, n, d_head)
    norm_grads = {}
    if c.qk_norm is not None:
        # forward: q = qk_norm(q, q_norm), k = qk_norm(k, k_norm), before the rotation
        named.update(hook_q_normed=dq, hook_k_normed=dk)
        dq, norm_grads["q_norm"] = c.qk_norm.backward(saved.qk_normed[0], dq, p.q_norm)   # (..., h, n, d_head)
        dk, norm_grads["k_norm"] = c.qk_norm.backward(saved.qk_normed[1], dk, p.k_norm)   # (..., h_kv, n, d_head)
    named.update(hook_q=dq, hook_k=dk)
    # forward: q = split_heads(x @ W_Q + b_Q), likewise k and v
    x2 = x.reshape(-1, d_model)                            # (N, d_model)
    grads, dx = {}, np.zeros_like(x)                      # dx: (..., n, d_model)
    for name, d in (("Q", dq), ("K", dk), ("V", dv)):
        d_lin = merge_heads(d)                             # (..., n, h·d_head) or (..., n, h_kv·d_head)
        w = d_lin.shape[-1]
        grads[f"W_{name}"] = x2.T @ d_lin.reshape(-1, w)   # (d_model, w)
        grads[f"b_{name}"] = d_lin.reshape(-1, w).sum(0)   # (w,)
        dx += d_lin @ getattr(p, f"W_{name}").T            # (..., n, d_model)
    if dsink:
        grads["sinks"] = dsink[0]                          # (h,)
    return dx, MultiHeadAttention(**grads, W_O=dW_O, b_O=db_O, config=c, **norm_grads), named


def _output(p: MultiHeadAttention, heads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The heads (..., h, n, d_head) side by side, and the layer's output ``merged W_O + b_O``."""
    *lead, h, n, d_head = heads.shape
    merged = heads.swapaxes(-2, -3).reshape(*lead, n, h * d_head)   # (..., n, h·d_head) merge_heads, unchecked
    y = linear(merged, p.W_O)                        # (..., n, d_model)
    y += p.b_O
    return merged, y                                 # (..., n, h·d_head), (..., n, d_model)


def _project(p: MultiHeadAttention, x: np.ndarray):
    """q (..., h, n, d_head), k and v (..., h_kv, n, d_head) of x, before any rotation; and q and k side by side
    (..., h + h_kv, n, d_head) when one product made them (q and k are views of it), else None."""
    c = p.config
    h, h_kv = c.n_heads, c.n_kv_heads
    if p.W_QKV is None:
        q = _heads(linear(x, p.W_Q) + p.b_Q, h)         # (..., h, n, d_head)
        k = _heads(linear(x, p.W_K) + p.b_K, h_kv)      # (..., h_kv, n, d_head)
        v = _heads(linear(x, p.W_V) + p.b_V, h_kv)      # (..., h_kv, n, d_head)
        return q, k, v, None
    b_qkv = np.concatenate([p.b_Q, p.b_K, p.b_V]) if p.b_QKV is None else p.b_QKV   # ((h + 2·h_kv)·d_head,)
    qkv = _heads(linear(x, p.W_QKV) + b_qkv, h + 2 * h_kv)   # (..., h + 2·h_kv, n, d_head) one product
    return qkv[..., :h, :, :], qkv[..., h:h + h_kv, :, :], qkv[..., h + h_kv:, :, :], qkv[..., :h + h_kv, :, :]


def _rows_kernels(p: MultiHeadAttention, x: np.ndarray):
    """The fused kernels (:mod:`attnlab.kernels._step_fused`) when they take this layer's q, k and v of x: float32
    rows (n, d_model) without batch axes, q|k|v as one product of a float32 weight with a float32 bias, no
    QK-norm, RoPE over whole heads or no rotation; else None (numpy's way: :func:`_project`, :func:`_rotate`).
    Quantized weights keep numpy's way, which their modes' own arithmetic may take over."""
    c, scheme = p.config, p.config.positions
    if (x.ndim != 2 or x.dtype != np.float32 or not isinstance(p.W_QKV, np.ndarray) or p.W_QKV.dtype != np.float32
            or p.b_QKV is None or p.b_QKV.dtype != np.float32
            or c.qk_norm is not None
            or (scheme.rotates and (type(scheme) is not RoPE or scheme.rotary_dim is not None))):
        return None
    return step_kernels()


def _project_rotated(p: MultiHeadAttention, x: np.ndarray, start: int, fused):
    """:func:`_project` then :func:`_rotate` on float32 rows x (n, d_model) in one pass after the product
    (``qkv_rope_rows``: the same operations, the same bits): q (h, n, d_head), k and v (h_kv, n, d_head), each
    head contiguous."""
    c = p.config
    qkv = linear(x, p.W_QKV)                         # (n, (h + 2·h_kv)·d_head)
    n = x.shape[0]
    q = np.empty((c.n_heads, n, c.d_head), np.float32)             # (h, n, d_head)
    k = np.empty((c.n_kv_heads, n, c.d_head), np.float32)          # (h_kv, n, d_head)
    v = np.empty((c.n_kv_heads, n, c.d_head), np.float32)          # (h_kv, n, d_head)
    rotate = c.positions.rotates
    cos, sin = c.positions.turns(c.d_head, start, n) if rotate else (_NO_TURN, _NO_TURN)   # (n, d_head/2, 2)
    fused.qkv_rope_rows(qkv, p.b_QKV, cos, sin, rotate, q, k, v)
    return q, k, v


_NO_TURN = np.zeros((1, 1, 2), np.float32)           # RoPE's tables where nothing rotates (unread)


def _rotate(p: MultiHeadAttention, q, k, qk, hook, *, start: int, positions=None):
    """q and k as attention sees them at positions start, start + 1, … (each row at ``start + positions``
    (..., n) in a padded batch): RoPE rotates them, seen at ``hook_rot_q`` and ``hook_rot_k``; the other
    schemes leave them. ``qk``: q and k side by side (one rotation for both), or None."""
    scheme = p.config.positions
    if not scheme.rotates:
        return q, k
    at = None if positions is None else positions[..., None, :]   # (..., 1, n) every head alike
    if qk is not None:
        both = scheme.rotate(qk, start=start, positions=at)   # (..., h + h_kv, n, d_head)
        h = q.shape[-3]
        q, k = both[..., :h, :, :], both[..., h:, :, :]
    else:
        q, k = scheme.rotate(q, start=start, positions=at), scheme.rotate(k, start=start, positions=at)
    if hook is NO_HOOKS:
        return q, k
    return hook("hook_rot_q", q), hook("hook_rot_k", k)        # (..., h, n, d_head), (..., h_kv, n, d_head)


def _qk_norm(p: MultiHeadAttention, q, k, hook, *, keep: bool):
    """q and k RMS-normalised by the config's QK-norm (:mod:`attnlab.layer.qknorm`), seen at ``hook_q_normed`` and
    ``hook_k_normed``; and, with ``keep``, what its backward needs for each (else None)."""
    norm = p.config.qk_norm
    q, saved_q = norm(q, p.q_norm, keep)             # (..., h, n, d_head)
    k, saved_k = norm(k, p.k_norm, keep)             # (..., h_kv, n, d_head)
    return hook("hook_q_normed", q), hook("hook_k_normed", k), ((saved_q, saved_k) if keep else None)


def _bias(p: MultiHeadAttention, bias, n_q: int, n_k: int, dtype):
    """The caller's bias plus the position scheme's (ALiBi's (h, n_q, n_k)); None when neither has one."""
    own = p.config.positions.bias(p.config.n_heads, n_q, n_k, dtype)   # (h, n_q, n_k) or None
    if own is None or bias is None:
        return bias if own is None else own
    return own + as_float_array("bias", bias)        # (..., h, n_q, n_k)


def _check_x(p: MultiHeadAttention, x) -> np.ndarray:
    x = as_float_array("x", x, min_ndim=2)
    if x.shape[-1] != p.config.d_model:
        raise ValueError(f"x has width {x.shape[-1]}, the layer's d_model is {p.config.d_model}; they must match")
    return x
