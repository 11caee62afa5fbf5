"""llama.cpp's arithmetic between the products (attnlab.kernels.ggml_arith), numpy only: hand cases, float64
references, and the orders of its sums stated independently. (Against llama.cpp's own tensors:
tests/test_ggml_llama_cpp.py, which needs llama_cpp.)"""

import numpy as np
import pytest

from attnlab.kernels import ggml_arith as G

F = np.float32


def test_rms_norm_hand_case_and_its_roundings():
    # (3, 4): squares 9, 16, mean 12.5, scale 1/√12.5 in float32, then x · scale, then · weight
    y = G.rms_norm(np.array([[3.0, 4.0]], F), np.array([1.0, 2.0], F), 0.0)
    scale = F(1) / np.sqrt(F(12.5))
    assert y.dtype == F
    np.testing.assert_array_equal(y, [[F(3) * scale * F(1), F(4) * scale * F(2)]])


def test_rms_norm_sums_squares_in_double_in_order():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 576)).astype(F)
    w = rng.standard_normal(576).astype(F)
    y = G.rms_norm(x, w, 1e-5)
    total = [sum(float(F(v * v)) for v in row) for row in x]          # each square float32, the sum double, in order
    scale = np.array([F(1) / np.sqrt(F(t / 576) + F(1e-5)) for t in total], F)
    np.testing.assert_array_equal(y, (x * scale[:, None]) * w)
    ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * w
    np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-7)


def test_rope_turns_by_the_recurrent_angles():
    x = np.random.default_rng(1).standard_normal((2, 3, 64)).astype(F)   # (h, n, d)
    y = G.rope(x, [0, 1, 700], 100000.0)
    np.testing.assert_array_equal(y[:, 0], x[:, 0])                      # position 0: cos 1, sin 0
    ts = G.theta_scale(100000.0, 64)
    assert abs(float(ts) - 100000.0 ** (-2 / 64)) < 1e-7
    for j, p in ((1, 1), (2, 700)):
        angles, t = [], F(p)
        for _ in range(32):
            angles.append(t)
            t = F(t * ts)                                                # θ_{i+1} = θ_i · theta_scale in float32
        cos, sin = G.rope_table(p, 64, 100000.0)
        np.testing.assert_allclose(cos, np.cos(np.array(angles, np.float64)), atol=1.2e-7)
        np.testing.assert_allclose(sin, np.sin(np.array(angles, np.float64)), atol=1.2e-7)
        x0, x1 = x[:, j, 0::2].astype(np.float64), x[:, j, 1::2].astype(np.float64)
        np.testing.assert_allclose(y[:, j, 0::2], x0 * cos - x1 * sin, rtol=0, atol=2e-6)
        np.testing.assert_allclose(y[:, j, 1::2], x0 * sin + x1 * cos, rtol=0, atol=2e-6)
        # GCC's contraction: y0 = fma(x0, cos, −(x1 · sin)), one rounding after the first product
        np.testing.assert_array_equal(y[:, j, 0::2], G.fma(x[:, j, 0::2], cos, -(x[:, j, 1::2] * sin)))


def test_v_expf_hand_values_and_its_stated_error():
    np.testing.assert_array_equal(G.v_expf(np.array([0.0, -np.inf, 200.0, -200.0], F)), [1.0, 0.0, np.inf, 0.0])
    x = np.linspace(-80, 80, 100001).astype(F)
    rel = np.abs(G.v_expf(x) / np.exp(x.astype(np.float64)) - 1)
    assert rel.max() < (1.46 + 0.5) * 2.0 ** -23                          # ggml's comment: 1.45358 plus 0.5 ulps
    assert G.v_expf(x).dtype == F


