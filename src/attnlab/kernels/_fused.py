"""The fused tile kernel (numba, the optional extra ``attnlab[fast]``): the per-tile work numpy cannot fuse.

numpy runs the online softmax's middle as separate passes over each (rows, cols) tile of scores: the row
max, the shift, the exponential, the causal diagonal's mask and the row sum, each one more trip through
memory. Here they are one loop per row (the row, 2 KiB of float32, stays in L1 between its max and its
exponential): ::

    m'  = max(m, max_j s_j)                    only for rows whose scores are not bounded
    shift moves to m' when m' leaves ±SHIFT_SLACK of it; l, acc rescaled by 2^(shift - shift')
    p_j = 2^(s_j - shift)  for j in [lo, hi)   0 outside: the causal diagonal and the window, same pass
    l   = (l +) Σ_j p_j

The two matrix products stay in BLAS (numpy's matmul); scores are in base 2 (log₂e folded into q's scale).

The float32 exponential is a polynomial: 2^x = 2^⌊x⌋ · 2^f with f = x - ⌊x⌋ in [0, 1); 2^f is a degree-6
polynomial (a Chebyshev fit, 2.6e-9 relative error in exact arithmetic, 8e-8 evaluated in float32) and
⌊x⌋ is added straight into the float's exponent bits. LLVM vectorises the loop (numpy's float32 exp2
is vectorised only with AVX-512). float64 tiles call ``np.exp2``, which is exact to float64.

Compiled with ``nogil=True`` (the tiled path's two worker threads run tiles at once) and ``cache=True``
(the machine code is kept in ``__pycache__``: a second process compiles nothing).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

# A row's exponentials stay below 2^(SHIFT_SLACK₂) (e^30 ≈ 1e13), as the numpy path's (attnlab.kernels.tiled).
SHIFT_SLACK2 = 30.0 / math.log(2)
# 2^f on [0, 1), lowest degree first: least squares on 2,000 Chebyshev nodes (numpy.polynomial).
P0, P1, P2, P3 = 1.0000000025868898, 0.6931469286929531, 0.24023050204587595, 0.055480426322116146
P4, P5, P6 = 0.009684580459334008, 0.0012387821416546601, 0.00021877504979813417


@intrinsic
def _f32_bits(typingctx, x):
    """The bits of a float32 as an int32 (a register reinterpretation, which LLVM vectorises)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(types.float32), codegen


