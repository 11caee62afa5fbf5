"""The whole stack's backward, beside its forward: every block, the embeddings and the final norm.

:func:`forward_saved` runs the pass of :func:`attnlab.stack.transformer.forward` (no cache, no hooks) and
keeps, per piece, exactly what that piece's backward needs (each piece's ``forward`` / ``backward`` pair
lives beside it: :mod:`attnlab.stack.layers`, :func:`attnlab.layer.multihead.multihead_attention_forward`,
:func:`attnlab.stack.transformer.embed_forward`). :func:`backward` walks it in reverse from dL/d(the last
hidden state), each step naming the forward line it undoes, and returns dL/d(every parameter) by the names
of :meth:`Transformer.params`, and dL/d(any named activation asked for), by the hook names of
:mod:`attnlab.stack.hooks` (``blocks.3.attn.hook_z``, ``blocks.0.hook_resid_pre``, …).

A block, forward and backward::

    pre-norm (GPT-2, Llama)               post-norm (BERT)
    x1 = x + attn(ln_1(x))                x1 = ln_1(x + attn(x))
    x2 = x1 + mlp(ln_2(x1))               x2 = ln_2(x1 + mlp(x1))
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..layer.multihead import multihead_attention_backward_named, multihead_attention_forward
from .hooks import LAYER_HOOKS, hook_names
from .transformer import ATTENTION_PARAMS, Block, ModelConfig, SavedEmbedding, Transformer, check_ids, \
    embed_backward, embed_forward

# the named activations a backward gives gradients for: every hook but the (n, n_k) grids
GRAD_HOOKS = tuple(h for h in LAYER_HOOKS if h not in ("attn.hook_scores", "attn.hook_pattern"))


@dataclass(frozen=True, eq=False)
class SavedBlock:
    """What :func:`block_forward_saved` keeps for :func:`block_backward`: each piece's own saved forward."""
    ln_1: tuple | None
    attn: object                 # a SavedLayer
    ln_2: tuple | None
    mlp: tuple | None


@dataclass(frozen=True, eq=False)
class Tape:
    """A forward pass kept for its backward: the embedding's, each block's and the final norm's saved forward."""
    embedding: SavedEmbedding
    blocks: tuple[SavedBlock, ...]
    final: tuple | None          # ln_final's saved forward
    hidden: np.ndarray           # (..., n, d_model) the last hidden state (after ln_final)


def _maybe(piece, x):
    """``piece.forward(x)``, or x itself and nothing saved when the block has no such piece."""
    return (x, None) if piece is None else piece.forward(x)


def _maybe_back(piece, saved, dy, grads: dict, prefix: str):
    """``piece.backward``, its grads into ``grads`` under ``prefix``; dy itself without the piece."""
    if piece is None:
        return dy
    dx, g = piece.backward(saved, dy)
    grads.update({prefix + k: v for k, v in g.items()})
    return dx


def block_forward_saved(block: Block, x: np.ndarray, config: ModelConfig):
    """One block on x (..., n, d_model), as :func:`attnlab.stack.transformer.block_forward` runs it without
    a cache: ``(x_out, saved)``."""
    if config.pre_norm:
        h, s1 = _maybe(block.ln_1, x)                                    # (..., n, d_model)
        y, sa = multihead_attention_forward(block.attn, h, is_causal=config.is_causal)
        x = x + y                                                        # (..., n, d_model)
        if block.mlp is None:
            return x, SavedBlock(s1, sa, None, None)
        h, s2 = _maybe(block.ln_2, x)                                    # (..., n, d_model)
        m, sm = block.mlp.forward(h)                                     # (..., n, d_model)
        return x + m, SavedBlock(s1, sa, s2, sm)
    y, sa = multihead_attention_forward(block.attn, x, is_causal=config.is_causal)
    x, s1 = _maybe(block.ln_1, x + y)                                    # (..., n, d_model)
    if block.mlp is None:
        return x, SavedBlock(s1, sa, None, None)
    m, sm = block.mlp.forward(x)                                         # (..., n, d_model)
    x, s2 = _maybe(block.ln_2, x + m)                                    # (..., n, d_model)
    return x, SavedBlock(s1, sa, s2, sm)


