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
block's bytes of the four rows side by side). numba types integer arithmetic as int64 and LLVM vectorised
none of the plain loops tried, so a row's block is written as LLVM vector IR by an intrinsic
(:func:`_block_intrinsic`): ``vpdpbusd`` on 256-bit registers where the CPU has AVX-VNNI or AVX-512 VNNI
(:func:`vnni_rule`), else plain IR that LLVM lowers to ``vpmaddwd`` and ``vphaddd``. No fastmath: every float
operation rounds as numpy's does, and the integer sums are exact whatever instructions compute them.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ._numba_load import call
from ._quant_fused import GROUP, _f32

FLAGS = dict(nogil=True, cache=True, boundscheck=False)
LANES = 8           # float32 accumulators per row: one 256-bit register, as llama.cpp's AVX2 loop keeps them
QK = 32             # values per block of Q8_0 / Q8_1 (and of the weights' blocks here)


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


I8, I32, F32 = ir.IntType(8), ir.IntType(32), ir.FloatType()


def vnni_rule() -> bool:
    """Whether the kernels call ``vpdpbusd`` (AVX-VNNI or AVX-512 VNNI with VL): numba compiles for this CPU
    (``NUMBA_CPU_NAME`` unset or "host") and LLVM reports either feature here. Else the products are written as
    plain vector IR, which LLVM turns into ``vpmaddwd`` and ``vphaddd`` (AVX2, AVX-512). A rule on the CPU's
    features, never a timing."""
    if numba.config.CPU_NAME not in (None, "host"):
        return False
    features = llvm.get_host_cpu_features()
    return bool(features.get("avxvnni") or (features.get("avx512vnni") and features.get("avx512vl")))


VNNI = vnni_rule()
# LLVM 22 takes vpdpbusd's byte operands as <32 x i8> (llvm-project PR 155194), earlier ones as <8 x i32>
VNNI_BYTES = llvm.llvm_version_info[0] >= 22


def _vec(ty, values):
    return ir.Constant(ir.VectorType(ty, len(values)), list(values))


def _load(context, builder, aryty, ary, offset, vecty):
    """The vector ``vecty`` at element ``offset`` of the C-contiguous array ``ary``."""
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.load(builder.bitcast(builder.gep(data, [offset]), vecty.as_pointer()), align=1)


def _dpbusd(builder, unsigned8, signed8):
    """<8 x i32>: lane j = Σ_{u<4} unsigned8[4j+u] · signed8[4j+u] (bytes as u8 and s8): ``vpdpbusd`` from
    zero where :data:`VNNI`, else the same sums in plain IR (products as i32, then two pairwise adds)."""
    v8 = ir.VectorType(I32, 8)
    if VNNI:
        if VNNI_BYTES:
            args = [unsigned8, signed8]
            fnty = ir.FunctionType(v8, [v8, ir.VectorType(I8, 32), ir.VectorType(I8, 32)])
        else:
            args = [builder.bitcast(unsigned8, v8), builder.bitcast(signed8, v8)]
            fnty = ir.FunctionType(v8, [v8, v8, v8])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.vpdpbusd.256")
        return builder.call(fn, [ir.Constant(v8, [0] * 8), *args])
    wide = ir.VectorType(I32, 32)
    p = builder.mul(builder.zext(unsigned8, wide), builder.sext(signed8, wide))          # <32 x i32>
    for n in (16, 8):                                                                  # pairs, then fours
        even = builder.shuffle_vector(p, p, _vec(I32, range(0, 2 * n, 2)))
        odd = builder.shuffle_vector(p, p, _vec(I32, range(1, 2 * n, 2)))
        p = builder.add(even, odd)
    return p


def _block_lanes(builder, kind, w, y):
    """The eight int32 lanes of one row's block: w the weight's 32 values as bytes in value order (Q4: 0 … 15,
    Q8_0: int8), y the token's 32 int8; Q4_0's values are q − 8: Σ q·y − 8·Σ y per lane."""
    if kind == "Q8_0":                      # s8 · s8 as llama.cpp: |w| (u8) times y with w's sign (|y| <= 127)
        negative = builder.icmp_signed("<", w, _vec(I8, [0] * 32))
        w_abs = builder.select(negative, builder.sub(_vec(I8, [0] * 32), w), w)
        y_signed = builder.select(negative, builder.sub(_vec(I8, [0] * 32), y), y)
        return _dpbusd(builder, w_abs, y_signed)
    lanes = _dpbusd(builder, w, y)
    if kind == "Q4_0":
        y_sums = _dpbusd(builder, _vec(I8, [1] * 32), y)
        lanes = builder.sub(lanes, builder.shl(y_sums, _vec(I32, [3] * 8)))
    return lanes


