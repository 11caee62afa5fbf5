"""llama.cpp's arithmetic between the products (:mod:`attnlab.kernels.ggml_arith`, the numpy reference), as numba
kernels: the same roundings in the same orders, so the same bits (tests/test_ggml_fused.py holds each to the
reference), at the q8 mode's speed.

Two LLVM operations carry it: ``llvm.fma.f32`` (one rounding: ``vfmadd`` here, a correctly rounded software fma
where the CPU has none) for ggml's fused multiply-adds, and ``fptrunc`` to half then ``fpext`` for its float16
roundings (ties to even, as F16C's ``vcvtps2ph``). numba compiles without fast-math: no other multiply and add
is fused. Compiled with ``cache=True`` (the machine code kept in ``__pycache__``), ``nogil=True``; single-threaded,
so every call gives the same bits.

The attention (:func:`attention`) is written in LLVM vector IR (``@intrinsic``s, as ``_fused.decode_tiles``), since
numba's loops over ggml's fixed orders stayed scalar: <16 x float> registers, float16 rows widened by ``fpext``
from <16 x half>, the fused multiply-adds as ``llvm.fma.v16f32`` (each product of two float16 values is exact in
float32, so one is the product added, rounded once, as ggml's), ``shufflevector`` and ``fadd`` for the fixed
16-lane tree. Per query:

- scores: sixteen keys a step, each key's registers (one token: four over each 64 of d, then (0 + 2) + (1 + 3);
  a batch: one over each 16) folded together in the tree's order, 15 shuffle-adds for the sixteen; for d = 64
  three heads a call, each key row loaded and widened once for them;
- softmax: the row's max, ``expf`` on 16 lanes (the same operations; 2^n as a double's exponent bits, the
  product rounded once to float32), each 16-block's tree sum added in double, the weights rounded to float16;
- weights·V: the lanes by key (j mod 64 one token, j mod 16 a batch) vectorised along d, eight lanes' running
  sums held in registers over all their keys (three heads at a time, each value row widened once), then the
  lanes folded along d as the dot product's registers are.

:func:`attention_scalar` is the same arithmetic one value at a time (a d not a multiple of 16, or of 64 for one
token, takes it). Every kernel here is held to ggml_arith's bits by tests/test_ggml_fused.py.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ._fused import LANES, _fma, _half, _shuffle_add, _vec_load, widen

F32 = np.float32
NEG_INF = np.float32(-np.inf)


@intrinsic
def fma32(typingctx, a, b, c):
    """a · b + c rounded once (LLVM's ``llvm.fma.f32``), float32."""
    if not (a == b == c == types.float32):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return types.float32(types.float32, types.float32, types.float32), codegen


@intrinsic
def half(typingctx, x):
    """x rounded to float16 (ties to even) and widened back, float32."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.float32), codegen


C0, C1, C2, C3, C4 = (F32(float.fromhex(h)) for h in ("0x1.0e4020p-7", "0x1.573e2ep-5", "0x1.555e66p-3",
                                                      "0x1.fffdb6p-2", "0x1.ffffecp-1"))
LOG2E, LN2_HI, LN2_LO = (F32(float.fromhex(h)) for h in ("0x1.715476p+0", "0x1.62e4p-1", "0x1.7f7d1cp-20"))
SHIFT = F32(float.fromhex("0x1.8p23"))
POW2 = np.ldexp(1.0, np.arange(-192, 193))                    # 2^n for |n| ≤ 192, float64 (exact)


@numba.njit(nogil=True, cache=True, inline="always")
def expf(x):
    """ggml's AVX-512 ``ggml_v_expf`` on one lane (the lanes never mix)."""
    z = fma32(x, LOG2E, SHIFT)
    n = z - SHIFT
    b = fma32(-n, LN2_LO, fma32(-n, LN2_HI, x))
    if abs(n) > F32(192):
        return F32(0) if n <= F32(0) else F32(np.inf)
    u = b * b
    j = fma32(fma32(fma32(C0, b, C1), u, fma32(C2, b, C3)), u, fma32(C4, b, F32(1)))
    return F32(np.float64(j) * POW2[int(n) + 192])            # _mm512_scalef_ps: exact in float64, one rounding


@numba.njit(nogil=True, cache=True, inline="always")
def reduce16(v, at):
    """GCC's ``_mm512_reduce_add_ps`` of v[at:at + 16]."""
    t0 = (v[at] + v[at + 8]) + (v[at + 4] + v[at + 12])
    t1 = (v[at + 1] + v[at + 9]) + (v[at + 5] + v[at + 13])
    t2 = (v[at + 2] + v[at + 10]) + (v[at + 6] + v[at + 14])
    t3 = (v[at + 3] + v[at + 11]) + (v[at + 7] + v[at + 15])
    return (t0 + t2) + (t1 + t3)


@numba.njit(nogil=True, cache=True)
def rms_norm_rows(x, w, eps, out):
    """x (R, d) float32 -> out (R, d): ggml's rms_norm then mul (ggml_arith.rms_norm)."""
    d = x.shape[1]
    for r in range(x.shape[0]):
        total = 0.0
        for i in range(d):
            total += np.float64(x[r, i] * x[r, i])
        scale = F32(1) / np.sqrt(F32(total / d) + eps)
        for i in range(d):
            out[r, i] = (x[r, i] * scale) * w[i]


@numba.njit(nogil=True, cache=True)
def silu_rows(g, out):
    """g (N,) float32 -> out: g / (1 + ggml's exp(−g))."""
    for i in range(g.shape[0]):
        out[i] = g[i] / (F32(1) + expf(-g[i]))


@numba.njit(nogil=True, cache=True)
def rope_rows(x, cos, sin, out):
    """x (H, n, d) float32 turned in pairs with the tables (n, d/2): y0 = fma(x0, c, −(x1·s)), y1 = fma(x0, s,
    x1·c)."""
    for h in range(x.shape[0]):
        for i in range(x.shape[1]):
            for p in range(x.shape[2] // 2):
                x0, x1, c, s = x[h, i, 2 * p], x[h, i, 2 * p + 1], cos[i, p], sin[i, p]
                out[h, i, 2 * p] = fma32(x0, c, -(x1 * s))
                out[h, i, 2 * p + 1] = fma32(x0, s, x1 * c)


@numba.njit(nogil=True, cache=True, inline="always")
def _score(qh, kw, d, one, acc):
    """qh · kw (float16 values, widened) in ggml's order: ``one`` ggml_vec_dot_f16's (four registers over each 64,
    then (0 + 2) + (1 + 3); a tail in double), else tinyBLAS's (one register over each 16; a d not a multiple of
    16: the former, as ggml falls back)."""
    if one or d % 16:
        whole = d - d % 64
        for u in range(64):
            acc[u] = F32(0)
        for c in range(0, whole, 64):
            for u in range(64):
                acc[u] += qh[c + u] * kw[c + u]
        for u in range(16):
            acc[u] = (acc[u] + acc[32 + u]) + (acc[16 + u] + acc[48 + u])
        total = reduce16(acc, 0)
        if whole == d:
            return total
        rest = np.float64(total)
        for i in range(whole, d):
            rest += np.float64(qh[i] * kw[i])
        return F32(rest)
    for u in range(16):
        acc[u] = F32(0)
    for c in range(0, d, 16):
        for u in range(16):
            acc[u] += qh[c + u] * kw[c + u]
    return reduce16(acc, 0)


@numba.njit(nogil=True, cache=True)
def attention_scalar(q, k, v, start, scale, out):
    """:func:`attention` one value at a time (every shape: a d_head not a multiple of 16, or of 64 for one token,
    takes it). ggml_arith.attention: q (h, n, d) float32; k, v (h_kv, ≥ start + n, d) float16 bits (uint16) or float32
    holding float16 values; out (h, n, d) float32. Each key and value row is widened once for its group's heads."""
    h, n, d = q.shape
    group = h // k.shape[0]
    one = n == 1
    n_kv = (start + n + 63) // 64 * 64
    s = np.empty((group, n_kv), F32)
    e = np.zeros((group, n_kv), F32)
    qh = np.empty((group, d), F32)
    row = np.empty(d, F32)
    acc = np.zeros(64, F32)
    sums = np.zeros((group, 64, d), F32)                       # (head, lane, d): the weighted sum's registers
    for g in range(k.shape[0]):
        for i in range(n):
            seen = start + i + 1
            for hh in range(group):
                for t in range(d):
                    qh[hh, t] = half(q[g * group + hh, i, t])
            for j in range(seen):
                for t in range(d):
                    row[t] = widen(k[g, j, t])
                for hh in range(group):
                    s[hh, j] = _score(qh[hh], row, d, one, acc) * scale
            for hh in range(group):
                top = NEG_INF
                for j in range(seen):
                    top = max(top, s[hh, j])
                for j in range(seen):
                    e[hh, j] = expf(s[hh, j] - top)
                for j in range(seen, (seen + 15) // 16 * 16):
                    e[hh, j] = F32(0)
                total = 0.0
                for b in range(0, seen, 16):
                    total += np.float64(reduce16(e[hh], b))
                inv = F32(1.0 / total)
                for j in range(seen):
                    e[hh, j] = half(e[hh, j] * inv)               # the weights, rounded to float16
            sums[:, :, :] = F32(0)
            for j in range(seen):
                for t in range(d):
                    row[t] = widen(v[g, j, t])
                r = j % 64 if one else j % 16
                for hh in range(group):
                    a = e[hh, j]
                    for t in range(d):
                        sums[hh, r, t] += a * row[t]
            for hh in range(group):
                for t in range(d):
                    if one:
                        for u in range(16):
                            acc[u] = (sums[hh, u, t] + sums[hh, 32 + u, t]) + (sums[hh, 16 + u, t] + sums[hh, 48 + u, t])
                    else:
                        for u in range(16):
                            acc[u] = sums[hh, u, t]
                    out[g * group + hh, i, t] = reduce16(acc, 0)


# ---- the vector kernel: LLVM vector IR for the loops LLVM would not vectorise (a fixed order of adds, ggml's
# exp with its branch) -----------------------------------------------------------------------------------------

def _vf(n=LANES, t=None):
    return ir.VectorType(t or ir.FloatType(), n)


def _splat(builder, x, n=LANES):
    """A scalar in all n lanes."""
    one = builder.insert_element(ir.Constant(_vf(n, x.type), ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(one, one, ir.Constant(_vf(n, ir.IntType(32)), [0] * n))


def _take(builder, v, at):
    return builder.shuffle_vector(v, v, ir.Constant(_vf(len(at), ir.IntType(32)), at))


def _reduce16(builder, v):
    """GCC's ``_mm512_reduce_add_ps`` (:func:`reduce16`) of a <16 x float>: lane u + u+8, then u+4, u+2, u+1."""
    for width in (8, 4, 2, 1):
        v = builder.fadd(_take(builder, v, list(range(width))), _take(builder, v, list(range(width, 2 * width))))
    return builder.extract_element(v, ir.Constant(ir.IntType(32), 0))


def _lanes_below(builder, at, seen):
    """<16 x i1>: lane u of the block at ``at`` is a key the query sees (at + u < seen)."""
    it = at.type
    idx = builder.add(_splat(builder, at), ir.Constant(_vf(LANES, it), list(range(LANES))))
    return builder.icmp_signed("<", idx, _splat(builder, seen))


def _intrinsic_fn(builder, name, vt, n_args):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt] * n_args), name)


def _v_expf(builder, x):
    """:func:`expf` on 16 lanes, the same operations in the same order (``llvm.fma.v16f32``; 2^n as a double's
    exponent bits, j · 2^n in double rounded once to float32, as the scalar's table)."""
    vf = _vf()
    fma = _fma(builder)
    fabs = _intrinsic_fn(builder, "llvm.fabs.v16f32", vf, 1)

    def c(value):
        return ir.Constant(vf, [float(value)] * LANES)
    z = builder.call(fma, [x, c(LOG2E), c(SHIFT)])
    n = builder.fsub(z, c(SHIFT))
    neg = builder.fsub(c(-0.0), n)                                          # −n
    b = builder.call(fma, [neg, c(LN2_LO), builder.call(fma, [neg, c(LN2_HI), x])])
    u = builder.fmul(b, b)
    inner = builder.call(fma, [builder.call(fma, [c(C0), b, c(C1)]), u, builder.call(fma, [c(C2), b, c(C3)])])
    j = builder.call(fma, [inner, u, builder.call(fma, [c(C4), b, c(1.0)])])
    size = builder.call(fabs, [n])
    far = builder.fcmp_ordered(">", size, c(192.0))
    n_int = builder.fptosi(builder.select(builder.fcmp_unordered(">", size, c(192.0)), c(0.0), n),
                           _vf(LANES, ir.IntType(64)))                      # |n| ≤ 192: no poison
    i64 = _vf(LANES, ir.IntType(64))
    pow2 = builder.bitcast(builder.shl(builder.add(n_int, ir.Constant(i64, [1023] * LANES)),
                                       ir.Constant(i64, [52] * LANES)), _vf(LANES, ir.DoubleType()))
    scaled = builder.fptrunc(builder.fmul(builder.fpext(j, _vf(LANES, ir.DoubleType())), pow2), vf)
    flushed = builder.select(builder.fcmp_ordered("<=", n, c(0.0)), c(0.0), c(np.inf))
    return builder.select(far, flushed, scaled)


def _data(context, builder, ty, value):
    return context.make_array(ty)(context, builder, value).data


@intrinsic
def _row_max(typingctx, s, s_at, seen):
    """max of s.flat[s_at:s_at + seen] (float32): 16 lanes, then the lanes (a max is one of its values, in any
    order)."""
    if s.dtype != types.float32:
        return None

    def codegen(context, builder, signature, args):
        data = _data(context, builder, signature.args[0], args[0])
        vf = _vf()
        ninf = ir.Constant(vf, [float("-inf")] * LANES)
        best = cgutils.alloca_once_value(builder, ninf)
        blocks = builder.sdiv(builder.add(args[2], ir.Constant(args[2].type, LANES - 1)),
                              ir.Constant(args[2].type, LANES))
        with cgutils.for_range(builder, blocks) as loop:
            at = builder.mul(loop.index, ir.Constant(loop.index.type, LANES))
            x = builder.select(_lanes_below(builder, at, args[2]),
                               _vec_load(builder, data, builder.add(args[1], at), False), ninf)
            m = builder.load(best)
            builder.store(builder.select(builder.fcmp_ordered(">", x, m), x, m), best)
        m = builder.load(best)
        for width in (8, 4, 2, 1):
            lo, hi = _take(builder, m, list(range(width))), _take(builder, m, list(range(width, 2 * width)))
            m = builder.select(builder.fcmp_ordered(">", hi, lo), hi, lo)
        return builder.extract_element(m, ir.Constant(ir.IntType(32), 0))
    return types.float32(s, types.intp, types.intp), codegen


@intrinsic
def _exp_sum(typingctx, s, s_at, top, e, e_at, seen):
    """e.flat[e_at + j] = expf(s.flat[s_at + j] − top) for j < seen, 0 for the rest of its 16-block; returns
    ggml's sum: each block's :func:`reduce16` in float32, the blocks added in double in turn."""
    if s.dtype != types.float32 or e.dtype != types.float32:
        return None

    def codegen(context, builder, signature, args):
        s_data = _data(context, builder, signature.args[0], args[0])
        e_data = _data(context, builder, signature.args[3], args[3])
        vf = _vf()
        top = _splat(builder, args[2])
        total = cgutils.alloca_once_value(builder, ir.Constant(ir.DoubleType(), 0.0))
        blocks = builder.sdiv(builder.add(args[5], ir.Constant(args[5].type, LANES - 1)),
                              ir.Constant(args[5].type, LANES))
        with cgutils.for_range(builder, blocks) as loop:
            at = builder.mul(loop.index, ir.Constant(loop.index.type, LANES))
            x = builder.fsub(_vec_load(builder, s_data, builder.add(args[1], at), False), top)
            y = builder.select(_lanes_below(builder, at, args[5]), _v_expf(builder, x), ir.Constant(vf, [0.0] * LANES))
            ptr = builder.bitcast(builder.gep(e_data, [builder.add(args[4], at)]), vf.as_pointer())
            builder.store(y, ptr, align=4)
            part = builder.fpext(_reduce16(builder, y), ir.DoubleType())
            builder.store(builder.fadd(builder.load(total), part), total)
        return builder.load(total)
    return types.float64(s, types.intp, types.float32, e, types.intp, types.intp), codegen


@intrinsic
def _scale_half(typingctx, e, e_at, inv, blocks):
    """e.flat[e_at:e_at + 16 · blocks] = half(e · inv): the softmax's weights, rounded to float16."""
    if e.dtype != types.float32:
        return None

    def codegen(context, builder, signature, args):
        data = _data(context, builder, signature.args[0], args[0])
        vf = _vf()
        inv = _splat(builder, args[2])
        with cgutils.for_range(builder, args[3]) as loop:
            at = builder.mul(loop.index, ir.Constant(loop.index.type, LANES))
            ptr = builder.bitcast(builder.gep(data, [builder.add(args[1], at)]), vf.as_pointer())
            w = builder.fmul(builder.load(ptr, align=4), inv)
            builder.store(builder.fpext(builder.fptrunc(w, _vf(LANES, ir.HalfType())), vf), ptr, align=4)
        return context.get_dummy_value()
    return types.void(e, types.intp, types.float32, types.intp), codegen


@intrinsic
def _widen_row(typingctx, src, s_at, dst, d_at, chunks):
    """dst.flat[d_at:d_at + 16 · chunks] = src.flat[s_at:…] widened (a float16 array's bits by ``fpext``:
    vcvtph2ps; float32 copied)."""
    if dst.dtype != types.float32 or src.dtype not in (types.float32, types.uint16):
        return None
    half_bits = src.dtype == types.uint16

    def codegen(context, builder, signature, args):
        s_data = _data(context, builder, signature.args[0], args[0])
        d_data = _data(context, builder, signature.args[2], args[2])
        with cgutils.for_range(builder, args[4]) as loop:
            at = builder.mul(loop.index, ir.Constant(loop.index.type, LANES))
            x = _vec_load(builder, s_data, builder.add(args[1], at), half_bits)
            ptr = builder.bitcast(builder.gep(d_data, [builder.add(args[3], at)]), _vf().as_pointer())
            builder.store(x, ptr, align=4)
        return context.get_dummy_value()
    return types.void(src, types.intp, dst, types.intp, types.intp), codegen


@numba.njit(nogil=True, cache=True, inline="always")
def _widen_rows(src, rows, dst):
    """dst[j] = src[j] widened to float32, j < rows (dst C-contiguous; rows of 16 · m values in vectors when
    src's rows are contiguous)."""
    d = src.shape[1]
    size = src.itemsize
    if d % LANES == 0 and src.strides[1] == size and src.strides[0] % size == 0:
        step = src.strides[0] // size
        for j in range(rows):
            _widen_row(src, j * step, dst, j * d, d // LANES)
        return
    for j in range(rows):
        for t in range(d):
            dst[j, t] = widen(src[j, t])


def _tree16(builder, keys):
    """Sixteen keys' 16-lane vectors to a vector of their 16 sums, each in :func:`reduce16`'s order (lane u + u+8,
    then u+4, u+2, u+1), the keys' halves interleaved at each level: 15 shuffle-adds."""
    def level(vs, lo, hi):
        return [_shuffle_add(builder, vs[i], vs[i + 1], lo, hi) for i in range(0, len(vs), 2)]
    vs = level(keys, [*range(8), *range(16, 24)], [*range(8, 16), *range(24, 32)])           # 2 keys × 8 lanes
    quad = [u for blk in range(0, 32, 8) for u in range(blk, blk + 4)]
    vs = level(vs, quad, [u + 4 for u in quad])                                            # 4 keys × 4 lanes
    pair = [u for blk in range(0, 32, 4) for u in (blk, blk + 1)]
    vs = level(vs, pair, [u + 2 for u in pair])                                            # 8 keys × 2 lanes
    return level(vs, list(range(0, 32, 2)), list(range(1, 32, 2)))[0]                      # 16 keys


def _scores_codegen(one: bool, fixed_d=None):
    def codegen(context, builder, signature, args):
        """s.flat[s_at + j] = (q.flat[q_at:q_at + d] · k.flat[j · d:]) · scale for j < 16 · blocks (k's rows
        past ``last`` read as its row ``last``; k float32 or a float16 array's bits, widened), sixteen keys
        at a time: one token's (ggml_vec_dot_f16: four registers over each 64, then (0 + 2) + (1 + 3)) or a
        batch's (tinyBLAS: one register over each 16), then the keys' trees together (:func:`_tree16`). The
        blocks wholly below ``last`` read their rows unclamped; ``fixed_d``: d known here, its loop unrolled."""
        q, q_at, k, d, blocks, scale, s, s_at, last = args
        half_bits = _half(signature.args[2])
        q_data = _data(context, builder, signature.args[0], q)
        k_data = _data(context, builder, signature.args[2], k)
        s_data = _data(context, builder, signature.args[6], s)
        vf = _vf()
        fma = _fma(builder)
        zero = ir.Constant(vf, [0.0] * LANES)
        regs = 4 if one else 1
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(regs)] for _ in range(LANES)]
        it = d.type
        if fixed_d is not None:
            d = ir.Constant(it, fixed_d)
        steps = builder.sdiv(d, ir.Constant(it, LANES * regs))
        scale = _splat(builder, scale)

        def key(row, r):
            if fixed_d is not None:                  # the steps unrolled, the registers as values
                a = [zero] * regs
                for step in range(fixed_d // (LANES * regs)):
                    for m in range(regs):
                        off = ir.Constant(it, (step * regs + m) * LANES)
                        qv = _vec_load(builder, q_data, builder.add(q_at, off), False)
                        kv = _vec_load(builder, k_data, builder.add(row, off), half_bits)
                        a[m] = builder.call(fma, [qv, kv, a[m]])
                return a
            for m in range(regs):
                builder.store(zero, accs[r][m])
            with cgutils.for_range(builder, steps) as loop:
                at = builder.mul(loop.index, ir.Constant(it, LANES * regs))
                for m in range(regs):
                    off = builder.add(at, ir.Constant(it, m * LANES))
                    qv = _vec_load(builder, q_data, builder.add(q_at, off), False)
                    kv = _vec_load(builder, k_data, builder.add(row, off), half_bits)
                    builder.store(builder.call(fma, [qv, kv, builder.load(accs[r][m])]), accs[r][m])
            return [builder.load(x) for x in accs[r]]

        def block(base, clamp):
            keys = []
            for r in range(LANES):
                j = builder.add(base, ir.Constant(it, r))
                if clamp:                            # past the last row: its copy (a score never looked at)
                    j = builder.select(builder.icmp_signed(">", j, last), last, j)
                a = key(builder.mul(j, d), r)
                keys.append(builder.fadd(builder.fadd(a[0], a[2]), builder.fadd(a[1], a[3])) if one else a[0])
            ptr = builder.bitcast(builder.gep(s_data, [builder.add(s_at, base)]), vf.as_pointer())
            builder.store(builder.fmul(_tree16(builder, keys), scale), ptr, align=4)

        _key_blocks(builder, block, last, blocks)
        return context.get_dummy_value()
    return codegen


def _key_blocks(builder, block, last, blocks):
    """``block(first, clamp)`` for each 16 keys: the whole blocks up to key ``last``, then (when ``blocks`` has one
    more) the block past it, ``clamp`` telling it to read key ``last`` for the keys beyond."""
    it = last.type
    full = builder.sdiv(builder.add(last, ir.Constant(it, 1)), ir.Constant(it, LANES))
    with cgutils.for_range(builder, full) as blk:
        block(builder.mul(blk.index, ir.Constant(it, LANES)), False)
    with builder.if_then(builder.icmp_signed(">", blocks, full)):
        block(builder.mul(full, ir.Constant(it, LANES)), True)


def _scores_sig(q, k, s):
    if q.dtype != types.float32 or k.dtype not in (types.float32, types.uint16) or s.dtype != types.float32:
        return None
    return types.void(q, types.intp, k, types.intp, types.intp, types.float32, s, types.intp, types.intp)


def _scores_intrinsic(one: bool, d: int | None, doc: str):
    """The scores intrinsic of one token (``one``) or a batch, for any d (a multiple of 64 or 16) or unrolled
    for ``d`` (:func:`_scores_codegen`)."""
    @intrinsic
    def scores(typingctx, q, q_at, k, d_, blocks, scale, s, s_at, last):
        sig = _scores_sig(q, k, s)
        return None if sig is None else (sig, _scores_codegen(one, d))
    scores.__doc__ = doc
    return scores


_scores_one = _scores_intrinsic(True, None, "One token's scores, 16 keys at a time (d a multiple of 64).")
_scores_batch = _scores_intrinsic(False, None, "A batch's scores, 16 keys at a time (d a multiple of 16).")
_scores_one64 = _scores_intrinsic(True, 64, ":func:`_scores_one` for d = 64, unrolled.")
_scores_batch64 = _scores_intrinsic(False, 64, ":func:`_scores_batch` for d = 64, unrolled.")


def _scores3_codegen(one: bool):
    def codegen(context, builder, signature, args):
        """:func:`_scores_codegen` for three heads (q.flat[q_at + 64 · h:], s.flat[s_at + h · s_stride:]) and d
        = 64: each key row loaded (and widened) once for the three; each head's sixteen keys folded as they
        come (:func:`_tree16`'s pairs, in its order)."""
        q, q_at, k, d, blocks, scale, s, s_at, last, s_stride = args
        half_bits = _half(signature.args[2])
        q_data = _data(context, builder, signature.args[0], q)
        k_data = _data(context, builder, signature.args[2], k)
        s_data = _data(context, builder, signature.args[6], s)
        vf = _vf()
        fma = _fma(builder)
        zero = ir.Constant(vf, [0.0] * LANES)
        it = d.type
        scale = _splat(builder, scale)
        qs = [[_vec_load(builder, q_data, builder.add(q_at, ir.Constant(it, 64 * h + LANES * c)), False)
               for c in range(4)] for h in range(3)]
        levels = ([*range(8), *range(16, 24)], [*range(8, 16), *range(24, 32)]), \
            ([u for b in range(0, 32, 8) for u in range(b, b + 4)], [u + 4 for b in range(0, 32, 8)
                                                                      for u in range(b, b + 4)]), \
            ([u for b in range(0, 32, 4) for u in (b, b + 1)], [u + 2 for b in range(0, 32, 4) for u in (b, b + 1)]), \
            (list(range(0, 32, 2)), list(range(1, 32, 2)))

        def block(base, clamp):
            stacks = [[] for _ in range(3)]            # per head: (level, vector), pairs folded as they come
            for r in range(LANES):
                j = builder.add(base, ir.Constant(it, r))
                if clamp:                              # past the last row: its copy (a score never looked at)
                    j = builder.select(builder.icmp_signed(">", j, last), last, j)
                row = builder.mul(j, ir.Constant(it, 64))
                kv = [_vec_load(builder, k_data, builder.add(row, ir.Constant(it, LANES * c)), half_bits)
                      for c in range(4)]
                for h in range(3):
                    if one:
                        a = [builder.call(fma, [qs[h][c], kv[c], zero]) for c in range(4)]
                        vec = builder.fadd(builder.fadd(a[0], a[2]), builder.fadd(a[1], a[3]))
                    else:
                        vec = zero
                        for c in range(4):
                            vec = builder.call(fma, [qs[h][c], kv[c], vec])
                    level, st = 0, stacks[h]
                    while st and st[-1][0] == level:
                        lo, hi = levels[level]
                        vec = _shuffle_add(builder, st.pop()[1], vec, lo, hi)
                        level += 1
                    st.append((level, vec))
            for h in range(3):
                at = builder.add(builder.add(s_at, builder.mul(s_stride, ir.Constant(it, h))), base)
                ptr = builder.bitcast(builder.gep(s_data, [at]), vf.as_pointer())
                builder.store(builder.fmul(stacks[h][0][1], scale), ptr, align=4)

        _key_blocks(builder, block, last, blocks)
        return context.get_dummy_value()
    return codegen


def _scores3_sig(q, k, s):
    sig = _scores_sig(q, k, s)
    return None if sig is None else types.void(*sig.args, types.intp)


@intrinsic
def _scores_one64x3(typingctx, q, q_at, k, d, blocks, scale, s, s_at, last, s_stride):
    """One token's scores for three heads, d = 64 (:func:`_scores3_codegen`)."""
    sig = _scores3_sig(q, k, s)
    return None if sig is None else (sig, _scores3_codegen(True))


@intrinsic
def _scores_batch64x3(typingctx, q, q_at, k, d, blocks, scale, s, s_at, last, s_stride):
    """A batch's scores for three heads, d = 64 (:func:`_scores3_codegen`)."""
    sig = _scores3_sig(q, k, s)
    return None if sig is None else (sig, _scores3_codegen(False))


@numba.njit(nogil=True, cache=True, inline="always")
def _scores(qh, kw, seen, one, scale, s):
    """s[hh, j] = (qh[hh] · kw[j]) · scale for j < seen rounded up to 16 (the scores past seen of a copy of
    key seen − 1); kw (≥ seen, d) float32 or a float16 array's bits, C-contiguous."""
    group, d = qh.shape
    blocks = (seen + LANES - 1) // LANES
    n_kv = s.shape[1]
    hh = 0
    while d == 64 and hh + 3 <= group:                 # three heads a call: each key row loaded once for them
        if one:
            _scores_one64x3(qh, hh * d, kw, d, blocks, scale, s, hh * n_kv, seen - 1, n_kv)
        else:
            _scores_batch64x3(qh, hh * d, kw, d, blocks, scale, s, hh * n_kv, seen - 1, n_kv)
        hh += 3
    for hh in range(hh, group):
        if one and d == 64:
            _scores_one64(qh, hh * d, kw, d, blocks, scale, s, hh * n_kv, seen - 1)
        elif one:
            _scores_one(qh, hh * d, kw, d, blocks, scale, s, hh * n_kv, seen - 1)
        elif d == 64:
            _scores_batch64(qh, hh * d, kw, d, blocks, scale, s, hh * n_kv, seen - 1)
        else:
            _scores_batch(qh, hh * d, kw, d, blocks, scale, s, hh * n_kv, seen - 1)


@numba.njit(nogil=True, cache=True, inline="always")
def _softmax(s, seen, e):
    """e[hh, :seen] = ggml's softmax of s[hh, :seen], rounded to float16 (the rest of the last 16-block 0)."""
    n_kv = s.shape[1]
    for hh in range(s.shape[0]):
        top = _row_max(s, hh * n_kv, seen)
        total = _exp_sum(s, hh * n_kv, top, e, hh * n_kv, seen)
        _scale_half(e, hh * n_kv, F32(1.0 / total), (seen + LANES - 1) // LANES)


def _weigh_codegen(lanes: int, heads: int):
    def codegen(context, builder, signature, args):
        """For each of ``heads`` heads h (sums.flat[s_at + h · lanes · d:], e.flat[e_at + h · e_stride:]):
        sums_h[r, :] = Σ_b e_h[b · lanes + r] · v.flat[(b · lanes + r) · d:][:d] for every lane r < lanes, b <
        blocks in turn (v's rows past ``last`` read as its row ``last``, their weights 0; v float32 or a float16
        array's bits, widened once for the heads): eight lanes by one 16-feature chunk at a time, their running
        sums in registers (8 · heads independent chains of fused multiply-adds: each product of two float16
        values exact, so the add rounded once as ggml's)."""
        sums, s_at, e, e_at, e_stride, v, d, blocks, last = args
        half_bits = _half(signature.args[5])
        s_data = _data(context, builder, signature.args[0], sums)
        e_data = _data(context, builder, signature.args[2], e)
        v_data = _data(context, builder, signature.args[5], v)
        vf = _vf()
        fma = _fma(builder)
        it = d.type
        zero = ir.Constant(vf, [0.0] * LANES)
        accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(8)] for _ in range(heads)]
        e_ats = [builder.add(e_at, builder.mul(e_stride, ir.Constant(it, h))) for h in range(heads)]
        chunks = builder.sdiv(d, ir.Constant(it, LANES))
        full = builder.sdiv(builder.add(last, ir.Constant(it, 1)), ir.Constant(it, lanes))   # blocks below last

        def block(b, r0, col, clamp):
            j0 = builder.add(builder.mul(b, ir.Constant(it, lanes)), r0)
            for x in range(8):
                j = builder.add(j0, ir.Constant(it, x))
                row = builder.select(builder.icmp_signed(">", j, last), last, j) if clamp else j
                vv = _vec_load(builder, v_data, builder.add(builder.mul(row, d), col), half_bits)
                for h in range(heads):
                    w = builder.load(builder.gep(e_data, [builder.add(e_ats[h], j)]))
                    builder.store(builder.call(fma, [_splat(builder, w), vv, builder.load(accs[h][x])]), accs[h][x])

        with cgutils.for_range(builder, ir.Constant(it, lanes // 8)) as r8:
            r0 = builder.mul(r8.index, ir.Constant(it, 8))
            with cgutils.for_range(builder, chunks) as ch:
                col = builder.mul(ch.index, ir.Constant(it, LANES))
                for h in range(heads):
                    for x in range(8):
                        builder.store(zero, accs[h][x])
                with cgutils.for_range(builder, full) as b:
                    block(b.index, r0, col, False)
                with builder.if_then(builder.icmp_signed(">", blocks, full)):
                    block(full, r0, col, True)
                for h in range(heads):
                    for x in range(8):
                        row = builder.mul(builder.add(r0, ir.Constant(it, x)), d)
                        head = builder.add(s_at, builder.mul(ir.Constant(it, h * lanes), d))
                        at = builder.add(head, builder.add(row, col))
                        ptr = builder.bitcast(builder.gep(s_data, [at]), vf.as_pointer())
                        builder.store(builder.load(accs[h][x]), ptr, align=4)
        return context.get_dummy_value()
    return codegen


def _weigh_sig(sums, e, v):
    if sums.dtype != types.float32 or e.dtype != types.float32 or v.dtype not in (types.float32, types.uint16):
        return None
    return types.void(sums, types.intp, e, types.intp, types.intp, v, types.intp, types.intp, types.intp)


def _weigh_intrinsic(lanes: int, heads: int, doc: str):
    """The weighted-sum intrinsic in ``lanes`` lanes (64: one token, 16: a batch) for ``heads`` heads at once
    (:func:`_weigh_codegen`)."""
    @intrinsic
    def weigh(typingctx, sums, s_at, e, e_at, e_stride, v, d, blocks, last):
        sig = _weigh_sig(sums, e, v)
        return None if sig is None else (sig, _weigh_codegen(lanes, heads))
    weigh.__doc__ = doc
    return weigh


_weigh64 = _weigh_intrinsic(64, 1, "One token's weighted sum in its 64 lanes, one head.")
_weigh64x3 = _weigh_intrinsic(64, 3, ":func:`_weigh64` for three heads at once (each value row widened once for them).")
_weigh16 = _weigh_intrinsic(16, 1, "A batch's weighted sum in its 16 lanes, one head.")
_weigh16x3 = _weigh_intrinsic(16, 3, ":func:`_weigh16` for three heads at once.")


@numba.njit(nogil=True, cache=True, inline="always")
def _weigh(e, vw, seen, sums):
    """sums[hh, r] = Σ e[hh, j] · vw[j] over the keys j ≡ r (mod lanes) in turn, lanes = sums.shape[1] (64 for
    one token, 16 for a batch), over whole blocks of lanes keys: the weights past ``seen`` are 0 and the rows
    read for them vw's row seen − 1 (finite), so those products add +0 or −0 to a sum that is never −0 (it
    starts at +0): the bits of stopping at ``seen``, and of ggml's padded row. The heads three at a time."""
    group, lanes, d = sums.shape
    n_kv = e.shape[1]
    blocks = (seen + lanes - 1) // lanes
    for hh in range(group):
        e[hh, (seen + LANES - 1) // LANES * LANES:blocks * lanes] = F32(0)
    hh = 0
    while hh < group:
        s_at, e_at = hh * lanes * d, hh * n_kv
        if hh + 3 <= group and lanes == 64:
            _weigh64x3(sums, s_at, e, e_at, n_kv, vw, d, blocks, seen - 1)
        elif hh + 3 <= group:
            _weigh16x3(sums, s_at, e, e_at, n_kv, vw, d, blocks, seen - 1)
        elif lanes == 64:
            _weigh64(sums, s_at, e, e_at, n_kv, vw, d, blocks, seen - 1)
        else:
            _weigh16(sums, s_at, e, e_at, n_kv, vw, d, blocks, seen - 1)
        hh += 3 if hh + 3 <= group else 1


def _lanes_codegen(lanes: int):
    def codegen(context, builder, signature, args):
        """out.flat[o_at + t] for t < 16 · chunks: the ``lanes`` rows sums.flat[s_at + u · d:] added lanewise
        along t, as one dot product's registers: 64 lanes (0 + 2) + (1 + 3) of its four, then the tree of
        :func:`reduce16`."""
        s_data = _data(context, builder, signature.args[0], args[0])
        o_data = _data(context, builder, signature.args[3], args[3])
        d = args[2]
        with cgutils.for_range(builder, args[5]) as loop:
            at = builder.mul(loop.index, ir.Constant(loop.index.type, LANES))
            rows = [_vec_load(builder, s_data, builder.add(builder.add(args[1], builder.mul(d, ir.Constant(
                d.type, u))), at), False) for u in range(lanes)]
            if lanes == 64:
                rows = [builder.fadd(builder.fadd(rows[u], rows[32 + u]), builder.fadd(rows[16 + u], rows[48 + u]))
                        for u in range(LANES)]
            for width in (8, 4, 2, 1):
                rows = [builder.fadd(rows[u], rows[u + width]) for u in range(width)]
            ptr = builder.bitcast(builder.gep(o_data, [builder.add(args[4], at)]), _vf().as_pointer())
            builder.store(rows[0], ptr, align=4)
        return context.get_dummy_value()
    return codegen


@intrinsic
def _lanes64(typingctx, sums, s_at, d, out, o_at, chunks):
    """One token's weighted sums from their 64 lanes (:func:`_lanes_codegen`)."""
    if sums.dtype != types.float32 or out.dtype != types.float32:
        return None
    return types.void(sums, types.intp, types.intp, out, types.intp, types.intp), _lanes_codegen(64)


@intrinsic
def _lanes16(typingctx, sums, s_at, d, out, o_at, chunks):
    """A batch's weighted sums from their 16 lanes (:func:`_lanes_codegen`)."""
    if sums.dtype != types.float32 or out.dtype != types.float32:
        return None
    return types.void(sums, types.intp, types.intp, out, types.intp, types.intp), _lanes_codegen(16)


@numba.njit(nogil=True, cache=True, inline="always")
def _gather(sums, one, out_rows):
    """out_rows[hh, t] = the lanes of sums[hh, :, t] added: one token's (0 + 2) + (1 + 3) of its four registers
    then :func:`reduce16`, a batch's :func:`reduce16`, 16 features at a time."""
    group, lanes, d = sums.shape
    for hh in range(group):
        if one:
            _lanes64(sums, hh * lanes * d, d, out_rows, hh * d, d // LANES)
        else:
            _lanes16(sums, hh * lanes * d, d, out_rows, hh * d, d // LANES)


@numba.njit(nogil=True, cache=True)
def attention(q, k, v, start, scale, out):
    """ggml_arith.attention: q (h, n, d) float32; k, v (h_kv, ≥ start + n, d) float16 bits (uint16) or float32
    holding float16 values; out (h, n, d) float32. Each key/value head's rows are widened once into float32
    scratch (padded with zero rows to a multiple of 64) for its group's heads and queries; then per query the
    scores (:func:`_scores`), the softmax (:func:`_softmax`) and the weighted sum (:func:`_weigh`,
    :func:`_gather`) in 16-lane vectors, each add where ggml has it. A d not a multiple of 16 (of 64 for one
    token: ggml's double tail) takes :func:`attention_scalar`."""
    h, n, d = q.shape
    one = n == 1
    if d % LANES or (one and d % 64):
        attention_scalar(q, k, v, start, scale, out)
        return
    group = h // k.shape[0]
    n_kv = (start + n + 63) // 64 * 64
    qh = np.empty((group, d), F32)
    s = np.empty((group, n_kv), F32)
    e = np.empty((group, n_kv), F32)
    sums = np.empty((group, 64 if one else LANES, d), F32)   # (head, lane, d): the weighted sum's registers
    rows = np.empty((group, d), F32)
    size = k.itemsize
    direct = one and k.strides[2] == size and k.strides[1] == d * size and v.strides[2] == size \
        and v.strides[1] == d * size
    if not direct:
        kw = np.empty((start + n, d), F32)
        vw = np.empty((start + n, d), F32)
    for g in range(k.shape[0]):
        if direct:                                   # one token: each key read once, widened as it is loaded
            _queries(q, k[g], v[g], g, start, scale, qh, s, e, sums, rows, out)
        else:                                        # a batch: the group's rows widened once for its queries
            _widen_rows(k[g], start + n, kw)
            _widen_rows(v[g], start + n, vw)
            _queries(q, kw, vw, g, start, scale, qh, s, e, sums, rows, out)


@numba.njit(nogil=True, cache=True, inline="always")
def _queries(q, kg, vg, g, start, scale, qh, s, e, sums, rows, out):
    """out[g · group + hh, i] for every query i of key/value head g's group: kg, vg (≥ start + n, d) float32 or
    float16 bits, C-contiguous."""
    group, d = qh.shape
    n = q.shape[1]
    one = n == 1
    for i in range(n):
        seen = start + i + 1
        for hh in range(group):
            for t in range(d):
                qh[hh, t] = half(q[g * group + hh, i, t])
        _scores(qh, kg, seen, one, scale, s)
        _softmax(s, seen, e)
        _weigh(e, vg, seen, sums)
        _gather(sums, one, rows)
        for hh in range(group):
            for t in range(d):
                out[g * group + hh, i, t] = rows[hh, t]
