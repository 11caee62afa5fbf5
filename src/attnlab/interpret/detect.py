"""Head detectors: how much of a head's attention falls where a known pattern says it should.

The definitions are TransformerLens's ``detect_head`` with ``error_measure="mul"``. For a head's weights A
(n_q, n_k) and a 0/1 detection pattern P of the same shape::

    score = Σ_ij A_ij · P_ij / Σ_ij A_ij

summed over every query: the share of the head's weight that lands on the pattern's cells. The patterns
(each built from the token ids alone):

- previous token: P[i, i − 1] = 1, each query's key one position back;
- duplicate token: P[i, j] = 1 where j < i and ids[j] = ids[i], earlier positions holding the same token;
- induction: P[i, j] = 1 where j ≤ i and ids[j − 1] = ids[i] with j − 1 < i, the position right after an
  earlier occurrence of the current token (Olsson et al., 2022).

A bidirectional model (BERT) is scored with the same patterns on its full grid: weight on later keys counts
in the denominator, never in the numerator. ``exclude_bos`` zeroes the first key's column and
``exclude_current_token`` the diagonal before scoring, as TransformerLens does.
"""

from __future__ import annotations

import numpy as np

from ..kernels._checks import as_nonnegative_int, as_positive_int, check_flag, check_rng
from ..stack.batch import is_ragged
from ..stack.hooks import run_with_cache
from ..stack.transformer import Transformer, check_ids

KINDS = ("previous_token", "duplicate_token", "induction")


def check_kinds(kinds) -> tuple[str, ...]:
    """``"all"``, one kind or a list of kinds, as a tuple of names from :data:`KINDS`."""
    if kinds == "all":
        return KINDS
    try:
        names = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    except TypeError:
        raise TypeError(f"kind must be a name, a list of names or 'all', got {type(kinds).__name__} "
                        f"{kinds!r}") from None
    bad = [k for k in names if k not in KINDS]
    if bad or not names:
        raise ValueError(f"kind must be one of {list(KINDS)} or 'all', got {bad[0] if bad else kinds!r}")
    return names


def _pattern_ids(ids) -> np.ndarray:
    ids = np.asarray(ids)                                               # (n,)
    if ids.ndim != 1:
        raise ValueError(f"ids must be 1-D (n,), got shape {ids.shape}")
    return ids


def previous_token_pattern(ids: np.ndarray) -> np.ndarray:
    """P (n, n): 1 at (i, i − 1).

    >>> previous_token_pattern(np.array([5, 6, 7])).astype(int).tolist()
    [[0, 0, 0], [1, 0, 0], [0, 1, 0]]
    """
    return np.eye(len(_pattern_ids(ids)), k=-1, dtype=bool)            # (n, n)


def duplicate_token_pattern(ids: np.ndarray) -> np.ndarray:
    """P (n, n): 1 at (i, j) for j < i holding the same id as i.

    >>> duplicate_token_pattern(np.array([1, 2, 1, 1])).astype(int).tolist()
    [[0, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0], [1, 0, 1, 0]]
    """
    ids = _pattern_ids(ids)                                             # (n,)
    same = ids[:, None] == ids[None, :]                                 # (n, n)
    return np.tril(same, k=-1)                                          # (n, n) keys before the query


def induction_pattern(ids: np.ndarray) -> np.ndarray:
    """P (n, n): 1 at (i, j) where the token before j is an earlier occurrence of token i.

    >>> induction_pattern(np.array([1, 2, 1, 2])).astype(int).tolist()     # A B A B: the 2nd A looks at B, the 2nd B at A
    [[0, 0, 0, 0], [0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]
    """
    dup = duplicate_token_pattern(ids)                                  # (n, n) j < i, same token
    out = np.zeros_like(dup)                                            # (n, n)
    out[:, 1:] = dup[:, :-1]                                            # (n, n) one key to the right
    return np.tril(out)                                                 # (n, n) keys up to the query


PATTERNS = {"previous_token": previous_token_pattern, "duplicate_token": duplicate_token_pattern,
            "induction": induction_pattern}


def pattern_scores(weights: np.ndarray, pattern: np.ndarray, *, exclude_bos: bool = False,
                   exclude_current_token: bool = False) -> np.ndarray:
    """Σ A·P / Σ A of every head: ``weights`` (..., n_q, n_k), ``pattern`` (n_q, n_k) -> (...).

    A head whose (excluded) weights sum to 0 scores 0.

    >>> a = np.array([[1., 0.], [0.25, 0.75]])          # query 1 gives 0.25 to the token before it
    >>> float(pattern_scores(a, previous_token_pattern(np.array([3, 4]))))   # 0.25 of a total of 2
    0.125
    """
    a = np.asarray(weights, dtype=np.float64)                           # (..., n_q, n_k)
    pattern = np.asarray(pattern)                                       # (n_q, n_k)
    if a.ndim < 2 or a.shape[-2:] != pattern.shape:
        raise ValueError(f"weights must be (..., n_q, n_k) with n_q, n_k = {pattern.shape}, got {a.shape}")
    keep = np.ones(pattern.shape, bool)                                 # (n_q, n_k)
    if exclude_bos:
        keep[:, 0] = False
    if exclude_current_token:
        np.fill_diagonal(keep, False)
    a = a * keep                                                        # (..., n_q, n_k)
    total = a.sum((-2, -1))                                             # (...)
    hit = (a * pattern).sum((-2, -1))                                   # (...)
    return np.divide(hit, total, out=np.zeros_like(hit), where=total > 0)


