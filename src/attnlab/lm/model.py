"""A small attention-only language model: the guide's pieces stacked, and trained.

    x = W_E[ids] + positions                      (B, n, d_model)   the guide's X, with W_P or sinusoids
    x = x + MultiHeadAttention(x, causal)          × n_layers        attention with W_O, and a residual
    logits = x @ W_U + b_U                         (B, n, vocab)     one prediction per position
    loss = cross-entropy of the next token

RoPE and ALiBi add nothing to x: they act inside attention (rotated q and k; a bias on the scores).
There is no MLP and no layer norm: the guide's attention and nothing else, so what the model learns
beyond the bigram floor it learns by looking back. The backward pass is written by hand, each line
naming the forward line it undoes; each layer's backward reuses what its forward kept
(:func:`attnlab.multihead.multihead_attention_forward` and ``multihead_attention_backward``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._checks import as_float_array, as_positive_int, as_token_ids, check_rng
from ..cache import KVCache
from ..config import AttentionConfig
from ..multihead import (MultiHeadAttention, multihead_attention, multihead_attention_backward,
                         multihead_attention_forward)
from ..positions import alibi_bias, alibi_slopes, check_scheme, learned_positions, sinusoidal_positions
from ..sampling import check_temperature, sample_next


@dataclass(frozen=True)
class LMConfig:
    """The sizes of the model. Defaults are small enough to train in numpy in a minute."""
    vocab_size: int                  # distinct tokens (characters or words) of the training text
    d_model: int = 64                # width of each token's vector
    n_heads: int = 4                 # heads per layer; d_head = d_model / n_heads
    n_layers: int = 2                # two layers let a head build on what an earlier one moved
    n_ctx: int = 64                  # tokens per training window; the learned table has this many rows
    positions: str = "learned"       # learned | sinusoidal | rope | alibi

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_heads", "n_layers", "n_ctx"):
            as_positive_int(name, getattr(self, name))
        check_scheme(self.positions)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.positions == "rope" and self.d_head % 2:
            raise ValueError(f"rope needs an even d_head (features rotate in pairs), got {self.d_head}")
        if self.positions == "sinusoidal" and self.d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model (sin and cos pairs), got {self.d_model}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def attention(self) -> AttentionConfig:
        return AttentionConfig(d_model=self.d_model, n_heads=self.n_heads, n_ctx=self.n_ctx)


@dataclass(frozen=True, eq=False)
class AttentionLM:
    """The parameters. Gradients come back in the same structure, so an optimizer walks both alike."""
    config: LMConfig
    W_E: np.ndarray                          # (vocab, d_model) token embeddings
    W_P: np.ndarray | None                   # (n_ctx, d_model) learned positions, or None for the others
    layers: tuple[MultiHeadAttention, ...]   # n_layers attention layers, each with W_O
    W_U: np.ndarray                          # (d_model, vocab) unembedding
    b_U: np.ndarray                          # (vocab,)

    def __post_init__(self):
        c = self.config
        if not isinstance(c, LMConfig):
            raise TypeError(f"config must be a LMConfig, got {type(c).__name__}")
        object.__setattr__(self, "layers", tuple(self.layers))
        if len(self.layers) != c.n_layers:
            raise ValueError(f"the config has n_layers {c.n_layers}, got {len(self.layers)} layers")
        expected = {"W_E": (c.vocab_size, c.d_model), "W_U": (c.d_model, c.vocab_size), "b_U": (c.vocab_size,),
                    "W_P": (c.n_ctx, c.d_model) if c.positions == "learned" else None}
        for name, shape in expected.items():
            if getattr(self, name) is not None:
                object.__setattr__(self, name, as_float_array(name, getattr(self, name)))
            got = None if getattr(self, name) is None else getattr(self, name).shape
            if got != shape:
                raise ValueError(f"{name} must have shape {shape} for this config, got {got}")
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, MultiHeadAttention):
                raise TypeError(f"layers[{i}] must be a MultiHeadAttention, got {type(layer).__name__}")
            if (layer.W_Q.shape, layer.n_heads) != ((c.d_model, c.d_model), c.n_heads):
                raise ValueError(f"layers[{i}] has W_Q {layer.W_Q.shape} and n_heads {layer.n_heads}, the config "
                                 f"asks for ({c.d_model}, {c.d_model}) and {c.n_heads}")

    @classmethod
    def init(cls, config: LMConfig, *, rng: np.random.Generator, std: float = 0.02,
             dtype=np.float32) -> "AttentionLM":
        """Weights from N(0, std²) as GPT-2 initialises them, zero biases."""
        if not isinstance(config, LMConfig):
            raise TypeError(f"config must be a LMConfig, got {type(config).__name__}")
        check_rng(rng)
        c = config
        draw = lambda *shape: rng.normal(0.0, std, shape).astype(dtype)   # noqa: E731
        layers = tuple(MultiHeadAttention.init(c.attention, rng=rng, std=std, dtype=dtype)
                       for _ in range(c.n_layers))
        return cls(config=c, W_E=draw(c.vocab_size, c.d_model),
                   W_P=draw(c.n_ctx, c.d_model) if c.positions == "learned" else None,
                   layers=layers, W_U=draw(c.d_model, c.vocab_size), b_U=np.zeros(c.vocab_size, dtype))

    @property
    def dtype(self) -> np.dtype:
        return self.W_E.dtype

    @property
    def n_params(self) -> int:
        return sum(a.size for a in self.params().values())

    def params(self) -> dict[str, np.ndarray]:
        """Every array by name ("W_E", "layers.0.W_Q", …): the arrays themselves, not copies."""
        return {name: self._lookup(name) for name in param_names(self.config)}

    def _lookup(self, name: str) -> np.ndarray:
        if name.startswith("layers."):
            _, i, field = name.split(".")
            return getattr(self.layers[int(i)], field)
        return getattr(self, name)

    @classmethod
    def from_params(cls, config: LMConfig, params: dict) -> "AttentionLM":
        """The inverse of :meth:`params`; refuses missing or extra names and wrong shapes."""
        expected = set(param_names(config))
        if set(params) != expected:
            missing, extra = sorted(expected - set(params)), sorted(set(params) - expected)
            raise ValueError(f"the weights do not fit the config {config}: missing {missing}, extra {extra}")
        layers = tuple(MultiHeadAttention(**{n: params[f"layers.{i}.{n}"] for n in LAYER_PARAMS},
                                          n_heads=config.n_heads) for i in range(config.n_layers))
        return cls(config=config, W_E=params["W_E"], W_P=params.get("W_P"), layers=layers,
                   W_U=params["W_U"], b_U=params["b_U"])


LAYER_PARAMS = ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O")


def param_names(config: LMConfig) -> list[str]:
    """The names :meth:`AttentionLM.params` uses, in order: "W_E", ["W_P"], "layers.0.W_Q", …, "W_U", "b_U"."""
    names = ["W_E"] + (["W_P"] if config.positions == "learned" else [])
    names += [f"layers.{i}.{n}" for i in range(config.n_layers) for n in LAYER_PARAMS]
    return names + ["W_U", "b_U"]


def embed(model: AttentionLM, ids: np.ndarray, *, start: int = 0) -> np.ndarray:
    """The first layer's input: token rows plus, for learned and sinusoidal, the position rows."""
    c, n = model.config, ids.shape[-1]
    x = model.W_E[ids]                                                   # (..., n, d_model)
    if c.positions == "learned":
        x = x + learned_positions(model.W_P, n, start=start)             # (..., n, d_model)
    elif c.positions == "sinusoidal":
        x = x + sinusoidal_positions(n, c.d_model, start=start, dtype=model.dtype)   # (..., n, d_model)
    return x


