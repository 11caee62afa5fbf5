"""Choosing the next token from a model's logits: the most likely one, or a draw at a temperature, optionally
from the top-k tokens or the top-p nucleus only, always from an explicit ``rng``.

The one :func:`attnlab.stack.transformer.generate` uses it for every decoder (GPT-2, attnlab's own LM).
"""

from __future__ import annotations

import numbers

import numpy as np

from ..kernels.softmax import softmax


SMALLEST_TEMPERATURE = float(np.finfo(np.float64).tiny)   # below it 1 / T overflows float64 (subnormals)


def check_temperature(temperature) -> float:
    """``temperature`` as a float: 0 (always the most likely token) or at least the smallest normal float64
    (2.2e-308; below it, dividing by it overflows); NaN, ±inf, negatives, bools and non-numbers refused."""
    if isinstance(temperature, (bool, np.bool_)) or not isinstance(temperature, numbers.Real) \
            or not (np.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a number >= 0 (finite; 0 = greedy), got {temperature!r}")
    if 0 < temperature < SMALLEST_TEMPERATURE:
        raise ValueError(f"temperature {temperature!r} is too small to divide by (below {SMALLEST_TEMPERATURE:.3g}, "
                         "the smallest normal float64); give 0 for greedy")
    return float(temperature)


def check_top(top_k, top_p, vocab_size: int) -> tuple[int | None, float | None]:
    """``top_k`` (None or an int in 1 … vocab_size) and ``top_p`` (None or a number in (0, 1])."""
    if top_k is not None and (isinstance(top_k, (bool, np.bool_)) or not isinstance(top_k, numbers.Integral)
                              or not 1 <= top_k <= vocab_size):
        raise ValueError(f"top_k must be None or an integer from 1 to the vocabulary size {vocab_size}, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, (bool, np.bool_)) or not isinstance(top_p, numbers.Real)
                              or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")
    return (None if top_k is None else int(top_k)), (None if top_p is None else float(top_p))


def check_logits(logits) -> np.ndarray:
    """One row of logits (vocab,) as float64: real numbers, at least one, none NaN or +inf, not all −inf
    (−inf is a token that may never be drawn)."""
    if isinstance(logits, (str, bytes)) or logits is None:
        raise TypeError(f"logits must be a 1-D array of numbers, got {type(logits).__name__}")
    z = np.asarray(logits)
    if z.dtype.kind not in "fiu" or z.dtype == np.bool_:
        raise TypeError(f"logits must be a 1-D array of real numbers, got dtype {z.dtype}")
    if z.ndim != 1 or z.size == 0:
        raise ValueError(f"logits must be one row (vocab,) of at least one token, got shape {z.shape}")
    z = z.astype(np.float64, copy=False)                               # (vocab,)
    top = z.max()                                                      # NaN propagates
    if np.isnan(top) or top == np.inf or top == -np.inf:
        bad = np.flatnonzero(np.isnan(z) | (z == np.inf))
        what = f"{z[bad[0]]} at index {int(bad[0])}" if bad.size else "-inf everywhere (no token may be drawn)"
        raise ValueError(f"logits must be finite or -inf, with at least one finite; got {what}")
    return z


def check_sampling(logits, temperature, top_k=None, top_p=None) -> tuple[np.ndarray, float, int | None, float | None]:
    """Every argument of a draw, checked at once (the one check :func:`next_token_probabilities`,
    :func:`sample_next` and :func:`attnlab.stack.transformer.generate` share): ``(logits (vocab,) float64,
    temperature, top_k, top_p)``. The cuts are checked at temperature 0 too, where they change nothing."""
    z = check_logits(logits)                                           # (vocab,)
    return (z, check_temperature(temperature), *check_top(top_k, top_p, z.size))


def next_token_probabilities(logits, temperature: float, top_k: int | None = None,
                             top_p: float | None = None) -> np.ndarray:
    """The distribution (vocab,) a draw comes from: softmax(logits / temperature), cut to the ``top_k`` most
    likely tokens, then to the fewest most likely whose probabilities reach ``top_p`` (nucleus sampling,
    Holtzman et al., 2020), renormalised; the order of the cuts is transformers'. float64, sums to 1.

    >>> next_token_probabilities(np.log([0.5, 0.3, 0.2]), 1.0, top_p=0.7).round(3)
    array([0.625, 0.375, 0.   ])
    """
    z, temperature, top_k, top_p = check_sampling(logits, temperature, top_k, top_p)   # (vocab,)
    if temperature == 0:                                               # the limit: the first most likely token
        return np.eye(1, z.size, int(np.argmax(z)))[0]                # (vocab,)
    with np.errstate(over="ignore"):                                   # a gap / T past float64 is -inf: p = 0
        z = (z - z.max()) / temperature                                # (vocab,) <= 0, the top token at 0
    if top_k is not None and top_k < z.size:
        kth = np.partition(z, z.size - top_k)[z.size - top_k]          # the k-th largest
        z = np.where(z >= kth, z, -np.inf)                             # (vocab,) ties at the k-th all kept
    p = softmax(z)                                                     # (vocab,)
    if top_p is not None and top_p < 1:
        order = np.argsort(-p, kind="stable")                          # (vocab,) most likely first
        before = np.cumsum(p[order]) - p[order]                        # (vocab,) mass of the tokens ahead
        keep = np.zeros(p.size, bool)
        keep[order[before < top_p]] = True                             # the first token is always kept
        p = np.where(keep, p, 0.0)
        p = p / p.sum()                                                # (vocab,)
    return p


def sample_next(logits, temperature: float = 0.0, rng: np.random.Generator | None = None, *,
                top_k: int | None = None, top_p: float | None = None) -> int:
    """The next token from one row of logits (vocab,): the argmax, or a draw from softmax(logits / temperature)
    cut to ``top_k`` and ``top_p`` (:func:`next_token_probabilities`).

    >>> sample_next(np.array([0.1, 2.0, -1.0]))
    1
    """
    z, temperature, top_k, top_p = check_sampling(logits, temperature, top_k, top_p)   # (vocab,)
    if temperature == 0:
        return int(np.argmax(z))
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator when temperature > 0, got {type(rng).__name__}")
    p = next_token_probabilities(z, temperature, top_k, top_p)         # (vocab,) float64, so it sums to 1
    return int(rng.choice(p.size, p=p))
