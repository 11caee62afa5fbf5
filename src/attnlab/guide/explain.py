"""The equation, symbol by symbol: ``A = softmax(QKᵀ/√d_k + M)``, output ``AV``, with Q, K, V = XW^Q, XW^K, XW^V.

One table of symbols serves both views: :func:`explain` computes every symbol's values on the toy
embeddings, and :func:`shapes` resolves every symbol's general shape for a real model, such as GPT-2
small on the running example "The cat sat on the" (n = 5, d_model = 768, d_k = d_v = 64).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..kernels._checks import as_positive_int
from ..kernels.attention import attention, attention_weights
from ..layer.config import GPT2_SMALL, AttentionConfig
from ..kernels.masks import additive_mask, causal_mask
from .toy import GuideToy


@dataclass(frozen=True)
class Symbol:
    name: str                      # as the guide writes it
    meaning: str
    shape: tuple[str, ...]         # general shape, in the guide's letters


SYMBOLS = (
    Symbol("X", "the tokens' vectors, one row per token", ("n", "d_model")),
    Symbol("W^Q", "learned: turns a token's vector into its query", ("d_model", "d_k")),
    Symbol("W^K", "learned: turns a token's vector into its key", ("d_model", "d_k")),
    Symbol("W^V", "learned: turns a token's vector into its value", ("d_model", "d_v")),
    Symbol("Q", "queries, Q = XW^Q", ("n", "d_k")),
    Symbol("K", "keys, K = XW^K", ("n", "d_k")),
    Symbol("V", "values, V = XW^V", ("n", "d_v")),
    Symbol("Kᵀ", "the keys turned into columns", ("d_k", "n")),
    Symbol("S", "scaled scores, S = QKᵀ/√d_k; row i holds token i's scores", ("n", "n")),
    Symbol("M", "causal mask: 0 where a token may look, −∞ where it may not", ("n", "n")),
    Symbol("S + M", "the scores with the later tokens sent to −∞", ("n", "n")),
    Symbol("A", "weights, A = softmax(S + M) row by row; each row sums to 1", ("n", "n")),
    Symbol("AV", "each token's new vector: its weighted sum of the values", ("n", "d_v")),
)


# Without the causal mask two symbols mean something else; the rest read the same.
UNMASKED = {
    "M": "no mask (--no-mask): M is all zeros, every token may look at every token",
    "S + M": "equal to S: with no mask nothing is sent to −∞",
}


@dataclass(frozen=True, eq=False)
class Step:
    symbol: Symbol
    shape: tuple[int, ...]         # the shape here
    value: np.ndarray | None       # None when only shapes are known
    rows: tuple[str, ...] | None = None   # a label per row when the rows are tokens
    cols: tuple[str, ...] | None = None   # a label per column when the columns are tokens


def shape_sizes(n: int, config: AttentionConfig = GPT2_SMALL) -> dict[str, int]:
    """The guide's letters for one head of ``config`` on ``n`` tokens."""
    n = as_positive_int("n", n)
    if not isinstance(config, AttentionConfig):
        raise TypeError(f"config must be an AttentionConfig, got {type(config).__name__}")
    return {"n": n, "d_model": config.d_model, "d_k": config.d_head, "d_v": config.d_head}


def shapes(n: int = 5, config: AttentionConfig = GPT2_SMALL) -> list[Step]:
    """The guide's shapes table: each symbol's general shape and its shape for ``n`` tokens of ``config``.

    >>> [(s.symbol.name, s.shape) for s in shapes()][:2]
    [('X', (5, 768)), ('W^Q', (768, 64))]
    """
    letters = shape_sizes(n, config)
    return [Step(symbol=s, shape=tuple(letters[d] for d in s.shape), value=None) for s in SYMBOLS]


def explain(toy: GuideToy, sentence: str, *, is_causal: bool = True) -> list[Step]:
    """Every symbol of the equation computed on the toy embeddings of ``sentence``.

    The weights come from :func:`attnlab.kernels.attention`; S, M and S + M are shown as the guide writes them.
    Without the causal mask, M is all zeros and the meanings of M and S + M say so. Each step carries the
    words of ``sentence`` as labels of its token axes (rows of X, Q, K, V, AV; both axes of S, M, A).
    """
    if not isinstance(toy, GuideToy):
        raise TypeError(f"toy must be a GuideToy (see guide_toy()), got {type(toy).__name__}")
    x = toy.embeddings.embed(sentence)                      # (n, d_model)
    q, k, v = x @ toy.W_Q, x @ toy.W_K, x @ toy.W_V         # (n, d_k), (n, d_k), (n, d_v)
    n, d_k = q.shape
    s = q @ k.T / np.sqrt(d_k)                              # (n, n) scaled scores
    keep = causal_mask(n) if is_causal else np.ones((n, n), bool)   # (n, n)
    m = additive_mask(keep)                                 # (n, n) 0 and −∞
    out = attention(q, k, v, mask=keep)                     # (n, d_v)
    a = attention_weights(q, k, mask=keep)                  # (n, n)
    values = {"X": x, "W^Q": toy.W_Q, "W^K": toy.W_K, "W^V": toy.W_V, "Q": q, "K": k, "V": v, "Kᵀ": k.T,
              "S": s, "M": m, "S + M": s + m, "A": a, "AV": out}
    letters = {"n": n, "d_model": x.shape[1], "d_k": d_k, "d_v": v.shape[1]}
    words = tuple(sentence.split())
    symbols = SYMBOLS if is_causal else tuple(replace(s, meaning=UNMASKED.get(s.name, s.meaning)) for s in SYMBOLS)
    steps = [Step(symbol=sym, shape=values[sym.name].shape, value=values[sym.name],
                  rows=words if sym.shape[0] == "n" else None, cols=words if sym.shape[-1] == "n" else None)
             for sym in symbols]
    assert all(st.shape == tuple(letters[d] for d in st.symbol.shape) for st in steps)
    return steps


@dataclass(frozen=True, eq=False)
class MaskTable:
    """The causal mask for a row of tokens, in both forms."""
    tokens: tuple[str, ...]
    keep: np.ndarray               # (n, n) bool, True = the query (row) may draw on the key (column)
    M: np.ndarray                  # (n, n) 0 and −∞, added to the scores


def mask_table(tokens) -> MaskTable:
    """The causal mask labelled by ``tokens`` (rows: queries, columns: keys).

    >>> mask_table(["The", "cat"]).M
    array([[  0., -inf],
           [  0.,   0.]])
    """
    if isinstance(tokens, str) or not all(isinstance(t, str) for t in tokens):
        raise TypeError("tokens must be a sequence of str")
    tokens = tuple(tokens)
    if not tokens:
        raise ValueError("tokens must hold at least one token, got none")
    if not all(t.strip() for t in tokens):
        raise ValueError(f"tokens must be labels with at least one visible character, got {list(tokens)!r}")
    keep = causal_mask(len(tokens))                         # (n, n)
    return MaskTable(tokens=tokens, keep=keep, M=additive_mask(keep))