def attention_options(model: AttentionLM, n: int, n_k: int) -> dict:
    """What every layer's attention takes: causal, plus RoPE's rotation or ALiBi's bias."""
    c = model.config
    bias = None
    if c.positions == "alibi":
        bias = alibi_bias(alibi_slopes(c.n_heads), n, n_k).astype(model.dtype)   # (h, n, n_k)
    return {"is_causal": True, "rope": c.positions == "rope", "bias": bias}


def forward(model: AttentionLM, ids, *, caches: list[KVCache] | None = None) -> np.ndarray:
    """Logits (..., n, vocab) for token ids (..., n). With ``caches`` (one per layer, see :func:`new_caches`)
    the ids are the next tokens after those already cached: one decode step per call."""
    ids = as_token_ids("ids", ids, model.config.vocab_size)
    if caches is not None and len(caches) != model.config.n_layers:
        raise ValueError(f"caches must hold one KVCache per layer ({model.config.n_layers}), got {len(caches)}")
    start = 0 if caches is None else caches[0].length
    n = ids.shape[-1]
    opts = attention_options(model, n, start + n)
    x = embed(model, ids, start=start)                                   # (..., n, d_model)
    for i, layer in enumerate(model.layers):
        x = x + multihead_attention(layer, x, cache=None if caches is None else caches[i], **opts)   # (..., n, d)
    return x @ model.W_U + model.b_U                                     # (..., n, vocab)


