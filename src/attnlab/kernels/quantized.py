"""Weights that stay quantized: a GGUF tensor kept in its block type, multiplied without a float32 copy.

llama.cpp stores a weight as rows of blocks: Q8_0 is 32 int8 values and one float16 scale ``d`` (w = d·q),
Q4_0 32 four-bit values and ``d`` (w = d·(q − 8)), Q4_1 32 four-bit values, ``d`` and a minimum ``m``
(w = d·q + m). The block sizes and byte sizes come from ``gguf.constants.GGML_QUANT_SIZES`` and the
dequantization itself from ``gguf.quants`` (the numpy path, and the reference the tests hold the kernel to).

:class:`QuantizedMatrix` is a weight (d_in, d_out) the stack multiplies as it does an array, ``x @ W``:
numpy hands the product to ``W.__rmatmul__`` (``__array_ufunc__ = None``). With numba (the extra
``attnlab[fast]``) a kernel dequantizes each block and multiplies it in one pass, over the rows in parallel
(:mod:`attnlab.kernels._quant_fused`), so a decode step reads 0.6 byte per weight (Q4_1) instead of 4; its
products are those of the dequantized float32 values, in another order. Without numba (or with
``ATTNLAB_NO_NUMBA=1``) each product dequantizes the weight with ``gguf.quants`` first (a float32 copy per
call: slow, but the same values); :func:`load_quantized` warns once and keeps float32 instead.

Many tokens at once (a prefill) dequantize row blocks into a float32 scratch and multiply them with BLAS:
the dequantization is paid once per call, not once per token.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np

from . import _kernels

# the types with a fused kernel, and each one's values per byte of payload (4-bit: two per byte)
KERNEL_TYPES = {"Q4_0": 2, "Q4_1": 2, "Q8_0": 1}
SCRATCH_BYTES = 4 * 2**20          # a prefill dequantizes this much float32 at a time (fits L2/L3)


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
    """A weight W (d_in, d_out) stored as GGUF rows: one row of blocks per output, ``raw`` (d_out, bytes).

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
        self.raw, self.qtype, self.d_in = raw, qtype, d_in
        blocks = raw.reshape(raw.shape[0], d_in // block, nbytes)            # (d_out, n_blocks, bytes) a view
        payload = block // KERNEL_TYPES[qtype]                                # bytes of the values
        header = nbytes - payload                                             # float16 d (and m)
        halves = np.ascontiguousarray(blocks[..., :header]).view(np.float16).astype(np.float32)
        self.d = np.ascontiguousarray(halves[..., 0])                        # (d_out, n_blocks) scales
        self.m = (np.ascontiguousarray(halves[..., 1]) if header // 2 > 1     # (d_out, n_blocks) minima (Q4_1),
                  else np.zeros_like(self.d))                                # 0 for the types without one
        self.qs = blocks[..., header:]                                       # (d_out, n_blocks, payload) a view

    @property
    def shape(self) -> tuple[int, int]:
        return (self.d_in, self.raw.shape[0])

    @property
    def ndim(self) -> int:
        return 2

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32)   # what it computes in, and what dequantize() returns

    @property
    def nbytes(self) -> int:
        """Bytes a product reads: the blocks (the scales are read from ``d`` and ``m``, float32 copies)."""
        return int(self.raw.nbytes)

    @property
    def size(self) -> int:
        return self.d_in * self.raw.shape[0]

    @property
    def T(self) -> "QuantizedRows":
        """The transpose (d_out, d_in), the same blocks: a table of rows (a tied embedding's W_E)."""
        return QuantizedRows(self)

    def __repr__(self) -> str:
        return f"QuantizedMatrix({self.qtype}, shape={self.shape})"

    def dequantize(self) -> np.ndarray:
        """The float32 weight (d_in, d_out), by ``gguf.quants``."""
        return dequantize_rows(self.raw, self.qtype).T

    def __array__(self, dtype=None, copy=None):
        out = self.dequantize()
        return out if dtype is None else out.astype(dtype)

    def __rmatmul__(self, x):
        x = np.asarray(x)
        if x.ndim < 1 or x.shape[-1] != self.d_in:
            raise ValueError(f"x @ W needs x (..., {self.d_in}), got shape {x.shape}")
        lead = x.shape[:-1]
        x2 = np.ascontiguousarray(x.reshape(-1, self.d_in), dtype=np.float32)   # (N, d_in)
        out = np.empty((x2.shape[0], self.raw.shape[0]), np.float32)           # (N, d_out)
        fused = None if _kernels.numba_disabled() else fused_kernels()
        if fused is None:
            out[:] = x2 @ dequantize_rows(self.raw, self.qtype).T
        elif x2.shape[0] <= fused.MAX_TOKENS:
            fused.matvec(self.qtype, self.qs, self.d, self.m, x2, out)
        else:
            self._matmul_chunks(fused, x2, out)
        return out.reshape(*lead, self.raw.shape[0])                         # (..., d_out)

    def _matmul_chunks(self, fused, x2, out) -> None:
        """Many tokens: row blocks dequantized into float32 scratch, then one BLAS product each."""
        rows = max(1, SCRATCH_BYTES // (4 * self.d_in))
        scratch = np.empty((min(rows, self.raw.shape[0]), self.d_in), np.float32)   # (rows, d_in)
        for r0 in range(0, self.raw.shape[0], rows):
            r1 = min(r0 + rows, self.raw.shape[0])
            w = scratch[:r1 - r0]                                           # (rows, d_in)
            fused.dequantize(self.qtype, self.qs[r0:r1], self.d[r0:r1], self.m[r0:r1], w)
            np.matmul(x2, w.T, out=out[:, r0:r1])                           # (N, rows)

    @classmethod
    def fuse_columns(cls, ws):
        """Weights side by side (d_in, Σ d_out_i) of one type: their rows stacked (a copy of the blocks)."""
        if len({(w.qtype, w.d_in) for w in ws}) != 1:
            return None
        return cls(np.concatenate([w.raw for w in ws], axis=0), ws[0].qtype, ws[0].d_in)


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

    def __getitem__(self, ids) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"a quantized table is indexed by integer ids, got dtype {ids.dtype}")
        rows = dequantize_rows(self.matrix.raw[ids.ravel()], self.qtype)      # (n, d)
        return rows.reshape(*ids.shape, self.shape[1])                       # (..., d)

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


def has_kernel() -> bool:
    """Whether quantized weights multiply without a float32 copy here (numba installed, not disabled)."""
    return fused_kernels() is not None
