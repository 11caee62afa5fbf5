"""The decode step's weights (issue 21): q/k/v and gate/in stored side by side as one matrix, each weight a view
of its columns; streamed weights in the layout this machine's matrix-vector product reads fastest; the logits of
the last positions only; the trimmed norm, SiLU and cache checks against float64 by hand."""

import warnings

import numpy as np
import pytest

from attnlab.kernels import matmul
from attnlab.layer.cache import KVCache
from attnlab.layer.config import AttentionConfig
from attnlab.layer.multihead import MultiHeadAttention, multihead_attention
from attnlab.layer.positions import RoPE
from attnlab.stack.layers import GatedMLP, RMSNorm, rms_norm, silu
from attnlab.stack.transformer import ModelConfig, Transformer, forward, generate, new_caches


def small_llama(rng, **kw):
    att = AttentionConfig(d_model=24, n_heads=4, n_kv_heads=2, d_head=6, n_ctx=32, positions=RoPE(500.0))
    cfg = ModelConfig(vocab_size=40, n_layers=2, attention=att, d_mlp=20, activation="silu", mlp="gated",
                      norm=RMSNorm, tied_embeddings=True, **kw)
    return Transformer.init(cfg, rng=rng, std=0.3)


def test_fused_projections_are_views_and_multiply_as_each_weight(rng):
    m = small_llama(rng)
    a, mlp = m.blocks[0].attn, m.blocks[0].mlp
    for part in (a.W_Q, a.W_K, a.W_V, a.b_Q):
        assert np.shares_memory(part, a.W_QKV if part.ndim == 2 else a.b_QKV)
    assert np.shares_memory(mlp.W_gate, mlp.W_gate_in) and np.shares_memory(mlp.W_in, mlp.W_gate_in)
    x = rng.standard_normal((5, 24)).astype(np.float32)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(x @ a.W_QKV, np.concatenate([x64 @ a.W_Q, x64 @ a.W_K, x64 @ a.W_V], -1),
                               rtol=1e-5, atol=1e-6)
    # the MLP by hand in float64: silu(x W_gate) ⊙ x W_in, then W_out
    g, up = x64 @ mlp.W_gate, x64 @ mlp.W_in
    np.testing.assert_allclose(mlp(x), (g / (1 + np.exp(-g)) * up) @ mlp.W_out, rtol=1e-5, atol=1e-6)


def test_an_in_place_update_of_a_weight_is_what_the_fused_product_reads(rng):
    """An optimizer updates ``params()`` in place: the fused matrix must see it (the views are its columns)."""
    m = small_llama(rng)
    ids = np.array([1, 5, 7, 2])
    before = forward(m, ids).logits
    p = m.params()
    p["blocks.1.attn.W_K"] *= 0.5
    p["blocks.0.mlp.W_in"] += 0.1
    after = forward(m, ids).logits
    rebuilt = Transformer.from_params(m.config, {k: v.copy() for k, v in p.items()})   # fused afresh
    np.testing.assert_array_equal(after, forward(rebuilt, ids).logits)
    assert not np.allclose(before, after)


def test_mixed_dtypes_are_not_fused_and_still_multiply(rng):
    c = AttentionConfig(d_model=8, n_heads=2, d_head=4, n_ctx=8)
    w = lambda *s, dt=np.float32: (rng.standard_normal(s) * 0.3).astype(dt)   # noqa: E731
    a = MultiHeadAttention(w(8, 8), w(8, 8, dt=np.float64), w(8, 8), w(8, 8), w(8), w(8), w(8), w(8), config=c)
    assert a.W_QKV is None
    x = rng.standard_normal((3, 8))
    q = x @ a.W_Q + a.b_Q
    assert multihead_attention(a, x).shape == (3, 8) and q.shape == (3, 8)
    mlp = GatedMLP(w(8, 6), w(8, 6, dt=np.float64), w(6, 8), "silu")
    assert mlp.W_gate_in is None
    np.testing.assert_allclose(mlp(x), (silu(x @ mlp.W_gate) * (x @ mlp.W_in)) @ mlp.W_out)


