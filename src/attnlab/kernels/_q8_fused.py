"""The 8-bit-activation kernels (numba, the optional extra ``attnlab[fast]``): x rounded to 8 bits per block of
32, then integer dot products with the weight's blocks, as llama.cpp's x86 ``ggml_vec_dot`` runs them.

:mod:`attnlab.kernels.q8_activations` says what is computed and holds the numpy reference these kernels are
tested against bit for bit; in short, for a row of blocks b and a token:

- x's block b becomes int8 ``qx`` and a float16 scale ``xd`` (Q8_0, Q8_1), and for Q8_1 also ``xs`` = float16
  of xd·Σqx (:func:`quantize_blocks`);
- per block, eight int32 lanes, lane j the sum of the products of the values 4j … 4j + 3 (what ``vpdpbusd``
  or ``vpmaddubsw`` + ``vpmaddwd`` leave in a 256-bit register), exact in any order;
- eight float32 accumulators, ``acc_j = fma(d_w·xd, float(lane_j), acc_j)`` block after block (one rounding,
  ``llvm.fma``: vfmadd, as llama.cpp's ``_mm256_fmadd_ps``), then llama.cpp's horizontal sum
  ``((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))``, plus (Q4_1) the minima's term Σ_b m_b·xs_b summed block after block.

The weights are the planes of :class:`attnlab.kernels.quantized.QuantizedMatrix` (rows in groups of 4, each
block's bytes of the four rows side by side). numba types integer arithmetic as int64 and LLVM vectorised
none of the plain loops tried, so a group's whole loop over its blocks is written as LLVM vector IR by an
intrinsic (:func:`_group_intrinsic`), its accumulators in registers (numba's loop around a per-block
intrinsic kept them in memory, a load and a store per block and row):

- one 64-byte load holds a block of the four rows (Q4: 16 bytes each; Q8_0: two loads of 64), split into
  two rows per 512-bit register, each row's lanes in its own half, x's block loaded once for the four;
- Q5_0 and Q5_1 (:func:`_five_bit_pairs`): a group's block is 80 bytes, each row's qh and 16 nibble bytes as
  the file holds them (a 64- and a 16-byte load); the nibbles unpacked as Q4's, each value's fifth bit tested
  in qh (llama.cpp's ``bytes_from_bits_32``) and ORed in as 16, Q5_0's values then less 16 and multiplied as
  Q8_0's int8, Q5_1's (0 … 31) as unsigned bytes with Q4_1's minima;
- ``vpdpbusd`` on 512-bit registers where the CPU has AVX-512 VNNI (:data:`VNNI_512`), two of 256 bits where
  it has AVX-VNNI alone (:func:`vnni_rule`), else plain IR that LLVM lowers to ``vpmaddwd`` and ``vphaddd``
  (AVX2);
- the values prefetched :data:`PREFETCH_BYTES` ahead; the four rows' sums in llama.cpp's order at the end,
  written to ``out`` as one 4-lane store; x rounded and every group multiplied in one numba call.

A product of many tokens (a prefill) runs a GEMM: the tokens in tiles of :data:`TILE` (8), each group's block
unpacked once for the tile's tokens, the tile's accumulators in registers (:func:`_gemm_intrinsic`: a
register's 16 lanes are 4 rows × 4 tokens, lane j of every (row, token) in its own register, so d_w·xd is one
multiply for 16 pairs and a block's weights one dword shuffle per j). The tokens after the last whole tile go
through the one-token kernel. Every (row, token) keeps the one-token
kernel's arithmetic, so a token's outputs are the same bits in a prefill and in a decode step (tested). x is
rounded a block at a time in vector IR (:func:`_quantize_block`), the tiles written in the same pass
(:func:`_quantized_tiles`), and the tokens go in chunks of :data:`CHUNK_BYTES` over all the groups.

No fastmath: every float operation rounds as the numpy reference's does (its fused multiply-add emulated
exactly), and the integer sums are exact whatever instructions compute them. (A 1,536 × 576 Q4_1 product
held in L2: 11-18 G weights/s with the per-block intrinsic, 16-22 with this loop; 2-core Xeon, loaded. At 512
tokens, one thread: 27 G MAC/s token by token, 54 with the GEMM, float32 BLAS 57 (benchmarks/q8_gemm.py;
Xeon, AVX-512, loaded).)
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import _kernels, _quant_fused
from ._numba_load import call
from ._quant_fused import _fma, _next_block

FLAGS = dict(nogil=True, cache=True, boundscheck=False)
GROUP = _quant_fused.GROUP            # rows side by side in the planes
MAX_TOKENS = _quant_fused.MAX_TOKENS  # up to this many tokens a product runs on the calling thread (a decode step)
LANES = 8           # float32 accumulators per row: one 256-bit register, as llama.cpp's AVX2 loop keeps them
QK = 32             # values per block of Q8_0 / Q8_1 (and of the weights' blocks here)
PREFETCH_BYTES = 4096   # the values are prefetched this far ahead of the block being multiplied: a decode step
#                         streams its weights from memory once, and the hardware prefetcher alone left the
#                         kernel waiting (60 Q4_1 weights of 3,072 x 576, cycled: 6.9-8.3 G weights/s without,
#                         10.2-15.4 with 2-8 KiB ahead; 2-core Xeon, loaded). A hint: it never faults, and it
#                         changes no result.


I8, I32, F32 = ir.IntType(8), ir.IntType(32), ir.FloatType()
FIVE_KINDS = ("Q5_0", "Q5_1")   # a row's block: the file's qh (4 bytes) and 16 nibble bytes, unpacked in registers
MINIMA_KINDS = ("Q4_1", "Q5_1")  # w = d·q + m: the minima's term Σ_b m_b·xs_b
WIDTH = {"Q8_0": QK, "Q5_0": 20, "Q5_1": 20, "Q4_0": QK // 2, "Q4_1": QK // 2}   # bytes of one row's block


@intrinsic
def _to_half(typingctx, value):
    """A float32 rounded to the nearest float16 (ties to even), returned as float32: llama.cpp's
    ``GGML_CPU_FP32_TO_FP16`` then back (LLVM's fptrunc and fpext: F16C's vcvtps2ph on x86)."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.float32), codegen


