import numpy as np
import pytest

from attnlab import AttentionConfig, KVCache, MultiHeadAttention, attention


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
