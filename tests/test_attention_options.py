"""Attention options per layer: the soft-cap and an explicit scale on every path (naive, fused, tiled, decode,
the rows rebuilt from lse) against a float64 reference, their backward against finite differences, RoPE's
partial rotation, the logits' soft-cap and windows that alternate by layer."""

import numpy as np
import pytest

from attnlab.kernels import naive, tiled
from attnlab.kernels._checks import check_attention_args
from attnlab.kernels._kernels import fused_module
from attnlab.kernels.attention import attention, attention_grad, attention_weights
from attnlab.kernels.decode import decode_attention
from attnlab.layer.config import AttentionConfig
from attnlab.layer.positions import RoPE, rope
from attnlab.stack.hooks import run_with_cache
from attnlab.stack.transformer import ModelConfig, Transformer, forward

KERNELS = ["numpy"] + (["fused"] if fused_module() is not None else [])


def reference(q, k, v, *, scale, softcap, is_causal=False, window=None):
    """float64, one formula: softmax(cap · tanh(q kᵀ · scale / cap), masked) v, query heads grouped."""
    g = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    s = q @ np.swapaxes(k, -1, -2) * scale
    s = softcap * np.tanh(s / softcap) if softcap else s
    n_q, n_k = s.shape[-2:]
    i, j = np.arange(n_q)[:, None] + n_k - n_q, np.arange(n_k)[None, :]
    keep = (j <= i) & ((j > i - window) if window else True) if is_causal else np.ones((n_q, n_k), bool)
    s = np.where(keep, s, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    a = a / a.sum(-1, keepdims=True)
    return a @ v, a


def qkv(rng, n_q, n_k, h=4, h_kv=2, d=8, spread=3.0, dtype=np.float64):
    """Large scores (spread), so the cap bites: many |q·k·scale| well past 2."""
    return tuple((spread * rng.standard_normal((2, hh, n, d))).astype(dtype)
                 for hh, n in ((h, n_q), (h_kv, n_k), (h_kv, n_k)))


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("causal, window", [(False, None), (True, None), (True, 5)])
def test_every_forward_path_caps_and_scales_as_the_reference(rng, kernel, causal, window):
    q, k, v = qkv(rng, 23, 23)
    opts = dict(scale=0.3, softcap=4.0, is_causal=causal, window=window)
    want, a_want = reference(q, k, v, **opts)
    assert np.abs(q @ np.swapaxes(np.repeat(k, 2, -3), -1, -2) * 0.3).max() > 8   # the cap does bite
    c = check_attention_args(q, k, v, **opts)
    out, a = naive.naive_attention(c, kernel)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(a, a_want, rtol=1e-12, atol=1e-14)
    out, lse = tiled.tiled_forward(c, tiled.make_plan(c, block_q=4, block_k=6), kernel=kernel)
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)
    rows = tiled.attention_weights_rows(q, k, lse, [0, 7, 22], **opts)
    np.testing.assert_allclose(rows, a_want[..., [0, 7, 22], :], rtol=1e-10, atol=1e-14)
    # the front door, whichever path it takes, and the weights alone
    np.testing.assert_allclose(attention(q, k, v, **opts), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(attention_weights(q, k, **opts), a_want, rtol=1e-12, atol=1e-14)


def test_float32_tiled_fused_at_300_tokens_and_the_decode_step(rng):
    q, k, v = qkv(rng, 300, 300, h=4, h_kv=1, d=16, spread=2.0, dtype=np.float32)
    opts = dict(scale=0.25, softcap=5.0, is_causal=True, window=64)
    want, _ = reference(*(x.astype(np.float64) for x in (q, k, v)), **opts)
    got = attention(q, k, v, **opts)                       # 300 queries: the tiled path
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    step = decode_attention(check_attention_args(q[..., -1:, :], k, v, scale=0.25, softcap=5.0))   # no window
    np.testing.assert_allclose(step, reference(*(x.astype(np.float64) for x in (q[..., -1:, :], k, v)), scale=0.25,
                                               softcap=5.0)[0], rtol=0, atol=2e-5)


@pytest.mark.parametrize("n, blocks", [(7, None), (150, (32, 48))])
def test_the_backward_through_the_cap_matches_finite_differences(rng, n, blocks):
    """Small n takes the naive backward, 150 the tiled one (given small tiles); both against central
    differences of L = Σ out · dout in float64."""
    q, k, v = qkv(rng, n, n, h=2, h_kv=1, d=4, spread=2.0)
    dout = rng.standard_normal(q.shape[:-1] + (4,))
    opts = dict(scale=0.4, softcap=3.0, is_causal=True)
    if blocks is None:
        dq, dk, dv = attention_grad(q, k, v, dout, **opts)
    else:
        dq, dk, dv = tiled.tiled_attention_grad(q, k, v, dout, block_q=blocks[0], block_k=blocks[1], **opts)
        np.testing.assert_allclose(dq, attention_grad(q, k, v, dout, **opts)[0], rtol=1e-9, atol=1e-11)
    loss = lambda q_, k_, v_: float((reference(q_, k_, v_, **opts)[0] * dout).sum())   # noqa: E731
    eps = 1e-6
    for x, dx, which in ((q, dq, 0), (k, dk, 1), (v, dv, 2)):
        for idx in [tuple(rng.integers(0, s) for s in x.shape) for _ in range(4)]:
            args = [q, k, v]
            hi, lo = [a.copy() for a in args], [a.copy() for a in args]
            hi[which][idx] += eps
            lo[which][idx] -= eps
            fd = (loss(*hi) - loss(*lo)) / (2 * eps)
            assert dx[idx] == pytest.approx(fd, rel=1e-5, abs=1e-8), (which, idx)


def test_options_are_checked_by_name(rng):
    q, k, v = qkv(rng, 3, 3)
    with pytest.raises(ValueError, match="softcap must be a positive finite number, got -1"):
        attention(q, k, v, softcap=-1.0)
    with pytest.raises(TypeError, match="softcap must be a positive number, got str"):
        AttentionConfig(d_model=8, n_heads=2, softcap="50")
    with pytest.raises(ValueError, match="scale must be a positive finite number"):
        AttentionConfig(d_model=8, n_heads=2, scale=0.0)


def test_partial_rope_turns_the_first_rotary_dim_features_only(rng):
    x = rng.normal(size=(3, 5, 10))
    y = rope(x, start=2, theta=100.0, rotary_dim=4)
    np.testing.assert_array_equal(y[..., 4:], x[..., 4:])
    np.testing.assert_allclose(y[..., :4], rope(x[..., :4], start=2, theta=100.0), rtol=1e-14)
    np.testing.assert_allclose(rope(y, start=2, theta=100.0, rotary_dim=4, inverse=True), x, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match=r"rotary_dim \(12\) must be at most d_head \(10\)"):
        AttentionConfig(d_model=20, n_heads=2, positions=RoPE(rotary_dim=12))
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        RoPE(rotary_dim=3)
    assert RoPE(rotary_dim=4).to_json()["rotary_dim"] == 4 and "rotary_dim" not in RoPE().to_json()


def small_model(rng, std=1.0, **config):
    a = AttentionConfig(d_model=8, n_heads=2, n_ctx=12, positions=RoPE())
    c = ModelConfig(vocab_size=7, n_layers=2, attention=a, **config)
    return Transformer.init(c, rng=rng, std=std, dtype=np.float64)


def test_the_logits_soft_cap_and_the_embedding_scale(rng):
    plain = small_model(rng)
    capped = Transformer.from_params(ModelConfig(**{**plain.config.__dict__, "logit_softcap": 2.0}), plain.params())
    ids = np.array([1, 2, 3, 4])
    raw = forward(plain, ids).logits
    assert np.abs(raw).max() > 4
    np.testing.assert_allclose(forward(capped, ids).logits, 2.0 * np.tanh(raw / 2.0), rtol=1e-13)
    scaled = Transformer.from_params(ModelConfig(**{**plain.config.__dict__, "embed_scale": 3.0}), plain.params())
    np.testing.assert_allclose(forward(scaled, ids).hidden_states[0], 3.0 * plain.W_E[ids], rtol=1e-15)


def test_windows_and_caps_by_layer(rng):
    a = AttentionConfig(d_model=8, n_heads=2, n_ctx=12, positions=RoPE())
    layers = (AttentionConfig(**{**a.__dict__, "window": 3, "softcap": 1.5}), a)
    model = small_model(rng, std=0.5, layers=layers)
    assert model.blocks[0].attn.config.window == 3 and model.blocks[1].attn.config.window is None
    _, cache = run_with_cache(model, np.arange(7), names=["blocks.0.attn.hook_scores", "blocks.0.attn.hook_pattern",
                                                          "blocks.1.attn.hook_pattern"])
    i, j = np.arange(7)[:, None], np.arange(7)[None, :]
    assert (cache["blocks.0.attn.hook_pattern"][:, i <= j - 1] == 0).all()        # causal
    assert (cache["blocks.0.attn.hook_pattern"][:, j <= i - 3] == 0).all()        # the window of layer 0
    assert (cache["blocks.1.attn.hook_pattern"][:, j <= i - 3] > 0).all()         # layer 1 sees everything
    s = cache["blocks.0.attn.hook_scores"]
    assert 1.0 < np.abs(s[np.isfinite(s)]).max() < 1.5                             # capped
    assert ModelConfig.from_json(model.config.to_json()) == model.config
    with pytest.raises(ValueError, match=r"layers\[1\] must share attention's sizes"):
        small_model(rng, layers=(a, AttentionConfig(d_model=8, n_heads=4, n_ctx=12, positions=RoPE())))
    with pytest.raises(ValueError, match=r"layers must hold one AttentionConfig per layer \(2\), got 1"):
        small_model(rng, layers=(a,))


def test_the_lm_backward_through_a_capped_scaled_layer_matches_finite_differences(rng):
    """attnlab's own LM with a soft-cap and its own scale in every layer: loss_and_grad's dW_Q and dW_K (the
    scores' path) against central differences, float64."""
    from attnlab.lm.model import loss, loss_and_grad
    a = AttentionConfig(d_model=8, n_heads=2, n_ctx=6, positions=RoPE(), scale=0.9, softcap=1.0)
    model = Transformer.init(ModelConfig(vocab_size=5, n_layers=2, attention=a), rng=rng, std=0.8, dtype=np.float64)
    ids, targets = rng.integers(0, 5, (2, 6)), rng.integers(0, 5, (2, 6))
    _, grads = loss_and_grad(model, ids, targets)
    params, eps = model.params(), 1e-6
    for name in ("blocks.0.attn.W_Q", "blocks.1.attn.W_K"):
        for idx in [tuple(rng.integers(0, s) for s in params[name].shape) for _ in range(3)]:
            keep = params[name][idx]
            params[name][idx] = keep + eps
            hi = loss(model, ids, targets)
            params[name][idx] = keep - eps
            lo = loss(model, ids, targets)
            params[name][idx] = keep
            assert grads[name][idx] == pytest.approx((hi - lo) / (2 * eps), rel=1e-5, abs=1e-9), (name, idx)
