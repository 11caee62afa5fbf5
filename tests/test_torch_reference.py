"""attnlab against PyTorch, where torch is installed (CI installs torch==2.13.0)."""

import numpy as np
import pytest

from attnlab import AttentionConfig, MultiHeadAttention, attention

torch = pytest.importorskip("torch")
F = torch.nn.functional

TOL = {np.float32: dict(rtol=2e-5, atol=2e-6), np.float64: dict(rtol=1e-12, atol=1e-13)}


def _sdpa(q, k, v, **kw):
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))   # noqa: E731
    return F.scaled_dot_product_attention(t(q), t(k), t(v), **kw).numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ["plain", "causal", "bool_mask", "float_bias", "scale", "cross"])
def test_matches_sdpa(rng, dtype, case):
    n_q = 5 if case == "cross" else 7
    q = rng.normal(size=(2, 3, n_q, 8)).astype(dtype)
    k = rng.normal(size=(2, 3, 7, 8)).astype(dtype)
    v = rng.normal(size=(2, 3, 7, 4)).astype(dtype)
    ours, theirs = {}, {}
    if case == "causal":
        ours = theirs = {"is_causal": True}
    elif case == "bool_mask":
        m = rng.random((2, 1, n_q, 7)) < 0.7
        m[..., 0] = True                       # torch < 2.5 semantics differ on empty rows; tested apart
        ours, theirs = {"mask": m}, {"attn_mask": torch.from_numpy(m)}
    elif case == "float_bias":
        b = rng.normal(size=(n_q, 7)).astype(dtype)
        ours, theirs = {"bias": b}, {"attn_mask": torch.from_numpy(b)}
    elif case == "scale":
        ours = theirs = {"scale": 0.37}
    got = attention(q, k, v, **ours)
    ref = _sdpa(q, k, v, **theirs)
    np.testing.assert_allclose(got, ref, **TOL[dtype])


def test_fully_masked_row_matches_torch(rng):
    q, k, v = (rng.normal(size=(1, 4, 3)).astype(np.float32) for _ in range(3))
    m = np.ones((4, 4), bool)
    m[2] = False
    ref = _sdpa(q, k, v, attn_mask=torch.from_numpy(m))
    got = attention(q, k, v, mask=m)
    assert not np.isnan(ref).any(), "torch 2.13 returns 0 for fully masked rows"
    np.testing.assert_allclose(got, ref, **TOL[np.float32])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("causal", [False, True])
def test_multihead_matches_torch_multiheadattention(rng, dtype, causal):
    cfg = AttentionConfig(d_model=16, n_heads=4)
    layer = MultiHeadAttention.init(cfg, rng=rng, std=0.3, dtype=dtype)
    layer = MultiHeadAttention(layer.W_Q, layer.W_K, layer.W_V, layer.W_O,
                               *(rng.normal(size=b.shape).astype(dtype) for b in
                                 (layer.b_Q, layer.b_K, layer.b_V, layer.b_O)), config=cfg)
    x = rng.normal(size=(2, 6, 16)).astype(dtype)
    tdt = torch.float32 if dtype == np.float32 else torch.float64
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True, dtype=tdt)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.from_numpy(np.concatenate([layer.W_Q, layer.W_K, layer.W_V], 1).T))
        mha.in_proj_bias.copy_(torch.from_numpy(np.concatenate([layer.b_Q, layer.b_K, layer.b_V])))
        mha.out_proj.weight.copy_(torch.from_numpy(layer.W_O.T))
        mha.out_proj.bias.copy_(torch.from_numpy(layer.b_O))
    tx = torch.from_numpy(x)
    attn_mask = torch.triu(torch.ones(6, 6, dtype=torch.bool), 1) if causal else None   # torch: True = blocked
    with torch.no_grad():
        ref, ref_w = mha(tx, tx, tx, attn_mask=attn_mask, need_weights=True, average_attn_weights=False)
    got, w = layer.with_weights(x, is_causal=causal)
    np.testing.assert_allclose(got, ref.numpy(), **TOL[dtype])
    np.testing.assert_allclose(w, ref_w.numpy(), **TOL[dtype])
