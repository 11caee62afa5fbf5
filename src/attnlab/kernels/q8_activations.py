"""The second quantized mode, ``quantized="q8-activations"``: the weights stay in their GGUF blocks as in the exact
mode (:mod:`attnlab.kernels.quantized`), and x is rounded to 8 bits per block of 32 before each product, whose
dot products are then integer, as llama.cpp computes them on x86 (``ggml_vec_dot`` with the weight type's
``vec_dot_type``, ggml-cpu.c's ``type_traits_cpu``): Q8_1 activations for Q4_1 and Q5_1 weights, Q8_0 for Q4_0,
Q5_0 and Q8_0.

x's rounding (ggml-cpu/arch/x86/quants.c, ``quantize_row_q8_0`` / ``quantize_row_q8_1``): per block of 32,
amax = max|x_t|, d = amax / 127 (kept as float16), q_t = round-half-even(x_t · (127 / amax)) (int8, 0 when amax
is 0), and for Q8_1 s = float16(d · Σ_t q_t). The block layouts are ``gguf.quants``' (Q8_0: float16 d and 32
int8; Q8_1: float16 d, float16 s, 32 int8).

A row's dot with one token (``ggml_vec_dot_q4_1_q8_1`` and its siblings, AVX2 branch), block after block:

    lane_j = Σ_{u<4} w_{4j+u} · q_{4j+u}                    (int32, j = 0 … 7: w the weight's integer values,
                                                             Q4_0's shifted by −8, Q4_1's 0 … 15, Q8_0's int8,
                                                             Q5_0's shifted by −16, Q5_1's 0 … 31)
    acc_j  = fma(d_w · d_x, float(lane_j), acc_j)            (float32, one rounding: llama.cpp's _mm256_fmadd_ps)
    summs  = summs + m_w · s_x                               (Q4_1 and Q5_1 only)

then ``((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7)) + summs``. Q5_0 and Q5_1
(``ggml_vec_dot_q5_0_q8_0``, ``..._q5_1_q8_1``) are Q4_0's and Q4_1's loops with a fifth bit per value from the
block's ``qh`` (``bytes_from_bits_32``: Q5_0 ORs 0xF0 into the values whose bit is clear, the int8 q − 16, and
multiplies with the sign trick; Q5_1 ORs 0x10 into those whose bit is set and multiplies unsigned bytes): the
lanes are the same exact integer sums, and ``d_w·d_x`` (Q5_1: ``dx·dy``, the same product), the fused
multiply-add and ``summs`` round as above. llama.cpp's batch path (llamafile's ``tinyBLAS_Q0_AVX``, which
multiplies Q5_0 with Q8_0 when a product has many tokens; Q5_1 has no such path) keeps this arithmetic in each
of its tilings (``gemm``, ``gemm4xN``, ``gemmMx4``): per (row, token) eight float32 lanes of the same integer
sums, ``madd(d_w·d_x, float(lane), acc)`` (a fused multiply-add) block after block from zero, then ``hsum``,
whose order ``((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`` is ``hsum_float_8``'s; so a token's
outputs do not depend on the batch size. The kernels
(:mod:`attnlab.kernels._q8_fused`, numba) compute exactly this, and :func:`reference_matmul` does it in numpy;
the tests hold them to each other bit for bit (numpy has no fused multiply-add: :func:`fma32` computes one,
correctly rounded). ``summs`` stays a multiply and an add: llama.cpp writes it in C, ``summs += m·s``, which its
compiler may or may not contract into one rounding (GCC's default for GNU C does, with FMA enabled); that
scalar, once per block, is the one place the two can still differ, by ~1e-7 relative. The K-quants (Q4_K,
Q6_K: Q8_K activations, super-blocks of 256) are :mod:`attnlab.kernels.q8k_activations`'s.

Every token's output depends on that token's x alone, so a decode step and a prefill give each token the same
logits; the thread count changes nothing (a row is summed by one thread).
"""

from __future__ import annotations

import functools

import numpy as np

from . import quantized
from .quantized import QuantizedMatrix

MODE = "q8-activations"          # load_model's quantized= value for this mode ("q8" on the command line)
INT_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1")   # the weight types with an integer kernel
MINIMA_TYPES = ("Q4_1", "Q5_1")  # w = d·q + m: Q8_1 activations, and the minima's term Σ m·s
QK = 32                          # values per block of Q8_0 / Q8_1
LANES = 8                        # float32 accumulators per row, as llama.cpp's AVX2 loop keeps them


