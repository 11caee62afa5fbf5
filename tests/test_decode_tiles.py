"""The tiled grouped-query decode kernel and the float16 KV cache (issue 33, part 2).

The kernel (attnlab.kernels._fused.decode_tiles) reads each key/value head once for its group, DECODE_TILE keys
at a time, with an online softmax across the tiles; a float16 cache is widened as it is loaded. Held here to
a float64 reference, to the numpy decode path, across tile boundaries and for every head of a group.

Tolerances:
- float32 (and a float16 cache against float64 on the same rounded values): 2e-6 absolute, as
  test_decode_keys_first holds the numpy path (N(0, 1) inputs: outputs below 1, ~10 float32 roundings);
- a float16 cache, which computes as llama.cpp does (q and the normalised weights rounded to float16 too),
  against a float64 reference of that arithmetic: 1e-5 (a weight rounded the other way moves the output by
  2^-11 of its share; measured 1.2e-6);
- a float16 cache against float32 on the unrounded values: 4e-3 absolute. Each key, value, query and weight
  moves by at most 2^-11 of itself when rounded; with d_head 64 a score moves by ~|q||k|·2^-10/8 ≈ 6e-3 at the
  largest, and the output by less (measured max 9.2e-4 over the cases here).
"""

import numpy as np
import pytest

from attnlab.kernels import _kernels, decode
from attnlab.kernels.attention import attend, attention, attention_path
from attnlab.kernels.quantized import quant_sizes
from attnlab.layer.cache import HALF_MAX, KVCache, kv_dtype_rule
from attnlab.stack.transformer import forward, new_caches

from _decoders import OPTIONS, random_model

needs_numba = pytest.mark.skipif(not _kernels.numba_installed(), reason="numba is not installed")
TIGHT, HALF, LLAMA = 2e-6, 4e-3, 1e-5


def reference(q, k, v):
    """Grouped-query attention of one query per head in float64: (..., h, 1, d)."""
    g = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, g, axis=-3).astype(np.float64), np.repeat(v, g, axis=-3).astype(np.float64)
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])   # (..., h, 1, n_k)
    a = np.exp(s - s.max(-1, keepdims=True))
    return (a / a.sum(-1, keepdims=True)) @ v                                  # (..., h, 1, d)


def cache_of(rng, h_kv, n_k, d, dtype=np.float32):
    """Keys and values as a cache holds them: views of the first n_k rows of longer buffers."""
    k = rng.standard_normal((h_kv, n_k + 5, d), np.float32).astype(dtype)[:, :n_k]   # (h_kv, n_k, d)
    v = rng.standard_normal((h_kv, n_k + 5, d), np.float32).astype(dtype)[:, :n_k]
    return k, v


# contexts on both sides of the tile (256), and of the kernel's four-key steps
CONTEXTS = [1, 3, 4, 5, 255, 256, 257, 513, 1000]
HEADS = [(9, 3), (4, 4), (8, 2), (3, 1)]          # SmolLM2's 9 on 3, ungrouped, and two more groupings


@needs_numba
@pytest.mark.parametrize("n_k", CONTEXTS)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("d", [64, 24, 8])        # a multiple of the 16 lanes, one with a tail, one below them
def test_the_kernel_against_float64_and_the_numpy_path(n_k, heads, d):
    rng = np.random.default_rng(n_k * 100 + d)
    h, h_kv = heads
    q = rng.standard_normal((h, 1, d), np.float32)                             # (h, 1, d)
    k, v = cache_of(rng, h_kv, n_k, d)
    fused = attention(q, k, v, implementation="decode", kernel="fused")
    numpy = attention(q, k, v, implementation="decode", kernel="numpy")
    assert fused.shape == (h, 1, d) and fused.dtype == np.float32
    np.testing.assert_allclose(fused, reference(q, k, v), rtol=0, atol=TIGHT)
    np.testing.assert_allclose(fused, numpy, rtol=0, atol=TIGHT)


