"""The quantized matrix-vector kernels (numba, the optional extra ``attnlab[fast]``): dequantize a block and
multiply it in one pass, rows in parallel.

The values are those ``gguf.quants`` rebuilds (``d·(q − 8)`` for Q4_0, ``d·q + m`` for Q4_1, ``q·d`` for
Q8_0): the dequantizing kernels rebuild them bit for bit (float32, the same operations, no contraction into
FMAs), and the products take each block's scale out of its sum (the same values, rounded in another order;
``reassoc`` lets LLVM split the sums over vector lanes). A 4-bit block's 16 bytes hold its values 0–15 in their low nibbles and 16–31 in
their high ones, as ``gguf.quants`` unpacks them (the tests hold the kernels to ``gguf.quants.dequantize``).

Compiled ``nogil=True`` and ``cache=True`` (kept in ``__pycache__``; a second process compiles nothing). The
rows run on the calling thread or split over numba's threads (``parallel=True``, one range of rows per
thread): :func:`attnlab.kernels.quantized.kernel_threads` times both once per process, on the machine it runs
on, and keeps the faster. (On a 2-core EPYC shared with other work, numba's OpenMP threads made a
SmolLM2 decode step's products 10x slower than one thread: they spin while they wait.)
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

MAX_TOKENS = 8      # up to this many tokens per product run the fused kernel; more: dequantize, then BLAS
FLAGS = dict(nogil=True, cache=True, boundscheck=False, fastmath={"reassoc", "nsz"})


@numba.njit(**FLAGS)
def _nibbles_rows(qs, d, m, off, x, xs, out, r0, r1):
    """out[n, r] = Σ_i x[n, i] · w[r, i] for rows r0 … r1 − 1 of a 4-bit type: qs (R, n_blocks, half) bytes,
    d and m (R, n_blocks), w = d·(q − off) + m; x (N, n_blocks·2·half), xs (N, n_blocks) x's sum over each
    block, out (N, R).

    Per block, Σ_t x_t·w_t = d·(Σ_t x_t·q_t − off·Σ_t x_t) + m·Σ_t x_t: the block's own sum of x·q (one
    conversion and one multiply-add per value), then its scale, 30% faster than rebuilding each w_t first;
    the same values, rounded in another order (the tests hold it to the float32 product within 1e-6)."""
    n_blocks, half = qs.shape[1], qs.shape[2]
    mask, four = np.uint8(15), np.uint8(4)
    for r in range(r0, r1):
        q = qs[r]
        for n in range(x.shape[0]):
            acc = np.float32(0.0)
            for b in range(n_blocks):
                base = b * 2 * half
                part = np.float32(0.0)
                for t in range(half):
                    byte = q[b, t]
                    part += x[n, base + t] * np.float32(byte & mask) + x[n, base + half + t] * np.float32(byte >> four)
                acc += d[r, b] * (part - off * xs[n, b]) + m[r, b] * xs[n, b]
            out[n, r] = acc


@numba.njit(**FLAGS)
def _int8_rows(qs, d, x, out, r0, r1):
    """out[n, r] = Σ_i x[n, i] · w[r, i] for rows r0 … r1 − 1 of Q8_0: qs (R, n_blocks, block) int8,
    d (R, n_blocks), w = q·d, as d·Σ_t x_t·q_t per block."""
    n_blocks, block = qs.shape[1], qs.shape[2]
    for r in range(r0, r1):
        q = qs[r]
        for n in range(x.shape[0]):
            acc = np.float32(0.0)
            for b in range(n_blocks):
                base = b * block
                part = np.float32(0.0)
                for t in range(block):
                    part += x[n, base + t] * np.float32(q[b, t])
                acc += d[r, b] * part
            out[n, r] = acc


@numba.njit(**FLAGS)
def _block_sums(x, n_blocks):
    """(N, n_blocks): x (N, n_blocks·block) summed over each block."""
    block = x.shape[1] // n_blocks
    xs = np.empty((x.shape[0], n_blocks), np.float32)
    for n in range(x.shape[0]):
        for b in range(n_blocks):
            total = np.float32(0.0)
            for t in range(block):
                total += x[n, b * block + t]
            xs[n, b] = total
    return xs


@numba.njit(parallel=True, **FLAGS)
def _nibbles_parallel(qs, d, m, off, x, xs, out, chunks):
    """:func:`_nibbles_rows` over ``chunks`` row ranges on numba's threads."""
    n_rows = qs.shape[0]
    step = (n_rows + chunks - 1) // chunks
    for c in prange(chunks):
        _nibbles_rows(qs, d, m, off, x, xs, out, c * step, min(n_rows, (c + 1) * step))


@numba.njit(parallel=True, **FLAGS)
def _int8_parallel(qs, d, x, out, chunks):
    n_rows = qs.shape[0]
    step = (n_rows + chunks - 1) // chunks
    for c in prange(chunks):
        _int8_rows(qs, d, x, out, c * step, min(n_rows, (c + 1) * step))


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


def matvec(qtype: str, qs, d, m, x, out, threads: int = 1) -> None:
    """out (N, R) = x (N, d_in) times the rows (R, d_in) of a quantized weight, N <= MAX_TOKENS, over
    ``threads`` of numba's threads (1: on the calling thread, no parallel region)."""
    rows = qs.shape[0]
    if qtype == "Q8_0":
        q8 = qs.view(np.int8)
        if threads > 1:
            _int8_parallel(q8, d, x, out, threads)
        else:
            _int8_rows(q8, d, x, out, 0, rows)
        return
    qs, d, m, off = _nibble_args(qtype, qs, d, m)
    xs = _block_sums(x, d.shape[1])                          # (N, n_blocks)
    if threads > 1:
        _nibbles_parallel(qs, d, m, off, x, xs, out, threads)
    else:
        _nibbles_rows(qs, d, m, off, x, xs, out, 0, rows)


def dequantize(qtype: str, qs, d, m, w) -> None:
    """w (R, d_in) float32 = the rows of a quantized weight."""
    if qtype == "Q8_0":
        _int8_dequantize(qs.view(np.int8), d, w)
    else:
        _nibbles_dequantize(*_nibble_args(qtype, qs, d, m), w)
