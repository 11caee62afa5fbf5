"""Choosing the next token from a model's logits: the most likely one, or a draw at a temperature, optionally
from the top-k tokens or the top-p nucleus only, always from an explicit ``rng``.

The one :func:`attnlab.stack.transformer.generate` uses it for every decoder (GPT-2, attnlab's own LM).
"""

from __future__ import annotations

import numbers

import numpy as np

from ..kernels.softmax import softmax


def check_temperature(temperature) -> float:
    """``temperature`` as a float >= 0 (0 = always the most likely token); NaN, ±inf and bools refused."""
    if isinstance(temperature, (bool, np.bool_)) or not isinstance(temperature, numbers.Real) \
            or not (np.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a number >= 0 (finite; 0 = greedy), got {temperature!r}")
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


def next_token_probabilities(logits, temperature: float, top_k: int | None = None,
                             top_p: float | None = None) -> np.ndarray:
    """The distribution (vocab,) a draw comes from: softmax(logits / temperature), cut to the ``top_k`` most
    likely tokens, then to the fewest most likely whose probabilities reach ``top_p`` (nucleus sampling,
    Holtzman et al., 2020), renormalised; the order of the cuts is transformers'. float64, sums to 1.

    >>> next_token_probabilities(np.log([0.5, 0.3, 0.2]), 1.0, top_p=0.7).round(3)
    array([0.625, 0.375, 0.   ])
    """
    z = np.asarray(logits, np.float64) / temperature                   # (vocab,)
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
    temperature = check_temperature(temperature)
    if temperature == 0:
        return int(np.argmax(logits))
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator when temperature > 0, got {type(rng).__name__}")
    top_k, top_p = check_top(top_k, top_p, np.shape(logits)[-1])
    p = next_token_probabilities(logits, temperature, top_k, top_p)   # (vocab,) float64, so it sums to 1
    return int(rng.choice(p.size, p=p))
