"""Argument checks shared by the public entry points.

Every check raises ``TypeError`` (wrong kind of thing) or ``ValueError`` (right kind, bad value),
and every message names the argument, what was expected, and what arrived.
"""

from __future__ import annotations

import numbers

import numpy as np

FLOAT_DTYPES = (np.float16, np.float32, np.float64)


def as_float_array(name: str, x, *, min_ndim: int = 0, finite: bool = False) -> np.ndarray:
    """``x`` as a float16/32/64 array of at least ``min_ndim`` axes; ints, bools, complex, objects refused."""
    if isinstance(x, (str, bytes)) or x is None:
        raise TypeError(f"{name} must be a float array, got {type(x).__name__}")
    arr = np.asarray(x)
    if arr.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be a float array (float16, float32 or float64), got dtype {arr.dtype}")
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} axes, got shape {arr.shape}")
    if finite:
        check_finite(name, arr)
    return arr


def check_finite(name: str, arr: np.ndarray) -> None:
    """Refuse NaN and ±inf, saying where the first one is."""
    with np.errstate(over="ignore", invalid="ignore"):
        total = arr.sum()               # one pass, no mask: any NaN or inf makes the sum non-finite
    if np.isfinite(total):
        return                          # (a sum that merely overflowed falls through to the exact check)
    bad = ~np.isfinite(arr)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{name} must be finite, got {arr[where]} at index {where} "
            f"({int(bad.sum())} non-finite values); pass check_finite=False to let them propagate")


def check_flag(name: str, v) -> bool:
    """A True/False option; 1, "yes" or None are refused rather than read as truthy."""
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {type(v).__name__} {v!r}")
    return bool(v)


def as_bool_array(name: str, x) -> np.ndarray:
    arr = np.asarray(x)
    if arr.dtype != np.bool_:
        raise TypeError(f"{name} must be a bool array (True = may attend), got dtype {arr.dtype}")
    return arr


def as_positive_int(name: str, v, *, allow_none: bool = False) -> int | None:
    if v is None and allow_none:
        return None
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer, got {type(v).__name__} {v!r}")
    if v < 1:
        raise ValueError(f"{name} must be a positive integer, got {v}")
    return int(v)


def as_positive_float(name: str, v) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a positive number, got {type(v).__name__} {v!r}")
    if not (np.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a positive finite number, got {v}")
    return float(v)


def as_finite_float(name: str, v) -> float:
    """``v`` as a float that is neither NaN nor ±inf; bools and non-numbers refused."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
        raise TypeError(f"{name} must be a finite number, got {type(v).__name__} {v!r}")
    if not np.isfinite(v):
        raise ValueError(f"{name} must be a finite number, got {v}")
    return float(v)


def broadcast_to(name: str, arr: np.ndarray, shape: tuple, what: str) -> np.ndarray:
    """``arr`` broadcast to ``shape``, or an error naming both shapes."""
    try:
        return np.broadcast_to(arr, shape)
    except ValueError:
        raise ValueError(f"{name} has shape {arr.shape}, which does not broadcast to {what} {shape}") from None


def compute_dtype(*arrays: np.ndarray) -> np.dtype:
    """The dtype the math runs in: the arrays' common float type, at least float32."""
    return np.result_type(np.float32, *arrays)


def as_nonnegative_int(name: str, v) -> int:
    """``v`` as an int >= 0; bools and floats refused."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an integer >= 0, got {type(v).__name__} {v!r}")
    if v < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {v}")
    return int(v)


def as_int(name: str, v) -> int:
    """``v`` as an int of any sign; bools and floats refused."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(v).__name__} {v!r}")
    return int(v)


def as_choice(name: str, v, choices: tuple[str, ...]) -> str:
    """``v`` as one of ``choices``."""
    if v not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {v!r}")
    return v


def check_rng(rng) -> np.random.Generator:
    """Randomness comes only from an explicit ``numpy.random.Generator``."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    return rng


def as_token_ids(name: str, ids, vocab_size: int) -> np.ndarray:
    """``ids`` as an int64 array of token ids (..., n), n >= 1, each in 0 … vocab_size − 1.

    Text, floats and bools are refused with TypeError; an empty array or an id out of range with ValueError.
    """
    if isinstance(ids, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of integer token ids, got {type(ids).__name__}; "
                        "tokenize text first")
    arr = np.asarray(ids)
    if arr.ndim == 0 or arr.shape[-1] == 0:
        raise ValueError(f"{name} must hold at least one token id, got shape {arr.shape}")
    if arr.dtype.kind not in "iu" and not (arr.dtype == object and all(
            isinstance(i, numbers.Integral) and not isinstance(i, bool) for i in arr.ravel().tolist())):
        raise TypeError(f"{name} must hold integer token ids, got dtype {arr.dtype}")
    bad = (arr < 0) | (arr >= vocab_size)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name} must be in [0, {vocab_size}) (the model's vocab_size), got {arr[where]} at index "
                         f"{where[0] if len(where) == 1 else where}")
    return arr.astype(np.int64, copy=False)
