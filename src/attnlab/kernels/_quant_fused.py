"""The quantized matrix-vector kernels (numba, the optional extra ``attnlab[fast]``): dequantize a block and
multiply it in one pass, rows in parallel.

Each block's values are rebuilt exactly as ``gguf.quants`` rebuilds them (float32, same operations in the
same order: ``d·(q − 8)`` for Q4_0, ``d·q + m`` for Q4_1, ``q·d`` for Q8_0; no contraction into FMAs), then
multiplied by x: the products of the float32 path, summed in another order (``reassoc`` lets LLVM split the
sum over vector lanes). A 4-bit block's 16 bytes hold its values 0–15 in their low nibbles and 16–31 in
their high ones, as ``gguf.quants`` unpacks them (the tests hold the kernels to ``gguf.quants.dequantize``).

Compiled ``nogil=True`` and ``cache=True`` (kept in ``__pycache__``; a second process compiles nothing), and
``parallel=True``: the rows are split over numba's threads.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

MAX_TOKENS = 8      # up to this many tokens per product run the fused kernel; more: dequantize, then BLAS
FLAGS = dict(nogil=True, cache=True, boundscheck=False, fastmath={"reassoc", "nsz"})


@numba.njit(parallel=True, **FLAGS)
def _nibbles_matvec(qs, d, m, off, x, out):
    """out[n, r] = Σ_i x[n, i] · w[r, i] for a 4-bit type: qs (R, n_blocks, half) bytes, d and m (R, n_blocks),
    w = d·(q − off) + m; x (N, n_blocks·2·half), out (N, R)."""
    n_rows, n_blocks, half = qs.shape
    for r in prange(n_rows):
        for n in range(x.shape[0]):
            acc = np.float32(0.0)
            for b in range(n_blocks):
                db, mb, base = d[r, b], m[r, b], b * 2 * half
                part = np.float32(0.0)
                for t in range(half):
                    byte = qs[r, b, t]
                    lo = db * (np.float32(byte & 15) - off) + mb
                    hi = db * (np.float32(byte >> 4) - off) + mb
                    part += x[n, base + t] * lo + x[n, base + half + t] * hi
                acc += part
            out[n, r] = acc


@numba.njit(parallel=True, **FLAGS)
def _int8_matvec(qs, d, x, out):
    """out[n, r] = Σ_i x[n, i] · w[r, i] for Q8_0: qs (R, n_blocks, block) int8, d (R, n_blocks), w = q·d."""
    n_rows, n_blocks, block = qs.shape
    for r in prange(n_rows):
        for n in range(x.shape[0]):
            acc = np.float32(0.0)
            for b in range(n_blocks):
                db, base = d[r, b], b * block
                part = np.float32(0.0)
                for t in range(block):
                    part += x[n, base + t] * (np.float32(qs[r, b, t]) * db)
                acc += part
            out[n, r] = acc


@numba.njit(parallel=True, **FLAGS)
def _nibbles_dequantize(qs, d, m, off, w):
    """w (R, n_blocks·2·half) float32 = the rows' values, as :func:`_nibbles_matvec` rebuilds them."""
    n_rows, n_blocks, half = qs.shape
    for r in prange(n_rows):
        for b in range(n_blocks):
            db, mb, base = d[r, b], m[r, b], b * 2 * half
            for t in range(half):
                byte = qs[r, b, t]
                w[r, base + t] = db * (np.float32(byte & 15) - off) + mb
                w[r, base + half + t] = db * (np.float32(byte >> 4) - off) + mb


@numba.njit(parallel=True, **FLAGS)
def _int8_dequantize(qs, d, w):
    n_rows, n_blocks, block = qs.shape
    for r in prange(n_rows):
        for b in range(n_blocks):
            db, base = d[r, b], b * block
            for t in range(block):
                w[r, base + t] = np.float32(qs[r, b, t]) * db


def _nibble_args(qtype: str, qs, d, m):
    """Q4_0: w = d·(q − 8) (its m is 0, which adds nothing); Q4_1: w = d·q + m."""
    return qs, d, m, np.float32(8.0 if qtype == "Q4_0" else 0.0)


def matvec(qtype: str, qs, d, m, x, out) -> None:
    """out (N, R) = x (N, d_in) times the rows (R, d_in) of a quantized weight, N <= MAX_TOKENS."""
    if qtype == "Q8_0":
        _int8_matvec(qs.view(np.int8), d, x, out)
    else:
        _nibbles_matvec(*_nibble_args(qtype, qs, d, m), x, out)


def dequantize(qtype: str, qs, d, m, w) -> None:
    """w (R, d_in) float32 = the rows of a quantized weight."""
    if qtype == "Q8_0":
        _int8_dequantize(qs.view(np.int8), d, w)
    else:
        _nibbles_dequantize(*_nibble_args(qtype, qs, d, m), w)
