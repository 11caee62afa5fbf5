"""Named activations: record any intermediate of a forward pass, or replace it.

Every intermediate of :func:`attnlab.stack.transformer.forward` has a stable name (TransformerLens's names);
:func:`hook_names` lists a model's own, in pass order. Before the blocks::

    hook_embed                       (n, d_model)         the token rows W_E[ids]
    hook_pos_embed                   (n, d_model)         the position rows (learned or sinusoidal positions)
    ln_embed.hook_scale, ln_embed.hook_normalized         the embeddings' norm (BERT)

Per layer i, at the same names in every block kind (:mod:`attnlab.stack.blocks`)::

    blocks.{i}.hook_resid_pre        (n, d_model)         the residual stream into the block
    blocks.{i}.ln_1.hook_scale       (n, 1)               a norm's divisor √(var + eps) (√(mean x² + eps) for RMSNorm)
    blocks.{i}.ln_1.hook_normalized  (n, d_model)         the norm's output; likewise ln_2 (and ln_1_post, ln_2_post)
    blocks.{i}.attn.hook_q           (n_heads, n, d_head)  queries, as attention sees them (RoPE applied)
    blocks.{i}.attn.hook_k           (n_kv_heads, n, d_head)
    blocks.{i}.attn.hook_v           (n_kv_heads, n, d_head)
    blocks.{i}.attn.hook_scores      (n_heads, n, n_k)     scaled, biased scores; -inf where masked
    blocks.{i}.attn.hook_pattern     (n_heads, n, n_k)     the attention weights
    blocks.{i}.attn.hook_z           (n_heads, n, d_head)  each head's output, before W_O
    blocks.{i}.attn.hook_result      (n_heads, n, d_model) each head's output after its own rows of W_O
    blocks.{i}.hook_attn_out         (n, d_model)         what the attention adds to the stream (b_O included)
    blocks.{i}.hook_resid_mid        (n, d_model)         the stream between the sublayers (not in a parallel block)
    blocks.{i}.mlp.hook_pre          (n, d_mlp)           the MLP's hidden layer before its nonlinearity (the gate's)
    blocks.{i}.mlp.hook_post         (n, d_mlp)           after it (gated: act(gate) ⊙ x W_in)
    blocks.{i}.hook_mlp_out          (n, d_model)         what the MLP adds to the stream
    blocks.{i}.hook_resid_post       (n, d_model)         the residual stream out of the block

and ``ln_final.hook_scale``, ``ln_final.hook_normalized`` (n, d_model), the final norm before the unembedding
(models with one). Norm and MLP names exist only where the model has them. With a batch of ids each has a
leading B axis. With a KV cache, k and v are the new tokens' only and n_k counts the cached ones too.

Nothing is recorded and nothing is copied unless asked: a pass without hooks makes one function call per
point (:data:`attnlab.layer.hookpoints.NO_HOOKS`). Asking for ``hook_scores`` or ``hook_pattern`` runs that
layer's attention through the (n, n_k) grid instead of the tiled kernel; ``hook_result`` is computed only
when asked.
"""

from __future__ import annotations

from ..layer.hookpoints import Hooks
from .transformer import ModelOutput, Transformer, forward, hook_names

__all__ = ["Hooks", "hook_names", "run_with_cache", "run_with_hooks"]


def run_with_hooks(model: Transformer, ids, hooks: dict, *, caches=None, return_weights: bool = False,
                   token_types=None) -> ModelOutput:
    """:func:`attnlab.stack.transformer.forward` with ``hooks`` {name: fn}: each ``fn(array, name)`` sees that activation
    and returns a replacement of the same shape (the pass goes on with it), or None to keep it.

    >>> # zero head 3's output in layer 0 (an ablation):
    >>> # run_with_hooks(model, ids, {"blocks.0.attn.hook_z": lambda z, name: np.where(
    >>> #     np.arange(z.shape[-3])[:, None, None] == 3, 0, z)})
    """
    if not isinstance(hooks, dict):
        raise TypeError(f"hooks must be a dict of name -> function, got {type(hooks).__name__}")
    return forward(model, ids, caches=caches, return_weights=return_weights, token_types=token_types, hooks=hooks)


def run_with_cache(model: Transformer, ids, names=None, *, caches=None, return_weights: bool = False,
                   token_types=None) -> tuple[ModelOutput, dict[str, np.ndarray]]:
    """:func:`attnlab.stack.transformer.forward`, and the activations ``names`` (default: every one of
    :func:`hook_names`) as a dict name -> array, in the order the pass reached them.

    The arrays are the pass's own (no copies are made); none of them is written to afterwards.
    """
    names = hook_names(model) if names is None else names
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError("names must be a list of activation names (see hook_names(model))")
    store: dict[str, np.ndarray] = {}

    def record(x, name):
        store[name] = x

    out = run_with_hooks(model, ids, {name: record for name in names}, caches=caches,
                         return_weights=return_weights, token_types=token_types)
    return out, store
