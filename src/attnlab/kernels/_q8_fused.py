"""The 8-bit-activation kernels (numba, the optional extra ``attnlab[fast]``): x rounded to 8 bits per block of
32, then integer dot products with the weight's blocks, as llama.cpp's x86 ``ggml_vec_dot`` runs them.

:mod:`attnlab.kernels.q8_activations` says what is computed and holds the numpy reference these kernels are
tested against bit for bit; in short, for a row of blocks b and a token:

- x's block b becomes int8 ``qx`` and a float16 scale ``xd`` (Q8_0, Q8_1), and for Q8_1 also ``xs`` = float16
  of xd·Σqx (:func:`quantize_blocks`);
- per block, eight int32 lanes, lane j the sum of the products of the values 4j … 4j + 3 (what ``vpdpbusd``
  or ``vpmaddubsw`` + ``vpmaddwd`` leave in a 256-bit register), exact in any order;
- eight float32 accumulators, ``acc_j = acc_j + (d_w·xd)·float(lane_j)`` block after block (llama.cpp fuses
  the multiply-add; here it is two roundings, so numpy can follow), then llama.cpp's horizontal sum
  ``((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))``, plus (Q4_1) the minima's term Σ_b m_b·xs_b summed block after block.

The weights are the planes of :class:`attnlab.kernels.quantized.QuantizedMatrix` (rows in groups of 4, each
block's bytes of the four rows side by side); the four rows' lanes are computed together, so LLVM can give
each group's block one pass of 512-bit integer dot products. No fastmath: every float operation rounds as
numpy's does, and the integer sums are exact whatever order LLVM gives them.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from ._quant_fused import GROUP, _f32

FLAGS = dict(nogil=True, cache=True, boundscheck=False)
LANES = 8           # float32 accumulators per row: one 256-bit register, as llama.cpp's AVX2 loop keeps them
QK = 32             # values per block of Q8_0 / Q8_1 (and of the weights' blocks here)
LOW, SHIFT = np.uint8(15), np.uint8(4)


@intrinsic
def _to_half(typingctx, value):
    """A float32 rounded to the nearest float16 (ties to even), returned as float32: llama.cpp's
    ``GGML_CPU_FP32_TO_FP16`` then back (LLVM's fptrunc and fpext: F16C's vcvtps2ph on x86)."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.float32), codegen


@numba.njit(**FLAGS)
def quantize_blocks(x, qx, xd, xs):
    """x (N, n_blocks·32) float32 -> qx (N, n_blocks, 32) int8, xd (N, n_blocks) and xs (N, n_blocks) float32
    (each the value of a float16), as llama.cpp's x86 ``quantize_row_q8_1`` (``quantize_row_q8_0``: the
    same, xs unused): amax = max|x|, d = amax / 127, q = round-half-even(x · (127 / amax)), xs = d·Σq."""
    for n in range(x.shape[0]):
        for b in range(qx.shape[1]):
            amax = np.float32(0.0)
            for t in range(QK):
                amax = max(amax, abs(x[n, b * QK + t]))
            d = amax / np.float32(127.0)
            inv = np.float32(127.0) / amax if amax != 0 else np.float32(0.0)
            total = 0
            for t in range(QK):
                q = np.int32(np.rint(x[n, b * QK + t] * inv))
                qx[n, b, t] = q
                total += q
            xd[n, b] = _to_half(d)
            xs[n, b] = _to_half(d * np.float32(total))


@numba.njit(inline="always", **FLAGS)
def _hsum(acc, k):
    """llama.cpp's ``hsum_float_8`` of row k's eight accumulators, in its order."""
    return ((acc[k, 0] + acc[k, 4]) + (acc[k, 2] + acc[k, 6])) + ((acc[k, 1] + acc[k, 5]) + (acc[k, 3] + acc[k, 7]))