@intrinsic
def _quantize_block(typingctx, x, x_at, q, q_at, q2, q2_at, xd, xs, s_at):
    """One block of 32 values of x (from element ``x_at``) rounded as :func:`quantize_blocks` says, in vector
    IR: its 32 int8 written at ``q[q_at]`` and at ``q2[q2_at]`` (a tile's copy, or the same place again),
    ``xd[s_at]`` and ``xs[s_at]``. The maximum of |x| is exact in any order (no NaN in x), the rest rounds as
    the scalar code: d = amax / 127, inv = 127 / amax (0 where amax is 0), q = roundeven(x·inv), xs = d·Σq."""
    def codegen(context, builder, signature, args):
        x_v, x_at_v, q_v, q_at_v, q2_v, q2_at_v, xd_v, xs_v, s_at_v = args
        t = signature.args
        v32 = ir.VectorType(F32, QK)
        v = _vload(builder, _ptr(context, builder, t[0], x_v, x_at_v), ir.Constant(x_at_v.type, 0), v32)
        fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v32, [v32]), "llvm.fabs.v32f32")
        a = builder.call(fabs, [v])
        width = QK
        while width > 1:                                      # the larger half, halving: max|x| in lane 0
            width //= 2
            lo = builder.shuffle_vector(a, a, _vec(I32, range(width)))
            hi = builder.shuffle_vector(a, a, _vec(I32, range(width, 2 * width)))
            a = builder.select(builder.fcmp_ordered(">", lo, hi), lo, hi)
        amax = builder.extract_element(a, ir.Constant(I32, 0))
        k127, zero = ir.Constant(F32, 127.0), ir.Constant(F32, 0.0)
        d = builder.fdiv(amax, k127)
        inv = builder.select(builder.fcmp_ordered("!=", amax, zero), builder.fdiv(k127, amax), zero)
        rne = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v32, [v32]), "llvm.roundeven.v32f32")
        qi = builder.fptosi(builder.call(rne, [builder.fmul(v, _splat(builder, inv, QK))]),
                            ir.VectorType(I32, QK))                                  # <32 x i32>
        q8 = builder.trunc(qi, ir.VectorType(I8, QK))
        for arg, ary, at in ((2, q_v, q_at_v), (4, q2_v, q2_at_v)):
            builder.store(q8, builder.bitcast(_ptr(context, builder, t[arg], ary, at),
                                              ir.VectorType(I8, QK).as_pointer()), align=1)
        vadd = cgutils.get_or_insert_function(builder.module, ir.FunctionType(I32, [ir.VectorType(I32, QK)]),
                                              "llvm.vector.reduce.add.v32i32")
        total = builder.sitofp(builder.call(vadd, [qi]), F32)

        def half(value):
            return builder.fpext(builder.fptrunc(value, ir.HalfType()), F32)
        builder.store(half(d), _ptr(context, builder, t[6], xd_v, s_at_v))
        builder.store(half(builder.fmul(d, total)), _ptr(context, builder, t[7], xs_v, s_at_v))
        return context.get_dummy_value()
    return types.void(x, x_at, q, q_at, q2, q2_at, xd, xs, s_at), codegen


@numba.njit(**FLAGS)
def quantize_blocks(x, qx, xd, xs):
    """x (N, n_blocks·32) float32 -> qx (N, n_blocks, 32) int8, xd (N, n_blocks) and xs (N, n_blocks) float32
    (each the value of a float16), as llama.cpp's x86 ``quantize_row_q8_1`` (``quantize_row_q8_0``: the
    same, xs unused): amax = max|x|, d = amax / 127, q = round-half-even(x · (127 / amax)), xs = d·Σq.
    x C-contiguous (a block at a time in vector IR: :func:`_quantize_block`)."""
    n_blocks = qx.shape[1]
    xf, qf, xdf, xsf = x.reshape(-1), qx.reshape(-1), xd.reshape(-1), xs.reshape(-1)
    for i in range(x.shape[0] * n_blocks):
        _quantize_block(xf, i * QK, qf, i * QK, qf, i * QK, xdf, xsf, i)




def vnni_rule() -> tuple[bool, bool]:
    """Whether the kernels call ``vpdpbusd`` (AVX-VNNI or AVX-512 VNNI with VL), and whether on 512-bit
    registers: :func:`attnlab.kernels._kernels.vnni_rules` on the features numba compiles for
    (``NUMBA_CPU_FEATURES`` when set, else this CPU's: :func:`~attnlab.kernels._kernels.numba_target_features`).
    Else the products are written as plain vector IR, which LLVM turns into ``vpmaddwd`` and ``vphaddd``."""
    return _kernels.vnni_rules(_kernels.numba_features())


VNNI, VNNI_512 = vnni_rule()    # VNNI_512: two rows' blocks in one register
# LLVM 22 takes vpdpbusd's byte operands as <32 x i8> (llvm-project PR 155194), earlier ones as <8 x i32>
VNNI_BYTES = llvm.llvm_version_info[0] >= 22


def _vec(ty, values):
    return ir.Constant(ir.VectorType(ty, len(values)), list(values))


