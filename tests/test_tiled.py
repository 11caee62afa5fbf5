"""The tiled kernel against the naive reference: forward, lse, weights on demand, backward, dispatch, memory."""

import importlib
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import attention, attention_grad, causal_mask
from attnlab.kernels import tiled
from attnlab.kernels import _threads
from attnlab.kernels._checks import check_attention_args
from attnlab.kernels._kernels import NO_NUMBA_ENV
from attnlab.kernels.attention import takes_tiled_path
from attnlab.kernels.naive import naive_attention, naive_attention_grad, visible
from attnlab.kernels.tiled import attention_weights_rows, tiled_attention, tiled_attention_grad

attention_module = importlib.import_module("attnlab.kernels.attention")   # the module, not the function
BLOCKS = [(2, 3), (3, 2), (1, 1), (64, 64)]   # tiny tiles cross every mask edge; (64, 64) is one tile


def naive(q, k, v, **kw):
    """The reference output and weights, whatever the size."""
    return naive_attention(check_attention_args(q, k, v, **kw))


def naive_lse(q, k, *, scale=None, **kw):
    """log Σ_j exp(s_j) over the visible scores of each query, from the whole grid, in float64."""
    c = check_attention_args(q, k, k, scale=scale, **kw)
    s = c.q @ np.swapaxes(c.k, -1, -2) * c.scale                    # (..., n_q, n_k)
    keep = visible(c)                                                # (..., n_q, n_k) or None
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    m = s.max(-1, keepdims=True)                                     # (..., n_q, 1)
    m = np.where(m == -np.inf, 0, m)
    with np.errstate(divide="ignore"):
        return (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[..., 0]   # (..., n_q), -inf if empty


def cases(rng, n_q, n_k):
    """(name, q, k, v, tiled kwargs, naive kwargs): every mask the kernel handles, in float64."""
    q = rng.normal(size=(2, 3, n_q, 4))
    k = rng.normal(size=(2, 3, n_k, 4))
    v = rng.normal(size=(2, 3, n_k, 5))
    dense = rng.random((2, 3, n_q, n_k)) < 0.6
    dense[0, 1, -1] = False                                          # a query that sees no key
    pad = np.ones((2, 1, 1, n_k), bool)
    pad[1, ..., -2:] = False                                         # key padding, broadcast over heads
    yield "plain", q, k, v, {}, {}
    yield "causal", q, k, v, {"is_causal": True}, {"is_causal": True}
    yield "dense mask", q, k, v, {"mask": dense}, {"mask": dense}
    yield "causal + dense", q, k, v, {"is_causal": True, "mask": dense}, {"is_causal": True, "mask": dense}
    yield "causal + padding", q, k, v, {"is_causal": True, "mask": pad}, {"is_causal": True, "mask": pad}
    for w in (1, 3):
        yield f"window {w}", q, k, v, {"is_causal": True, "window": w}, {"mask": causal_mask(n_q, n_k, window=w)}
    yield "broadcast", q[0], k[:1, :1], v[0, 0], {"is_causal": True}, {"is_causal": True}


SHAPES = [(7, 7), (5, 11), (11, 5), (1, 9)]   # square, more keys (bottom-right), more queries (empty rows), decode


@pytest.mark.parametrize("n_q, n_k", SHAPES)
@pytest.mark.parametrize("block_q, block_k", BLOCKS)
def test_forward_and_lse_match_the_naive_grid(tile_kernel, rng, n_q, n_k, block_q, block_k):
    for name, q, k, v, kw, ref_kw in cases(rng, n_q, n_k):
        out, lse = tiled_attention(q, k, v, block_q=block_q, block_k=block_k, return_lse=True, **kw)
        ref, _ = naive(q, k, v, **ref_kw)
        np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-13, err_msg=name)
        np.testing.assert_allclose(lse, naive_lse(q, k, **ref_kw), rtol=1e-12, atol=1e-13, err_msg=name)


def test_a_query_that_sees_no_key_gives_zero_and_lse_minus_inf(tile_kernel, rng):
    q, k, v = rng.normal(size=(4, 3)), rng.normal(size=(2, 3)), rng.normal(size=(2, 2))
    out, lse = tiled_attention(q, k, v, is_causal=True, block_q=1, block_k=1, return_lse=True)
    # bottom-right: 4 queries, 2 keys, so queries 0 and 1 sit before every key
    np.testing.assert_array_equal(out[:2], 0)
    np.testing.assert_array_equal(lse[:2], -np.inf)
    assert np.isfinite(lse[2:]).all() and np.isfinite(out).all()


