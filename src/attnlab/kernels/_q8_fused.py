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
- ``vpdpbusd`` on 512-bit registers where the CPU has AVX-512 VNNI (:data:`VNNI_512`), two of 256 bits where
  it has AVX-VNNI alone (:func:`vnni_rule`), else plain IR that LLVM lowers to ``vpmaddwd`` and ``vphaddd``
  (AVX2);
- the values prefetched :data:`PREFETCH_BYTES` ahead; the four rows' sums in llama.cpp's order at the end,
  written to ``out`` as one 4-lane store; x rounded and every group multiplied in one numba call.

No fastmath: every float operation rounds as the numpy reference's does (its fused multiply-add emulated
exactly), and the integer sums are exact whatever instructions compute them. (A 1,536 × 576 Q4_1 product
held in L2: 11-18 G weights/s with the per-block intrinsic, 16-22 with this loop; 2-core Xeon, loaded.)
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


def _dpbusd(builder, unsigned8, signed8):
    """<n/4 x i32> of two <n x i8> (n 32 or 64): lane j = Σ_{u<4} unsigned8[4j+u] · signed8[4j+u] (bytes as u8
    and s8): ``vpdpbusd`` from zero where :data:`VNNI` (a 512-bit one where :data:`VNNI_512`, else two of 256
    bits), else the same sums in plain IR (products as i32, then two pairwise adds)."""
    n = unsigned8.type.count
    if VNNI and n == 64 and not VNNI_512:
        halves = [_dpbusd(builder, *(builder.shuffle_vector(v, v, _vec(I32, range(h, h + 32)))
                                     for v in (unsigned8, signed8))) for h in (0, 32)]
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
        return builder.call(fn, [ir.Constant(vl, [0] * (n // 4)), *args])
    wide = ir.VectorType(I32, n)
    p = builder.mul(builder.zext(unsigned8, wide), builder.sext(signed8, wide))          # <n x i32>
    for half in (n // 2, n // 4):                                                      # pairs, then fours
        even = builder.shuffle_vector(p, p, _vec(I32, range(0, 2 * half, 2)))
        odd = builder.shuffle_vector(p, p, _vec(I32, range(1, 2 * half, 2)))
        p = builder.add(even, odd)
    return p


def _block_lanes(builder, kind, w, y, y_sums=None):
    """The int32 lanes of two rows' blocks (<16 x i32>, eight a row): w their 2 × 32 values as bytes in value
    order (Q4: 0 … 15, Q8_0: int8), y the token's 32 int8 twice; Q4_0's values are q − 8: Σ q·y − 8·Σ y per
    lane (``y_sums`` the lanes of Σ y, shared by the rows of a group)."""
    n = w.type.count
    if kind == "Q8_0":                      # s8 · s8 as llama.cpp: |w| (u8) times y with w's sign (|y| <= 127)
        zero = _vec(I8, [0] * n)
        negative = builder.icmp_signed("<", w, zero)
        w_abs = builder.select(negative, builder.sub(zero, w), w)
        y_signed = builder.select(negative, builder.sub(zero, y), y)
        return _dpbusd(builder, w_abs, y_signed)
    lanes = _dpbusd(builder, w, y)
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


def _group_intrinsic(kind: str):
    """An intrinsic ``(qs, q_at, d, m, dm_at, y, y_at, xd, xs, x_at, n_blocks, acc, summs)``: one group of GROUP
    rows against one token, every block, the accumulators in registers: for block b, row k,
    acc_k = acc_k + (d_w·xd_b)·float(lanes_k) (a multiply, then an add, each rounded) and (Q4_1)
    summs_k = summs_k + m_w·xs_b; at the end acc (GROUP, 8) and summs (GROUP,) are written out.
    ``qs`` from element ``q_at`` (n_blocks blocks of GROUP rows' 16 packed bytes, or 32 int8 for Q8_0), ``d``
    and ``m`` (float16 bits) from ``dm_at`` (GROUP per block), ``y`` (int8) from ``y_at`` (32 per block), ``xd``
    and ``xs`` from ``x_at`` (one per block); ``n_blocks`` >= 1."""
    width = QK if kind == "Q8_0" else QK // 2           # bytes of one row's block
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
            else:                                    # the four rows' 16 bytes: low nibbles, high, row by row
                packed = _vload(builder, q_p, q_b, v64)
                low, high = builder.and_(packed, _vec(I8, [15] * 64)), builder.lshr(packed, _vec(I8, [4] * 64))
                pairs = [builder.shuffle_vector(low, high, _vec(I32, [*range(32 * h, 32 * h + 16),
                                                                      *range(64 + 32 * h, 64 + 32 * h + 16),
                                                                      *range(32 * h + 16, 32 * h + 32),
                                                                      *range(80 + 32 * h, 80 + 32 * h + 16)]))
                         for h in (0, 1)]
            new_accs = []
            for h, w in enumerate(pairs):            # rows 2h and 2h + 1, eight lanes each
                lanes = _block_lanes(builder, kind, w, y2, y_sums)
                scale = builder.shuffle_vector(dd, dd, _vec(I32, [2 * h] * LANES + [2 * h + 1] * LANES))
                new_accs.append(_fma(builder, scale, builder.sitofp(lanes, vf), accs[h]))   # llama.cpp's fmadd
            if kind == "Q4_1":
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
            if kind == "Q4_1":
                total = builder.fadd(total, new_summ)
            res_p = _ptr(context, builder, t[11], res_v, res_at_v)
            builder.store(total, builder.bitcast(res_p, vf4.as_pointer()), align=4)
            return context.get_dummy_value()
        return types.void(qs, q_at, d, m, dm_at, y, y_at, xd, xs, x_at, n_blocks, res, res_at), codegen
    return group


_q4_0_group, _q4_1_group, _q8_0_group = (_group_intrinsic(k) for k in ("Q4_0", "Q4_1", "Q8_0"))


@numba.njit(**FLAGS)
def _nibbles_groups(qs, d, m, off, qx, xd, xs, out, g0, g1):
    """out[n, r] for the rows of groups g0 … g1 − 1 of a 4-bit type: qs (G, n_blocks, 4, 16) bytes (value t
    in byte t's low nibble, t + 16 in its high one), d and m (G, n_blocks, 4) float16 bits; ``off`` 8: Q4_0
    (w = d·(q − 8), m unused), 0: Q4_1 (w = d·q + m: adds Σ_b m_b·xs_b)."""
    n_blocks, n_rows = qs.shape[1], out.shape[1]
    last = np.empty(GROUP, np.float32)                       # (rows,) a last group's sums, padding rows too
    flat = out.reshape(-1)
    for g in range(g0, g1):
        full = (g + 1) * GROUP <= n_rows
        for n in range(qx.shape[0]):
            res, at = (flat, n * n_rows + g * GROUP) if full else (last, 0)
            if off == 0:
                _q4_1_group(qs, g * n_blocks * GROUP * 16, d, m, g * n_blocks * GROUP, qx, n * n_blocks * QK,
                            xd, xs, n * n_blocks, n_blocks, res, at)
            else:
                _q4_0_group(qs, g * n_blocks * GROUP * 16, d, m, g * n_blocks * GROUP, qx, n * n_blocks * QK,
                            xd, xs, n * n_blocks, n_blocks, res, at)
            if not full:
                out[n, g * GROUP:] = last[:n_rows - g * GROUP]


@numba.njit(**FLAGS)
def _int8_groups(qs, d, qx, xd, out, g0, g1):
    """out[n, r] for the rows of groups g0 … g1 − 1 of Q8_0: qs (G, n_blocks, 4, 32) int8, d (G, n_blocks, 4, 1)
    float16 bits."""
    n_blocks, n_rows = qs.shape[1], out.shape[1]
    last = np.empty(GROUP, np.float32)
    flat = out.reshape(-1)
    for g in range(g0, g1):
        full = (g + 1) * GROUP <= n_rows
        for n in range(qx.shape[0]):
            res, at = (flat, n * n_rows + g * GROUP) if full else (last, 0)
            _q8_0_group(qs, g * n_blocks * GROUP * QK, d, d, g * n_blocks * GROUP, qx, n * n_blocks * QK,
                        xd, xd, n * n_blocks, n_blocks, res, at)
            if not full:
                out[n, g * GROUP:] = last[:n_rows - g * GROUP]


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


@numba.njit(**FLAGS)
def _quantized(x):
    """(qx, xd, xs) of x (N, d_in) float32 C-contiguous: :func:`quantize_blocks` into new arrays."""
    n_blocks = x.shape[1] // QK
    qx = np.empty((x.shape[0], n_blocks, QK), np.int8)                 # (N, n_blocks, 32)
    xd = np.empty((x.shape[0], n_blocks), np.float32)                  # (N, n_blocks)
    xs = np.empty((x.shape[0], n_blocks), np.float32)                  # (N, n_blocks)
    quantize_blocks(x, qx, xd, xs)
    return qx, xd, xs


@numba.njit(**FLAGS)
def _nibbles_product(qs, d, m, off, x, out):
    """x rounded, then every group of a 4-bit type on the calling thread: one numba call per product."""
    qx, xd, xs = _quantized(x)
    _nibbles_groups(qs, d, m, off, qx, xd, xs, out, 0, qs.shape[0])


@numba.njit(**FLAGS)
def _int8_product(qs, d, x, out):
    qx, xd, _ = _quantized(x)
    _int8_groups(qs, d, qx, xd, out, 0, qs.shape[0])


def quantize(x):
    """(qx, xd, xs) of x (N, d_in) float32 C-contiguous: :func:`quantize_blocks` into new arrays."""
    return call(_quantized, x)


def matmul(qtype: str, qs, d, m, x, out, threads: int = 1, pool=None) -> None:
    """out (N, R) = x (N, d_in) times the rows of a Q4_0, Q4_1 or Q8_0 weight in grouped planes (d and m as
    float16 bits), x rounded to 8 bits per block first; over ``threads`` of numba's threads (1: the calling
    thread), or with ``pool`` (a ThreadPoolExecutor) over its threads, a range of groups each (the kernels
    release the GIL). Each output is one row's and one token's sum: neither the threads nor N change it."""
    off = np.int32(8 if qtype == "Q4_0" else 0)
    m = d if m is None else m                                     # Q4_0 has no minima (never read: off 8)
    if pool is None and threads <= 1:                             # a decode step's product: one call
        if qtype == "Q8_0":
            call(_int8_product, qs, d, x, out)
        else:
            call(_nibbles_product, qs, d, m, off, x, out)
        return
    qx, xd, xs = call(_quantized, x)
    groups = qs.shape[0]
    if qtype == "Q8_0":
        serial, parallel, args = _int8_groups, _int8_parallel, (qs, d, qx, xd, out)
    else:
        serial, parallel, args = _nibbles_groups, _nibbles_parallel, (qs, d, m, off, qx, xd, xs, out)
    if pool is not None:
        n = pool._max_workers
        step = -(-groups // n)
        for f in [pool.submit(call, serial, *args, g0, min(groups, g0 + step)) for g0 in range(0, groups, step)]:
            f.result()
    else:
        call(parallel, *args, threads)
