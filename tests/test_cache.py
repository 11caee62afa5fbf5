import numpy as np
import pytest

from attnlab import AttentionConfig, KVCache, MultiHeadAttention, attention, attention_weights


def test_step_by_step_decode_equals_full_pass(rng):
    layer = MultiHeadAttention.init(AttentionConfig(d_model=32, n_heads=4), rng=rng, std=0.2)
    x = rng.normal(size=(2, 9, 32)).astype(np.float32)
    full = layer(x, is_causal=True)
    cache = layer.new_cache(16, batch_shape=(2,))
    first = layer(x[:, :4], is_causal=True, cache=cache)        # prompt of 4 tokens at once
    steps = [layer(x[:, t:t + 1], is_causal=True, cache=cache) for t in range(4, 9)]   # then one at a time
    got = np.concatenate([first, *steps], axis=1)
    assert cache.length == 9
    np.testing.assert_allclose(got, full, rtol=1e-6, atol=1e-6)


def test_append_returns_views_of_everything_so_far(rng):
    cache = KVCache.empty(2, 5, 3, dtype=np.float64)
    k1, v1 = rng.normal(size=(2, 2, 3)), rng.normal(size=(2, 2, 3))
    k2, v2 = rng.normal(size=(2, 1, 3)), rng.normal(size=(2, 1, 3))
    cache.append(k1, v1)
    keys, values = cache.append(k2, v2)
    np.testing.assert_array_equal(keys, np.concatenate([k1, k2], 1))
    np.testing.assert_array_equal(values, np.concatenate([v1, v2], 1))
    assert np.shares_memory(keys, cache.k)
    q = rng.normal(size=(2, 1, 3))
    np.testing.assert_allclose(attention(q, keys, values, is_causal=True),
                               attention(q, np.concatenate([k1, k2], 1), np.concatenate([v1, v2], 1)))


def test_append_past_capacity_leaves_cache_unchanged(rng):
    cache = KVCache.empty(1, 3, 2)
    cache.append(np.ones((1, 2, 2), np.float32), np.ones((1, 2, 2), np.float32))
    before_k, before_v = cache.k.copy(), cache.v.copy()
    with pytest.raises(ValueError, match="cannot append 2 tokens: the cache holds 2 of its capacity 3"):
        cache.append(np.full((1, 2, 2), 7, np.float32), np.full((1, 2, 2), 7, np.float32))
    assert cache.length == 2
    np.testing.assert_array_equal(cache.k, before_k)
    np.testing.assert_array_equal(cache.v, before_v)


def test_cache_dtype_and_width_mismatch(rng):
    cache = KVCache.empty(2, 4, 3)
    with pytest.raises(TypeError, match="key has dtype float64, the cache holds float32"):
        cache.append(np.ones((2, 1, 3)), np.ones((2, 1, 3)))
    with pytest.raises(ValueError, match=r"key has shape \(2, 1, 5\), the cache expects .*width 3"):
        cache.append(np.ones((2, 1, 5), np.float32), np.ones((2, 1, 5), np.float32))
    with pytest.raises(ValueError, match="key has 1 tokens, value has 2"):
        cache.append(np.ones((2, 1, 3), np.float32), np.ones((2, 2, 3), np.float32))
    assert cache.length == 0
    with pytest.raises(ValueError, match="capacity must be a positive integer"):
        KVCache.empty(2, 0, 3)


def test_failed_layer_step_leaves_cache_unchanged(rng):
    layer = MultiHeadAttention.init(AttentionConfig(d_model=8, n_heads=2), rng=rng)
    cache = layer.new_cache(4)
    layer(rng.normal(size=(2, 8)).astype(np.float32), is_causal=True, cache=cache)
    with pytest.raises(ValueError, match="mask has shape"):
        layer(rng.normal(size=(1, 8)).astype(np.float32), mask=np.ones((5, 5), bool), cache=cache)
    assert cache.length == 2
    with pytest.raises(TypeError, match="cache holds float32"):
        layer(rng.normal(size=(1, 8)), cache=cache)          # float64 x gives float64 keys
    assert cache.length == 2


def test_step_by_step_decode_equals_full_pass_on_the_tiled_path(rng, monkeypatch):
    """The same check with the prompt and the full pass going through the tiled kernel (small tiles)."""
    import importlib

    from attnlab.kernels import tiled
    attention_module = importlib.import_module("attnlab.kernels.attention")
    monkeypatch.setattr(attention_module, "TILED_MIN_QUERIES", 4)
    monkeypatch.setattr(attention_module, "TILED_MIN_SCORES", 16)
    monkeypatch.setattr(tiled, "BLOCK_Q", 3)
    monkeypatch.setattr(tiled, "BLOCK_K", 5)
    calls = []
    monkeypatch.setattr(tiled, "tiled_forward",
                        lambda *a, _f=tiled.tiled_forward, **kw: calls.append(1) or _f(*a, **kw))
    layer = MultiHeadAttention.init(AttentionConfig(d_model=32, n_heads=4), rng=rng, std=0.2)
    x = rng.normal(size=(2, 20, 32)).astype(np.float32)
    full = layer(x, is_causal=True)
    cache = layer.new_cache(24, batch_shape=(2,))
    first = layer(x[:, :12], is_causal=True, cache=cache)                  # tiled: 12 queries against 12 keys
    steps = [layer(x[:, t:t + 1], is_causal=True, cache=cache) for t in range(12, 20)]   # naive: one query
    assert len(calls) == 2
    np.testing.assert_allclose(np.concatenate([first, *steps], axis=1), full, rtol=1e-6, atol=1e-6)