@intrinsic
def _bits_f32(typingctx, x):
    """An int32's bits as a float32."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


def pow2(x):
    """2^x (for numba code only: float32 by the polynomial, float64 by np.exp2)."""
    return np.exp2(x)


@overload(pow2, jit_options={"fastmath": {"contract"}})
def _pow2_overload(x):
    if isinstance(x, types.Float) and x.bitwidth == 32:
        def pow2_f32(x):
            # 2^x underflows below -126 (subnormals dropped: they weigh below 2^-126 of the row's largest)
            y = min(max(x, np.float32(-127.0)), np.float32(127.99998))
            n = np.floor(y)                                        # float32: no float-to-int64 detour
            f = y - n                                              # [0, 1)
            p = np.float32(P6)
            p = p * f + np.float32(P5)
            p = p * f + np.float32(P4)
            p = p * f + np.float32(P3)
            p = p * f + np.float32(P2)
            p = p * f + np.float32(P1)
            p = p * f + np.float32(P0)                             # 2^f in [1, 2)
            r = _bits_f32(_f32_bits(p) + (np.int32(n) << 23))     # times 2^n: n added to the exponent
            return r if x >= np.float32(-126.0) else np.float32(0.0)
        return pow2_f32
    if isinstance(x, types.Float):
        return lambda x: np.exp2(x)
    return None


@numba.njit(nogil=True, cache=True, fastmath={"contract"}, boundscheck=False)
def pow2_array(x, out):
    """out = 2^x elementwise over 1-d arrays (the kernel's exponential, exposed for tests and timing)."""
    for i in range(x.shape[0]):
        out[i] = pow2(x[i])


@numba.njit(nogil=True, cache=True, boundscheck=False)
def row_max(row, mx):
    """max(mx, max_j row[j]) with eight running maxima (LLVM vectorises these; a single-max loop it did not:
    0.2 against 0.85 ns per element)."""
    n = row.shape[0]
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = mx
    j = 0
    while j + 8 <= n:
        a0, a1, a2, a3 = max(a0, row[j]), max(a1, row[j + 1]), max(a2, row[j + 2]), max(a3, row[j + 3])
        a4, a5, a6, a7 = max(a4, row[j + 4]), max(a5, row[j + 5]), max(a6, row[j + 6]), max(a7, row[j + 7])
        j += 8
    while j < n:
        a0 = max(a0, row[j])
        j += 1
    return max(max(max(a0, a1), max(a2, a3)), max(max(a4, a5), max(a6, a7)))


@numba.njit(nogil=True, cache=True, boundscheck=False)
def lane_sum(row):
    """Σ_j row[j] in 16 fixed lanes (lane i sums row[i::16], the tail in lane 0), combined in a fixed tree: a
    sum whose order is written here, not left to LLVM. (With fastmath's ``reassoc`` LLVM chose the order
    itself, and a kernel compiled in the process summed in another order than the same kernel loaded from
    numba's cache: results differed in the last bits between a cold and a warm cache.) LLVM still vectorises
    the lanes: 0.7 against 0.45 ns per element for the reassociated loop, one core of a Xeon."""
    row = np.ascontiguousarray(row)              # layout "C" for numba (no copy: a row view is contiguous), so
    n = row.shape[0]                             # the 16 lanes load as one vector (strided "A": one by one)
    z = row.dtype.type(0)
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = z
    j = 0
    while j + 16 <= n:
        a0 += row[j]; a1 += row[j + 1]; a2 += row[j + 2]; a3 += row[j + 3]              # noqa: E702
        a4 += row[j + 4]; a5 += row[j + 5]; a6 += row[j + 6]; a7 += row[j + 7]          # noqa: E702
        b0 += row[j + 8]; b1 += row[j + 9]; b2 += row[j + 10]; b3 += row[j + 11]        # noqa: E702
        b4 += row[j + 12]; b5 += row[j + 13]; b6 += row[j + 14]; b7 += row[j + 15]      # noqa: E702
        j += 16
    while j < n:
        a0 += row[j]
        j += 1
    a = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
    b = ((b0 + b1) + (b2 + b3)) + ((b4 + b5) + (b6 + b7))
    return a + b


@numba.njit(nogil=True, cache=True, fastmath={"contract"}, boundscheck=False)
def exp_only(row, sh):
    """row[j] = 2^(row[j] - sh) in place (a vectorised loop: no reduction in it)."""
    for j in range(row.shape[0]):
        row[j] = pow2(row[j] - sh)


@numba.njit(nogil=True, cache=True, fastmath={"contract"}, boundscheck=False)
def exp_row(row, sh):
    """row[j] = 2^(row[j] - sh) in place; returns Σ_j row[j] (the exponentials a vectorised loop, then
    :func:`lane_sum`: the same bits whether numba compiled the kernel here or loaded it from its cache)."""
    for j in range(row.shape[0]):
        row[j] = pow2(row[j] - sh)
    return lane_sum(row)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def tile_softmax(s, m, shift, l, acc, hi0, lo0, first, track):
    """One tile of the online softmax, in place, in one pass per row.

    s (br, bk) base-2 scores, masked ones -inf (a dense mask); row r sees columns [max(0, lo0 + r),
    min(bk, hi0 + r)) (the causal diagonal and the window; the rest becomes 0 here). m, shift, l (br,) the
    running max, reference and sum; acc (br, d_v) the accumulator. ``first``: the rows' first tile (l is
    set, nothing is rescaled). ``track``: follow the running max (False when the scores are bounded).
    On return s holds p = 2^(s - shift), and l the running sum of what came before, rescaled: the caller adds
    the tile's row sums (a matrix-vector product with ones, as the numpy tile step does). A sum in the kernel
    left its order to LLVM (fastmath's ``reassoc``), which summed in one order when numba compiled the kernel
    in the process and in another when it loaded it from its cache; a sum in written lanes ran the tile step
    1.4x slower than this.
    """
    br, bk = s.shape
    if track:                       # every row's max first: a max followed at once by the exponential of the
        for r in range(br):         # same row ran 3-10x slower than the two as separate loops
            lo = min(max(0, lo0 + r), bk)
            hi = max(min(bk, hi0 + r), lo)
            m[r] = row_max(s[r, lo:hi], m[r])
        for r in range(br):
            mx = m[r]
            if mx > -np.inf and abs(mx - shift[r]) > SHIFT_SLACK2:
                if not first:
                    alpha = pow2(shift[r] - mx)                  # what came before, to the new reference
                    l[r] *= alpha
                    for d in range(acc.shape[1]):
                        acc[r, d] *= alpha
                shift[r] = mx
    for r in range(br):
        lo = min(max(0, lo0 + r), bk)
        hi = max(min(bk, hi0 + r), lo)
        s[r, :lo] = 0
        s[r, hi:] = 0
        exp_only(s[r, lo:hi], shift[r])          # a row view looped from 0: LLVM vectorises it (a loop over
                                                 # range(lo, hi) it did not)


@numba.njit(nogil=True, cache=True, fastmath={"contract"}, boundscheck=False)
def exp_row_scaled(row, scale2, mx):
    """row[j] = 2^((row[j] - mx) · scale2) in place; returns Σ_j row[j]. The shift comes before the scale: at
    the row's max the exponent is exactly 0, so the sum is at least 1 whatever the scale. (An FMA of
    row[j] · scale2 - mx · scale2 leaves the rounding error of mx · scale2, which at scale 1e8 exceeds 126
    and sent every weight of a row, and the sum, to 0.)"""
    for j in range(row.shape[0]):
        row[j] = pow2((row[j] - mx) * scale2)
    return lane_sum(row)                         # a written order of the sum (see lane_sum)


@numba.njit(nogil=True, cache=True, boundscheck=False)
def softmax_rows(s, scale2, maxima):
    """In place, each row of s (rows, n) becomes softmax(s · scale): the naive path's grid, where numpy takes
    a scale pass and five softmax passes with two temporaries. ``scale2`` = scale · log₂e; ``maxima``
    (rows,) scratch. A row of -inf (no key visible) becomes 0."""
    rows = s.shape[0]
    for b0 in range(0, rows, 16):                 # 16 rows at a time, still in cache for their second loop:
        b1 = min(b0 + 16, rows)                   # the maxima first (see tile_softmax), then the exponentials
        for r in range(b0, b1):
            maxima[r] = row_max(s[r], -np.inf)
        for r in range(b0, b1):
            row = s[r]
            if maxima[r] == -np.inf:
                row[:] = 0
                continue
            total = exp_row_scaled(row, scale2, maxima[r])
            inv = (total - total + 1) / total    # in the row's dtype (1 / total would be float64); total >= 1
            for j in range(row.shape[0]):
                row[j] *= inv


@numba.njit(nogil=True, cache=True, fastmath={"contract", "reassoc", "nsz"}, boundscheck=False)
def exp_minus_rows(s, shift, unit):
    """s[r, j] = exp(s[r, j] - shift[r]) in place, as 2^(s · unit - shift · unit) with ``unit`` = log₂e: the
    backward's weights a = exp(s - lse) in one pass (numpy: a subtraction pass, then exp). A shift of +inf
    (a query that saw no key) gives 0."""
    for r in range(s.shape[0]):
        row = s[r]
        sh = shift[r] * unit
        for j in range(row.shape[0]):
            row[j] = pow2(row[j] * unit - sh)


@intrinsic
def _half_bits_f32(typingctx, bits):
    """A float16 given by its bits (uint16) as a float32, exactly (LLVM's bitcast to half and fpext: F16C's
    ``vcvtph2ps`` on x86, which LLVM vectorises 16 at a time with AVX-512)."""
    if bits != types.uint16:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.uint16), codegen


