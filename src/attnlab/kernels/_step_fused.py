"""The pieces of a one-token pass between its products, fused (numba, the optional extra ``attnlab[fast]``).

A decode step of a pre-norm block (Llama, SmolLM2) is four products (q|k|v, W_O, gate|up, W_out), attention,
and small elementwise work between them: RMSNorm, the bias, RoPE's rotation of q and k, the append of k and v to
the cache, the residual adds, silu(gate) · up. On one token each of these is a handful of numpy calls of a few
hundred numbers, so their cost is numpy's per-call overhead, not arithmetic (about 29 calls a layer, 60-70 µs).
Here each stretch between two products is one call:

    rms_norm_rows      h = x / √(mean(x²) + eps) · w                                        (ln_1, ln_final)
    qkv_rope_append    q = rot(qkv_q + b_q); k = rot(qkv_k + b_k) and v = qkv_v + b_v written to the cache
    resid_rms          x' = x + (y + b_O); h = rms_norm(x')                                  (ln_2)
    silu_mul_rows      hidden = silu(gate) · up

and, for a prompt's rows (a prefill), ``qkv_rope_rows``: the bias and RoPE of q|k|v, each head to its own block.

The arithmetic is numpy's, operation for operation, wherever an elementwise IEEE operation is exact (the
bias, RoPE's ``pair · cos + reversed(pair) · sin``, the divisions and products of the norm, the adds): those
bits equal the numpy path's. Two pieces are not numpy's own:

- The mean of squares is summed in 16 written lanes (lane i sums x[i::16]), combined in a fixed tree
  (:func:`sum_squares`): numpy's ``vecdot`` leaves the order to BLAS.
- silu's exponential is :func:`exp_f32`, Cephes' ``expf`` (range reduction by a two-part ln 2, a degree-5
  polynomial; within 2 ulp of e^x), in plain IEEE operations: numpy's float32 exp is its own SIMD code.

So a one-token pass computes RMSNorm and silu the same way whether hooks listen or not: with the fused pieces
chosen (:func:`attnlab.kernels._kernels.step_kernel_choice`), ``rms_norm`` and the gated MLP call
:func:`rms_scale_rows` and :func:`silu_mul_rows` on a single row, hooked or not, and the fused decode step
(:mod:`attnlab.stack.decode_step`) calls the same inner functions. No function here uses fastmath: LLVM may
vectorise a loop, never reorder or contract its operations, so a vectorised loop and its scalar remainder, or
the same function inlined in two kernels, give the same bits. float32 only.

Compiled with ``cache=True`` (the machine code is kept in ``__pycache__``), ``nogil=True`` and numpy's error model
(``error_model="numpy"``): a float division by 0 gives inf or nan, as numpy's, where Python's model checks every
divisor and raises ZeroDivisionError. That check, a branch in the loop, kept LLVM from vectorising the divisions
of silu and the norm: silu(gate) · up of a 512 × 1,536 prompt took 5.3 ms in scalar code and 1.0 ms vectorised
(one core of a Xeon, AVX-512, loaded), the same bits (no function here reorders or contracts its operations).
"""

from __future__ import annotations

import numba
import numpy as np

from ._fused import _bits_f32

# Cephes' expf (Moshier, 1984): e^x = 2^n · e^r, n = round(x · log₂e), r = x − n · ln 2 in two parts (C1 exact
# in float32, so n · C1 is exact for |n| <= 2^15), e^r by a degree-5 polynomial on |r| <= ln 2 / 2.
LOG2E_F32 = np.float32(1.44269504088896341)
C1, C2 = np.float32(0.693359375), np.float32(-2.12194440e-4)
E0, E1, E2 = np.float32(1.9875691500e-4), np.float32(1.3981999507e-3), np.float32(8.3334519073e-3)
E3, E4, E5 = np.float32(4.1665795894e-2), np.float32(1.6666665459e-1), np.float32(5.0000001201e-1)
EXP_HI, EXP_LO = np.float32(88.0), np.float32(-87.0)   # e^x overflows float32 above 88.72; below -87, 1 + e^x is 1
HALF, ONE, ZERO = np.float32(0.5), np.float32(1.0), np.float32(0.0)


@numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy", inline="always")
def exp_f32(x):
    """e^x for a float32 x in [-87, 88] (n in [-126, 127]: 2^n a normal float): Cephes' expf."""
    z = np.floor(LOG2E_F32 * x + HALF)                     # n, as a float32
    r = x - z * C1
    r = r - z * C2                                         # |r| <= ln 2 / 2
    p = E0 * r + E1
    p = p * r + E2
    p = p * r + E3
    p = p * r + E4
    p = p * r + E5
    y = p * (r * r) + r + ONE                              # e^r
    return y * _bits_f32((np.int32(z) + np.int32(127)) << 23)   # times 2^n, built in the exponent bits


@numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy", inline="always")
def silu_f32(g):
    """silu(g) = g / (1 + e^(−g)); e^(−g) is inf above 88 (g / inf = −0, as numpy's) and 0 below −87."""
    t = -g
    e = np.float32(np.inf) if t > EXP_HI else ZERO if t < EXP_LO else exp_f32(t)
    return g / (e + ONE)


@numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy", inline="always")
def sum_squares(x):
    """Σ_j x[j]² of a 1-D float32 row, in 16 lanes (lane i sums x[i::16], the tail into lane 0) combined in a
    fixed tree: an order written here, the same in every kernel that inlines it."""
    n = x.shape[0]
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = ZERO
    j = 0
    while j + 16 <= n:
        a0 += x[j] * x[j]; a1 += x[j + 1] * x[j + 1]; a2 += x[j + 2] * x[j + 2]                         # noqa: E702
        a3 += x[j + 3] * x[j + 3]; a4 += x[j + 4] * x[j + 4]; a5 += x[j + 5] * x[j + 5]                 # noqa: E702
        a6 += x[j + 6] * x[j + 6]; a7 += x[j + 7] * x[j + 7]; b0 += x[j + 8] * x[j + 8]                 # noqa: E702
        b1 += x[j + 9] * x[j + 9]; b2 += x[j + 10] * x[j + 10]; b3 += x[j + 11] * x[j + 11]             # noqa: E702
        b4 += x[j + 12] * x[j + 12]; b5 += x[j + 13] * x[j + 13]; b6 += x[j + 14] * x[j + 14]           # noqa: E702
        b7 += x[j + 15] * x[j + 15]
        j += 16
    while j < n:
        a0 += x[j] * x[j]
        j += 1
    a = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
    b = ((b0 + b1) + (b2 + b3)) + ((b4 + b5) + (b6 + b7))
    return a + b


@numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy", inline="always")
def rms_scale(x, inv_d, eps):
    """√(Σ x² · (1/d) + eps) of one row, as ``rms_norm`` orders it: the sum times 1/d, plus eps, the root."""
    ms = sum_squares(x) * inv_d
    ms = ms + eps
    return np.sqrt(ms)


@numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")
def rms_scale_rows(x, inv_d, eps, out):
    """out[r, 0] = √(mean(x[r]²) + eps) for each row of x (rows, d): the divisor ``hook_scale`` sees."""
    for r in range(x.shape[0]):
        out[r, 0] = rms_scale(np.ascontiguousarray(x[r]), inv_d, eps)


@numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy", inline="always")
def _normalise(x, w, s, out):
    """out = (x / s) · w elementwise, one row: numpy's ``y = x / scale; y *= weight``."""
    for j in range(x.shape[0]):
        out[j] = (x[j] / s) * w[j]


@numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")
def rms_norm_rows(x, w, inv_d, eps, out):
    """out (rows, d) = RMSNorm of x (rows, d) with weight w (d,)."""
    for r in range(x.shape[0]):
        row = np.ascontiguousarray(x[r])
        _normalise(row, w, rms_scale(row, inv_d, eps), out[r])


@numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")
def resid_rms(x, y, b, w, inv_d, eps, x_out, h_out):
    """The attention's residual line and the next norm, one row: x_out = x + (y + b) (numpy's ``y += b_O``,
    then ``x + y``), h_out = RMSNorm(x_out) with weight w. x, y, x_out, h_out (1, d); b, w (d,)."""
    xo = x_out[0]
    for j in range(xo.shape[0]):
        xo[j] = x[0, j] + (y[0, j] + b[j])
    _normalise(xo, w, rms_scale(xo, inv_d, eps), h_out[0])


@numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy", inline="always")
def _silu_mul(g, u, out):
    for j in range(g.shape[0]):
        out[j] = silu_f32(g[j]) * u[j]


@numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")
def silu_mul_rows(gate, up, out):
    """out = silu(gate) · up, rows (rows, m) each: the gated MLP's hidden layer (SwiGLU)."""
    for r in range(gate.shape[0]):
        _silu_mul(np.ascontiguousarray(gate[r]), np.ascontiguousarray(up[r]), out[r])


@numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")
def swiglu_row(both, out):
    """out (1, m) = silu(both[0, :m]) · both[0, m:]: the hidden layer from the gate|up product (1, 2m)."""
    m = out.shape[1]
    row = both[0]
    _silu_mul(row[:m], row[m:], out[0])


@numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy", inline="always")
def _rotated(row, b, cos, sin, base, i, rotate):
    """Feature i of the head starting at ``base`` of the projected row, biased and (with ``rotate``) turned by
    RoPE as numpy's ``rope`` does: pair · cos + reversed(pair) · sin, cos and sin (d/2, 2) rows of its tables."""
    t = row[base + i] + b[base + i]
    if not rotate:
        return t
    o = base + (i ^ 1)                                     # the pair's other feature
    return t * cos[i >> 1, i & 1] + (row[o] + b[o]) * sin[i >> 1, i & 1]


@numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")
def qkv_rope_rows(qkv, b, cos, sin, rotate, q, k, v):
    """A prompt's q, k and v from its q|k|v product, in one pass: each row biased, q and k rotated (RoPE, with
    ``rotate``) as :func:`qkv_rope_append` turns one token's, and every head written to its own contiguous
    (n, d) block: q (h, n, d), k and v (h_kv, n, d). qkv (n, (h + 2·h_kv)·d); b its bias; cos, sin
    (n, d/2, 2) RoPE's pair tables at the rows' positions (:meth:`attnlab.layer.positions.RoPE.turns`).

    numpy's ``qkv + b``, then ``rope`` on the strided head views, take a pass each for the bias, the pair swap,
    both products and their sum; the operations here are the same, each rounded alike (``pair · cos +
    reversed(pair) · sin``), so the bits are numpy's. Head by head, a row's head biased into ``t``, its pairs
    swapped into ``u``, then ``t · cos + u · sin``: three loops LLVM vectorises (SmolLM2's 512 rows: 0.53 ms,
    numpy's passes 1.2 ms, the pairs indexed in one loop 1.6 ms; one core of a Xeon, AVX-512)."""
    h, d = q.shape[0], q.shape[2]
    h_kv = k.shape[0]
    for hd in range(h + h_kv):                             # q's and k's heads
        out = q[hd] if hd < h else k[hd - h]               # (n, d)
        if rotate:
            _rope_head(qkv, b, cos, sin, hd * d, out)
        else:
            _bias_head(qkv, b, hd * d, out)
    for hd in range(h_kv):                                 # v's heads
        _bias_head(qkv, b, (h + h_kv + hd) * d, v[hd])


@numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy", inline="always")
def _bias_head(qkv, b, base, out):
    """out (n, d) = qkv[:, base:base + d] + b[base:base + d]."""
    d = out.shape[1]
    bias = b[base:base + d]
    for r in range(qkv.shape[0]):
        row, o = qkv[r, base:base + d], out[r]
        for i in range(d):
            o[i] = row[i] + bias[i]


@numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy", inline="always")
def _rope_head(qkv, b, cos, sin, base, out):
    """out (n, d) = the head at column ``base`` of qkv, biased, turned: ``pair · cos + reversed(pair) · sin``."""
    n, d = out.shape
    c2, s2 = cos.reshape(n, d), sin.reshape(n, d)          # (n, d) each pair's cos, and ±sin, twice
    bias = b[base:base + d]
    t = np.empty(d, np.float32)                            # a row's head, biased
    u = np.empty(d, np.float32)                            # its pairs swapped: (x_2i+1, x_2i)
    for r in range(n):
        row, c, s, o = qkv[r, base:base + d], c2[r], s2[r], out[r]
        for i in range(d):
            t[i] = row[i] + bias[i]
        for i in range(0, d, 2):
            u[i] = t[i + 1]
            u[i + 1] = t[i]
        for i in range(d):
            o[i] = t[i] * c[i] + u[i] * s[i]


@numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")
def qkv_rope_append(qkv, b, cos, sin, rotate, q, k_buf, v_buf, pos):
    """One token's q, k and v from its q|k|v product: biased, q and k rotated (RoPE, with ``rotate``), q written
    to q (h, 1, d), k and v to the cache buffers k_buf, v_buf (h_kv, capacity, d) at position ``pos``.

    qkv (1, (h + 2·h_kv)·d); b its bias; cos, sin (1, d/2, 2) RoPE's tables at ``pos`` (numpy's). Returns
    (max |q|, max |k|, max |v|, finite): the largest magnitudes as ``check_finite`` and the cache's ``append``
    take them, and whether all three are finite. Nothing is written to the cache unless k and v are finite,
    so a step that fails leaves the cache as it was."""
    h, d = q.shape[0], q.shape[2]
    h_kv = k_buf.shape[0]
    row, c, s = qkv[0], cos[0], sin[0]
    q_top = k_top = v_top = ZERO
    finite = True
    for hd in range(h):
        for i in range(d):
            t = _rotated(row, b, c, s, hd * d, i, rotate)
            q[hd, 0, i] = t
            a = abs(t)
            finite = finite and a < np.inf
            q_top = a if a > q_top else q_top
    for hd in range(h_kv):                                 # k and v: their maxima first, written only if finite
        for i in range(d):
            a = abs(_rotated(row, b, c, s, (h + hd) * d, i, rotate))
            finite = finite and a < np.inf
            k_top = a if a > k_top else k_top
            a = abs(row[(h + h_kv + hd) * d + i] + b[(h + h_kv + hd) * d + i])
            finite = finite and a < np.inf
            v_top = a if a > v_top else v_top
    if finite:
        for hd in range(h_kv):
            for i in range(d):
                k_buf[hd, pos, i] = _rotated(row, b, c, s, (h + hd) * d, i, rotate)
                v_buf[hd, pos, i] = row[(h + h_kv + hd) * d + i] + b[(h + h_kv + hd) * d + i]
    return q_top, k_top, v_top, finite
