"""The whole stack's backward, beside its forward: the embeddings, every block, the final norm.

:func:`forward_saved` runs the pass of :func:`attnlab.stack.transformer.forward` (no cache, no hooks) and
keeps, per piece, exactly what that piece's backward needs; each piece's pair lives beside it (the block
kinds' ``forward_saved`` / ``backward`` in :mod:`attnlab.stack.blocks`, the norms' and MLPs' in
:mod:`attnlab.stack.layers`, attention's in :mod:`attnlab.layer.multihead`,
:func:`attnlab.stack.transformer.embed_forward` / ``embed_backward``). :func:`backward` walks it in reverse
from dL/d(the last hidden state) and returns dL/d(every parameter) by the names of
:meth:`Transformer.params`, and dL/d(any named activation asked for) by the hook names of
:mod:`attnlab.stack.hooks` (``blocks.3.attn.hook_z``, ``blocks.0.hook_resid_pre``, …).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .transformer import SavedEmbedding, Transformer, check_ids, embed_backward, embed_forward, hook_names

# hook points the backward gives no gradient at: the (n, n_k) grids (the tiled path never builds them), the
# norms' divisors and the MLPs' hidden layers
NOT_DIFFERENTIATED = ("hook_scores", "hook_pattern", "hook_scale", "mlp.hook_pre", "mlp.hook_post")


@dataclass(frozen=True, eq=False)
class Tape:
    """A forward pass kept for its backward: the embedding's, each block's and the final norm's saved forward."""
    embedding: SavedEmbedding
    blocks: tuple                # one dict per block, from the block's forward_saved
    final: tuple | None          # ln_final's saved forward
    hidden: np.ndarray           # (..., n, d_model) the last hidden state (after ln_final)


def forward_saved(model: Transformer, ids, *, token_types=None) -> Tape:
    """The forward pass of ``ids`` (..., n), keeping what :func:`backward` needs."""
    ids = check_ids(model, ids)                                          # (..., n)
    x, emb = embed_forward(model, ids, token_types=token_types)          # (..., n, d_model)
    blocks = []
    for block in model.blocks:
        x, s = block.forward_saved(x, is_causal=model.config.is_causal)  # (..., n, d_model)
        blocks.append(s)
    final = None
    if model.ln_final is not None:
        x, final = model.ln_final.forward(x)                             # (..., n, d_model)
    return Tape(embedding=emb, blocks=tuple(blocks), final=final, hidden=x)


def grad_hook_names(model: Transformer) -> list[str]:
    """The activation names :func:`backward` gives gradients for: every hook name but those of
    :data:`NOT_DIFFERENTIATED`, and the embedding's (``hook_embed``, ``hook_pos_embed``: ask for
    ``blocks.0.hook_resid_pre``)."""
    return [n for n in hook_names(model) if n.startswith(("blocks.", "ln_")) and not n.endswith(NOT_DIFFERENTIATED)]


def check_grad_names(model: Transformer, grad_names) -> tuple[str, ...]:
    """``grad_names`` as a tuple of activation names the backward gives (see :func:`grad_hook_names`)."""
    if isinstance(grad_names, str) or not all(isinstance(n, str) for n in grad_names):
        raise TypeError("grad_names must be a list of activation names (see attnlab.stack.hooks.hook_names)")
    known = grad_hook_names(model)
    bad = [n for n in grad_names if n not in known]
    if bad:
        raise ValueError(f"grad_names has {bad}, which the backward does not give; it gives {known[:4]} … "
                         f"(see attnlab.stack.backward.grad_hook_names)")
    return tuple(grad_names)


def backward(model: Transformer, tape: Tape, d_hidden: np.ndarray, *, grad_names=()):
    """dL/d(every parameter) and dL/d(the named activations ``grad_names``) from dL/d ``tape.hidden``.

    Returns ``(grads, named)``: two dicts, by the names of :meth:`Transformer.params` (the unembedding is
    not part of the stack: the caller adds its own) and by the hook names asked for.
    """
    names = check_grad_names(model, grad_names)
    grads, named = {}, {}
    dx = d_hidden                                                        # (..., n, d_model)
    if model.ln_final is not None:
        # forward: hidden = ln_final(x)
        named["ln_final.hook_normalized"] = dx
        dx, g = model.ln_final.backward(tape.final, dx)                  # (..., n, d_model)
        grads.update({f"ln_final.{k}": v for k, v in g.items()})
    for i in reversed(range(model.config.n_layers)):
        # forward: x = block_i.forward(x)
        dx, g, points = model.blocks[i].backward(tape.blocks[i], dx)     # (..., n, d_model)
        grads.update({f"blocks.{i}.{k}": v for k, v in g.items()})
        named.update({f"blocks.{i}.{k}": v for k, v in points.items() if f"blocks.{i}.{k}" in names})
    if model.ln_embed is not None:
        named["ln_embed.hook_normalized"] = dx
    grads.update(embed_backward(model, tape.embedding, dx))
    return grads, {n: named[n] for n in names}