@pytest.mark.parametrize("workers", [1, 2])
def test_threads_give_the_same_result(tile_kernel, rng, workers):
    q, k, v = (rng.normal(size=(3, 2, 33, 8)) for _ in range(3))
    one = tiled_attention(q, k, v, is_causal=True, block_q=4, block_k=8, workers=1)
    np.testing.assert_array_equal(tiled_attention(q, k, v, is_causal=True, block_q=4, block_k=8,
                                                  workers=workers), one)


def test_float32_and_float16(tile_kernel, rng):
    q, k, v = (rng.normal(size=(2, 40, 8)) for _ in range(3))
    ref, _ = naive(q, k, v, is_causal=True)
    got32 = tiled_attention(*(x.astype(np.float32) for x in (q, k, v)), is_causal=True, block_q=8, block_k=16)
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, ref, rtol=1e-5, atol=1e-6)
    h = [x.astype(np.float16) for x in (q, k, v)]
    got16 = tiled_attention(*h, is_causal=True, block_q=8, block_k=16)
    assert got16.dtype == np.float16
    ref16, _ = naive(*(x.astype(np.float32) for x in h), is_causal=True)    # float16 in, float32 math
    np.testing.assert_allclose(got16, ref16, rtol=1e-3, atol=1e-3)          # within float16 rounding


@settings(max_examples=40, deadline=None)
@given(n_q=st.integers(1, 12), n_k=st.integers(1, 12), block_q=st.integers(1, 6), block_k=st.integers(1, 6),
       is_causal=st.booleans(), seed=st.integers(0, 2**16))
def test_property_tiled_equals_naive(n_q, n_k, block_q, block_k, is_causal, seed):
    r = np.random.default_rng(seed)
    q, k, v = r.normal(size=(n_q, 3)), r.normal(size=(n_k, 3)), r.normal(size=(n_k, 2))
    mask = r.random((n_q, n_k)) < 0.7
    got = tiled_attention(q, k, v, mask=mask, is_causal=is_causal, block_q=block_q, block_k=block_k)
    np.testing.assert_allclose(got, naive(q, k, v, mask=mask, is_causal=is_causal)[0], rtol=1e-12, atol=1e-13)


def test_memory_stays_far_below_the_grid(tile_kernel, rng):
    n = 1024
    q, k, v = (rng.standard_normal((2, n, 16), dtype=np.float32) for _ in range(3))
    tiled_attention(q, k, v, is_causal=True, block_q=64, block_k=128)          # warm up
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = tiled_attention(q, k, v, is_causal=True, block_q=64, block_k=128)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    grid = 2 * n * n * 4                                                        # 8 MiB of float32 scores
    # the output, lse, and per worker one (64, 128) tile and one head's keys transposed: O(n · block)
    assert peak < 5 * out.nbytes < grid / 10
    del out


@pytest.mark.parametrize("n, is_causal", [(1024, True), (1024, False), (2048, True)])
def test_forward_extra_peak_stays_within_one_and_a_half_outputs(tile_kernel, rng, n, is_causal):
    """The issue's memory goal, from n = 1024 up: the forward allocates its output, its lse and the workers'
    scratch, which shrinks its tiles to fit half an output (tiled.forward_blocks); tracemalloc sees numpy's
    allocations, in every thread."""
    q, k, v = (rng.standard_normal((1, 12, n, 64), dtype=np.float32) for _ in range(3))   # (B, h, n, d_head)
    tiled_attention(q, k, v, is_causal=is_causal, workers=2)                 # warm up (numba, the pool)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = tiled_attention(q, k, v, is_causal=is_causal, workers=2)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert out.nbytes < peak <= tiled.EXTRA_PEAK * out.nbytes
    np.testing.assert_allclose(out[0, :2], naive(q[0, :2], k[0, :2], v[0, :2], is_causal=is_causal)[0],
                               rtol=2e-5, atol=2e-6)


