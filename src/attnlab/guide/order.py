"""Order: attention without positions cannot tell "the cat saw the dog" from "the dog saw the cat".

The guide's three checks, on the toy embeddings with its random W_Q, W_K, W_V:
without the mask, reversing the rows reverses the outputs, and "saw" gets the same vector in both
sentences (True True); add random position vectors (seed 2) and reversal no longer commutes (False,
outputs differ by up to 0.749); with the causal mask on, a little order leaks through (False 0.020).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels._checks import check_rng
from .toy import GuideToy

SENTENCE = "the cat saw the dog"
SWAPPED = "the dog saw the cat"
POSITION_SEED = 2              # the guide's seed for the random position vectors
POSITION_STD = 1.0


@dataclass(frozen=True, eq=False)
class OrderChecks:
    reversal_commutes: bool        # attention(X[::-1]) == attention(X)[::-1], no mask, no positions
    same_vector: bool              # the word gets the same output in both sentences, no mask
    with_positions_commutes: bool  # the reversal check again, after adding position vectors
    with_positions_max_diff: float # how far apart the two sides are then
    masked_same_vector: bool       # the word in both sentences, with the causal mask on
    masked_max_diff: float
    word: str                      # the word compared across the two sentences
    index: int                     # its position in ``sentence``
    index_swapped: int             # its position in ``swapped``
    sentence: str
    swapped: str
    flipped: np.ndarray            # (n, d_v) attention(X[::-1]), no mask, no positions
    out_reversed: np.ndarray       # (n, d_v) attention(X)[::-1]: equal to ``flipped`` row by row
    unmasked: tuple                # ((d_v,), (d_v,)) the word's output in each sentence, no mask
    masked: tuple                  # ((d_v,), (d_v,)) the same with the causal mask


def order_checks(toy: GuideToy, sentence: str = SENTENCE, swapped: str | None = SWAPPED, *,
                 index: int | None = None, rng: np.random.Generator) -> OrderChecks:
    """Run the guide's order checks; ``rng`` draws the position vectors (the guide uses default_rng(2)).

    ``swapped`` defaults to ``sentence``'s words in reverse order (None). ``index`` is the position in
    ``sentence`` of the word compared between the two sentences (default: the word nearest the middle
    that ``swapped`` also holds, "saw" for the guide's pair); in ``swapped`` the same word is taken at the
    same position if it sits there, else where it first occurs.
    """
    check_rng(rng)
    if swapped is None:
        swapped = _reverse(sentence)
    x = toy.embeddings.embed(sentence)                                      # (n, d_model)
    n = len(x)
    if len(toy.embeddings.ids(swapped)) != n:
        raise ValueError(f"swapped must have as many words as sentence ({n}), got {swapped!r}")
    ids_a, ids_b = toy.embeddings.ids(sentence), toy.embeddings.ids(swapped)  # (n,) each
    index = _pick(ids_a, ids_b) if index is None else index
    if not 0 <= index < n:
        raise ValueError(f"index must be a position from 0 to {n - 1}, got {index}")
    same_place = np.flatnonzero(ids_b == ids_a[index])
    if same_place.size == 0:
        raise ValueError(f"swapped must also hold the compared word {sentence.split()[index]!r}, got {swapped!r}")
    index_b = index if ids_b[index] == ids_a[index] else int(same_place[0])
    out1, _ = toy.attend(sentence, is_causal=False)                         # (n, d_v)
    out2, _ = toy.attend(swapped, is_causal=False)                          # (n, d_v)
    flipped, _ = toy.attend(_reverse(sentence), is_causal=False)            # (n, d_v)
    pos = rng.normal(0, POSITION_STD, x.shape)                              # (n, d_model) one vector per position
    out1_pos, _ = toy.attend(sentence, is_causal=False, positions=pos)      # (n, d_v)
    flipped_pos, _ = toy.attend(_reverse(sentence), is_causal=False, positions=pos)   # (n, d_v)
    masked1, _ = toy.attend(sentence)                                       # (n, d_v)
    masked2, _ = toy.attend(swapped)                                        # (n, d_v)
    gap = np.abs(flipped_pos - out1_pos[::-1])                              # (n, d_v)
    return OrderChecks(
        reversal_commutes=bool(np.allclose(flipped, out1[::-1])),
        same_vector=bool(np.allclose(out1[index], out2[index_b])),
        with_positions_commutes=bool(np.allclose(flipped_pos, out1_pos[::-1])),
        with_positions_max_diff=float(gap.max()),
        masked_same_vector=bool(np.allclose(masked1[index], masked2[index_b])),
        masked_max_diff=float(np.abs(masked1[index] - masked2[index_b]).max()),
        word=sentence.split()[index], index=index, index_swapped=index_b, sentence=sentence, swapped=swapped,
        flipped=flipped, out_reversed=out1[::-1], unmasked=(out1[index], out2[index_b]),
        masked=(masked1[index], masked2[index_b]))


def _pick(ids_a: np.ndarray, ids_b: np.ndarray) -> int:
    """The position in the first sentence of the word to compare: one the second sentence holds at the same
    position, nearest the middle (earliest on a tie); else the first word the second sentence holds at all."""
    n = len(ids_a)
    same = [i for i in range(n) if ids_a[i] == ids_b[i]]
    if same:
        return min(same, key=lambda i: (abs(i - n // 2), i))
    shared = [i for i in range(n) if ids_a[i] in set(ids_b.tolist())]
    if not shared:
        raise ValueError("swapped must share at least one word with sentence to compare its vectors")
    return shared[0]


def _reverse(sentence: str) -> str:
    return " ".join(reversed(sentence.split()))
