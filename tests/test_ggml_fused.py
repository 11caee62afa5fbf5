"""The numba kernels of llama.cpp's arithmetic (attnlab.kernels._ggml_fused) give their numpy reference's
(attnlab.kernels.ggml_arith) bits."""

import numpy as np
import pytest

pytest.importorskip("numba")

from attnlab.kernels import _ggml_fused as K  # noqa: E402
from attnlab.kernels import ggml_arith as G  # noqa: E402

F = np.float32


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def test_rms_norm_rows(rng):
    x = (3 * rng.standard_normal((5, 576))).astype(F)
    w = rng.standard_normal(576).astype(F)
    out = np.empty_like(x)
    K.rms_norm_rows(x, w, F(1e-5), out)
    np.testing.assert_array_equal(out, G.rms_norm(x, w, 1e-5))


def test_silu_rows_and_its_exp_in_every_range(rng):
    g = np.concatenate([(8 * rng.standard_normal(5000)), np.linspace(-140, 140, 4001),
                        [0.0, -0.0, 88.7, 89.0, -103.9, -104.5, 1e-30, -1e-30]]).astype(F)
    out = np.empty_like(g)
    K.silu_rows(g, out)
    np.testing.assert_array_equal(out, G.silu(g))


def test_rope_rows(rng):
    x = rng.standard_normal((9, 5, 64)).astype(F)
    cos, sin = G.rope_tables(range(100, 105), 64, 100000.0)
    out = np.empty_like(x)
    K.rope_rows(x, cos, sin, out)
    np.testing.assert_array_equal(out, G.rope(x, range(100, 105), 100000.0))


@pytest.mark.parametrize("n, start, d", [(1, 0, 64), (1, 130, 64), (7, 0, 64), (5, 70, 64), (1, 9, 16), (6, 3, 16),
                                         (3, 5, 24)])
def test_attention(rng, n, start, d):
    h, h_kv = 6, 2
    q = rng.standard_normal((h, n, d)).astype(F)
    k = rng.standard_normal((h_kv, start + n, d)).astype(np.float16)
    v = rng.standard_normal((h_kv, start + n, d)).astype(np.float16)
    out = np.empty((h, n, d), F)
    K.attention(q, k.view(np.uint16), v.view(np.uint16), start, F(d ** -0.5), out)
    want = G.attention(q, k, v, start, F(d ** -0.5))
    np.testing.assert_array_equal(out, want)
    K.attention(q, k.astype(F), v.astype(F), start, F(d ** -0.5), out)     # float32 holding float16 values
    np.testing.assert_array_equal(out, want)
