"""llama.cpp's arithmetic between the products (:mod:`attnlab.kernels.ggml_arith`, the numpy reference), as numba
kernels: the same roundings in the same orders, so the same bits (tests/test_ggml_fused.py holds each to the
reference), at the q8 mode's speed.

Two LLVM operations carry it: ``llvm.fma.f32`` (one rounding: ``vfmadd`` here, a correctly rounded software fma
where the CPU has none) for ggml's fused multiply-adds, and ``fptrunc`` to half then ``fpext`` for its float16
roundings (ties to even, as F16C's ``vcvtps2ph``). numba compiles without fast-math: no other multiply and add
is fused. Compiled with ``cache=True`` (the machine code kept in ``__pycache__``), ``nogil=True``; single-threaded,
so every call gives the same bits.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ._fused import LANES, _axpy1, _axpy4, _dot4, _fma, _fold4, _vec_load, widen

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
def _dot4_one(typingctx, q, q_at, k, k0, k1, k2, k3, quads):
    """Four ``ggml_vec_dot_f16``s q.flat[q_at:] · k.flat[k_r:] over 64 · quads features (float32 holding float16
    values): per key four 16-lane registers, register m the products of the m-th 16 of each 64 added in turn,
    then (0 + 2) + (1 + 3) and :func:`reduce16` (four keys' trees at once, :func:`_fold4`). The products of two
    float16 values are exact in float32: a fused multiply-add is the product added, rounded once."""
    if q.dtype != types.float32 or k.dtype != types.float32:
        return None

    def codegen(context, builder, signature, args):
        q_data = _data(context, builder, signature.args[0], args[0])
        k_data = _data(context, builder, signature.args[2], args[2])
        vf = _vf()
        fma = _fma(builder)
        accs = [[cgutils.alloca_once_value(builder, ir.Constant(vf, [0.0] * LANES)) for _ in range(4)]
                for _ in range(4)]
        with cgutils.for_range(builder, args[7]) as loop:
            base = builder.mul(loop.index, ir.Constant(loop.index.type, 4 * LANES))
            for m in range(4):
                at = builder.add(base, ir.Constant(base.type, m * LANES))
                qv = _vec_load(builder, q_data, builder.add(args[1], at), False)
                for r in range(4):
                    kv = _vec_load(builder, k_data, builder.add(args[3 + r], at), False)
                    builder.store(builder.call(fma, [qv, kv, builder.load(accs[r][m])]), accs[r][m])
        keys = []
        for r in range(4):
            a = [builder.load(x) for x in accs[r]]
            keys.append(builder.fadd(builder.fadd(a[0], a[2]), builder.fadd(a[1], a[3])))
        sums = _fold4(builder, keys)
        out = ir.Constant(ir.ArrayType(ir.FloatType(), 4), ir.Undefined)
        for r in range(4):
            out = builder.insert_value(out, builder.extract_element(sums, ir.Constant(ir.IntType(32), r)), r)
        return out
    return types.UniTuple(types.float32, 4)(q, types.intp, k, types.intp, types.intp, types.intp, types.intp,
                                            types.intp), codegen


@numba.njit(nogil=True, cache=True, inline="always")
def _widen_rows(src, rows, dst):
    """dst[j] = src[j] widened to float32, j < rows."""
    for j in range(rows):
        for t in range(src.shape[1]):
            dst[j, t] = widen(src[j, t])


@numba.njit(nogil=True, cache=True, inline="always")
def _scores(qh, kw, seen, one, scale, s):
    """s[hh, j] = (qh[hh] · kw[j]) · scale for j < seen rounded up to 4 (kw's rows padded with zeros): one
    token's order (:func:`_dot4_one`) or a batch's (tinyBLAS: ``_fused._dot4``, one register over each 16)."""
    group, d = qh.shape
    for hh in range(group):
        for j in range(0, seen, 4):
            if one:
                a = _dot4_one(qh, hh * d, kw, j * d, (j + 1) * d, (j + 2) * d, (j + 3) * d, d // 64)
            else:
                a = _dot4(qh, hh * d, kw, j * d, (j + 1) * d, (j + 2) * d, (j + 3) * d, d // LANES)
            s[hh, j] = a[0] * scale
            s[hh, j + 1] = a[1] * scale
            s[hh, j + 2] = a[2] * scale
            s[hh, j + 3] = a[3] * scale


@numba.njit(nogil=True, cache=True, inline="always")
def _softmax(s, seen, e):
    """e[hh, :seen] = ggml's softmax of s[hh, :seen], rounded to float16 (the rest of the last 16-block 0)."""
    n_kv = s.shape[1]
    for hh in range(s.shape[0]):
        top = _row_max(s, hh * n_kv, seen)
        total = _exp_sum(s, hh * n_kv, top, e, hh * n_kv, seen)
        _scale_half(e, hh * n_kv, F32(1.0 / total), (seen + LANES - 1) // LANES)


@numba.njit(nogil=True, cache=True, inline="always")
def _weigh(e, vw, seen, sums):
    """sums[hh, r] = Σ e[hh, j] · vw[j] over the keys j < seen with j ≡ r (mod lanes), in turn: the weighted
    sum's lane r of each feature (lanes = sums.shape[1]: 64 for one token, 16 for a batch), four keys of a lane
    per step (``_fused._axpy4``: the lane's row loaded and stored once for them)."""
    group, lanes, d = sums.shape
    chunks = d // LANES
    sums[:, :, :] = F32(0)
    for hh in range(group):
        for r in range(min(lanes, seen)):
            at = (hh * lanes + r) * d
            j = r
            while j + 3 * lanes < seen:
                _axpy4(sums, at, e[hh, j], e[hh, j + lanes], e[hh, j + 2 * lanes], e[hh, j + 3 * lanes],
                       vw, j * d, (j + lanes) * d, (j + 2 * lanes) * d, (j + 3 * lanes) * d, chunks)
                j += 4 * lanes
            while j < seen:
                _axpy1(sums, at, e[hh, j], vw, j * d, chunks)
                j += lanes


@numba.njit(nogil=True, cache=True, inline="always")
def _gather(sums, one, out_rows):
    """out_rows[hh, t] = the lanes of sums[hh, :, t] added: one token's (0 + 2) + (1 + 3) of its four registers
    then :func:`reduce16`, a batch's :func:`reduce16`, feature by feature."""
    group, lanes, d = sums.shape
    acc = np.empty(LANES, F32)
    for hh in range(group):
        for t in range(d):
            if one:
                for u in range(LANES):
                    acc[u] = (sums[hh, u, t] + sums[hh, 32 + u, t]) + (sums[hh, 16 + u, t] + sums[hh, 48 + u, t])
            else:
                for u in range(LANES):
                    acc[u] = sums[hh, u, t]
            out_rows[hh, t] = reduce16(acc, 0)


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
    n_k = start + n
    n_kv = (n_k + 63) // 64 * 64
    kw = np.zeros((n_kv, d), F32)
    vw = np.zeros((n_kv, d), F32)
    qh = np.empty((group, d), F32)
    s = np.empty((group, n_kv), F32)
    e = np.empty((group, n_kv), F32)
    sums = np.empty((group, 64 if one else LANES, d), F32)   # (head, lane, d): the weighted sum's registers
    rows = np.empty((group, d), F32)
    for g in range(k.shape[0]):
        _widen_rows(k[g], n_k, kw)
        _widen_rows(v[g], n_k, vw)
        for i in range(n):
            seen = start + i + 1
            for hh in range(group):
                for t in range(d):
                    qh[hh, t] = half(q[g * group + hh, i, t])
            _scores(qh, kw, seen, one, scale, s)
            _softmax(s, seen, e)
            _weigh(e, vw, seen, sums)
            _gather(sums, one, rows)
            for hh in range(group):
                for t in range(d):
                    out[g * group + hh, i, t] = rows[hh, t]
