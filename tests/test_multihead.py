import numpy as np
import pytest

from attnlab import GPT2_SMALL, AttentionConfig, MultiHeadAttention, attention, attention_weights, merge_heads, split_heads


def test_gpt2_small_config_and_parameter_counts(rng):
    assert (GPT2_SMALL.d_model, GPT2_SMALL.n_heads, GPT2_SMALL.d_head, GPT2_SMALL.n_ctx) == (768, 12, 64, 1024)
    assert GPT2_SMALL.n_params == 2_359_296
    assert GPT2_SMALL.n_params_with_bias == 2_362_368
    layer = MultiHeadAttention.init(GPT2_SMALL, rng=rng)
    assert layer.n_params == 2_362_368


def test_guide_multihead_shapes():
    # the guide's block: n = 5, d_model 768, h 12, seed 0
    rng = np.random.default_rng(0)
    n, d_model, h = 5, 768, 12
    x = rng.normal(size=(n, d_model))
    WQ, WK, WV, WO = (rng.normal(0, 0.02, (d_model, d_model)) for _ in range(4))
    zeros = np.zeros(d_model)
    layer = MultiHeadAttention(WQ, WK, WV, WO, zeros, zeros, zeros, zeros, config=GPT2_SMALL)
    y, a = layer.with_weights(x, is_causal=True)
    assert y.shape == (5, 768) and a.shape == (12, 5, 5)
    # the guide's own computation
    q, k, v = split_heads(x @ WQ, h), split_heads(x @ WK, h), split_heads(x @ WV, h)
    assert q.shape == (12, 5, 64)
    M = np.triu(np.full((n, n), -np.inf), k=1)
    s = q @ k.transpose(0, 2, 1) / 8 + M
    A = np.exp(s - s.max(-1, keepdims=True))
    A /= A.sum(-1, keepdims=True)
    joined = (A @ v).transpose(1, 0, 2).reshape(n, d_model)
    np.testing.assert_allclose(a, A, rtol=1e-12)
    np.testing.assert_allclose(y, joined @ WO, rtol=1e-10, atol=1e-14)


def test_split_merge_roundtrip(rng):
    x = rng.normal(size=(2, 5, 12))
    h = split_heads(x, 3)
    assert h.shape == (2, 3, 5, 4)
    np.testing.assert_array_equal(h[:, 1], x[..., 4:8])
    np.testing.assert_array_equal(merge_heads(h), x)


def test_each_head_is_plain_attention(rng):
    cfg = AttentionConfig(d_model=16, n_heads=4)
    layer = MultiHeadAttention.init(cfg, rng=rng, dtype=np.float64)
    x = rng.normal(size=(6, 16))
    _, a = layer.with_weights(x)
    for i in range(4):
        cols = slice(4 * i, 4 * i + 4)
        a_i = attention_weights(x @ layer.W_Q[:, cols], x @ layer.W_K[:, cols])
        np.testing.assert_allclose(a[i], a_i, rtol=1e-12)


def test_from_gpt2_splits_fused_layout(rng):
    d = 8
    c_attn_w, c_attn_b = rng.normal(size=(d, 3 * d)), rng.normal(size=3 * d)
    c_proj_w, c_proj_b = rng.normal(size=(d, d)), rng.normal(size=d)
    layer = MultiHeadAttention.from_gpt2(c_attn_w, c_attn_b, c_proj_w, c_proj_b,
                                         config=AttentionConfig(d_model=8, n_heads=2, d_head=4))
    np.testing.assert_array_equal(layer.W_K, c_attn_w[:, d:2 * d])
    np.testing.assert_array_equal(layer.b_V, c_attn_b[2 * d:])
    x = rng.normal(size=(3, d))
    qkv = x @ c_attn_w + c_attn_b
    q, k, v = (split_heads(t, 2) for t in np.split(qkv, 3, axis=-1))
    ref = merge_heads(attention(q, k, v, is_causal=True)) @ c_proj_w + c_proj_b
    np.testing.assert_allclose(layer(x, is_causal=True), ref, rtol=1e-12)