@numba.njit(**FLAGS)
def _nibbles_groups(qs, d, m, off, qx, xd, xs, out, g0, g1):
    """out[n, r] for the rows of groups g0 … g1 − 1 of a 4-bit type: qs (G, n_blocks, 4, 16) bytes (value t
    in byte t's low nibble, t + 16 in its high one), d and m (G, n_blocks, 4) float16 bits (m unused when
    ``off``: Q4_0, w = d·(q − 8)); Q4_1 (off 0) adds Σ_b m_b·xs_b."""
    n_blocks, n_rows = qs.shape[1], out.shape[1]
    lanes = np.empty((GROUP, LANES), np.int32)
    acc = np.empty((GROUP, LANES), np.float32)
    summs = np.empty(GROUP, np.float32)
    ysum = np.empty(LANES, np.int32)                             # Σ of qx over each lane's four values
    for g in range(g0, g1):
        qg, dg, mg = qs[g], d[g], m[g]
        for n in range(qx.shape[0]):
            acc[:] = 0.0
            summs[:] = 0.0
            for b in range(n_blocks):
                y = qx[n, b]                                     # (32,) int8
                for j in range(LANES):
                    ysum[j] = (np.int32(y[4 * j]) + np.int32(y[4 * j + 1]) + np.int32(y[4 * j + 2])
                               + np.int32(y[4 * j + 3]))
                for k in range(GROUP):
                    for j in range(4):
                        lo = np.int32(0)
                        hi = np.int32(0)
                        for u in range(4):
                            c = qg[b, k, 4 * j + u]
                            lo += np.int32(c & LOW) * np.int32(y[4 * j + u])
                            hi += np.int32(c >> SHIFT) * np.int32(y[16 + 4 * j + u])
                        lanes[k, j] = lo - off * ysum[j]
                        lanes[k, 4 + j] = hi - off * ysum[4 + j]
                for k in range(GROUP):
                    dd = _f32(dg[b, k]) * xd[n, b]
                    for j in range(LANES):
                        acc[k, j] = acc[k, j] + dd * np.float32(lanes[k, j])
                    if off == 0:
                        summs[k] = summs[k] + _f32(mg[b, k]) * xs[n, b]
            for k in range(min(GROUP, n_rows - g * GROUP)):
                out[n, g * GROUP + k] = _hsum(acc, k) + summs[k] if off == 0 else _hsum(acc, k)


@numba.njit(**FLAGS)
def _int8_groups(qs, d, qx, xd, out, g0, g1):
    """out[n, r] for the rows of groups g0 … g1 − 1 of Q8_0: qs (G, n_blocks, 4, 32) int8, d (G, n_blocks, 4, 1)
    float16 bits."""
    n_blocks, n_rows = qs.shape[1], out.shape[1]
    lanes = np.empty((GROUP, LANES), np.int32)
    acc = np.empty((GROUP, LANES), np.float32)
    for g in range(g0, g1):
        qg, dg = qs[g], d[g]
        for n in range(qx.shape[0]):
            acc[:] = 0.0
            for b in range(n_blocks):
                y = qx[n, b]
                for k in range(GROUP):
                    for j in range(LANES):
                        s = np.int32(0)
                        for u in range(4):
                            s += np.int32(qg[b, k, 4 * j + u]) * np.int32(y[4 * j + u])
                        lanes[k, j] = s
                for k in range(GROUP):
                    dd = _f32(dg[b, k, 0]) * xd[n, b]
                    for j in range(LANES):
                        acc[k, j] = acc[k, j] + dd * np.float32(lanes[k, j])
            for k in range(min(GROUP, n_rows - g * GROUP)):
                out[n, g * GROUP + k] = _hsum(acc, k)


@numba.njit(parallel=True, **FLAGS)
def _nibbles_parallel(qs, d, m, off, qx, xd, xs, out, chunks):
    step = -(-qs.shape[0] // chunks)
    for c in prange(chunks):
        _nibbles_groups(qs, d, m, off, qx, xd, xs, out, c * step, min(qs.shape[0], (c + 1) * step))


@numba.njit(parallel=True, **FLAGS)
def _int8_parallel(qs, d, qx, xd, out, chunks):
    step = -(-qs.shape[0] // chunks)
    for c in prange(chunks):
        _int8_groups(qs, d, qx, xd, out, c * step, min(qs.shape[0], (c + 1) * step))


def quantize(x):
    """(qx, xd, xs) of x (N, d_in) float32 C-contiguous: :func:`quantize_blocks` into new arrays."""
    n_blocks = x.shape[1] // QK
    qx = np.empty((x.shape[0], n_blocks, QK), np.int8)                 # (N, n_blocks, 32)
    xd = np.empty((x.shape[0], n_blocks), np.float32)                  # (N, n_blocks)
    xs = np.empty((x.shape[0], n_blocks), np.float32)                  # (N, n_blocks)
    quantize_blocks(x, qx, xd, xs)
    return qx, xd, xs


def matmul(qtype: str, qs, d, m, x, out, threads: int = 1) -> None:
    """out (N, R) = x (N, d_in) times the rows of a Q4_0, Q4_1 or Q8_0 weight in grouped planes (d and m as
    float16 bits), x rounded to 8 bits per block first; over ``threads`` of numba's threads (1: the calling
    thread). Each output is one row's and one token's sum: neither the thread count nor N changes it."""
    qx, xd, xs = quantize(x)
    groups = qs.shape[0]
    if qtype == "Q8_0":
        if threads > 1:
            _int8_parallel(qs, d, qx, xd, out, threads)
        else:
            _int8_groups(qs, d, qx, xd, out, 0, groups)
        return
    off = np.int32(8 if qtype == "Q4_0" else 0)
    m = d if m is None else m                                     # Q4_0 has no minima (never read: off 8)
    if threads > 1:
        _nibbles_parallel(qs, d, m, off, qx, xd, xs, out, threads)
    else:
        _nibbles_groups(qs, d, m, off, qx, xd, xs, out, 0, groups)
