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


@numba.njit(nogil=True, cache=True, fastmath={"contract", "reassoc", "nsz"}, boundscheck=False)
def decode_groups(q, k, v, scale2, out, s, cap2):
    """The decode step for every key/value head and its group of query heads, in one call.

    q (B, h_kv, g, d_k) one query per head, its g query heads stacked per key/value head; k (B, h_kv, n_k, d_k)
    and v (B, h_kv, n_k, d_v) the cache; ``scale2`` = scale · log₂e; ``cap2`` the soft-cap · log₂e (scores
    become cap2 · tanh(s / cap2)), 0 for none; out (B, h_kv, g, d_v) is written;
    s (g, n_k) scratch. Each cached key and value is read once for its whole group (the g dot products of
    a key are taken together), every key is visible (the decode path's condition), so a row's max is
    finite and its sum at least 1.

    A cache's keys and values arrive as views of a longer buffer (numba's layout "A": strides known only at
    run time), where the loops over d_k and d_v did not vectorise (12 heads × 1024 keys: 0.82 against 0.32 ms
    contiguous); each head is taken as a C-contiguous view (``np.ascontiguousarray`` copies nothing when
    its rows are contiguous, as a cache's are), which runs as fast as contiguous input.
    """
    n_b, h_kv, g, d_k = q.shape
    n_k, d_v = k.shape[2], v.shape[3]
    total = np.empty(g, s.dtype)                            # (g,) the rows' sums
    zero = scale2 - scale2                                  # 0 in the dtype (scale2 is finite)
    for b in range(n_b):
        for h in range(h_kv):
            qh = np.ascontiguousarray(q[b, h])              # (g, d_k) views in C layout, no copies when
            kh = np.ascontiguousarray(k[b, h])              # (n_k, d_k) each head's rows are contiguous
            vh = np.ascontiguousarray(v[b, h])              # (n_k, d_v)
            oh = out[b, h]                                  # (g, d_v)
            for j in range(n_k):                            # key j once, for the g query heads
                for i in range(g):
                    acc = zero
                    for t in range(d_k):
                        acc += qh[i, t] * kh[j, t]
                    s[i, j] = acc * scale2                  # base-2 scores
                    if cap2 > 0:
                        s[i, j] = cap2 * np.tanh(s[i, j] / cap2)   # soft-capped (Gemma-2)
            for i in range(g):
                total[i] = exp_row(s[i], row_max(s[i], -np.inf))   # s[i] = 2^(s - max), in place
            for i in range(g):
                for t in range(d_v):
                    oh[i, t] = 0
            for j in range(n_k):                            # value j once, for the g query heads
                for i in range(g):
                    p = s[i, j]
                    for t in range(d_v):
                        oh[i, t] += p * vh[j, t]
            for i in range(g):
                inv = (total[i] - total[i] + 1) / total[i]
                for t in range(d_v):
                    oh[i, t] *= inv
