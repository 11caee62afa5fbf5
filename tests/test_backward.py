"""attention_grad and multihead_attention_grad: finite differences in float64, and torch autograd."""

import numpy as np
import pytest

from attnlab import AttentionConfig, MultiHeadAttention, attention, attention_grad, multihead_attention_grad
from attnlab.kernels._checks import check_attention_args
from attnlab.kernels.attention import attention_backward, attention_forward
from attnlab.kernels.naive import NaiveSaved, naive_attention, naive_attention_grad
from attnlab.kernels.tiled import TiledSaved
from attnlab.layer.multihead import multihead_attention_backward, multihead_attention_forward
from attnlab.layer.positions import RoPE


@pytest.mark.parametrize("case", ["plain", "causal", "mask", "bias", "cross_causal", "broadcast"])
def test_attention_grad_matches_finite_differences(rng, numeric_grad, case):
    n_q = 3 if case == "cross_causal" else 4
    q = rng.normal(size=(2, n_q, 3))
    k = rng.normal(size=(1, 4, 3)) if case == "broadcast" else rng.normal(size=(2, 4, 3))
    v = rng.normal(size=(4, 2)) if case == "broadcast" else rng.normal(size=(2, 4, 2))
    kw = {}
    if case in ("causal", "cross_causal"):
        kw["is_causal"] = True
    if case == "mask":
        m = rng.random((2, n_q, 4)) < 0.6
        m[0, 1] = False                                   # one fully masked row
        kw["mask"] = m
    if case == "bias":
        kw["bias"] = rng.normal(size=(n_q, 4))
    w = rng.normal(size=(2, n_q, 2))                      # loss = sum(w * out)
    loss = lambda: float((w * attention(q, k, v, scale=0.7, **kw)).sum())   # noqa: E731
    dq, dk, dv = attention_grad(q, k, v, w, scale=0.7, **kw)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    for got, x in ((dq, q), (dk, k), (dv, v)):
        np.testing.assert_allclose(got, numeric_grad(loss, x), rtol=1e-6, atol=1e-8)


def test_attention_grad_bad_dout(rng):
    q, k, v = rng.normal(size=(3, 2)), rng.normal(size=(4, 2)), rng.normal(size=(4, 5))
    with pytest.raises(ValueError, match=r"dout must have the output's shape \(3, 5\), got \(3, 4\)"):
        attention_grad(q, k, v, np.ones((3, 4)))
    with pytest.raises(TypeError, match="dout must be a float array"):
        attention_grad(q, k, v, np.ones((3, 5), int))


def _layer(rng, dtype=np.float64, cfg=AttentionConfig(d_model=6, n_heads=2)):
    layer = MultiHeadAttention.init(cfg, rng=rng, std=0.5, dtype=dtype)
    biases = [rng.normal(size=b.shape).astype(dtype) for b in (layer.b_Q, layer.b_K, layer.b_V, layer.b_O)]
    return MultiHeadAttention(layer.W_Q, layer.W_K, layer.W_V, layer.W_O, *biases, config=layer.config)


@pytest.mark.parametrize("is_causal, cfg", [
    (False, AttentionConfig(d_model=6, n_heads=2)),
    (True, AttentionConfig(d_model=6, n_heads=2)),
    # grouped-query: 1 KV head for 3 query heads, RoPE with θ = 100; dW_K and dW_V sum over the group
    (True, AttentionConfig(d_model=6, n_heads=3, n_kv_heads=1, d_head=2, positions=RoPE(theta=100.0))),
])
def test_multihead_grad_matches_finite_differences(rng, numeric_grad, is_causal, cfg):
    layer = _layer(rng, cfg=cfg)
    x = rng.normal(size=(2, 4, 6))
    w = rng.normal(size=(2, 4, 6))
    loss = lambda: float((w * layer(x, is_causal=is_causal)).sum())   # noqa: E731
    dx, grads = multihead_attention_grad(layer, x, w, is_causal=is_causal)
    np.testing.assert_allclose(dx, numeric_grad(loss, x), rtol=1e-6, atol=1e-8)
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
        np.testing.assert_allclose(getattr(grads, name), numeric_grad(loss, getattr(layer, name)),
                                   rtol=1e-6, atol=1e-8, err_msg=name)


def test_attention_grad_matches_torch_autograd(rng):
    torch = pytest.importorskip("torch")
    q, k, v = rng.normal(size=(2, 3, 6, 4)), rng.normal(size=(2, 3, 6, 4)), rng.normal(size=(2, 3, 6, 5))
    do = rng.normal(size=(2, 3, 6, 5))
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True).backward(torch.tensor(do))
    for got, t in zip(attention_grad(q, k, v, do, is_causal=True), (tq, tk, tv)):
        np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------- forward and backward as a pair



def _attention_cases(rng):
    """(q, k, v, kwargs) for the naive path: plain, causal, a mask with an empty row, a bias, broadcast."""
    q, k, v = rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 5, 3)), rng.normal(size=(2, 5, 2))
    m = rng.random((2, 4, 5)) < 0.6
    m[1, 2] = False                                                  # a query that sees no key
    yield q, k, v, {}
    yield q, k, v, {"is_causal": True}
    yield q, k, v, {"mask": m, "scale": 0.7}
    yield q, k, v, {"bias": rng.normal(size=(4, 5))}
    yield q, k[:1], v[0], {"is_causal": True}                        # k and v broadcast over the batch