def block_backward(block: Block, saved: SavedBlock, dx: np.ndarray, config: ModelConfig, grads: dict,
                   named: dict, prefix: str) -> np.ndarray:
    """Backward of :func:`block_forward_saved` from dL/dx_out: dL/dx_in. The block's parameter gradients go
    into ``grads`` and its named activations' into ``named``, under ``prefix`` ("blocks.3.")."""
    named[prefix + "hook_resid_post"] = dx
    pre = config.pre_norm
    if block.mlp is not None:
        if pre:
            # forward: x2 = x1 + m, m = mlp(ln_2(x1)): the residual passes dx through, the MLP adds its part
            named[prefix + "hook_mlp_out"] = dx
            dh = block.mlp.backward(saved.mlp, dx)
            grads.update({f"{prefix}mlp.{k}": v for k, v in dh[1].items()})
            dx = dx + _maybe_back(block.ln_2, saved.ln_2, dh[0], grads, prefix + "ln_2.")
        else:
            # forward: x2 = ln_2(x1 + m), m = mlp(x1)
            dx = _maybe_back(block.ln_2, saved.ln_2, dx, grads, prefix + "ln_2.")
            named[prefix + "hook_mlp_out"] = dx
            dm, g = block.mlp.backward(saved.mlp, dx)
            grads.update({f"{prefix}mlp.{k}": v for k, v in g.items()})
            dx = dx + dm
    if not pre:
        # forward: x1 = ln_1(x + y)
        dx = _maybe_back(block.ln_1, saved.ln_1, dx, grads, prefix + "ln_1.")
    # forward: x1 = x + y, y = attn(ln_1(x)) (pre-norm) or attn(x) (post-norm)
    named[prefix + "hook_attn_out"] = dx
    dh, g, acts = multihead_attention_backward_named(block.attn, saved.attn, dx)
    grads.update({f"{prefix}attn.{k}": getattr(g, k) for k in ATTENTION_PARAMS})
    named.update({f"{prefix}attn.{k}": v for k, v in acts.items()})
    if pre:
        dh = _maybe_back(block.ln_1, saved.ln_1, dh, grads, prefix + "ln_1.")
    dx = dx + dh                                                         # (..., n, d_model)
    named[prefix + "hook_resid_pre"] = dx
    return dx


def forward_saved(model: Transformer, ids, *, token_types=None) -> Tape:
    """The forward pass of ``ids`` (..., n), keeping what :func:`backward` needs."""
    ids = check_ids(model, ids)                                          # (..., n)
    x, emb = embed_forward(model, ids, token_types=token_types)          # (..., n, d_model)
    blocks = []
    for block in model.blocks:
        x, s = block_forward_saved(block, x, model.config)               # (..., n, d_model)
        blocks.append(s)
    x, final = _maybe(model.ln_final, x)                                 # (..., n, d_model)
    return Tape(embedding=emb, blocks=tuple(blocks), final=final, hidden=x)


def check_grad_names(model: Transformer, grad_names) -> tuple[str, ...]:
    """``grad_names`` as a tuple of activation names the backward can give (every hook but the grids)."""
    if isinstance(grad_names, str) or not all(isinstance(n, str) for n in grad_names):
        raise TypeError("grad_names must be a list of activation names (see attnlab.stack.hooks.hook_names)")
    known = [n for n in hook_names(model) if not n.endswith(("hook_scores", "hook_pattern"))]
    bad = [n for n in grad_names if n not in known]
    if bad:
        raise ValueError(f"grad_names has {bad}, which the backward does not give; it gives {known[:4]} … "
                         f"(every hook name but hook_scores and hook_pattern)")
    return tuple(grad_names)


def backward(model: Transformer, tape: Tape, d_hidden: np.ndarray, *, grad_names=()):
    """dL/d(every parameter) and dL/d(the named activations ``grad_names``) from dL/d ``tape.hidden``.

    Returns ``(grads, named)``: two dicts, by the names of :meth:`Transformer.params` (the unembedding is
    not part of the stack; the caller adds its own) and by the hook names asked for.
    """
    names = check_grad_names(model, grad_names)
    grads, named = {}, {}
    # forward: hidden = ln_final(x)
    named["ln_final.hook_normalized"] = d_hidden
    dx = _maybe_back(model.ln_final, tape.final, d_hidden, grads, "ln_final.")
    for i in reversed(range(model.config.n_layers)):
        dx = block_backward(model.blocks[i], tape.blocks[i], dx, model.config, grads, named, f"blocks.{i}.")
    grads.update(embed_backward(model, tape.embedding, dx))
    return grads, {n: named[n] for n in names}