def widen(x):
    """A cached key or value as the kernel computes with it (for numba code only): a float16's bits (uint16)
    as float32, a float32 or float64 as itself."""
    return x


@overload(widen)
def _widen_overload(x):
    if x == types.uint16:
        return lambda x: _half_bits_f32(x)
    if isinstance(x, types.Float):
        return lambda x: x
    return None


# Keys per tile of the decode kernel: a tile's keys and values (256 × 64 features: 64 KiB each in float32, 32
# KiB in float16) stay in L2 between the scores and the weighted sum, and its scores (g × 256) in L1.
DECODE_TILE = 256
LANES = 16          # float32 lanes of the decode kernel's vectors: one 512-bit (or two 256-bit) registers
KEYS = 4            # keys per vector step: four independent chains of fused multiply-adds


def _vec_load(builder, data, at, half: bool):
    """16 float32 from ``data[at:at + 16]`` (float32), or widened from a float16 array's bits (uint16)."""
    vf = ir.VectorType(ir.FloatType(), LANES)
    vt = ir.VectorType(ir.IntType(16), LANES) if half else vf
    x = builder.load(builder.bitcast(builder.gep(data, [at]), vt.as_pointer()), align=2 if half else 4)
    return builder.fpext(builder.bitcast(x, ir.VectorType(ir.HalfType(), LANES)), vf) if half else x