def test_forward_blocks_shrink_to_the_memory_budget_and_no_further(rng):
    def blocks(n, heads=12, workers=2):
        q = np.zeros((heads, n, 64), np.float32)                             # (h, n, d_head)
        return tiled.forward_blocks(check_attention_args(q, q, q), workers)

    assert blocks(8192) == (tiled.BLOCK_Q, tiled.BLOCK_K)                   # a big output: the full tile
    assert blocks(1024) == (256, 512)           # 2 × 512 × 512 × 4 bytes exceed half of 3 MiB: queries halved
    assert blocks(1024, workers=1) == (512, 512)                            # one worker's scratch fits
    assert blocks(4096, heads=1, workers=1) == (256, 256)                  # 1 MiB of output: 256 × 256 fits half
    assert blocks(64, heads=1) == (64, 64)                                  # never above the grid
    assert blocks(4096, heads=1, workers=64) == (tiled.MIN_BLOCK, tiled.MIN_BLOCK)   # and never below the floor
    for n, heads, workers in [(1024, 12, 2), (2048, 12, 2), (4096, 1, 1), (8192, 3, 2)]:
        bq, bk = blocks(n, heads, workers)
        scratch = workers * tiled.Scratch.forward_bytes(bq, bk, 64, 64, 4)
        assert scratch + heads * n * (64 + 1) * 4 <= tiled.EXTRA_PEAK * heads * n * 64 * 4


# ---------------------------------------------------------------------------- dispatch


def test_attention_dispatches_to_the_tiled_path_above_the_crossover(rng, monkeypatch):
    n = max(attention_module.TILED_MIN_QUERIES, int(np.ceil(np.sqrt(attention_module.TILED_MIN_SCORES))))
    assert not takes_tiled_path(np.zeros((n - 1, 4)), np.zeros((n - 1, 4)), bias=None)
    assert takes_tiled_path(np.zeros((n, 4)), np.zeros((n, 4)), bias=None)
    assert not takes_tiled_path(np.zeros((n, 4)), np.zeros((n, 4)), bias=np.zeros(1))
    assert not takes_tiled_path(np.zeros((1, 4)), np.zeros((n, 4)), bias=None)
    calls = []
    monkeypatch.setattr(tiled, "tiled_forward",
                        lambda *a, _f=tiled.tiled_forward, **kw: calls.append(1) or _f(*a, **kw))
    for dtype, rtol in ((np.float32, 1e-6), (np.float64, 1e-12)):
        q, k, v = (rng.standard_normal((2, n, 16)).astype(dtype) for _ in range(3))
        for is_causal in (False, True):
            got = attention(q, k, v, is_causal=is_causal)
            assert got.dtype == dtype
            ref, _ = naive(q, k, v, is_causal=is_causal)
            np.testing.assert_allclose(got, ref, rtol=rtol, atol=rtol * np.abs(ref).max())
    assert len(calls) == 4                                                      # every call went tiled


def test_attention_grad_dispatches_to_the_tiled_backward(rng, monkeypatch):
    monkeypatch.setattr(attention_module, "TILED_MIN_QUERIES", 4)
    monkeypatch.setattr(attention_module, "TILED_MIN_SCORES", 16)
    monkeypatch.setattr(tiled, "BLOCK_Q", 3)
    monkeypatch.setattr(tiled, "BLOCK_K", 4)
    monkeypatch.setattr(tiled, "BACKWARD_BLOCKS", (3, 4))
    q, k, v, do = (rng.normal(size=(2, 9, 3)) for _ in range(4))
    calls = []
    monkeypatch.setattr(tiled, "tiled_backward",
                        lambda *a, _f=tiled.tiled_backward, **kw: calls.append(1) or _f(*a, **kw))
    got = attention_grad(q, k, v, do, is_causal=True)
    c = check_attention_args(q, k, v, is_causal=True)
    ref = naive_attention_grad(c, do)
    assert calls == [1]
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-12, atol=1e-13)


# ---------------------------------------------------------------------------- weights on demand