def test_config_validation():
    with pytest.raises(ValueError, match=r"d_model \(10\) must be divisible by n_heads \(3\)"):
        AttentionConfig(d_model=10, n_heads=3)
    with pytest.raises(ValueError, match="n_heads must be a positive integer, got 0"):
        AttentionConfig(d_model=10, n_heads=0)
    assert AttentionConfig(d_model=10, n_heads=3, d_head=4).d_head == 4
    with pytest.raises(AttributeError):
        GPT2_SMALL.d_model = 5


def test_split_and_merge_heads_say_which_shape_they_need():
    with pytest.raises(ValueError, match=r"width n_heads=2 divides, got shape \(3, 5\)"):
        split_heads(np.ones((3, 5)), 2)
    with pytest.raises(ValueError, match=r"got shape \(4,\)"):
        split_heads(np.ones(4), 2)
    with pytest.raises(ValueError, match="n_heads must be a positive integer, got 0"):
        split_heads(np.ones((3, 4)), 0)
    with pytest.raises(ValueError, match=r"at least 3 axes, got shape \(3, 4\)"):
        merge_heads(np.ones((3, 4)))


def test_layer_validation(rng):
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        MultiHeadAttention.init(GPT2_SMALL, rng=0)
    with pytest.raises(TypeError, match="config must be an AttentionConfig, got dict"):
        MultiHeadAttention.init({"d_model": 8, "n_heads": 2}, rng=rng)
    layer = MultiHeadAttention.init(AttentionConfig(d_model=8, n_heads=2), rng=rng)
    with pytest.raises(ValueError, match="x has width 6, the layer's d_model is 8"):
        layer(rng.normal(size=(3, 6)))
    with pytest.raises(ValueError, match=r"W_O has shape \(4, 8\), the config \(d_model 8, n_heads 2, n_kv_heads 2, "
                                         r"d_head 4\) asks for \(8, 8\)"):
        MultiHeadAttention(layer.W_Q, layer.W_K, layer.W_V, layer.W_O[:4], layer.b_Q, layer.b_K, layer.b_V,
                           layer.b_O, config=layer.config)
    with pytest.raises(TypeError, match="config must be an AttentionConfig, got int"):
        MultiHeadAttention(layer.W_Q, layer.W_K, layer.W_V, layer.W_O, layer.b_Q, layer.b_K, layer.b_V,
                           layer.b_O, config=2)
    with pytest.raises(ValueError, match=r"c_attn_weight \(4, 7\) and c_attn_bias \(7,\) must be \(4, 12\)"):
        MultiHeadAttention.from_gpt2(np.ones((4, 7)), np.ones(7), np.ones((4, 4)), np.ones(4),
                                     config=AttentionConfig(d_model=4, n_heads=2))


def test_config_states_d_head_apart_from_d_model(rng):
    """d_head is the config's, never d_model / n_heads read off a weight: 3 heads of 5 on a width of 8."""
    cfg = AttentionConfig(d_model=8, n_heads=3, d_head=5)
    layer = MultiHeadAttention.init(cfg, rng=rng, dtype=np.float64, std=0.5)
    assert layer.W_Q.shape == (8, 15) and layer.W_O.shape == (15, 8)
    x = rng.normal(size=(4, 8))
    y, a = layer.with_weights(x, is_causal=True)
    q, k, v = (split_heads(x @ w + b, 3) for w, b in ((layer.W_Q, layer.b_Q), (layer.W_K, layer.b_K),
                                                       (layer.W_V, layer.b_V)))
    ref = merge_heads(attention(q, k, v, is_causal=True)) @ layer.W_O + layer.b_O
    np.testing.assert_allclose(y, ref, rtol=1e-12)
    assert a.shape == (3, 4, 4)


