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
        self.raws, self.qtype, self.d_in, self.d_out = (raw,), qtype, d_in, raw.shape[0]
        blocks = raw.reshape(raw.shape[0], d_in // block, nbytes)            # (d_out, n_blocks, bytes) a view
        payload = block // KERNEL_TYPES[qtype]                                # bytes of the values
        header = nbytes - payload                                             # float16 d (and m)
        halves = np.ascontiguousarray(blocks[..., :header]).view(np.float16).astype(np.float32)
        self.d = np.ascontiguousarray(halves[..., 0])                        # (d_out, n_blocks) scales
        self.m = (np.ascontiguousarray(halves[..., 1]) if header // 2 > 1     # (d_out, n_blocks) minima (Q4_1),
                  else np.zeros_like(self.d))                                # 0 for the types without one
        self.qs = np.ascontiguousarray(blocks[..., header:])                 # (d_out, n_blocks, payload) the values
        #         alone, contiguous: a strided view of the blocks kept LLVM from vectorising the kernel

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
        """Bytes a product reads: the values and their float32 scales (and minima)."""
        return int(self.qs.nbytes + self.d.nbytes + (self.m.nbytes if self.qtype == "Q4_1" else 0))

    @property
    def size(self) -> int:
        return self.d_in * self.d_out

    @property
    def T(self) -> "QuantizedRows":
        """The transpose (d_out, d_in), the same blocks: a table of rows (a tied embedding's W_E)."""
        return QuantizedRows(self)

    def __repr__(self) -> str:
        return f"QuantizedMatrix({self.qtype}, shape={self.shape})"

    def __getitem__(self, key):
        """``W[:, cols]``: the weight of the columns ``cols`` (outputs; a slice or an index array), its rows of
        blocks copied; ``W[:, :]`` is W itself. Anything else needs the float32 array (``np.asarray(W)``)."""
        if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], slice) and key[0] == slice(None)):
            raise TypeError(f"a QuantizedMatrix takes W[:, cols] only (whole rows of blocks), got {key!r}; "
                            "np.asarray(W) gives the float32 weight")
        cols = key[1]
        if isinstance(cols, slice) and cols == slice(None):
            return self
        part = object.__new__(type(self))
        part.qtype, part.d_in = self.qtype, self.d_in
        part.raws = (np.concatenate(self.raws)[cols],)
        part.qs, part.d, part.m = self.qs[cols].copy(), self.d[cols].copy(), self.m[cols].copy()
        part.d_out = part.d.shape[0]
        return part

    def finite(self) -> bool:
        """Whether every value is finite: the float16 scales (and minima) are (the values are integers)."""
        return bool(np.isfinite(self.d).all() and np.isfinite(self.m).all())

    def dequantize(self) -> np.ndarray:
        """The float32 weight (d_in, d_out), by ``gguf.quants``."""
        return np.concatenate([dequantize_rows(raw, self.qtype) for raw in self.raws]).T

    def __array__(self, dtype=None, copy=None):
        out = self.dequantize()
        return out if dtype is None else out.astype(dtype)

    def __rmatmul__(self, x):
        x = np.asarray(x)
        if x.ndim < 1 or x.shape[-1] != self.d_in:
            raise ValueError(f"x @ W needs x (..., {self.d_in}), got shape {x.shape}")
        lead = x.shape[:-1]
        x2 = np.ascontiguousarray(x.reshape(-1, self.d_in), dtype=np.float32)   # (N, d_in)
        out = np.empty((x2.shape[0], self.d_out), np.float32)                 # (N, d_out)
        fused = None if _kernels.numba_disabled() else fused_kernels()
        if fused is None:
            out[:] = x2 @ self.dequantize()
        elif x2.shape[0] <= fused.MAX_TOKENS:
            fused.matvec(self.qtype, self.qs, self.d, self.m, x2, out, kernel_threads()["threads"])
        else:
            self._matmul_chunks(fused, x2, out)
        return out.reshape(*lead, self.d_out)                         # (..., d_out)

    def _matmul_chunks(self, fused, x2, out) -> None:
        """Many tokens: row blocks dequantized into float32 scratch, then one BLAS product each."""
        rows = max(1, SCRATCH_BYTES // (4 * self.d_in))
        scratch = np.empty((min(rows, self.d_out), self.d_in), np.float32)   # (rows, d_in)
        for r0 in range(0, self.d_out, rows):
            r1 = min(r0 + rows, self.d_out)
            w = scratch[:r1 - r0]                                           # (rows, d_in)
            fused.dequantize(self.qtype, self.qs[r0:r1], self.d[r0:r1], self.m[r0:r1], w)
            np.matmul(x2, w.T, out=out[:, r0:r1])                           # (N, rows)

    @classmethod
    def fuse_columns(cls, ws):
        """Weights side by side (d_in, Σ d_out_i) of one type and width: their rows stacked in one weight, and
        each of ``ws`` then reads its own rows of it (views: the values are held once)."""
        if len({(w.qtype, w.d_in) for w in ws}) != 1:
            return None
        fused = object.__new__(cls)
        fused.qtype, fused.d_in, fused.d_out = ws[0].qtype, ws[0].d_in, sum(w.d_out for w in ws)
        fused.raws = tuple(raw for w in ws for raw in w.raws)
        for plane in ("qs", "d", "m"):
            setattr(fused, plane, np.concatenate([getattr(w, plane) for w in ws]))   # (Σ d_out_i, ...)
        r0 = 0
        for w in ws:
            for plane in ("qs", "d", "m"):
                setattr(w, plane, getattr(fused, plane)[r0:r0 + w.d_out])           # contiguous row views
            r0 += w.d_out
        return fused


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
        flat = ids.ravel()
        m, fused = self.matrix, fused_kernels()
        if fused is None:
            rows = dequantize_rows(np.concatenate(m.raws)[flat], self.qtype)   # (n, d) by gguf.quants
        else:                                                              # from the kept planes, so the file's
            rows = np.empty((flat.size, m.d_in), np.float32)                # pages need not stay resident
            fused.dequantize(self.qtype, m.qs[flat], m.d[flat], m.m[flat], rows)   # (n, d) the same values
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


@functools.cache
def kernel_threads(rounds: int = 7) -> dict:
    """How many threads the quantized products run on here: numba's threads or the calling thread alone,
    whichever multiplied a (1,536 × 576) Q4_1 weight faster (the best of ``rounds`` alternated calls each),
    measured once per process on this machine, never a constant from another. ``{"threads": n, "us": {...}}``."""
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
    threads = min(best, key=best.get)
    return {"threads": threads, "us": {n: 1e6 * t for n, t in best.items()}}


def has_kernel() -> bool:
    """Whether quantized weights multiply without a float32 copy here (numba installed, not disabled)."""
    return fused_kernels() is not None
