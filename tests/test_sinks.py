"""Learned attention sinks (attnlab.kernels.sinks): every path against a float64 reference with the sink
written out as an extra column, a hand-computed case, finite differences for dq, dk, dv and dsink, torch's
formula, the layer's hook and its KV cache."""

import numpy as np
import pytest

from attnlab import kernels  # noqa: F401
from attnlab.kernels import _kernels
from attnlab.kernels.attention import attention, attention_forward, attention_grad, attention_path, attention_weights


def reference(q, k, v, sink, *, is_causal=False, window=None, scale=None, softcap=None):
    """float64, the sink as one more key column with score sink_h and value 0 (GQA by repeating k, v)."""
    q, k, v, sink = (np.asarray(x, np.float64) for x in (q, k, v, sink))
    g = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, g, axis=-3), np.repeat(v, g, axis=-3)
    n_q, n_k = q.shape[-2], k.shape[-2]
    s = q @ np.swapaxes(k, -1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    if is_causal:
        i, j = np.arange(n_q)[:, None] + n_k - n_q, np.arange(n_k)[None]
        ok = (j <= i) & (True if window is None else j > i - window)
        s = np.where(ok, s, -np.inf)
    col = np.broadcast_to(sink[..., None, None], (*s.shape[:-1], 1))
    full = np.concatenate([s, col], axis=-1)
    a = np.exp(full - full.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    return a[..., :-1] @ v, a[..., :-1], a[..., -1]


def inputs(rng, b=2, h=4, h_kv=2, n_q=5, n_k=5, d=8, dtype=np.float64):
    q = rng.normal(size=(b, h, n_q, d)).astype(dtype)
    k = rng.normal(size=(b, h_kv, n_k, d)).astype(dtype)
    v = rng.normal(size=(b, h_kv, n_k, d)).astype(dtype)
    return q, k, v, rng.normal(size=h).astype(dtype) * 2


def test_hand_computed_case():
    # one query, scores (0, log 2) with scale 1, sink log 3: denominator 1 + 2 + 3 = 6
    q, k = np.array([[1.0]]), np.array([[0.0], [np.log(2)]])
    v = np.array([[6.0, 0.0], [0.0, 6.0]])
    out = attention(q, k, v, scale=1.0, sink=np.array(np.log(3)))
    np.testing.assert_allclose(out, [[1.0, 2.0]])                        # (1/6)·6, (2/6)·6
    np.testing.assert_allclose(attention_weights(q, k, scale=1.0, sink=np.array(np.log(3))), [[1 / 6, 2 / 6]])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("implementation", ["naive", "tiled"])
@pytest.mark.parametrize("kernel", ["numpy", "fused"])
def test_every_path_matches_the_written_out_reference(causal, implementation, kernel):
    if kernel == "fused" and (implementation == "naive" or _kernels.load_fused() is None):
        pytest.skip("the fused kernel with a sink is the tiled path's, and needs numba")
    rng = np.random.default_rng(0)
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 2e-6)):
        q, k, v, sink = inputs(rng, n_q=37, n_k=37, dtype=dtype)
        out = attention(q, k, v, sink=sink, is_causal=causal, window=9 if causal else None,
                        implementation=implementation, kernel=kernel)
        want = reference(q, k, v, sink, is_causal=causal, window=9 if causal else None)[0]
        np.testing.assert_allclose(out, want, rtol=tol, atol=tol)
        assert out.dtype == dtype


def test_the_tiled_path_at_its_own_sizes_and_the_decode_path():
    rng = np.random.default_rng(1)
    q, k, v, sink = inputs(rng, b=1, n_q=200, n_k=200, dtype=np.float32)
    assert attention_path(q, k, v, sink=sink).name == "tiled"
    np.testing.assert_allclose(attention(q, k, v, sink=sink, is_causal=True),
                               reference(q, k, v, sink, is_causal=True)[0], atol=2e-6)
    q1 = q[..., -1:, :]
    assert attention_path(q1, k, v, sink=sink, is_causal=True).name == "decode"
    np.testing.assert_allclose(attention(q1, k, v, sink=sink, is_causal=True), reference(q1, k, v, sink)[0], atol=2e-6)
    # softcap and the sink together
    np.testing.assert_allclose(attention(q1, k, v, sink=sink, softcap=1.5), reference(q1, k, v, sink, softcap=1.5)[0],
                               atol=2e-6)


def test_a_huge_sink_takes_every_weight_and_a_row_with_no_key_stays_zero():
    rng = np.random.default_rng(2)
    q, k, v, _ = inputs(rng, n_q=3, n_k=3)
    out = attention(q, k, v, sink=np.full(4, 60.0))
    assert np.abs(out).max() < 1e-20
    mask = np.zeros((3, 3), bool)
    for impl in ("naive", "tiled"):
        assert not attention(q, k, v, mask=mask if impl == "naive" else None, sink=np.zeros(4),
                             is_causal=impl == "tiled", q_offset=-5 if impl == "tiled" else None,
                             implementation=impl).any()


@pytest.mark.parametrize("implementation", ["naive", "tiled"])
def test_gradients_by_finite_differences(implementation, monkeypatch, numeric_grad):
    import attnlab.kernels.attention as front
    rng = np.random.default_rng(3)
    q, k, v, sink = inputs(rng, b=1, n_q=4, n_k=6)
    do = rng.normal(size=(1, 4, 4, 8))
    if implementation == "tiled":
        monkeypatch.setattr(front, "TILED_MIN_QUERIES", 1)
        monkeypatch.setattr(front, "TILED_MIN_SCORES", 1)
    _, saved = attention_forward(q, k, v, sink=sink, is_causal=True)
    assert type(saved).__name__ == ("TiledSaved" if implementation == "tiled" else "NaiveSaved")
    dq, dk, dv, dsink = attention_grad(q, k, v, do, sink=sink, is_causal=True)
    loss = lambda: float((reference(q, k, v, sink, is_causal=True)[0] * do).sum())   # noqa: E731
    for got, x in ((dq, q), (dk, k), (dv, v), (dsink, sink)):
        np.testing.assert_allclose(got, numeric_grad(loss, x), rtol=1e-6, atol=1e-8)


