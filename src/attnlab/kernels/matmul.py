"""Weights side by side: projections that read the same input, multiplied as one matrix.

A decode step multiplies one token's vector by every weight of the model, so it streams the weights once
per token, and each product pays a fixed cost (numpy's dispatch, BLAS or numba waking its threads). Quantized
weights (:class:`attnlab.kernels.quantized.QuantizedMatrix`) of W_Q, W_K and W_V, and of the gated MLP's
W_gate and W_in, are therefore stacked into one weight each: one product instead of three, or two.

float32 arrays are not fused. Fused, they would be column views of one array, and a view is not
C-contiguous: ``safetensors.numpy.save_file(model.params())`` writes an array's buffer as it lies in memory
and would silently write the wrong numbers. (Measured on a 2-core EPYC with OpenBLAS: 30 layers of seven
separate float32 products ran at 18 GB/s, the same bytes in four products at 21 GB/s; not worth that risk.)
"""

from __future__ import annotations

from ._checks import as_float_array


def as_weight(name: str, w):
    """A weight as a float array, or a quantized weight (:mod:`attnlab.kernels.quantized`) as it is: anything
    with ``__array_ufunc__ = None`` and a ``shape`` (numpy then hands ``x @ w`` to ``w.__rmatmul__``)."""
    if getattr(type(w), "__array_ufunc__", False) is None and hasattr(w, "shape"):
        return w
    return as_float_array(name, w)


def fuse_columns(*ws):
    """``(fused, ws)``: weights ``ws`` (each (d, w_i)) side by side as one weight (d, Σ w_i) by their type's
    ``fuse_columns`` (a copy of their blocks), or None when they have none (float arrays) or differ in type."""
    fuse = getattr(type(ws[0]), "fuse_columns", None)
    if fuse is None or not all(type(w) is type(ws[0]) for w in ws):
        return None, ws
    return fuse(ws), ws