def _fma(builder):
    vf = ir.VectorType(ir.FloatType(), LANES)
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf, vf]), "llvm.fma.v16f32")


def _shuffle_add(builder, a, b, lo: list, hi: list):
    """a ⧺ b taken at ``lo`` plus a ⧺ b taken at ``hi``, lane by lane."""
    def take(at):
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), len(at)), at))
    return builder.fadd(take(lo), take(hi))


def _fold4(builder, v):
    """Four 16-lane vectors to their four sums, each folded in halves (lane u plus u + 8, then u + 4, u + 2,
    u + 1): the order of one vector folded alone, four at a time in 7 shuffle-adds."""
    x = _shuffle_add(builder, v[0], v[1], [*range(8), *range(16, 24)], [*range(8, 16), *range(24, 32)])
    y = _shuffle_add(builder, v[2], v[3], [*range(8), *range(16, 24)], [*range(8, 16), *range(24, 32)])
    z = _shuffle_add(builder, x, y, [*range(4), *range(8, 12), *range(16, 20), *range(24, 28)],
                     [*range(4, 8), *range(12, 16), *range(20, 24), *range(28, 32)])
    w = _shuffle_add(builder, z, z, [0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15])
    return _shuffle_add(builder, w, w, [0, 2, 4, 6], [1, 3, 5, 7])        # <4 x float>


def _half(k) -> bool:
    return k.dtype == types.uint16


@intrinsic
def _dot4(typingctx, q, q_at, k, k0, k1, k2, k3, chunks):
    """Four dot products q.flat[q_at:] · k.flat[k_r:] over 16 · chunks features (q float32, k float32 or a
    float16 array's bits, widened by ``fpext``: vcvtph2ps), as LLVM vector IR: per key 16 lanes, lane u the
    fused multiply-adds of the features t ≡ u (mod 16) in turn, then folded in halves (:func:`_fold4`). An
    order written here, the same whatever LLVM makes of it; four keys for four independent chains (one key at a
    time waited on each multiply-add's latency: 40 ns a key for three heads, d_head 64). The loop written in
    numba stayed scalar (LLVM's SLP vectoriser did not pack its 16 running sums), and with ``reassoc`` the
    order was LLVM's. Offsets rather than row views: a view per key cost two reference-count calls."""
    if q.dtype != types.float32 or k.dtype not in (types.float32, types.uint16):
        return None
    half = _half(k)

    def codegen(context, builder, signature, args):
        q_data = context.make_array(signature.args[0])(context, builder, args[0]).data
        k_data = context.make_array(signature.args[2])(context, builder, args[2]).data
        vf = ir.VectorType(ir.FloatType(), LANES)
        fma = _fma(builder)
        accs = [cgutils.alloca_once_value(builder, ir.Constant(vf, [0.0] * LANES)) for _ in range(KEYS)]
        with cgutils.for_range(builder, args[7]) as loop:
            at = builder.mul(loop.index, ir.Constant(loop.index.type, LANES))
            qv = _vec_load(builder, q_data, builder.add(args[1], at), False)
            for r in range(KEYS):
                kv = _vec_load(builder, k_data, builder.add(args[3 + r], at), half)
                builder.store(builder.call(fma, [qv, kv, builder.load(accs[r])]), accs[r])
        sums = _fold4(builder, [builder.load(a) for a in accs])
        out = ir.Constant(ir.ArrayType(ir.FloatType(), KEYS), ir.Undefined)
        for r in range(KEYS):
            out = builder.insert_value(out, builder.extract_element(sums, ir.Constant(ir.IntType(32), r)), r)
        return out
    return types.UniTuple(types.float32, KEYS)(q, types.intp, k, types.intp, types.intp, types.intp, types.intp,
                                               types.intp), codegen


