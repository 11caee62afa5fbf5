"""Grouped-query attention (GQA) on the head axis (-3): every path against a float64 reference that repeats K
and V by hand, against torch SDPA with ``enable_gqa=True``, gradients by finite differences and autograd."""

import importlib
import tracemalloc

import numpy as np
import pytest

from attnlab import KVCache, attention, attention_grad, attention_weights, attention_weights_rows, causal_mask
from attnlab.kernels.attention import attention_backward, attention_forward
from attnlab.kernels.tiled import TiledSaved, tiled_attention, tiled_attention_grad

attention_module = importlib.import_module("attnlab.kernels.attention")   # the module, not the function


def repeat_kv(x, groups):
    """(..., h_kv, n, d) -> (..., h_kv·groups, n, d): KV head j copied for query heads j·g … j·g + g − 1."""
    return np.repeat(x, groups, axis=-3)


def grid(q, k, *, mask=None, bias=None, is_causal=False, window=None, q_offset=None, scale=None):
    """Plain numpy, float64, no attnlab path: the scaled, masked scores (..., h, n_q, n_k) and which survive."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    s = q @ np.swapaxes(k, -1, -2) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    s = s + (0 if bias is None else bias)
    keep = np.ones(s.shape, bool) if mask is None else np.broadcast_to(mask, s.shape)
    if is_causal:
        keep = keep & causal_mask(n_q, n_k, window=window, q_offset=q_offset)
    return np.where(keep, s, -np.inf), keep


def reference(q, k, v, **kw):
    """Plain multi-head attention on K and V repeated by hand, in float64: the output and the weights."""
    g = q.shape[-3] // k.shape[-3]
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    k, v = repeat_kv(k, g), repeat_kv(v, g)
    s, keep = grid(q, k, **kw)
    m = np.where(keep.any(-1, keepdims=True), s.max(-1, keepdims=True), 0)
    e = np.where(keep, np.exp(s - m), 0)
    a = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)                  # rows with no key: 0
    return a @ v, a


def reference_grads(q, k, v, do, **kw):
    """(dq, dk, dv) of the repeated-K/V reference in float64 by the chain rule, dk and dv summed over each group
    and over broadcast batch axes."""
    g = q.shape[-3] // k.shape[-3]
    scale = kw.get("scale") or 1 / np.sqrt(q.shape[-1])
    out, a = reference(q, k, v, **kw)
    kr, vr = repeat_kv(k, g), repeat_kv(v, g)
    dv = np.swapaxes(a, -1, -2) @ do                                      # out = a v
    da = do @ np.swapaxes(vr, -1, -2)
    ds = a * (da - (da * a).sum(-1, keepdims=True))                       # a = softmax(s)
    dq = ds @ kr * scale                                                  # s = q kᵀ · scale
    dk = np.swapaxes(ds, -1, -2) @ q * scale
    fold = lambda x, like: x.reshape(*x.shape[:-3], x.shape[-3] // g, g, *x.shape[-2:]).sum(-3).reshape(   # noqa
        (-1, *like.shape)).sum(0)
    return dq.reshape((-1, *q.shape)).sum(0), fold(dk, k), fold(dv, v)


def qkv(rng, *, h=6, h_kv=2, n_q=5, n_k=7, d=4, d_v=3, batch=(2,)):
    return (rng.normal(size=(*batch, h, n_q, d)), rng.normal(size=(*batch, h_kv, n_k, d)),
            rng.normal(size=(*batch, h_kv, n_k, d_v)))


def masks(rng, h, n_q, n_k):
    """Keyword sets every path takes: none, causal, window, q_offset, a dense mask per query head, padding."""
    dense = rng.random((2, h, n_q, n_k)) < 0.6
    dense[1, 3, 0] = False                                          # a query that sees no key
    pad = np.ones((2, 1, 1, n_k), bool)
    pad[0, ..., :2] = False
    return [{}, {"is_causal": True}, {"is_causal": True, "window": 3}, {"is_causal": True, "q_offset": 1},
            {"mask": dense}, {"is_causal": True, "mask": pad}]


# ---------------------------------------------------------------------------- forward, against K and V repeated


@pytest.mark.parametrize("h, h_kv", [(6, 2), (6, 3), (4, 1), (8, 8)])
def test_naive_path_and_weights_match_repeated_kv(rng, h, h_kv):
    q, k, v = qkv(rng, h=h, h_kv=h_kv)
    for kw in masks(rng, h, 5, 7):
        ref_out, ref_a = reference(q, k, v, **kw)
        np.testing.assert_allclose(attention(q, k, v, **kw), ref_out, rtol=1e-12, atol=1e-14, err_msg=str(kw))
        np.testing.assert_allclose(attention_weights(q, k, **kw), ref_a, rtol=1e-12, atol=1e-14, err_msg=str(kw))


def test_bias_per_query_head(rng):
    q, k, v = qkv(rng)
    bias = rng.normal(size=(6, 5, 7))
    ref_out, _ = reference(q, k, v, bias=bias)
    np.testing.assert_allclose(attention(q, k, v, bias=bias), ref_out, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("block_q, block_k", [(2, 3), (3, 2), (64, 64)])
def test_tiled_forward_and_lse_match_repeated_kv(rng, block_q, block_k):
    q, k, v = qkv(rng)
    for kw in masks(rng, 6, 5, 7):
        out, lse = tiled_attention(q, k, v, block_q=block_q, block_k=block_k, return_lse=True, **kw)
        ref_out, ref_a = reference(q, k, v, **kw)
        np.testing.assert_allclose(out, ref_out, rtol=1e-12, atol=1e-13, err_msg=str(kw))
        rows = attention_weights_rows(q, k, lse, [0, 2, 4], **kw)          # (2, 6, 3, 7) from lse alone
        np.testing.assert_allclose(rows, ref_a[..., [0, 2, 4], :], rtol=1e-12, atol=1e-13, err_msg=str(kw))


def test_attention_takes_the_tiled_path_with_groups_above_the_crossover(rng, monkeypatch):
    monkeypatch.setattr(attention_module, "TILED_MIN_QUERIES", 4)
    monkeypatch.setattr(attention_module, "TILED_MIN_SCORES", 16)
    q, k, v = qkv(rng, n_q=9, n_k=11)
    calls = []
    monkeypatch.setattr(attention_module.tiled, "tiled_forward",
                        lambda *a, _f=attention_module.tiled.tiled_forward, **kw: calls.append(1) or _f(*a, **kw))
    for kw in ({}, {"is_causal": True, "window": 4}):
        np.testing.assert_allclose(attention(q, k, v, **kw), reference(q, k, v, **kw)[0], rtol=1e-12, atol=1e-13)
    assert calls == [1, 1]


def test_decode_path_with_groups(rng, monkeypatch):
    calls = []
    decode = attention_module.decode
    monkeypatch.setattr(decode, "decode_attention",
                        lambda c, kernel=None, _f=decode.decode_attention: calls.append(1) or _f(c, kernel))
    q, k, v = qkv(rng, n_q=1, n_k=9)
    for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-6)):
        got = attention(*(x.astype(dtype) for x in (q, k, v)), is_causal=True)
        assert got.dtype == dtype and got.shape == (2, 6, 1, 3)
        np.testing.assert_allclose(got, reference(q, k, v)[0], rtol=tol, atol=tol)
    assert calls == [1, 1]


def test_kv_cache_holds_only_the_kv_heads_and_decodes_as_the_full_pass(rng):
    h, h_kv, n, d = 6, 2, 8, 4
    q, k, v = qkv(rng, h=h, h_kv=h_kv, n_q=n, n_k=n, d=d, d_v=d, batch=())
    cache = KVCache.empty(h_kv, n, d, dtype=np.float64)
    assert cache.k.shape == (h_kv, n, d)                                   # not (h, n, d)
    full = attention(q, k, v, is_causal=True)                              # (h, n, d)
    first = attention(q[:, :3], *cache.append(k[:, :3], v[:, :3]), is_causal=True)
    steps = [attention(q[:, t:t + 1], *cache.append(k[:, t:t + 1], v[:, t:t + 1]), is_causal=True)
             for t in range(3, n)]
    np.testing.assert_allclose(np.concatenate([first, *steps], axis=-2), full, rtol=1e-12, atol=1e-14)


def test_leading_axes_broadcast_beside_the_groups(rng):
    q = rng.normal(size=(3, 6, 5, 4))                   # (B, h, n_q, d)
    k = rng.normal(size=(1, 2, 7, 4))                   # one batch entry shared, 2 KV heads
    v = rng.normal(size=(2, 7, 3))                      # no batch axis
    out = attention(q, k, v, is_causal=True)
    assert out.shape == (3, 6, 5, 3)
    for b in range(3):
        np.testing.assert_allclose(out[b], reference(q[b], k[0], v, is_causal=True)[0], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(tiled_attention(q, k, v, is_causal=True, block_q=2, block_k=3), out,
                               rtol=1e-12, atol=1e-13)


# ---------------------------------------------------------------------------- backward


@pytest.mark.parametrize("path", ["naive", "tiled"])
def test_grads_match_repeated_kv_summed_over_groups(rng, monkeypatch, path):
    if path == "tiled":
        monkeypatch.setattr(attention_module, "TILED_MIN_QUERIES", 2)
        monkeypatch.setattr(attention_module, "TILED_MIN_SCORES", 4)
        monkeypatch.setattr(attention_module.tiled, "BACKWARD_BLOCKS", (2, 3))
        monkeypatch.setattr(attention_module.tiled, "BLOCK_Q", 3)
        monkeypatch.setattr(attention_module.tiled, "BLOCK_K", 2)
    q, k, v = qkv(rng)
    do = rng.normal(size=(2, 6, 5, 3))
    for kw in masks(rng, 6, 5, 7):
        _, saved = attention_forward(q, k, v, **kw)
        assert isinstance(saved, TiledSaved) == (path == "tiled")
        got = attention_backward(saved, do)
        for g, r, x in zip(got, reference_grads(q, k, v, do, **kw), (q, k, v)):
            assert g.shape == x.shape
            np.testing.assert_allclose(g, r, rtol=1e-11, atol=1e-12, err_msg=str(kw))


@pytest.mark.parametrize("block_q, block_k", [(2, 3), (64, 64)])
def test_tiled_attention_grad_with_groups(rng, block_q, block_k):
    q, k, v = qkv(rng, batch=(1,))
    k, v = k[0], v[0]                                   # broadcast over the batch: summed back
    do = rng.normal(size=(1, 6, 5, 3))
    for kw in ({}, {"is_causal": True, "window": 2}, {"is_causal": True, "q_offset": 3}):
        got = tiled_attention_grad(q, k, v, do, block_q=block_q, block_k=block_k, **kw)
        for g, r, x in zip(got, reference_grads(q, k, v, do, **kw), (q, k, v)):
            assert g.shape == x.shape
            np.testing.assert_allclose(g, r, rtol=1e-11, atol=1e-12, err_msg=str(kw))


def test_grads_by_central_differences(rng, numeric_grad):
    q, k, v = qkv(rng, h=4, h_kv=2, n_q=3, n_k=4, d=3, d_v=2, batch=())
    do = rng.normal(size=(4, 3, 2))
    loss = lambda: float((attention(q, k, v, is_causal=True) * do).sum())   # noqa: E731
    got = attention_grad(q, k, v, do, is_causal=True)
    for g, x in zip(got, (q, k, v)):
        np.testing.assert_allclose(g, numeric_grad(loss, x), rtol=1e-6, atol=1e-8)
    tiled = tiled_attention_grad(q, k, v, do, is_causal=True, block_q=2, block_k=3)
    for g, r in zip(tiled, got):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-13)


# ---------------------------------------------------------------------------- against torch SDPA, enable_gqa=True


@pytest.mark.parametrize("n_q, n_k, is_causal", [(1, 33, False), (40, 40, True), (200, 200, True),
                                                 (300, 300, False)])
def test_forward_and_backward_match_torch_sdpa_enable_gqa(rng, n_q, n_k, is_causal):
    torch = pytest.importorskip("torch")
    q, k, v = qkv(rng, h=8, h_kv=2, n_q=n_q, n_k=n_k, d=16, d_v=16, batch=(2,))
    do = rng.normal(size=(2, 8, n_q, 16))
    for dtype, tol in ((np.float64, 1e-10), (np.float32, 2e-5)):
        tq, tk, tv = (torch.tensor(x.astype(dtype), requires_grad=True) for x in (q, k, v))
        # torch's is_causal is top-left; with n_q == n_k (or one query, not causal) both agree
        ref = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=is_causal, enable_gqa=True)
        ref.backward(torch.tensor(do.astype(dtype)))
        args = [x.astype(dtype) for x in (q, k, v)]
        out = attention(*args, is_causal=is_causal)
        assert out.dtype == dtype
        np.testing.assert_allclose(out, ref.detach().numpy(), rtol=tol, atol=tol)
        for g, t in zip(attention_grad(*args, do.astype(dtype), is_causal=is_causal), (tq, tk, tv)):
            assert g.dtype == dtype and g.shape == tuple(t.shape)
            np.testing.assert_allclose(g, t.grad.numpy(), rtol=tol, atol=tol)


# ---------------------------------------------------------------------------- never repeated, bad input


def test_kv_heads_are_never_repeated_in_memory(rng):
    """One KV head is 1 MiB here; K and V repeated for 8 query heads would take 16 MiB more."""
    q = rng.normal(size=(8, 1, 32)).astype(np.float32)
    k, v = (rng.normal(size=(2, 8192, 32)).astype(np.float32) for _ in range(2))
    for run in (lambda: attention(q, k, v),                                       # the decode step
                lambda: tiled_attention(np.repeat(q, 64, axis=1), k, v, is_causal=True)):   # the tiled kernel
        run()
        tracemalloc.start()
        try:
            run()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 6 * 2**20, peak


@pytest.mark.parametrize("h, h_kv", [(6, 4), (8, 3)])
def test_head_counts_that_do_not_divide_are_refused_naming_both(rng, h, h_kv):
    q, k, v = qkv(rng, h=h, h_kv=h_kv)
    do = rng.normal(size=(2, h, 5, 3))
    msg = f"query has {h} heads .* key has {h_kv}.*multiple"
    for call in (lambda: attention(q, k, v), lambda: attention_weights(q, k), lambda: tiled_attention(q, k, v),
                 lambda: attention_grad(q, k, v, do), lambda: tiled_attention_grad(q, k, v, do),
                 lambda: attention(q[..., :1, :], k, v)):
        with pytest.raises(ValueError, match=msg):
            call()


def test_value_heads_must_match_key_heads(rng):
    q, k, _ = qkv(rng)
    with pytest.raises(ValueError, match="value has 3 heads .* key has 2"):
        attention(q, k, rng.normal(size=(2, 3, 7, 3)))


def test_causal_mask_shared_by_every_query_head(rng):
    q, k, v = qkv(rng, n_q=4, n_k=4)
    a = attention_weights(q, k, is_causal=True)
    assert (a[..., ~causal_mask(4)] == 0).all()
