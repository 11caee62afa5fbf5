"""Weights that stay quantized: a GGUF tensor kept in its block type, multiplied without a float32 copy.

llama.cpp stores a weight as rows of blocks: Q8_0 is 32 int8 values and one float16 scale ``d`` (w = d·q),
Q4_0 32 four-bit values and ``d`` (w = d·(q − 8)), Q4_1 32 four-bit values, ``d`` and a minimum ``m``
(w = d·q + m); the K-quant Q4_K a super-block of 256 four-bit values in 8 sub-blocks of 32, each with a 6-bit
scale and minimum of the super-block's float16 d and dmin (w = (d·sc)·q − dmin·mn), and Q6_K 256 six-bit
values in 16 sub-blocks of 16, each with an int8 scale of the float16 d (w = (d·sc)·(q − 32)). The block
sizes and byte sizes come from ``gguf.constants.GGML_QUANT_SIZES``, Q4_K's packed scales and Q6_K's values
are unpacked by ``gguf.quants``, and ``gguf.quants.dequantize`` is the reference the tests hold every path
to, bit for bit.

:class:`QuantizedMatrix` is a weight (d_in, d_out) the stack multiplies as it does an array, ``x @ W``:
numpy hands the product to ``W.__rmatmul__`` (``__array_ufunc__ = None``). It holds the file's bytes
rearranged into planes (values, scales, minima; rows in groups of four side by side), not a float32 copy:
SmolLM2's 98 MB Q4_1 file is 97 MB of planes. The K-quants' sub-block scales are products computed in
float32, so they stay float32: Q4_K takes 0.75 byte per weight against the file's 0.56, Q6_K (its values
unpacked to int8) 1.25 against 0.82; still a third of float32's 4 bytes or less. With numba (the extra ``attnlab[fast]``) a kernel dequantizes each
block and multiplies it in one pass, over the rows in parallel (:mod:`attnlab.kernels._quant_fused`), so a
decode step reads 0.6 byte per weight (Q4_1) instead of 4; its products are those of the dequantized float32
values, in another order. Without numba (or with ``ATTNLAB_NO_NUMBA=1``) each product dequantizes the weight
with numpy first (a float32 copy per call: slow, but the same values); :func:`weight_from_gguf` warns once
and keeps float32 instead.

Many tokens at once (a prefill) dequantize row blocks into a float32 scratch and multiply them with BLAS:
the dequantization is paid once per call, not once per token. ``y @ W.T`` (a backward pass) does the same.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np

from . import _kernels
from ._step import answers

# the types with a fused kernel, and each one's values per byte of payload (4-bit: two per byte); the
# K-quants multiply as 32-value blocks of Q4_1's form (Q4_K) or Q8_0's with a scale per 16 (Q6_K)
KERNEL_TYPES = {"Q4_0": 2, "Q4_1": 2, "Q8_0": 1, "Q4_K": 2, "Q6_K": 1}
FIVE_BIT_TYPES = ("Q5_0", "Q5_1")  # planes only (the 8-bit-activation mode's): the file's qh and nibbles
INT8_TYPES = ("Q8_0", "Q6_K")      # kept as int8 values (Q6_K's 6-bit values unpacked: 1 byte each)
SCRATCH_BYTES = 4 * 2**20          # a prefill dequantizes this much float32 at a time (fits L2/L3)
GROUP = 4          # rows whose blocks lie side by side: _quant_fused.GROUP (the kernels, numba), tested equal


@functools.cache
def quant_sizes(name: str) -> tuple[int, int]:
    """(values per block, bytes per block) of a GGML type, from ``gguf.constants.GGML_QUANT_SIZES``."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType[name]]