@pytest.mark.parametrize("n_q, n_k", SHAPES)
def test_weights_rows_match_the_naive_weights(tile_kernel, rng, n_q, n_k):
    rows = [0, n_q - 1, -1] if n_q > 1 else [0]
    for name, q, k, v, kw, ref_kw in cases(rng, n_q, n_k):
        _, lse = tiled_attention(q, k, v, block_q=2, block_k=3, return_lse=True, **kw)
        _, a = naive(q, k, v, **ref_kw)
        got = attention_weights_rows(q, k, lse, rows, **kw)
        np.testing.assert_allclose(got, a[..., rows, :], rtol=1e-12, atol=1e-14, err_msg=name)


def test_weights_rows_of_chosen_heads(rng):
    q, k, v = (rng.normal(size=(4, 10, 3)) for _ in range(3))                  # (h, n, d)
    _, lse = tiled_attention(q, k, v, is_causal=True, return_lse=True)
    heads = [1, 3]
    got = attention_weights_rows(q[heads], k[heads], lse[heads], 7, is_causal=True)
    np.testing.assert_allclose(got, naive(q, k, v, is_causal=True)[1][heads][:, [7]], rtol=1e-12)


def test_weights_rows_bad_input(rng):
    q, k = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
    lse = np.zeros(5)
    with pytest.raises(ValueError, match=r"rows must lie in -5 … 4 \(there are 5 queries\), got \[5\]"):
        attention_weights_rows(q, k, lse, [5])
    with pytest.raises(TypeError, match="rows must be an int or a non-empty sequence of ints"):
        attention_weights_rows(q, k, lse, [0.5])
    with pytest.raises(ValueError, match=r"lse must have shape \(5,\) \(one per query\), got \(4,\)"):
        attention_weights_rows(q, k, np.zeros(4), [0])


# ---------------------------------------------------------------------------- backward


def grad_cases(rng):
    n = 5
    q, k, v = rng.normal(size=(2, n, 3)), rng.normal(size=(2, n + 2, 3)), rng.normal(size=(2, n + 2, 2))
    mask = rng.random((2, n, n + 2)) < 0.6
    mask[1, 2] = False                                                         # one query sees nothing
    yield "plain", q, k, v, {}
    yield "causal, more keys", q, k, v, {"is_causal": True}
    yield "causal, more queries", k, q, rng.normal(size=(2, n, 2)), {"is_causal": True}
    yield "mask", q, k, v, {"mask": mask}
    yield "window", q, k, v, {"is_causal": True, "window": 2}
    yield "broadcast", q, k[:1], v[0], {"is_causal": True}


@pytest.mark.parametrize("block_q, block_k", [(2, 3), (1, 2), (8, 8)])
def test_tiled_backward_matches_finite_differences(tile_kernel, rng, numeric_grad, block_q, block_k):
    for name, q, k, v, kw in grad_cases(rng):
        w = rng.normal(size=np.broadcast_shapes(q.shape[:-1] + (1,), v.shape[:-2] + (1, v.shape[-1])))
        f = lambda: float((w * tiled_attention(q, k, v, scale=0.7, block_q=block_q, block_k=block_k,   # noqa: E731
                                               **kw)).sum())
        grads = tiled_attention_grad(q, k, v, w, scale=0.7, block_q=block_q, block_k=block_k, **kw)
        for got, x, label in zip(grads, (q, k, v), "qkv"):
            assert got.shape == x.shape
            np.testing.assert_allclose(got, numeric_grad(f, x), rtol=1e-6, atol=1e-8, err_msg=f"{name} d{label}")


@pytest.mark.parametrize("is_causal", [False, True])
def test_tiled_backward_matches_torch_autograd(tile_kernel, rng, is_causal):
    torch = pytest.importorskip("torch")
    q, k, v, do = (rng.normal(size=(2, 3, 19, 8)) for _ in range(4))
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=is_causal).backward(torch.tensor(do))
    got = tiled_attention_grad(q, k, v, do, is_causal=is_causal, block_q=4, block_k=6, workers=2)
    for g, t in zip(got, (tq, tk, tv)):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_tiled_backward_float32(tile_kernel, rng):
    q, k, v, do = (rng.normal(size=(2, 30, 8)) for _ in range(4))
    ref = tiled_attention_grad(q, k, v, do, is_causal=True, block_q=4, block_k=8)
    got = tiled_attention_grad(*(x.astype(np.float32) for x in (q, k, v, do)), is_causal=True,
                               block_q=4, block_k=8)
    for g, r in zip(got, ref):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("bad, error, message", [
    (0, ValueError, "block_q must be a positive integer, got 0"),
    (-3, ValueError, "block_q must be a positive integer, got -3"),
    (2.5, TypeError, "block_q must be a positive integer, got float 2.5"),
    (True, TypeError, "block_q must be a positive integer, got bool True"),
    ("8", TypeError, "block_q must be a positive integer, got str '8'"),
])
def test_block_sizes_must_be_positive_integers(rng, bad, error, message):
    q = rng.normal(size=(4, 2))
    with pytest.raises(error, match=message):
        tiled_attention(q, q, q, block_q=bad)
    with pytest.raises(error, match=message.replace("block_q", "block_k")):
        tiled_attention_grad(q, q, q, q, block_k=bad)


