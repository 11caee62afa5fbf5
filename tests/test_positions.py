"""Position schemes: the learned table's limit, sinusoids against the formula, RoPE's relative scores,
ALiBi's slopes, and decoding through the KV cache equal to one full pass for every scheme."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import AttentionConfig, MultiHeadAttention
from attnlab.lm.model import lm_config
from attnlab.layer.multihead import multihead_attention_grad
from attnlab.stack.transformer import Transformer, forward, new_caches
from attnlab.layer.positions import (POSITION_SCHEMES, ALiBi, Learned, RoPE, Sinusoidal, rope_frequencies, scheme_from_json,
                               alibi_bias, alibi_slopes, learned_positions, position_ids, rope,
                               sinusoidal_positions)


# --- learned table ------------------------------------------------------------------------

def test_learned_table_has_no_row_past_its_end():
    W_P = np.arange(1024 * 2, dtype=np.float64).reshape(1024, 2)
    np.testing.assert_array_equal(learned_positions(W_P, 3), W_P[:3])
    np.testing.assert_array_equal(learned_positions(W_P, 1, start=1023), W_P[1023:])
    msg = r"^position 1024 has no row: the table holds 1,024 positions \(0 to 1023\)$"
    with pytest.raises(ValueError, match=msg):
        learned_positions(W_P, 1025)
    with pytest.raises(ValueError, match=msg):
        learned_positions(W_P, 2, start=1023)                 # a cache offset runs into the same limit
    with pytest.raises(ValueError, match="position 2000 has no row"):
        position_ids(1, start=2000, n_max=1024)


# --- sinusoidal ---------------------------------------------------------------------------

def test_sinusoidal_against_the_formula():
    n, d = 50, 16
    pe = sinusoidal_positions(n, d)
    for pos in (0, 1, 7, 49):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)                # Vaswani et al. (2017), section 3.5
            assert pe[pos, 2 * i] == pytest.approx(np.sin(angle), abs=1e-12)
            assert pe[pos, 2 * i + 1] == pytest.approx(np.cos(angle), abs=1e-12)
    np.testing.assert_array_equal(sinusoidal_positions(5, d, start=45), pe[45:])   # offset = later rows
    assert sinusoidal_positions(3, 8, dtype=np.float32).dtype == np.float32
    with pytest.raises(ValueError, match="d_model must be even"):
        sinusoidal_positions(3, 7)


# --- RoPE ---------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 500), n=st.integers(0, 500), shift=st.integers(0, 1000), seed=st.integers(0, 2**16))
def test_rope_scores_depend_only_on_the_offset(m, n, shift, seed):
    r = np.random.default_rng(seed)
    q, k = r.normal(size=(1, 8)), r.normal(size=(1, 8))
    score = lambda a, b: float(rope(q, start=a)[0] @ rope(k, start=b)[0])   # noqa: E731
    assert score(m, n) == pytest.approx(score(m + shift, n + shift), rel=1e-9, abs=1e-9)


def test_rope_rotates_pairs_keeps_lengths_and_inverts(rng):
    x = rng.normal(size=(2, 3, 6, 8))
    y = rope(x, start=5)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-12)
    np.testing.assert_allclose(rope(y, start=5, inverse=True), x, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(rope(x[..., :1, :], start=0), x[..., :1, :])     # position 0: no turn
    # pair i of position p turns by p · 10000^(−2i/d): check one entry by hand
    p, i, d = 4, 1, 8
    angle = (5 + p) * 10000 ** (-2 * i / d)
    a, b = x[0, 0, p, 2 * i], x[0, 0, p, 2 * i + 1]
    assert y[0, 0, p, 2 * i] == pytest.approx(a * np.cos(angle) - b * np.sin(angle), rel=1e-12)
    assert y[0, 0, p, 2 * i + 1] == pytest.approx(a * np.sin(angle) + b * np.cos(angle), rel=1e-12)
    # a window starting at `start` is the matching slice of the full sequence
    np.testing.assert_allclose(rope(x, start=0)[..., 5:, :], rope(x[..., 5:, :], start=5), rtol=1e-12)
    with pytest.raises(ValueError, match="even head width"):
        rope(rng.normal(size=(3, 5)))


def test_rope_matches_transformers_rotate_half(rng):
    """transformers' LLaMA RoPE pairs feature i with i + d/2; ours pairs 2i with 2i+1 (RoFormer's order).
    Moving our even features to the front and the odd ones to the back turns one into the other."""
    torch = pytest.importorskip("torch")
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    d, n = 8, 6
    x = rng.normal(size=(1, 2, n, d))                                        # (B, h, n, d_head)
    perm = np.r_[0:d:2, 1:d:2]                                               # interleaved -> halves
    inv_freq = 10000.0 ** (-np.arange(0, d, 2) / d)                          # (d/2,)
    angle = np.arange(n)[:, None] * inv_freq                                 # (n, d/2)
    emb = np.concatenate([angle, angle], -1)                                 # (n, d) LLaMA's layout
    cos, sin = torch.tensor(np.cos(emb))[None], torch.tensor(np.sin(emb))[None]
    t = torch.tensor(x[..., perm])
    q_ref, _ = llama.apply_rotary_pos_emb(t, t, cos, sin)
    np.testing.assert_allclose(rope(x)[..., perm], q_ref.numpy(), rtol=1e-12, atol=1e-12)


# --- ALiBi --------------------------------------------------------------------------------

def test_alibi_slopes_follow_press_et_al():
    np.testing.assert_array_equal(alibi_slopes(8), [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256])
    np.testing.assert_array_equal(alibi_slopes(4), [1 / 4, 1 / 16, 1 / 64, 1 / 256])
    # 6 heads: the 4-head slopes, then every other slope of the 8-head sequence (1/2, 1/8)
    np.testing.assert_array_equal(alibi_slopes(6), [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8])
    with pytest.raises(ValueError, match="n_heads must be a positive integer"):
        alibi_slopes(0)


def test_alibi_bias_is_minus_slope_times_distance_bottom_right():
    b = alibi_bias([0.5, 0.25], 3)
    np.testing.assert_array_equal(b[0], -0.5 * np.array([[0, 1, 2], [1, 0, 1], [2, 1, 0]]))
    np.testing.assert_array_equal(b[1], b[0] / 2)
    np.testing.assert_array_equal(alibi_bias([0.5, 0.25], 1, 3), b[:, -1:])   # one query after 2 cached
    with pytest.raises(ValueError, match="n_k must be at least n_q"):
        alibi_bias([0.5], 3, 2)


# --- the layer: RoPE and ALiBi in the forward, the backward and the cache -------------------

def _layer(rng, positions=None):
    cfg = AttentionConfig(d_model=8, n_heads=2, positions=Learned() if positions is None else positions)
    return MultiHeadAttention.init(cfg, rng=rng, std=0.5, dtype=np.float64)


@pytest.mark.parametrize("scheme", [RoPE(), RoPE(theta=50.0), ALiBi()])
def test_layer_grad_with_positions_matches_finite_differences(rng, numeric_grad, scheme):
    layer, x, w = _layer(rng, scheme), rng.normal(size=(2, 5, 8)), rng.normal(size=(2, 5, 8))
    opts = {"is_causal": True}
    loss = lambda: float((w * layer(x, **opts)).sum())                       # noqa: E731
    dx, grads = multihead_attention_grad(layer, x, w, **opts)
    np.testing.assert_allclose(dx, numeric_grad(loss, x), rtol=1e-6, atol=1e-8)
    for name in ("W_Q", "W_K", "b_Q", "b_K"):                                 # the ones RoPE's backward touches
        np.testing.assert_allclose(getattr(grads, name), numeric_grad(loss, getattr(layer, name)),
                                   rtol=1e-6, atol=1e-8, err_msg=name)


def test_layer_rope_through_the_cache_equals_full_pass(rng):
    layer, x = _layer(rng, RoPE()), rng.normal(size=(7, 8))
    full = layer(x, is_causal=True)
    cache = layer.new_cache(7)
    parts = [layer(x[:3], is_causal=True, cache=cache)]
    parts += [layer(x[t:t + 1], is_causal=True, cache=cache) for t in range(3, 7)]
    np.testing.assert_allclose(np.concatenate(parts), full, rtol=1e-12, atol=1e-12)
    plain = MultiHeadAttention(*(getattr(layer, n) for n in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")),
                               config=AttentionConfig(d_model=8, n_heads=2))
    assert not np.allclose(plain(x, is_causal=True), full)                   # the rotation does something


def test_rope_theta_is_the_base_of_the_frequencies(rng):
    """θ = 100 against the formula by hand: pair i of position p turns by p · 100^(−2i/d_head)."""
    x = rng.normal(size=(3, 4))
    got = RoPE(theta=100.0).rotate(x, start=2)
    for p in range(3):
        for i in range(2):
            t = (p + 2) * 100.0 ** (-2 * i / 4)
            c, s = np.cos(t), np.sin(t)
            np.testing.assert_allclose(got[p, 2 * i:2 * i + 2], [c * x[p, 2 * i] - s * x[p, 2 * i + 1],
                                                                 s * x[p, 2 * i] + c * x[p, 2 * i + 1]], rtol=1e-12)
    assert not np.allclose(got, RoPE().rotate(x, start=2))


def test_rope_llama3_scaling_against_transformers(rng):
    torch = pytest.importorskip("torch")
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    transformers = pytest.importorskip("transformers")
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
    cfg = transformers.LlamaConfig(hidden_size=256, num_attention_heads=2, rope_theta=5000.0, rope_scaling=scaling,
                                   max_position_embeddings=512)
    inv_freq, _ = rope_utils.ROPE_INIT_FUNCTIONS["llama3"](cfg, torch.device("cpu"))
    ours = rope_frequencies(128, 5000.0, RoPE(theta=5000.0, scaling=scaling).scaling)
    np.testing.assert_allclose(ours, inv_freq.double().numpy(), rtol=1e-6)
    assert not np.allclose(ours, rope_frequencies(128, 5000.0))


def test_schemes_round_trip_through_json_and_refuse_strings():
    for scheme in (Learned(), Sinusoidal(), RoPE(theta=5e5), RoPE(scaling={"rope_type": "linear", "factor": 2.0}),
                   ALiBi()):
        assert scheme_from_json(scheme.to_json()) == scheme
        assert POSITION_SCHEMES[scheme.name] is type(scheme)
    with pytest.raises(TypeError, match=r"positions must be a position scheme object \(Learned\(\), Sinusoidal"):
        AttentionConfig(d_model=8, n_heads=2, positions="rope")
    with pytest.raises(ValueError, match="positions must be one of 'learned', 'sinusoidal', 'rope', 'alibi', "
                                         "'rope_llama_cpp', got 'absolute'"):
        scheme_from_json("absolute")
    with pytest.raises(ValueError, match="rope needs an even d_head"):
        AttentionConfig(d_model=6, n_heads=2, positions=RoPE())
    with pytest.raises(ValueError, match="theta must be a positive finite number, got 0"):
        RoPE(theta=0)


@pytest.mark.parametrize("scheme", [Learned(), Sinusoidal(), RoPE(), ALiBi()])
def test_model_decoding_through_the_cache_equals_one_full_pass(rng, scheme):
    config = lm_config(11, d_model=16, n_heads=4, n_layers=2, n_ctx=12, positions=scheme)
    model = Transformer.init(config, rng=rng, std=0.3, dtype=np.float64)
    ids = rng.integers(0, 11, size=(2, 12))
    full = forward(model, ids).logits                                        # (2, 12, 11)
    caches = new_caches(model, 12, batch_shape=(2,))
    steps = [forward(model, ids[:, :5], caches=caches).logits]               # a prompt of 5
    steps += [forward(model, ids[:, t:t + 1], caches=caches).logits for t in range(5, 12)]   # then one at a time
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-10, atol=1e-12)
    # and the order matters: shuffling earlier tokens changes the last prediction
    shuffled = ids.copy()
    shuffled[:, :11] = ids[:, :11][:, ::-1]
    assert not np.allclose(forward(model, shuffled).logits[:, -1], full[:, -1])


def test_cache_past_the_learned_table_names_the_limit(rng):
    model = Transformer.init(lm_config(5, d_model=8, n_heads=2, n_layers=1, n_ctx=4), rng=rng)
    with pytest.raises(ValueError, match=r"capacity must be at most the model's n_ctx=4"):
        new_caches(model, 5)
    with pytest.raises(ValueError, match=r"ids has 5 tokens, but the model has only 4 positions"):
        forward(model, np.zeros(5, np.int64))
