"""Attention sinks in a trained model: how much each head parks on the first token, what the first token's
keys and values are worth to the loss, and a sink + window cache for text longer than the window.

Xiao et al. (2023, "Efficient Streaming Language Models with Attention Sinks", StreamingLLM) found that many
heads put a large share of their weight on the first tokens whatever they are (a softmax must put its weight
somewhere), that dropping those tokens from a rolling KV cache wrecks the perplexity, and that keeping 4 of
them beside the window recovers the full cache's.

- :func:`first_token_attention` (L, h): the mean weight each head gives key 0, over the queries 1 … n − 1 of
  each text (query 0 sees only key 0, weight 1, so it is left out), weighted by the queries of each text.
- :func:`without_first_token`: the per-token loss of the text after the first token, with and without the
  first token's keys and values in every layer's cache.
- :func:`streaming_loss`: the per-token loss of a long text read through a cache policy
  (:class:`attnlab.layer.streaming.SinkWindow`, or None for the full cache), ``chunk`` tokens per forward.
- :func:`recomputed_loss`: StreamingLLM's baseline, a sliding window with re-computation: each chunk's
  predictions from a fresh forward over the last ``capacity`` tokens (its first token a fresh start, so a sink
  of its own). What a sink + window cache of that capacity aims at, without the far context a full cache has.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels._checks import as_positive_int, as_token_ids
from ..layer.cache import KVCache
from ..layer.streaming import SinkWindow, StreamingCache
from ..stack.transformer import Transformer, check_decoder, check_ids, forward, new_caches
from .interventions import per_token_loss

#: modules whose docstrings are the default corpus: English prose that ships with attnlab, nothing to download
CORPUS_MODULES = ("attnlab.layer.streaming", "attnlab.layer.cache", "attnlab.stack.transformer",
                  "attnlab.guide.cost", "attnlab.interpret.sweeps", "attnlab.stack.blocks",
                  "attnlab.kernels.tiled", "attnlab.layer.positions", "attnlab.interpret.sinks",
                  "attnlab.interpret", "attnlab.kernels.attention", "attnlab.stack.backward")


def package_text() -> str:
    """The docstrings of :data:`CORPUS_MODULES`, joined by blank lines: the default corpus (the same text for
    the same version of attnlab)."""
    import importlib
    docs = (importlib.import_module(name).__doc__ or "" for name in CORPUS_MODULES)
    return "\n\n".join(d.strip() for d in docs if d and d.strip())


def first_token_attention(model: Transformer, texts) -> np.ndarray:
    """Mean attention weight on key 0 by layer and head (L, h), over queries 1 … n − 1 of every text.

    ``texts`` is a list of token-id arrays (each n >= 2). Each layer's ``hook_pattern`` (h, n, n) is reduced as
    the pass goes (nothing of size n² is kept): sum over queries of a[:, 1:, 0], divided by the queries counted.
    """
    check_decoder(model, "first_token_attention")
    texts = _texts(model, texts)
    c = model.config
    total = np.zeros((c.n_layers, c.attention.n_heads))                  # (L, h) float64
    counted = 0
    for ids in texts:
        def on_pattern(a, name, total=total):
            total[_layer(name)] += a[..., :, 1:, 0].astype(np.float64).sum(-1)   # (h,) queries 1 … n − 1
        forward(model, ids, hooks={f"blocks.{i}.attn.hook_pattern": on_pattern for i in range(c.n_layers)},
                logits_to_keep=1)
        counted += ids.size - 1
    return total / counted                                              # (L, h)


@dataclass(frozen=True)
class FirstTokenRemoved:
    """Per-token loss of tokens 2 … n − 1 (predicted from queries 1 … n − 2), with and without token 0."""
    with_first: np.ndarray       # (n − 2,) nats
    without_first: np.ndarray    # (n − 2,) nats

    @property
    def increase(self) -> float:
        return float(self.without_first.mean() - self.with_first.mean())


def without_first_token(model: Transformer, ids) -> FirstTokenRemoved:
    """The loss of the text after its first token, with and without the first token's keys and values.

    Without them no layer of any later token can read token 0: that is a forward over ids[1:]. Its positions
    start at 0 rather than 1, which RoPE (and a model with no positions) cannot tell apart, since the scores
    see only offsets; a learned position table or sinusoids could, so those models are refused. Query 0's own
    prediction needs token 0, so both sides score the tokens 2 … n − 1.
    """
    check_decoder(model, "without_first_token")
    positions = model.config.attention.positions
    if positions.adds_rows:
        raise ValueError(f"without_first_token needs positions the scores see only as offsets (RoPE, ALiBi or "
                         f"none), got {type(positions).__name__}: dropping token 0 would move every row")
    ids = check_ids(model, ids)
    if ids.ndim != 1 or ids.size < 3:
        raise ValueError(f"ids must be one text (n,) of at least 3 tokens, got shape {ids.shape}")
    full = forward(model, ids).logits                                    # (n, V)
    cut = forward(model, ids[1:]).logits                                 # (n − 1, V)
    return FirstTokenRemoved(with_first=per_token_loss(full[1:-1], ids[2:]),
                             without_first=per_token_loss(cut[:-1], ids[2:]))


def sink_caches(model: Transformer, policy: SinkWindow) -> list[StreamingCache]:
    """One :class:`StreamingCache` per layer under ``policy``, each re-positioning by its layer's scheme."""
    check_decoder(model, "sink_caches")
    if not isinstance(policy, SinkWindow):
        raise TypeError(f"policy must be a SinkWindow, got {type(policy).__name__}")
    return [StreamingCache.empty(b.attn.config.n_kv_heads, policy.capacity, b.attn.config.d_head,
                                 dtype=model.dtype, policy=policy, positions=b.attn.config.positions)
            for b in model.blocks]


