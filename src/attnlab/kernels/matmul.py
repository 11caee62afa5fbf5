"""Weights as a decode step reads them: each in the layout this machine's matrix-vector product streams
fastest, and projections that read the same input side by side, multiplied as one matrix.

A decode step multiplies one token's vector by every weight of the model, so it streams the weights once
per token, from memory. Two things set how fast:

- **The layout.** ``x @ W`` for a (d_in, d_out) W runs BLAS's matrix-vector product along W's output axis
  when W is C-contiguous (each row of W, scaled by one x_i, added to the output: the "axpy" form) and as
  d_out dot products when W is F-contiguous (a checkpoint's ``weight.T``, a tied embedding's ``W_Eᵀ``).
  Which form streams faster is the BLAS kernel's business, and depends on the shape. :func:`gemv_order` is a
  rule: "C" (the axpy form) for every weight, unless ``attnlab tune`` measured the other form faster here for
  wide or tall weights; :func:`streamed` lays a weight out that way. (On a 2-core EPYC with OpenBLAS's
  SkylakeX kernel the axpy form read SmolLM2's 576 × 49,152 unembedding twice as fast, the dot form its
  1536 × 576 down-projections 1.2x as fast; on a Xeon with the same kernel wide weights read 1.04-1.14x faster
  in "C" and tall ones 0.93-1.12x: within the noise; docs/speed.md.) The layout changes the order of a
  product's sums, so its last bits: it is never timed while a program runs. Weights below
  :data:`STREAMED_BYTES` are kept as they come: they sit in cache.
- **The number of products.** Each pays a fixed cost (numpy's dispatch, BLAS or numba waking its threads),
  and a small one streams worse than a large one. W_Q, W_K and W_V, and the gated MLP's W_gate and W_in, are
  therefore stored side by side (:func:`fuse_columns`): one product instead of three, or two.

A batch (several prompts, a sweep's stacked runs) multiplies (..., n, d_in) by a 2-D weight: numpy calls BLAS once
per batch row then, each time for n rows only (SmolLM2's 576 × 3072 gate/up weight on a sweep's 9 × 14 rows, one
BLAS thread: 13.3 ms against 5.8 ms as one product; docs/speed.md). :func:`linear` makes it one 2-D product of
all the rows, where that cannot change a row's bits (:func:`merges_rows`).

Fused float weights: the fused array owns the numbers and each weight is a view of its columns (an
optimizer's in-place update of ``W_Q`` updates the fused array). Such a view, like a checkpoint's
``weight.T``, is not C-contiguous: whoever writes a weight's buffer as it lies in memory must make it
contiguous first (``safetensors.numpy.save_file`` writes a non-contiguous array's bytes silently wrong;
attnlab's checkpoints and training state use ``np.ascontiguousarray``). Quantized weights
(:class:`attnlab.kernels.quantized.QuantizedMatrix`) are fused by their type's ``fuse_columns``, a copy of
their blocks, and keep their own layout.
"""

from __future__ import annotations

import numpy as np

from ._checks import as_float_array

STREAMED_BYTES = 2**20       # a weight this large is read from memory, not cache, by a decode step
PROBE_SHAPE = (512, 8192)    # attnlab tune's probe (d_in, d_out) for wide weights: a float32 weight of 16 MiB,
#                              many outputs per input as an unembedding and MLP up-projections have; tall
#                              weights (d_in > d_out: a down-projection) are probed with its transpose's shape
PROBE_MARGIN = 0.9           # tune keeps "F" only when it takes < 0.9× the time of "C"


def as_weight(name: str, w):
    """A weight as a float array, or a quantized weight (:mod:`attnlab.kernels.quantized`) as it is: anything
    with ``__array_ufunc__ = None`` and a ``shape`` (numpy then hands ``x @ w`` to ``w.__rmatmul__``)."""
    if getattr(type(w), "__array_ufunc__", False) is None and hasattr(w, "shape"):
        return w
    return as_float_array(name, w)


# OpenBLAS (0.3.x, SkylakeX kernel) multiplies products of at most 100³ multiply-adds with its small-matrix kernel
# and a single row (numpy's gemv) with its matrix-vector kernel, each summing in another order than its blocked
# kernel; on the blocked kernel a row's sums do not depend on how many rows the product has (checked on this
# machine for 4 … 2,048 rows, 1 and 2 BLAS threads, float32 and float64, C and F weights, d 8 … 3,072)
SMALL_PRODUCT_MACS = 100**3


def merges_rows(n: int, d_in: int, d_out: int) -> bool:
    """Whether a batch's products of n rows each, by a (d_in, d_out) weight, may run as one product of all
    their rows without changing a bit of any row: each batch row's own product already takes BLAS's blocked
    kernel (more than one row, more than SMALL_PRODUCT_MACS multiply-adds), so the merged one takes it too.
    A decode step's batch (n = 1) and small models' products keep one call per batch row, so a token's output
    never depends on the batch it sits in."""
    return n > 1 and n * d_in * d_out > SMALL_PRODUCT_MACS