def test_other_bad_input(rng):
    q = rng.normal(size=(4, 2))
    with pytest.raises(ValueError, match="window=2 needs is_causal=True"):
        tiled_attention(q, q, q, window=2)
    with pytest.raises(ValueError, match="window must be a positive integer, got 0"):
        tiled_attention(q, q, q, is_causal=True, window=0)
    with pytest.raises(ValueError, match="workers must be a positive integer, got 0"):
        tiled_attention(q, q, q, workers=0)
    with pytest.raises(ValueError, match="key has width 3, query has width 2"):
        tiled_attention(q, rng.normal(size=(4, 3)), q)
    with pytest.raises(ValueError, match="query must be finite"):
        tiled_attention(np.full((4, 2), np.nan), q, q)
    with pytest.raises(TypeError, match="mask must be a bool array"):
        tiled_attention(q, q, q, mask=np.ones((4, 4)))
    with pytest.raises(ValueError, match=r"dout must have the output's shape \(4, 2\), got \(4, 3\)"):
        tiled_attention_grad(q, q, q, np.ones((4, 3)))


def test_without_threadpoolctl_the_tiled_path_runs_on_one_thread(rng, monkeypatch):
    import sys
    import threading
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)                   # import now fails
    _threads.blas_limiter.cache_clear()
    try:
        assert _threads.blas_limiter() is None
        seen = set()
        q, k, v = (rng.normal(size=(4, 20, 3)) for _ in range(3))
        _threads.run_items(list(range(6)), lambda item, buf: seen.add(threading.get_ident()), lambda: None, workers=2)
        assert seen == {threading.get_ident()}
        got = tiled_attention(q, k, v, is_causal=True, block_q=3, block_k=4, workers=2)
        np.testing.assert_allclose(got, naive(q, k, v, is_causal=True)[0], rtol=1e-12, atol=1e-13)
    finally:
        _threads.blas_limiter.cache_clear()