def _axpy_codegen(n_keys: int):
    def codegen(context, builder, signature, args):
        """acc.flat[a_at:] = fma(p_r, v.flat[v_r:], …) key after key, per 16-lane chunk: one load and one store
        of the accumulator for ``n_keys`` keys, the same roundings as one key at a time."""
        acc_data = context.make_array(signature.args[0])(context, builder, args[0]).data
        v_data = context.make_array(signature.args[2 + n_keys])(context, builder, args[2 + n_keys]).data
        half = _half(signature.args[2 + n_keys])
        vf = ir.VectorType(ir.FloatType(), LANES)
        fma = _fma(builder)
        splats = []
        for r in range(n_keys):
            one = builder.insert_element(ir.Constant(vf, ir.Undefined), args[2 + r], ir.Constant(ir.IntType(32), 0))
            splats.append(builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(ir.IntType(32), LANES),
                                                                       [0] * LANES)))
        with cgutils.for_range(builder, args[-1]) as loop:
            at = builder.mul(loop.index, ir.Constant(loop.index.type, LANES))
            ptr = builder.bitcast(builder.gep(acc_data, [builder.add(args[1], at)]), vf.as_pointer())
            a = builder.load(ptr, align=4)
            for r in range(n_keys):
                a = builder.call(fma, [splats[r], _vec_load(builder, v_data, builder.add(args[3 + n_keys + r], at),
                                                            half), a])
            builder.store(a, ptr, align=4)
        return context.get_dummy_value()
    return codegen


@intrinsic
def _axpy4(typingctx, acc, a_at, p0, p1, p2, p3, v, v0, v1, v2, v3, chunks):
    """acc.flat[a_at:] += p_r · v.flat[v_r:] for the four keys r in turn, over 16 · chunks features (acc
    float32; v float32 or a float16 array's bits, widened): the weighted sum's step, in LLVM vector IR."""
    if acc.dtype != types.float32 or v.dtype not in (types.float32, types.uint16):
        return None
    f = types.float32
    return types.void(acc, types.intp, f, f, f, f, v, types.intp, types.intp, types.intp, types.intp,
                      types.intp), _axpy_codegen(KEYS)


@intrinsic
def _axpy1(typingctx, acc, a_at, p0, v, v0, chunks):
    """:func:`_axpy4` for one key."""
    if acc.dtype != types.float32 or v.dtype not in (types.float32, types.uint16):
        return None
    return types.void(acc, types.intp, types.float32, v, types.intp, types.intp), _axpy_codegen(1)


def _scores(qs, kh, j0, n, s):
    """s[i, j] = qs[i] · kh[j0 + j] for the g query heads and the n keys of a tile, each key widened (for numba
    code only). float32: four keys at a time by :func:`_dot4` (a float16 cache's keys widened in it, once per
    head: widening a block once into float32 scratch for the g heads measured no faster for SmolLM2's 3), then
    the features past the last multiple of 16 in turn; other dtypes in turn (:func:`_scores_any`)."""
    _scores_any(qs, kh, j0, n, s)


@numba.njit(nogil=True, cache=True, fastmath={"contract"}, boundscheck=False)
def _scores_any(qs, kh, j0, n, s):
    """:func:`_scores` in turn, feature after feature (float64)."""
    for j in range(n):
        for i in range(qs.shape[0]):
            total = qs[i, 0] - qs[i, 0]
            for t in range(qs.shape[1]):
                total += qs[i, t] * widen(kh[j0 + j, t])
            s[i, j] = total


@numba.njit(nogil=True, cache=True, fastmath={"contract"}, boundscheck=False, inline="always")
def _block_scores(qs, kh, j0, rows, s, col):
    """s[i, col + r] = qs[i] · kh[j0 + r] for r < rows <= 4, every head i (float32 queries): :func:`_dot4`, a
    short block repeating its last key, then the features past the last multiple of 16 in turn."""
    g, d = qs.shape
    chunks = d // LANES
    last = j0 + rows - 1
    k0, k1, k2, k3 = j0 * d, min(j0 + 1, last) * d, min(j0 + 2, last) * d, last * d
    for i in range(g):
        sums = _dot4(qs, i * d, kh, k0, k1, k2, k3, chunks)
        for r in range(rows):
            total = sums[r]
            for t in range(chunks * LANES, d):
                total += qs[i, t] * widen(kh[j0 + r, t])
            s[i, col + r] = total


