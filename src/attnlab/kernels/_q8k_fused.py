"""The K-quants' 8-bit-activation kernels (numba, the optional extra ``attnlab[fast]``): x rounded to Q8_K, then
integer dot products with Q4_K, Q5_K or Q6_K super-blocks, as llama.cpp's x86 ``ggml_vec_dot_q4_K_q8_K``,
``ggml_vec_dot_q5_K_q8_K`` and ``ggml_vec_dot_q6_K_q8_K`` run them.

:mod:`attnlab.kernels.q8k_activations` says what is computed and holds the numpy reference these kernels are
tested against bit for bit. Here:

- :func:`quantize_k` rounds x (``quantize_row_q8_K``): per super-block of 256, the int8 values, the float32 d
  and the 16 int16 sums;
- a super-block's eight int32 lanes (lane j the values 4j … 4j + 3 of each 32, times their sub-block's
  scale) are LLVM vector IR (:func:`_q4k_block`, :func:`_q6k_block`, numba intrinsics): ``vpdpbusd`` where the
  CPU has VNNI, else plain IR that LLVM lowers to ``vpmaddwd`` (the helper ``_dpbusd`` of
  :mod:`attnlab.kernels._q8_fused`), then ``acc = fma(x.d·d, float(lanes), acc)`` (``llvm.fma``, as llama.cpp's
  ``_mm256_fmadd_ps``) on an 8-float accumulator;
- Q4_K's minima are four more lanes, ``accm_k = fma(−x.d·dmin, float(mn·S), accm_k)`` (S x's sums of 32), in
  numba, and a row's total is llama.cpp's horizontal sum of the eight, plus the four's;
- from 8 tokens on, llama.cpp's tiled GEMM (:func:`_tiled_groups`): per super-block the exact integers s1 and s2
  (:func:`_tiled_block`: a row's values unpacked once for a tile of :data:`TILE` tokens), then
  ``r = float(s1)·d``, ``r = fma(−dmin, float(s2), r)``, ``out = fma(r, x.d, out)``.

No fastmath: every float operation rounds as the reference's does; the integer sums are exact in any order.
Rows are stored in groups of four side by side (:class:`attnlab.kernels.q8k_activations.Q8KActivationMatrix`'s
planes); a product runs on the calling thread, or (a prefill) over the worker pool's threads, a range of
groups each (the kernels release the GIL). Each output is one row's and one token's sum: neither the threads
nor the number of tokens change it.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import _q8_fused, _quant_fused
from ._numba_load import call
from ._q8_fused import _dpbusd, _ptr, _vec, _vload
from ._quant_fused import _half, _prefetch

FLAGS = dict(nogil=True, cache=True, boundscheck=False)
GROUP = _quant_fused.GROUP            # rows side by side in the planes
MAX_TOKENS = _quant_fused.MAX_TOKENS  # up to this many tokens a product runs on the calling thread (a decode step)
QK_K = 256                            # values per super-block
Q6_BYTES = 192                        # a Q6_K row's values per super-block: ql (128 bytes), qh (64)
LANES = 8                             # llama.cpp's int32 lanes (and float32 accumulators) per row
PREFETCH_BYTES = 4096                 # the values are prefetched this far ahead, as _q8_fused's (a hint: no result
#                                       changes; a decode step streams its weights from memory)
I8, I16, I32, F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()


@numba.njit(**FLAGS)
def quantize_k(x, qx, xd, bsums):
    """x (N, n·256) float32 -> qx (N, n, 256) int8, xd (N, n) float32, bsums (N, n, 16) int16: llama.cpp's
    ``quantize_row_q8_K_ref`` (max the first largest |x| with its sign, iscale = −127 / max, q = min(127,
    round-half-even(iscale·x)), d = 1 / iscale; a super-block of zeros gives zeros)."""
    for n in range(x.shape[0]):
        for b in range(qx.shape[1]):
            amax = np.float32(0.0)
            top = np.float32(0.0)
            for t in range(QK_K):
                v = x[n, b * QK_K + t]
                if abs(v) > amax:
                    amax = abs(v)
                    top = v
            if amax == 0:
                qx[n, b, :] = 0
                bsums[n, b, :] = 0
                xd[n, b] = np.float32(0.0)
                continue
            iscale = np.float32(-127.0) / top
            for i in range(QK_K // 16):
                total = 0
                for t in range(16 * i, 16 * i + 16):
                    q = min(np.rint(x[n, b * QK_K + t] * iscale), np.float32(127.0))
                    qx[n, b, t] = np.int32(q)
                    total += np.int32(q)
                bsums[n, b, i] = total
            xd[n, b] = np.float32(1.0) / iscale


def _fma_ir(builder, a, b, c):
    """a·b + c with one rounding (``llvm.fma``): scalars or vectors of float32."""
    name = f"llvm.fma.v{a.type.count}f32" if isinstance(a.type, ir.VectorType) else "llvm.fma.f32"
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(a.type, [a.type] * 3), name)
    return builder.call(fn, [a, b, c])


@intrinsic
def _fma32(typingctx, a, b, c):
    """a·b + c for float32 scalars, one rounding (vfmadd)."""
    if not (a == b == c == types.float32):
        return None

    def codegen(context, builder, signature, args):
        return _fma_ir(builder, *args)
    return types.float32(types.float32, types.float32, types.float32), codegen


def avx2_rule() -> bool:
    """Whether a sub-block's lanes are ``vpmaddubsw`` then ``vpmaddwd`` with its scale (llama.cpp's own two
    instructions; LLVM's ``llvm.x86.avx2.pmadd.*``): the features numba compiles for have AVX2
    (:func:`attnlab.kernels._kernels.numba_features`, the same target every rule on the CPU reads). Else
    ``vpdpbusd`` (or its plain-IR sums) times the scale. A rule on the features, never a timing; the integer
    lanes are the same either way."""
    from ._kernels import numba_features

    return bool(numba_features().get("avx2"))


MADD = avx2_rule()


def _scaled_lanes(builder, w, y, sc16):
    """<8 x i32>: lane j = Σ_{u<4} w[4j+u]·y[4j+u] times the scale of its values (w <32 x u8>, y <32 x s8>,
    ``sc16`` <16 x i16> the scale of each pair of values): :data:`MADD`'s two instructions, or ``vpdpbusd``
    and a multiply. No sum saturates: |w·y| pairs stay within 2·63·127."""
    v16, v8 = ir.VectorType(I16, 16), ir.VectorType(I32, LANES)
    if MADD:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v16, [w.type, y.type]),
                                            "llvm.x86.avx2.pmadd.ub.sw")
        wd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8, [v16, v16]), "llvm.x86.avx2.pmadd.wd")
        return builder.call(wd, [builder.call(fn, [w, y]), sc16])
    sc = builder.sext(builder.shuffle_vector(sc16, sc16, _vec(I32, range(0, 16, 2))), v8)
    return builder.mul(_dpbusd(builder, w, y), sc)


def _splat(builder, value, n):
    vec = ir.VectorType(value.type, n)
    one = builder.insert_element(ir.Constant(vec, ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(one, one, _vec(I32, [0] * n))


def _accumulate(context, builder, acc_ty, acc, acc_at, scale, sumi):
    """acc[at:at + 8] = fma(scale, float(sumi), acc[at:at + 8]) for the float32 array ``acc``."""
    vf = ir.VectorType(F32, LANES)
    p = builder.bitcast(_ptr(context, builder, acc_ty, acc, acc_at), vf.as_pointer())
    builder.store(_fma_ir(builder, _splat(builder, scale, LANES), builder.sitofp(sumi, vf),
                          builder.load(p, align=4)), p, align=4)


def _nibble_chunks(builder, q_p, sc16, five):
    """A Q4_K or Q5_K super-block's eight chunks of 32 values in value order (chunk c = 2j + h: byte t of the
    32 at 32j gives value 64j + 32h + t), each (w <32 x i8>, its sub-block's scale <16 x i16>): the 4-bit
    values from the 128 bytes of nibbles at ``q_p``, Q5_K's (``five``) plus 16 times bit c of the byte 128 + t;
    ``sc16`` the 16 scales and minima as i16."""
    v32, i64 = ir.VectorType(I8, 32), ir.IntType(64)
    high = _vload(builder, q_p, ir.Constant(i64, QK_K // 2), v32) if five else None
    chunks = []
    for j in range(QK_K // 64):                                   # 32 bytes: values 64j + t (low), + 32 (high)
        bits = _vload(builder, q_p, ir.Constant(i64, 32 * j), v32)
        halves = (builder.and_(bits, _vec(I8, [15] * 32)), builder.lshr(bits, _vec(I8, [4] * 32)))
        for h, w in enumerate(halves):
            if five:                                              # + 16 · bit 2j + h of qh[t]
                bit = builder.and_(builder.lshr(high, _vec(I8, [2 * j + h] * 32)), _vec(I8, [1] * 32))
                w = builder.or_(w, builder.shl(bit, _vec(I8, [4] * 32)))
            chunks.append((w, builder.shuffle_vector(sc16, sc16, _vec(I32, [2 * j + h] * 16))))
    return chunks


def _q6_chunks(builder, q_p, scales16):
    """A Q6_K super-block's eight chunks of 32 values (chunk c = 4h + k, as ``dequantize_row_q6_K``'s value
    order), each (w <32 x i8> the 6-bit values, the scales of its two sub-blocks <16 x i16>): low 4 bits from the
    128 bytes at ``q_p``, high 2 from the 64 after them, unpacked as llama.cpp's AVX2 loop does."""
    v32, i64 = ir.VectorType(I8, 32), ir.IntType(64)
    m4, m3 = _vec(I8, [15] * 32), _vec(I8, [3] * 32)
    chunks = []
    for c in range(QK_K // 32):
        h, k = divmod(c, 4)
        low = _vload(builder, q_p, ir.Constant(i64, 64 * h + 32 * (k % 2)), v32)
        high = _vload(builder, q_p, ir.Constant(i64, QK_K // 2 + 32 * h), v32)
        nib = builder.and_(builder.lshr(low, _vec(I8, [4 * (k // 2)] * 32)), m4)
        top = builder.shl(builder.and_(builder.lshr(high, _vec(I8, [2 * k] * 32)), m3), _vec(I8, [4] * 32))
        chunks.append((builder.or_(nib, top),
                       builder.shuffle_vector(scales16, scales16, _vec(I32, [2 * c] * 8 + [2 * c + 1] * 8))))
    return chunks


def _nibbles_block(kind: str):
    """The intrinsic of one Q4_K or Q5_K super-block of a row against one token (``kind``):
    ``(qs, q_at, qx, x_at, sm, s_at, bsums, b_at, scale, dmin, acc, acc_at, accm, accm_at)``.
    ``acc[a:a+8] = fma(scale, float(sumi), acc[a:a+8])`` (a = ``acc_at``), sumi the eight int32 lanes
    Σ_s sc_s · Σ_u w·q (``qs`` from element ``q_at``: 128 bytes of nibbles, Q5_K's 32 bytes of fifth bits after
    them; x's ``qx`` from ``x_at``: 256 int8; sc_0 … sc_7 and mn_0 … mn_7 from element ``s_at`` of ``sm``). The
    minima, with prod_k = mn_2k·S_2k + mn_2k+1·S_2k+1 (S_s x's sum over sub-block s, from its ``bsums`` at
    ``b_at``): Q4_K's four lanes ``accm[m:m+4] = fma(dmin, float(prod), accm[m:m+4])`` (m = ``accm_at``), Q5_K's
    one ``accm[m] = fma(dmin, float(Σ_k prod_k), accm[m])``."""
    five = kind == "Q5_K"

    @intrinsic
    def block(typingctx, qs, q_at, qx, x_at, sm, s_at, bsums, b_at, scale, dmin, acc, acc_at, accm, accm_at):
        def codegen(context, builder, signature, args):
            (qs_v, q_at_v, qx_v, x_at_v, sm_v, s_at_v, bs_v, b_at_v, scale_v, dmin_v, acc_v, acc_at_v, accm_v,
             accm_at_v) = args
            t = signature.args
            q_p = _ptr(context, builder, t[0], qs_v, q_at_v)
            x_p = _ptr(context, builder, t[2], qx_v, x_at_v)
            s_p = _ptr(context, builder, t[4], sm_v, s_at_v)
            b_p = _ptr(context, builder, t[6], bs_v, b_at_v)
            v32 = ir.VectorType(I8, 32)
            sm8 = _vload(builder, s_p, ir.Constant(s_at_v.type, 0), ir.VectorType(I8, 16))   # sc, mn
            sm16 = builder.zext(sm8, ir.VectorType(I32, 16))                            # <16 x i32>
            sc16 = builder.zext(sm8, ir.VectorType(I16, 16))                            # <16 x i16>
            sumi = ir.Constant(ir.VectorType(I32, LANES), [0] * LANES)
            for c, (w, sc) in enumerate(_nibble_chunks(builder, q_p, sc16, five)):
                y = _vload(builder, x_p, ir.Constant(x_at_v.type, 32 * c), v32)
                sumi = builder.add(sumi, _scaled_lanes(builder, w, y, sc))
            _accumulate(context, builder, t[10], acc_v, acc_at_v, scale_v, sumi)
            sums = builder.sext(_vload(builder, b_p, ir.Constant(b_at_v.type, 0), ir.VectorType(I16, 16)),
                                ir.VectorType(I32, 16))                                 # <16 x i32> bsums
            S = builder.add(builder.shuffle_vector(sums, sums, _vec(I32, range(0, 16, 2))),
                            builder.shuffle_vector(sums, sums, _vec(I32, range(1, 16, 2))))   # <8 x i32> sums of 32
            p = builder.mul(builder.shuffle_vector(sm16, sm16, _vec(I32, range(8, 16))), S)    # mn_s · S_s
            prod = builder.add(builder.shuffle_vector(p, p, _vec(I32, range(0, 8, 2))),
                               builder.shuffle_vector(p, p, _vec(I32, range(1, 8, 2))))       # <4 x i32>
            mp = _ptr(context, builder, t[12], accm_v, accm_at_v)
            if five:                                                  # one scalar: Σ_k prod_k, exact
                total = builder.extract_element(prod, ir.Constant(I32, 0))
                for k in range(1, 4):
                    total = builder.add(total, builder.extract_element(prod, ir.Constant(I32, k)))
                builder.store(_fma_ir(builder, dmin_v, builder.sitofp(total, F32), builder.load(mp)), mp)
            else:
                vf4 = ir.VectorType(F32, 4)
                mp = builder.bitcast(mp, vf4.as_pointer())
                builder.store(_fma_ir(builder, _splat(builder, dmin_v, 4), builder.sitofp(prod, vf4),
                                      builder.load(mp, align=4)), mp, align=4)
            return context.get_dummy_value()
        return types.void(qs, q_at, qx, x_at, sm, s_at, bsums, b_at, scale, dmin, acc, acc_at, accm, accm_at), codegen
    return block


_q4k_block, _q5k_block = _nibbles_block("Q4_K"), _nibbles_block("Q5_K")


@intrinsic
def _q6k_block(typingctx, qs, q_at, qx, x_at, sc, s_at, bsums, b_at, scale, acc, acc_at):
    """One Q6_K super-block of a row against one token: ``acc[a:a+8] = fma(scale, float(sumi), acc[a:a+8])``
    (a = ``acc_at``), sumi the eight int32 lanes
    Σ_c sc_{2c + j//4} · Σ_u w·q − 32·(sc_{2j}·bsums_{2j} + sc_{2j+1}·bsums_{2j+1}) (``qs`` from ``q_at``: 128
    bytes of low 4 bits, 64 of high 2, unpacked as llama.cpp's AVX2 loop does; x's ``qx`` from ``x_at``; the int8 scales from ``s_at``; x's int16 ``bsums`` from ``b_at``)."""
    def codegen(context, builder, signature, args):
        qs_v, q_at_v, qx_v, x_at_v, sc_v, s_at_v, bs_v, b_at_v, scale_v, acc_v, acc_at_v = args
        t = signature.args
        q_p = _ptr(context, builder, t[0], qs_v, q_at_v)
        x_p = _ptr(context, builder, t[2], qx_v, x_at_v)
        s_p = _ptr(context, builder, t[4], sc_v, s_at_v)
        b_p = _ptr(context, builder, t[6], bs_v, b_at_v)
        v32, i64 = ir.VectorType(I8, 32), q_at_v.type
        sc8 = _vload(builder, s_p, ir.Constant(s_at_v.type, 0), ir.VectorType(I8, 16))
        scales = builder.sext(sc8, ir.VectorType(I32, 16))                                # <16 x i32>
        scales16 = builder.sext(sc8, ir.VectorType(I16, 16))                              # <16 x i16>
        sumi = ir.Constant(ir.VectorType(I32, LANES), [0] * LANES)
        for c, (w, sc) in enumerate(_q6_chunks(builder, q_p, scales16)):
            y = _vload(builder, x_p, ir.Constant(x_at_v.type, 32 * c), v32)
            sumi = builder.add(sumi, _scaled_lanes(builder, w, y, sc))
        sums = builder.sext(_vload(builder, b_p, ir.Constant(b_at_v.type, 0), ir.VectorType(I16, 16)),
                            ir.VectorType(I32, 16))
        p = builder.mul(scales, sums)                                                     # <16 x i32>
        pairs = builder.add(builder.shuffle_vector(p, p, _vec(I32, range(0, 16, 2))),
                            builder.shuffle_vector(p, p, _vec(I32, range(1, 16, 2))))     # <8 x i32>
        sumi = builder.sub(sumi, builder.shl(pairs, _vec(I32, [5] * LANES)))
        _accumulate(context, builder, t[9], acc_v, acc_at_v, scale_v, sumi)
        return context.get_dummy_value()
    return types.void(qs, q_at, qx, x_at, sc, s_at, bsums, b_at, scale, acc, acc_at), codegen


def _hadd(builder, vec):
    """The sum of an integer vector's elements (exact: any order)."""
    total = builder.extract_element(vec, ir.Constant(I32, 0))
    for i in range(1, vec.type.count):
        total = builder.add(total, builder.extract_element(vec, ir.Constant(I32, i)))
    return total


def _token_sums(builder, vecs):
    """<T x i32>: the sum of each of T integer vectors <8 x i32> (T = 1, 4 or 8), exact in any order; four or
    eight by a tree of shuffles and adds (eight lanes each), the sums side by side."""
    if len(vecs) == 1:
        return builder.insert_element(ir.Constant(ir.VectorType(I32, 1), ir.Undefined), _hadd(builder, vecs[0]),
                                      ir.Constant(I32, 0))

    def fold(a, b, keep, other):
        return builder.add(builder.shuffle_vector(a, b, _vec(I32, keep)),
                           builder.shuffle_vector(a, b, _vec(I32, other)))
    halves = [fold(a, b, [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])   # 4 lanes a token, 2 tokens
              for a, b in zip(vecs[::2], vecs[1::2])]
    quarters = [fold(a, b, [0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15])  # 2 lanes a token, 4 tokens
                for a, b in zip(halves[::2], halves[1::2])]
    if len(quarters) == 1:
        return fold(quarters[0], quarters[0], [0, 2, 4, 6], [1, 3, 5, 7])           # <4 x i32>
    return fold(*quarters, list(range(0, 16, 2)), list(range(1, 16, 2)))            # <8 x i32>


def _chunk_pairs(builder, chunks, sm32, six):
    """A super-block's values as four <64 x i8> (chunks 2m and 2m + 1 side by side: values 64m … 64m + 63),
    each with the scale of each of its 16 lanes of four values (<16 x i32>: Q4_K and Q5_K sc_2m eight times, then
    sc_2m+1; Q6_K sc_4m … sc_4m+3 four times each), for ``vpdpbusd`` of 512 bits (:func:`_pair_lanes`)."""
    pairs = []
    for m in range(len(chunks) // 2):
        w = builder.shuffle_vector(chunks[2 * m][0], chunks[2 * m + 1][0], _vec(I32, range(64)))
        lanes = [4 * m + j // 4 for j in range(16)] if six else [2 * m + j // 8 for j in range(16)]
        pairs.append((w, builder.shuffle_vector(sm32, sm32, _vec(I32, lanes))))
    return pairs


def _pair_lanes(builder, pairs, x_p, offset_type):
    """<8 x i32> whose sum is Σ_s sc_s · Σ w·q of one token (x's 256 int8 at ``x_p``): per pair of chunks one
    ``vpdpbusd`` and a multiply by the lanes' scales, then the two halves added (exact integers: any grouping
    gives the one-token lanes' total)."""
    total = None
    for m, (w, sc) in enumerate(pairs):
        y = _vload(builder, x_p, ir.Constant(offset_type, 64 * m), ir.VectorType(I8, 64))
        lanes = builder.mul(_dpbusd(builder, w, y), sc)                             # <16 x i32>
        total = lanes if total is None else builder.add(total, lanes)
    return builder.add(builder.shuffle_vector(total, total, _vec(I32, range(8))),
                       builder.shuffle_vector(total, total, _vec(I32, range(8, 16))))


def _tiled_block(kind: str, tokens: int):
    """The intrinsic of one super-block of a row against ``tokens`` tokens (1 or :data:`TILE`), the tiled GEMM's
    arithmetic: ``(qs, q_at, sm, s_at, qx, x_at, x_step, bsums, b_at, b_step, xd, xd_at, xd_step, d, dmin, acc,
    acc_at)``. The row's values (from element ``q_at`` of ``qs``) and sub-block scales and minima (from ``s_at``
    of ``sm``) are unpacked once; for token i (its ``qx`` from ``x_at + i·x_step``, ``bsums`` from
    ``b_at + i·b_step``, x.d ``xd[xd_at + i·xd_step]``) the exact s1 = Σ_s sc_s · Σ w·q (Q6_K: minus
    32·Σ_s sc_s·bsums_s) and, Q4_K and Q5_K, s2 = Σ_s mn_s · S_s (S_s x's sum over sub-block s), then, the tokens
    side by side, ``r = float(s1)·d``, ``r = fma(dmin, float(s2), r)`` (``dmin`` passed negated) and
    ``acc[acc_at + i] = fma(r, x.d, acc[acc_at + i])``."""
    six = kind == "Q6_K"

    @intrinsic
    def block(typingctx, qs, q_at, sm, s_at, qx, x_at, x_step, bsums, b_at, b_step, xd, xd_at, xd_step, d, dmin,
              acc, acc_at):
        def codegen(context, builder, signature, args):
            (qs_v, q_at_v, sm_v, s_at_v, qx_v, x_at_v, x_step_v, bs_v, b_at_v, b_step_v, xd_v, xd_at_v, xd_step_v,
             d_v, dmin_v, acc_v, acc_at_v) = args
            t = signature.args
            q_p = _ptr(context, builder, t[0], qs_v, q_at_v)
            sm8 = _vload(builder, _ptr(context, builder, t[2], sm_v, s_at_v), ir.Constant(s_at_v.type, 0),
                         ir.VectorType(I8, 16))                                         # sc (and mn)
            extend = builder.sext if six else builder.zext
            sm16, sm32 = extend(sm8, ir.VectorType(I16, 16)), extend(sm8, ir.VectorType(I32, 16))
            chunks = _q6_chunks(builder, q_p, sm16) if six else _nibble_chunks(builder, q_p, sm16, kind == "Q5_K")
            v32, v16 = ir.VectorType(I8, 32), ir.VectorType(I16, 16)
            # bsums_j is weighted by Q6_K's sc_j (times −32), or by Q4_K's and Q5_K's mn_{j//2}
            weights = sm32 if six else builder.shuffle_vector(sm32, sm32, _vec(I32, [8 + j // 2 for j in range(16)]))
            firsts, seconds, xds = [], [], []
            x_at_i, b_at_i, xd_at_i = x_at_v, b_at_v, xd_at_v
            pairs = _chunk_pairs(builder, chunks, sm32, six) if _q8_fused.VNNI else None
            for i in range(tokens):
                x_p = _ptr(context, builder, t[4], qx_v, x_at_i)
                if pairs is None:
                    sumi = ir.Constant(ir.VectorType(I32, LANES), [0] * LANES)
                    for c, (w, sc) in enumerate(chunks):
                        y = _vload(builder, x_p, ir.Constant(x_at_v.type, 32 * c), v32)
                        sumi = builder.add(sumi, _scaled_lanes(builder, w, y, sc))
                else:
                    sumi = _pair_lanes(builder, pairs, x_p, x_at_v.type)
                b_p = _ptr(context, builder, t[7], bs_v, b_at_i)
                S = builder.sext(_vload(builder, b_p, ir.Constant(b_at_v.type, 0), v16), ir.VectorType(I32, 16))
                p = builder.mul(weights, S)                                     # sc_j·bsums_j, or mn_{j//2}·bsums_j
                p = builder.add(builder.shuffle_vector(p, p, _vec(I32, range(8))),
                                builder.shuffle_vector(p, p, _vec(I32, range(8, 16))))   # <8 x i32>, same sum
                if six:
                    firsts.append(builder.sub(sumi, builder.shl(p, _vec(I32, [5] * LANES))))
                else:
                    firsts.append(sumi)
                    seconds.append(p)
                xds.append(builder.load(_ptr(context, builder, t[10], xd_v, xd_at_i)))
                x_at_i, b_at_i = builder.add(x_at_i, x_step_v), builder.add(b_at_i, b_step_v)
                xd_at_i = builder.add(xd_at_i, xd_step_v)
            vf = ir.VectorType(F32, tokens)
            r = builder.fmul(builder.sitofp(_token_sums(builder, firsts), vf), _splat(builder, d_v, tokens))
            if not six:
                s2 = builder.sitofp(_token_sums(builder, seconds), vf)
                r = _fma_ir(builder, _splat(builder, dmin_v, tokens), s2, r)
            x = ir.Constant(vf, ir.Undefined)
            for i, value in enumerate(xds):
                x = builder.insert_element(x, value, ir.Constant(I32, i))
            a_p = builder.bitcast(_ptr(context, builder, t[15], acc_v, acc_at_v), vf.as_pointer())
            builder.store(_fma_ir(builder, r, x, builder.load(a_p, align=4)), a_p, align=4)
            return context.get_dummy_value()
        return types.void(qs, q_at, sm, s_at, qx, x_at, x_step, bsums, b_at, b_step, xd, xd_at, xd_step, d, dmin, acc,
                          acc_at), codegen
    return block


TILE = 8                              # tokens per tile of the tiled GEMM (each row's values unpacked once a tile)
_q4k_tile, _q4k_one = _tiled_block("Q4_K", TILE), _tiled_block("Q4_K", 1)
_q5k_tile, _q5k_one = _tiled_block("Q5_K", TILE), _tiled_block("Q5_K", 1)
_q6k_tile, _q6k_one = _tiled_block("Q6_K", TILE), _tiled_block("Q6_K", 1)


@numba.njit(inline="always", **FLAGS)
def _tiled_block_of(kind, tokens, qs, q_at, sm, s_at, qx, x_at, x_step, bsums, b_at, b_step, xd, xd_at, xd_step, d,
                    dmin, acc, acc_at):
    """One super-block of a row against ``tokens`` (TILE or 1) tokens of ``kind`` (4, 5 or 6: Q4_K, Q5_K,
    Q6_K): :func:`_tiled_block`'s intrinsic."""
    if kind == 4 and tokens == TILE:
        _q4k_tile(qs, q_at, sm, s_at, qx, x_at, x_step, bsums, b_at, b_step, xd, xd_at, xd_step, d, dmin,
                  acc, acc_at)
    elif kind == 4:
        _q4k_one(qs, q_at, sm, s_at, qx, x_at, x_step, bsums, b_at, b_step, xd, xd_at, xd_step, d, dmin, acc, acc_at)
    elif kind == 5 and tokens == TILE:
        _q5k_tile(qs, q_at, sm, s_at, qx, x_at, x_step, bsums, b_at, b_step, xd, xd_at, xd_step, d, dmin,
                  acc, acc_at)
    elif kind == 5:
        _q5k_one(qs, q_at, sm, s_at, qx, x_at, x_step, bsums, b_at, b_step, xd, xd_at, xd_step, d, dmin, acc, acc_at)
    elif tokens == TILE:
        _q6k_tile(qs, q_at, sm, s_at, qx, x_at, x_step, bsums, b_at, b_step, xd, xd_at, xd_step, d, dmin,
                  acc, acc_at)
    else:
        _q6k_one(qs, q_at, sm, s_at, qx, x_at, x_step, bsums, b_at, b_step, xd, xd_at, xd_step, d, dmin, acc, acc_at)


@numba.njit(**FLAGS)
def _tiled_groups(kind, qs, d, sm, qx, xd, bsums, out, g0, g1):
    """out[t, r] for the rows of groups g0 … g1 − 1 by the tiled GEMM's arithmetic (``kind`` 4, 5 or 6: Q4_K,
    Q5_K, Q6_K; planes as the one-token kernels'): per super-block b the exact s1 (and s2), then
    ``r = float(s1)·d``, Q4_K and Q5_K ``r = fma(−dmin, float(s2), r)``, and ``out = fma(r, x.d, out)``, b after
    b. Tokens in tiles of :data:`TILE` (a row's values unpacked once a tile), the last ones one by one."""
    n_sb, n_rows, n_tok, nbytes = qs.shape[1], out.shape[1], qx.shape[0], qs.shape[3]
    acc = np.empty(GROUP * TILE, np.float32)                      # (4 rows × the tile's tokens)
    for g in range(g0, g1):
        for t0 in range(0, n_tok, TILE):
            tokens = TILE if n_tok - t0 >= TILE else 1
            for t1 in range(t0, min(t0 + TILE, n_tok), tokens):
                acc[:] = 0
                for b in range(n_sb):
                    at = (g * n_sb + b) * GROUP
                    for k in range(GROUP):
                        dmin = -_half(d[g, b, k, 1]) if kind != 6 else np.float32(0.0)
                        _tiled_block_of(kind, tokens, qs, (at + k) * nbytes, sm, (at + k) * 16, qx,
                                        (t1 * n_sb + b) * QK_K, n_sb * QK_K, bsums, (t1 * n_sb + b) * 16, n_sb * 16,
                                        xd, t1 * n_sb + b, n_sb, _half(d[g, b, k, 0]), dmin, acc, k * TILE)
                for k in range(min(GROUP, n_rows - g * GROUP)):
                    for i in range(tokens):
                        out[t1 + i, g * GROUP + k] = acc[k * TILE + i]


@numba.njit(inline="always", **FLAGS)
def _hsum8(a, at):
    """llama.cpp's ``hsum_float_8`` of a[at:at + 8]: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))."""
    return ((a[at] + a[at + 4]) + (a[at + 2] + a[at + 6])) + ((a[at + 1] + a[at + 5]) + (a[at + 3] + a[at + 7]))


@numba.njit(**FLAGS)
def _q4k_groups(qs, d, sm, qx, xd, bsums, out, g0, g1):
    """out[t, r] for the rows of groups g0 … g1 − 1: qs (G, n, 4, 128) uint8, d (G, n, 4, 2) float16 bits (d,
    dmin), sm (G, n, 4, 16) uint8 (sc, mn); x's qx (N, n, 256), xd (N, n), bsums (N, n, 16). A group's four
    rows side by side, super-block after super-block: the planes are read in order, once per token."""
    n_sb, n_rows, n_tok = qs.shape[1], out.shape[1], qx.shape[0]
    acc = np.empty(GROUP * LANES, np.float32)                     # (4 rows × 8 lanes)
    accm = np.empty(GROUP * 4, np.float32)                        # (4 rows × 4 lanes) the minima's
    for g in range(g0, g1):
        for t in range(n_tok):
            acc[:] = 0
            accm[:] = 0
            for b in range(n_sb):
                at = (g * n_sb + b) * GROUP
                xdb = xd[t, b]
                for k in range(GROUP):
                    _prefetch(qs, (at + k) * 128 + PREFETCH_BYTES)
                    _prefetch(qs, (at + k) * 128 + PREFETCH_BYTES + 64)
                    _q4k_block(qs, (at + k) * 128, qx, (t * n_sb + b) * QK_K, sm, (at + k) * 16, bsums,
                               (t * n_sb + b) * 16, xdb * _half(d[g, b, k, 0]), -xdb * _half(d[g, b, k, 1]),
                               acc, k * LANES, accm, 4 * k)
            for k in range(min(GROUP, n_rows - g * GROUP)):
                m = 4 * k
                out[t, g * GROUP + k] = _hsum8(acc, k * LANES) + ((accm[m] + accm[m + 2]) + (accm[m + 1] + accm[m + 3]))


@numba.njit(**FLAGS)
def _q5k_groups(qs, d, sm, qx, xd, bsums, out, g0, g1):
    """out[t, r] for the rows of groups g0 … g1 − 1 of Q5_K: qs (G, n, 4, 160) uint8 (nibbles, then fifth
    bits), d and sm as Q4_K's; the minima one float32 per row, summs = fma(dmin, float(Σ mn·S), summs)."""
    n_sb, n_rows, n_tok = qs.shape[1], out.shape[1], qx.shape[0]
    acc = np.empty(GROUP * LANES, np.float32)                     # (4 rows × 8 lanes)
    summs = np.empty(GROUP, np.float32)                           # (4 rows,) the minima's
    for g in range(g0, g1):
        for t in range(n_tok):
            acc[:] = 0
            summs[:] = 0
            for b in range(n_sb):
                at = (g * n_sb + b) * GROUP
                xdb = xd[t, b]
                for k in range(GROUP):
                    for line in range(0, 160, 64):
                        _prefetch(qs, (at + k) * 160 + PREFETCH_BYTES + line)
                    _q5k_block(qs, (at + k) * 160, qx, (t * n_sb + b) * QK_K, sm, (at + k) * 16, bsums,
                               (t * n_sb + b) * 16, xdb * _half(d[g, b, k, 0]), -xdb * _half(d[g, b, k, 1]),
                               acc, k * LANES, summs, k)
            for k in range(min(GROUP, n_rows - g * GROUP)):
                out[t, g * GROUP + k] = _hsum8(acc, k * LANES) + summs[k]


@numba.njit(**FLAGS)
def _q6k_groups(qs, d, sc, qx, xd, bsums, out, g0, g1):
    """out[t, r] for the rows of groups g0 … g1 − 1: qs (G, n, 4, 192) uint8 (the file's ql, qh), d (G, n, 4, 1)
    float16 bits, sc (G, n, 4, 16) int8; x's qx (N, n, 256), xd (N, n), bsums (N, n, 16)."""
    n_sb, n_rows, n_tok = qs.shape[1], out.shape[1], qx.shape[0]
    acc = np.empty(GROUP * LANES, np.float32)
    for g in range(g0, g1):
        for t in range(n_tok):
            acc[:] = 0
            for b in range(n_sb):
                at = (g * n_sb + b) * GROUP
                for k in range(GROUP):
                    for line in range(0, Q6_BYTES, 64):
                        _prefetch(qs, (at + k) * Q6_BYTES + PREFETCH_BYTES + line)
                    _q6k_block(qs, (at + k) * Q6_BYTES, qx, (t * n_sb + b) * QK_K, sc, (at + k) * 16, bsums,
                               (t * n_sb + b) * 16, xd[t, b] * _half(d[g, b, k, 0]), acc, k * LANES)
            for k in range(min(GROUP, n_rows - g * GROUP)):
                out[t, g * GROUP + k] = _hsum8(acc, k * LANES)


@numba.njit(**FLAGS)
def _quantized(x):
    """(qx, xd, bsums) of x (N, d_in) float32 C-contiguous: :func:`quantize_k` into new arrays."""
    n_sb = x.shape[1] // QK_K
    qx = np.empty((x.shape[0], n_sb, QK_K), np.int8)                   # (N, n, 256)
    xd = np.empty((x.shape[0], n_sb), np.float32)                      # (N, n)
    bsums = np.empty((x.shape[0], n_sb, QK_K // 16), np.int16)         # (N, n, 16)
    quantize_k(x, qx, xd, bsums)
    return qx, xd, bsums


@numba.njit(**FLAGS)
def _q4k_product(qs, d, sm, x, out):
    """x rounded, then every group on the calling thread: one numba call per product."""
    qx, xd, bsums = _quantized(x)
    _q4k_groups(qs, d, sm, qx, xd, bsums, out, 0, qs.shape[0])


@numba.njit(**FLAGS)
def _q5k_product(qs, d, sm, x, out):
    qx, xd, bsums = _quantized(x)
    _q5k_groups(qs, d, sm, qx, xd, bsums, out, 0, qs.shape[0])


@numba.njit(**FLAGS)
def _q6k_product(qs, d, sc, x, out):
    qx, xd, bsums = _quantized(x)
    _q6k_groups(qs, d, sc, qx, xd, bsums, out, 0, qs.shape[0])


def quantize(x):
    """(qx, xd, bsums) of x (N, d_in) float32 C-contiguous: :func:`quantize_k` into new arrays."""
    return call(_quantized, x)


PRODUCTS = {"Q4_K": _q4k_product, "Q5_K": _q5k_product, "Q6_K": _q6k_product}
GROUPS = {"Q4_K": _q4k_groups, "Q5_K": _q5k_groups, "Q6_K": _q6k_groups}


@numba.njit(**FLAGS)
def _tiled_product(kind, qs, d, sm, x, out):
    """x rounded, then every group by the tiled arithmetic on the calling thread."""
    qx, xd, bsums = _quantized(x)
    _tiled_groups(kind, qs, d, sm, qx, xd, bsums, out, 0, qs.shape[0])


KIND = {"Q4_K": 4, "Q5_K": 5, "Q6_K": 6}


def matmul(qtype: str, qs, d, m, x, out, pool=None, *, tiled: bool = False) -> None:
    """out (N, R) = x (N, d_in) times the rows of a Q4_K, Q5_K or Q6_K weight in grouped integer planes (d as float16
    bits), x rounded to Q8_K first; by the one-token kernels' arithmetic (llama.cpp's ``ggml_vec_dot_*_q8_K``) or,
    ``tiled``, by its tiled GEMM's; on the calling thread, or with ``pool`` (a ThreadPoolExecutor) over its
    threads, a range of groups each."""
    if pool is None:
        if tiled:
            call(_tiled_product, KIND[qtype], qs, d, m, x, out)
        else:
            call(PRODUCTS[qtype], qs, d, m, x, out)
        return
    qx, xd, bsums = call(_quantized, x)
    groups = qs.shape[0]
    step = -(-groups // pool._max_workers)
    if tiled:
        jobs = [(_tiled_groups, KIND[qtype], qs, d, m, qx, xd, bsums, out, g0, min(groups, g0 + step))
                for g0 in range(0, groups, step)]
    else:
        jobs = [(GROUPS[qtype], qs, d, m, qx, xd, bsums, out, g0, min(groups, g0 + step))
                for g0 in range(0, groups, step)]
    for f in [pool.submit(call, *job) for job in jobs]:
        f.result()
