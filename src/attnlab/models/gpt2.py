"""GPT-2 (Radford et al., 2019) of any size, read from a Hugging Face safetensors checkpoint.

One block, pre-norm::

    x = x + Attention(LN_1(x))        causal, through attnlab's multi-head attention
    x = x + MLP(LN_2(x))              GELU, tanh form

then ``LN_f`` and the logits ``x W_Eᵀ`` (``lm_head`` is tied to ``wte``). Conv1D weights are stored as
[in, out], which is attnlab's own layout: no transposes. Keys load with or without ``transformer.``.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np

from .._checks import as_positive_int
from ..cache import KVCache
from ..multihead import MultiHeadAttention
from ..sampling import check_temperature, sample_next
from .checkpoint import Tensors, check_layer_count, config_float, config_int
from .layers import MLP, LayerNorm, activation_name
from .output import ModelOutput, attention_and_weights, check_ids, check_model


@dataclass(frozen=True)
class GPT2Config:
    """Sizes of a GPT-2, from config.json (HF names in the comments)."""
    n_layers: int            # n_layer
    n_heads: int             # n_head
    d_model: int             # n_embd
    n_ctx: int               # n_positions: rows of W_P, so the longest input
    vocab_size: int
    d_mlp: int               # n_inner, or 4·n_embd when null
    ln_eps: float = 1e-5     # layer_norm_epsilon
    activation: str = "gelu_new"   # activation_function: GPT-2's tanh GELU

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")

    @classmethod
    def from_json(cls, config: dict, source: str) -> "GPT2Config":
        for key, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                        ("add_cross_attention", False)):
            if config.get(key, ok) != ok:
                raise ValueError(f"{source}: config.json sets {key}={config[key]!r}; attnlab reads GPT-2 with "
                                 f"{key}={ok}")
        n = lambda key, default=None: config_int(config, key, source, default)   # noqa: E731
        d_model = n("n_embd")
        return cls(n_layers=n("n_layer"), n_heads=n("n_head"), d_model=d_model, n_ctx=n("n_positions"),
                   vocab_size=n("vocab_size"), d_mlp=n("n_inner", None) if config.get("n_inner") else 4 * d_model,
                   ln_eps=config_float(config, "layer_norm_epsilon", source, 1e-5),
                   activation=activation_name(config, "activation_function", source))


@dataclass(frozen=True, eq=False)
class GPT2Block:
    ln_1: LayerNorm
    attn: MultiHeadAttention
    ln_2: LayerNorm
    mlp: MLP


@dataclass(frozen=True, eq=False)
class GPT2:
    """A GPT-2's parameters. ``gpt2(ids)`` runs the forward pass (see :func:`gpt2_forward`)."""
    config: GPT2Config
    W_E: np.ndarray          # (vocab_size, d_model) wte; also the unembedding (tied lm_head)
    W_P: np.ndarray          # (n_ctx, d_model) wpe
    blocks: tuple            # of GPT2Block
    ln_f: LayerNorm

    def __call__(self, ids, caches: tuple[KVCache, ...] | None = None, *,
                 return_weights: bool = False) -> ModelOutput:
        return gpt2_forward(self, ids, caches, return_weights=return_weights)

    def embed(self, ids, *, start: int = 0) -> np.ndarray:
        return gpt2_embed(self, ids, start=start)


def gpt2_embed(model: GPT2, ids, *, start: int = 0) -> np.ndarray:
    """Token ids (n,) at positions start, start + 1, … -> the first block's input X = W_E[ids] + W_P[positions]."""
    check_model(model, GPT2)
    ids = check_ids(ids, model.config.vocab_size, model.config.n_ctx, start=start)
    return model.W_E[ids] + model.W_P[start:start + len(ids)]     # (n, d_model)


def gpt2_forward(model: GPT2, ids, caches: tuple[KVCache, ...] | None = None, *,
                 return_weights: bool = False) -> ModelOutput:
    """Token ids (n,) -> hidden states (n_layers+1, n, d_model) and logits (n, vocab_size).

    With ``caches`` (one :class:`~attnlab.KVCache` per layer, from :func:`new_caches`) the ids continue the
    tokens already cached: they take the next positions, their keys and values are appended, and they
    attend to all ``n_k`` tokens so far. ``hidden_states[-1]`` has ``ln_f`` applied, as transformers
    returns it. ``return_weights=True`` also returns every head's weights as ``attentions``
    (n_layers, h, n, n_k); without it ``attentions`` is None and a long input takes attention's tiled
    path, which never builds the (n, n_k) grids.
    """
    check_model(model, GPT2)
    start = check_caches(caches, model.config.n_layers)
    x = gpt2_embed(model, ids, start=start)                # (n, d_model) X = W_E[ids] + W_P[positions]
    hidden, weights = [x], []
    for block, cache in zip(model.blocks, caches or itertools.repeat(None)):
        y, a = attention_and_weights(block.attn, block.ln_1(x), return_weights, is_causal=True,
                                     cache=cache)          # (n, d_model), (h, n, n_k) or None
        x = x + y                                          # (n, d_model)
        x = x + block.mlp(block.ln_2(x))                   # (n, d_model)
        hidden.append(x)
        weights.append(a)
    hidden[-1] = model.ln_f(x)                             # (n, d_model)
    logits = hidden[-1] @ model.W_E.T                      # (n, vocab_size)
    return ModelOutput(hidden_states=np.stack(hidden), logits=logits,   # (L+1, n, d_model), (n, vocab_size)
                       attentions=np.stack(weights) if return_weights else None)   # (L, h, n, n_k)