def dequantize_rows(raw: np.ndarray, qtype: str) -> np.ndarray:
    """float32 rows (rows, d_in) of ``raw`` (rows, bytes) in GGML type ``qtype``, by ``gguf.quants``."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    return dequantize(raw, GGMLQuantizationType[qtype])


class QuantizedMatrix:
    """A weight W (d_in, d_out) kept as GGUF blocks: one row of blocks per output, in the planes the kernels
    read (:mod:`attnlab.kernels._quant_fused`): the values ``qs`` (G, n_blocks, GROUP, bytes), the float16
    scales ``d`` and minima ``m`` (G, n_blocks, GROUP; m None for the types without one), the rows in groups
    of GROUP side by side (the last group padded with zero rows): the file's bytes, rearranged.

    ``x @ W`` for x (..., d_in) gives (..., d_out) in float32, as ``x @ dequantize(raw).T`` does.
    """
    __array_ufunc__ = None          # x @ W: numpy defers to __rmatmul__ (and refuses other ufuncs)

    def __init__(self, raw: np.ndarray, qtype: str, d_in: int):
        if qtype not in KERNEL_TYPES:
            raise ValueError(f"qtype must be one of {sorted(KERNEL_TYPES)}, got {qtype!r}")
        block, nbytes = quant_sizes(qtype)
        raw = np.asarray(raw)
        if raw.dtype != np.uint8 or raw.ndim != 2 or d_in % block or raw.shape[1] != d_in // block * nbytes:
            raise ValueError(f"raw must be uint8 (d_out, {d_in // block} blocks × {nbytes} bytes) for d_in {d_in} "
                             f"in {qtype} ({block} values per block), got {raw.dtype} {raw.shape}")
        qs, d, m = {"Q4_K": k_quant_planes, "Q6_K": q6_k_planes}.get(qtype, block_planes)(raw, qtype, d_in)
        self._set(qtype, d_in, raw.shape[0], grouped(qs), grouped(d), None if m is None else grouped(m))

    def _set(self, qtype, d_in, d_out, qs, d, m) -> None:
        self.qtype, self.d_in, self.d_out, self.qs, self.d, self.m = qtype, d_in, d_out, qs, d, m
        # the planes as the kernels take them (float16 as its bits, uint16 views), made once, not per product
        self.kernel_planes = (qs, *(p.view(np.uint16) if p is not None and p.dtype == np.float16 else p
                                    for p in (d, m)))

    @classmethod
    def _of(cls, qtype, d_in, d_out, qs, d, m) -> "QuantizedMatrix":
        w = object.__new__(cls)
        w._set(qtype, d_in, d_out, qs, d, m)
        return w

    @property
    def shape(self) -> tuple[int, int]:
        return (self.d_in, self.d_out)

    @property
    def ndim(self) -> int:
        return 2

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)   # what it computes in, and what dequantize() returns

    @property
    def nbytes(self) -> int:
        """Bytes it holds, which a product reads: the values and their float16 scales (and minima)."""
        return int(self.qs.nbytes + self.d.nbytes + (0 if self.m is None else self.m.nbytes))

    @property
    def size(self) -> int:
        return self.d_in * self.d_out

    @property
    def T(self) -> "QuantizedRows":
        """The transpose (d_out, d_in), the same blocks: a table of rows (a tied embedding's W_E)."""
        return QuantizedRows(self)

    def __repr__(self) -> str:
        return f"QuantizedMatrix({self.qtype}, shape={self.shape})"

    def rows(self, plane: str) -> np.ndarray:
        """One plane (``"qs"``, ``"d"``, ``"m"``) with a row per output, (d_out, n_blocks, ...): a copy."""
        return ungrouped(getattr(self, plane), self.d_out)

    def __getitem__(self, key):
        """``W[:, cols]``: the weight of the columns ``cols`` (outputs; a slice or an index array), its rows of
        blocks copied; ``W[:, :]`` is W itself. Anything else needs the float32 array (``np.asarray(W)``)."""
        if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], slice) and key[0] == slice(None)):
            raise TypeError(f"a QuantizedMatrix takes W[:, cols] only (whole rows of blocks), got {key!r}; "
                            "np.asarray(W) gives the float32 weight")
        cols = key[1]
        if isinstance(cols, slice) and cols == slice(None):
            return self
        planes = [None if getattr(self, p) is None else grouped(self.rows(p)[cols]) for p in ("qs", "d", "m")]
        return self._of(self.qtype, self.d_in, len(np.arange(self.d_out)[cols]), *planes)

    def finite(self) -> bool:
        """Whether every value is finite: the float16 scales (and minima) are (the values are integers)."""
        return bool(np.isfinite(self.d).all() and (self.m is None or np.isfinite(self.m).all()))

    def dequantize(self, rows=None) -> np.ndarray:
        """The float32 weight (d_in, d_out), or its columns ``rows`` (int array) only, (d_in, len(rows)):
        the values ``gguf.quants`` rebuilds, bit for bit, by numpy from the planes (d·(q − off) + m)."""
        keep = slice(None) if rows is None else rows
        qs, d = self.rows("qs")[keep], self.rows("d")[keep].astype(np.float32)        # (R, n_blocks, ...)
        if self.qtype in FIVE_BIT_TYPES:                                               # d (R, n_blocks)
            w = d[..., None] * five_bit_values(qs, self.qtype).astype(np.float32)      # (R, n_blocks, 32)
            if self.qtype == "Q5_1":
                w = w + self.rows("m")[keep].astype(np.float32)[..., None]             # (R, n_blocks, 32)
        elif self.qtype in INT8_TYPES:                                                 # d (R, n_blocks, 1 or 2)
            q = qs.astype(np.float32).reshape(*d.shape, -1)                            # (R, n_blocks, 1 or 2, ...)
            w = q * d[..., None]                                                       # (R, n_blocks, 1 or 2, ...)
        else:
            q = np.concatenate([qs & np.uint8(15), qs >> np.uint8(4)], axis=-1).astype(np.float32)
            w = d[..., None] * (q - np.float32(8.0)) if self.qtype == "Q4_0" else \
                d[..., None] * q + self.rows("m")[keep].astype(np.float32)[..., None]    # (R, n_blocks, 32)
        return w.reshape(w.shape[0], self.d_in).T                                      # (d_in, R)

    def __array__(self, dtype=None, copy=None):
        out = self.dequantize()
        return out if dtype is None else out.astype(dtype)

    def dequantize_rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` (n,) int64 in [0, d_out) of the transpose, float32 (n, d_in): a table's lookup (the fused
        kernel, or numpy without it; the same values)."""
        fused = fused_kernels()
        if fused is None:
            return self.dequantize(ids).T                                       # (n, d) by numpy
        rows = np.empty((ids.size, self.d_in), np.float32)                      # (n, d) the same values
        fused.dequantize(self.qtype, *self.kernel_planes, ids, rows)
        return rows

    def __rmatmul__(self, x):
        x = np.asarray(x)
        if x.ndim < 1 or x.shape[-1] != self.d_in:
            raise ValueError(f"x @ W needs x (..., {self.d_in}), got shape {x.shape}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.d_in)
        if x2.dtype != np.float32 or not x2.flags.c_contiguous:
            x2 = np.ascontiguousarray(x2, dtype=np.float32)                  # (N, d_in)
        fused, threads = product_kernel()
        if fused is None:
            return (x2 @ self.dequantize()).reshape(*lead, self.d_out)
        out = np.empty((x2.shape[0], self.d_out), np.float32)                 # (N, d_out)
        if x2.shape[0] <= fused.MAX_TOKENS:
            fused.matvec(self.qtype, *self.kernel_planes, x2, out, threads)
        else:
            self._matmul_chunks(fused, x2, out)
        return out.reshape(*lead, self.d_out)                         # (..., d_out)

    def _matmul_chunks(self, fused, x2, out) -> None:
        """Many tokens: row blocks dequantized into float32 scratch (over :func:`prefill_pool`'s threads),
        then one BLAS product each."""
        rows = max(1, SCRATCH_BYTES // (4 * self.d_in))
        scratch = np.empty((min(rows, self.d_out), self.d_in), np.float32)   # (rows, d_in)
        pool = prefill_pool(x2.shape[0])
        for r0 in range(0, self.d_out, rows):
            r1 = min(r0 + rows, self.d_out)
            w = scratch[:r1 - r0]                                           # (rows, d_in)
            if pool is None:
                fused.dequantize(self.qtype, *self.kernel_planes, np.arange(r0, r1), w)
            else:
                step = -(-(r1 - r0) // pool._max_workers)
                for f in [pool.submit(fused.dequantize, self.qtype, *self.kernel_planes, np.arange(a, min(a + step, r1)),
                                      w[a - r0:min(a + step, r1) - r0]) for a in range(r0, r1, step)]:
                    f.result()
            np.matmul(x2, w.T, out=out[:, r0:r1])                           # (N, rows)

    @classmethod
    def fuse_columns(cls, ws):
        """Weights side by side (d_in, Σ d_out_i) of one type and width, each a whole number of groups: their
        rows stacked in one weight, and each of ``ws`` then reads its own groups of it (views: the values are
        held once). None when they differ in type or width, or a weight's rows end inside a group."""
        if len({(w.qtype, w.d_in) for w in ws}) != 1 or any(w.d_out % GROUP for w in ws):
            return None
        kept = {p: consecutive_groups([getattr(w, p) for w in ws]) for p in ("qs", "d", "m")
                if getattr(ws[0], p) is not None}
        if all(k is not None for k in kept.values()):    # views of one fused weight's planes already: no copy
            return cls._of(ws[0].qtype, ws[0].d_in, sum(w.d_out for w in ws), kept["qs"], kept["d"],
                           kept.get("m"))
        planes = [None if ws[0].m is None and p == "m" else np.concatenate([getattr(w, p) for w in ws])
                  for p in ("qs", "d", "m")]                                 # (Σ G_i, ...)
        fused = cls._of(ws[0].qtype, ws[0].d_in, sum(w.d_out for w in ws), *planes)
        g0 = 0
        for w in ws:
            g1 = g0 + w.d_out // GROUP
            w._set(w.qtype, w.d_in, w.d_out, *(None if p is None else p[g0:g1] for p in planes))   # views
            g0 = g1
        return fused


def consecutive_groups(parts):
    """The array the planes ``parts`` (each (G_i, ...)) are consecutive leading slices of, in order and with
    nothing before, between or after them; else None. A weight built again from its own fused planes
    (:mod:`attnlab.models.weight_cache`'s copy, mapped from disk) keeps them as they are."""
    base = parts[0].base
    if not isinstance(base, np.ndarray) or not base.flags.c_contiguous or \
            base.shape != (sum(p.shape[0] for p in parts), *parts[0].shape[1:]):
        return None
    at = base.__array_interface__["data"][0]
    for p in parts:
        if p.base is not base or p.dtype != base.dtype or p.strides != base.strides \
                or p.__array_interface__["data"][0] != at:
            return None
        at += p.shape[0] * base.strides[0]
    return base


def block_planes(raw: np.ndarray, qtype: str, d_in: int):
    """(qs, d, m) with a row per output of Q4_0, Q4_1, Q8_0, Q5_0 or Q5_1 bytes ``raw`` (d_out, bytes): each
    block's float16 scale (and minimum) before its values, as ``gguf.quants`` reads them (m None without one).
    Q5_0 and Q5_1: :func:`five_bit_planes`."""
    if qtype in FIVE_BIT_TYPES:
        return five_bit_planes(raw, qtype, d_in)
    block, nbytes = quant_sizes(qtype)
    blocks = raw.reshape(raw.shape[0], d_in // block, nbytes)            # (d_out, n_blocks, bytes) a view
    header = nbytes - block // KERNEL_TYPES[qtype]                        # float16 d (and m) before the values
    halves = blocks[..., :header].copy().view(np.float16)                # (d_out, n_blocks, 1 or 2)
    values = blocks[..., header:]                                        # (d_out, n_blocks, payload)
    if qtype == "Q8_0":                                       # d (d_out, n_blocks, 1): one scale per block
        return values.view(np.int8), halves[..., :1], None
    return values, halves[..., 0], (halves[..., 1] if header == 4 else None)


def five_bit_planes(raw: np.ndarray, qtype: str, d_in: int):
    """(qs, d, m) of Q5_0 or Q5_1 bytes ``raw`` (d_out, bytes): qs (d_out, n_blocks, 20) each block's bytes after
    its float16 d (and m) as the file holds them, the little-endian uint32 ``qh`` (the values' fifth bits) then
    16 nibble bytes (:func:`five_bit_values` reads them); d and m (d_out, n_blocks) float16, m None for Q5_0."""
    block, nbytes = quant_sizes(qtype)
    blocks = raw.reshape(raw.shape[0], d_in // block, nbytes)            # (d_out, n_blocks, bytes) a view
    header = 4 if qtype == "Q5_1" else 2                                 # float16 d (and m), then qh and qs
    halves = blocks[..., :header].copy().view(np.float16)                # (d_out, n_blocks, 1 or 2)
    return blocks[..., header:], halves[..., 0], (halves[..., 1] if qtype == "Q5_1" else None)


def five_bit_values(qs: np.ndarray, qtype: str) -> np.ndarray:
    """The values (..., 32) int8 in value order of Q5 blocks ``qs`` (..., 20) (:func:`five_bit_planes`): value
    t's low four bits the nibble ``qs[4 + t]`` (t < 16: low, else ``qs[4 + t − 16]``'s high one), its fifth bit t
    of the little-endian uint32 ``qh`` (as ``gguf.quants`` and llama.cpp's ``bytes_from_bits_32`` read them);
    Q5_0's q − 16 (−16 … 15), Q5_1's q (0 … 31)."""
    qh = np.ascontiguousarray(qs[..., :4]).view("<u4")                   # (..., 1)
    nibbles = qs[..., 4:]                                                # (..., 16)
    low = np.concatenate([nibbles & np.uint8(15), nibbles >> np.uint8(4)], axis=-1)   # (..., 32)
    fifth = (qh >> np.arange(32, dtype=np.uint32)) & np.uint32(1)        # (..., 32)
    q = low.astype(np.int16) | (fifth.astype(np.int16) << 4)             # (..., 32) 0 … 31
    return (q - 16 if qtype == "Q5_0" else q).astype(np.int8)


def k_quant_planes(raw: np.ndarray, qtype: str, d_in: int):
    """(qs, d, m) of Q4_K bytes ``raw`` (d_out, bytes) as 32-value blocks of Q4_1's form: a super-block of 256
    values holds float16 d and dmin, 6-bit scales and minima of its 8 sub-blocks (unpacked by
    ``gguf.quants.Q4_K.get_scale_min``) and 4-bit values q, w = (d·sc)·q − dmin·mn, computed in float32 as
    ``gguf.quants`` does. d = d·sc and m = −dmin·mn (float32); each sub-block's values repacked as Q4_1 packs
    them (byte t: value t low, t + 16 high; Q4_K packs 64 values in 32 bytes, t and t + 32)."""
    from gguf.quants import Q4_K

    block, nbytes = quant_sizes(qtype)                                   # 256 values, 144 bytes
    n = raw.shape[0] * (d_in // block)
    blocks = raw.reshape(n, nbytes)                                      # (super-blocks, bytes)
    d, dmin = blocks[:, :4].copy().view(np.float16).astype(np.float32).T   # (n,) each
    sc, mn = Q4_K.get_scale_min(blocks[:, 4:4 + Q4_K.K_SCALE_SIZE])      # (n, 8) each
    values = blocks[:, 4 + Q4_K.K_SCALE_SIZE:].reshape(n, block // 64, 1, 32)   # (n, 4, 1, 32) bytes
    q = (values >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & np.uint8(15)
    q = q.reshape(n, block // 32, 32)                                    # (n, 8, 32) each sub-block's values
    qs = q[..., :16] | (q[..., 16:] << np.uint8(4))                      # (n, 8, 16) Q4_1's packing
    scales = d[:, None] * sc.astype(np.float32)                          # (n, 8) as gguf computes them
    minima = -(dmin[:, None] * mn.astype(np.float32))                    # (n, 8) w = scale·q + minimum
    rows = raw.shape[0]
    return qs.reshape(rows, -1, 16), scales.reshape(rows, -1), minima.reshape(rows, -1)


def q6_k_planes(raw: np.ndarray, qtype: str, d_in: int):
    """(qs, d, None) of Q6_K bytes ``raw`` (d_out, bytes) as int8 blocks of 32 values with a scale per 16: a
    super-block of 256 values holds their low 4 bits, their high 2 bits, 16 int8 scales and a float16 d, in
    the order ``gguf.quants.Q6_K`` reads them; w = (d·sc)·(q − 32). The values come from gguf itself
    (``Q6_K.dequantize_blocks`` of the blocks with d = 1 and every scale 1 gives q − 32, exact small integers),
    the scales d·sc are computed in float32 as gguf does."""
    from gguf.constants import QK_K
    from gguf.quants import Q6_K

    block, nbytes = quant_sizes(qtype)                                   # 256 values, 210 bytes
    n = raw.shape[0] * (d_in // block)
    blocks = raw.reshape(n, nbytes)                                      # (super-blocks, bytes)
    scales_at = QK_K // 2 + QK_K // 4                                    # after the values' low and high bits
    unit = blocks.copy()
    unit[:, scales_at:scales_at + QK_K // 16] = 1                        # every scale 1
    unit[:, scales_at + QK_K // 16:] = np.array([1.0], np.float16).view(np.uint8)   # d = 1
    q = Q6_K.dequantize_blocks(unit).astype(np.int8)                     # (n, 256) q − 32, exact
    d = blocks[:, scales_at + QK_K // 16:].copy().view(np.float16).astype(np.float32)   # (n, 1)
    sc = blocks[:, scales_at:scales_at + QK_K // 16].view(np.int8).astype(np.float32)  # (n, 16)
    scales = d * sc                                                      # (n, 16) as gguf computes them
    rows = raw.shape[0]
    return q.reshape(rows, -1, 32), scales.reshape(rows, -1, 2), None


def grouped(plane: np.ndarray) -> np.ndarray:
    """A plane (R, n_blocks, ...) with a row per output as the kernels read it, (G, n_blocks, GROUP, ...):
    rows in groups of GROUP side by side, the last group padded with zero rows."""
    pad = -plane.shape[0] % GROUP
    if pad:
        plane = np.concatenate([plane, np.zeros((pad, *plane.shape[1:]), plane.dtype)])
    g = plane.reshape(plane.shape[0] // GROUP, GROUP, *plane.shape[1:])   # (G, GROUP, n_blocks, ...)
    return np.ascontiguousarray(np.swapaxes(g, 1, 2))                      # (G, n_blocks, GROUP, ...)


def ungrouped(plane: np.ndarray, n_rows: int) -> np.ndarray:
    """The inverse of :func:`grouped`: (G, n_blocks, GROUP, ...) -> (n_rows, n_blocks, ...), a copy."""
    g = np.swapaxes(plane, 1, 2)                                           # (G, GROUP, n_blocks, ...)
    return g.reshape(-1, *g.shape[2:])[:n_rows].copy()


class QuantizedRows:
    """A table (n_rows, d) kept in a GGUF block type, one row of blocks per row: a token embedding W_E.

    ``W[ids]`` dequantizes the rows asked for (float32, (..., d)); ``W.T`` is the :class:`QuantizedMatrix`
    (d, n_rows) of the same blocks, so ``x @ W_E.T`` (tied logits) multiplies without a float32 copy.
    """
    __array_ufunc__ = None

    def __init__(self, matrix: QuantizedMatrix):
        self.matrix = matrix

    @classmethod
    def from_raw(cls, raw: np.ndarray, qtype: str, d: int) -> "QuantizedRows":
        return cls(QuantizedMatrix(raw, qtype, d))

    @property
    def shape(self) -> tuple[int, int]:
        return self.matrix.shape[::-1]

    ndim = 2
    dtype = np.dtype(np.float32)

    @property
    def nbytes(self) -> int:
        return self.matrix.nbytes

    @property
    def size(self) -> int:
        return self.matrix.size

    @property
    def qtype(self) -> str:
        return self.matrix.qtype

    @property
    def T(self) -> QuantizedMatrix:
        return self.matrix

    def __repr__(self) -> str:
        return f"QuantizedRows({self.qtype}, shape={self.shape})"

    def finite(self) -> bool:
        return self.matrix.finite()

    def __getitem__(self, ids) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"a quantized table is indexed by integer ids, got dtype {ids.dtype}")
        flat = ids.ravel().astype(np.int64)
        m = self.matrix
        if flat.size and not (-m.d_out <= flat.min() and flat.max() < m.d_out):
            raise IndexError(f"ids must lie in [-{m.d_out}, {m.d_out}), got {flat.min()} … {flat.max()}")
        flat %= m.d_out
        return m.dequantize_rows(flat).reshape(*ids.shape, self.shape[1])     # (..., d)

    def __rmatmul__(self, y):
        """``y @ W`` for y (..., n_rows): (..., d) in float32 (a backward pass through ``x @ W.T``), the rows
        dequantized a block at a time into float32 scratch, one BLAS product each."""
        y = np.asarray(y)
        m = self.matrix
        if y.ndim < 1 or y.shape[-1] != m.d_out:
            raise ValueError(f"y @ W needs y (..., {m.d_out}), got shape {y.shape}")
        y2 = np.ascontiguousarray(y.reshape(-1, m.d_out), dtype=np.float32)    # (N, n_rows)
        out = np.zeros((y2.shape[0], m.d_in), np.float32)                       # (N, d)
        step = max(1, SCRATCH_BYTES // (4 * m.d_in))
        for r0 in range(0, m.d_out, step):
            rows = self[np.arange(r0, min(r0 + step, m.d_out))]                  # (rows, d) float32
            out += y2[:, r0:r0 + rows.shape[0]] @ rows                          # (N, d)
        return out.reshape(*y.shape[:-1], m.d_in)

    def __array__(self, dtype=None, copy=None):
        out = self.matrix.dequantize().T
        return out if dtype is None else out.astype(dtype)


def is_quantized(w) -> bool:
    """Whether ``w`` is a quantized weight (:class:`QuantizedMatrix` or :class:`QuantizedRows`)."""
    return isinstance(w, (QuantizedMatrix, QuantizedRows))


_warned = []


def weight_from_gguf(raw: np.ndarray, qtype: str, d_in: int, *, rows: bool = False):
    """A GGUF tensor ``raw`` (d_out, bytes) of type ``qtype`` as the stack's weight, kept quantized:
    a :class:`QuantizedMatrix` (d_in, d_out), or with ``rows`` a :class:`QuantizedRows` (d_out, d_in).

    Without the fused kernel (numba missing or ``ATTNLAB_NO_NUMBA`` set), or for a type it does not
    multiply, the float32 weight (by ``gguf.quants``) instead: a warning says so, once per process for the
    missing kernel.
    """
    if qtype in KERNEL_TYPES and has_kernel():
        m = QuantizedMatrix(raw, qtype, d_in)
        return m.T if rows else m
    if qtype in KERNEL_TYPES and not _warned:
        _warned.append(True)
        warnings.warn("quantized weights need numba (pip install 'attnlab[fast]'; ATTNLAB_NO_NUMBA unset): "
                      "keeping them as float32 instead", RuntimeWarning, stacklevel=2)
    w = dequantize_rows(raw, qtype)                                          # (d_out, d_in)
    return w if rows else w.T


@functools.cache
def _fused_module():
    try:
        from . import _quant_fused
    except ImportError:
        return None
    return _quant_fused


def fused_kernels():
    """:mod:`attnlab.kernels._quant_fused` (numba), or None without numba or with ``ATTNLAB_NO_NUMBA``."""
    return None if _kernels.numba_disabled() else _fused_module()


def product_kernel() -> tuple:
    """``(kernels, threads)`` for a product: :func:`fused_kernels` (None: numpy) and :func:`kernel_threads`'
    count; once per step inside a model's pass (:func:`attnlab.kernels._step.one_step`), not per product."""
    step = answers()
    if step is not None and "quantized kernel" in step:
        return step["quantized kernel"]
    fused = fused_kernels()
    got = (fused, None if fused is None else kernel_threads()["threads"])
    if step is not None:
        step["quantized kernel"] = got
    return got


def kernel_threads_rule() -> int:
    """The rule for the quantized products' threads: 1, the calling thread. numba's OpenMP threads spin while
    they wait, and on a machine shared with other work a (1,536 × 576) Q4_1 product on 2 threads took 7.7 ms
    against 0.18 ms on one (2-core Xeon, loaded); ``attnlab tune`` measures numba's threads against one here and
    keeps more only where they win. (Each row is summed by one thread: the count changes no result.)"""
    return 1


def prefill_pool(n_tokens: int):
    """The rule for a product of many tokens (a prefill: more than ``_quant_fused.MAX_TOKENS``): its
    dequantization (exact mode) or integer kernel (q8 mode) split over the worker pool's threads, one per
    usable core, a range of rows each (the kernels release the GIL; Python threads, unlike numba's OpenMP
    ones, do not spin after their work, so BLAS's threads get the cores back). None (the calling thread) for
    fewer tokens or one core. A 512-token SmolLM2 prefill spent ~9% of its time dequantizing on one thread
    while BLAS's second thread waited (Xeon, 2 cores, loaded). Each row is computed by one thread: the split
    changes no result."""
    from ._threads import usable_cores, worker_pool

    import threading

    cores = usable_cores()
    if n_tokens <= _fused_module().MAX_TOKENS or cores == 1 or threading.current_thread().name.startswith("attnlab"):
        return None                       # (a call from one of the pool's own threads never waits on the pool)
    return worker_pool(cores)


def kernel_threads() -> dict:
    """How many threads the quantized products run on: ``{"threads": n, "reason": why}``, the tune profile's
    count when one applies (at most numba's threads), else :func:`kernel_threads_rule`."""
    from . import profile
    tuned = profile.choice("quantized_threads")
    if isinstance(tuned, int) and tuned >= 1:
        return {"threads": tuned, "reason": "tune profile"}
    return {"threads": kernel_threads_rule(),
            "reason": "rule: the calling thread (numba's threads spin on a shared machine)"}


def time_threads(rounds: int = 7) -> dict:
    """``attnlab tune``'s measurement: microseconds of a (1,536 × 576) Q4_1 product on the calling thread and on
    numba's threads, the best of ``rounds`` alternated calls each: ``{threads: us}``."""
    import time

    fused = fused_kernels()
    import numba

    many = numba.get_num_threads()
    rng = np.random.default_rng(0)
    rows, d_in = 1536, 576
    block, nbytes = quant_sizes("Q4_1")
    raw = rng.integers(0, 256, (rows, d_in // block * nbytes), dtype=np.uint8)
    halves = raw.reshape(rows, d_in // block, nbytes)[..., :4].view(np.float16)
    halves[...] = rng.uniform(-0.01, 0.01, halves.shape).astype(np.float16)   # finite scales and minima
    w = QuantizedMatrix(raw, "Q4_1", d_in)
    x = np.ones((1, d_in), np.float32)
    out = np.empty((1, rows), np.float32)
    best = {1: np.inf, many: np.inf}
    for n in best:
        fused.matvec("Q4_1", w.qs, w.d, w.m, x, out, n)                        # compiled / loaded first
    for _ in range(rounds):
        for n in best:
            t0 = time.perf_counter()
            fused.matvec("Q4_1", w.qs, w.d, w.m, x, out, n)
            best[n] = min(best[n], time.perf_counter() - t0)
    return {n: 1e6 * t for n, t in best.items()}


def has_kernel() -> bool:
    """Whether quantized weights multiply without a float32 copy here (numba installed, not disabled)."""
    return fused_kernels() is not None
