"""The K-quants in the 8-bit-activation mode (``quantized="q8-activations"``, :mod:`attnlab.kernels.q8_activations`):
x rounded to Q8_K, then integer dot products with a Q4_K, Q5_K or Q6_K weight's super-blocks, as llama.cpp computes
them on x86 (``ggml_vec_dot_q4_K_q8_K``, ``_q5_K_q8_K`` and ``_q6_K_q8_K``, ggml-cpu/arch/x86/quants.c, the AVX2
branch, which AVX2 and AVX-512 builds both run; ``quantize_row_q8_K``, which on x86 is ggml-quants.c's
``quantize_row_q8_K_ref``).

x's rounding (Q8_K: a float32 d, 256 int8 and 16 int16 sums per super-block of 256 values): max is the first
x_t of the largest |x_t| (its sign kept), iscale = −127 / max (float32), q_t = min(127, nearest_int(iscale·x_t))
(``nearest_int``: x + 1.5·2²³ in float32, i.e. round half to even), bsums_i = Σ of the 16 q_t of group i, and
d = 1 / iscale (float32, not float16: −max/127 rounded twice). A super-block of zeros gives d 0, q 0, sums 0.

A row's dot with one token, super-block after super-block b (all integer sums exact, in int32):

- Q4_K (8 sub-blocks of 32, 6-bit scale sc_s and minimum mn_s, float16 d and dmin, 4-bit values w):
  ``sumi_j = Σ_s sc_s · Σ_{u<4} w_{s,4j+u} · q_{s,4j+u}`` (j = 0 … 7, llama.cpp's eight int32 lanes),
  ``acc_j = fma(x.d·d, float(sumi_j), acc_j)``; the minima: ``prod_k = mn_{2k}·S_{2k} + mn_{2k+1}·S_{2k+1}``
  (S_s the sum of x's 32 values of sub-block s, k = 0 … 3), ``accm_k = fma(−x.d·dmin, float(prod_k), accm_k)``;
  at the end ``hsum8(acc) + ((accm_0 + accm_2) + (accm_1 + accm_3))``.
- Q5_K (Q4_K's form, the values 5-bit: a fifth bit per value from 32 bytes qh): the same lanes and ``acc``;
  the minima as one scalar, ``summs = fma(−x.d·dmin, float(Σ_s mn_s·S_s), summs)`` (ggml's C
  ``summs += dmin * hsum``, which the vendored build compiles to ``vfmadd231ss``), then ``hsum8(acc) + summs``.
- Q6_K (16 sub-blocks of 16, int8 scale sc, float16 d, 6-bit values w, w − 32 the weight's integer):
  ``sumi_j = Σ_c sc_{2c + j//4} · Σ_{u<4} w_{32c+4j+u} · q_{32c+4j+u}
  − 32·(sc_{2j}·bsums_{2j} + sc_{2j+1}·bsums_{2j+1})``
  (c = 0 … 7; the −32 taken out through x's sums, as the vendored ggml does: its lanes, not the older
  ``_mm256_maddubs_epi16(m32s, q8)`` ones), ``acc_j = fma(x.d·d, float(sumi_j), acc_j)`` (the int32 to
  float32 conversion rounds past 2²⁴), then ``hsum8(acc)``.

``hsum8(a) = ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))``, as for the 32-value types.

That is a product of fewer than :data:`TILED_MIN_BATCH` (8) tokens: a decode step. From 8 tokens on (a prefill) the
vendored llama.cpp multiplies a K-quant weight by another arithmetic, its tiled GEMM (``ggml_tiled_min_batch``),
and so does this mode: per super-block b the exact integers s1 = Σ_j sumi_j and (Q4_K, Q5_K) s2 = Σ_s mn_s·S_s,
``r = float(s1)·d`` (float32), ``r = fma(−dmin, float(s2), r)``, ``out = fma(r, x.d, out)``, b after b
(:func:`reference_matmul_tiled`). The rule is on the product's number of tokens alone, as llama.cpp's is: a
token's bits depend on whether its batch has 8 tokens or more, deterministically, never on the threads.

The numba kernels (:mod:`attnlab.kernels._q8k_fused`) compute exactly this; :func:`reference_matmul` (and
:func:`reference_matmul_tiled`) does it in numpy, and the
tests hold the two to each other bit for bit (and, where llama-cpp-python is installed, to ggml's own
``quantize_row_q8_K`` and ``ggml_vec_dot_*_q8_K``).

The weight's planes here are its integers, not the exact mode's float32 sub-block scales (d·sc rounds away
which d and sc it came from, and llama.cpp multiplies d by x.d first): rows in groups of four side by side as
:class:`attnlab.kernels.quantized.QuantizedMatrix` keeps them, ``qs`` the values (Q4_K: the file's 128 bytes of
nibbles; Q5_K: those, then its 32 bytes of fifth bits; Q6_K: the file's 192 bytes of low and high bits), ``d`` the float16
scales (Q4_K, Q5_K: d and dmin; Q6_K: d) and ``m`` the sub-block scales (Q4_K, Q5_K: sc_0 … sc_7 then
mn_0 … mn_7, uint8; Q6_K: sc_0 … sc_15, int8).
"""