def test_cache_refuses_non_finite_values_and_stays_unchanged():
    cache = KVCache.empty(1, 4, 2)
    bad = np.array([[[np.nan, 0.0]]], np.float32)                           # (h, t, d_head)
    with pytest.raises(ValueError, match="key must be finite to enter the cache"):
        cache.append(bad, np.zeros((1, 1, 2), np.float32))
    with pytest.raises(ValueError, match="value must be finite to enter the cache"):
        cache.append(np.zeros((1, 1, 2), np.float32), bad)
    assert cache.length == 0


def test_layer_decode_still_refuses_non_finite_input(rng):
    layer = MultiHeadAttention.init(AttentionConfig(d_model=8, n_heads=2), rng=rng)
    cache = layer.new_cache(4)
    x = np.full((1, 8), np.inf, np.float32)
    with pytest.raises(ValueError, match="must be finite"), np.errstate(invalid="ignore"):
        layer(x, is_causal=True, cache=cache)
    assert cache.length == 0


# ---------------------------------------------------------------------------- the decode kernel


@pytest.mark.parametrize("n_k", [1, 2, 37])
@pytest.mark.parametrize("is_causal", [False, True])
def test_decode_kernel_matches_the_naive_reference(rng, n_k, is_causal):
    """One query per head against every key (a decode step): float64 to 1e-12, float32 to 1e-6."""
    from attnlab.kernels._checks import check_attention_args
    from attnlab.kernels.decode import decode_attention
    from attnlab.kernels.naive import naive_attention
    q = rng.normal(size=(2, 3, 1, 8)) * 3                        # (B, h, 1, d) large scores: the max matters
    k = rng.normal(size=(2, 3, n_k, 8))
    v = rng.normal(size=(1, 3, n_k, 5))                          # broadcast over the batch
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-6)):
        args = [x.astype(dtype) for x in (q, k, v)]
        c = check_attention_args(*args, is_causal=is_causal)
        ref, _ = naive_attention(check_attention_args(*(x.astype(np.float64) for x in args), is_causal=is_causal))
        got = attention(*args, is_causal=is_causal)
        assert got.dtype == dtype and got.shape == (2, 3, 1, 5)
        np.testing.assert_allclose(decode_attention(c), ref, rtol=tol, atol=tol)
        np.testing.assert_allclose(got, ref, rtol=tol, atol=tol)
    h = [x.astype(np.float16) for x in (q, k, v)]                # float16 in, float32 math, float16 out
    ref16, _ = naive_attention(check_attention_args(*(x.astype(np.float64) for x in h), is_causal=is_causal))
    got16 = attention(*h, is_causal=is_causal)
    assert got16.dtype == np.float16
    np.testing.assert_allclose(got16, ref16, rtol=2e-3, atol=2e-3)              # within float16 rounding


def test_decode_path_is_taken_only_when_it_computes_what_was_asked(rng, monkeypatch):
    from attnlab.kernels import decode
    from attnlab.kernels._checks import check_attention_args
    from attnlab.kernels.naive import naive_attention
    calls = []
    monkeypatch.setattr(decode, "decode_attention",
                        lambda c, kernel=None, _f=decode.decode_attention: calls.append(1) or _f(c, kernel))
    q, k, v = rng.normal(size=(2, 1, 4)), rng.normal(size=(2, 6, 4)), rng.normal(size=(2, 6, 3))
    attention(q, k, v, is_causal=True)
    assert len(calls) == 1
    pad = np.ones((2, 1, 6), bool)
    pad[0, 0, :2] = False
    out_pad = attention(q, k, v, mask=pad)                                       # a mask: naive
    a = attention_weights(q, k)                                                  # the weights: naive
    attention(q, k, v, bias=np.zeros((2, 1, 6)))                                 # a bias: naive
    attention(rng.normal(size=(2, 2, 4)), k, v)                                  # two queries: naive
    assert len(calls) == 1
    assert a.shape == (2, 1, 6)
    ref, _ = naive_attention(check_attention_args(q[0], k[0, 2:], v[0, 2:]))
    np.testing.assert_allclose(out_pad[0], ref, rtol=1e-12)
    np.testing.assert_array_equal(attention(q, k[:, :0], v[:, :0]), 0)           # no key: naive gives 0
    assert len(calls) == 1


def test_decode_kernel_keeps_extreme_scores_finite(rng):
    """Scores far beyond exp's range: the row max is subtracted, so the result matches the float64 grid."""
    q, k, v = rng.normal(size=(3, 1, 4)) * 400, rng.normal(size=(3, 9, 4)), rng.normal(size=(3, 9, 2))
    got = attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32))
    ref = attention(np.repeat(q, 2, axis=1), k, v)[:, :1]                        # two queries: the naive path
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