def streaming_loss(model: Transformer, ids, policy: SinkWindow | None, *, chunk: int = 1,
                   progress=None) -> np.ndarray:
    """−log p(ids[t + 1] | what the cache holds) for t = 0 … n − 2, (n − 1,) nats, reading ``chunk`` tokens a
    forward.

    ``policy`` None is the full cache (every token kept; n must fit n_ctx). Under a :class:`SinkWindow` each
    chunk first makes room (:meth:`StreamingCache.make_room`), then runs against what is kept: with ``chunk``
    = 1 that is StreamingLLM exactly (each query sees the sinks and the ``window`` most recent tokens, itself
    included); with ``chunk`` = c the queries of a chunk see the sinks and between window − c + 1 and window
    recent tokens. ``progress(done, total)`` is called after each chunk.
    """
    check_decoder(model, "streaming_loss")
    ids = (check_ids(model, ids) if policy is None else    # past n_ctx too: positions stay below the capacity
           as_token_ids("ids", ids, model.config.vocab_size))
    if ids.ndim != 1 or ids.size < 2:
        raise ValueError(f"ids must be one text (n,) of at least 2 tokens, got shape {ids.shape}")
    chunk = as_positive_int("chunk", chunk)
    if policy is not None and chunk > policy.window:
        raise ValueError(f"chunk must be at most the window ({policy.window}), got {chunk}")
    caches: list[KVCache] = new_caches(model, ids.size) if policy is None else sink_caches(model, policy)
    n = ids.size
    loss = np.empty(n - 1)                                              # (n − 1,)
    for s in range(0, n - 1, chunk):
        t = min(chunk, n - 1 - s)                                       # the last token predicts nothing
        for cache in caches:
            cache.make_room(t)
        logits = forward(model, ids[s:s + t], caches=caches).logits      # (t, V)
        loss[s:s + t] = per_token_loss(logits, ids[s + 1:s + t + 1])     # (t,)
        if progress is not None:
            progress(s + t, n - 1)
    return loss


def recomputed_loss(model: Transformer, ids, capacity: int, *, chunk: int = 1, progress=None) -> np.ndarray:
    """−log p(ids[t + 1] | ids[t + 1 − m … t]) for t = 0 … n − 2, (n − 1,), m at most ``capacity``, every
    context run afresh (no cache): the sliding window with re-computation that StreamingLLM compares against.

    The first ``capacity`` tokens are one forward (what every cache sees there); then each chunk of ``chunk``
    targets is the last ``chunk`` predictions of a forward over the ``capacity`` tokens ending at its last
    query, so its queries see between capacity − chunk + 1 and capacity tokens, as a sink + window cache's
    chunk does.
    """
    check_decoder(model, "recomputed_loss")
    ids = check_ids(model, ids)
    capacity, chunk = as_positive_int("capacity", capacity), as_positive_int("chunk", chunk)
    if ids.ndim != 1 or ids.size < 2:
        raise ValueError(f"ids must be one text (n,) of at least 2 tokens, got shape {ids.shape}")
    if chunk > capacity:
        raise ValueError(f"chunk must be at most the capacity ({capacity}), got {chunk}")
    n = ids.size
    head = min(capacity, n) - 1                                         # targets 1 … head: one forward
    loss = np.empty(n - 1)                                              # (n − 1,)
    loss[:head] = per_token_loss(forward(model, ids[:head + 1]).logits[:-1], ids[1:head + 1])
    for s in range(head, n - 1, chunk):
        t = min(chunk, n - 1 - s)                                       # queries s … s + t − 1
        context = ids[s + t - capacity:s + t]                           # (capacity,) ends at the last query
        logits = forward(model, context, logits_to_keep=t).logits       # (t, V)
        loss[s:s + t] = per_token_loss(logits, ids[s + 1:s + t + 1])
        if progress is not None:
            progress(s + t, n - 1)
    return loss


def _texts(model: Transformer, texts) -> list[np.ndarray]:
    if isinstance(texts, np.ndarray) and texts.ndim == 1:
        texts = [texts]
    out = [check_ids(model, t) for t in texts]
    for i, t in enumerate(out):
        if t.ndim != 1 or t.size < 2:
            raise ValueError(f"texts[{i}] must be token ids (n,) with n >= 2, got shape {t.shape}")
    if not out:
        raise ValueError("texts must hold at least one text")
    return out


def _layer(name: str) -> int:
    return int(name.split(".")[1])                                      # "blocks.{i}.attn.hook_pattern"