def new_caches(model: AttentionLM, capacity: int, *, batch_shape: tuple = ()) -> list[KVCache]:
    """One empty KV cache per layer, room for ``capacity`` tokens (at most n_ctx with a learned table)."""
    capacity = as_positive_int("capacity", capacity)
    if model.config.positions == "learned" and capacity > model.config.n_ctx:
        learned_positions(model.W_P, capacity)                           # raises: position n_ctx has no row
    return [layer.new_cache(capacity, batch_shape=batch_shape) for layer in model.layers]


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean of −log p(target) over every position, and its gradient with respect to the logits."""
    z = logits - logits.max(-1, keepdims=True)                           # (..., vocab) softmax sees differences
    log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))                 # (..., vocab) log-softmax
    picked = np.take_along_axis(log_p, targets[..., None], -1)[..., 0]   # (...) log p of each target
    dlogits = np.exp(log_p)                                              # (..., vocab) predicted probabilities
    np.put_along_axis(dlogits, targets[..., None], np.take_along_axis(dlogits, targets[..., None], -1) - 1, -1)
    return float(-picked.mean()), dlogits / targets.size                 # predicted minus correct, over N


def loss(model: AttentionLM, ids, targets) -> float:
    """Cross-entropy of ``targets`` (..., n) given ``ids`` (..., n), in nats per token."""
    logits = forward(model, ids)                                         # (..., n, vocab)
    return cross_entropy(logits, check_targets(targets, logits.shape[:-1], model.config.vocab_size))[0]


def check_targets(targets, shape: tuple, vocab_size: int) -> np.ndarray:
    """``targets`` as token ids of the vocabulary, with the shape of the ids they follow."""
    targets = as_token_ids("targets", targets, vocab_size)
    if targets.shape != shape:
        raise ValueError(f"targets must have the shape of ids {shape}, got {targets.shape}")
    return targets


def loss_and_grad(model: AttentionLM, ids, targets) -> tuple[float, AttentionLM]:
    """The cross-entropy loss of ``targets`` given ``ids``, and its gradient with respect to every parameter.

    One forward pass keeps each layer's saved forward (:func:`attnlab.multihead.multihead_attention_forward`); the
    backward then walks the layers in reverse, the residual passing dx straight through.

    Parameters
    ----------
    model : AttentionLM
    ids, targets : int arrays (..., n)
        Token ids and the token expected at each position (usually ids shifted by one).

    Returns
    -------
    loss : float
        Mean −log p(target) over every position, in nats per token (as :func:`loss`).
    grads : AttentionLM
        dL/dW_E, dL/dW_P (None unless positions are learned), each layer's gradients, dL/dW_U, dL/db_U.

    Raises
    ------
    ValueError, TypeError
        When ids or targets are not token ids of the vocabulary, or their shapes differ.
    """
    c = model.config
    ids = as_token_ids("ids", ids, c.vocab_size)
    targets = check_targets(targets, ids.shape, c.vocab_size)
    n = ids.shape[-1]
    opts = attention_options(model, n, n)
    x = embed(model, ids)                                                # (..., n, d_model) residual stream
    saved = []                                                           # each layer's forward, for its backward
    for layer in model.layers:
        y, s = multihead_attention_forward(layer, x, **opts)             # (..., n, d_model)
        x = x + y                                                        # (..., n, d_model)
        saved.append(s)
    value, dlogits = cross_entropy(x @ model.W_U + model.b_U, targets)   # (..., n, vocab)
    # forward: logits = x_L @ W_U + b_U
    V, d = c.vocab_size, c.d_model
    dW_U = x.reshape(-1, d).T @ dlogits.reshape(-1, V)                   # (d_model, vocab)
    db_U = dlogits.reshape(-1, V).sum(0)                                 # (vocab,)
    dx = dlogits @ model.W_U.T                                           # (..., n, d_model)
    grads = []
    for layer, s in zip(reversed(model.layers), reversed(saved)):
        # forward: x_out = x + multihead_attention(layer, x): the residual passes dx straight through
        dx_attn, g = multihead_attention_backward(layer, s, dx)          # (..., n, d_model), layer grads
        dx += dx_attn                                                    # (..., n, d_model)
        grads.append(g)
    # forward: x_0 = W_E[ids] + W_P[0 … n−1]
    dW_E = np.zeros_like(model.W_E)                                      # (vocab, d_model)
    np.add.at(dW_E, ids.reshape(-1), dx.reshape(-1, d))                  # each token's row gets its positions'
    dW_P = None
    if c.positions == "learned":
        dW_P = np.zeros_like(model.W_P)                                  # (n_ctx, d_model)
        dW_P[:n] = dx.reshape(-1, n, d).sum(0)                           # (n, d_model) summed over the batch
    return value, AttentionLM(config=c, W_E=dW_E, W_P=dW_P, layers=tuple(reversed(grads)), W_U=dW_U, b_U=db_U)


def generate(model: AttentionLM, prompt, n_tokens: int, *, rng: np.random.Generator,
             temperature: float = 1.0) -> np.ndarray:
    """Sample ``n_tokens`` ids after ``prompt`` (n,), one decode step per token through the KV cache.

    The prompt goes through in one pass; each sampled token then costs one query against the cache.
    The model sees at most n_ctx tokens, as in training: when the cache is full it is emptied and the
    last n_ctx / 2 tokens are read again in one pass, then decoding goes on. ``temperature`` divides the
    logits (0 = always the most likely token). The prompt must fit n_ctx (with a learned table, the error
    names the position that has no row).
    """
    c = model.config
    prompt = as_token_ids("prompt", prompt, c.vocab_size)
    if prompt.ndim != 1:
        raise ValueError(f"prompt must be 1-D (n,), got shape {prompt.shape}")
    if prompt.size > c.n_ctx:
        if c.positions == "learned":
            learned_positions(model.W_P, prompt.size)                   # raises: position n_ctx has no row
        raise ValueError(f"the prompt has {prompt.size} tokens, more than the model's context n_ctx {c.n_ctx}")
    n_tokens = as_positive_int("n_tokens", n_tokens)
    temperature = check_temperature(temperature)
    check_rng(rng)
    tokens = np.concatenate([prompt, np.empty(n_tokens, prompt.dtype)])   # (n + n_tokens,)
    caches = new_caches(model, c.n_ctx)
    logits = forward(model, prompt, caches=caches)[-1]                     # (vocab,) after the whole prompt
    for t in range(prompt.size, tokens.size):
        tokens[t] = sample_next(logits, temperature, rng)
        if t + 1 == tokens.size:
            break
        if caches[0].length == c.n_ctx:                                    # full: re-read the recent half
            for cache in caches:
                cache.reset()
            logits = forward(model, tokens[t + 1 - max(1, c.n_ctx // 2):t + 1], caches=caches)[-1]
        else:
            logits = forward(model, tokens[t:t + 1], caches=caches)[-1]    # (vocab,) one decode step
    return tokens[prompt.size:]
