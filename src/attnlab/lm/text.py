"""Text for the language model: a character- or word-level vocabulary, and a held-out tail.

The guide's toy text (:data:`attnlab.guide.toy.TOY_TEXT`) is the default: 128 characters from Guide 1,
where the next-character floor with one character of context is 0.884 nats. Splitting text into tokens
is :func:`attnlab.guide.ngrams.encode`'s, so the model and the n-gram floors count the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._checks import as_choice
from ..guide.ngrams import LEVELS, encode


@dataclass(frozen=True)
class Vocab:
    """The distinct tokens of a text, sorted; a token's id is its index.

    >>> v = Vocab.from_text("the cat")
    >>> v.symbols, v.encode("cat").tolist(), v.decode([4, 3, 2])
    ((' ', 'a', 'c', 'e', 'h', 't'), [2, 1, 5], 'hec')
    """
    symbols: tuple[str, ...]
    level: str = "char"

    def __post_init__(self):
        object.__setattr__(self, "symbols", tuple(self.symbols))
        as_choice("level", self.level, LEVELS)
        if not self.symbols:
            raise ValueError("a vocabulary needs at least one symbol, got none")
        if len(set(self.symbols)) != len(self.symbols) or not all(isinstance(s, str) for s in self.symbols):
            raise ValueError("a vocabulary's symbols must be distinct strings")

    @classmethod
    def from_text(cls, text: str, level: str = "char") -> "Vocab":
        """The sorted distinct tokens of ``text``; an empty text is a ValueError."""
        codes, symbols = encode(text, level)                             # (n,), (V,)
        if not codes.size:
            raise ValueError(f"the text is empty: it has no {'characters' if level == 'char' else 'words'}")
        return cls(symbols, level)

    @property
    def size(self) -> int:
        return len(self.symbols)

    def encode(self, text: str) -> np.ndarray:
        """Ids (n,) of the tokens of ``text``; a token outside the vocabulary is a ValueError naming it."""
        codes, symbols = encode(text, self.level)                        # (n,), the text's own symbols
        index = {s: i for i, s in enumerate(self.symbols)}
        unknown = [s for s in symbols if s not in index]
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not in the vocabulary of {self.size} {self.level}s")
        ours = np.array([index[s] for s in symbols], np.int64)           # (V_text,) text code -> our id
        return ours[codes]                                               # (n,)

    def decode(self, ids) -> str:
        return ("" if self.level == "char" else " ").join(self.symbols[int(i)] for i in ids)


def split_heldout(ids: np.ndarray, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """The text split into a training head and a held-out tail of ``fraction`` of its tokens (0 = no tail)."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
        raise ValueError(f"heldout fraction must be a number in [0, 1), got {fraction!r}")
    cut = len(ids) - int(round(len(ids) * fraction))
    return ids[:cut], ids[cut:]                                          # (n_train,), (n_heldout,)
