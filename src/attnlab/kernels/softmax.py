"""The softmax: scores to weights that are positive and sum to 1 along an axis."""

from __future__ import annotations

import numpy as np

from ._checks import as_float_array


def softmax(x, axis: int = -1) -> np.ndarray:
    """Stable softmax along ``axis``: ``exp(x - max) / sum(exp(x - max))``.

    Parameters
    ----------
    x : float array
        Scores. ``-inf`` means "no weight here". float16 is computed in float32 and returned as float16.
    axis : int
        The axis that sums to 1.

    Returns
    -------
    Weights of the same shape and dtype as ``x``. A slice that is all ``-inf`` gives all zeros, never NaN.

    Examples
    --------
    >>> softmax(np.array([0.0, 2.0, 1.0])).round(3)
    array([0.09 , 0.665, 0.245])
    >>> softmax(np.array([-np.inf, -np.inf]))
    array([0., 0.])
    """
    x = as_float_array("x", x)
    z = x.astype(np.result_type(x, np.float32), copy=False)   # (...) at least float32
    m = np.max(z, axis=axis, keepdims=True) if z.size else z  # (..., 1, ...) row maxima
    m = np.where(np.isneginf(m), 0, m)                       # all -inf rows: subtract 0, exp gives 0s
    e = z - m                                                # (...) a new array: the steps below work in it
    np.exp(e, out=e)                                         # (...) in (0, 1], 0 where x was -inf
    total = e.sum(axis=axis, keepdims=True)                  # (..., 1, ...) >= 1 unless the row was empty
    e /= np.where(total == 0, 1, total)                      # (...) empty rows stay 0
    return e.astype(x.dtype, copy=False)