def test_a_streamed_weight_takes_the_rules_layout_and_keeps_its_numbers(rng):
    order = matmul.gemv_order()
    assert order == matmul.gemv_order_rule(False) == "C"                     # no tune profile in the tests
    w = rng.standard_normal((512, 1024)).astype(np.float32)                  # 2 MiB: streamed
    got = matmul.streamed(w)
    assert got.flags["C_CONTIGUOUS" if order == "C" else "F_CONTIGUOUS"]
    np.testing.assert_array_equal(got, w)
    small = rng.standard_normal((16, 16)).astype(np.float32).T                # small: kept as it comes
    assert matmul.streamed(small) is small
    fused, parts = matmul.fuse_columns(w, w[:, :8].copy())
    assert fused.shape == (512, 1032) and fused.flags["C_CONTIGUOUS" if order == "C" else "F_CONTIGUOUS"]
    np.testing.assert_array_equal(parts[0], w)


def test_a_tied_embedding_laid_out_for_the_logits_keeps_its_rows(rng):
    m = small_llama(rng)
    E = m.W_E.copy(order="C")
    ids = np.array([3, 9, 1])
    out = forward(m, ids)
    np.testing.assert_array_equal(out.hidden_states[0], E[ids])                 # the row lookup
    x = out.hidden_states[-1].astype(np.float64)
    np.testing.assert_allclose(out.logits, x @ E.T.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_logits_to_keep_gives_the_last_rows_of_the_full_logits(rng):
    m = small_llama(rng)
    ids = rng.integers(0, 40, (2, 7))
    full = forward(m, ids).logits                                                # (2, 7, vocab)
    # fewer rows through BLAS may round in another order: float32's last bits
    np.testing.assert_allclose(forward(m, ids, logits_to_keep=1).logits, full[:, -1:], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(forward(m, ids, logits_to_keep=3).logits, full[:, -3:], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(forward(m, ids, logits_to_keep=0).logits, full)
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ValueError, match="logits_to_keep must be an int >= 0"):
            forward(m, ids, logits_to_keep=bad)


def test_generate_through_the_caches_matches_rereading_everything(rng):
    """generate keeps only the last logits of its prompt; greedy tokens are those of full re-reads."""
    m = small_llama(rng)
    prompt = np.array([4, 8, 15, 16])
    got = generate(m, prompt, 6)
    ids = list(prompt)
    for _ in range(6):
        ids.append(int(np.argmax(forward(m, np.array(ids)).logits[-1])))
    assert list(got) == ids[len(prompt):]


def test_silu_at_the_extremes_without_a_warning():
    for dt in (np.float16, np.float32, np.float64):
        x = np.array([-1e4, -1000.0, -100.0, -20.0, -1.0, 0.0, 1.0, 20.0, 100.0, 1000.0], dt)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            y = silu(x)
        x64 = x.astype(np.float64)
        ref = x64 / (1 + np.exp(np.minimum(-x64, 700.0)))
        assert y.dtype == dt
        np.testing.assert_allclose(y.astype(np.float64), ref, rtol=2e-3 if dt == np.float16 else 1e-6,
                                   atol=6e-8 if dt == np.float16 else 1e-30)   # float16's smallest step near 0


def test_rms_norm_by_hand_in_each_dtype():
    x = np.array([[3.0, 4.0], [1.0, -1.0]])
    w = np.array([2.0, 0.5])
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w             # (3, 4): rms √12.5
    for dt, tol in ((np.float16, 2e-3), (np.float32, 1e-6), (np.float64, 1e-12)):
        y = rms_norm(x.astype(dt), w.astype(dt), 1e-6)
        assert y.dtype == dt
        np.testing.assert_allclose(y, want, rtol=tol)


def test_the_cache_still_refuses_what_is_not_finite_and_keeps_the_largest_magnitude():
    cache = KVCache.empty(1, 4, 2)
    cache.append(np.array([[[1.0, -3.0]]], np.float32), np.array([[[0.5, 2.0]]], np.float32))
    assert (cache.k_max, cache.v_max) == (3.0, 2.0)
    for bad in (np.nan, np.inf, -np.inf):
        with pytest.raises(ValueError, match="key must be finite"):
            cache.append(np.array([[[bad, 0.0]]], np.float32), np.zeros((1, 1, 2), np.float32))
        assert cache.length == 1


def test_a_decode_step_against_the_caches_equals_the_full_pass(rng):
    m = small_llama(rng)
    ids = rng.integers(0, 40, 9)
    caches = new_caches(m, 9)
    forward(m, ids[:6], caches=caches)
    steps = [forward(m, ids[t:t + 1], caches=caches).logits[-1] for t in range(6, 9)]
    np.testing.assert_allclose(np.stack(steps), forward(m, ids).logits[6:], rtol=1e-4, atol=1e-5)
