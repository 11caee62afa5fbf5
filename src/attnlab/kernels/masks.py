"""Masks: which keys each query may attend to. Boolean, True = may attend."""

from __future__ import annotations

import numpy as np

from ._checks import as_bool_array, as_int, as_positive_int


def causal_mask(n_q: int, n_k: int | None = None, *, window: int | None = None,
                q_offset: int | None = None) -> np.ndarray:
    """The causal mask as a bool array of shape ``(n_q, n_k)``; True = the query may see that key.

    When ``n_k > n_q`` the queries are the *last* ``n_q`` positions (bottom-right alignment, as a
    KV cache needs): query ``i`` sits at absolute position ``i + n_k - n_q`` and sees keys up to it.
    ``window=w`` keeps only the last ``w`` keys up to and including each query (sliding window).
    ``q_offset`` moves the queries: query ``i`` sits at key index ``i + q_offset`` (default ``n_k - n_q``),
    so it sees key ``j`` when ``j <= i + q_offset`` and ``j > i + q_offset - window``.

    Examples
    --------
    >>> causal_mask(3).astype(int)
    array([[1, 0, 0],
           [1, 1, 0],
           [1, 1, 1]])
    >>> causal_mask(1, 4).astype(int)
    array([[1, 1, 1, 1]])
    >>> causal_mask(4, window=2).astype(int)[-1]
    array([0, 0, 1, 1])
    >>> causal_mask(2, 4, q_offset=0).astype(int)
    array([[1, 0, 0, 0],
           [1, 1, 0, 0]])
    """
    n_q = as_positive_int("n_q", n_q)
    n_k = n_q if n_k is None else as_positive_int("n_k", n_k)
    window = as_positive_int("window", window, allow_none=True)
    q_offset = n_k - n_q if q_offset is None else as_int("q_offset", q_offset)
    pos_q = np.arange(n_q)[:, None] + q_offset      # (n_q, 1) absolute position of each query
    pos_k = np.arange(n_k)[None, :]                 # (1, n_k)
    keep = pos_k <= pos_q                           # (n_q, n_k) no peeking ahead
    if window is not None:
        keep &= pos_k > pos_q - window              # (n_q, n_k) only the last `window` keys
    return keep


def additive_mask(mask) -> np.ndarray:
    """The guide's M: 0 where a bool mask keeps a score, ``-inf`` where it drops one.

    >>> additive_mask(causal_mask(2))
    array([[  0., -inf],
           [  0.,   0.]])
    """
    keep = as_bool_array("mask", mask)
    return np.where(keep, 0.0, -np.inf)             # same shape as mask