def new_caches(model: GPT2, capacity: int) -> tuple[KVCache, ...]:
    """One empty KV cache per layer, each with room for ``capacity`` tokens."""
    check_model(model, GPT2)
    capacity = as_positive_int("capacity", capacity)
    if capacity > model.config.n_ctx:
        raise ValueError(f"capacity must be at most the model's n_ctx={model.config.n_ctx}, got {capacity}")
    return tuple(block.attn.new_cache(capacity) for block in model.blocks)


def check_caches(caches, n_layers: int) -> int:
    """How many tokens the caches already hold (0 without caches); one cache per layer, all in step."""
    if caches is None:
        return 0
    if not isinstance(caches, (tuple, list)) or not all(isinstance(c, KVCache) for c in caches):
        raise TypeError("caches must be a tuple of KVCache, one per layer (see new_caches)")
    if len(caches) != n_layers:
        raise ValueError(f"caches must hold one KVCache per layer ({n_layers}), got {len(caches)}")
    lengths = {c.length for c in caches}
    if len(lengths) != 1:
        raise ValueError(f"caches must all hold the same number of tokens, got lengths {sorted(lengths)}")
    return lengths.pop()


def generate(model: GPT2, ids, n_new: int, *, temperature: float = 0.0,
             rng: np.random.Generator | None = None) -> np.ndarray:
    """``n_new`` token ids after the prompt ``ids``: greedy (``temperature=0``) or sampled with ``rng``.

    The prompt runs once; each new token is then one decode step against the layers' KV caches.
    """
    check_model(model, GPT2)
    cfg = model.config
    n_new = as_positive_int("n_new", n_new)
    temperature = check_temperature(temperature)
    ids = check_ids(ids, cfg.vocab_size, cfg.n_ctx)
    if len(ids) + n_new - 1 > cfg.n_ctx:
        raise ValueError(f"n_new={n_new} after a prompt of {len(ids)} tokens needs {len(ids) + n_new - 1} "
                         f"positions, but the model has only n_ctx={cfg.n_ctx}")
    caches = new_caches(model, len(ids) + n_new - 1)
    logits = gpt2_forward(model, ids, caches).logits          # (n, vocab)
    new = [sample_next(logits[-1], temperature, rng)]
    while len(new) < n_new:
        logits = gpt2_forward(model, new[-1:], caches).logits  # (1, vocab) one decode step
        new.append(sample_next(logits[-1], temperature, rng))
    return np.array(new, np.int64)                             # (n_new,)


def load_gpt2(tensors: Tensors, config: dict) -> GPT2:
    """A :class:`GPT2` from a checkpoint's tensors and its config.json."""
    cfg = GPT2Config.from_json(config, tensors.source)
    t = tensors.strip_prefix("transformer.")
    check_layer_count(t, r"h\.(\d+)\.", cfg.n_layers, "n_layer")
    d, d_mlp = cfg.d_model, cfg.d_mlp
    why = f"n_embd={d}, MLP width {d_mlp}"

    norm = functools.partial(LayerNorm.load, t, d_model=d, eps=cfg.ln_eps, why=why)   # norm(prefix)

    def conv1d(prefix: str, d_in: int, d_out: int) -> tuple[np.ndarray, np.ndarray]:
        return t.take(f"{prefix}.weight", (d_in, d_out), why), t.take(f"{prefix}.bias", (d_out,), why)

    def block(i: int) -> GPT2Block:
        p = f"h.{i}"
        attn = MultiHeadAttention.from_gpt2(*conv1d(f"{p}.attn.c_attn", d, 3 * d), *conv1d(f"{p}.attn.c_proj", d, d),
                                            n_heads=cfg.n_heads)
        mlp = MLP(*conv1d(f"{p}.mlp.c_fc", d, d_mlp), *conv1d(f"{p}.mlp.c_proj", d_mlp, d), cfg.activation)
        return GPT2Block(ln_1=norm(f"{p}.ln_1"), attn=attn, ln_2=norm(f"{p}.ln_2"), mlp=mlp)

    W_E = t.take("wte.weight", (cfg.vocab_size, d), f"vocab_size={cfg.vocab_size}, {why}")
    if "lm_head.weight" in t.arrays and not np.array_equal(t.arrays["lm_head.weight"], W_E):
        raise ValueError(f"{t.source}: tensor 'lm_head.weight' differs from 'wte.weight'; attnlab reads GPT-2 "
                         "with the unembedding tied to the embedding")
    return GPT2(config=cfg, W_E=W_E, W_P=t.take("wpe.weight", (cfg.n_ctx, d), f"n_positions={cfg.n_ctx}, {why}"),
                blocks=tuple(block(i) for i in range(cfg.n_layers)), ln_f=norm("ln_f"))