def test_sink_gradient_is_minus_p_sink_times_dout_dot_out():
    rng = np.random.default_rng(4)
    q, k, v, sink = inputs(rng, b=1, h=2, h_kv=2, n_q=3, n_k=3)
    do = rng.normal(size=(1, 2, 3, 8))
    out, _, p = reference(q, k, v, sink)
    *_, dsink = attention_grad(q, k, v, do, sink=sink)
    np.testing.assert_allclose(dsink, -(p * (do * out).sum(-1)).sum((0, 2)), rtol=1e-12)


def test_bad_sinks_are_refused_with_their_name():
    q = np.zeros((4, 2, 8))
    with pytest.raises(ValueError, match="sink"):
        attention(q, q, q, sink=np.zeros(3))
    with pytest.raises(ValueError, match="sink must be finite"):
        attention(q, q, q, sink=np.array([0, 0, np.nan, 0]))
    with pytest.raises(TypeError, match="sink"):
        attention(q, q, q, sink=np.zeros(4, int))
    with pytest.raises(ValueError, match="no sink"):
        attention(q, q, q, sink=np.zeros(4), implementation="naive", kernel="fused")


def test_torch_formula_as_gpt_oss_writes_it():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    q, k, v, sink = inputs(rng, b=1, h=4, h_kv=4, n_q=6, n_k=6, dtype=np.float32)
    # transformers' eager_attention_forward of gpt-oss: the sink as a concatenated column, max-shifted
    tq, tk, tv, ts = (torch.from_numpy(x) for x in (q, k, v, sink))
    w = tq @ tk.transpose(2, 3) * 8 ** -0.5
    w = torch.cat([w, ts.reshape(1, -1, 1, 1).expand(1, -1, 6, 1)], dim=-1)
    w = w - w.max(dim=-1, keepdim=True).values
    want = (torch.softmax(w, dim=-1)[..., :-1] @ tv).numpy()
    np.testing.assert_allclose(attention(q, k, v, sink=sink), want, atol=2e-6)


# ----------------------------------------------------------------------------------------------------
# the layer and the stack: sinks as a parameter of the attention, its hook, its KV cache, its gradient

from attnlab.layer.config import AttentionConfig  # noqa: E402
from attnlab.layer.positions import RoPE  # noqa: E402
from attnlab.stack.hooks import hook_names, run_with_cache  # noqa: E402
from attnlab.stack.layers import RMSNorm  # noqa: E402
from attnlab.stack.transformer import ModelConfig, Transformer, forward, generate, new_caches  # noqa: E402


def sink_model(dtype=np.float32, window=None):
    a = AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2, n_ctx=256, positions=RoPE(), sinks=True, window=window)
    c = ModelConfig(vocab_size=50, n_layers=2, attention=a, d_mlp=24, mlp="gated", activation="silu", norm=RMSNorm)
    rng = np.random.default_rng(7)
    model = Transformer.init(c, rng=rng, std=0.4, dtype=dtype)
    for b in model.blocks:
        b.attn.sinks[...] = rng.normal(0, 1.5, b.attn.sinks.shape)
    return model


def test_hook_sink_is_what_the_pattern_rows_leave_and_the_output_does_not_change():
    model = sink_model()
    ids = np.random.default_rng(0).integers(0, 50, 9)
    assert "blocks.0.attn.hook_sink" in hook_names(model)
    plain = forward(model, ids).logits
    out, cache = run_with_cache(model, ids)
    p, pattern = cache["blocks.1.attn.hook_sink"], cache["blocks.1.attn.hook_pattern"]
    assert p.shape == (4, 9) and (p > 0).all()
    np.testing.assert_allclose(pattern.sum(-1) + p, 1, rtol=1e-6)
    np.testing.assert_allclose(out.logits, plain, rtol=1e-5, atol=1e-6)


def test_kv_cache_decode_equals_the_full_forward_with_sinks():
    model = sink_model(window=5)
    ids = np.random.default_rng(1).integers(0, 50, 12)
    full = forward(model, ids).logits
    caches = new_caches(model, 16)
    steps = [forward(model, ids[:4], caches=caches).logits]
    steps += [forward(model, ids[i:i + 1], caches=caches).logits for i in range(4, 12)]
    np.testing.assert_allclose(np.concatenate(steps), full, rtol=1e-5, atol=1e-5)
    assert len(generate(model, ids, 5)) == 5


def test_every_parameter_gradient_with_sinks_matches_finite_differences(param_grads):
    from attnlab.lm.model import loss, loss_and_grad
    model = sink_model(np.float64)
    rng = np.random.default_rng(2)
    ids, targets = rng.integers(0, 50, (2, 6)), rng.integers(0, 50, (2, 6))
    value, grads = loss_and_grad(model, ids, targets)
    assert "blocks.0.attn.sinks" in grads and np.abs(grads["blocks.0.attn.sinks"]).max() > 0
    f = lambda: loss(model, ids, targets)                               # noqa: E731
    param_grads(grads, model.params(), f, lambda p: [np.unravel_index(i, p.shape) for i in range(min(p.size, 3))])