from __future__ import annotations

import functools

import numpy as np

from . import quantized
from .q8_activations import INT_TYPES, LANES, Q8ActivationMatrix, fma32
from .q8_activations import weight_q8 as q8_weight
from .quantized import grouped

QK_K = 256                       # values per super-block (Q8_K, Q4_K, Q6_K)
K_TYPES = ("Q4_K", "Q5_K", "Q6_K")   # the K-quants with an integer kernel
MODE_TYPES = (*INT_TYPES, *K_TYPES)   # every type the mode multiplies in integers (:func:`weight_q8` takes)
SUB = {"Q4_K": 32, "Q5_K": 32, "Q6_K": 16}   # values per sub-block (one scale each)
TILED_MIN_BATCH = 8              # a product of this many tokens or more takes the tiled GEMM's arithmetic, as the
#                                  vendored llama.cpp's ggml_mul_mat does from ggml_tiled_min_batch tokens on


def quantize_q8_k(x: np.ndarray):
    """x (N, n·256) float32 -> (q (N, n, 256) int8, d (N, n) float32, bsums (N, n, 16) int16): llama.cpp's
    ``quantize_row_q8_K_ref`` (the x86 ``quantize_row_q8_K``)."""
    x = np.asarray(x, np.float32)
    blocks = x.reshape(x.shape[0], -1, QK_K)                                    # (N, n, 256)
    first = np.abs(blocks).argmax(axis=-1)                                      # (N, n) the first largest |x|
    top = np.take_along_axis(blocks, first[..., None], axis=-1)[..., 0]         # (N, n) its signed value
    zero = top == 0
    with np.errstate(divide="ignore"):
        iscale = np.float32(-127.0) / np.where(zero, np.float32(1.0), top)      # (N, n) float32
    v = np.rint(blocks * iscale[..., None])                                     # (N, n, 256) float32, ties even
    q = np.minimum(v, np.float32(127.0)).astype(np.int8)                        # (N, n, 256)
    q[zero] = 0
    d = np.where(zero, np.float32(0.0), np.float32(1.0) / iscale).astype(np.float32)   # (N, n)
    bsums = q.reshape(*q.shape[:2], QK_K // 16, 16).astype(np.int32).sum(-1).astype(np.int16)   # (N, n, 16)
    return q, d, bsums


def planes(raw: np.ndarray, qtype: str, d_in: int):
    """(qs, d, m) with a row per output of Q4_K, Q5_K or Q6_K bytes ``raw`` (d_out, bytes), the module's docstring's
    integer planes: (d_out, n, 128, 160 or 192) uint8, (d_out, n, 2 or 1) float16, (d_out, n, 16) uint8 or
    int8."""
    from gguf.quants import Q4_K

    block, nbytes = quantized.quant_sizes(qtype)
    rows, n = raw.shape[0], d_in // block
    blocks = raw.reshape(rows * n, nbytes)                                      # (super-blocks, bytes)
    if qtype in ("Q4_K", "Q5_K"):
        d = blocks[:, :4].copy().view(np.float16)                               # (rows·n, 2) d, dmin
        sc, mn = Q4_K.get_scale_min(blocks[:, 4:4 + Q4_K.K_SCALE_SIZE])         # (rows·n, 8) each
        sm = np.concatenate([sc, mn], axis=-1).astype(np.uint8)                 # (rows·n, 16)
        qs = blocks[:, 4 + Q4_K.K_SCALE_SIZE:]                                  # (rows·n, 128 [+ 32]) the file's
        if qtype == "Q5_K":                                                     # qh then nibbles: nibbles, then qh
            qs = np.concatenate([qs[:, QK_K // 8:], qs[:, :QK_K // 8]], axis=-1)   # (rows·n, 160)
        return qs.reshape(rows, n, -1), d.reshape(rows, n, 2), sm.reshape(rows, n, 16)
    if qtype == "Q6_K":
        qs = blocks[:, :3 * QK_K // 4]                                          # (rows·n, 192) ql, then qh
        sc = blocks[:, 3 * QK_K // 4:3 * QK_K // 4 + 16].view(np.int8)          # (rows·n, 16)
        d = blocks[:, 3 * QK_K // 4 + 16:].copy().view(np.float16)              # (rows·n, 1)
        return qs.reshape(rows, n, -1), d.reshape(rows, n, 1), sc.reshape(rows, n, 16).copy()
    raise ValueError(f"qtype must be one of {list(K_TYPES)}, got {qtype!r}")


def values(qs: np.ndarray, qtype: str) -> np.ndarray:
    """The weights' values w (R, n, 256) int32 in value order from ``qs`` (R, n, 128, 160 or 192): Q4_K's
    4-bit w (byte 32·i + t holds values 64·i + t and 64·i + 32 + t), Q5_K's those plus 16 times bit 2·i (or
    2·i + 1) of byte 128 + t, Q6_K's 6-bit w (its integer is w − 32; low 4 bits in the first 128 bytes, high 2
    in the last 64, as ``dequantize_row_q6_K`` reads them)."""
    if qtype == "Q6_K":                                                         # ql (128 bytes), qh (64)
        w = np.empty((*qs.shape[:2], 2, 4, 32), np.int32)                       # (R, n, half, quarter, 32)
        for h in range(2):                                                      # llama.cpp's value order
            low = qs[..., 64 * h:64 * h + 64].reshape(*qs.shape[:2], 2, 32).astype(np.int32)   # bytes l, l + 32
            high = qs[..., 128 + 32 * h:128 + 32 * h + 32].astype(np.int32)     # (R, n, 32)
            for k in range(4):
                w[:, :, h, k] = ((low[:, :, k % 2] >> 4 * (k // 2)) & 15) | (((high >> 2 * k) & 3) << 4)
        return w.reshape(*qs.shape[:2], QK_K)
    q = qs[..., :QK_K // 2].reshape(*qs.shape[:2], 4, 1, 32).astype(np.int32)   # (R, n, 4, 1, 32)
    w = np.concatenate([q & 15, q >> 4], axis=3)                                # (R, n, 4, 2, 32)
    if qtype == "Q5_K":
        bit = np.arange(8).reshape(4, 2, 1)                                     # value 64·i + 32·h: bit 2·i + h
        w = w + 16 * ((qs[..., None, None, QK_K // 2:].astype(np.int32) >> bit) & 1)
    return w.reshape(*qs.shape[:2], QK_K)


def dequantized(qs, d, m, qtype: str) -> np.ndarray:
    """The float32 weights (R, n·256) ``gguf.quants`` rebuilds, bit for bit, from the integer planes (one row
    per output): Q4_K (d·sc)·w − dmin·mn, Q6_K (d·sc)·(w − 32), each product rounded to float32 as gguf's."""
    w = (values(qs, qtype) - (32 if qtype == "Q6_K" else 0)).astype(np.float32)   # (R, n, 256)
    dd = d.astype(np.float32)                                                   # (R, n, 2 or 1)
    if qtype in ("Q4_K", "Q5_K"):
        scale = dd[..., :1] * m[..., :8].astype(np.float32)                     # (R, n, 8)
        low = dd[..., 1:] * m[..., 8:].astype(np.float32)                       # (R, n, 8)
        out = scale[..., None] * w.reshape(*w.shape[:2], 8, 32) - low[..., None]   # (R, n, 8, 32)
    else:
        scale = dd * m.astype(np.float32)                                       # (R, n, 16)
        out = scale[..., None] * w.reshape(*w.shape[:2], 16, 16)                # (R, n, 16, 16)
    return out.reshape(w.shape[0], -1)


def hsum8(a: np.ndarray) -> np.ndarray:
    """llama.cpp's ``hsum_float_8`` over the last axis (8): ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))."""
    return ((a[..., 0] + a[..., 4]) + (a[..., 2] + a[..., 6])) + ((a[..., 1] + a[..., 5]) + (a[..., 3] + a[..., 7]))


def integer_lanes(qx: np.ndarray, w: np.ndarray, sc: np.ndarray, bsums: np.ndarray, qtype: str) -> np.ndarray:
    """(N, R, n, 8) int64: llama.cpp's eight int32 lanes per super-block, ``sumi_j`` of the module's
    docstring, for x's q (N, n, 256) and sums bsums (N, n, 16), the weights' values w (R, n, 256) and sub-block
    scales sc (R, n, 8 or 16)."""
    sub = SUB[qtype]
    per = QK_K // 32                                                            # chunks of 32 values
    lanes = np.einsum("nbcju,rbcju->nrbcj", qx.reshape(*qx.shape[:2], per, LANES, 4).astype(np.int64),
                      w.reshape(*w.shape[:2], per, LANES, 4).astype(np.int64))  # (N, R, n, 8 chunks, 8 lanes)
    if sub == 32:                                                               # one scale a chunk
        scale = sc.astype(np.int64)[None, :, :, :, None]                        # (1, R, n, 8, 1)
    else:                                                                       # lanes 0-3: sc_2c, 4-7: sc_2c+1
        scale = np.repeat(sc.astype(np.int64).reshape(*sc.shape[:2], per, 2), 4, axis=-1)[None]   # (1, R, n, 8, 8)
    sumi = (lanes * scale).sum(axis=3)                                          # (N, R, n, 8)
    if qtype == "Q6_K":                                    # − 32·Σ_i sc_i·bsums_i, lane j: i = 2j, 2j + 1
        offset = (sc.astype(np.int64).reshape(1, *sc.shape[:2], 8, 2) *
                  bsums.astype(np.int64).reshape(bsums.shape[0], 1, bsums.shape[1], 8, 2)).sum(-1)   # (N, R, n, 8)
        sumi = sumi - 32 * offset
    return sumi


def reference_matmul(x: np.ndarray, w: "Q8KActivationMatrix") -> np.ndarray:
    """x (N, d_in) @ w in llama.cpp's Q8_K arithmetic, by numpy: (N, d_out) float32, every rounding as the
    module's docstring says (the kernels' reference, bit for bit)."""
    if w.qtype not in K_TYPES:
        raise ValueError(f"w.qtype must be one of {list(K_TYPES)}, got {w.qtype!r}")
    qx, xd, bsums = quantize_q8_k(x)                                            # (N, n, 256), (N, n), (N, n, 16)
    qs, d, m = (w.rows(p) for p in ("qs", "d", "m"))                            # (R, n, ...)
    wi = values(qs, w.qtype)                                                    # (R, n, 256)
    sc = m if w.qtype == "Q6_K" else m[..., :8]                                 # (R, n, 8 or 16)
    sumi = integer_lanes(qx, wi, sc, bsums, w.qtype).astype(np.int32).astype(np.float32)   # (N, R, n, 8)
    wd = d.astype(np.float32)                                                   # (R, n, 2 or 1)
    N, R, n = qx.shape[0], wi.shape[0], wi.shape[1]
    acc = np.zeros((N, R, LANES), np.float32)                                   # (N, R, 8)
    accm = np.zeros((N, R, 4), np.float32)                                      # (N, R, 4)
    summs = np.zeros((N, R), np.float32)                                        # (N, R) Q5_K's minima
    if w.qtype != "Q6_K":
        S = bsums.astype(np.int64).reshape(N, n, 8, 2).sum(-1)                  # (N, n, 8) x's sums of 32
        mn = m[..., 8:].astype(np.int64)                                        # (R, n, 8)
        prod = (mn[None].reshape(1, R, n, 4, 2) * S[:, None].reshape(N, 1, n, 4, 2)).sum(-1)   # (N, R, n, 4)
        prod = prod.astype(np.int32).astype(np.float32)
    for b in range(n):
        dd = xd[:, None, b] * wd[None, :, b, 0]                                 # (N, R) x.d·d, float32
        acc = fma32(np.broadcast_to(dd[..., None], acc.shape), sumi[:, :, b], acc)   # (N, R, 8)
        if w.qtype != "Q6_K":
            dmin = -xd[:, None, b] * wd[None, :, b, 1]                          # (N, R) −x.d·dmin
        if w.qtype == "Q4_K":
            accm = fma32(np.broadcast_to(dmin[..., None], accm.shape), prod[:, :, b], accm)   # (N, R, 4)
        elif w.qtype == "Q5_K":
            summs = fma32(dmin, prod[:, :, b].astype(np.int64).sum(-1).astype(np.float32), summs)   # (N, R)
    total = hsum8(acc)                                                          # (N, R)
    if w.qtype == "Q4_K":
        total = total + ((accm[..., 0] + accm[..., 2]) + (accm[..., 1] + accm[..., 3]))
    elif w.qtype == "Q5_K":
        total = total + summs
    return total


def reference_matmul_tiled(x: np.ndarray, w: "Q8KActivationMatrix") -> np.ndarray:
    """x (N, d_in) @ w as the vendored ggml's *tiled* K-quant GEMM computes it (ggml-cpu's
    ``ggml_compute_forward_mul_mat_tiled``, which ``ggml_tiled_min_batch`` takes for 8 or more tokens: llama.cpp's
    prefill; the mode's rule from :data:`TILED_MIN_BATCH` tokens on), by numpy: per super-block the exact integers
    s1 = Σ_s sc_s · Σ w·q (Q6_K: with its −32) and
    s2 = Σ_s mn_s · S_s, then ``r = float(s1)·d`` and ``r = fma(−dmin, float(s2), r)`` (the VNNI microkernel's
    epilogue, ``_mm512_fnmadd_ps``; no minima for Q6_K), ``out = fma(r, x.d, out)`` super-block after
    super-block (its ``buf + r·d1``, contracted by the compiler). A token's outputs here differ from
    :func:`reference_matmul`'s (llama.cpp's one-token ``vec_dot``), but not with the batch's size from 8 tokens on
    (tests/test_q8k_activations.py holds it to ggml's ``ggml_mul_mat`` where llama-cpp-python is installed)."""
    if w.qtype not in K_TYPES:
        raise ValueError(f"w.qtype must be one of {list(K_TYPES)}, got {w.qtype!r}")
    qx, xd, bsums = quantize_q8_k(x)                                            # (N, n, 256), (N, n), (N, n, 16)
    qs, d, m = (w.rows(p) for p in ("qs", "d", "m"))                            # (R, n, ...)
    sc = m if w.qtype == "Q6_K" else m[..., :8]                                 # (R, n, 8 or 16)
    s1 = integer_lanes(qx, values(qs, w.qtype), sc, bsums, w.qtype).sum(-1)    # (N, R, n) exact
    s1 = s1.astype(np.int32).astype(np.float32)
    wd = d.astype(np.float32)                                                   # (R, n, 2 or 1)
    N, R, n = s1.shape
    if w.qtype != "Q6_K":
        S = bsums.astype(np.int64).reshape(N, n, 8, 2).sum(-1)                  # (N, n, 8) x's sums of 32
        s2 = (m[..., 8:].astype(np.int64)[None] * S[:, None]).sum(-1).astype(np.int32).astype(np.float32)
    out = np.zeros((N, R), np.float32)                                          # (N, R)
    for b in range(n):
        r = s1[:, :, b] * wd[None, :, b, 0]                                     # (N, R)
        if w.qtype != "Q6_K":
            r = fma32(-np.broadcast_to(wd[None, :, b, 1], r.shape), s2[:, :, b], r)
        out = fma32(r, np.broadcast_to(xd[:, None, b], r.shape), out)
    return out


@functools.cache
def _kernels():
    from . import _q8k_fused
    return _q8k_fused


class Q8KActivationMatrix(Q8ActivationMatrix):
    """A Q4_K, Q5_K or Q6_K weight W (d_in, d_out) whose ``x @ W`` rounds x to Q8_K and multiplies integers, as
    llama.cpp does (the module's docstring); its planes are the integer ones (not the exact mode's). The rule,
    llama.cpp's: a product of fewer than :data:`TILED_MIN_BATCH` tokens (a decode step) is its one-token
    arithmetic (:func:`reference_matmul`), one of that many or more (a prefill) its tiled GEMM's
    (:func:`reference_matmul_tiled`). A token's outputs depend only on which side of the rule its batch is on,
    never on the threads, and deterministically: as llama.cpp's, a prefill's last logits are not bit for bit the
    decode step's."""

    def __init__(self, raw: np.ndarray, qtype: str, d_in: int):
        if qtype not in K_TYPES:
            raise ValueError(f"qtype must be one of {list(K_TYPES)} for Q8_K activations, got {qtype!r}")
        if isinstance(d_in, bool) or not isinstance(d_in, (int, np.integer)) or d_in <= 0 or d_in % QK_K:
            raise ValueError(f"d_in must be a positive multiple of {QK_K} for {qtype}, got {d_in!r}")
        block, nbytes = quantized.quant_sizes(qtype)
        raw = np.asarray(raw)
        if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] != d_in // block * nbytes:
            raise ValueError(f"raw must be uint8 (d_out, {d_in // block} blocks × {nbytes} bytes) for d_in {d_in} "
                             f"in {qtype}, got {raw.dtype} {raw.shape}")
        qs, d, m = planes(raw, qtype, int(d_in))
        self._set(qtype, int(d_in), raw.shape[0], grouped(qs), grouped(d), grouped(m))

    def __repr__(self) -> str:
        return f"Q8KActivationMatrix({self.qtype}, shape={self.shape})"

    def finite(self) -> bool:
        return bool(np.isfinite(self.d).all())

    def dequantize(self, rows=None) -> np.ndarray:
        """The float32 weight (d_in, d_out), or its columns ``rows`` only: ``gguf.quants``' values, bit for bit."""
        keep = slice(None) if rows is None else rows
        qs, d, m = (self.rows(p)[keep] for p in ("qs", "d", "m"))
        return dequantized(qs, d, m, self.qtype).T                                  # (d_in, R)

    def dequantize_rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` (n,) of the transpose, float32 (n, d_in): a tied embedding's lookup."""
        return self.dequantize(ids).T

    def _product(self, x2: np.ndarray) -> np.ndarray:
        """x2 (N, d_in) float32 C-contiguous @ W: (N, d_out), the tiled arithmetic from TILED_MIN_BATCH tokens."""
        tiled = x2.shape[0] >= TILED_MIN_BATCH                                     # llama.cpp's prefill arithmetic
        if not quantized.has_kernel():
            return (reference_matmul_tiled if tiled else reference_matmul)(x2, self)    # (N, d_out)
        out = np.empty((x2.shape[0], self.d_out), np.float32)                      # (N, d_out)
        many = x2.shape[0] > _kernels().MAX_TOKENS                                  # a prefill: the worker pool
        _kernels().matmul(self.qtype, *self.kernel_planes, x2, out,
                          quantized.prefill_pool(x2.shape[0]) if many else None, tiled=tiled)
        return out


def weight_q8(raw: np.ndarray, qtype: str, d_in: int, *, rows: bool = False):
    """A GGUF tensor as the stack's weight in the 8-bit-activation mode: a :class:`Q8KActivationMatrix` (its
    ``.T`` rows with ``rows``) for Q4_K, Q5_K and Q6_K, any other type as
    :func:`attnlab.kernels.q8_activations.weight_q8` keeps it."""
    if qtype in K_TYPES and quantized.has_kernel():
        m = Q8KActivationMatrix(raw, qtype, d_in)
        return m.T if rows else m
    return q8_weight(raw, qtype, d_in, rows=rows)
