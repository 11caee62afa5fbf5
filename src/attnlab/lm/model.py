"""attnlab's own language model: the guide's pieces stacked on :mod:`attnlab.stack.transformer`, and trained.

    x = W_E[ids] + positions                      (B, n, d_model)   the guide's X, with W_P or sinusoids
    x = x + MultiHeadAttention(x, causal)          × n_layers        attention with W_O, and a residual
    logits = x @ W_U + b_U                         (B, n, vocab)     one prediction per position
    loss = cross-entropy of the next token

RoPE and ALiBi add nothing to x: they act inside attention (rotated q and k; a bias on the scores).
There is no MLP and no layer norm: the guide's attention and nothing else, so what the model learns
beyond the bigram floor it learns by looking back. The model is a :class:`attnlab.stack.transformer.Transformer`
(:func:`lm_config` states its shape); it runs through the stack's ``forward`` and ``generate`` like
GPT-2 does. The backward pass is written by hand, each line naming the forward line it undoes; each
layer's backward reuses what its forward kept (:func:`attnlab.layer.multihead.multihead_attention_forward`
and ``multihead_attention_backward``).
"""

from __future__ import annotations

import numpy as np

from ..kernels._checks import as_token_ids
from ..layer.config import AttentionConfig
from ..layer.multihead import multihead_attention_backward, multihead_attention_forward
from ..layer.positions import Learned, PositionScheme
from ..stack.transformer import ATTENTION_PARAMS, ModelConfig, Transformer, embed, forward

FAMILY = "attnlab"


def lm_config(vocab_size: int, *, d_model: int = 64, n_heads: int = 4, n_layers: int = 2, n_ctx: int = 64,
              positions: PositionScheme | None = None, d_head: int | None = None,
              n_kv_heads: int | None = None) -> ModelConfig:
    """The shape of attnlab's own LM: attention-only causal blocks, no norms, an untied unembedding with a
    bias. Defaults are small enough to train in numpy in a minute; d_head defaults to d_model / n_heads,
    positions to :class:`~attnlab.layer.positions.Learned`."""
    attention = AttentionConfig(d_model=d_model, n_heads=n_heads, d_head=d_head, n_kv_heads=n_kv_heads,
                                n_ctx=n_ctx, positions=Learned() if positions is None else positions)
    return ModelConfig(vocab_size=vocab_size, n_layers=n_layers, attention=attention, family=FAMILY)


def check_trainable(model: Transformer) -> None:
    """:func:`loss_and_grad` writes the backward of attnlab's own LM: attention-only blocks without norms,
    token types or a tied unembedding."""
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a Transformer, got {type(model).__name__}")
    c = model.config
    extra = [what for what, has in (("an MLP", c.d_mlp is not None), ("norms", c.norm is not None),
                                    ("token types", c.n_types > 0), ("tied embeddings", c.tied_embeddings),
                                    ("no logits", not c.has_logits), ("no causal mask", not c.is_causal),
                                    ("an embedding scale", c.embed_scale != 1.0),
                                    ("a logit soft-cap", c.logit_softcap is not None))
             if has]
    if extra:
        raise ValueError(f"loss_and_grad trains attention-only decoders (attnlab's own LM); this model has "
                         f"{', '.join(extra)}")