def quantize_q8(x: np.ndarray):
    """x (N, n_blocks·32) float32 -> (qx (N, n_blocks, 32) int8, d (N, n_blocks), s (N, n_blocks)), d and s
    float32 holding float16 values: llama.cpp's x86 ``quantize_row_q8_1`` (Q8_0: the same qx and d)."""
    x = np.asarray(x, np.float32)
    blocks = x.reshape(x.shape[0], -1, QK)                                   # (N, n_blocks, 32)
    amax = np.abs(blocks).max(axis=-1)                                        # (N, n_blocks)
    d = amax / np.float32(127.0)                                              # (N, n_blocks)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    qx = np.rint(blocks * inv[..., None]).astype(np.int8)                     # (N, n_blocks, 32)
    total = qx.astype(np.int32).sum(axis=-1).astype(np.float32)               # (N, n_blocks)
    return qx, d.astype(np.float16).astype(np.float32), (d * total).astype(np.float16).astype(np.float32)


def integer_values(w: QuantizedMatrix) -> np.ndarray:
    """The weight's integers (d_out, n_blocks, 32) int32 in value order: Q4_0's q − 8, Q4_1's q, Q8_0's q,
    Q5_0's q − 16 and Q5_1's q (their fifth bits from qh: :func:`attnlab.kernels.quantized.five_bit_values`)."""
    if w.qtype in quantized.FIVE_BIT_TYPES:
        return quantized.five_bit_values(w.rows("qs"), w.qtype).astype(np.int32)   # (R, n_blocks, 32)
    qs = w.rows("qs").astype(np.int32)                                        # (R, n_blocks, 16 or 32)
    if w.qtype == "Q8_0":
        return qs
    q = np.concatenate([qs & 15, qs >> 4], axis=-1)                           # (R, n_blocks, 32)
    return q - 8 if w.qtype == "Q4_0" else q


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """a·b + c in float32 with one rounding (what ``vfmadd`` computes), by numpy: the product of two float32 is
    exact in float64, their sum with c is rounded to float64 with its error kept (Knuth's two-sum), and the
    float64 sum rounded to float32 is the fused result unless it lies exactly halfway between two float32,
    where the error says which way the exact value lies. (Finite values away from float32's extremes.)"""
    p = a.astype(np.float64) * b.astype(np.float64)                           # exact
    c64 = c.astype(np.float64)
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)                                         # s + err == p + c exactly
    r = s.astype(np.float32)
    r64 = r.astype(np.float64)
    toward = np.where(s > r64, np.float32(np.inf), np.float32(-np.inf)).astype(np.float32)
    other = np.nextafter(r, toward)                                           # r's neighbour on s's side
    halfway = (s != r64) & (s - r64 == other.astype(np.float64) - s)
    wrong = halfway & (err != 0) & ((err > 0) == (other > r))                 # the exact value is past the tie
    return np.where(wrong, other, r)


def reference_matmul(x: np.ndarray, w: QuantizedMatrix) -> np.ndarray:
    """x (N, d_in) @ w in the 8-bit-activation arithmetic, by numpy: (N, d_out) float32, every rounding as the
    module's docstring says (the kernels' reference, bit for bit)."""
    if w.qtype not in INT_TYPES:
        raise ValueError(f"w.qtype must be one of {list(INT_TYPES)}, got {w.qtype!r}")
    qx, xd, xs = quantize_q8(x)                                               # (N, nb, 32), (N, nb) x 2
    q = integer_values(w)                                                     # (R, nb, 32)
    n_blocks = q.shape[1]
    lanes = np.einsum("nbju,rbju->nrbj", qx.reshape(*qx.shape[:2], LANES, 4).astype(np.int64),
                      q.reshape(*q.shape[:2], LANES, 4).astype(np.int64)).astype(np.int32)   # (N, R, nb, 8)
    wd = w.rows("d").astype(np.float32).reshape(q.shape[0], n_blocks)         # (R, nb)
    acc = np.zeros((qx.shape[0], q.shape[0], LANES), np.float32)              # (N, R, 8)
    summs = np.zeros((qx.shape[0], q.shape[0]), np.float32)                   # (N, R)
    wm = None if w.m is None else w.rows("m").astype(np.float32)              # (R, nb)
    for b in range(n_blocks):
        dd = wd[None, :, b] * xd[:, b, None]                                  # (N, R)
        acc = fma32(np.broadcast_to(dd[..., None], acc.shape), lanes[:, :, b].astype(np.float32), acc)   # (N, R, 8)
        if w.qtype in MINIMA_TYPES:
            summs = summs + wm[None, :, b] * xs[:, b, None]                   # (N, R) a product, then a sum
    a = acc
    total = ((a[..., 0] + a[..., 4]) + (a[..., 2] + a[..., 6])) + ((a[..., 1] + a[..., 5]) + (a[..., 3] + a[..., 7]))
    return total + summs if w.qtype in MINIMA_TYPES else total                # (N, R)