@pytest.mark.parametrize("spread", [1.0, 25.0, 300.0])
def test_scores_far_from_zero_and_growing_across_blocks(tile_kernel, rng, spread):
    """Rows whose running max leaves the ±SHIFT_SLACK band move their reference point and rescale."""
    n = 24
    q = rng.normal(size=(2, n, 4))
    k = rng.normal(size=(2, n, 4)) * np.linspace(0.1, 1, n)[:, None] * spread   # later keys score higher
    k[1] -= spread                                                                # and some rows sit far below 0
    v = rng.normal(size=(2, n, 3))
    for kw in ({}, {"is_causal": True}):
        out, lse = tiled_attention(q, k, v, block_q=5, block_k=3, return_lse=True, **kw)
        np.testing.assert_allclose(out, naive(q, k, v, **kw)[0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lse, naive_lse(q, k, **kw), rtol=1e-12)
        out32 = tiled_attention(*(x.astype(np.float32) for x in (q, k, v)), block_q=5, block_k=3, **kw)
        np.testing.assert_allclose(out32, out, rtol=1e-4, atol=1e-5)


def test_bounded_rows_skip_the_running_max_and_agree_with_moving_rows(rng, monkeypatch):
    """‖q‖‖k‖·scale within SHIFT_SLACK: no running max is kept (shift stays 0); just beyond it, the moving
    reference runs. Both match the float64 grid, in float64 and float32."""
    n, d = 40, 8
    q, k, v = rng.normal(size=(2, n, d)), rng.normal(size=(2, n, d)), rng.normal(size=(2, n, 3))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    k /= np.linalg.norm(k, axis=-1, keepdims=True)                               # unit rows: the bound is c²·scale
    maxima = []
    monkeypatch.setenv(NO_NUMBA_ENV, "1")                # the numpy tile step calls move_shift; the fused one
    monkeypatch.setattr(tiled, "move_shift", lambda *a, _f=tiled.move_shift, **kw: maxima.append(1) or _f(*a, **kw))
    for c, bounded in ((np.sqrt(tiled.SHIFT_SLACK) * 0.99, True), (np.sqrt(tiled.SHIFT_SLACK) * 1.01, False)):
        maxima.clear()
        for kw in ({}, {"is_causal": True}):
            out, lse = tiled_attention(q * c, k * c, v, scale=1.0, block_q=7, block_k=9, return_lse=True,
                                       workers=1, **kw)
            np.testing.assert_allclose(out, naive(q * c, k * c, v, scale=1.0, **kw)[0], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(lse, naive_lse(q * c, k * c, scale=1.0, **kw), rtol=1e-12)
            out32 = tiled_attention(*(x.astype(np.float32) for x in (q * c, k * c, v)), scale=1.0, block_q=7,
                                    block_k=9, **kw)
            np.testing.assert_allclose(out32, out, rtol=1e-5, atol=1e-6)
        assert (len(maxima) == 0) == bounded


def test_max_row_norm():
    x = np.array([[3.0, 4.0], [1.0, 0.0], [0.0, -6.0]])
    assert tiled.max_row_norm(x) == 6.0
    assert tiled.max_row_norm(x[:0]) == 0.0


@pytest.mark.parametrize("n_q, n_k", SHAPES + [(16, 16), (9, 20)])
@pytest.mark.parametrize("block_q, block_k", [(5, 3), (7, 6), (16, 32)])
def test_diagonal_strips_match_the_naive_grid(tile_kernel, rng, monkeypatch, n_q, n_k, block_q, block_k):
    """Causal diagonal tiles split into strips of 2 rows: every mask, and scores far beyond the band."""
    monkeypatch.setattr(tiled, "DIAGONAL_ROWS", 2)
    for name, q, k, v, kw, ref_kw in cases(rng, n_q, n_k):
        for spread in (1.0, 200.0):
            out, lse = tiled_attention(q * spread, k, v, block_q=block_q, block_k=block_k, return_lse=True, **kw)
            ref, _ = naive(q * spread, k, v, **ref_kw)
            np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12, err_msg=f"{name} x{spread}")
            np.testing.assert_allclose(lse, naive_lse(q * spread, k, **ref_kw), rtol=1e-12, atol=1e-12,
                                       err_msg=f"{name} x{spread}")


@pytest.mark.parametrize("diagonal_rows", [1, 3, 64])
@pytest.mark.parametrize("n_q, n_k, window", [(20, 20, None), (13, 29, None), (29, 13, None), (20, 20, 6)])
def test_plan_tiles_cover_every_visible_score_exactly_once(monkeypatch, diagonal_rows, n_q, n_k, window):
    monkeypatch.setattr(tiled, "DIAGONAL_ROWS", diagonal_rows)
    plan = tiled.Plan(n_q=n_q, n_k=n_k, block_q=8, block_k=5, is_causal=True, window=window)
    visible = ~plan.hidden(np.arange(n_q), np.arange(n_k))                   # (n_q, n_k)
    count = np.zeros((n_q, n_k), int)
    for i0, i1 in plan.query_blocks():
        for r0, r1, j0, j1 in plan.tiles(i0, i1):
            assert i0 <= r0 < r1 <= i1 and j0 < j1
            count[r0:r1, j0:j1] += 1
    assert (count[visible] == 1).all() and count.max() <= 1
    # the strips skip what the unsplit diagonal tiles would have computed above the diagonal
    unsplit = sum(plan.n_scores(i0, i1) for i0, i1 in plan.query_blocks())
    assert count.sum() < unsplit if diagonal_rows < 8 else count.sum() == unsplit


def test_is_causal_must_be_a_bool_on_the_tiled_path_too():
    from attnlab import attention
    from attnlab.kernels.tiled import tiled_attention
    x = np.zeros((256, 8), np.float32)                 # above the crossover: attention() goes tiled
    for f in (attention, tiled_attention):
        with pytest.raises(TypeError, match="is_causal must be True or False, got str 'yes'"):
            f(x, x, x, is_causal="yes")


# ----------------------------------------------------------------------------------------------------
# q_offset: query 0 sits at key index q_offset; against a dense mask built by hand


def offset_keep(n_q, n_k, q_offset, window=None):
    """keep[i, j] = j <= i + q_offset and j > i + q_offset - window, cell by cell."""
    keep = np.zeros((n_q, n_k), bool)
    for i in range(n_q):
        for j in range(n_k):
            keep[i, j] = j <= i + q_offset and (window is None or j > i + q_offset - window)
    return keep


OFFSET_CASES = [(5, 9, off, w) for off in (-7, -2, 0, 1, 4, 8, 20) for w in (None, 1, 3)] + [(9, 4, 2, None)]


@pytest.mark.parametrize("n_q, n_k, q_offset, window", OFFSET_CASES)
def test_q_offset_matches_a_hand_built_mask(tile_kernel, rng, n_q, n_k, q_offset, window):
    q, k, v = rng.normal(size=(2, n_q, 4)), rng.normal(size=(2, n_k, 4)), rng.normal(size=(2, n_k, 3))
    keep = offset_keep(n_q, n_k, q_offset, window)
    want, a_want = naive(q, k, v, mask=keep)
    kw = {"is_causal": True, "window": window, "q_offset": q_offset}
    np.testing.assert_allclose(attention(q, k, v, **kw), want, rtol=0, atol=1e-12)
    for bq, bk in [(2, 3), (3, 2), (64, 64)]:
        out, lse = tiled_attention(q, k, v, block_q=bq, block_k=bk, return_lse=True, **kw)
        np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)
        np.testing.assert_allclose(lse, naive_lse(q, k, mask=keep), rtol=0, atol=1e-12)
        rows = attention_weights_rows(q, k, lse, list(range(n_q)), **kw)
        np.testing.assert_allclose(rows, a_want, rtol=0, atol=1e-12)
        dout = rng.normal(size=want.shape)
        got = tiled_attention_grad(q, k, v, dout, block_q=bq, block_k=bk, **kw)
        ref = attention_grad(q, k, v, dout, mask=keep)
        for g, r in zip(got, ref):
            np.testing.assert_allclose(g, r, rtol=0, atol=1e-12)
    for g, r in zip(attention_grad(q, k, v, dout, **kw), attention_grad(q, k, v, dout, mask=keep)):
        np.testing.assert_allclose(g, r, rtol=0, atol=1e-12)