def _dpbusd(builder, unsigned8, signed8, start=None):
    """<n/4 x i32> of two <n x i8> (n 32 or 64): lane j = Σ_{u<4} unsigned8[4j+u] · signed8[4j+u] (bytes as u8
    and s8), added to ``start`` (<n/4 x i32>, zero when None): ``vpdpbusd`` where :data:`VNNI` (a 512-bit one
    where :data:`VNNI_512`, else two of 256 bits), else the same sums in plain IR (products as i32, then two
    pairwise adds)."""
    n = unsigned8.type.count
    if VNNI and n == 64 and not VNNI_512:
        starts = [None, None] if start is None else [builder.shuffle_vector(start, start, _vec(I32, range(h, h + 8)))
                                                     for h in (0, 8)]
        halves = [_dpbusd(builder, *(builder.shuffle_vector(v, v, _vec(I32, range(h, h + 32)))
                                     for v in (unsigned8, signed8)), s) for h, s in zip((0, 32), starts)]
        return builder.shuffle_vector(*halves, _vec(I32, range(16)))
    vl = ir.VectorType(I32, n // 4)
    if VNNI:
        if VNNI_BYTES:
            args = [unsigned8, signed8]
            fnty = ir.FunctionType(vl, [vl, ir.VectorType(I8, n), ir.VectorType(I8, n)])
        else:
            args = [builder.bitcast(unsigned8, vl), builder.bitcast(signed8, vl)]
            fnty = ir.FunctionType(vl, [vl, vl, vl])
        fn = cgutils.get_or_insert_function(builder.module, fnty, f"llvm.x86.avx512.vpdpbusd.{8 * n}")
        return builder.call(fn, [ir.Constant(vl, [0] * (n // 4)) if start is None else start, *args])
    wide = ir.VectorType(I32, n)
    p = builder.mul(builder.zext(unsigned8, wide), builder.sext(signed8, wide))          # <n x i32>
    for half in (n // 2, n // 4):                                                      # pairs, then fours
        even = builder.shuffle_vector(p, p, _vec(I32, range(0, 2 * half, 2)))
        odd = builder.shuffle_vector(p, p, _vec(I32, range(1, 2 * half, 2)))
        p = builder.add(even, odd)
    return p if start is None else builder.add(start, p)


def _block_lanes(builder, kind, w, y, y_sums=None, start=None):
    """The int32 lanes of two rows' blocks (<16 x i32>, eight a row): w their 2 × 32 values as bytes in value
    order (Q4: 0 … 15, Q8_0: int8), y the token's 32 int8 twice; Q4_0's values are q − 8: Σ q·y − 8·Σ y per
    lane (``y_sums`` the lanes of Σ y, shared by the rows of a group); added to ``start`` (zero when None)."""
    n = w.type.count
    if kind == "Q8_0":                      # s8 · s8 as llama.cpp: |w| (u8) times y with w's sign (|y| <= 127)
        zero = _vec(I8, [0] * n)
        negative = builder.icmp_signed("<", w, zero)
        w_abs = builder.select(negative, builder.sub(zero, w), w)
        y_signed = builder.select(negative, builder.sub(zero, y), y)
        return _dpbusd(builder, w_abs, y_signed, start)
    lanes = _dpbusd(builder, w, y, start)
    if kind == "Q4_0":
        lanes = builder.sub(lanes, builder.shl(y_sums, _vec(I32, [3] * (n // 4))))
    return lanes


def _splat(builder, value, n):
    """<n x T>: ``value`` in every lane."""
    vec = ir.VectorType(value.type, n)
    one = builder.insert_element(ir.Constant(vec, ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(one, one, _vec(I32, [0] * n))


def _lane(builder, vec, k, n):
    """<n x T>: lane k of ``vec`` in every lane."""
    return builder.shuffle_vector(vec, vec, _vec(I32, [k] * n))


def _ptr(context, builder, aryty, ary, offset):
    """The address of element ``offset`` of the C-contiguous array ``ary``."""
    return builder.gep(context.make_array(aryty)(context, builder, ary).data, [offset])


def _prefetch(builder, base, offset):
    """A prefetch (read, keep in all caches) of the byte ``offset`` after the pointer ``base``."""
    fnty = ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
    ptr = builder.gep(builder.bitcast(base, I8.as_pointer()), [offset])
    builder.call(fn, [ptr, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])


def _vload(builder, base, offset, vecty):
    """The vector ``vecty`` at element ``offset`` after the pointer ``base``."""
    return builder.load(builder.bitcast(builder.gep(base, [offset]), vecty.as_pointer()), align=1)


def _hsum_rows(builder, accs):
    """<4 x float>: each of the four rows' <8 x float> accumulators summed in llama.cpp's ``hsum_float_8``
    order, ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), the four rows side by side."""
    halves = [builder.fadd(builder.shuffle_vector(a, a, _vec(I32, range(4))),
                           builder.shuffle_vector(a, a, _vec(I32, range(4, 8)))) for a in accs]   # a_j + a_{j+4}
    pair01 = builder.shuffle_vector(halves[0], halves[1], _vec(I32, range(8)))                    # <8 x float>
    pair23 = builder.shuffle_vector(halves[2], halves[3], _vec(I32, range(8)))
    both = builder.shuffle_vector(pair01, pair23, _vec(I32, range(16)))                            # <16 x float>
    col = [builder.shuffle_vector(both, both, _vec(I32, [4 * k + j for k in range(GROUP)])) for j in range(4)]
    return builder.fadd(builder.fadd(col[0], col[2]), builder.fadd(col[1], col[3]))


def _nibble_pairs(builder, packed):
    """Two <64 x i8> of the four rows' 16 packed bytes each (``packed``, <64 x i8>, row k's at 16k): rows 2h and
    2h + 1's 32 values in value order (value t in byte t's low nibble, t + 16 in its high one), 0 … 15."""
    low, high = builder.and_(packed, _vec(I8, [15] * 64)), builder.lshr(packed, _vec(I8, [4] * 64))
    return [builder.shuffle_vector(low, high, _vec(I32, [*range(32 * h, 32 * h + 16),
                                                         *range(64 + 32 * h, 64 + 32 * h + 16),
                                                         *range(32 * h + 16, 32 * h + 32),
                                                         *range(80 + 32 * h, 80 + 32 * h + 16)]))
            for h in (0, 1)]


def _five_bit_pairs(builder, kind, q_p, q_b):
    """Two <64 x i8> of a group's Q5 block (80 bytes at element ``q_b`` of the pointer ``q_p``: row k's qh at
    20k, its 16 nibble bytes at 20k + 4): rows 2h and 2h + 1's values in value order, the fifth bit of value t
    bit t of the row's little-endian qh (llama.cpp's ``bytes_from_bits_32``): Q5_1's q (0 … 31), Q5_0's q − 16
    (int8)."""
    head = _vload(builder, q_p, q_b, ir.VectorType(I8, 64))              # bytes 0 … 63, and 64 … 79 (four times)
    tail = _vload(builder, q_p, builder.add(q_b, ir.Constant(q_b.type, 64)), ir.VectorType(I8, 16))
    tail = builder.shuffle_vector(tail, tail, _vec(I32, [i % 16 for i in range(64)]))

    def take(at):                            # the block's bytes at ``at`` (< 80; tail's first 16 are 64 … 79)
        return builder.shuffle_vector(head, tail, _vec(I32, at))
    nibbles = take([20 * k + 4 + u for k in range(GROUP) for u in range(16)])
    pairs = []
    for h, values in enumerate(_nibble_pairs(builder, nibbles)):
        qh = take([20 * (2 * h + i // 32) + (i % 32) // 8 for i in range(64)])
        bit = builder.and_(qh, _vec(I8, [((1 << (i % 8)) + 128) % 256 - 128 for i in range(64)]))
        set_ = builder.icmp_unsigned("!=", bit, _vec(I8, [0] * 64))
        q = builder.or_(values, builder.select(set_, _vec(I8, [16] * 64), _vec(I8, [0] * 64)))
        pairs.append(builder.sub(q, _vec(I8, [16] * 64)) if kind == "Q5_0" else q)
    return pairs


def _group_intrinsic(kind: str):
    """An intrinsic ``(qs, q_at, d, m, dm_at, y, y_at, xd, xs, x_at, n_blocks, acc, summs)``: one group of GROUP
    rows against one token, every block, the accumulators in registers: for block b, row k,
    acc_k = acc_k + (d_w·xd_b)·float(lanes_k) (a multiply, then an add, each rounded) and (Q4_1)
    summs_k = summs_k + m_w·xs_b; at the end acc (GROUP, 8) and summs (GROUP,) are written out.
    ``qs`` from element ``q_at`` (n_blocks blocks of GROUP rows' 16 packed bytes, or 32 int8 for Q8_0), ``d``
    and ``m`` (float16 bits) from ``dm_at`` (GROUP per block), ``y`` (int8) from ``y_at`` (32 per block), ``xd``
    and ``xs`` from ``x_at`` (one per block); ``n_blocks`` >= 1."""
    width = WIDTH[kind]                                 # bytes of one row's block
    vf, vf4 = ir.VectorType(F32, 2 * LANES), ir.VectorType(F32, GROUP)    # two rows' lanes; one per row

    @intrinsic
    def group(typingctx, qs, q_at, d, m, dm_at, y, y_at, xd, xs, x_at, n_blocks, res, res_at):
        def codegen(context, builder, signature, args):
            qs_v, q_at_v, d_v, m_v, dm_at_v, y_v, y_at_v, xd_v, xs_v, x_at_v, nb_v, res_v, res_at_v = args
            t = signature.args
            i64 = q_at_v.type
            q_p = _ptr(context, builder, t[0], qs_v, q_at_v)
            d_p = _ptr(context, builder, t[2], d_v, dm_at_v)
            m_p = _ptr(context, builder, t[3], m_v, dm_at_v)
            y_p = _ptr(context, builder, t[5], y_v, y_at_v)
            xd_p = _ptr(context, builder, t[7], xd_v, x_at_v)
            xs_p = _ptr(context, builder, t[8], xs_v, x_at_v)
            nb = builder.sext(nb_v, i64) if nb_v.type != i64 else nb_v
            entry = builder.basic_block
            loop = builder.append_basic_block("q8.blocks")
            done = builder.append_basic_block("q8.done")
            builder.branch(loop)
            builder.position_at_end(loop)
            b = builder.phi(i64)
            accs = [builder.phi(vf) for _ in range(GROUP // 2)]
            summ = builder.phi(vf4)
            b.add_incoming(ir.Constant(i64, 0), entry)
            for a in accs:
                a.add_incoming(ir.Constant(vf, [0.0] * 2 * LANES), entry)
            summ.add_incoming(ir.Constant(vf4, [0.0] * GROUP), entry)

            y8 = _vload(builder, y_p, builder.mul(b, ir.Constant(i64, QK)), ir.VectorType(I8, QK))
            y2 = builder.shuffle_vector(y8, y8, _vec(I32, [*range(QK), *range(QK)]))   # <64 x i8> for two rows
            xd_b = builder.load(builder.gep(xd_p, [b]))
            dm_at_b = builder.mul(b, ir.Constant(i64, GROUP))
            d4 = builder.fpext(builder.bitcast(_vload(builder, d_p, dm_at_b, ir.VectorType(ir.IntType(16), GROUP)),
                                               ir.VectorType(ir.HalfType(), GROUP)), vf4)
            dd = builder.fmul(d4, _splat(builder, xd_b, GROUP))                   # <4 x float> d_w·xd per row
            y_sums = _dpbusd(builder, _vec(I8, [1] * 2 * QK), y2) if kind == "Q4_0" else None
            q_b = builder.mul(b, ir.Constant(i64, GROUP * width))
            _prefetch(builder, q_p, builder.add(q_b, ir.Constant(i64, PREFETCH_BYTES)))
            v64 = ir.VectorType(I8, 2 * QK)
            if kind == "Q8_0":                       # rows 0 and 1, rows 2 and 3: 64 int8 each
                pairs = [_vload(builder, q_p, builder.add(q_b, ir.Constant(i64, h)), v64) for h in (0, 2 * QK)]
            elif kind in FIVE_KINDS:                 # the four rows' 20 bytes: values with their fifth bit
                pairs = _five_bit_pairs(builder, kind, q_p, q_b)
            else:                                    # the four rows' 16 bytes: low nibbles, high, row by row
                pairs = _nibble_pairs(builder, _vload(builder, q_p, q_b, v64))
            new_accs = []
            for h, w in enumerate(pairs):            # rows 2h and 2h + 1, eight lanes each
                lanes = _block_lanes(builder, "Q8_0" if kind == "Q5_0" else kind, w, y2, y_sums)
                scale = builder.shuffle_vector(dd, dd, _vec(I32, [2 * h] * LANES + [2 * h + 1] * LANES))
                new_accs.append(_fma(builder, scale, builder.sitofp(lanes, vf), accs[h]))   # llama.cpp's fmadd
            if kind in MINIMA_KINDS:
                m4 = builder.fpext(builder.bitcast(_vload(builder, m_p, dm_at_b, ir.VectorType(ir.IntType(16), GROUP)),
                                                   ir.VectorType(ir.HalfType(), GROUP)), vf4)
                new_summ = builder.fadd(summ, builder.fmul(m4, _splat(builder, builder.load(builder.gep(xs_p, [b])),
                                                                      GROUP)))
            else:
                new_summ = summ
            _next_block(builder, b, [*zip(accs, new_accs), (summ, new_summ)], nb, loop, done)

            builder.position_at_end(done)
            rows = [builder.shuffle_vector(a, a, _vec(I32, range(h, h + LANES))) for a in new_accs for h in (0, LANES)]
            total = _hsum_rows(builder, rows)                                # <4 x float> a row's sum each
            if kind in MINIMA_KINDS:
                total = builder.fadd(total, new_summ)
            res_p = _ptr(context, builder, t[11], res_v, res_at_v)
            builder.store(total, builder.bitcast(res_p, vf4.as_pointer()), align=4)
            return context.get_dummy_value()
        return types.void(qs, q_at, d, m, dm_at, y, y_at, xd, xs, x_at, n_blocks, res, res_at), codegen
    return group


_q4_0_group, _q4_1_group, _q8_0_group, _q5_0_group, _q5_1_group = (
    _group_intrinsic(k) for k in ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1"))


TILE = 8   # tokens a prefill's product multiplies each unpacked block with: 4 rows x 8 tokens x 8 lanes of float32
#            accumulators, 16 zmm registers (32 on AVX-512; 12 tokens would spill). Any TILE gives the same bits.
CHUNK_BYTES = 32768   # a product's tokens in chunks of about this many bytes of 8-bit x, each multiplied by every
#                       group of rows before the next: a chunk's tokens stay in the core's caches


MAGIC, MAGIC_BITS = 12582912.0, 0x4B400000
#   1.5·2^23 and its float32 bits: for an int32 i with |i| < 2^22, the float32 of bits MAGIC_BITS + i is exactly
#   MAGIC + i, so float(i) = that − MAGIC, exactly: the sums start from MAGIC_BITS (vpdpbusd's accumulator, free)
#   and a subtraction (either vector port) replaces vcvtdq2ps (port 0 alone on AVX-512 cores, beside
#   vpdpbusd). A block's lane is at most 4·128·127 = 65,024 in magnitude (Q8_0; Q4: 4·15·127).


def _gemm_intrinsic(kind: str, tile: int = TILE):
    """An intrinsic ``(qs, q_at, d, m, dm_at, y, ys, xd, xs, x_at, n_blocks, res, res_at, stride)``: one group of
    GROUP rows against ``tile`` tokens (a prefill's product), every block, each (row, token) with
    :func:`_group_intrinsic`'s arithmetic (the bits of that token alone). A register's 16 lanes are 4 rows × 4
    tokens (lane 4k + u: row k, token 4q + u of the tile's quad q), and the eight lanes j of a (row, token) lie
    in eight registers, acc[j][q]: a block's d_w·xd is one multiply for 16 pairs, its weights one dword shuffle
    per j (row k's dword j broadcast over lane k's four; ``vpshufd`` for Q4, ``vpermt2d`` for Q8_0) against the
    quad's dwords j broadcast from memory, and the horizontal sums add whole registers. The tokens come tiled
    (:func:`_quantized_tiles`, the tile's first element at ``x_at`` of xd and xs, 32·x_at of y, 8·x_at of ys);
    row k of token u is written to res[res_at + u·stride + k]. float(lane) is the MAGIC subtraction:
    ``vpdpbusd`` starts from MAGIC_BITS, for Q4_0 from MAGIC_BITS − 8·Σy (``ys``: its −8·Σy), for Q8_0 from
    MAGIC_BITS − 128·Σw with y stored + 128 (unsigned bytes against w's signed ones: Σ (y + 128)·w − 128·Σw)."""
    quads = tile // 4
    vf, vf4, v16 = ir.VectorType(F32, 16), ir.VectorType(F32, GROUP), ir.VectorType(I32, 16)

    @intrinsic
    def gemm(typingctx, qs, q_at, d, m, dm_at, y, ys, xd, xs, x_at, n_blocks, res, res_at, stride):
        def codegen(context, builder, signature, args):
            qs_v, q_at_v, d_v, m_v, dm_at_v, y_v, ys_v, xd_v, xs_v, x_at_v, nb_v, res_v, res_at_v, stride_v = args
            t_ = signature.args
            i64 = q_at_v.type
            c = lambda k: ir.Constant(i64, k)                                      # noqa: E731
            q_p = _ptr(context, builder, t_[0], qs_v, q_at_v)
            d_p = _ptr(context, builder, t_[2], d_v, dm_at_v)
            m_p = _ptr(context, builder, t_[3], m_v, dm_at_v)
            y_p = _ptr(context, builder, t_[5], y_v, builder.mul(x_at_v, c(QK)))
            ys_p = _ptr(context, builder, t_[6], ys_v, builder.mul(x_at_v, c(LANES)))
            xd_p = _ptr(context, builder, t_[7], xd_v, x_at_v)
            xs_p = _ptr(context, builder, t_[8], xs_v, x_at_v)
            nb = builder.sext(nb_v, i64) if nb_v.type != i64 else nb_v
            entry = builder.basic_block
            loop = builder.append_basic_block("q8gemm.blocks")
            done = builder.append_basic_block("q8gemm.done")
            builder.branch(loop)
            builder.position_at_end(loop)
            b = builder.phi(i64)
            accs = [[builder.phi(vf) for _ in range(quads)] for _ in range(LANES)]      # [j][quad]
            summs = [builder.phi(vf) for _ in range(quads)]
            b.add_incoming(c(0), entry)
            for a in (*(a for row in accs for a in row), *summs):
                a.add_incoming(ir.Constant(vf, [0.0] * 16), entry)

            by_row = _vec(I32, [i // 4 for i in range(16)])                      # lane 4k + u <- row k
            quad = _vec(I32, [i % 4 for i in range(16)])                         # lane 4k + u <- token u
            dm_at_b = builder.mul(b, c(GROUP))
            d4 = builder.fpext(builder.bitcast(_vload(builder, d_p, dm_at_b, ir.VectorType(ir.IntType(16), GROUP)),
                                               ir.VectorType(ir.HalfType(), GROUP)), vf4)
            d16 = builder.shuffle_vector(d4, d4, by_row)
            scales = []
            for q in range(quads):                   # d_w·xd of the 16 (row, token) pairs, as the decode kernel
                x4 = _vload(builder, xd_p, builder.add(builder.mul(b, c(tile)), c(4 * q)), vf4)
                scales.append(builder.fmul(d16, builder.shuffle_vector(x4, x4, quad)))
            v64 = ir.VectorType(I8, 64)
            if kind == "Q8_0":                       # rows 0 and 1, rows 2 and 3: 64 int8 each
                halves = [builder.bitcast(_vload(builder, q_p, builder.add(builder.mul(b, c(GROUP * QK)), c(h)), v64),
                                          v16) for h in (0, 2 * QK)]
            elif kind in FIVE_KINDS:                 # the same from the 5-bit block, unpacked once for the tile
                halves = [builder.bitcast(p, v16) for p in _five_bit_pairs(builder, kind, q_p,
                                                                           builder.mul(b, c(GROUP * WIDTH[kind])))]
            else:
                packed = builder.bitcast(_vload(builder, q_p, builder.mul(b, c(GROUP * QK // 2)), v64), v16)
                low = builder.and_(packed, _vec(I32, [0x0F0F0F0F] * 16))       # values 0 … 15, four a dword
                high = builder.and_(builder.lshr(packed, _vec(I32, [4] * 16)), _vec(I32, [0x0F0F0F0F] * 16))
            yq_at = builder.mul(b, c(LANES * tile))                              # the block's dwords in y and ys
            for j in range(LANES):
                if kind in ("Q8_0", *FIVE_KINDS):    # row k's dword j in lane k; Q8_0's y is stored + 128:
                    w = builder.shuffle_vector(*halves, _vec(I32, [8 * (i // 4) + j if i < 8
                                                                   else 16 + 8 * (i // 4 - 2) + j for i in range(16)]))
                    w8 = builder.bitcast(w, v64)     # Σ (y + 128)·w − 128·Σ w = Σ y·w, from MAGIC_BITS
                    if kind in ("Q8_0", "Q5_0"):     # (Q5_1's w are 0 … 31: unsigned bytes against signed y)
                        start_j = builder.sub(_vec(I32, [MAGIC_BITS] * 16),
                                              _dpbusd(builder, _vec(I8, [-128] * 64), w8))
                else:
                    src = low if j < 4 else high
                    w8 = builder.bitcast(builder.shuffle_vector(src, src, _vec(I32, [4 * (i // 4) + j % 4
                                                                                    for i in range(16)])), v64)
                for q in range(quads):
                    at = builder.add(yq_at, c(j * tile + 4 * q))                 # the quad's 4 dwords j
                    y4 = _vload(builder, builder.bitcast(y_p, I32.as_pointer()), at, ir.VectorType(I32, 4))
                    y16 = builder.bitcast(builder.shuffle_vector(y4, y4, quad), v64)
                    if kind in ("Q8_0", "Q5_0"):
                        lanes = _dpbusd(builder, y16, w8, start_j)
                    elif kind == "Q4_0":
                        s4 = _vload(builder, ys_p, at, ir.VectorType(I32, 4))
                        lanes = _dpbusd(builder, w8, y16, builder.shuffle_vector(s4, s4, quad))
                    else:
                        lanes = _dpbusd(builder, w8, y16, _vec(I32, [MAGIC_BITS] * 16))
                    value = builder.fsub(builder.bitcast(lanes, vf), ir.Constant(vf, [MAGIC] * 16))
                    accs[j][q] = (accs[j][q], _fma(builder, scales[q], value, accs[j][q]))
            new_summs = []
            if kind in MINIMA_KINDS:
                m4 = builder.fpext(builder.bitcast(_vload(builder, m_p, dm_at_b, ir.VectorType(ir.IntType(16), GROUP)),
                                                   ir.VectorType(ir.HalfType(), GROUP)), vf4)
                m16 = builder.shuffle_vector(m4, m4, by_row)
                for q in range(quads):
                    x4 = _vload(builder, xs_p, builder.add(builder.mul(b, c(tile)), c(4 * q)), vf4)
                    new_summs.append(builder.fadd(summs[q], builder.fmul(m16, builder.shuffle_vector(x4, x4, quad))))
            else:
                new_summs = summs
            _next_block(builder, b, [*(pair for row in accs for pair in row), *zip(summs, new_summs)], nb, loop, done)

            builder.position_at_end(done)
            res_p = _ptr(context, builder, t_[11], res_v, res_at_v)
            step = builder.sext(stride_v, i64) if stride_v.type != i64 else stride_v
            for q in range(quads):
                a = [accs[j][q][1] for j in range(LANES)]
                total = builder.fadd(builder.fadd(builder.fadd(a[0], a[4]), builder.fadd(a[2], a[6])),
                                     builder.fadd(builder.fadd(a[1], a[5]), builder.fadd(a[3], a[7])))
                if kind in MINIMA_KINDS:
                    total = builder.fadd(total, new_summs[q])
                by_token = builder.shuffle_vector(total, total,
                                                  _vec(I32, [4 * k + u for u in range(4) for k in range(4)]))
                for u in range(4):
                    row4 = builder.shuffle_vector(by_token, by_token, _vec(I32, range(4 * u, 4 * u + 4)))
                    at = builder.gep(res_p, [builder.mul(c(4 * q + u), step)])
                    builder.store(row4, builder.bitcast(at, vf4.as_pointer()), align=4)
            return context.get_dummy_value()
        return types.void(qs, q_at, d, m, dm_at, y, ys, xd, xs, x_at, n_blocks, res, res_at, stride), codegen
    return gemm


_q4_0_gemm, _q4_1_gemm, _q8_0_gemm, _q5_0_gemm, _q5_1_gemm = (
    _gemm_intrinsic(k) for k in ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1"))


@numba.njit(**FLAGS)
def _nibbles_groups(qs, d, m, off, qx, xd, xs, qt, ys, xdt, xst, out, g0, g1):
    """out[n, r] for the rows of groups g0 … g1 − 1 of a 4-bit type: qs (G, n_blocks, 4, 16) bytes (value t
    in byte t's low nibble, t + 16 in its high one), d and m (G, n_blocks, 4) float16 bits; ``off`` 8: Q4_0
    (w = d·(q − 8), m unused), 0: Q4_1 (w = d·q + m: adds Σ_b m_b·xs_b). The tokens of whole tiles (qt, xdt,
    xst: :func:`_quantized_tiles`) TILE at a time, the rest (qx, xd, xs) one by one: the same bits either way."""
    n_blocks, n_rows, n_tiles = qs.shape[1], out.shape[1], xdt.shape[0]
    last = np.empty(GROUP * TILE, np.float32)                # (TILE, rows) a last group's sums, padding rows too
    flat = out.reshape(-1)
    chunk = max(1, CHUNK_BYTES // (TILE * n_blocks * QK))                # tiles whose tokens stay in cache
    for c0 in range(0, n_tiles, chunk):
        for g in range(g0, g1):
            full = (g + 1) * GROUP <= n_rows
            q_at, dm_at = g * n_blocks * GROUP * 16, g * n_blocks * GROUP
            for i in range(c0, min(n_tiles, c0 + chunk)):
                res, at, stride = (flat, i * TILE * n_rows + g * GROUP, n_rows) if full else (last, 0, GROUP)
                x_at = i * n_blocks * TILE
                if off == 0:
                    _q4_1_gemm(qs, q_at, d, m, dm_at, qt, ys, xdt, xst, x_at, n_blocks, res, at, stride)
                else:
                    _q4_0_gemm(qs, q_at, d, m, dm_at, qt, ys, xdt, xst, x_at, n_blocks, res, at, stride)
                if not full:
                    for t in range(TILE):
                        out[i * TILE + t, g * GROUP:] = last[t * GROUP:t * GROUP + n_rows - g * GROUP]
    for g in range(g0, g1):
        full = (g + 1) * GROUP <= n_rows
        q_at, dm_at = g * n_blocks * GROUP * 16, g * n_blocks * GROUP
        for n in range(n_tiles * TILE, qx.shape[0]):
            res, at = (flat, n * n_rows + g * GROUP) if full else (last, 0)
            if off == 0:
                _q4_1_group(qs, q_at, d, m, dm_at, qx, n * n_blocks * QK, xd, xs, n * n_blocks, n_blocks, res, at)
            else:
                _q4_0_group(qs, q_at, d, m, dm_at, qx, n * n_blocks * QK, xd, xs, n * n_blocks, n_blocks, res, at)
            if not full:
                out[n, g * GROUP:] = last[:n_rows - g * GROUP]


@numba.njit(**FLAGS)
def _int8_groups(qs, d, qx, xd, qt, xdt, out, g0, g1):
    """out[n, r] for the rows of groups g0 … g1 − 1 of Q8_0: qs (G, n_blocks, 4, 32) int8, d (G, n_blocks, 4, 1)
    float16 bits; whole tiles TILE tokens at a time, the rest one by one."""
    n_blocks, n_rows, n_tiles = qs.shape[1], out.shape[1], xdt.shape[0]
    last = np.empty(GROUP * TILE, np.float32)
    flat = out.reshape(-1)
    chunk = max(1, CHUNK_BYTES // (TILE * n_blocks * QK))
    for c0 in range(0, n_tiles, chunk):
        for g in range(g0, g1):
            full = (g + 1) * GROUP <= n_rows
            q_at, dm_at = g * n_blocks * GROUP * QK, g * n_blocks * GROUP
            for i in range(c0, min(n_tiles, c0 + chunk)):
                res, at, stride = (flat, i * TILE * n_rows + g * GROUP, n_rows) if full else (last, 0, GROUP)
                _q8_0_gemm(qs, q_at, d, d, dm_at, qt, qt, xdt, xdt, i * n_blocks * TILE, n_blocks, res, at, stride)
                if not full:
                    for t in range(TILE):
                        out[i * TILE + t, g * GROUP:] = last[t * GROUP:t * GROUP + n_rows - g * GROUP]
    for g in range(g0, g1):
        full = (g + 1) * GROUP <= n_rows
        q_at, dm_at = g * n_blocks * GROUP * QK, g * n_blocks * GROUP
        for n in range(n_tiles * TILE, qx.shape[0]):
            res, at = (flat, n * n_rows + g * GROUP) if full else (last, 0)
            _q8_0_group(qs, q_at, d, d, dm_at, qx, n * n_blocks * QK, xd, xd, n * n_blocks, n_blocks, res, at)
            if not full:
                out[n, g * GROUP:] = last[:n_rows - g * GROUP]


@numba.njit(**FLAGS)
def _five_groups(qs, d, m, minima, qx, xd, xs, qt, xdt, xst, out, g0, g1):
    """out[n, r] for the rows of groups g0 … g1 − 1 of Q5_0 (``minima`` 0: w = d·(q − 16), the tiles stored
    + 128 as Q8_0's) or Q5_1 (``minima`` 1: w = d·q + m, adds Σ_b m_b·xs_b; signed tiles): qs (G, n_blocks, 4,
    20) the file's qh and nibble bytes, d and m (G, n_blocks, 4) float16 bits; whole tiles TILE tokens at a time,
    the rest one by one: the same bits either way."""
    n_blocks, n_rows, n_tiles = qs.shape[1], out.shape[1], xdt.shape[0]
    last = np.empty(GROUP * TILE, np.float32)
    flat = out.reshape(-1)
    chunk = max(1, CHUNK_BYTES // (TILE * n_blocks * QK))
    for c0 in range(0, n_tiles, chunk):
        for g in range(g0, g1):
            full = (g + 1) * GROUP <= n_rows
            q_at, dm_at = g * n_blocks * GROUP * 20, g * n_blocks * GROUP
            for i in range(c0, min(n_tiles, c0 + chunk)):
                res, at, stride = (flat, i * TILE * n_rows + g * GROUP, n_rows) if full else (last, 0, GROUP)
                if minima:
                    _q5_1_gemm(qs, q_at, d, m, dm_at, qt, qt, xdt, xst, i * n_blocks * TILE, n_blocks, res, at, stride)
                else:
                    _q5_0_gemm(qs, q_at, d, d, dm_at, qt, qt, xdt, xdt, i * n_blocks * TILE, n_blocks, res, at, stride)
                if not full:
                    for t in range(TILE):
                        out[i * TILE + t, g * GROUP:] = last[t * GROUP:t * GROUP + n_rows - g * GROUP]
    for g in range(g0, g1):
        full = (g + 1) * GROUP <= n_rows
        q_at, dm_at = g * n_blocks * GROUP * 20, g * n_blocks * GROUP
        for n in range(n_tiles * TILE, qx.shape[0]):
            res, at = (flat, n * n_rows + g * GROUP) if full else (last, 0)
            if minima:
                _q5_1_group(qs, q_at, d, m, dm_at, qx, n * n_blocks * QK, xd, xs, n * n_blocks, n_blocks, res, at)
            else:
                _q5_0_group(qs, q_at, d, d, dm_at, qx, n * n_blocks * QK, xd, xd, n * n_blocks, n_blocks, res, at)
            if not full:
                out[n, g * GROUP:] = last[:n_rows - g * GROUP]


@numba.njit(parallel=True, **FLAGS)
def _five_parallel(qs, d, m, minima, qx, xd, xs, qt, xdt, xst, out, chunks):
    step = -(-qs.shape[0] // chunks)
    for c in prange(chunks):
        _five_groups(qs, d, m, minima, qx, xd, xs, qt, xdt, xst, out, c * step, min(qs.shape[0], (c + 1) * step))


@numba.njit(parallel=True, **FLAGS)
def _nibbles_parallel(qs, d, m, off, qx, xd, xs, qt, ys, xdt, xst, out, chunks):
    step = -(-qs.shape[0] // chunks)
    for c in prange(chunks):
        _nibbles_groups(qs, d, m, off, qx, xd, xs, qt, ys, xdt, xst, out, c * step, min(qs.shape[0], (c + 1) * step))


@numba.njit(parallel=True, **FLAGS)
def _int8_parallel(qs, d, qx, xd, qt, xdt, out, chunks):
    step = -(-qs.shape[0] // chunks)
    for c in prange(chunks):
        _int8_groups(qs, d, qx, xd, qt, xdt, out, c * step, min(qs.shape[0], (c + 1) * step))


@numba.njit(**FLAGS)
def _quantized(x):
    """(qx, xd, xs) of x (N, d_in) float32 C-contiguous: :func:`quantize_blocks` into new arrays."""
    n_blocks = x.shape[1] // QK
    qx = np.empty((x.shape[0], n_blocks, QK), np.int8)                 # (N, n_blocks, 32)
    xd = np.empty((x.shape[0], n_blocks), np.float32)                  # (N, n_blocks)
    xs = np.empty((x.shape[0], n_blocks), np.float32)                  # (N, n_blocks)
    quantize_blocks(x, qx, xd, xs)
    return qx, xd, xs


@intrinsic
def _tile_block(typingctx, q, q_at, qt, qt_at, ys, unsigned):
    """A token's rounded block (32 int8 at ``q[q_at]``) into its tile (:func:`_quantized_tiles`): dword j to
    ``qt`` at int8 element qt_at + 4·TILE·j (its bytes + 128 with ``unsigned``), and MAGIC_BITS − 8·(the
    dword's sum) to ``ys`` at int32 element (qt_at + 4·TILE·j) / 4."""
    def codegen(context, builder, signature, args):
        q_v, q_at_v, qt_v, qt_at_v, ys_v, unsigned_v = args
        t = signature.args
        v8 = ir.VectorType(I32, LANES)
        q8 = _vload(builder, _ptr(context, builder, t[0], q_v, q_at_v), ir.Constant(q_at_v.type, 0),
                    ir.VectorType(I8, QK))
        flipped = builder.xor(q8, _vec(I8, [-128] * QK))                 # the bits of q + 128 as uint8
        flip = builder.icmp_unsigned("!=", unsigned_v, ir.Constant(unsigned_v.type, 0))
        stored = builder.bitcast(builder.select(flip, flipped, q8), v8)
        wide = builder.sext(q8, ir.VectorType(I32, QK))
        pairs = builder.add(builder.shuffle_vector(wide, wide, _vec(I32, range(0, QK, 2))),
                            builder.shuffle_vector(wide, wide, _vec(I32, range(1, QK, 2))))
        sums = builder.add(builder.shuffle_vector(pairs, pairs, _vec(I32, range(0, QK // 2, 2))),
                           builder.shuffle_vector(pairs, pairs, _vec(I32, range(1, QK // 2, 2))))   # <8 x i32>
        starts = builder.sub(_vec(I32, [MAGIC_BITS] * LANES), builder.shl(sums, _vec(I32, [3] * LANES)))
        i64 = qt_at_v.type
        dword_at = builder.sdiv(qt_at_v, ir.Constant(i64, 4))
        qt_p = builder.bitcast(context.make_array(t[2])(context, builder, qt_v).data, I32.as_pointer())
        ys_p = context.make_array(t[4])(context, builder, ys_v).data
        for j in range(LANES):
            at = builder.add(dword_at, ir.Constant(i64, j * TILE))
            builder.store(builder.extract_element(stored, ir.Constant(I32, j)), builder.gep(qt_p, [at]), align=1)
            builder.store(builder.extract_element(starts, ir.Constant(I32, j)), builder.gep(ys_p, [at]))
        return context.get_dummy_value()
    return types.void(q, q_at, qt, qt_at, ys, unsigned), codegen


@numba.njit(**FLAGS)
def _quantized_tiles(x, unsigned):
    """(qx, xd, xs, qt, ys, xdt, xst): x rounded (:func:`_quantized`), and its first N − N % TILE tokens again in
    tiles of TILE tokens, each dword j of a block's tokens side by side (one pass over x): qt flat int8 laid out
    (n_tiles, n_blocks, 8, TILE, 4) (token TILE·i + u's values 4j … 4j + 3 of block b at [i, b, j, u]; with
    ``unsigned`` the bits of q + 128 as uint8: the Q8_0 GEMM's), ys flat int32 (n_tiles, n_blocks, 8, TILE):
    MAGIC_BITS − 8·(the sum of the dword's four q) (the Q4_0 GEMM's start), xdt and xst (n_tiles, n_blocks,
    TILE)."""
    n, n_blocks = x.shape[0], x.shape[1] // QK
    n_tiles = n // TILE
    qx = np.empty((n, n_blocks, QK), np.int8)                          # (N, n_blocks, 32)
    xd = np.empty((n, n_blocks), np.float32)                           # (N, n_blocks)
    xs = np.empty((n, n_blocks), np.float32)                           # (N, n_blocks)
    qt = np.empty(n_tiles * n_blocks * TILE * QK, np.int8)             # (n_tiles, n_blocks, 8, TILE, 4)
    ys = np.empty(n_tiles * n_blocks * LANES * TILE, np.int32)         # (n_tiles, n_blocks, 8, TILE)
    xdt = np.empty((n_tiles, n_blocks, TILE), np.float32)              # (n_tiles, n_blocks, TILE)
    xst = np.empty((n_tiles, n_blocks, TILE), np.float32)              # (n_tiles, n_blocks, TILE)
    xf, qf, xdf, xsf = x.reshape(-1), qx.reshape(-1), xd.reshape(-1), xs.reshape(-1)
    for t in range(n):
        for b in range(n_blocks):
            i = t * n_blocks + b
            _quantize_block(xf, i * QK, qf, i * QK, qf, i * QK, xdf, xsf, i)
            if t >= n_tiles * TILE:
                continue
            base, u = ((t // TILE) * n_blocks + b) * TILE * LANES, t % TILE
            xdt[t // TILE, b, u] = xd[t, b]
            xst[t // TILE, b, u] = xs[t, b]
            _tile_block(qf, i * QK, qt, (base + u) * 4, ys, unsigned)
    return qx, xd, xs, qt, ys, xdt, xst


@numba.njit(**FLAGS)
def _nibbles_product(qs, d, m, off, x, out):
    """x rounded, then every group of a 4-bit type on the calling thread: one numba call per product."""
    qx, xd, xs, qt, ys, xdt, xst = _quantized_tiles(x, False)
    _nibbles_groups(qs, d, m, off, qx, xd, xs, qt, ys, xdt, xst, out, 0, qs.shape[0])


@numba.njit(**FLAGS)
def _int8_product(qs, d, x, out):
    qx, xd, _, qt, _, xdt, _ = _quantized_tiles(x, True)
    _int8_groups(qs, d, qx, xd, qt, xdt, out, 0, qs.shape[0])


@numba.njit(**FLAGS)
def _five_product(qs, d, m, minima, x, out):
    qx, xd, xs, qt, _, xdt, xst = _quantized_tiles(x, minima == 0)
    _five_groups(qs, d, m, minima, qx, xd, xs, qt, xdt, xst, out, 0, qs.shape[0])


def quantize(x):
    """(qx, xd, xs) of x (N, d_in) float32 C-contiguous: :func:`quantize_blocks` into new arrays."""
    return call(_quantized, x)


def matmul(qtype: str, qs, d, m, x, out, threads: int = 1, pool=None) -> None:
    """out (N, R) = x (N, d_in) times the rows of a Q4_0, Q4_1, Q8_0, Q5_0 or Q5_1 weight in grouped planes (d
    and m as float16 bits; Q5's values as the file packs them, qh and nibbles), x rounded to 8 bits per block
    first; over ``threads`` of numba's threads (1: the calling thread), or with ``pool`` (a ThreadPoolExecutor)
    over its threads, a range of groups each (the kernels release the GIL). Each output is one row's and one
    token's sum: neither the threads nor N change it."""
    off = np.int32(8 if qtype == "Q4_0" else 0)
    minima = np.int32(1 if qtype == "Q5_1" else 0)
    m = d if m is None else m                                     # Q4_0 has no minima (never read: off 8)
    if pool is None and threads <= 1:                             # a decode step's product: one call
        if qtype == "Q8_0":
            call(_int8_product, qs, d, x, out)
        elif qtype in ("Q5_0", "Q5_1"):
            call(_five_product, qs, d, m, minima, x, out)
        else:
            call(_nibbles_product, qs, d, m, off, x, out)
        return
    qx, xd, xs, qt, ys, xdt, xst = call(_quantized_tiles, x, qtype in ("Q8_0", "Q5_0"))
    groups = qs.shape[0]
    if qtype == "Q8_0":
        serial, parallel, args = _int8_groups, _int8_parallel, (qs, d, qx, xd, qt, xdt, out)
    elif qtype in ("Q5_0", "Q5_1"):
        serial, parallel, args = _five_groups, _five_parallel, (qs, d, m, minima, qx, xd, xs, qt, xdt, xst, out)
    else:
        serial, parallel, args = _nibbles_groups, _nibbles_parallel, (qs, d, m, off, qx, xd, xs, qt, ys, xdt, xst, out)
    if pool is not None:
        n = pool._max_workers
        step = -(-groups // n)
        for f in [pool.submit(call, serial, *args, g0, min(groups, g0 + step)) for g0 in range(0, groups, step)]:
            f.result()
    else:
        call(parallel, *args, threads)