def _block_intrinsic(kind: str):
    """An intrinsic ``(qs, q_at, y, y_at, acc, acc_at, dd)``: acc[acc_at : acc_at + 8] = acc + dd · float(lanes)
    for the row block of ``qs`` at element ``q_at`` (16 packed bytes, or 32 int8 for Q8_0) and the token block
    of ``y`` at ``y_at`` (32 int8): a multiply, then an add, each rounded (no fused multiply-add)."""
    @intrinsic
    def block(typingctx, qs, q_at, y, y_at, acc, acc_at, dd):
        def codegen(context, builder, signature, args):
            qs_v, q_at_v, y_v, y_at_v, acc_v, acc_at_v, dd_v = args
            qs_t, _, y_t, _, acc_t, _, _ = signature.args
            if kind == "Q8_0":
                w = _load(context, builder, qs_t, qs_v, q_at_v, ir.VectorType(I8, 32))
            else:                            # bytes_from_nibbles_32: low nibbles (values 0–15), then high (16–31)
                packed = _load(context, builder, qs_t, qs_v, q_at_v, ir.VectorType(I8, 16))
                w = builder.shuffle_vector(builder.and_(packed, _vec(I8, [15] * 16)),
                                           builder.lshr(packed, _vec(I8, [4] * 16)), _vec(I32, range(32)))
            y8 = _load(context, builder, y_t, y_v, y_at_v, ir.VectorType(I8, 32))
            lanes = _block_lanes(builder, kind, w, y8)
            vf = ir.VectorType(F32, LANES)
            data = context.make_array(acc_t)(context, builder, acc_v).data
            ptr = builder.bitcast(builder.gep(data, [acc_at_v]), vf.as_pointer())
            splat = builder.insert_element(ir.Constant(vf, ir.Undefined), dd_v, ir.Constant(I32, 0))
            splat = builder.shuffle_vector(splat, splat, _vec(I32, [0] * LANES))
            builder.store(builder.fadd(builder.load(ptr, align=4), builder.fmul(splat, builder.sitofp(lanes, vf))),
                          ptr, align=4)
            return context.get_dummy_value()
        return types.void(qs, q_at, y, y_at, acc, acc_at, dd), codegen
    return block


_q4_0_block, _q4_1_block, _q8_0_block = (_block_intrinsic(k) for k in ("Q4_0", "Q4_1", "Q8_0"))


@numba.njit(inline="always", **FLAGS)
def _hsum(acc, k):
    """llama.cpp's ``hsum_float_8`` of row k's eight accumulators, in its order."""
    return ((acc[k, 0] + acc[k, 4]) + (acc[k, 2] + acc[k, 6])) + ((acc[k, 1] + acc[k, 5]) + (acc[k, 3] + acc[k, 7]))


@numba.njit(**FLAGS)
def _nibbles_groups(qs, d, m, off, qx, xd, xs, out, g0, g1):
    """out[n, r] for the rows of groups g0 … g1 − 1 of a 4-bit type: qs (G, n_blocks, 4, 16) bytes (value t
    in byte t's low nibble, t + 16 in its high one), d and m (G, n_blocks, 4) float16 bits; ``off`` 8: Q4_0
    (w = d·(q − 8), m unused), 0: Q4_1 (w = d·q + m: adds Σ_b m_b·xs_b)."""
    n_blocks, n_rows = qs.shape[1], out.shape[1]
    acc = np.empty((GROUP, LANES), np.float32)
    summs = np.empty(GROUP, np.float32)
    for g in range(g0, g1):
        for n in range(qx.shape[0]):
            acc[:] = 0.0
            summs[:] = 0.0
            for b in range(n_blocks):
                y_at, xdb = (n * n_blocks + b) * QK, xd[n, b]
                for k in range(GROUP):
                    q_at = ((g * n_blocks + b) * GROUP + k) * (QK // 2)
                    if off == 0:
                        _q4_1_block(qs, q_at, qx, y_at, acc, k * LANES, _f32(d[g, b, k]) * xdb)
                        summs[k] = summs[k] + _f32(m[g, b, k]) * xs[n, b]
                    else:
                        _q4_0_block(qs, q_at, qx, y_at, acc, k * LANES, _f32(d[g, b, k]) * xdb)
            for k in range(min(GROUP, n_rows - g * GROUP)):
                out[n, g * GROUP + k] = _hsum(acc, k) + summs[k] if off == 0 else _hsum(acc, k)


@numba.njit(**FLAGS)
def _int8_groups(qs, d, qx, xd, out, g0, g1):
    """out[n, r] for the rows of groups g0 … g1 − 1 of Q8_0: qs (G, n_blocks, 4, 32) int8, d (G, n_blocks, 4, 1)
    float16 bits."""
    n_blocks, n_rows = qs.shape[1], out.shape[1]
    acc = np.empty((GROUP, LANES), np.float32)
    for g in range(g0, g1):
        for n in range(qx.shape[0]):
            acc[:] = 0.0
            for b in range(n_blocks):
                y_at, xdb = (n * n_blocks + b) * QK, xd[n, b]
                for k in range(GROUP):
                    _q8_0_block(qs, ((g * n_blocks + b) * GROUP + k) * QK, qx, y_at, acc, k * LANES,
                                _f32(d[g, b, k, 0]) * xdb)
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
    call(quantize_blocks, x, qx, xd, xs)
    return qx, xd, xs


def matmul(qtype: str, qs, d, m, x, out, threads: int = 1, pool=None) -> None:
    """out (N, R) = x (N, d_in) times the rows of a Q4_0, Q4_1 or Q8_0 weight in grouped planes (d and m as
    float16 bits), x rounded to 8 bits per block first; over ``threads`` of numba's threads (1: the calling
    thread), or with ``pool`` (a ThreadPoolExecutor) over its threads, a range of groups each (the kernels
    release the GIL). Each output is one row's and one token's sum: neither the threads nor N change it."""
    qx, xd, xs = quantize(x)
    groups = qs.shape[0]
    off = np.int32(8 if qtype == "Q4_0" else 0)
    m = d if m is None else m                                     # Q4_0 has no minima (never read: off 8)
    if qtype == "Q8_0":
        serial, parallel, args = _int8_groups, _int8_parallel, (qs, d, qx, xd, out)
    else:
        serial, parallel, args = _nibbles_groups, _nibbles_parallel, (qs, d, m, off, qx, xd, xs, out)
    if pool is not None:
        n = pool._max_workers
        step = -(-groups // n)
        for f in [pool.submit(call, serial, *args, g0, min(groups, g0 + step)) for g0 in range(0, groups, step)]:
            f.result()
    elif threads > 1:
        parallel(*args, threads)
    else:
        call(serial, *args, 0, groups)
