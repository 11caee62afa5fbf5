"""What a model's forward pass returns, and the check on the token ids that go in."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._checks import as_token_ids


@dataclass(frozen=True, eq=False)
class ModelOutput:
    """A forward pass's results for ``n`` tokens.

    ``hidden_states[0]`` is the embedding output and ``hidden_states[i]`` the output of block i (for GPT-2
    the last one has the final layer norm applied, as in transformers). ``attentions`` is None unless the
    forward pass was asked for the weights (``return_weights=True``); ``logits`` is None for encoders.
    """
    hidden_states: np.ndarray              # (n_layers+1, n, d_model)
    attentions: np.ndarray | None = None   # (n_layers, n_heads, n, n_k); n_k > n with a KV cache
    logits: np.ndarray | None = None       # (n, vocab_size)


def attention_and_weights(attn, x: np.ndarray, return_weights: bool, **options):
    """One block's attention on x (n, d_model): its output (n, d_model) and its weights (h, n, n_k), the weights
    only when asked (otherwise None), so that a long input can take attention's tiled path."""
    out = attn(x, return_weights=return_weights, **options)
    return out if return_weights else (out, None)


def check_model(model, kind: type) -> None:
    """A TypeError unless ``model`` is a ``kind`` (a loaded network, see attnlab.models.load_network)."""
    if not isinstance(model, kind):
        raise TypeError(f"model must be a {kind.__name__} (from attnlab.models.load_network), "
                        f"got {type(model).__name__}")


def check_ids(ids, vocab_size: int, n_ctx: int, *, name: str = "ids", start: int = 0) -> np.ndarray:
    """``ids`` as a 1-D int64 array of at least one token, each below ``vocab_size``, fitting in ``n_ctx``.

    ``start`` is the position of the first token (the tokens already in a KV cache).
    """
    arr = as_token_ids(name, ids, vocab_size)                # (n,) once it is 1-D
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of token ids, got shape {arr.shape}")
    if start + arr.size > n_ctx:
        already = f" after {start} already processed" if start else ""
        raise ValueError(f"{name} has {arr.size} tokens{already}, but the model has only {n_ctx} positions "
                         f"(n_ctx, the rows of its position table); shorten the text")
    return arr