def cross_entropy(logits: np.ndarray, targets: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean of −log p(target) over every position, and its gradient with respect to the logits."""
    z = logits - logits.max(-1, keepdims=True)                           # (..., vocab) softmax sees differences
    log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))                 # (..., vocab) log-softmax
    picked = np.take_along_axis(log_p, targets[..., None], -1)[..., 0]   # (...) log p of each target
    dlogits = np.exp(log_p)                                              # (..., vocab) predicted probabilities
    np.put_along_axis(dlogits, targets[..., None], np.take_along_axis(dlogits, targets[..., None], -1) - 1, -1)
    return float(-picked.mean()), dlogits / targets.size                 # predicted minus correct, over N


def loss(model: Transformer, ids, targets) -> float:
    """Cross-entropy of ``targets`` (..., n) given ``ids`` (..., n), in nats per token."""
    logits = forward(model, ids).logits                                  # (..., n, vocab)
    return cross_entropy(logits, check_targets(targets, logits.shape[:-1], model.config.vocab_size))[0]


def check_targets(targets, shape: tuple, vocab_size: int) -> np.ndarray:
    """``targets`` as token ids of the vocabulary, with the shape of the ids they follow."""
    targets = as_token_ids("targets", targets, vocab_size)
    if targets.shape != shape:
        raise ValueError(f"targets must have the shape of ids {shape}, got {targets.shape}")
    return targets


def loss_and_grad(model: Transformer, ids, targets) -> tuple[float, dict[str, np.ndarray]]:
    """The cross-entropy loss of ``targets`` given ``ids``, and its gradient with respect to every parameter.

    One forward pass keeps each layer's saved forward (:func:`attnlab.layer.multihead.multihead_attention_forward`); the
    backward then walks the layers in reverse, the residual passing dx straight through.

    Parameters
    ----------
    model : Transformer
        attnlab's own LM (see :func:`lm_config`): attention-only blocks.
    ids, targets : int arrays (..., n)
        Token ids and the token expected at each position (usually ids shifted by one).

    Returns
    -------
    loss : float
        Mean −log p(target) over every position, in nats per token (as :func:`loss`).
    grads : dict
        dL/d(every parameter), by the names of :meth:`Transformer.params` and in their shapes.

    Raises
    ------
    ValueError, TypeError
        When ids or targets are not token ids of the vocabulary, or their shapes differ, or the model is
        not attention-only.
    """
    check_trainable(model)
    c = model.config
    ids = as_token_ids("ids", ids, c.vocab_size)
    targets = check_targets(targets, ids.shape, c.vocab_size)
    n = ids.shape[-1]
    layers = [b.attn for b in model.blocks]
    x = embed(model, ids)                                                # (..., n, d_model) residual stream
    saved = []                                                           # each layer's forward, for its backward
    for layer in layers:
        y, s = multihead_attention_forward(layer, x, is_causal=True)     # (..., n, d_model)
        x = x + y                                                        # (..., n, d_model)
        saved.append(s)
    value, dlogits = cross_entropy(x @ model.W_U + model.b_U, targets)   # (..., n, vocab)
    # forward: logits = x_L @ W_U + b_U
    V, d = c.vocab_size, c.d_model
    dW_U = x.reshape(-1, d).T @ dlogits.reshape(-1, V)                   # (d_model, vocab)
    db_U = dlogits.reshape(-1, V).sum(0)                                 # (vocab,)
    dx = dlogits @ model.W_U.T                                           # (..., n, d_model)
    grads = {}
    for i, layer, s in zip(reversed(range(len(layers))), reversed(layers), reversed(saved)):
        # forward: x_out = x + multihead_attention(layer, x): the residual passes dx straight through
        dx_attn, g = multihead_attention_backward(layer, s, dx)          # (..., n, d_model), layer grads
        dx += dx_attn                                                    # (..., n, d_model)
        grads.update({f"blocks.{i}.attn.{k}": getattr(g, k) for k in ATTENTION_PARAMS})
    # forward: x_0 = W_E[ids] + W_P[0 … n−1]
    dW_E = np.zeros_like(model.W_E)                                      # (vocab, d_model)
    np.add.at(dW_E, ids.reshape(-1), dx.reshape(-1, d))                  # each token's row gets its positions'
    grads.update(W_E=dW_E, W_U=dW_U, b_U=db_U)
    if model.W_P is not None:
        dW_P = np.zeros_like(model.W_P)                                  # (n_ctx, d_model)
        dW_P[:n] = dx.reshape(-1, n, d).sum(0)                           # (n, d_model) summed over the batch
        grads["W_P"] = dW_P
    return value, {name: grads[name] for name in model.params()}         # in the order of the parameters
