"""Kernels never return silent garbage (issue 26): every path (naive and tiled, numpy and fused, decode) gives
one answer or one ValueError on scores that overflow float32, values near its maximum, huge scales and
``d_head = 0``."""

import re

import numpy as np
import pytest

from attnlab.kernels import _kernels, tiled
from attnlab.kernels._checks import check_attention_args
from attnlab.kernels.attention import attention, attention_grad, attention_weights
from attnlab.kernels.decode import decode_attention
from attnlab.kernels.naive import naive_attention


def every_path(q, k, v, **options):
    """The output of the naive path, the tiled kernel and (for one query) the decode step, all through the
    public entry points (the decode step through its front-door check)."""
    c = check_attention_args(q, k, v, **options)
    outs = {"front door": attention(q, k, v, **options), "naive": naive_attention(c, _kernels.tile_kernel())[0],
            "tiled": tiled.tiled_attention(q, k, v, **options)}
    if q.shape[-2] == 1 and not options.get("is_causal"):
        outs["decode"] = decode_attention(c)
    return outs


def reference(q, k, v, scale=None):
    """softmax(q kᵀ · scale) v in float64, the row max subtracted first."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale                     # (..., n_q, n_k)
    a = np.exp(s - s.max(-1, keepdims=True))
    return (a / a.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("seed", range(4))
def test_a_huge_scale_gives_the_hard_max_on_every_path(tile_kernel, seed):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=(4, 64, 64)).astype(np.float32) for _ in range(3))
    want = reference(q, k, v, scale=1e8)                       # one-hot rows: the value of the top key
    for path, out in every_path(q, k, v, scale=1e8).items():
        np.testing.assert_allclose(out, want, atol=1e-6, err_msg=f"{tile_kernel} {path}")


@pytest.mark.parametrize("n_q", [1, 8])
def test_scores_that_overflow_float32_are_refused_naming_scale_and_largest_score(tile_kernel, rng, n_q):
    q = rng.normal(size=(2, n_q, 16)).astype(np.float32) * np.float32(4e19)
    k = rng.normal(size=(2, 8, 16)).astype(np.float32) * np.float32(4e19)
    v = rng.normal(size=(2, 8, 16)).astype(np.float32)
    largest = np.abs(q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64)).max()
    assert largest * 0.25 > np.finfo(np.float32).max           # the float32 scores do overflow
    calls = [lambda: attention(q, k, v), lambda: tiled.tiled_attention(q, k, v), lambda: attention_weights(q, k),
             lambda: attention_grad(q, k, v, np.ones((2, n_q, 16), np.float32))]
    for call in calls:
        with pytest.raises(ValueError, match=re.escape(f"overflow float32: scale 0.25 times the largest query·key "
                                                       f"{largest:.3g} gives a largest score of {largest * 0.25:.3g}")):
            call()
    out = attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))   # float64 holds them
    np.testing.assert_allclose(out, reference(q, k, v), atol=1e-12)


def test_large_scores_that_fit_agree_on_every_path(tile_kernel, rng):
    # scores up to ~1e36: their float32 products fit, and every path shifts by the row max before exp
    q = rng.normal(size=(3, 8, 16)).astype(np.float32) * np.float32(1e17)
    k = rng.normal(size=(3, 8, 16)).astype(np.float32) * np.float32(1e17)
    v = rng.normal(size=(3, 8, 16)).astype(np.float32)
    want = reference(q, k, v)
    for path, out in every_path(q, k, v).items():
        assert np.isfinite(out).all(), path
        np.testing.assert_allclose(out, want, atol=1e-6, err_msg=f"{tile_kernel} {path}")
    for path, out in every_path(q[:, :1], k, v).items():
        np.testing.assert_allclose(out, want[:, :1], atol=1e-6, err_msg=f"{tile_kernel} {path}, one query")


def test_values_near_the_float32_maximum_are_refused_naming_value(tile_kernel, rng):
    q, k = (rng.normal(size=(2, 8, 16)).astype(np.float32) for _ in range(2))
    v = np.clip(rng.normal(size=(2, 8, 16)), -1, 1).astype(np.float32) * np.float32(3e38)
    for call in (lambda: attention(q, k, v), lambda: tiled.tiled_attention(q, k, v),
                 lambda: attention(q[:, :1], k, v)):
        with pytest.raises(ValueError, match=r"value holds 3e\+38: a weighted sum of its 8 rows could overflow "
                                             r"float32"):
            call()


@pytest.mark.parametrize("is_causal", [False, True])
def test_d_head_zero_is_the_uniform_average_on_every_path(tile_kernel, rng, is_causal):
    q, k = np.zeros((2, 6, 0), np.float32), np.zeros((2, 6, 0), np.float32)
    v = rng.normal(size=(2, 6, 3)).astype(np.float32)
    n_seen = np.arange(1, 7)[:, None] if is_causal else 6          # (6, 1) keys each query sees
    want = np.cumsum(v, axis=1) / n_seen if is_causal else np.broadcast_to(v.mean(1, keepdims=True), v.shape)
    for path, out in every_path(q, k, v, is_causal=is_causal).items():
        np.testing.assert_allclose(out, want, rtol=1e-6, err_msg=f"{tile_kernel} {path}")
    if not is_causal:
        np.testing.assert_allclose(every_path(q[:, :1], k, v)["decode"], want[:, :1], rtol=1e-6)
    np.testing.assert_allclose(attention_weights(q, k, is_causal=is_causal).sum(-1), 1.0, rtol=1e-6)


def test_the_fused_and_numpy_naive_softmax_agree_at_every_scale(rng, monkeypatch):
    pytest.importorskip("numba")
    from attnlab.kernels._kernels import NO_NUMBA_ENV
    q, k, v = (rng.normal(size=(2, 32, 64)).astype(np.float32) for _ in range(3))
    for scale in (1e-30, 1e-3, 1.0, 1e3, 1e8, 1e20, 1e30):
        c = check_attention_args(q, k, v, scale=scale)
        monkeypatch.setenv(NO_NUMBA_ENV, "1")
        numpy_out = naive_attention(c, "numpy")[0]
        monkeypatch.delenv(NO_NUMBA_ENV)
        fused_out = naive_attention(c, "fused")[0]
        np.testing.assert_allclose(fused_out, numpy_out, atol=2e-6, err_msg=f"scale {scale}")


def test_a_cached_decode_step_refuses_scores_that_overflow(rng):
    from attnlab.layer.cache import KVCache
    from attnlab.layer.config import AttentionConfig
    from attnlab.layer.multihead import MultiHeadAttention

    layer = MultiHeadAttention.init(AttentionConfig(d_model=16, n_heads=2), rng=rng, std=0.3)
    x = rng.normal(size=(1, 5, 16)).astype(np.float32)
    cache = KVCache.empty(2, 8, 8, batch_shape=(1,))
    want = layer(x, is_causal=True)                               # the uncached forward, for the last token
    layer(x[:, :4], is_causal=True, cache=cache)
    np.testing.assert_allclose(layer(x[:, 4:], is_causal=True, cache=cache), want[:, 4:], atol=1e-5)
    cache.reset()
    huge = x * np.float32(1e20)                                   # q·k beyond float32: refused, not NaN
    with pytest.raises(ValueError, match="the attention scores overflow float32"):
        layer(huge[:, :4], is_causal=True, cache=cache)
    assert cache.length == 0                                      # and the failed step left the cache as it was