def score_patterns(weights: np.ndarray, ids, kinds="all", *, exclude_bos: bool = False,
                   exclude_current_token: bool = False) -> dict[str, np.ndarray]:
    """Every head's score for each detector: ``weights`` (n_layers, n_heads, n, n) of the tokens ``ids`` (n,)
    -> {kind: (n_layers, n_heads)}.

    Raises
    ------
    ValueError
        An unknown kind, fewer than two tokens (no earlier token to score), weights of another length.
    """
    kinds = check_kinds(kinds)
    ids = np.asarray(ids)                                               # (n,)
    if ids.ndim != 1 or ids.size < 2:
        raise ValueError(f"ids must be 1-D with at least 2 tokens (the first has no earlier token to score), "
                         f"got shape {ids.shape}")
    flags = dict(exclude_bos=check_flag("exclude_bos", exclude_bos),
                 exclude_current_token=check_flag("exclude_current_token", exclude_current_token))
    return {k: pattern_scores(weights, PATTERNS[k](ids), **flags) for k in kinds}


def model_patterns(model: Transformer, ids, *, token_types=None) -> np.ndarray:
    """Every layer's attention weights on ``ids`` (n,) or a batch (B, n), through the stack's ``hook_pattern``
    activations, in one pass: (n_layers, n_heads, n, n), or (n_layers, B, n_heads, n, n) for a batch."""
    ids = check_ids(model, ids)
    if ids.ndim > 2:
        raise ValueError(f"ids must be (n,) or (B, n), got shape {ids.shape}")
    names = [f"blocks.{i}.attn.hook_pattern" for i in range(model.config.n_layers)]
    _, cache = run_with_cache(model, ids, names, token_types=token_types)
    return np.stack([cache[n] for n in names])                          # (n_layers, [B,] n_heads, n, n)


def detect_heads(model: Transformer, ids, kinds="all", *, exclude_bos: bool = False,
                 exclude_current_token: bool = False) -> dict[str, np.ndarray]:
    """Run ``model`` on token ids (n,) or a batch (B, n) and score every head with each detector.

    Parameters
    ----------
    model : Transformer
        Any model attnlab runs: MiniLM and other BERTs (scored on the full grid), GPT-2, attnlab's own LMs.
    ids : int array (n,) or (B, n), or a list of prompts of different lengths
        With a batch, the scores are the mean of each row's scores (as TransformerLens averages a batch); a
        list runs as one padded pass, each prompt scored on its own tokens only.
    kinds : "all", a kind of :data:`KINDS`, or a list of them

    Returns
    -------
    dict kind -> (n_layers, n_heads) float64 scores in [0, 1].

    Raises
    ------
    ValueError, TypeError
        An unknown kind, a text of one token, ids outside the vocabulary or past the model's positions.

    Examples
    --------
    ``detect_heads(model, tokenizer.encode("The cat sat on the mat"), "previous_token")``
    """
    kinds = check_kinds(kinds)
    if is_ragged(ids):
        rows, weights = padded_patterns(model, ids)                     # one pass over the padded batch
    else:
        ids = check_ids(model, ids)
        rows = ids.reshape(-1, ids.shape[-1])                           # (B, n)
        grids = model_patterns(model, rows)                             # (n_layers, B, n_heads, n, n), one pass
        weights = [grids[:, b] for b in range(len(rows))]
    scores = [score_patterns(w, row, kinds, exclude_bos=exclude_bos, exclude_current_token=exclude_current_token)
              for w, row in zip(weights, rows)]
    return {k: np.mean([s[k] for s in scores], axis=0) for k in kinds}


def padded_patterns(model: Transformer, prompts) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Prompts of different lengths in one padded pass: each prompt's ids (n_b,) and its own weights
    (n_layers, n_heads, n_b, n_b), the padded queries and keys cut away."""
    names = [f"blocks.{i}.attn.hook_pattern" for i in range(model.config.n_layers)]
    out, cache = run_with_cache(model, prompts, names)
    b = out.batch
    rows = [b.own(b.ids[i], i, axis=-1) for i in range(len(b.lengths))]
    weights = [np.stack([b.own(b.own(cache[n][i], i, axis=-1), i, axis=-2) for n in names])
               for i in range(len(b.lengths))]                          # (n_layers, n_heads, n_b, n_b) each
    return rows, weights


def repeated_random_tokens(n: int, *, vocab_size: int, rng: np.random.Generator, avoid=()) -> np.ndarray:
    """The standard induction test: ``n`` random token ids, then the same ``n`` again: (2n,).

    ``avoid`` lists ids never drawn (a tokenizer's special tokens).

    >>> repeated_random_tokens(3, vocab_size=10, rng=np.random.default_rng(0)).tolist()
    [8, 6, 5, 8, 6, 5]
    """
    rng = check_rng(rng)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    vocab_size = as_positive_int("vocab_size", vocab_size)
    allowed = np.setdiff1d(np.arange(vocab_size), np.asarray(avoid, np.int64))   # (V',)
    if allowed.size == 0:
        raise ValueError("no token id is left to draw once the special tokens are avoided")
    r = allowed[rng.integers(0, allowed.size, n)]                       # (n,)
    return np.concatenate([r, r])                                       # (2n,)


def top_heads(scores: np.ndarray, k: int = 3) -> list[tuple[int, int, float]]:
    """The ``k`` highest of (n_layers, n_heads) scores as (layer, head, score), best first."""
    scores = np.asarray(scores)                                         # (n_layers, n_heads)
    if scores.ndim != 2:
        raise ValueError(f"scores must be (n_layers, n_heads), got shape {scores.shape}")
    k = as_nonnegative_int("k", k)
    flat = np.argsort(-scores, axis=None, kind="stable")[:k]            # (k,) flat indices, best first
    return [(int(i), int(j), float(scores[i, j])) for i, j in zip(*np.unravel_index(flat, scores.shape))]
