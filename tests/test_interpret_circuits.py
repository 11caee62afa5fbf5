"""QK and OV circuits and composition scores against dense float64 numpy, and hand cases."""

import numpy as np
import pytest

from attnlab.interpret.circuits import (FactoredMatrix, composition_scores, ov_circuit, qk_circuit, read_circuit)
from attnlab.layer.config import AttentionConfig
from attnlab.layer.positions import Learned
from attnlab.stack.layers import RMSNorm
from attnlab.stack.transformer import ModelConfig, Transformer


@pytest.fixture
def model(rng):
    att = AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2, n_ctx=8, positions=Learned())
    cfg = ModelConfig(vocab_size=20, n_layers=3, attention=att, d_mlp=8, norm=RMSNorm, tied_embeddings=True)
    m = Transformer.init(cfg, rng=rng, std=0.3, dtype=np.float64)
    for name, a in m.params().items():
        if name.endswith("weight"):
            a[:] = 1 + rng.normal(0, 0.3, a.shape)
    return m


def dense(model, layer, head, fold=True):
    """W_QK and W_OV (d_model, d_model) of one head, built whole."""
    b, c = model.blocks[layer], model.config.attention
    dh, g = c.d_head, head // (c.n_heads // c.n_kv_heads)
    w = b.ln_1.weight[:, None] if fold else 1.0
    Q, K = (w * b.attn.W_Q)[:, head * dh:(head + 1) * dh], (w * b.attn.W_K)[:, g * dh:(g + 1) * dh]
    V, O = (w * b.attn.W_V)[:, g * dh:(g + 1) * dh], b.attn.W_O[head * dh:(head + 1) * dh]
    return Q @ K.T, V @ O


def test_factored_matrix_against_dense(rng):
    A, B = rng.normal(size=(9, 3)), rng.normal(size=(3, 7))
    f = FactoredMatrix(A, B)
    np.testing.assert_allclose(f.singular_values, np.linalg.svd(A @ B, compute_uv=False)[:3], rtol=1e-12)
    U, S, Vh = f.svd()
    np.testing.assert_allclose(U * S @ Vh, A @ B, atol=1e-12)
    np.testing.assert_allclose(U.T @ U, np.eye(3), atol=1e-12)
    assert f.norm() == pytest.approx(np.linalg.norm(A @ B), rel=1e-12) and f.shape == (9, 7)
    C = rng.normal(size=(7, 5))
    np.testing.assert_allclose((f @ C).AB, A @ B @ C, atol=1e-12)
    np.testing.assert_allclose((f @ FactoredMatrix(C, C.T)).AB, A @ B @ C @ C.T, atol=1e-10)
    np.testing.assert_allclose(f.T.AB, (A @ B).T, atol=1e-12)
    with pytest.raises(ValueError, match=r"A and B must be \(d_in, r\) and \(r, d_out\)"):
        FactoredMatrix(A, C)


def test_circuits_are_the_dense_products(model):
    for layer, head in ((0, 0), (1, 3), (2, 1)):
        qk, ov = dense(model, layer, head)
        np.testing.assert_allclose(qk_circuit(model, layer, head).AB, qk, atol=1e-12)
        np.testing.assert_allclose(ov_circuit(model, layer, head).AB, ov, atol=1e-12)
        np.testing.assert_allclose(ov_circuit(model, layer, head).singular_values,
                                   np.linalg.svd(ov, compute_uv=False)[:4], rtol=1e-10)
    qk, _ = dense(model, 1, 2, fold=False)
    np.testing.assert_allclose(qk_circuit(model, 1, 2, fold_ln=False).AB, qk, atol=1e-12)
    with pytest.raises(ValueError, match=r"head must be an int in \[0, 4\)"):
        qk_circuit(model, 0, 4)


