"""attention_grad and multihead_attention_grad: finite differences in float64, and torch autograd."""

import numpy as np
import pytest

from attnlab import AttentionConfig, MultiHeadAttention, attention, attention_grad, multihead_attention_grad


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


def _layer(rng, dtype=np.float64):
    layer = MultiHeadAttention.init(AttentionConfig(d_model=6, n_heads=2), rng=rng, std=0.5, dtype=dtype)
    biases = [rng.normal(size=b.shape).astype(dtype) for b in (layer.b_Q, layer.b_K, layer.b_V, layer.b_O)]
    return MultiHeadAttention(layer.W_Q, layer.W_K, layer.W_V, layer.W_O, *biases, n_heads=2)


@pytest.mark.parametrize("is_causal", [False, True])
def test_multihead_grad_matches_finite_differences(rng, numeric_grad, is_causal):
    layer = _layer(rng)
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