@overload(_scores, jit_options={"fastmath": {"contract"}})
def _scores_overload(qs, kh, j0, n, s):
    if qs.dtype != types.float32:
        return lambda qs, kh, j0, n, s: _scores_any(qs, kh, j0, n, s)

    def scores_f32(qs, kh, j0, n, s):
        for jb in range(0, n, KEYS):
            _block_scores(qs, kh, j0 + jb, min(KEYS, n - jb), s, jb)
    return scores_f32


def _weigh(s, vh, j0, n, acc):
    """acc[i] += Σ_j s[i, j] · vh[j0 + j] key after key, each value widened (for numba code only). float32:
    four keys a step by :func:`_axpy4`; other dtypes in turn (:func:`_weigh_any`)."""
    _weigh_any(s, vh, j0, n, acc)


@numba.njit(nogil=True, cache=True, fastmath={"contract"}, boundscheck=False)
def _weigh_any(s, vh, j0, n, acc):
    """:func:`_weigh` key after key (float64)."""
    for j in range(n):
        for i in range(acc.shape[0]):
            p = s[i, j]
            for t in range(acc.shape[1]):
                acc[i, t] += p * widen(vh[j0 + j, t])


@overload(_weigh, jit_options={"fastmath": {"contract"}})
def _weigh_overload(s, vh, j0, n, acc):
    if acc.dtype != types.float32:
        return lambda s, vh, j0, n, acc: _weigh_any(s, vh, j0, n, acc)

    def weigh_f32(s, vh, j0, n, acc):
        g, d = acc.shape
        chunks = d // LANES
        jb = 0
        while jb + KEYS <= n:
            j = j0 + jb
            for i in range(g):
                _axpy4(acc, i * d, s[i, jb], s[i, jb + 1], s[i, jb + 2], s[i, jb + 3],
                       vh, j * d, (j + 1) * d, (j + 2) * d, (j + 3) * d, chunks)
            jb += KEYS
        while jb < n:
            for i in range(g):
                _axpy1(acc, i * d, s[i, jb], vh, (j0 + jb) * d, chunks)
            jb += 1
        for i in range(g):                                   # the features past the last multiple of 16
            for j in range(n):
                p = s[i, j]
                for t in range(chunks * LANES, d):
                    acc[i, t] += p * widen(vh[j0 + j, t])
    return weigh_f32


@numba.njit(nogil=True, cache=True, fastmath={"contract"}, boundscheck=False)
def decode_tiles(q, k, v, scale2, out, cap2, tile):
    """The decode step for every key/value head and its group of query heads, in one call, tile by tile.

    q (B, h_kv, g, d_k) one query per head, the g query heads of each key/value head stacked; k (B, h_kv, n_k,
    d_k) and v (B, h_kv, n_k, d_v) the cache, float32 or float64 as q, or float16 given as its bits (uint16,
    widened to float32 as each is loaded); ``scale2`` = scale · log₂e; ``cap2`` the soft-cap · log₂e (scores
    become cap2 · tanh(s / cap2)), 0 for none; out (B, h_kv, g, d_v) is written; ``tile`` keys per tile.

    Each key/value head is read once for its whole group, ``tile`` keys at a time: the g scores of each key
    (:func:`_scores`), then FlashAttention's online softmax across tiles in base 2 ::

        m' = max(m, max_j s_j);  l, acc *= 2^(m - m');  p_j = 2^(s_j - m');  l += Σ_j p_j;  acc += Σ_j p_j v_j

    (:func:`_weigh`), and out = acc / l. Every key is visible (the decode path's condition), so m is finite
    after the first tile and l >= 1. Every sum is in an order written here: the same bits whether numba
    compiled the kernel in this process or loaded it from its cache, and for any tile size that is a multiple
    of 4 except through the running max (each tile's own max shifts its exponentials).
    """
    n_b, h_kv, g, d_k = q.shape
    n_k, d_v = k.shape[2], v.shape[3]
    dt = q.dtype
    s = np.empty((g, tile), dt)                              # (g, tile) one tile's scores, then weights
    m = np.empty(g, dt)                                      # (g,) running max of the base-2 scores
    l = np.empty(g, dt)                                      # (g,) running sum of the weights
    acc = np.empty((g, d_v), dt)                             # (g, d_v) running weighted sum of the values
    qs = np.empty((g, d_k), dt)                              # (g, d_k) the queries times scale2
    for b in range(n_b):
        for h in range(h_kv):
            kh = np.ascontiguousarray(k[b, h])               # (n_k, d_k) views in C layout, no copies when
            vh = np.ascontiguousarray(v[b, h])               # (n_k, d_v) each head's rows are contiguous
            for i in range(g):
                for t in range(d_k):
                    qs[i, t] = q[b, h, i, t] * scale2
                for t in range(d_v):
                    acc[i, t] = 0
                l[i] = 0
                m[i] = -np.inf
            for j0 in range(0, n_k, tile):
                n = min(tile, n_k - j0)
                _scores(qs, kh, j0, n, s)                    # base-2 scores, (g, n)
                if cap2 > 0:
                    for i in range(g):
                        for j in range(n):
                            s[i, j] = cap2 * np.tanh(s[i, j] / cap2)   # soft-capped (Gemma-2)
                for i in range(g):
                    mx = row_max(s[i][:n], m[i])             # in the dtype (m[i] is)
                    if j0 > 0 and mx > m[i]:                 # what came before, to the new max
                        alpha = pow2(m[i] - mx)
                        l[i] *= alpha
                        for t in range(d_v):
                            acc[i, t] *= alpha
                    m[i] = mx
                    l[i] += exp_row(s[i][:n], mx)            # s[i] = 2^(s - m), in place; its sum
                _weigh(s, vh, j0, n, acc)                    # acc += p · V of the tile's keys
            for i in range(g):
                inv = (l[i] - l[i] + 1) / l[i]               # in the dtype; l >= 1
                for t in range(d_v):
                    out[b, h, i, t] = acc[i, t] * inv


