"""Choosing the next token from a model's logits: the most likely one, or a draw at a temperature.

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


def sample_next(logits, temperature: float = 0.0, rng: np.random.Generator | None = None) -> int:
    """The next token from one row of logits (vocab,): the argmax, or a draw from softmax(logits / temperature).

    >>> sample_next(np.array([0.1, 2.0, -1.0]))
    1
    """
    temperature = check_temperature(temperature)
    if temperature == 0:
        return int(np.argmax(logits))
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator when temperature > 0, got {type(rng).__name__}")
    p = softmax(np.asarray(logits, np.float64) / temperature)   # (vocab,) float64, so it sums to 1 for choice
    return int(rng.choice(p.size, p=p))