def linear(x: np.ndarray, w) -> np.ndarray:
    """``x @ w`` (..., n, d_out) for x (..., n, d_in): one 2-D product of all the rows (B·n, d_in) @ (d_in, d_out)
    when w is a 2-D float array, x has batch axes and :func:`merges_rows` allows it; else ``x @ w`` as numpy
    runs it (quantized weights batch their own rows)."""
    if not isinstance(w, np.ndarray) or w.ndim != 2 or x.ndim < 3 or not merges_rows(x.shape[-2], *w.shape):
        return x @ w
    rows = x.reshape(-1, x.shape[-1])                    # (B·n, d_in) a view when x is contiguous
    return (rows @ w).reshape(*x.shape[:-1], w.shape[-1])   # (..., n, d_out)


def gemv_order_rule(tall: bool) -> str:
    """The rule for a streamed weight's layout: "C" for wide and tall weights alike (the form measured faster
    for wide weights on both machines it was measured on; for tall ones the EPYC preferred "F" by 1.2x and the
    Xeon by nothing clear, so the layout weights are drawn in is kept: ``attnlab tune`` finds "F" where it pays)."""
    return "C"


def gemv_order(tall: bool = False) -> str:
    """"C" or "F": the layout of a wide (d_in <= d_out), or with ``tall`` a tall (d_in > d_out), (d_in, d_out)
    float32 W that a decode step streams: the tune profile's when one applies, else :func:`gemv_order_rule`."""
    from . import profile
    tuned = profile.choice("gemv_order")
    kind = "tall" if tall else "wide"
    if tuned is not None and tuned.get(kind) in ("C", "F"):
        return tuned[kind]
    return gemv_order_rule(tall)


def order_for(shape: tuple, dtype) -> str:
    """The layout a float weight of this shape and dtype is kept in: :func:`gemv_order`'s when it is streamed
    (2-D, at least STREAMED_BYTES), else "C"."""
    streams = len(shape) == 2 and int(np.prod(shape)) * np.dtype(dtype).itemsize >= STREAMED_BYTES
    return gemv_order(tall=shape[0] > shape[1]) if streams else "C"


def streamed(w):
    """A 2-D float weight (d_in, d_out) in the layout :func:`order_for` picks (a copy when it is not in it
    already), or ``w`` as it is: small, another shape, or quantized."""
    if not isinstance(w, np.ndarray) or w.ndim != 2 or w.nbytes < STREAMED_BYTES:
        return w
    order = order_for(w.shape, w.dtype)
    flag = "C_CONTIGUOUS" if order == "C" else "F_CONTIGUOUS"
    return w if w.flags[flag] else np.asarray(w, order=order)        # (d_in, d_out)


def fuse_columns(*ws):
    """``(fused, parts)``: weights ``ws`` (each (..., w_i), the same leading shape) side by side as one weight
    (..., Σ w_i), and the parts to keep in their place. Float arrays of one dtype: one new array, laid out as
    :func:`streamed` would, the parts views of its columns. Quantized weights: their type's ``fuse_columns``
    (a copy of their blocks), the parts as they are. ``(None, ws)`` when they differ in type, dtype or leading
    shape, or the type has no fusion."""
    if all(isinstance(w, np.ndarray) for w in ws):
        if ws[0].ndim == 0 or len({(w.dtype, w.shape[:-1]) for w in ws}) != 1:
            return None, ws
        shape = (*ws[0].shape[:-1], sum(w.shape[-1] for w in ws))
        whole = fused_already(ws, shape)
        if whole is not None:                            # views of one fused array in its layout: kept, no copy
            return whole, ws
        fused = np.empty(shape, ws[0].dtype, order=order_for(shape, ws[0].dtype))   # (..., Σ w_i)
        edges = np.cumsum([0] + [w.shape[-1] for w in ws])
        parts = tuple(fused[..., a:b] for a, b in zip(edges[:-1], edges[1:]))   # (..., w_i) views
        for part, w in zip(parts, ws):
            part[...] = w
        return fused, parts
    fuse = getattr(type(ws[0]), "fuse_columns", None)
    if fuse is None or not all(type(w) is type(ws[0]) for w in ws):
        return None, ws
    return fuse(ws), ws


def fused_already(ws, shape: tuple):
    """The array ``ws`` (float arrays (..., w_i)) are consecutive column views of, when it has ``shape``
    (..., Σ w_i) and the layout :func:`fuse_columns` would give a new one; else None. A model built again from
    its own fused weights (:mod:`attnlab.models.weight_cache`'s copy, mapped from disk) keeps them as they are."""
    base = ws[0].base
    if not isinstance(base, np.ndarray) or base.shape != shape or base.dtype != ws[0].dtype:
        return None
    flag = "C_CONTIGUOUS" if order_for(shape, base.dtype) == "C" else "F_CONTIGUOUS"
    if not base.flags[flag] or any(w.base is not base or w.strides != base.strides for w in ws):
        return None
    start = base.__array_interface__["data"][0]
    edge = 0
    for w in ws:
        if w.__array_interface__["data"][0] != start + edge * base.strides[-1]:
            return None
        edge += w.shape[-1]
    return base