@intrinsic
def _round_half(typingctx, x):
    """A float32 rounded to the nearest float16 (ties to even) and back: LLVM's fptrunc and fpext (vcvtps2ph,
    vcvtph2ps), which it vectorises in a loop."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.float32), codegen


@numba.njit(nogil=True, cache=True, fastmath={"contract"}, boundscheck=False)
def decode_half(q, k, v, scale2, out, cap2):
    """The decode step against a float16 cache as llama.cpp computes it (flash-attention off, its default): q
    rounded to float16 before its dot products with the keys (ggml's F16 ``vec_dot_type``), the scores in
    float32, the softmax over the whole row, the normalised weights rounded to float16, their sum of the
    values in float32.

    q (B, h_kv, g, d_k) float32; k (B, h_kv, n_k, d_k) and v (B, h_kv, n_k, d_v) a float16 cache's bits
    (uint16); ``scale2``, ``cap2`` and ``out`` as :func:`decode_tiles`. Each key/value head is read once for its
    group: the keys for the g rows of scores (:func:`_scores`, (g, n_k) float32: 96 KiB at 8,192 keys for 3
    heads, in L2), then the values for their weighted sum (:func:`_weigh`). The weights must be normalised
    before they are rounded, so the softmax cannot run online across tiles here.
    """
    n_b, h_kv, g, d_k = q.shape
    n_k, d_v = k.shape[2], v.shape[3]
    s = np.empty((g, n_k), np.float32)                       # (g, n_k) the scores, then the weights
    acc = np.empty((g, d_v), np.float32)                     # (g, d_v) the weighted sum of the values
    qs = np.empty((g, d_k), np.float32)                      # (g, d_k) the queries, rounded, times scale2
    for b in range(n_b):
        for h in range(h_kv):
            kh = np.ascontiguousarray(k[b, h])               # (n_k, d_k) views in C layout
            vh = np.ascontiguousarray(v[b, h])               # (n_k, d_v)
            for i in range(g):
                for t in range(d_k):
                    qs[i, t] = _round_half(q[b, h, i, t]) * scale2
                for t in range(d_v):
                    acc[i, t] = 0
            _scores(qs, kh, 0, n_k, s)                       # base-2 scores, (g, n_k)
            for i in range(g):
                row = s[i]
                if cap2 > 0:
                    for j in range(n_k):
                        row[j] = cap2 * np.tanh(row[j] / cap2)   # soft-capped (Gemma-2)
                total = exp_row(row, row_max(row, np.float32(-np.inf)))   # row = 2^(s - max), in place; its sum
                inv = np.float32(1) / total
                for j in range(n_k):
                    row[j] = _round_half(row[j] * inv)       # the normalised weight, as float16
            _weigh(s, vh, 0, n_k, acc)                       # acc = Σ_j a_j v_j
            for i in range(g):
                for t in range(d_v):
                    out[b, h, i, t] = acc[i, t]