def test_composition_scores_against_dense(model):
    s = composition_scores(model)
    score = lambda A, B: np.linalg.norm(A @ B) / (np.linalg.norm(A) * np.linalg.norm(B))   # noqa: E731
    for l1, h1, l2, h2 in ((0, 1, 1, 2), (0, 3, 2, 0), (1, 0, 2, 3)):
        qk1, ov1 = dense(model, l1, h1)
        qk2, ov2 = dense(model, l2, h2)
        assert s.q[l1, h1, l2, h2] == pytest.approx(score(ov1, qk2), rel=1e-10)
        assert s.k[l1, h1, l2, h2] == pytest.approx(score(ov1, qk2.T), rel=1e-10)
        assert s.v[l1, h1, l2, h2] == pytest.approx(score(ov1, ov2), rel=1e-10)
    assert s.q.shape == (3, 4, 3, 4) and np.all(s.q[1, :, 0, :] == 0) and np.all(s.v[2, :, 2, :] == 0)


def test_composition_hand_cases(rng):
    """Head 0 of layer 0 writes only to dims 8…; layer 1's head 0 reads its value from those dims (V-composition
    1 for rank-1 maps along the same direction), its head 1 from dims < 8 (composition 0)."""
    att = AttentionConfig(d_model=16, n_heads=2, n_ctx=8, positions=Learned())
    m = Transformer.init(ModelConfig(vocab_size=5, n_layers=2, attention=att), rng=rng, dtype=np.float64)
    for b in m.blocks:
        for W in (b.attn.W_Q, b.attn.W_K, b.attn.W_V, b.attn.W_O):
            W[:] = 0
    e = np.eye(16)
    a0, a1 = m.blocks[0].attn, m.blocks[1].attn
    a0.W_V[3, 0], a0.W_O[0, 9] = 1.0, 2.0          # OV of L0H0 = 2 e3 e9ᵀ: reads dim 3, writes dim 9
    a1.W_V[9, 0], a1.W_O[0, 1] = 1.0, 1.0          # L1H0: reads dim 9: V-composition 1
    a1.W_V[2, 8], a1.W_O[8, 4] = 1.0, 1.0          # L1H1: reads dim 2: 0
    a1.W_Q[9, 8], a1.W_K[5, 8] = 1.0, 1.0          # L1H1's query reads dim 9: Q-composition 1, K-composition 0
    a0.W_Q[0, 0], a0.W_K[0, 0] = 1.0, 1.0
    a1.W_Q[0, 0], a1.W_K[1, 0] = 1.0, 1.0
    s = composition_scores(m)
    assert s.v[0, 0, 1, 0] == pytest.approx(1.0) and s.v[0, 0, 1, 1] == pytest.approx(0.0)
    assert s.q[0, 0, 1, 1] == pytest.approx(1.0) and s.k[0, 0, 1, 1] == pytest.approx(0.0)
    assert s.q[0, 0, 1, 0] == pytest.approx(0.0)
    np.testing.assert_allclose(ov_circuit(m, 0, 0).AB, 2 * np.outer(e[3], e[9]))
    assert ov_circuit(m, 0, 0).singular_values[0] == pytest.approx(2.0)


def test_read_circuit_finds_a_copying_head(rng):
    """An OV circuit that maps each token's embedding onto itself (W_V W_O = W_Eᵀ W_E-like) promotes the token
    it reads: the top input token of each direction is among its top output tokens."""
    att = AttentionConfig(d_model=8, n_heads=1, n_ctx=8, positions=Learned())
    m = Transformer.init(ModelConfig(vocab_size=8, n_layers=1, attention=att, tied_embeddings=True, has_logits=True),
                         rng=rng, dtype=np.float64)
    m.W_E[:] = np.eye(8) * np.arange(1, 9)[:, None]           # token t along axis t, length t + 1
    m.blocks[0].attn.W_V[:] = np.eye(8)
    m.blocks[0].attn.W_O[:] = np.eye(8)
    r = read_circuit(m, ov_circuit(m, 0, 0), 0, kind="ov", k=3, top=1)
    assert r.singular_values.tolist() == [1.0, 1.0, 1.0]
    np.testing.assert_array_equal(r.in_tokens, r.out_tokens)
    with pytest.raises(ValueError, match="kind must be 'qk' or 'ov'"):
        read_circuit(m, ov_circuit(m, 0, 0), 0, kind="x")
