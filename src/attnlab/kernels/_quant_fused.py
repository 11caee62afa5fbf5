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
(the same values, rounded in another order). The 4-bit types' loop over a group's blocks is written as LLVM
vector IR (:func:`_nibbles_group`, a numba intrinsic), so that its accumulators stay in registers (numba's own
loop kept them in memory: a load and a store per block and row):

- one 64-byte load holds a block of the group's four rows; its nibbles are masked and shifted as bytes, then
  widened to float32, 16 lanes at a time (one 512-bit register where the CPU has AVX-512, two of 256 bits
  otherwise);
- the sum over a block runs in a small accumulator, one lane per position in the block
  (``acc[k, t] += d·(x_t·q_t + x_{t+16}·q_{t+16})``, fused multiply-adds), reduced once per row, not once
  per block;
- the four rows of a group share each load of x (one row at a time: 2.4× slower per weight);
- the minima's term is a separate sum over the blocks with ``xs``, x summed per block once per call;
- the values are prefetched PREFETCH_BYTES ahead (a cycled stream of 60 Q4_1 weights of 3,072 × 576 ran at
  4.3–5.5 G weights/s with numba's loop, 6.8–8.1 with this one; 2-core Xeon, loaded).

The int8 types (Q8_0, Q6_K) run the same kind of loop (:func:`_int8_intrinsic`: a block's two halves of 16
lanes a row, each with its scale; a 1,536 × 576 Q8_0 product from L2 at 5.4–9.2 G weights/s with numba's
loop, 9.2–11.7 with this one, alternating processes, loaded).

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

from ._numba_load import call

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


I8, I32, F32 = ir.IntType(8), ir.IntType(32), ir.FloatType()


def _vec(ty, values):
    return ir.Constant(ir.VectorType(ty, len(values)), list(values))


def _fma(builder, a, b, c):
    """a·b + c, one rounding (``llvm.fma``: vfmadd where the CPU has FMA)."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(a.type, [a.type] * 3),
                                        f"llvm.fma.v{a.type.count}f32")
    return builder.call(fn, [a, b, c])


def _next_block(builder, b, updates, nb, loop, done):
    """The block loop's back edge: b + 1, each phi of ``updates`` ((phi, its value after this block) pairs) fed
    from here, and the branch back to ``loop`` while b + 1 < nb (else to ``done``)."""
    b_next = builder.add(b, ir.Constant(b.type, 1))
    here = builder.basic_block
    b.add_incoming(b_next, here)
    for phi, value in updates:
        phi.add_incoming(value, here)
    builder.cbranch(builder.icmp_signed("<", b_next, nb), loop, done)


def _scales(builder, ptr, ty, n=GROUP):
    """<n x float> of n scales at ``ptr``: float16 bits widened exactly, or float32 as they are."""
    if ty == types.uint16:
        bits = builder.load(builder.bitcast(ptr, ir.VectorType(ir.IntType(16), n).as_pointer()), align=1)
        return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), n)), ir.VectorType(F32, n))
    return builder.load(builder.bitcast(ptr, ir.VectorType(F32, n).as_pointer()), align=1)


def _prefetch_ir(builder, base, offset):
    """A prefetch (read, all caches) of the element ``offset`` after the pointer ``base``."""
    fnty = ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
    builder.call(fn, [builder.bitcast(builder.gep(base, [offset]), I8.as_pointer()), ir.Constant(I32, 0),
                      ir.Constant(I32, 3), ir.Constant(I32, 1)])


def _sum_rows(builder, rows):
    """<4 x float>: each of four rows' <16 x float> lanes summed (a tree of adds), the rows side by side."""
    halves = [builder.fadd(builder.shuffle_vector(a, a, _vec(I32, range(8))),
                           builder.shuffle_vector(a, a, _vec(I32, range(8, 16)))) for a in rows]      # <8 x float>
    quads = [builder.fadd(builder.shuffle_vector(h, h, _vec(I32, range(4))),
                          builder.shuffle_vector(h, h, _vec(I32, range(4, 8)))) for h in halves]     # <4 x float>
    both = builder.shuffle_vector(builder.shuffle_vector(quads[0], quads[1], _vec(I32, range(8))),
                                  builder.shuffle_vector(quads[2], quads[3], _vec(I32, range(8))),
                                  _vec(I32, range(16)))                                              # <16 x float>
    col = [builder.shuffle_vector(both, both, _vec(I32, [4 * k + j for k in range(GROUP)])) for j in range(4)]
    return builder.fadd(builder.fadd(col[0], col[2]), builder.fadd(col[1], col[3]))


@intrinsic
def _nibbles_group(typingctx, qs, q_at, d, m, dm_at, x, x_at, xs, xs_at, n_blocks, m_scale, off, res, res_at):
    """One group of GROUP rows of a 4-bit type against one token, every block, in one loop whose accumulators
    stay in registers: per row k, lane t of 16, acc_k,t += d_k·(x_t·q_t + x_{t+16}·q_{t+16}) (fused
    multiply-adds), and tail_k += (m_scale·m_k − off·d_k)·xs_b; then res[res_at + k] = Σ_t acc_k,t + tail_k.
    ``qs`` from element ``q_at`` (GROUP rows' 16 bytes a block), ``d`` and ``m`` (float16 bits or float32) from
    ``dm_at`` (GROUP a block), ``x`` from ``x_at`` (32 a block), ``xs`` (x's block sums) from ``xs_at``."""
    def codegen(context, builder, signature, args):
        qs_v, q_at_v, d_v, m_v, dm_at_v, x_v, x_at_v, xs_v, xs_at_v, nb_v, ms_v, off_v, res_v, res_at_v = args
        t = signature.args
        i64 = q_at_v.type

        def ptr(i, ary, at):
            return builder.gep(context.make_array(t[i])(context, builder, ary).data, [at])

        q_p, d_p, m_p = ptr(0, qs_v, q_at_v), ptr(2, d_v, dm_at_v), ptr(3, m_v, dm_at_v)
        x_p, xs_p = ptr(5, x_v, x_at_v), ptr(7, xs_v, xs_at_v)
        v16, v4 = ir.VectorType(F32, 16), ir.VectorType(F32, GROUP)

        def splat(value, n):
            one = builder.insert_element(ir.Constant(ir.VectorType(value.type, n), ir.Undefined), value,
                                         ir.Constant(I32, 0))
            return builder.shuffle_vector(one, one, _vec(I32, [0] * n))

        entry = builder.basic_block
        loop, done = builder.append_basic_block("exact.blocks"), builder.append_basic_block("exact.done")
        builder.branch(loop)
        builder.position_at_end(loop)
        b = builder.phi(i64)
        accs = [builder.phi(v16) for _ in range(GROUP)]
        tail = builder.phi(v4)
        b.add_incoming(ir.Constant(i64, 0), entry)
        for a in accs:
            a.add_incoming(ir.Constant(v16, [0.0] * 16), entry)
        tail.add_incoming(ir.Constant(v4, [0.0] * GROUP), entry)

        q_b = builder.mul(b, ir.Constant(i64, GROUP * 16))
        _prefetch_ir(builder, q_p, builder.add(q_b, ir.Constant(i64, PREFETCH_BYTES)))
        packed = builder.load(builder.bitcast(builder.gep(q_p, [q_b]), ir.VectorType(I8, 64).as_pointer()), align=1)
        low, high = builder.and_(packed, _vec(I8, [15] * 64)), builder.lshr(packed, _vec(I8, [4] * 64))
        x_b = builder.gep(x_p, [builder.mul(b, ir.Constant(i64, 32))])
        x_lo = builder.load(builder.bitcast(x_b, v16.as_pointer()), align=1)
        x_hi = builder.load(builder.bitcast(builder.gep(x_b, [ir.Constant(i64, 16)]), v16.as_pointer()), align=1)
        dm_b = builder.mul(b, ir.Constant(i64, GROUP))
        d4 = _scales(builder, builder.gep(d_p, [dm_b]), t[2].dtype)
        m4 = _scales(builder, builder.gep(m_p, [dm_b]), t[3].dtype)
        new = []
        for k in range(GROUP):
            q_lo = builder.uitofp(builder.shuffle_vector(low, low, _vec(I32, range(16 * k, 16 * k + 16))), v16)
            q_hi = builder.uitofp(builder.shuffle_vector(high, high, _vec(I32, range(16 * k, 16 * k + 16))), v16)
            dot = _fma(builder, x_hi, q_hi, builder.fmul(x_lo, q_lo))
            d_k = builder.shuffle_vector(d4, d4, _vec(I32, [k] * 16))
            new.append(_fma(builder, d_k, dot, accs[k]))
        term = builder.fsub(builder.fmul(splat(ms_v, GROUP), m4), builder.fmul(splat(off_v, GROUP), d4))
        new_tail = _fma(builder, term, splat(builder.load(builder.gep(xs_p, [b])), GROUP), tail)
        nb = builder.sext(nb_v, i64) if nb_v.type != i64 else nb_v
        _next_block(builder, b, [*zip(accs, new), (tail, new_tail)], nb, loop, done)

        builder.position_at_end(done)
        total = builder.fadd(_sum_rows(builder, new), new_tail)
        builder.store(total, builder.bitcast(ptr(12, res_v, res_at_v), v4.as_pointer()), align=4)
        return context.get_dummy_value()
    return types.void(qs, q_at, d, m, dm_at, x, x_at, xs, xs_at, n_blocks, m_scale, off, res, res_at), codegen



def _int8_intrinsic(scales: int):
    """An intrinsic ``(qs, q_at, d, d_at, x, x_at, n_blocks, res, res_at)``: :func:`_nibbles_group` for int8
    values in blocks of 32 with ``scales`` scales a block (Q8_0: 1, Q6_K: 2, one per 16 values): per row k, the
    block's two halves in two 16-lane accumulators, acc += d·(x·q) (a multiply, then a fused multiply-add), d
    the row's first scale for the first half and its last for the second (``d`` float16 bits or float32, GROUP
    × ``scales`` a block from element ``d_at``); then res[res_at + k] = the sum of its 32 lanes."""
    @intrinsic
    def group(typingctx, qs, q_at, d, d_at, x, x_at, n_blocks, res, res_at):
        def codegen(context, builder, signature, args):
            qs_v, q_at_v, d_v, d_at_v, x_v, x_at_v, nb_v, res_v, res_at_v = args
            t = signature.args
            i64 = q_at_v.type

            def ptr(i, ary, at):
                return builder.gep(context.make_array(t[i])(context, builder, ary).data, [at])

            q_p, d_p, x_p = ptr(0, qs_v, q_at_v), ptr(2, d_v, d_at_v), ptr(4, x_v, x_at_v)
            v16 = ir.VectorType(F32, 16)
            entry = builder.basic_block
            loop, done = builder.append_basic_block("int8.blocks"), builder.append_basic_block("int8.done")
            builder.branch(loop)
            builder.position_at_end(loop)
            b = builder.phi(i64)
            accs = [builder.phi(v16) for _ in range(2 * GROUP)]          # row k's halves at 2k, 2k + 1
            b.add_incoming(ir.Constant(i64, 0), entry)
            for a in accs:
                a.add_incoming(ir.Constant(v16, [0.0] * 16), entry)
            q_b = builder.mul(b, ir.Constant(i64, GROUP * 32))
            _prefetch_ir(builder, q_p, builder.add(q_b, ir.Constant(i64, PREFETCH_BYTES)))
            x_b = builder.gep(x_p, [builder.mul(b, ir.Constant(i64, 32))])
            xh = [builder.load(builder.bitcast(builder.gep(x_b, [ir.Constant(i64, 16 * h)]), v16.as_pointer()),
                               align=1) for h in (0, 1)]
            d_b = _scales(builder, builder.gep(d_p, [builder.mul(b, ir.Constant(i64, GROUP * scales))]), t[2].dtype,
                          GROUP * scales)
            new = []
            for k in range(GROUP):
                row = builder.load(builder.bitcast(builder.gep(q_p, [builder.add(q_b, ir.Constant(i64, 32 * k))]),
                                                   ir.VectorType(I8, 32).as_pointer()), align=1)
                for h in (0, 1):
                    q = builder.sitofp(builder.shuffle_vector(row, row, _vec(I32, range(16 * h, 16 * h + 16))), v16)
                    d_kh = builder.shuffle_vector(d_b, d_b, _vec(I32, [k * scales + (scales - 1) * h] * 16))
                    new.append(_fma(builder, d_kh, builder.fmul(xh[h], q), accs[2 * k + h]))
            nb = builder.sext(nb_v, i64) if nb_v.type != i64 else nb_v
            _next_block(builder, b, zip(accs, new), nb, loop, done)

            builder.position_at_end(done)
            total = _sum_rows(builder, [builder.fadd(new[2 * k], new[2 * k + 1]) for k in range(GROUP)])
            builder.store(total, builder.bitcast(ptr(7, res_v, res_at_v), ir.VectorType(F32, GROUP).as_pointer()),
                          align=4)
            return context.get_dummy_value()
        return types.void(qs, q_at, d, d_at, x, x_at, n_blocks, res, res_at), codegen
    return group


_int8_one_scale, _int8_two_scales = _int8_intrinsic(1), _int8_intrinsic(2)


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
    group's rows past R are padding, not written): :func:`_nibbles_group` for each group and token."""
    n_blocks, n_rows = qs.shape[1], out.shape[1]
    xs = _block_sums(x, n_blocks)                            # (N, n_blocks) x summed over each block
    last = np.empty(GROUP, np.float32)                       # (rows,) a last group's sums, padding rows too
    flat, xf, xsf = out.reshape(-1), x.reshape(-1), xs.reshape(-1)
    for g in range(g0, g1):
        full = (g + 1) * GROUP <= n_rows
        for n in range(x.shape[0]):
            res, at = (flat, n * n_rows + g * GROUP) if full else (last, 0)
            _nibbles_group(qs, g * n_blocks * GROUP * 16, d, m, g * n_blocks * GROUP, xf, n * n_blocks * 32,
                           xsf, n * n_blocks, n_blocks, m_scale, off, res, at)
            if not full:
                out[n, g * GROUP:] = last[:n_rows - g * GROUP]


@numba.njit(**SUM)
def _int8_groups(qs, d, x, out, g0, g1):
    """out[n, r] = Σ_i x[n, i]·w[r, i] for the rows of groups g0 … g1 − 1 of int8 values in blocks of 32:
    qs (G, n_blocks, 4, 32) int8, d (G, n_blocks, 4, S) a scale per 32 / S values (Q8_0: S = 1, its float16
    bits; Q6_K: S = 2, float32), w = q·d: :func:`_int8_intrinsic`'s loop for each group and token."""
    n_blocks, n_rows, scales = qs.shape[1], out.shape[1], d.shape[3]
    last = np.empty(GROUP, np.float32)                       # (rows,) a last group's sums, padding rows too
    flat, xf = out.reshape(-1), x.reshape(-1)
    for g in range(g0, g1):
        full = (g + 1) * GROUP <= n_rows
        for n in range(x.shape[0]):
            res, at = (flat, n * n_rows + g * GROUP) if full else (last, 0)
            if scales == 1:
                _int8_one_scale(qs, g * n_blocks * GROUP * 32, d, g * n_blocks * GROUP, xf, n * n_blocks * 32,
                                n_blocks, res, at)
            else:
                _int8_two_scales(qs, g * n_blocks * GROUP * 32, d, g * n_blocks * GROUP * 2, xf, n * n_blocks * 32,
                                 n_blocks, res, at)
            if not full:
                out[n, g * GROUP:] = last[:n_rows - g * GROUP]


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
            call(_int8_groups, qs, d, x, out, 0, groups)
        return
    m, m_scale, off = _nibble_args(qtype, d, m)
    if threads > 1:
        _nibbles_parallel(qs, d, m, m_scale, off, x, out, threads)
    else:
        call(_nibbles_groups, qs, d, m, m_scale, off, x, out, 0, groups)


def dequantize(qtype: str, qs, d, m, rows, w) -> None:
    """w (len(rows), d_in) float32 = the rows ``rows`` (int64) of a quantized weight in grouped planes."""
    d, m = _bits(d), _bits(m)
    if qtype in ("Q8_0", "Q6_K"):
        call(_int8_dequantize, qs, d, rows, w)
    else:
        call(_nibbles_dequantize, qs, d, *_nibble_args(qtype, d, m), rows, w)
