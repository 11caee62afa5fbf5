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


@pytest.mark.parametrize("h, h_kv, n, start, d", [(3, 1, 1, 0, 64), (3, 1, 1, 63, 64), (9, 3, 1, 511, 64),
                                                  (4, 4, 1, 200, 128), (8, 2, 1, 64, 192), (2, 1, 16, 0, 16),
                                                  (3, 1, 17, 47, 32), (6, 2, 64, 0, 64), (4, 1, 9, 120, 128),
                                                  (3, 3, 33, 15, 48)])
def test_attention_vector_kernel_over_shapes(rng, h, h_kv, n, start, d):
    """The vector kernel (d a multiple of 16; of 64 for one token) against the reference, its blocks' edges
    (16, 64, a key count one past them), group sizes 1 to 4, scores wide enough that some weights flush to 0
    and some round to float16 subnormals."""
    q = (rng.standard_normal((h, n, d)) * rng.choice([0.5, 4.0, 12.0, 60.0], (h, n, 1))).astype(F)
    k = rng.standard_normal((h_kv, start + n + 3, d)).astype(np.float16)         # rows past start + n unread
    v = rng.standard_normal((h_kv, start + n + 3, d)).astype(np.float16)
    scale = F(d ** -0.5)
    want = G.attention(q, k[:, :start + n], v[:, :start + n], start, scale)
    out = np.empty((h, n, d), F)
    K.attention(q, k.view(np.uint16), v.view(np.uint16), start, scale, out)
    np.testing.assert_array_equal(out, want)
    scalar = np.empty((h, n, d), F)
    K.attention_scalar(q, k.view(np.uint16), v.view(np.uint16), start, scale, scalar)
    np.testing.assert_array_equal(scalar, want)
