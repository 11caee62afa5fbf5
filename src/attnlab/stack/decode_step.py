"""A pre-norm block's decode step in the fused one-token kernels: the block's two residual lines on one
token, with one call between each two products.

    x (1, d_model)  ─ rms_norm_rows ─▶ h  ─ h @ W_QKV ─▶ qkv  ─ qkv_rope_append ─▶ q; k, v into the cache
    q, the cache    ─ attend ─▶ heads (h, 1, d_head)  ─ merged @ W_O ─▶ y
    x, y            ─ resid_rms ─▶ x' = x + (y + b_O), h' = ln_2(x')  ─ h' @ W_gate_in ─▶ gate|up
    gate|up         ─ swiglu_row ─▶ hidden  ─ hidden @ W_out ─▶ x' += it

The block's own lines (:meth:`attnlab.stack.blocks.Block.forward`) take about 29 numpy calls a layer for the
same token; this takes 4 numba calls, the 4 products and attention's own. Same bits as those lines with the
fused kernels chosen, hooked or not (``tests/test_decode_step_bits.py``): the bias, the rotation, the residual
adds and the norm's elementwise work are numpy's exact IEEE operations in numpy's order, and the norm's sum of
squares and silu are the same inner functions of :mod:`attnlab.kernels._step_fused` that ``rms_norm`` and
``GatedMLP`` call on one row.

It takes Llama's block: RMSNorms, a MultiHeadAttention with q|k|v as one product, no QK-norm, no sinks, RoPE
over whole heads or positions that do not touch q and k (no ALiBi), a SwiGLU MLP with gate|up as one product;
float32, one token without batch axes, a plain :class:`~attnlab.layer.cache.KVCache` of float32 with room for
it. Anything else (and a step whose q, k or v is not finite, which then raises from the block's own lines)
goes the block's own way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels._checks import surely_fits
from ..kernels.attention import attend
from ..layer.cache import KVCache
from ..layer.multihead import MultiHeadAttention
from ..layer.positions import RoPE
from .layers import GatedMLP, RMSNorm

NO_TURN = np.zeros((1, 1, 2), np.float32)        # RoPE's tables for a scheme that does not rotate (unread)


@dataclass(frozen=True, eq=False)
class StepPlan:
    """What a block's fused decode step reads, looked up once when the block is built."""
    attn: MultiHeadAttention
    mlp: GatedMLP
    w_1: np.ndarray            # (d_model,) ln_1's weight
    w_2: np.ndarray            # (d_model,) ln_2's weight
    eps_1: np.float32
    eps_2: np.float32
    inv_d: np.float32          # 1 / d_model, as rms_norm multiplies by it
    rope: RoPE | None          # the rotation, or None for positions that leave q and k
    fit_scale: float           # the scale surely_fits bounds the scores with (the layer's, or 1/√d_head)
    options: dict              # what attention takes besides q, k, v: the config's window, scale, softcap


def step_plan(attn, ln_1, mlp, ln_2) -> StepPlan | None:
    """The plan of a pre-norm block with these parts, or None when the fused step does not take them."""
    if not (isinstance(attn, MultiHeadAttention) and isinstance(ln_1, RMSNorm) and isinstance(ln_2, RMSNorm)
            and isinstance(mlp, GatedMLP) and mlp.activation == "silu" and mlp.W_gate_in is not None):
        return None
    c = attn.config
    scheme = c.positions
    if (c.qk_norm is not None or attn.sinks is not None or attn.W_QKV is None or attn.b_QKV is None
            or (scheme.rotates and (type(scheme) is not RoPE or scheme.rotary_dim is not None))
            or scheme.bias(c.n_heads, 1, 1, np.float32) is not None):
        return None
    weights = (attn.W_QKV, attn.W_O, mlp.W_gate_in, mlp.W_out)
    if any(isinstance(w, np.ndarray) and w.dtype != np.float32 for w in weights):
        return None                                       # float weights of another dtype; quantized ones: float32
    if any(a.dtype != np.float32 for a in (attn.b_QKV, attn.b_O, ln_1.weight, ln_2.weight)):
        return None
    d = c.d_model
    return StepPlan(attn=attn, mlp=mlp, w_1=ln_1.weight, w_2=ln_2.weight, eps_1=np.float32(ln_1.eps),
                    eps_2=np.float32(ln_2.eps), inv_d=np.float32(1 / d), rope=scheme if scheme.rotates else None,
                    fit_scale=c.scale if c.scale is not None else c.d_head ** -0.5, options=c.options)


def decode_step(plan: StepPlan, x: np.ndarray, cache, fused, *, is_causal: bool) -> np.ndarray | None:
    """The block's output (1, d_model) for one float32 token x (1, d_model) against ``cache``, by the fused
    kernels ``fused`` (:mod:`attnlab.kernels._step_fused`); None, with the cache untouched, when the cache or
    the token's q, k and v are not what it takes (the caller then runs the block's own lines)."""
    pos = cache.length
    if type(cache) is not KVCache or cache.k.dtype != np.float32 or cache.k.ndim != 3 or pos >= cache.capacity:
        return None
    a, c = plan.attn, plan.attn.config
    h = np.empty(x.shape, np.float32)                                      # (1, d_model)
    fused.rms_norm_rows(x, plan.w_1, plan.inv_d, plan.eps_1, h)
    qkv = h @ a.W_QKV                                                      # (1, (h + 2·h_kv)·d_head)
    cos, sin = NO_TURN, NO_TURN
    if plan.rope is not None:
        cos, sin = plan.rope.turns(c.d_head, pos)                          # (1, d_head/2, 2) each
    q = np.empty((c.n_heads, 1, c.d_head), np.float32)                     # (h, 1, d_head)
    q_max, k_max, v_max, finite = fused.qkv_rope_append(qkv, a.b_QKV, cos, sin, plan.rope is not None, q, cache.k,
                                                        cache.v, pos)
    if not finite:
        return None                                                        # nothing written
    cache.count_written(1, k_max, v_max)
    try:
        fits = surely_fits(q.dtype, c.d_head, pos + 1, plan.fit_scale, q_max, cache.k_max, cache.v_max)
        heads = attend(q, cache.keys, cache.values, is_causal=is_causal, check_finite=not fits,
                       **plan.options)                                     # (h, 1, d_head)
    except Exception:
        cache.length = pos                                                 # as the block's own step does
        raise
    y = heads.reshape(1, c.n_heads * c.d_head) @ a.W_O                     # (1, d_model)
    out = np.empty(x.shape, np.float32)                                    # (1, d_model)
    fused.resid_rms(x, y, a.b_O, plan.w_2, plan.inv_d, plan.eps_2, out, h)   # h: ln_1's output is read, reused
    both = h @ plan.mlp.W_gate_in                                          # (1, 2·d_mlp) gate | up
    hidden = np.empty((1, both.shape[1] // 2), np.float32)                 # (1, d_mlp)
    fused.swiglu_row(both, hidden)
    out += hidden @ plan.mlp.W_out                                         # (1, d_model)
    return out
