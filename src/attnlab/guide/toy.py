"""The guide's toy world: Guide 1's text, Guide 3's 12 × 4 word embeddings, random W_Q, W_K, W_V.

The embeddings are retrained exactly as the guide does (skip-gram, window 2, seed 0, 3001 full-batch
steps of learning rate 0.5), and the projections are drawn as it draws them (seed 1, N(0, 0.5²)), so
every grid the guide prints comes out digit for digit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels._checks import as_float_array, as_positive_float, as_positive_int, check_rng
from ..kernels.attention import attention, attention_weights
from ..kernels.softmax import softmax

TOY_TEXT = ("the cat sat on the mat and the dog sat on the log and the "
            "cat saw the dog then the dog ran to the cat and the cat ran on the mat")
RUNNING_EXAMPLE = "The cat sat on the"     # GPT-2 tokens 464 3797 3332 319 262
EMBED_SEED = 0                             # Guide 3's seed for the embedding table
PROJECTION_SEED = 1                        # the guide's seed for W_Q, W_K, W_V
PROJECTION_STD = 0.5                       # the guide's scale for W_Q, W_K, W_V


@dataclass(frozen=True)
class SkipGramConfig:
    """Guide 3's training run, squeezed into the attention guide's few lines."""
    window: int = 2          # neighbours on each side that a word learns to predict
    d_embed: int = 4         # numbers per word
    steps: int = 3001        # the guide loops over range(3001)
    lr: float = 0.5          # plain gradient descent, full batch
    init_std: float = 0.1    # E and W start as N(0, 0.1²)

    def __post_init__(self):
        for name in ("window", "d_embed", "steps"):
            as_positive_int(name, getattr(self, name))
        for name in ("lr", "init_std"):
            as_positive_float(name, getattr(self, name))


@dataclass(frozen=True, eq=False)
class ToyEmbeddings:
    """A word embedding table: one row of ``E`` per word of ``vocab``."""
    vocab: tuple[str, ...]
    E: np.ndarray            # (V, d_embed)

    def ids(self, sentence: str) -> np.ndarray:
        """The words of ``sentence`` as row numbers; a word outside the vocabulary is an error naming it."""
        return word_ids(self.vocab, sentence)

    def embed(self, sentence: str) -> np.ndarray:
        """``sentence`` as the matrix X, one row per word: (n, d_embed)."""
        return self.E[self.ids(sentence)]                 # (n, d_embed)

    def cosine(self, word_a: str, word_b: str) -> float:
        """Cosine similarity of two words' rows."""
        for name, w in (("word_a", word_a), ("word_b", word_b)):
            if not isinstance(w, str) or len(w.split()) != 1:
                raise ValueError(f"{name} must be one word, got {w!r}")
        a, b = self.embed(f"{word_a} {word_b}")           # (d_embed,) each
        return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@dataclass(frozen=True, eq=False)
class GuideToy:
    """Everything the guide's toy examples share: the trained table and the random projections."""
    embeddings: ToyEmbeddings
    W_Q: np.ndarray          # (d_model, d_k)
    W_K: np.ndarray          # (d_model, d_k)
    W_V: np.ndarray          # (d_model, d_v)

    def attend(self, sentence: str, *, is_causal: bool = True, positions=None):
        """The guide's ``attention(embed(sentence), WQ, WK, WV, causal)``: (out (n, d_v), weights (n, n))."""
        x = self.embeddings.embed(sentence)               # (n, d_model)
        if positions is not None:
            x = x + positions                             # (n, d_model)
        return self_attention(x, self.W_Q, self.W_K, self.W_V, is_causal=is_causal)


def toy_vocab(text: str = TOY_TEXT) -> tuple[str, ...]:
    """The sorted distinct words of ``text``: for the toy text, 12 words."""
    return tuple(sorted(set(text.split())))


def word_ids(vocab: tuple[str, ...], sentence: str) -> np.ndarray:
    """The words of ``sentence`` (split on whitespace) as indices into ``vocab``: (n,).

    A word not in ``vocab`` is looked up lowercased, so the guide's "The cat sat" works on the toy's words.

    >>> word_ids(("cat", "the"), "The cat").tolist()
    [1, 0]
    """
    if not isinstance(sentence, str):
        raise TypeError(f"sentence must be a str, got {type(sentence).__name__}")
    words = sentence.split()
    if not words:
        raise ValueError("sentence must hold at least one word, got an empty string")
    index = {w: i for i, w in enumerate(vocab)}
    words = [w if w in index else w.lower() for w in words]                  # "The" is the toy's "the"
    unknown = [w for w in words if w not in index]
    if unknown:
        raise ValueError(f"word {unknown[0]!r} is not in the toy vocabulary ({' '.join(vocab)})")
    return np.array([index[w] for w in words])                               # (n,)


