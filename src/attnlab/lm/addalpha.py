"""Count-based next-token predictors with add-α smoothing: the baseline the model must beat off its training text.

A floor (:mod:`attnlab.text.ngrams`) knows the counts of the very text it is scored on. A predictor has
to be fitted on one text and scored on another; unseen (context, next) pairs must not get probability 0.
Add-α smoothing (Lidstone's law) adds α to every count:

    p(x | c) = (n(c, x) + α) / (n(c) + α · V)

with n counted on the training ids and V the vocabulary size. A context never seen in training gives
the uniform 1/V. Scored, like the floors, on positions max(k, 1) … L − 1.
"""

from __future__ import annotations

import numpy as np

from ..kernels._checks import as_nonnegative_int, as_positive_float, as_positive_int


def context_keys(ids: np.ndarray, k: int, base: int) -> np.ndarray:
    """One int64 key per position i ≥ k for the k ids before it: Σ_j ids[i−k+j] · base^(k−1−j).

    >>> context_keys(np.array([1, 2, 0, 1]), 2, 3).tolist()    # (1,2) (2,0) -> 1·3+2, 2·3+0
    [5, 6]
    """
    if base ** (k + 1) >= 2 ** 63:
        raise ValueError(f"k = {k} contexts of a {base}-token vocabulary do not fit an int64 key")
    key = np.zeros(len(ids) - k, np.int64)                         # (L − k,)
    for j in range(k):
        key = key * base + ids[j:len(ids) - k + j]                 # (L − k,) one more token of context
    return key


def add_alpha_loss(train_ids, eval_ids, k: int, *, vocab_size: int, alpha: float = 1.0) -> float:
    """Cross-entropy (nats per token) on ``eval_ids`` of the add-α predictor with k tokens of context
    fitted on ``train_ids``.

    >>> ids = np.array([0, 1, 0, 1, 0, 1])
    >>> round(add_alpha_loss(ids, ids, 1, vocab_size=2, alpha=1.0), 4)    # p = (3+1)/(3+2) three times, (2+1)/(2+2) twice
    0.249
    """
    k = as_nonnegative_int("k", k)
    vocab_size = as_positive_int("vocab_size", vocab_size)
    alpha = as_positive_float("alpha", alpha)
    train, test = (np.asarray(a) for a in (train_ids, eval_ids))
    for name, a in (("train_ids", train), ("eval_ids", test)):
        if a.ndim != 1 or a.dtype.kind not in "iu":
            raise TypeError(f"{name} must be a 1-D integer array of token ids, got {a.dtype} {a.shape}")
        if a.size <= max(k, 1):
            raise ValueError(f"{name} has {a.size} tokens; k = {k} needs more than {max(k, 1)} to score one")
    start = max(k, 1)
    pair_train = context_keys(train, k, vocab_size)[start - k:] * vocab_size + train[start:]   # (N,)
    ctx_seen, n_ctx = np.unique(pair_train // vocab_size, return_counts=True)   # (C,), (C,)
    pair_seen, n_pair = np.unique(pair_train, return_counts=True)               # (P,), (P,)
    ctx_test = context_keys(test, k, vocab_size)[start - k:]       # (M,) context of each scored i
    pair_test = ctx_test * vocab_size + test[start:]                           # (M,)
    count_c = _lookup(ctx_seen, n_ctx, ctx_test)                                # (M,) n(c), 0 if unseen
    count_cx = _lookup(pair_seen, n_pair, pair_test)                            # (M,) n(c, x)
    p = (count_cx + alpha) / (count_c + alpha * vocab_size)                     # (M,)
    return float(-np.log(p).mean())


def _lookup(sorted_keys: np.ndarray, counts: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """The count of each query key in (sorted_keys, counts), 0 where absent."""
    at = np.minimum(np.searchsorted(sorted_keys, queries), len(sorted_keys) - 1)   # (M,)
    return np.where(sorted_keys[at] == queries, counts[at], 0).astype(np.float64)  # (M,)