@functools.cache
def _kernels():
    from . import _q8_fused
    return _q8_fused


class Q8ActivationMatrix(QuantizedMatrix):
    """A :class:`attnlab.kernels.quantized.QuantizedMatrix` (Q4_0, Q4_1, Q8_0, Q5_0 or Q5_1) whose ``x @ W``
    rounds x to 8 bits per block and multiplies integers, as llama.cpp does (the module's docstring): any number
    of tokens, each token's outputs its own (a prefill gives the decode step's values). Q5_0 and Q5_1 are this
    mode's only (their planes the file's bytes, unpacked in registers); the exact mode keeps them in float32."""

    def __init__(self, raw: np.ndarray, qtype: str, d_in: int):
        if qtype not in INT_TYPES:
            raise ValueError(f"qtype must be one of {list(INT_TYPES)} for 8-bit activations, got {qtype!r}")
        if qtype not in quantized.FIVE_BIT_TYPES:
            super().__init__(raw, qtype, d_in)
            return
        block, nbytes = quantized.quant_sizes(qtype)                              # Q5: planes of this mode only
        raw = np.asarray(raw)
        if isinstance(d_in, bool) or not isinstance(d_in, (int, np.integer)) or d_in <= 0 or d_in % block:
            raise ValueError(f"d_in must be a positive multiple of {block} for {qtype}, got {d_in!r}")
        if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] != d_in // block * nbytes:
            raise ValueError(f"raw must be uint8 (d_out, {d_in // block} blocks × {nbytes} bytes) for d_in {d_in} "
                             f"in {qtype} ({block} values per block), got {raw.dtype} {raw.shape}")
        qs, d, m = quantized.block_planes(raw, qtype, int(d_in))
        self._set(qtype, int(d_in), raw.shape[0], quantized.grouped(qs), quantized.grouped(d),
                  None if m is None else quantized.grouped(m))

    def dequantize_rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` (n,) of the transpose, float32 (n, d_in) (Q5_0 and Q5_1 by numpy: the exact mode's
        kernels have no 5-bit planes; the same values as ``gguf.quants``)."""
        if self.qtype in quantized.FIVE_BIT_TYPES:
            return self.dequantize(ids).T                                          # (n, d_in)
        return super().dequantize_rows(ids)

    def __repr__(self) -> str:
        return f"Q8ActivationMatrix({self.qtype}, shape={self.shape})"

    def __rmatmul__(self, x):
        x = np.asarray(x)
        if x.ndim < 1 or x.shape[-1] != self.d_in:
            raise ValueError(f"x @ W needs x (..., {self.d_in}), got shape {x.shape}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.d_in)                                              # (N, d_in)
        if x2.dtype != np.float32 or not x2.flags.c_contiguous:
            x2 = np.ascontiguousarray(x2, dtype=np.float32)                        # (N, d_in)
        return self._product(x2).reshape(*lead, self.d_out)                       # (..., d_out)

    def _product(self, x2: np.ndarray) -> np.ndarray:
        """x2 (N, d_in) float32 C-contiguous @ W: (N, d_out) float32, by the kernels."""
        out = np.empty((x2.shape[0], self.d_out), np.float32)                      # (N, d_out)
        many = x2.shape[0] > _kernels().MAX_TOKENS                                  # a prefill: the worker pool
        _kernels().matmul(self.qtype, *self.kernel_planes, x2, out, quantized.product_kernel()[1],
                          quantized.prefill_pool(x2.shape[0]) if many else None)
        return out


def weight_q8(raw: np.ndarray, qtype: str, d_in: int, *, rows: bool = False):
    """A GGUF tensor as the stack's weight in this mode: a :class:`Q8ActivationMatrix` (its ``.T`` rows with
    ``rows``) for the types with an integer kernel; any other type as
    :func:`attnlab.kernels.quantized.weight_from_gguf` keeps it (the exact product, or float32).
    (:func:`attnlab.kernels.q8k_activations.weight_q8` adds the K-quants.)"""
    if qtype in INT_TYPES and quantized.has_kernel():
        m = Q8ActivationMatrix(raw, qtype, d_in)
        return m.T if rows else m
    return quantized.weight_from_gguf(raw, qtype, d_in, rows=rows)
