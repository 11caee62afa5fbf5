"""N-gram floors: the lowest cross-entropy any predictor can reach from k tokens of context.

The guide's first table. For each context length k, count what follows every distinct context and
score the best possible predictor, the one that knows those counts exactly:

    floor_k = -(1/N) Σ_{c,x} n(c, x) · log(n(c, x) / n(c))
            =  (1/N) [Σ_c n(c) log n(c) − Σ_{c,x} n(c, x) log n(c, x)]

over the N predictions at positions max(k, 1) … L−1 (k = 0 is scored on the same positions as k = 1).

Counting is numpy only: the text becomes integer codes, every position's context becomes one packed
int64 key (``key_{k+1} = key_k << bits | code``), and one sort per k groups equal keys. When the packed
key would overflow 63 bits the contexts are renumbered densely first (``np.unique``), so any vocabulary
and any k work. A 10 MB text at k ≤ 8 takes seconds (benchmarks/bench_floors.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..kernels._checks import as_choice, as_nonnegative_int

LEVELS = ("char", "word")
UNICODE_SIZE = 0x110000      # code points run from 0 to 0x10FFFF


@dataclass(frozen=True)
class Floor:
    """One row of the guide's table."""
    k: int                   # tokens of context
    floor: float             # lowest possible cross-entropy, in nats per prediction
    n_contexts: int          # distinct contexts seen
    n_predictions: int       # positions scored


def encode(text: str, level: str = "char") -> tuple[np.ndarray, tuple[str, ...]]:
    """``text`` as integer codes ``(L,)`` 0 … V−1 and the V symbols they stand for, in sorted order.

    ``level="char"`` splits into characters (Unicode code points), ``"word"`` on whitespace.

    >>> codes, symbols = encode("abba")
    >>> codes.tolist(), symbols
    ([0, 1, 1, 0], ('a', 'b'))
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    as_choice("level", level, LEVELS)
    if level == "word":
        return _encode_words(text.split())
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)   # (L,) code points
    present = np.zeros(UNICODE_SIZE, dtype=bool)                         # (0x110000,)
    present[points] = True
    rank = np.cumsum(present, dtype=np.int64) - 1                        # (0x110000,) code point -> code
    symbols = tuple(chr(p) for p in np.flatnonzero(present))
    return rank[points], symbols                                         # (L,), (V,)


def _encode_words(words: list[str]) -> tuple[np.ndarray, tuple[str, ...]]:
    """Number the distinct words in order of first appearance (one dict of words), then renumber sorted."""
    first: dict[str, int] = {}
    codes = np.fromiter((first.setdefault(w, len(first)) for w in words), np.int64, len(words))   # (L,)
    symbols = sorted(first)
    rank = np.empty(len(first), dtype=np.int64)                          # (V,) first-seen number -> sorted
    rank[[first[w] for w in symbols]] = np.arange(len(symbols))        # (V,)
    return rank[codes], tuple(symbols)                                   # (L,), (V,)


def floors(text: str, max_k: int = 5, *, level: str = "char") -> list[Floor]:
    """The floor for every context length k = 0 … ``max_k``.

    Parameters
    ----------
    text : str
    max_k : int >= 0
        The longest context. Rows stop early when the text has no position left to score.
    level : "char" or "word"

    Returns
    -------
    list of Floor, one per k.

    Examples
    --------
    The guide's toy text:

    >>> from attnlab.guide.toy import TOY_TEXT
    >>> [(f.k, round(f.floor, 3), f.n_contexts) for f in floors(TOY_TEXT, 2)]
    [(0, 2.318, 1), (1, 0.884, 15), (2, 0.337, 32)]
    """
    return list(iter_floors(text, max_k, level=level))


def iter_floors(text: str, max_k: int = 5, *, level: str = "char"):
    """:func:`floors`, one row at a time (for a progress bar)."""
    max_k = as_nonnegative_int("max_k", max_k)
    codes, symbols = encode(text, level)                       # (L,)
    bits = max(1, (len(symbols) - 1).bit_length())             # bits for one code
    ctx = np.zeros(len(codes), dtype=np.int64)                 # (L,) key of the k tokens before i; k = 0: all 0
    for k in range(max_k + 1):
        start = max(k, 1)
        if start >= len(codes):
            return
        ctx = _fit(ctx, k, bits)
        pair = (ctx << bits) | codes                           # (L,) key of (context, next), valid for i >= k
        yield _floor_of(pair[start:], k, bits)
        ctx = np.concatenate([[0], pair[:-1]])                 # (L,) context of length k+1 ends before i


def read_utf8(path: str | Path) -> str:
    """A UTF-8 text file's contents; unreadable raises OSError, not UTF-8 raises ValueError with the offset."""
    raw = Path(path).read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text: byte {raw[e.start]:#04x} at offset {e.start}") from None


def _fit(ctx: np.ndarray, k: int, bits: int) -> np.ndarray:
    """Renumber the contexts densely when shifting them by ``bits`` would overflow int64."""
    if k == 0 or int(ctx[k:].max()) < (1 << (63 - bits)):
        return ctx
    dense = np.zeros_like(ctx)                                       # (L,) positions < k hold no context
    dense[k:] = np.unique(ctx[k:], return_inverse=True)[1]           # (L−k,) same contexts, same numbers
    return dense


def _floor_of(pair: np.ndarray, k: int, bits: int) -> Floor:
    """Score one k from the packed (context, next) keys of the N predictions."""
    pair = np.sort(pair)                                       # (N,) equal contexts are now adjacent
    starts = _run_starts(pair)                                 # (P,) first index of each distinct pair
    n_pair = np.diff(np.append(starts, len(pair)))             # (P,) n(c, x)
    ctx = pair[starts] >> bits                                 # (P,) the context of each pair, still sorted
    n_ctx = np.add.reduceat(n_pair, _run_starts(ctx))          # (C,) n(c)
    floor = (_n_log_n(n_ctx) - _n_log_n(n_pair)) / len(pair)
    return Floor(k=k, floor=max(float(floor), 0.0), n_contexts=len(n_ctx), n_predictions=len(pair))


def _run_starts(sorted_keys: np.ndarray) -> np.ndarray:
    """Where each run of equal values starts in a sorted, non-empty array."""
    change = sorted_keys[1:] != sorted_keys[:-1]                           # (N − 1,)
    return np.flatnonzero(np.concatenate([[True], change]))               # (runs,)


def _n_log_n(counts: np.ndarray) -> float:
    c = counts.astype(np.float64)
    return float(np.sum(c * np.log(c)))
