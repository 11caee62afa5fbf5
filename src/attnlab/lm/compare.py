"""The model's loss beside what counting can do on the same text: the n-gram floors of the guide's first
section, and add-α count predictors fitted on the training part.

On the training part every number is measured on text the predictor has seen. On the held-out tail the
model and the add-α predictors are fair comparisons, while the floor counted on the tail itself is only an
optimistic bound: it knows the tail's own counts.
"""

from __future__ import annotations

import numpy as np

from ..text.ngrams import floors
from ..stack.transformer import Transformer
from ..text.tokens import Vocab
from .addalpha import add_alpha_loss
from .training import evaluate

ALPHA = 0.1       # add-α smoothing; near the best α for k = 1, 2 on the guide's own text (benchmarks/train_guide.py)


def loss_beside_counts(model: Transformer, vocab: Vocab, train: np.ndarray, heldout: np.ndarray, *, max_k: int = 3,
                       ks: tuple[int, ...] = (1, 2), alpha: float = ALPHA) -> dict:
    """``{"train": part, "heldout": part}`` (the held-out part only when the tail has more than max_k + 1
    tokens), each part ``{"model": loss, "floors": {k: floor}, "add_alpha": {k: loss}}`` in nats per token.
    """
    parts = {"train": train} | ({"heldout": heldout} if heldout.size > max_k + 1 else {})
    return {name: {"model": evaluate(model, ids),
                   "floors": {f.k: f.floor for f in floors(vocab.decode(ids), max_k, level=vocab.level)},
                   "add_alpha": {k: add_alpha_loss(train, ids, k, vocab_size=vocab.size, alpha=alpha) for k in ks}}
            for name, ids in parts.items()}