def test_q_offset_default_is_bottom_right(rng):
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(7, 4)), rng.normal(size=(7, 2))
    np.testing.assert_array_equal(attention(q, k, v, is_causal=True, q_offset=4), attention(q, k, v, is_causal=True))
    np.testing.assert_array_equal(tiled_attention(q, k, v, is_causal=True, q_offset=4),
                                  tiled_attention(q, k, v, is_causal=True))


def test_q_offset_and_window_are_checked():
    q = np.zeros((2, 4))
    with pytest.raises(TypeError, match="q_offset must be an integer"):
        attention(q, q, q, is_causal=True, q_offset=1.5)
    with pytest.raises(TypeError, match="q_offset must be an integer"):
        tiled_attention(q, q, q, is_causal=True, q_offset=True)
    with pytest.raises(ValueError, match="window=2 needs is_causal=True"):
        attention(q, q, q, window=2)
    with pytest.raises(ValueError, match="window must be a positive integer"):
        attention(q, q, q, is_causal=True, window=0)


def test_attention_window_and_offset_on_the_tiled_path(tile_kernel, rng):
    n = attention_module.TILED_MIN_QUERIES + 72
    q, k, v = rng.normal(size=(n, 8)), rng.normal(size=(n + 30, 8)), rng.normal(size=(n + 30, 8))
    assert takes_tiled_path(q, k, bias=None)
    want, _ = naive(q, k, v, mask=offset_keep(n, n + 30, 11, 50))
    np.testing.assert_allclose(attention(q, k, v, is_causal=True, window=50, q_offset=11), want, rtol=0, atol=1e-12)