def test_attention_forward_and_backward_give_what_attention_and_attention_grad_give(rng):
    for q, k, v, kw in _attention_cases(rng):
        for dtype in (np.float64, np.float32):
            q_, k_, v_ = (a.astype(dtype) for a in (q, k, v))
            do = rng.normal(size=(2, 4, 2)).astype(dtype)
            out, saved = attention_forward(q_, k_, v_, **kw)
            np.testing.assert_array_equal(out, attention(q_, k_, v_, **kw))
            assert out.dtype == dtype
            weights = saved.a.copy()
            got = attention_backward(saved, do)
            for g, r, x in zip(got, attention_grad(q_, k_, v_, do, **kw), (q_, k_, v_)):
                assert g.shape == x.shape and g.dtype == dtype
                np.testing.assert_array_equal(g, r)
            np.testing.assert_array_equal(saved.a, weights)          # the backward leaves the saved forward alone
            for g, r in zip(attention_backward(saved, do), got):     # so it can run twice
                np.testing.assert_array_equal(g, r)


def test_attention_backward_matches_finite_differences(rng, numeric_grad):
    q, k, v = rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 4, 2))
    w = rng.normal(size=(2, 4, 2))
    loss = lambda: float((w * attention_forward(q, k, v, is_causal=True, scale=0.7)[0]).sum())   # noqa: E731
    grads = attention_backward(attention_forward(q, k, v, is_causal=True, scale=0.7)[1], w)
    for got, x in zip(grads, (q, k, v)):
        np.testing.assert_allclose(got, numeric_grad(loss, x), rtol=1e-6, atol=1e-8)


def test_attention_forward_takes_the_tiled_path_above_the_crossover(rng, monkeypatch):
    import importlib

    from attnlab.kernels import tiled

    attention_module = importlib.import_module("attnlab.kernels.attention")  # attnlab.kernels.attention is the function

    monkeypatch.setattr(attention_module, "TILED_MIN_QUERIES", 4)
    monkeypatch.setattr(attention_module, "TILED_MIN_SCORES", 16)
    monkeypatch.setattr(tiled, "BLOCK_Q", 3)
    monkeypatch.setattr(tiled, "BLOCK_K", 4)
    monkeypatch.setattr(tiled, "BACKWARD_BLOCKS", (3, 4))
    calls = []
    monkeypatch.setattr(tiled, "tiled_backward",
                        lambda *a, _f=tiled.tiled_backward, **kw: calls.append(1) or _f(*a, **kw))
    q, k, v, do = (rng.normal(size=(2, 9, 3)) for _ in range(4))
    out, saved = attention_forward(q, k, v, is_causal=True)
    assert isinstance(saved, TiledSaved) and saved.lse.shape == (2, 9)   # no grid of weights was kept
    c = check_attention_args(q, k, v, is_causal=True)
    ref_out, _ = naive_attention(c)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-13)
    got = attention_backward(saved, do)
    assert calls == [1]
    for g, r in zip(got, naive_attention_grad(c, do)):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-13)


def test_a_mask_with_more_batch_axes_than_the_scores(rng):
    # q and k have no batch, v and the mask have 2: the scores are (n_q, n_k), the masked scores (2, n_q, n_k)
    q, k, v = rng.normal(size=(3, 2)), rng.normal(size=(4, 2)), rng.normal(size=(2, 4, 2))
    m = rng.random((2, 3, 4)) < 0.6
    m[:, :, 0] = True
    out = attention(q, k, v, mask=m)                                 # (2, 3, 2)
    for b in range(2):
        for i in range(3):
            s = np.array([q[i] @ k[j] / np.sqrt(2) if m[b, i, j] else -np.inf for j in range(4)])
            a = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            np.testing.assert_allclose(out[b, i], a @ v[b], rtol=1e-12)


@pytest.mark.parametrize("positions", ["learned", "rope", "alibi"])
def test_multihead_forward_and_backward_give_what_the_public_pair_gives(rng, positions):
    from attnlab.layer.positions import POSITION_SCHEMES

    layer = MultiHeadAttention.init(AttentionConfig(d_model=8, n_heads=2, positions=POSITION_SCHEMES[positions]()),
                                    rng=rng, std=0.5, dtype=np.float64)   # d_head 4: rope rotates pairs
    x, dy = rng.normal(size=(2, 4, 8)), rng.normal(size=(2, 4, 8))
    kw = {"is_causal": True}
    y, saved = multihead_attention_forward(layer, x, **kw)
    np.testing.assert_array_equal(y, layer(x, **kw))
    dx, grads = multihead_attention_backward(layer, saved, dy)
    ref_dx, ref = multihead_attention_grad(layer, x, dy, **kw)
    np.testing.assert_array_equal(dx, ref_dx)
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
        np.testing.assert_array_equal(getattr(grads, name), getattr(ref, name), err_msg=name)
    with pytest.raises(ValueError, match=r"dy must have the shape of x \(2, 4, 8\), got \(2, 4, 5\)"):
        multihead_attention_backward(layer, saved, dy[..., :5])
