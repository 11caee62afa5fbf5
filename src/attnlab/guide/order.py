"""Order: attention without positions cannot tell "the cat saw the dog" from "the dog saw the cat".

The guide's three checks, on the toy embeddings with its random W_Q, W_K, W_V:
without the mask, reversing the rows reverses the outputs, and "saw" gets the same vector in both
sentences (True True); add random position vectors (seed 2) and reversal no longer commutes (False,
outputs differ by up to 0.749); with the causal mask on, a little order leaks through (False 0.020).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._checks import check_rng
from .toy import GuideToy

SENTENCE = "the cat saw the dog"
SWAPPED = "the dog saw the cat"
POSITION_SEED = 2              # the guide's seed for the random position vectors
POSITION_STD = 1.0


@dataclass(frozen=True)
class OrderChecks:
    reversal_commutes: bool        # attention(X[::-1]) == attention(X)[::-1], no mask, no positions
    same_vector: bool              # "saw" gets the same output in both sentences, no mask
    with_positions_commutes: bool  # the reversal check again, after adding position vectors
    with_positions_max_diff: float # how far apart the two sides are then
    masked_same_vector: bool       # "saw" in both sentences, with the causal mask on
    masked_max_diff: float
    word: str                      # the word compared across the two sentences
    index: int


def order_checks(toy: GuideToy, sentence: str = SENTENCE, swapped: str = SWAPPED, *, index: int = 2,
                 rng: np.random.Generator) -> OrderChecks:
    """Run the guide's order checks; ``rng`` draws the position vectors (the guide uses default_rng(2)).

    ``index`` is the position compared between ``sentence`` and ``swapped`` ("saw").
    """
    check_rng(rng)
    x = toy.embeddings.embed(sentence)                                      # (n, d_model)
    n = len(x)
    if len(toy.embeddings.ids(swapped)) != n:
        raise ValueError(f"swapped must have as many words as sentence ({n}), got {swapped!r}")
    if not 0 <= index < n:
        raise ValueError(f"index must be a position from 0 to {n - 1}, got {index}")
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
        same_vector=bool(np.allclose(out1[index], out2[index])),
        with_positions_commutes=bool(np.allclose(flipped_pos, out1_pos[::-1])),
        with_positions_max_diff=float(gap.max()),
        masked_same_vector=bool(np.allclose(masked1[index], masked2[index])),
        masked_max_diff=float(np.abs(masked1[index] - masked2[index]).max()),
        word=sentence.split()[index], index=index)


def _reverse(sentence: str) -> str:
    return " ".join(reversed(sentence.split()))
