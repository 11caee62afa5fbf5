"""Many interventions at the price of few forward passes: a sweep runs them in batches, one pass per batch.

A sweep (patch every head, ablate every head, path-patch each of several senders) is a list of
:class:`Intervention` s, each an edit of one or a few named activations of an otherwise unchanged base run
(the corrupted prompts, the intact text). Run one at a time, each would be a whole forward pass. Here:

1. **Shared layers run once.** An intervention whose first edit is in block L leaves blocks 0 … L − 1 as the
   base run had them, so its pass starts at block L from the base run's residual stream there
   (:func:`attnlab.stack.transformer.forward_from`); the base run records ``hook_resid_pre`` of every layer
   a sweep starts at.
2. **One pass per batch.** Interventions that start at the same block are stacked on a new leading axis
   (K, B, n, d_model): one forward of K rows instead of K forwards (the stack takes leading batch axes),
   each row's edits applied to its own slice by one hook per named point.
3. **Only the logits asked for.** A metric of the last tokens (patching) unembeds the last position alone.

Each row sees exactly the arrays a pass of its own would see, and its edit is the same function applied to
them, so a sweep equals the loop of single passes (up to the float rounding of larger matrix products).

The batch size K follows a memory rule, never a timing: a pass of K rows holds about

    K · B · n · (4 · max(d_model, d_mlp, n_heads · n) + 2 · kept · vocab) · itemsize   bytes

(a few (B, n, ·) activations alive at once, the (n, n) scores of every head, the kept logits and their
float64 copy), and K is the largest number that keeps this under :data:`SWEEP_BYTES`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..stack.hooks import run_with_cache
from ..stack.transformer import Transformer, forward, forward_from

#: the memory one batched pass of a sweep may hold (see the module docstring's rule): 256 MiB.
SWEEP_BYTES = 256 * 2**20


@dataclass(frozen=True, eq=False)
class Intervention:
    """Edits of one run: ``edits`` {hook name: fn(x, name) -> x'}, each on the activation one unbatched pass
    sees there ((B, …) or (…) as the base run's ids have it), as a hook of :func:`attnlab.run_with_hooks`."""
    edits: dict


def start_layer(model: Transformer, names) -> int:
    """The first block a hook of ``names`` sits in: −1 when one is before the blocks (the whole pass runs),
    n_layers when all are after them (``ln_final.…``)."""
    L = model.config.n_layers
    return min((int(n.split(".")[1]) if n.startswith("blocks.") else (L if n.startswith("ln_final.") else -1))
               for n in names)


def resid_names(model: Transformer, starts) -> list[str]:
    """The base run's activations a sweep needs to start at each block of ``starts``."""
    L = model.config.n_layers
    return sorted({f"blocks.{s}.hook_resid_pre" if s < L else f"blocks.{L - 1}.hook_resid_post"
                   for s in starts if s >= 0})


def base_run(model: Transformer, ids, interventions, *, attention_mask=None, names=()):
    """The base run (``ids``, unedited) with the residuals the sweep starts from and ``names`` recorded:
    ``(output, cache)``."""
    starts = {start_layer(model, iv.edits) for iv in interventions}
    return run_with_cache(model, ids, sorted(set(names) | set(resid_names(model, starts))),
                          attention_mask=attention_mask)


def batch_size(model: Transformer, ids_shape: tuple, kept: int) -> int:
    """How many interventions one pass may hold under :data:`SWEEP_BYTES` (the module docstring's rule)."""
    c = model.config
    rows = int(np.prod(ids_shape))                                      # B · n
    n = ids_shape[-1]
    width = max(c.d_model, c.d_mlp or 0, c.attention.n_heads * n)
    logits = int(np.prod(ids_shape[:-1])) * kept * c.vocab_size if c.has_logits else 0
    per_row = (4 * rows * width + 2 * logits) * np.dtype(model.dtype).itemsize
    return max(1, SWEEP_BYTES // per_row)


def run_sweep(model: Transformer, ids, interventions: list, score: Callable, *, cache, attention_mask=None,
              logits_to_keep: int = 0, progress=None) -> np.ndarray:
    """``score(logits)`` of each intervention's run, in order, as (len(interventions),) float64.

    ``ids`` (n,) or (B, n) are the base run's (its ``attention_mask`` with them), ``cache`` its activations
    from :func:`base_run`; ``score`` takes one run's logits ((…, kept, vocab), as a single pass with
    ``logits_to_keep`` would give) and returns a float. ``progress(done, total)``, if given, is called after
    each batched pass.
    """
    L = model.config.n_layers
    ids = np.asarray(ids)
    groups: dict[int, list[int]] = {}
    for k, iv in enumerate(interventions):
        groups.setdefault(start_layer(model, iv.edits), []).append(k)
    size = batch_size(model, ids.shape, logits_to_keep or ids.shape[-1])
    out, done = np.full(len(interventions), np.nan), 0
    for start in sorted(groups):
        for at in range(0, len(groups[start]), size):
            chunk = groups[start][at:at + size]
            hooks = stacked_hooks([interventions[k].edits for k in chunk])
            if start < 0:                                               # an edit before the blocks: whole passes
                many = np.broadcast_to(ids, (len(chunk), *ids.shape))  # (K, …, n)
                mask = None if attention_mask is None else np.broadcast_to(attention_mask, many.shape)
                logits = forward(model, many, hooks=hooks, attention_mask=mask,
                                 logits_to_keep=logits_to_keep).logits  # (K, …, kept, vocab)
            else:
                resid = cache[f"blocks.{start}.hook_resid_pre" if start < L else f"blocks.{L - 1}.hook_resid_post"]
                many = np.broadcast_to(resid, (len(chunk), *resid.shape))   # (K, …, n, d_model) read-only
                logits = forward_from(model, many, start, hooks=hooks, attention_mask=attention_mask,
                                      logits_to_keep=logits_to_keep).logits   # (K, …, kept, vocab)
            out[chunk] = [score(row) for row in logits]
            done += len(chunk)
            if progress is not None:
                progress(done, len(interventions))
    return out


def stacked_hooks(edits: list[dict]) -> dict:
    """One hook per named point for K stacked runs: row k's activation x[k] goes through ``edits[k]``'s
    function at that name, the other rows pass unchanged."""
    by_name: dict[str, list[tuple[int, Callable]]] = {}
    for k, e in enumerate(edits):
        for name, fn in e.items():
            by_name.setdefault(name, []).append((k, fn))

    def hook_for(rows):
        def hook(x, name):                                              # (K, …) one slice per run
            x = np.array(x, order="C")                                  # a copy: the pass's own may be shared
            for k, fn in rows:
                new = fn(x[k], name)
                if new is not None:
                    x[k] = new
            return x
        return hook
    return {name: hook_for(rows) for name, rows in by_name.items()}
