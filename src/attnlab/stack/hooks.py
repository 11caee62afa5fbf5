"""Named activations: record any intermediate of a forward pass, or replace it.

Every intermediate of :func:`attnlab.stack.transformer.forward` has a stable name, TransformerLens's names with
TransformerLens's meanings; :func:`hook_names` lists a model's own, in pass order. Before the blocks::

    hook_embed                       (n, d_model)         the token rows W_E[ids] (before Gemma's embed_scale)
    hook_pos_embed                   (n, d_model)         the position rows (learned or sinusoidal positions)
    ln_embed.hook_scale, ln_embed.hook_normalized, ln_embed.hook_out   the embeddings' norm (BERT)

Per layer i, at the same names in every block kind (:mod:`attnlab.stack.blocks`)::

    blocks.{i}.hook_resid_pre        (n, d_model)         the residual stream into the block
    blocks.{i}.hook_attn_in          (n, d_model)         the stream the attention branch reads (before its norm)
    blocks.{i}.ln_1.hook_scale       (n, 1)               a norm's divisor √(var + eps) (√(mean x² + eps) for RMSNorm)
    blocks.{i}.ln_1.hook_normalized  (n, d_model)         TL's: a LayerNorm's output; an RMSNorm's x / scale, before
                                                          its weight
    blocks.{i}.ln_1.hook_out         (n, d_model)         the norm's output; likewise ln_2 (and ln_1_post, ln_2_post)
    blocks.{i}.attn.hook_q           (n_heads, n, d_head)  queries as projected, before RoPE (TL's hook_q)
    blocks.{i}.attn.hook_k           (n_kv_heads, n, d_head)
    blocks.{i}.attn.hook_v           (n_kv_heads, n, d_head)
    blocks.{i}.attn.hook_q_normed    (n_heads, n, d_head)  queries after QK-norm, before RoPE (QK-norm only)
    blocks.{i}.attn.hook_k_normed    (n_kv_heads, n, d_head)
    blocks.{i}.attn.hook_rot_q       (n_heads, n, d_head)  queries after RoPE, as attention sees them (RoPE only)
    blocks.{i}.attn.hook_rot_k       (n_kv_heads, n, d_head)
    blocks.{i}.attn.hook_scores      (n_heads, n, n_k)     scaled, biased scores; -inf where masked
    blocks.{i}.attn.hook_pattern     (n_heads, n, n_k)     the attention weights
    blocks.{i}.attn.hook_sink        (n_heads, n)         the weight each query gave its head's learned sink (sinks
                                                          only, gpt-oss; the pattern's rows sum to 1 minus it)
    blocks.{i}.attn.hook_z           (n_heads, n, d_head)  each head's output, before W_O
    blocks.{i}.attn.hook_result      (n_heads, n, d_model) each head's output after its own rows of W_O
    blocks.{i}.hook_attn_out         (n, d_model)         what the attention adds to the stream (b_O included)
    blocks.{i}.hook_resid_mid        (n, d_model)         the stream between the sublayers (not in a parallel block)
    blocks.{i}.hook_mlp_in           (n, d_model)         the stream the MLP branch reads
    blocks.{i}.mlp.hook_pre          (n, d_mlp)           the MLP's hidden layer before its nonlinearity (the gate's)
    blocks.{i}.mlp.hook_pre_linear   (n, d_mlp)           a gated MLP's linear path x W_in
    blocks.{i}.mlp.hook_post         (n, d_mlp)           after it (gated: act(gate) ⊙ x W_in)
    blocks.{i}.mlp.hook_router_logits  (n, n_experts)     an experts MLP's router logits (attnlab.stack.experts)
    blocks.{i}.mlp.hook_expert_ids     (n, top_k)         the experts each token chose (ints)
    blocks.{i}.mlp.hook_expert_weights (n, top_k)         their weights in the token's output
    blocks.{i}.hook_mlp_out          (n, d_model)         what the MLP adds to the stream
    blocks.{i}.hook_resid_post       (n, d_model)         the residual stream out of the block

and ``ln_final.hook_scale``, ``ln_final.hook_normalized``, ``ln_final.hook_out`` (n, d_model), the final norm
before the unembedding (models with one), and ``hook_unembed`` (n, vocab), the logits. Norm and MLP names
exist only where the model has them. With a batch of ids each has a leading B axis. With a KV cache, k and v
are the new tokens' only and n_k counts the cached ones too. RoPE turns features (2i, 2i+1) as a pair where
TransformerLens and transformers turn (i, i + d_head/2): :meth:`ActivationCache.to_tl` puts q and k in their
order.

Nothing is recorded and nothing is copied unless asked: a pass without hooks makes one function call per
point (:data:`attnlab.layer.hookpoints.NO_HOOKS`). Asking for ``hook_scores``, ``hook_pattern`` or
``hook_sink`` runs that layer's attention through the (n, n_k) grid instead of the tiled kernel; ``hook_result`` is computed only
when asked.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..layer.hookpoints import Hooks
from .batch import is_ragged, pad_prompts
from .activation_cache import ActivationCache
from .transformer import ModelOutput, Transformer, forward, hook_names

__all__ = ["ActivationCache", "Hooks", "hook_names", "run_with_cache", "run_with_hooks"]


def run_with_hooks(model: Transformer, ids, hooks: dict, *, caches=None, return_weights: bool = False,
                   token_types=None, attention_mask=None, tape=None) -> ModelOutput:
    """:func:`attnlab.stack.transformer.forward` with ``hooks`` {name: fn}: each ``fn(array, name)`` sees that activation
    and returns a replacement of the same shape (the pass goes on with it), or None to keep it.

    ``ids`` may be a list of prompts of different lengths (or a :class:`~attnlab.stack.batch.Batch`): they
    are padded (:func:`~attnlab.stack.batch.pad_prompts`, left for a decoder, right for an encoder) and run
    as one batch with their attention mask; the output's ``batch`` says where each prompt sits. A hook that
    must tell padding from tokens (a mean over the batch: :func:`attnlab.interpret.ablation_hooks`) has a
    method ``with_mask(mask) -> hook``; the pass's mask (B, n), given or made here, is handed to it. A
    ``tape`` keeps what the backward needs, as :func:`~attnlab.stack.transformer.forward`'s does.

    >>> # zero head 3's output in layer 0 (an ablation):
    >>> # run_with_hooks(model, ids, {"blocks.0.attn.hook_z": lambda z, name: np.where(
    >>> #     np.arange(z.shape[-3])[:, None, None] == 3, 0, z)})
    """
    if not isinstance(hooks, dict):
        raise TypeError(f"hooks must be a dict of name -> function, got {type(hooks).__name__}")
    batch = None
    if is_ragged(ids):
        if attention_mask is not None:
            raise ValueError("give a list of prompts or ids with an attention_mask, not both")
        if not isinstance(model, Transformer):
            raise TypeError(f"model must be a Transformer, got {type(model).__name__}")
        batch = pad_prompts(ids, vocab_size=model.config.vocab_size, is_causal=model.config.is_causal)
        ids, attention_mask = batch.ids, batch.mask
    if attention_mask is not None:
        hooks = with_mask(hooks, attention_mask)
    out = forward(model, ids, caches=caches, return_weights=return_weights, token_types=token_types, hooks=hooks,
                  attention_mask=attention_mask, tape=tape)
    return out if batch is None else dataclasses.replace(out, batch=batch)


def with_mask(hooks: dict, mask) -> dict:
    """``hooks`` with each that has a ``with_mask`` method replaced by ``fn.with_mask(mask)``: the hook as it
    reads a padded batch whose real tokens are ``mask`` (B, n)."""
    return {name: fn.with_mask(mask) if callable(getattr(fn, "with_mask", None)) else fn
            for name, fn in hooks.items()}


def cache_names(model: Transformer, names) -> list[str]:
    """The hook names ``names`` picks (see :func:`run_with_cache`), in pass order for a function."""
    if names is None:
        return hook_names(model)
    if isinstance(names, str):
        return [names]
    if callable(names):
        return [n for n in hook_names(model) if names(n)]
    try:
        names = list(names)
    except TypeError:
        names = None
    if names is None or not all(isinstance(n, str) for n in names):
        raise TypeError("names must be None, a hook name, a list of hook names or a function name -> bool (as "
                        "TransformerLens's names_filter; see hook_names(model))")
    return names


def run_with_cache(model: Transformer, ids, names=None, *, caches=None, return_weights: bool = False,
                   token_types=None, attention_mask=None, tape=None) -> tuple[ModelOutput, ActivationCache]:
    """:func:`attnlab.stack.transformer.forward`, and the activations ``names`` as an
    :class:`~attnlab.stack.activation_cache.ActivationCache`: a mapping
    name -> array, in the order the pass reached them, with the decompositions of the residual stream, direct
    logit attribution and TransformerLens's layout (``cache.to_tl()``).

    The arrays are the pass's own (no copies are made); none of them is written to afterwards. ``ids`` may be
    a list of prompts of different lengths, as for :func:`run_with_hooks`; ``cache.batch`` then holds the
    padding.

    ``names`` picks what is kept, as TransformerLens's ``names_filter``: None (every name of
    :func:`hook_names`), one name, a list of names, or a function ``name -> bool`` asked of every name::

        run_with_cache(model, ids, names=lambda name: name.endswith("hook_pattern"))
    """
    names = cache_names(model, names)
    store: dict[str, np.ndarray] = {}

    def record(x, name):
        store[name] = x

    out = run_with_hooks(model, ids, {name: record for name in names}, caches=caches,
                         return_weights=return_weights, token_types=token_types, attention_mask=attention_mask,
                         tape=tape)
    batched = out.batch is not None or np.ndim(ids) > 1
    return out, ActivationCache(store, model, batched=batched, batch=out.batch)