def test_gqa_layer_shares_kv_heads_and_caches_only_them(rng):
    """n_kv_heads < n_heads: W_K, W_V have n_kv_heads·d_head columns; query head i reads KV head i // 3; the
    cache holds the 2 KV heads only. Checked against K, V repeated by hand in float64."""
    cfg = AttentionConfig(d_model=12, n_heads=6, n_kv_heads=2, d_head=4)
    assert cfg.n_params == 2 * 12 * 4 * (6 + 2)
    layer = MultiHeadAttention.init(cfg, rng=rng, dtype=np.float64, std=0.5)
    assert layer.W_K.shape == layer.W_V.shape == (12, 8) and layer.b_K.shape == (8,)
    x = rng.normal(size=(5, 12))
    q = split_heads(x @ layer.W_Q + layer.b_Q, 6)                            # (6, 5, 4)
    k, v = (np.repeat(split_heads(x @ w + b, 2), 3, axis=0) for w, b in ((layer.W_K, layer.b_K),
                                                                          (layer.W_V, layer.b_V)))   # (6, 5, 4)
    s = q @ k.transpose(0, 2, 1) / 2 + np.triu(np.full((5, 5), -np.inf), 1)
    A = np.exp(s - s.max(-1, keepdims=True))
    A /= A.sum(-1, keepdims=True)
    ref = merge_heads(A @ v) @ layer.W_O + layer.b_O
    y, a = layer.with_weights(x, is_causal=True)
    np.testing.assert_allclose(a, A, rtol=1e-12)
    np.testing.assert_allclose(y, ref, rtol=1e-12)
    cache = layer.new_cache(5)
    assert cache.k.shape == (2, 5, 4)
    steps = [layer(x[:2], is_causal=True, cache=cache)] + [layer(x[t:t + 1], is_causal=True, cache=cache)
                                                           for t in range(2, 5)]
    np.testing.assert_allclose(np.concatenate(steps), ref, rtol=1e-12)
    with pytest.raises(ValueError, match=r"n_heads \(6\) must be a multiple of n_kv_heads \(4\)"):
        AttentionConfig(d_model=12, n_heads=6, n_kv_heads=4, d_head=4)
    with pytest.raises(ValueError, match=r"W_K has shape \(12, 24\), the config .*n_kv_heads 2, d_head 4\) asks for "
                                         r"\(12, 8\)"):
        MultiHeadAttention(layer.W_Q, layer.W_Q, layer.W_V, layer.W_O, layer.b_Q, layer.b_K, layer.b_V, layer.b_O,
                           config=cfg)


def test_one_return_type_per_function(rng):
    """The layer returns y and nothing else; the weights come from a second function, never from a flag.
    Both give the same y: the plain call may take the tiled kernel (n = 160 here is above the crossover),
    the weighted one holds the grid; float64 keeps them equal to rounding. With a KV cache the weights of a
    step are its rows of the full grid."""
    from attnlab.layer.multihead import multihead_attention, multihead_attention_with_weights

    layer = MultiHeadAttention.init(AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2), rng=rng,
                                    dtype=np.float64, std=0.5)
    x = rng.normal(size=(160, 16))
    y = multihead_attention(layer, x, is_causal=True)
    assert isinstance(y, np.ndarray) and y.shape == (160, 16)
    y_w, a = multihead_attention_with_weights(layer, x, is_causal=True)
    np.testing.assert_allclose(y_w, y, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(a.sum(-1), 1.0, rtol=1e-12)
    assert a.shape == (4, 160, 160) and not np.triu(a, 1).any()
    with pytest.raises(TypeError, match="return_weights"):
        layer(x, return_weights=True)
    cache = layer.new_cache(160)
    layer(x[:150], is_causal=True, cache=cache)
    y_step, a_step = layer.with_weights(x[150:], is_causal=True, cache=cache)
    np.testing.assert_allclose(a_step, a[:, 150:], rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(y_step, y_w[150:], rtol=1e-10, atol=1e-12)
