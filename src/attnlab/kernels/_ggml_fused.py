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
from numba.extending import intrinsic

from ._fused import widen

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
def attention(q, k, v, start, scale, out):
    """ggml_arith.attention: q (h, n, d) float32; k, v (h_kv, ≥ start + n, d) float16 bits (uint16) or float32
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
