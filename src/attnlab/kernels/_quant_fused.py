"""The quantized matrix-vector kernels (numba, the optional extra ``attnlab[fast]``): dequantize a block and
multiply it in one pass, rows in parallel.

The weights arrive as planes laid out for these kernels (:class:`attnlab.kernels.quantized.QuantizedMatrix`
builds them from the GGUF bytes): rows in groups of GROUP = 4, each block's values of the group's rows side
by side, ``qs`` (G, n_blocks, 4, bytes), and their float16 scales ``d`` and minima ``m`` (G, n_blocks, 4), as
the file holds them (converted to float32 in the kernel, exactly). A
product then reads memory in one sequential stream (four rows read side by side from their own places in a
row-major layout ran at 5 GB/s from DRAM on an AVX-512 EPYC, the grouped planes at 15 GB/s).

The values are those ``gguf.quants`` rebuilds, ``d·(q − off) + m`` (Q4_0: off 8, no m; Q4_1: off 0; Q8_0:
``q·d``, q int8): the dequantizing kernels rebuild them bit for bit (float32, the same operations, no
contraction into FMAs). A 4-bit block's 16 bytes hold its values 0–15 in their low nibbles and 16–31 in their
high ones, as ``gguf.quants`` unpacks them (the tests hold the kernels to ``gguf.quants.dequantize``).

The products take each block's scale and minimum out of its sum, Σ_t x_t·w_t = d·Σ_t x_t·q_t + (m − off·d)·Σ_t x_t
(the same values, rounded in another order), written so that LLVM vectorises them:

- the nibbles are masked and shifted as ``uint8`` (numba would widen them to 64-bit integers, 8 to a vector);
- the sum over a block runs in a small accumulator, one lane per position in the block
  (``acc[k, t] += d·(x_t·q_t + x_{t+16}·q_{t+16})``), reduced once per row, not once per block;
- the four rows of a group share each load of x (one row at a time: 2.4× slower per weight);
- the minima's term is a separate dot over the blocks with ``xs``, x summed per block once per call
  (inside the kernel: one numba call per product).

Compiled ``nogil=True`` and ``cache=True`` (kept in ``__pycache__``; a second process compiles nothing). The
groups run on the calling thread or split over numba's threads (``parallel=True``, one range of groups per
thread): :func:`attnlab.kernels.quantized.kernel_threads` says which: one by rule, numba's where ``attnlab
tune`` measured them faster here. (On a 2-core EPYC shared with other work, numba's OpenMP threads can make a
product 10x slower than one thread: they spin while they wait.)
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

PREFETCH_BYTES = 4096   # the values are prefetched this far ahead (a decode step streams them from memory;
#                         _q8_fused.PREFETCH_BYTES says what it gained there)
MAX_TOKENS = 8      # up to this many tokens per product run the fused kernel; more: dequantize, then BLAS
GROUP = 4           # rows whose blocks lie side by side: the kernels below are written out for four rows
FLAGS = dict(nogil=True, cache=True, boundscheck=False)
SUM = dict(FLAGS, fastmath={"reassoc", "nsz", "contract"})    # sums in any order, multiply-adds fused
EXACT = dict(FLAGS, fastmath={"nsz"})                         # the dequantized values: gguf's own roundings
LOW, SHIFT = np.uint8(15), np.uint8(4)
ZERO, ONE, EIGHT = np.float32(0.0), np.float32(1.0), np.float32(8.0)


@intrinsic
def _prefetch(typingctx, ary, offset):
    """A prefetch (read, all caches) of element ``offset`` of the C-contiguous array ``ary``: a hint, which
    never faults (an address past the end included) and changes no result."""
    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(builder.gep(data, [args[1]]), i8p), ir.Constant(i32, 0),
                          ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.void(ary, offset), codegen


@intrinsic
def _half(typingctx, bits):
    """The float16 whose bits are ``bits`` (uint16) as float32, exactly (LLVM's fpext: F16C's vcvtph2ps on
    x86; numba has no float16 type, so the scales travel as their bits)."""
    if bits != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.uint16), codegen


def _f32(scale):
    """A scale as float32: a float16's bits (uint16) converted, a float32 (the K-quants' scales) as it is."""


@overload(_f32, inline="always")
def _f32_impl(scale):
    if scale == types.uint16:
        return lambda scale: _half(scale)
    if scale == types.float32:
        return lambda scale: scale


@numba.njit(inline="always", **FLAGS)
def _low(byte):
    """The low nibble of a byte as float32 (masked as uint8: numba would widen it to a 64-bit integer)."""
    return np.float32(np.uint8(byte & LOW))


@numba.njit(inline="always", **FLAGS)
def _high(byte):
    """The high nibble of a byte as float32."""
    return np.float32(np.uint8(byte >> SHIFT))


@numba.njit(**SUM)
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


@numba.njit(**SUM)
def _nibbles_groups(qs, d, m, m_scale, off, x, out, g0, g1):
    """out[n, r] = Σ_i x[n, i]·w[r, i] for the rows of groups g0 … g1 − 1 of a 4-bit type: qs (G, n_blocks, 4,
    16) bytes, d and m (G, n_blocks, 4), w = d·(q − off) + m_scale·m; x (N, n_blocks·32), out (N, R) (a last
    group's rows past R are padding, not written)."""
    n_blocks, n_rows = qs.shape[1], out.shape[1]
    xs = _block_sums(x, n_blocks)                            # (N, n_blocks) x summed over each block
    acc = np.empty((GROUP, 16), np.float32)                  # (rows, lanes): one lane per byte of a block
    tail = np.empty(GROUP, np.float32)                       # (rows,) the minima's terms
    for g in range(g0, g1):
        qg, dg, mg = qs[g], d[g], m[g]                          # (n_blocks, 4, 16), (n_blocks, 4) x 2
        for n in range(x.shape[0]):
            xn = x[n]
            acc[:] = 0.0
            for b in range(n_blocks):
                _prefetch(qs, (g * n_blocks + b) * (GROUP * 16) + PREFETCH_BYTES)
                d0, d1, d2, d3 = _f32(dg[b, 0]), _f32(dg[b, 1]), _f32(dg[b, 2]), _f32(dg[b, 3])
                for t in range(16):
                    lo, hi = xn[b * 32 + t], xn[b * 32 + 16 + t]
                    c0, c1, c2, c3 = qg[b, 0, t], qg[b, 1, t], qg[b, 2, t], qg[b, 3, t]
                    acc[0, t] += d0 * (lo * _low(c0) + hi * _high(c0))
                    acc[1, t] += d1 * (lo * _low(c1) + hi * _high(c1))
                    acc[2, t] += d2 * (lo * _low(c2) + hi * _high(c2))
                    acc[3, t] += d3 * (lo * _low(c3) + hi * _high(c3))
            tail[:] = 0.0
            for b in range(n_blocks):                           # Σ_b (m_scale·m_b − off·d_b)·xs_b, a lane per row
                for k in range(GROUP):
                    tail[k] += (m_scale * _f32(mg[b, k]) - off * _f32(dg[b, k])) * xs[n, b]
            for k in range(min(GROUP, n_rows - g * GROUP)):
                out[n, g * GROUP + k] = acc[k].sum() + tail[k]


@numba.njit(**SUM)
def _int8_groups(qs, d, x, out, g0, g1):
    """out[n, r] = Σ_i x[n, i]·w[r, i] for the rows of groups g0 … g1 − 1 of int8 values in blocks of 32:
    qs (G, n_blocks, 4, 32) int8, d (G, n_blocks, 4, S) a scale per 32 / S values (Q8_0: S = 1, its float16
    bits; Q6_K: S = 2, float32), w = q·d."""
    n_blocks, n_rows, last = qs.shape[1], out.shape[1], d.shape[3] - 1
    acc = np.empty((GROUP, 32), np.float32)                  # (rows, lanes)
    for g in range(g0, g1):
        qg, dg = qs[g], d[g]
        for n in range(x.shape[0]):
            xn = x[n]
            acc[:] = 0.0
            for b in range(n_blocks):
                _prefetch(qs, (g * n_blocks + b) * (GROUP * 32) + PREFETCH_BYTES)
                d0, d1, d2, d3 = _f32(dg[b, 0, 0]), _f32(dg[b, 1, 0]), _f32(dg[b, 2, 0]), _f32(dg[b, 3, 0])
                if last == 0:                                   # one scale per block (Q8_0): one pass of 32
                    for t in range(32):
                        xt = xn[b * 32 + t]
                        acc[0, t] += d0 * (xt * np.float32(qg[b, 0, t]))
                        acc[1, t] += d1 * (xt * np.float32(qg[b, 1, t]))
                        acc[2, t] += d2 * (xt * np.float32(qg[b, 2, t]))
                        acc[3, t] += d3 * (xt * np.float32(qg[b, 3, t]))
                    continue
                for t in range(16):                             # the block's first half: its first scale
                    xt = xn[b * 32 + t]
                    acc[0, t] += d0 * (xt * np.float32(qg[b, 0, t]))
                    acc[1, t] += d1 * (xt * np.float32(qg[b, 1, t]))
                    acc[2, t] += d2 * (xt * np.float32(qg[b, 2, t]))
                    acc[3, t] += d3 * (xt * np.float32(qg[b, 3, t]))
                d0, d1, d2, d3 = (_f32(dg[b, 0, last]), _f32(dg[b, 1, last]), _f32(dg[b, 2, last]),
                                  _f32(dg[b, 3, last]))
                for t in range(16, 32):                         # its second half: its last scale
                    xt = xn[b * 32 + t]
                    acc[0, t] += d0 * (xt * np.float32(qg[b, 0, t]))
                    acc[1, t] += d1 * (xt * np.float32(qg[b, 1, t]))
                    acc[2, t] += d2 * (xt * np.float32(qg[b, 2, t]))
                    acc[3, t] += d3 * (xt * np.float32(qg[b, 3, t]))
            for k in range(min(GROUP, n_rows - g * GROUP)):
                out[n, g * GROUP + k] = acc[k].sum()


@numba.njit(parallel=True, **SUM)
def _nibbles_parallel(qs, d, m, m_scale, off, x, out, chunks):
    """:func:`_nibbles_groups` over ``chunks`` ranges of groups on numba's threads."""
    step = -(-qs.shape[0] // chunks)
    for c in prange(chunks):
        _nibbles_groups(qs, d, m, m_scale, off, x, out, c * step, min(qs.shape[0], (c + 1) * step))


@numba.njit(parallel=True, **SUM)
def _int8_parallel(qs, d, x, out, chunks):
    step = -(-qs.shape[0] // chunks)
    for c in prange(chunks):
        _int8_groups(qs, d, x, out, c * step, min(qs.shape[0], (c + 1) * step))


@numba.njit(**EXACT)
def _nibbles_dequantize(qs, d, m, m_scale, off, rows, w):
    """w (len(rows), n_blocks·32) float32 = the values of ``rows``, d·(q − off) + m_scale·m, as
    ``gguf.quants`` rebuilds them. On the calling thread: BLAS multiplies the result on every core next, and
    numba's threads, spinning after a parallel region, would take cores from BLAS's (a 512-token prefill ran
    1.8x slower)."""
    n_blocks = qs.shape[1]
    for i in range(rows.shape[0]):
        g, k = rows[i] // GROUP, rows[i] % GROUP
        for b in range(n_blocks):
            db, mb, base = _f32(d[g, b, k]), m_scale * _f32(m[g, b, k]), b * 32
            for t in range(16):
                byte = qs[g, b, k, t]
                w[i, base + t] = db * (_low(byte) - off) + mb
                w[i, base + 16 + t] = db * (_high(byte) - off) + mb


@numba.njit(**EXACT)
def _int8_dequantize(qs, d, rows, w):
    n_blocks, last = qs.shape[1], d.shape[3] - 1
    for i in range(rows.shape[0]):
        g, k = rows[i] // GROUP, rows[i] % GROUP
        for b in range(n_blocks):
            lo, hi = _f32(d[g, b, k, 0]), _f32(d[g, b, k, last])
            for t in range(16):
                w[i, b * 32 + t] = np.float32(qs[g, b, k, t]) * lo
                w[i, b * 32 + 16 + t] = np.float32(qs[g, b, k, 16 + t]) * hi


def _bits(plane):
    """A float16 plane's bits (uint16, a view), as the kernels take it; uint16, float32 and None as they are."""
    return plane.view(np.uint16) if plane is not None and plane.dtype == np.float16 else plane


def _nibble_args(qtype: str, d, m):
    """(m, m_scale, off): Q4_0 w = d·(q − 8) (no minima: d stands in for m, scaled by 0); Q4_1 and Q4_K
    (its 32-value sub-blocks, m the negated minimum) w = d·q + m."""
    if qtype == "Q4_0":
        return d, ZERO, EIGHT
    return m, ONE, ZERO


def matvec(qtype: str, qs, d, m, x, out, threads: int = 1) -> None:
    """out (N, R) = x (N, d_in) times the rows (R, d_in) of a quantized weight in grouped planes (d and m
    float16), N <= MAX_TOKENS, over ``threads`` of numba's threads (1: on the calling thread, no parallel
    region)."""
    groups = qs.shape[0]
    if d.dtype == np.float16:
        d, m = _bits(d), _bits(m)
    if qtype in ("Q8_0", "Q6_K"):
        if threads > 1:
            _int8_parallel(qs, d, x, out, threads)
        else:
            _int8_groups(qs, d, x, out, 0, groups)
        return
    m, m_scale, off = _nibble_args(qtype, d, m)
    if threads > 1:
        _nibbles_parallel(qs, d, m, m_scale, off, x, out, threads)
    else:
        _nibbles_groups(qs, d, m, m_scale, off, x, out, 0, groups)


def dequantize(qtype: str, qs, d, m, rows, w) -> None:
    """w (len(rows), d_in) float32 = the rows ``rows`` (int64) of a quantized weight in grouped planes."""
    d, m = _bits(d), _bits(m)
    if qtype in ("Q8_0", "Q6_K"):
        _int8_dequantize(qs, d, rows, w)
    else:
        _nibbles_dequantize(qs, d, *_nibble_args(qtype, d, m), rows, w)