def test_softmax_uniform_row_is_exact_and_rows_match_float64():
    np.testing.assert_array_equal(G.softmax(np.zeros((1, 16), F), 1.0), np.full((1, 16), 1 / 16, F))
    rng = np.random.default_rng(2)
    s = (4 * rng.standard_normal((3, 5, 256))).astype(F)
    mask = np.where(np.arange(256) < 37, F(0), F(-np.inf))
    p = G.softmax(s, 0.125, mask)
    assert np.all(p[..., 37:] == 0)
    w = s[..., :37].astype(np.float64) * 0.125
    ref = np.exp(w - w.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    np.testing.assert_allclose(p[..., :37], ref, rtol=5e-7, atol=1e-9)
    with pytest.raises(ValueError, match="multiple of 16"):
        G.softmax(np.zeros((1, 10), F), 1.0)


def test_softmax_sums_each_16_block_in_float32_then_in_double():
    e = G.v_expf(np.linspace(-3, 0, 32).astype(F) - F(0))                # the exps of the row, its max 0
    p = G.softmax(np.linspace(-3, 0, 32).astype(F)[None], 1.0)
    total = np.float64(G.reduce_add16(e[:16])) + np.float64(G.reduce_add16(e[16:]))
    np.testing.assert_array_equal(p[0], e * F(1.0 / total))


def test_reduce_add16_is_gccs_tree():
    v = np.array([2.0 ** 24, 1, 1, 1, 1, 1, 1, 1, -(2.0 ** 24), 1, 1, 1, 1, 1, 1, 1], F)
    # lanes i + i+8 first: 2^24 − 2^24 = 0 exactly, then the ones: 14 (a sequential sum would lose them)
    assert G.reduce_add16(v) == 14


def test_silu_and_swiglu():
    g = np.array([0.0, 1.0, -1.0, 20.0, -20.0], F)
    np.testing.assert_allclose(G.silu(g), g / (1 + np.exp(-g.astype(np.float64))), rtol=3e-7)
    assert G.silu(g)[0] == 0
    np.testing.assert_array_equal(G.swiglu(g, np.full(5, 2, F)), G.silu(g) * F(2))


def test_f16_dots_orders_and_values():
    rng = np.random.default_rng(3)
    a = G.half(rng.standard_normal((4, 128)))
    b = G.half(rng.standard_normal((4, 128)))
    ref = (a.astype(np.float64) * b).sum(-1)
    for dot in (G.dot_f16_batch, G.dot_f16_vec):
        np.testing.assert_allclose(dot(a, b), ref, rtol=1e-5, atol=1e-5)
    # integers: every order exact
    ai, bi = np.arange(128, dtype=F)[None] % 7, np.ones((1, 128), F)
    assert G.dot_f16_batch(ai, bi)[0] == G.dot_f16_vec(ai, bi)[0] == float((np.arange(128) % 7).sum())
    # the one-token order: register j holds the j-th 16 of each 64, then (0 + 2) + (1 + 3)
    big = np.zeros((1, 64), F)
    big[0, 0], big[0, 32], big[0, 16] = 2.0 ** 15, -(2.0 ** 15), 2.0 ** -10   # float16 values
    assert G.dot_f16_vec(big, np.ones((1, 64), F))[0] == 2.0 ** -10     # registers 0 and 2 cancel first
    # the batch order: one register, the 16-blocks added into it in turn: 2^15 + 2^-10 rounds to 2^15 first
    assert G.dot_f16_batch(big, np.ones((1, 64), F))[0] == 0.0
    # a k short of 64: ggml_vec_dot_f16's tail in double (2^15 + 2^-10 − 2^15 exact), also for a batch (tinyBLAS
    # declines k = 24, not a multiple of 16)
    tail = np.zeros((1, 24), F)
    tail[0, 0], tail[0, 1], tail[0, 2] = 2.0 ** 15, 2.0 ** -10, -(2.0 ** 15)
    assert G.dot_f16_vec(tail, np.ones((1, 24), F))[0] == G.dot_f16_batch(tail, np.ones((1, 24), F))[0] == 2.0 ** -10


def test_attention_matches_float64_softmax_attention():
    rng = np.random.default_rng(4)
    h, h_kv, d, start = 4, 2, 64, 10
    for n in (1, 3, 70):
        q = rng.standard_normal((h, n, d)).astype(F)
        k, v = rng.standard_normal((h_kv, start + n, d)).astype(F), rng.standard_normal((h_kv, start + n, d)).astype(F)
        o = G.attention(q, k, v, start, d ** -0.5)
        kg, vg = np.repeat(G.half(k), 2, 0).astype(np.float64), np.repeat(G.half(v), 2, 0).astype(np.float64)
        s = np.einsum("hnd,hkd->hnk", q, kg) / 8
        s = np.where(np.arange(start + n)[None, :] <= start + np.arange(n)[:, None], s, -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        np.testing.assert_allclose(o, np.einsum("hnk,hkd->hnd", w, vg), rtol=0, atol=5e-3)   # q, w in float16


def test_attention_is_the_softmax_and_dots_it_states():
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 1, 64)).astype(F)
    k, v = rng.standard_normal((1, 5, 64)).astype(F), rng.standard_normal((1, 5, 64)).astype(F)
    o = G.attention(q, k, v, 4, 0.125)                                    # one token at position 4: 5 keys
    kp = np.zeros((64, 64), F)
    kp[:5] = G.half(k[0])
    vp = np.zeros((64, 64), F)
    vp[:5] = G.half(v[0])
    mask = np.where(np.arange(64) < 5, F(0), F(-np.inf))
    for head in range(2):
        s = G.dot_f16_vec(G.half(q[head, 0])[None], kp)                   # (64,) ggml_vec_dot_f16's order
        a = G.half(G.softmax(s, 0.125, mask))
        np.testing.assert_array_equal(o[head, 0], G.dot_f16_vec(a[None], vp.T))
