"""Each piece's backward beside its forward (stack/layers.py, layer/positions.py, layer/multihead.py): finite
differences in float64 on tiny sizes, piece by piece, and torch autograd where torch has the same piece."""

import numpy as np
import pytest

from attnlab.layer.config import AttentionConfig
from attnlab.layer.multihead import (MultiHeadAttention, multihead_attention, multihead_attention_backward_named,
                                     multihead_attention_forward)
from attnlab.layer.positions import RoPE, rope
from attnlab.stack.layers import ACTIVATION_GRADS, ACTIVATIONS, MLP, GatedMLP, LayerNorm, RMSNorm

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8}


def check_piece(piece, x, rng, numeric_grad, tol=1e-7):
    """piece.forward / piece.backward against central differences of L = Σ y · w for a random w."""
    y, saved = piece.forward(x)
    np.testing.assert_allclose(y, piece(x), rtol=1e-12, atol=1e-12)   # the forward is the plain call
    w = rng.normal(size=y.shape)                                       # dL/dy
    dx, grads = piece.backward(saved, w)
    loss = lambda: float((piece(x) * w).sum())                         # noqa: E731
    np.testing.assert_allclose(dx, numeric_grad(loss, x), atol=tol, rtol=tol)
    assert set(grads) == set(piece.params())
    for name, p in piece.params().items():
        assert grads[name].shape == p.shape
        np.testing.assert_allclose(grads[name], numeric_grad(loss, p), atol=tol, rtol=tol, err_msg=name)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_each_activation_backward_matches_finite_differences(name, rng, numeric_grad):
    x = rng.normal(size=(3, 5)) * 2                                    # (3, 5) away from relu's kink
    x[np.abs(x) < 1e-3] = 0.5
    w = rng.normal(size=x.shape)
    numeric = numeric_grad(lambda: float((ACTIVATIONS[name](x) * w).sum()), x)
    np.testing.assert_allclose(ACTIVATION_GRADS[name](x, w), numeric, atol=1e-7)


def test_norm_backwards_match_finite_differences(rng, numeric_grad):
    x = rng.normal(size=(2, 3, 6))                                     # (B, n, d_model)
    ln = LayerNorm(1 + rng.normal(size=6) * 0.3, rng.normal(size=6) * 0.3, 1e-5)
    rms = RMSNorm(1 + rng.normal(size=6) * 0.3, 1e-6)
    for piece in (ln, rms):
        check_piece(piece, x, rng, numeric_grad)


@pytest.mark.parametrize("activation", ["gelu", "gelu_new", "relu", "silu"])
def test_mlp_backwards_match_finite_differences(activation, rng, numeric_grad):
    x = rng.normal(size=(2, 3, 4))                                     # (B, n, d_model)
    draw = lambda *shape: rng.normal(0, 0.5, shape)                    # noqa: E731
    tol = 1e-5 if activation == "gelu" else 1e-7     # gelu's forward erfc is a fit, good to 1.2e-7 relative
    check_piece(MLP(draw(4, 7), draw(7), draw(7, 4), draw(4), activation), x, rng, numeric_grad, tol)
    check_piece(GatedMLP(draw(4, 7), draw(4, 7), draw(7, 4), activation), x, rng, numeric_grad, tol)


def test_rope_backward_is_the_inverse_rotation(rng, numeric_grad):
    """A rotation's transpose is its inverse: dL/dx = rope(dL/dy, inverse=True), with Llama 3's scaling too."""
    x = rng.normal(size=(2, 5, 8))                                     # (h, n, d_head)
    w = rng.normal(size=x.shape)
    for scheme in (RoPE(), RoPE(theta=500.0, scaling=LLAMA3)):
        numeric = numeric_grad(lambda: float((scheme.rotate(x, start=3) * w).sum()), x)
        np.testing.assert_allclose(scheme.rotate(w, start=3, inverse=True), numeric, atol=1e-8)
    np.testing.assert_allclose(rope(rope(x, start=2), start=2, inverse=True), x, atol=1e-12)


@pytest.mark.parametrize("cfg", [
    dict(n_heads=4, n_kv_heads=2, positions=RoPE(theta=500.0, scaling=LLAMA3)),   # GQA 4 on 2, RoPE
    dict(n_heads=2, window=2),                                                   # a sliding window
    dict(n_heads=4, n_kv_heads=1),                                               # multi-query
])
def test_multihead_backward_and_its_named_activations_match_finite_differences(cfg, rng, numeric_grad):
    config = AttentionConfig(d_model=8, d_head=4, n_ctx=8, **cfg)
    p = MultiHeadAttention.init(config, rng=rng, std=0.5, dtype=np.float64)
    x = rng.normal(size=(2, 5, 8))                                     # (B, n, d_model)
    y, saved = multihead_attention_forward(p, x, is_causal=True)
    w = rng.normal(size=y.shape)
    dx, grads, named = multihead_attention_backward_named(p, saved, w)
    loss = lambda: float((multihead_attention(p, x, is_causal=True) * w).sum())   # noqa: E731
    np.testing.assert_allclose(dx, numeric_grad(loss, x), atol=1e-7)
    for name in ("W_Q", "W_K", "b_V", "W_O"):
        np.testing.assert_allclose(getattr(grads, name), numeric_grad(loss, getattr(p, name)), atol=1e-7)
    # d hook_z: the heads' outputs before W_O, replaced by z + δ
    z = saved.merged.reshape(2, 5, config.n_heads, 4).swapaxes(-2, -3).copy()   # (B, h, n, d_head)
    z_loss = lambda: float(((z.swapaxes(-2, -3).reshape(2, 5, -1) @ p.W_O + p.b_O) * w).sum())   # noqa: E731
    np.testing.assert_allclose(named["hook_z"], numeric_grad(z_loss, z), atol=1e-7)
    assert named["hook_q"].shape == (2, config.n_heads, 5, 4) and named["hook_k"].shape == (2, config.n_kv_heads, 5, 4)


def test_pieces_match_torch_autograd(rng):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = rng.normal(size=(2, 3, 6))
    w = rng.normal(size=x.shape)
    g, b = 1 + rng.normal(size=6) * 0.3, rng.normal(size=6) * 0.3
    tx, tg, tb = (torch.tensor(a, requires_grad=True) for a in (x, g, b))
    (F.layer_norm(tx, (6,), tg, tb, 1e-5) * torch.tensor(w)).sum().backward()
    dx, grads = LayerNorm(g, b, 1e-5).backward(LayerNorm(g, b, 1e-5).forward(x)[1], w)
    for ours, theirs in ((dx, tx), (grads["weight"], tg), (grads["bias"], tb)):
        np.testing.assert_allclose(ours, theirs.grad.numpy(), rtol=1e-10, atol=1e-12)
    tx.grad, tg.grad = None, None
    (F.rms_norm(tx, (6,), tg, 1e-6) * torch.tensor(w)).sum().backward()
    dx, grads = RMSNorm(g, 1e-6).backward(RMSNorm(g, 1e-6).forward(x)[1], w)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grads["weight"], tg.grad.numpy(), rtol=1e-10, atol=1e-12)
    torch_act = {"gelu": F.gelu, "gelu_new": lambda t: F.gelu(t, approximate="tanh"), "relu": F.relu, "silu": F.silu}
    for name, fn in torch_act.items():
        tx.grad = None
        (fn(tx) * torch.tensor(w)).sum().backward()
        np.testing.assert_allclose(ACTIVATION_GRADS[name](x, w), tx.grad.numpy(), rtol=2e-6, atol=1e-7, err_msg=name)
