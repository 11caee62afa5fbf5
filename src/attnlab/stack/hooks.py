"""Named activations: record any intermediate of a forward pass, or replace it.

Every intermediate of :func:`attnlab.stack.transformer.forward` has a stable name (TransformerLens's names). Per layer i::

    blocks.{i}.hook_resid_pre        (n, d_model)         the residual stream into the block
    blocks.{i}.attn.hook_q           (n_heads, n, d_head)  queries, as attention sees them (RoPE applied)
    blocks.{i}.attn.hook_k           (n_kv_heads, n, d_head)
    blocks.{i}.attn.hook_v           (n_kv_heads, n, d_head)
    blocks.{i}.attn.hook_scores      (n_heads, n, n_k)     scaled, biased scores; -inf where masked
    blocks.{i}.attn.hook_pattern     (n_heads, n, n_k)     the attention weights
    blocks.{i}.attn.hook_z           (n_heads, n, d_head)  each head's output, before W_O
    blocks.{i}.hook_attn_out         (n, d_model)         the attention's output, after W_O
    blocks.{i}.hook_mlp_out          (n, d_model)         the MLP's output (blocks with an MLP)
    blocks.{i}.hook_resid_post       (n, d_model)         the residual stream out of the block

and ``ln_final.hook_normalized`` (n, d_model), the final norm's output before the unembedding (models with
one). With a batch of ids each has a leading B axis. With a KV cache, k and v are the new tokens' only
and n_k counts the cached ones too.

Nothing is recorded and nothing is copied unless asked: a pass without hooks checks one ``None`` per
place. Asking for ``hook_scores`` or ``hook_pattern`` runs that layer's attention through the (n, n_k)
grid instead of the tiled kernel.
"""

from __future__ import annotations

import difflib

import numpy as np

from .activation_cache import ActivationCache
from .transformer import ModelOutput, Transformer, run

LAYER_HOOKS = ("hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_scores",
               "attn.hook_pattern", "attn.hook_z", "hook_attn_out", "hook_mlp_out", "hook_resid_post")


def hook_names(model: Transformer) -> list[str]:
    """Every name ``model`` has an activation for, in the order the forward pass reaches them."""
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a Transformer, got {type(model).__name__}")
    c = model.config
    names = [f"blocks.{i}.{h}" for i in range(c.n_layers) for h in LAYER_HOOKS
             if h != "hook_mlp_out" or c.d_mlp is not None]
    return names + (["ln_final.hook_normalized"] if c.final_norm else [])


class Hooks:
    """Functions by name, for one forward pass: ``hooks(name, array)`` returns the array to go on with.

    Each function is called as ``fn(array, name)`` and returns a replacement of the same shape, or None
    to leave the array as it is. :meth:`scoped` gives the view a block or its attention calls with
    short names ("hook_q", …).
    """

    def __init__(self, model: Transformer, fns: dict):
        if not isinstance(fns, dict):
            raise TypeError(f"hooks must be a dict of name -> function, got {type(fns).__name__}")
        known = hook_names(model)
        for name, fn in fns.items():
            if name not in known:
                near = difflib.get_close_matches(str(name), known, n=3)
                hint = f"; did you mean {near}?" if near else f"; see hook_names(model), e.g. {known[:3]}"
                raise ValueError(f"hooks has no activation named {name!r}{hint}")
            if not callable(fn):
                raise TypeError(f"hooks[{name!r}] must be a function fn(array, name), got {type(fn).__name__}")
        self.fns = fns

    def wants(self, name: str) -> bool:
        return name in self.fns

    def __call__(self, name: str, x: np.ndarray) -> np.ndarray:
        fn = self.fns.get(name)
        if fn is None:
            return x
        out = fn(x, name)
        if out is None:
            return x
        out = np.asarray(out)
        if out.shape != x.shape:
            raise ValueError(f"the hook on {name!r} returned shape {out.shape}; it must keep the shape {x.shape}")
        return out

    def scoped(self, prefix: str) -> "_Scoped":
        return _Scoped(self, prefix)


class _Scoped:
    """The hooks of one block (or one block's attention): short names, the prefix added."""

    def __init__(self, hooks: Hooks, prefix: str):
        self.hooks, self.prefix = hooks, prefix

    def wants(self, name: str) -> bool:
        return self.hooks.wants(self.prefix + name)

    def __call__(self, name: str, x: np.ndarray) -> np.ndarray:
        return self.hooks(self.prefix + name, x)

    def scoped(self, prefix: str) -> "_Scoped":
        return _Scoped(self.hooks, self.prefix + prefix)


def run_with_hooks(model: Transformer, ids, hooks: dict, *, caches=None, return_weights: bool = False,
                   token_types=None) -> ModelOutput:
    """:func:`attnlab.stack.transformer.forward` with ``hooks`` {name: fn}: each ``fn(array, name)`` sees that activation
    and returns a replacement of the same shape (the pass goes on with it), or None to keep it.

    >>> # zero head 3's output in layer 0 (an ablation):
    >>> # run_with_hooks(model, ids, {"blocks.0.attn.hook_z": lambda z, name: np.where(
    >>> #     np.arange(z.shape[-3])[:, None, None] == 3, 0, z)})
    """
    return run(model, ids, caches=caches, return_weights=return_weights, token_types=token_types,
               hooks=Hooks(model, hooks))


def run_with_cache(model: Transformer, ids, names=None, *, caches=None, return_weights: bool = False,
                   token_types=None) -> tuple[ModelOutput, ActivationCache]:
    """:func:`attnlab.stack.transformer.forward`, and the activations ``names`` (default: every one of
    :func:`hook_names`) as an :class:`~attnlab.stack.activation_cache.ActivationCache`: a mapping
    name -> array, in the order the pass reached them, with the decompositions of the residual stream, direct
    logit attribution and TransformerLens's layout (``cache.to_tl()``).

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
    return out, ActivationCache(store, model, batched=np.ndim(ids) > 1)