def skipgram_pairs(ids: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """(word, neighbour) pairs within ``window`` positions, ordered by word then neighbour as the guide's loop.

    >>> [p.tolist() for p in skipgram_pairs(np.array([7, 8, 9]), 1)]
    [[7, 8, 8, 9], [8, 7, 9, 8]]
    """
    n = len(ids)
    offsets = np.array([o for o in range(-window, window + 1) if o != 0])   # (2·window,)
    i = np.broadcast_to(np.arange(n)[:, None], (n, len(offsets)))          # (n, 2·window)
    j = i + offsets                                                          # (n, 2·window)
    inside = (j >= 0) & (j < n)                                              # (n, 2·window)
    return ids[i[inside]], ids[j[inside]]                                    # (P,), (P,)


def train_embeddings(text: str = TOY_TEXT, config: SkipGramConfig = SkipGramConfig(), *,
                     rng: np.random.Generator) -> ToyEmbeddings:
    """Guide 3's skip-gram: learn E so that ``softmax(E[word] @ W)`` predicts the word's neighbours."""
    check_rng(rng)
    vocab = toy_vocab(text)
    inputs, targets = skipgram_pairs(word_ids(vocab, text), config.window)  # (P,), (P,)
    P = len(inputs)
    E = rng.normal(0, config.init_std, (len(vocab), config.d_embed))        # (V, d) embedding table
    W = rng.normal(0, config.init_std, (config.d_embed, len(vocab)))        # (d, V) output matrix
    for _ in range(config.steps):
        dz = softmax(E[inputs] @ W)                                          # (P, V) predicted probabilities
        dz[np.arange(P), targets] -= 1                                       # (P, V) predicted minus correct
        dW = E[inputs].T @ dz / P                                            # (d, V)
        dE = np.zeros_like(E)                                                # (V, d)
        np.add.at(dE, inputs, dz @ W.T / P)                                  # each pair's gradient to its word
        E -= config.lr * dE
        W -= config.lr * dW
    return ToyEmbeddings(vocab=vocab, E=E)


def random_projections(d_model: int = 4, d_k: int = 4, d_v: int | None = None, *, rng: np.random.Generator,
                       std: float = PROJECTION_STD) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Untrained W_Q, W_K (d_model, d_k) and W_V (d_model, d_v) from N(0, std²), drawn in that order."""
    check_rng(rng)
    d_model, d_k = as_positive_int("d_model", d_model), as_positive_int("d_k", d_k)
    d_v = d_k if d_v is None else as_positive_int("d_v", d_v)
    std = as_positive_float("std", std)
    return (rng.normal(0, std, (d_model, d_k)), rng.normal(0, std, (d_model, d_k)),
            rng.normal(0, std, (d_model, d_v)))


def self_attention(x, W_Q, W_K, W_V, *, is_causal: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Single-head self-attention without biases, the guide's ``attention(X, WQ, WK, WV)``.

    x (n, d_model) -> out (n, d_v) and weights A (n, n), with ``A = softmax(QKᵀ/√d_k + M)``.
    """
    x = as_float_array("x", x, min_ndim=2)
    for name, w in (("W_Q", W_Q), ("W_K", W_K), ("W_V", W_V)):
        w = as_float_array(name, w)
        if w.ndim != 2 or w.shape[0] != x.shape[-1]:
            raise ValueError(f"{name} must be ({x.shape[-1]}, width) to match x of shape {x.shape}, "
                             f"got {w.shape}")
    q, k, v = x @ W_Q, x @ W_K, x @ W_V                                      # (n, d_k), (n, d_k), (n, d_v)
    return attention(q, k, v, is_causal=is_causal), attention_weights(q, k, is_causal=is_causal)   # (n, d_v), (n, n)


def guide_toy(text: str = TOY_TEXT) -> GuideToy:
    """The guide's own toy: embeddings from seed 0, then W_Q, W_K, W_V from seed 1."""
    emb = train_embeddings(text, rng=np.random.default_rng(EMBED_SEED))
    d = emb.E.shape[1]
    W_Q, W_K, W_V = random_projections(d, d, rng=np.random.default_rng(PROJECTION_SEED))
    return GuideToy(embeddings=emb, W_Q=W_Q, W_K=W_K, W_V=W_V)

