"""Text for the language model: a character- or word-level vocabulary, and a held-out tail.

The guide's toy text is the default: 128 characters from Guide 1, where the next-character floor with
one character of context is 0.884 nats.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

LEVELS = ("char", "word")

TOY_TEXT = ("the cat sat on the mat and the dog sat on the log and the "
            "cat saw the dog then the dog ran to the cat and the cat ran on the mat")   # the guide's `text`


def read_text(path) -> str:
    """The UTF-8 text of a file; an unreadable or non-UTF-8 file is an OSError/ValueError naming it."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text: byte {e.start} is {data[e.start:e.start + 1]!r}") from None


def split_text(text: str, level: str) -> list[str]:
    """The tokens of ``text``: its characters, or its whitespace-separated words (the guide's ``text.split()``)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    return list(text) if level == "char" else text.split()


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
        if self.level not in LEVELS:
            raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {self.level!r}")
        if not self.symbols:
            raise ValueError("a vocabulary needs at least one symbol, got none")
        if len(set(self.symbols)) != len(self.symbols) or not all(isinstance(s, str) for s in self.symbols):
            raise ValueError("a vocabulary's symbols must be distinct strings")

    @classmethod
    def from_text(cls, text: str, level: str = "char") -> "Vocab":
        tokens = split_text(text, level)
        if not tokens:
            raise ValueError(f"the text is empty: it has no {'characters' if level == 'char' else 'words'}")
        return cls(tuple(sorted(set(tokens))), level)

    @property
    def size(self) -> int:
        return len(self.symbols)

    def encode(self, text: str) -> np.ndarray:
        """Ids (n,) of the tokens of ``text``; a token outside the vocabulary is a ValueError naming it."""
        index = {s: i for i, s in enumerate(self.symbols)}
        tokens = split_text(text, self.level)
        unknown = [t for t in tokens if t not in index]
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not in the vocabulary of {self.size} {self.level}s")
        return np.array([index[t] for t in tokens], np.int64)            # (n,)

    def decode(self, ids) -> str:
        return ("" if self.level == "char" else " ").join(self.symbols[int(i)] for i in ids)


def split_heldout(ids: np.ndarray, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """The text split into a training head and a held-out tail of ``fraction`` of its tokens (0 = no tail)."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction < 1:
        raise ValueError(f"heldout fraction must be a number in [0, 1), got {fraction!r}")
    cut = len(ids) - int(round(len(ids) * fraction))
    return ids[:cut], ids[cut:]                                          # (n_train,), (n_heldout,)
