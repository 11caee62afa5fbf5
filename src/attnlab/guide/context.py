"""The two gaps embeddings leave, measured on a trained model: a word's vector in two sentences, layer by layer.

The guide opens with two gaps. "bank" beside a river and at a lender gets one row of the embedding
table, so one vector; and the mean of the rows of "the cat saw the dog" equals the mean for "the dog saw
the cat". :func:`compare_in_context` runs both sentences through a trained model (all-MiniLM-L6-v2 by
default) and gives, for every hidden state (the embedding output first, then the output of each layer):

- the cosine between WORD's vector in sentence A and in sentence B (a word of several word pieces is the
  mean of its pieces' vectors);
- the cosine between the two mean-pooled sentence vectors (the mean over every token, [CLS] and [SEP]
  included, as sentence-transformers pools MiniLM).

It also gives both cosines for the token-embedding rows alone (W_E[ids], before positions are added and
before any attention): there "bank" is one row, so its cosine is exactly 1, and two sentences holding
the same words have exactly the same mean.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

MINILM = "minilm"


@dataclass(frozen=True, eq=False)
class InContext:
    """One word in two sentences, at every hidden state of a model."""
    word: str
    sentences: tuple[str, str]
    tokens: tuple[tuple[str, ...], tuple[str, ...]]   # each sentence's tokens, as the model sees them
    pieces: tuple[tuple[int, ...], tuple[int, ...]]   # positions of WORD's tokens in each sentence
    occurrence: tuple[int, int]                       # which occurrence of WORD, from 0, in each sentence
    n_occurrences: tuple[int, int]                    # how many times WORD occurs in each sentence
    layers: tuple[str, ...]                            # "embeddings", "layer 1", …: one per hidden state
    word_cosine: np.ndarray                            # (n_layers + 1,)
    sentence_cosine: np.ndarray                        # (n_layers + 1,)
    rows_word_cosine: float                            # W_E rows alone: before positions and attention
    rows_sentence_cosine: float
    model: str
    causal: bool = False                               # a decoder: each token sees only the tokens before it


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity along the last axis: (..., d), (..., d) -> (...)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def find_word(word: str, text: str, offsets, *, name: str = "sentence", index: int = 0) -> tuple[int, ...]:
    """Positions of the tokens that cover occurrence ``index`` (counted from 0) of ``word`` in ``text``, as a
    whole word in any case; ``offsets`` are the tokens' (start, end) characters, special tokens (0, 0).

    >>> find_word("bank", "the river bank", [(0, 0), (0, 3), (4, 9), (10, 14), (0, 0)])
    (3,)
    """
    found = occurrences(word, text)
    if not found:
        raise ValueError(f"{name} must contain the word {word!r} (whole word, any case), got {text!r}")
    if not 0 <= index < len(found):
        raise ValueError(f"index must pick one of the {len(found)} occurrences of {word!r} in {name} (0 to "
                         f"{len(found) - 1}), got {index}")
    start, end = found[index]
    pieces = tuple(i for i, (a, b) in enumerate(offsets) if b > a and a < end and b > start)
    if not pieces:
        raise ValueError(f"{name}: no token of {text!r} covers {word!r}")
    return pieces


def occurrences(word: str, text: str) -> list[tuple[int, int]]:
    """The (start, end) characters of every whole-word, case-insensitive occurrence of ``word`` in ``text``.

    >>> occurrences("the", "The cat saw the dog")
    [(0, 3), (12, 15)]
    """
    pattern = r"(?<!\w)" + re.escape(word.strip()) + r"(?!\w)"
    return [m.span() for m in re.finditer(pattern, text, re.IGNORECASE)]


def compare_in_context(word: str, sentence_a: str, sentence_b: str, model=MINILM, *, index=0) -> InContext:
    """``word``'s vector in ``sentence_a`` and in ``sentence_b``, and the two sentences' mean vectors, compared
    by cosine at every hidden state of ``model`` (``"minilm"``, a checkpoint folder, or the
    ``(model, tokenizer)`` pair of :func:`attnlab.models.load_model`). ``index`` picks which occurrence of
    ``word`` (from 0) in both sentences, or ``(index_a, index_b)`` one per sentence.

    Raises
    ------
    TypeError
        ``word`` or a sentence is not a str.
    ValueError
        ``word`` is empty, does not occur in a sentence as a whole word, or ``index`` picks no occurrence.
    FileNotFoundError
        The model is not installed.
    """
    from ..models.attend import _loaded
    from ..stack.transformer import forward

    for name, value in (("word", word), ("sentence_a", sentence_a), ("sentence_b", sentence_b)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if not word.strip():
        raise ValueError("word must hold at least one non-space character, got an empty string")
    indices = occurrence_indices(index)
    network, tokenizer, model_name = _loaded(model)
    states, tokens, pieces, rows = [], [], [], []
    for name, text, i in (("sentence_a", sentence_a, indices[0]), ("sentence_b", sentence_b, indices[1])):
        ids = tokenizer.encode(text)                                  # (n,)
        offsets = tokenizer.tokenizer.encode(text).offsets
        pieces.append(find_word(word, text, offsets, name=name, index=i))
        states.append(np.stack(forward(network, ids).hidden_states))  # (L + 1, n, d_model)
        rows.append(token_rows(network, ids))                         # (n, d_model)
        tokens.append(tokenizer.labels(ids))
    (ha, hb), (pa, pb) = states, pieces
    word_cos = cosine(ha[:, list(pa)].mean(axis=1), hb[:, list(pb)].mean(axis=1))   # (L + 1,)
    sentence_cos = cosine(ha.mean(axis=1), hb.mean(axis=1))                          # (L + 1,)
    ra, rb = rows
    return InContext(
        word=word, sentences=(sentence_a, sentence_b), tokens=tuple(tokens), pieces=(pa, pb),
        layers=("embeddings",) + tuple(f"layer {i}" for i in range(1, len(ha))),
        word_cosine=word_cos, sentence_cosine=sentence_cos,
        rows_word_cosine=float(cosine(ra[list(pa)].mean(axis=0), rb[list(pb)].mean(axis=0))),
        rows_sentence_cosine=float(cosine(ra.mean(axis=0), rb.mean(axis=0))),
        occurrence=indices, n_occurrences=(len(occurrences(word, sentence_a)), len(occurrences(word, sentence_b))),
        model=model_name, causal=network.config.is_causal)


def occurrence_indices(index) -> tuple[int, int]:
    """``index`` as one occurrence per sentence: an int for both, or a pair."""
    pair = (index, index) if isinstance(index, (int, np.integer)) else tuple(index)
    if len(pair) != 2 or not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in pair):
        raise TypeError(f"index must be an int or a pair of ints (one per sentence), got {index!r}")
    return int(pair[0]), int(pair[1])


def token_rows(network, ids) -> np.ndarray:
    """The token-embedding rows W_E[ids] (n, d_model): what a token is before positions and attention."""
    W_E = getattr(network, "W_E", None)
    if W_E is None:
        raise TypeError(f"{type(network).__name__} has no token-embedding table W_E")
    return np.asarray(W_E)[np.asarray(ids)]                            # (n, d_model)
