"""The q8 mode's product of many tokens (issue 33, prefill): the register-blocked GEMM of
:mod:`attnlab.kernels._q8_fused` (a group's block unpacked once for TILE tokens) gives every token the bits of
that token's product alone (the decode kernel) and of the numpy reference, on weights written by
``gguf.GGUFWriter``: token counts that are not a multiple of TILE, rows that are not a multiple of 4, tokens over
several cache chunks, and any split over threads."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
import _gguf_tensor  # noqa: E402
pytest.importorskip("numba")

from attnlab.kernels import _q8_fused  # noqa: E402
from attnlab.kernels.q8_activations import INT_TYPES, Q8ActivationMatrix, reference_matmul  # noqa: E402


@pytest.fixture(autouse=True)
def numba_on(monkeypatch):
    monkeypatch.delenv("ATTNLAB_NO_NUMBA", raising=False)


def written(tmp_path, w: np.ndarray, qtype: str) -> Q8ActivationMatrix:
    """``w`` (d_out, d_in) through a GGUF file in ``qtype``, read back as the mode's weight."""
    raw, d_in = _gguf_tensor.written(tmp_path, w, qtype)
    return Q8ActivationMatrix(raw, qtype, d_in)


def one_by_one(x: np.ndarray, W) -> np.ndarray:
    """Each token's product alone (the decode step's kernel), stacked: (N, d_out)."""
    return np.concatenate([x[i:i + 1] @ W for i in range(x.shape[0])])


@pytest.mark.parametrize("qtype", INT_TYPES)
def test_a_prefill_gives_each_token_its_decode_bits(tmp_path, rng, qtype):
    """Tokens over three cache chunks of whole tiles and 5 left (at d_in 1,024 and TILE 8: 4 tiles a chunk, 77
    tokens), against 99 rows (24 groups and 3 rows): the GEMM equals the single-token products and the numpy
    reference bit for bit, with a block of zeros and a token of zeros among them."""
    tiles = _q8_fused.CHUNK_BYTES // (_q8_fused.TILE * 32 * 32)             # whole tiles in a chunk at d_in 1,024
    n = (2 * tiles + 1) * _q8_fused.TILE + 5
    W = written(tmp_path, (rng.standard_normal((99, 1024)) * 0.05).astype(np.float32), qtype)
    x = rng.standard_normal((n, 1024)).astype(np.float32)                    # (N, d_in)
    x[3, 64:96] = 0.0
    x[17] = 0.0
    got = x @ W                                                              # (N, d_out)
    np.testing.assert_array_equal(got, one_by_one(x, W))
    np.testing.assert_array_equal(got, reference_matmul(x, W))


@pytest.mark.parametrize("qtype", INT_TYPES)
@pytest.mark.parametrize("n_tokens", [8, 9, 16, 23])
def test_whole_tiles_and_a_rest_equal_the_reference(tmp_path, rng, qtype, n_tokens):
    W = written(tmp_path, (rng.standard_normal((30, 96)) * 0.05).astype(np.float32), qtype)
    x = rng.standard_normal((n_tokens, 96)).astype(np.float32)
    got = x @ W
    np.testing.assert_array_equal(got, reference_matmul(x, W))
    np.testing.assert_array_equal(got, one_by_one(x, W))


@pytest.mark.parametrize("qtype", INT_TYPES)
def test_the_split_over_threads_changes_no_bit(tmp_path, rng, qtype):
    """The prefill pool's rule (Python threads over ranges of row groups) and numba's threads: the same bits as
    the calling thread alone."""
    W = written(tmp_path, (rng.standard_normal((70, 128)) * 0.05).astype(np.float32), qtype)
    x = rng.standard_normal((27, 128)).astype(np.float32)
    alone = np.empty((27, 70), np.float32)
    _q8_fused.matmul(qtype, *W.kernel_planes, x, alone)
    with ThreadPoolExecutor(3) as pool:
        pooled = np.empty_like(alone)
        _q8_fused.matmul(qtype, *W.kernel_planes, x, pooled, pool=pool)
    numba_threads = np.empty_like(alone)
    _q8_fused.matmul(qtype, *W.kernel_planes, x, numba_threads, threads=2)
    np.testing.assert_array_equal(pooled, alone)
    np.testing.assert_array_equal(numba_threads, alone)
    np.testing.assert_array_equal(alone, reference_matmul(x, W))


def test_the_tiles_lay_each_dword_of_the_tokens_side_by_side(rng):
    """_quantized_tiles by hand: token 8i + u's values 4j … 4j + 3 of block b at qt[i, b, j, u] (for Q8_0 their
    bits + 128 as uint8), ys[i, b, j, u] = MAGIC_BITS − 8·their sum, its scales at xdt[i, b, u] and
    xst[i, b, u]; the tokens after the last whole tile are left to the one-token kernel."""
    assert _q8_fused.TILE == 8                                               # the layouts below, by hand
    x = rng.standard_normal((19, 64)).astype(np.float32)
    qx, xd, xs, qt, ys, xdt, xst = _q8_fused._quantized_tiles(x, False)
    assert qt.shape == (2 * 2 * 8 * 32,) and ys.shape == (2 * 2 * 8 * 8,) and xdt.shape == xst.shape == (2, 2, 8)
    np.testing.assert_array_equal(qt.reshape(2, 2, 8, 8, 4)[1, 1, 5, 3], qx[11, 1, 20:24])
    assert ys.reshape(2, 2, 8, 8)[1, 1, 5, 3] == 0x4B400000 - 8 * int(qx[11, 1, 20:24].astype(np.int32).sum())
    assert (xdt[1, 0, 7], xst[0, 1, 2]) == (xd[15, 0], xs[2, 1])
    unsigned = _q8_fused._quantized_tiles(x, True)[3].view(np.uint8).reshape(2, 2, 8, 8, 4)
    np.testing.assert_array_equal(unsigned[1, 1, 5, 3], qx[11, 1, 20:24].astype(np.int32) + 128)


def test_x_rounded_in_vector_ir_equals_numpys_rounding(rng):
    """The kernels' rounding of x (a block at a time in vector IR) against :func:`quantize_q8`: blocks of every
    magnitude, halves that tie (x·127/amax = k + 0.5), a block of zeros; the tiles hold the same values."""
    from attnlab.kernels.q8_activations import quantize_q8

    x = rng.standard_normal((19, 256)).astype(np.float32) * np.logspace(-6, 2, 8, dtype=np.float32).repeat(32)
    x[2, :32] = np.arange(32, dtype=np.float32) - 15.5                      # amax 15.5: ties at every other value
    x[2, 31] = 127.0                                                       # amax 127: x·1 ... and k + 0.5 exactly
    x[2, :8] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 126.5]
    x[5, 64:96] = 0.0
    want = quantize_q8(x)
    for unsigned in (False, True):
        qx, xd, xs, qt, ys, xdt, xst = _q8_fused._quantized_tiles(x, unsigned)
        for got, ref in zip((qx, xd, xs), want):
            np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(qx[2, 0, :8], [0, 2, 2, 0, -2, -2, 4, 126])
    signed = qt.view(np.uint8).astype(np.int32) - 128                       # the unsigned layout's values
    np.testing.assert_array_equal(signed.reshape(2, 8, 8, 8, 4).transpose(0, 3, 1, 2, 4).reshape(16, 8, 32), qx[:16])
    np.testing.assert_array_equal(xst.transpose(0, 2, 1).reshape(16, 8), xs[:16])