@needs_numba
@pytest.mark.parametrize("n_k", [7, 300, 1000])
def test_every_head_of_a_group_is_its_own_attention(n_k):
    """Query head i of a group attends with key/value head i // g alone, as a single-head call."""
    rng = np.random.default_rng(n_k)
    q = rng.standard_normal((9, 1, 64), np.float32)                            # (9, 1, 64)
    k, v = cache_of(rng, 3, n_k, 64)
    out = attention(q, k, v, kernel="fused")                                   # (9, 1, 64)
    for i in range(9):
        alone = reference(q[i:i + 1], k[i // 3:i // 3 + 1], v[i // 3:i // 3 + 1])   # (1, 1, 64)
        np.testing.assert_allclose(out[i:i + 1], alone, rtol=0, atol=TIGHT)


@needs_numba
@pytest.mark.parametrize("tile", [4, 8, 12, 256])
@pytest.mark.parametrize("n_k", [1, 5, 13, 99])
def test_tiles_of_any_size_give_the_same_attention(tile, n_k):
    """The online softmax across tiles: any tile (contexts not a multiple of it) gives the float64 answer, with
    a key far above the others in a later tile (the running max moves) and batch axes."""
    from attnlab.kernels import _fused

    rng = np.random.default_rng(tile + n_k)
    q = rng.standard_normal((2, 3, 2, 16), np.float32)                         # (B, h_kv, g, d)
    k = rng.standard_normal((2, 3, n_k, 16), np.float32)                       # (B, h_kv, n_k, d)
    v = rng.standard_normal((2, 3, n_k, 16), np.float32)
    k[:, :, -1] = 3 * q[:, :, 0] / np.linalg.norm(q[:, :, 0], axis=-1, keepdims=True) * 4   # the last key wins
    out = np.empty((2, 3, 2, 16), np.float32)
    _fused.decode_tiles(q, k, v, np.float32(0.25 * _kernels.LOG2E), out, np.float32(0), tile)
    np.testing.assert_allclose(out.reshape(2, 6, 1, 16), reference(q.reshape(2, 6, 1, 16), k, v), rtol=0,
                               atol=TIGHT)


@needs_numba
def test_the_kernel_gives_the_same_bits_every_call():
    rng = np.random.default_rng(5)
    q = rng.standard_normal((9, 1, 64), np.float32)
    k, v = cache_of(rng, 3, 777, 64)
    first = attention(q, k, v, kernel="fused")
    for _ in range(3):
        np.testing.assert_array_equal(attention(q, k, v, kernel="fused"), first)


@needs_numba
@pytest.mark.parametrize("n_k", [1, 256, 1000])
def test_softcap_and_float64_on_the_fused_kernel(n_k):
    """The soft-cap (Gemma-2) and float64 inputs, whose dot products run in turn rather than in vector IR."""
    rng = np.random.default_rng(n_k)
    q = rng.standard_normal((4, 1, 32))                                        # float64
    k, v = cache_of(rng, 2, n_k, 32, np.float64)
    capped = attention(q, k, v, softcap=0.5, kernel="fused")
    np.testing.assert_allclose(capped, attention(q, k, v, softcap=0.5, kernel="numpy"), rtol=0, atol=1e-13)
    np.testing.assert_allclose(attention(q, k, v, kernel="fused"), reference(q, k, v), rtol=0, atol=1e-13)


# ---------------------------------------------------------------------------------------------------------
# the float16 cache


def llama_reference(q, k, v):
    """Attention against a float16 cache as llama.cpp computes it (flash-attention off), in float64 between its
    roundings: q rounded to float16, the normalised weights rounded to float16. (..., h, 1, d)."""
    g = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, g, axis=-3).astype(np.float64), np.repeat(v, g, axis=-3).astype(np.float64)
    s = q.astype(np.float16).astype(np.float64) @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    a = np.exp(s - s.max(-1, keepdims=True))
    return (a / a.sum(-1, keepdims=True)).astype(np.float16).astype(np.float64) @ v


@pytest.mark.parametrize("kernel", ["fused", "numpy"] if _kernels.numba_installed() else ["numpy"])
@pytest.mark.parametrize("n_k", [1, 5, 257, 1000, 3000])
@pytest.mark.parametrize("heads", [(9, 3), (4, 4)])
def test_a_float16_cache_computes_as_llama_cpp(monkeypatch, kernel, n_k, heads):
    """The stack's entry (attend) keeps a float16 cache as it is for the decode step, which computes as llama.cpp
    does against its own: within LLAMA of the float64 reference of that arithmetic (a weight that lands on the
    other side of a float16 rounding moves the output by 2^-11 of its share: measured 1.2e-6), and within HALF
    of the float32 cache it was rounded from."""
    monkeypatch.setenv(_kernels.KERNEL_ENV, kernel)
    rng = np.random.default_rng(n_k)
    h, h_kv = heads
    q = rng.standard_normal((h, 1, 64), np.float32)
    k, v = cache_of(rng, h_kv, n_k, 64)
    k16, v16 = k.astype(np.float16), v.astype(np.float16)
    out = attend(q, k16, v16, check_finite=False)                              # (h, 1, 64)
    assert out.dtype == np.float32 and out.shape == (h, 1, 64)
    np.testing.assert_allclose(out, llama_reference(q, k16, v16), rtol=0, atol=LLAMA)
    np.testing.assert_allclose(out, reference(q, k, v), rtol=0, atol=HALF)


def test_a_checked_float16_step_computes_as_the_unchecked_one():
    """attend with check_finite (a layer whose inputs it could not bound) checks, then takes the same step."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((9, 1, 64), np.float32)
    k, v = (a.astype(np.float16) for a in cache_of(rng, 3, 300, 64))
    np.testing.assert_array_equal(attend(q, k, v, check_finite=True), attend(q, k, v, check_finite=False))
    with pytest.raises(ValueError, match="query must be finite"):
        attend(np.full_like(q, np.nan), k, v, check_finite=True)


@needs_numba
@pytest.mark.parametrize("n_k", [1, 300, 2000])
def test_both_kernels_compute_a_float16_cache_alike(n_k):
    rng = np.random.default_rng(n_k)
    q = rng.standard_normal((2, 9, 1, 64), np.float32)                         # batch axes too
    k = rng.standard_normal((2, 3, n_k, 64), np.float32).astype(np.float16)
    v = rng.standard_normal((2, 3, n_k, 64), np.float32).astype(np.float16)
    fused = decode.decode_attention(attention_checked(q, k, v), "fused")
    numpy = decode.decode_attention(attention_checked(q, k, v), "numpy")
    np.testing.assert_allclose(fused, numpy, rtol=0, atol=LLAMA)


def attention_checked(q, k, v):
    """The checked inputs attend builds for a float16 cache under a float32 query (k and v kept float16)."""
    from dataclasses import replace

    from attnlab.kernels._checks import check_attention_args

    c = check_attention_args(q, k, v)
    return replace(c, k=k, v=v)


@needs_numba
def test_a_float16_cache_takes_the_fused_kernel_by_rule():
    rule = decode.decode_kernel_rule(9 * 64, 3, 64, None, half_cache=True)
    assert rule[0] == "fused" and "float16" in rule[1]
    assert decode.decode_kernel_rule(9 * 64, 3, 64, None)[0] == "numpy"      # float32: the rule as before
    q, k = np.zeros((9, 1, 8), np.float32), np.zeros((3, 5, 8), np.float32)
    assert attention_path(q, k, k).kernel == "numpy"


def test_float16_cache_append_rounds_and_keeps_the_largest():
    cache = KVCache.empty(2, 6, 4, dtype=np.float16)
    rng = np.random.default_rng(0)
    k = rng.standard_normal((2, 3, 4), np.float32) * 10                        # (h_kv, t, d)
    v = rng.standard_normal((2, 3, 4), np.float32)
    keys, values = cache.append(k, v)
    assert keys.dtype == np.float16 and cache.length == 3
    np.testing.assert_array_equal(keys, k.astype(np.float16))                 # round to nearest, ties to even
    np.testing.assert_array_equal(values, v.astype(np.float16))
    assert cache.k_max == float(np.abs(k.astype(np.float16)).max())
    cache.append(k[:, :1].astype(np.float16), v[:, :1].astype(np.float16))    # float16 itself is taken too
    assert cache.length == 4


@pytest.mark.parametrize("bad, error", [
    (lambda k: k * 0 + np.float32(7e4), "beyond the float16 cache's range"),  # would round to inf
    (lambda k: np.where(k > 0, np.nan, k).astype(np.float32), "finite"),
    (lambda k: k.astype(np.float64), "takes float16 or float32"),
    (lambda k: k[..., :3], "shape"),
    (lambda k: np.concatenate([k, k, k], axis=-2), "cannot append"),           # no room
])
def test_a_failed_append_leaves_the_float16_cache_as_it_was(bad, error):
    cache = KVCache.empty(2, 8, 4, dtype=np.float16)
    rng = np.random.default_rng(1)
    cache.append(rng.standard_normal((2, 3, 4), np.float32), rng.standard_normal((2, 3, 4), np.float32))
    before = cache.k.copy(), cache.v.copy(), cache.length, cache.k_max, cache.v_max
    k = rng.standard_normal((2, 3, 4), np.float32)
    with pytest.raises((TypeError, ValueError), match=error):
        cache.append(bad(k), bad(k))
    with pytest.raises((TypeError, ValueError)):
        cache.append(k, bad(k))                                                # the value alone bad
    np.testing.assert_array_equal(cache.k, before[0])
    np.testing.assert_array_equal(cache.v, before[1])
    assert (cache.length, cache.k_max, cache.v_max) == before[2:]
    assert HALF_MAX == float(np.finfo(np.float16).max)


def test_the_kv_dtype_rule():
    from attnlab.kernels.q8_activations import Q8ActivationMatrix

    assert kv_dtype_rule(np.zeros((4, 4), np.float32))[0] == np.float32
    assert kv_dtype_rule(np.zeros((4, 4), np.float64))[0] == np.float64
    block, nbytes = quant_sizes("Q8_0")
    w = Q8ActivationMatrix(np.zeros((32, 64 // block * nbytes), np.uint8), "Q8_0", 64)
    dtype, why = kv_dtype_rule(w)
    assert dtype == np.float16 and "llama.cpp" in why


def test_new_caches_takes_a_kv_dtype_and_refuses_others():
    model = random_model(OPTIONS["gqa"], np.random.default_rng(0), dtype=np.float32)
    assert {c.k.dtype for c in new_caches(model, 8)} == {np.dtype(np.float32)}          # the rule: exact
    assert {c.k.dtype for c in new_caches(model, 8, kv_dtype=np.float16)} == {np.dtype(np.float16)}
    with pytest.raises(TypeError, match="kv_dtype must be float32 or float16"):
        new_caches(model, 8, kv_dtype=np.int8)
    model64 = random_model(OPTIONS["gqa"], np.random.default_rng(0), dtype=np.float64)
    with pytest.raises(TypeError, match="kv_dtype must be float64"):
        new_caches(model64, 8, kv_dtype=np.float16)


@pytest.mark.parametrize("kernel", ["fused", "numpy"] if _kernels.numba_installed() else ["numpy"])
@pytest.mark.parametrize("option", ["gqa", "rope", "gemma2"])
def test_a_model_decodes_with_a_float16_cache(monkeypatch, option, kernel):
    """Prefill and decode steps with a float16 cache against the float32 cache: logits within HALF (relative
    to their largest), the same whichever kernel runs the step."""
    monkeypatch.setenv(_kernels.KERNEL_ENV, kernel)
    model = random_model(OPTIONS[option], np.random.default_rng(2), dtype=np.float32)
    logits = {}
    for dtype in (np.float32, np.float16):
        caches = new_caches(model, 10, kv_dtype=dtype)
        rows = [forward(model, np.arange(5), caches=caches).logits[-1]]
        for t in (3, 7, 1):
            rows.append(forward(model, np.array([t]), caches=caches).logits[-1])
        logits[dtype] = np.stack(rows)                                         # (4, vocab)
    top = np.abs(logits[np.float32]).max()
    np.testing.assert_allclose(logits[np.float16], logits[np.float32], rtol=0, atol=HALF * top)
