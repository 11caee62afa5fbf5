"""Ablation and the logit lens, all through the stack's named activations.

None of these writes a forward pass of its own: each runs the stack with a function that replaces one
activation (:func:`attnlab.stack.hooks.run_with_hooks`), a sweep of them batched
(:mod:`attnlab.interpret.sweeps`).

- Ablation removes one head: its output before W_O (``blocks.{l}.attn.hook_z``, (n_heads, n, d_head)) is
  zeroed, or replaced by a causal mean (per position over other prompts, or the running mean over earlier
  positions), or resampled from another prompt; the change in next-token loss is measured.
- Activation patching and path patching live in :mod:`attnlab.interpret.patching`.
- The logit lens (nostalgebraist, 2020) applies the final norm and the unembedding to each layer's residual
  stream, as if the model stopped there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels._checks import as_choice, as_float_array, as_positive_int, as_token_ids
from ..stack.batch import is_ragged, pad_prompts
from ..stack.hooks import run_with_cache
from ..kernels.softmax import softmax
from ..stack.transformer import Transformer, check_decoder, check_ids, logits_of
from .sweeps import Intervention, base_run, run_sweep

MODES = ("zero", "mean", "prefix-mean", "resample")


def per_token_loss(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """−log p(target) at every position, in float64: logits (..., n, V), targets (..., n) -> (..., n)."""
    z = logits.astype(np.float64)                                       # (..., n, V)
    z = z - z.max(-1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))                # (..., n, V)
    return -np.take_along_axis(log_p, targets[..., None], -1)[..., 0]   # (..., n)


def next_token_loss(logits: np.ndarray, ids: np.ndarray) -> float:
    """Mean −log p(ids[t + 1] | ids[..t]) over t = 0 … n − 2: ``logits`` (n, vocab), ``ids`` (n,)."""
    logits = as_float_array("logits", logits)                           # (n, vocab)
    if logits.ndim != 2 or logits.shape[0] < 2:
        raise ValueError(f"logits must be (n, vocab) with n >= 2, got shape {logits.shape}")
    ids = as_token_ids("ids", ids, logits.shape[1])                     # (n,)
    if ids.shape != logits.shape[:1]:
        raise ValueError(f"ids must be (n,) = ({logits.shape[0]},) like the logits' rows, got shape {ids.shape}")
    return float(per_token_loss(logits[:-1], ids[1:]).mean())


def batch_loss(logits: np.ndarray, ids: np.ndarray, mask: np.ndarray | None = None) -> float:
    """:func:`next_token_loss` of each prompt, averaged over the prompts: logits (..., n, vocab), ids (..., n);
    with a padded batch's ``mask`` (B, n), only predictions from a real token of a real token count."""
    loss = per_token_loss(logits[..., :-1, :], ids[..., 1:])           # (..., n − 1)
    if mask is None:
        return float(loss.mean())
    valid = mask[:, :-1] & mask[:, 1:]                                  # (B, n − 1)
    if not valid.any(-1).all():
        raise ValueError("every prompt needs at least 2 tokens (one to predict)")
    return float(((loss * valid).sum(-1) / valid.sum(-1)).mean())


def ablation_hooks(model: Transformer, heads, *, mode: str, reference=None, attention_mask=None) -> dict:
    """Hooks ``{name: fn}`` for :func:`attnlab.run_with_hooks` that remove each (layer, head) of ``heads``.

    Each replaces the head's output before W_O (``blocks.{l}.attn.hook_z``, (B, n_heads, n, d_head)) at
    every position t by:

    - ``"zero"``: 0;
    - ``"mean"``: its mean at position t over a reference batch: ``reference`` (B_r, n_r) ids, n_r >= n, run
      once here; without one, over the batch's *other* prompts (B >= 2). Position t sees only tokens <= t of
      any prompt, so a causal model stays causal;
    - ``"prefix-mean"``: its running mean over positions 0 … t of the same prompt (causal too);
    - ``"resample"``: its value at t in another prompt: row b % B_r of ``reference``, or without one row
      b − 1 of the batch itself (cyclically).

    ``attention_mask`` (B, n) is a padded batch's (:func:`attnlab.stack.batch.pad_prompts`, left padding;
    :func:`attnlab.run_with_hooks` hands the hooks the mask of the pass itself, a list of prompts' too):
    padded positions are left out of every mean; a reference is read from each prompt's first token; the
    batch's own means are taken column by column over the other prompts with a real token there (left
    padding lines up the prompts' ends; a column no other prompt reaches gets 0), which is causal too.

    The hooks compose with any other hook (merge the dicts; names must not collide). The means over the
    batch itself are taken from the pass the hook sees, so heads ablated in earlier layers are already gone.

    Raises
    ------
    ValueError, TypeError
        An unknown mode, a (layer, head) outside the model, a reference with a mode that takes none, a
        reference shorter than the text (when the hook runs), ``"mean"``/``"resample"`` without a reference
        on a single prompt.
    """
    mode = as_choice("mode", mode, MODES)
    return _ablation_hooks(model, heads, mode, _reference_z(model, heads, mode, reference), attention_mask)


def is_index(x) -> bool:
    """Whether ``x`` is an integer index: an int or numpy integer, not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _check_heads(model: Transformer, heads) -> list[tuple[int, int]]:
    c = model.config
    if isinstance(heads, tuple) and len(heads) == 2 and all(isinstance(h, (int, np.integer)) for h in heads):
        raise TypeError(f"heads must be a list of (layer, head) pairs; for one head write [{heads}]")
    try:
        pairs = [(layer, head) for layer, head in heads]
    except (TypeError, ValueError):
        raise TypeError(f"heads must be a list of (layer, head) pairs, got {heads!r}") from None
    for layer, head in pairs:
        if not (is_index(layer) and is_index(head)):
            raise TypeError(f"heads has ({layer!r}, {head!r}); a layer and a head are integers (not bools, floats "
                            "or strings)")
    pairs = [(int(layer), int(head)) for layer, head in pairs]
    for layer, head in pairs:
        if not (0 <= layer < c.n_layers and 0 <= head < c.attention.n_heads):
            raise ValueError(f"heads has ({layer}, {head}); the model has layers 0 … {c.n_layers - 1} and heads "
                             f"0 … {c.attention.n_heads - 1}")
    return pairs


def _reference_z(model: Transformer, heads, mode: str, reference) -> dict | None:
    """The reference batch's hook_z (B_r, n_heads, n_r, d_head) of every layer ``heads`` touches, or None."""
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a Transformer, got {type(model).__name__}")
    layers = sorted({layer for layer, _ in _check_heads(model, heads)})
    if reference is None:
        return None
    if mode not in ("mean", "resample"):
        raise ValueError(f"reference is for mode 'mean' or 'resample'; mode {mode!r} takes none")
    ref = check_ids(model, reference, name="reference")
    ref = ref.reshape(-1, ref.shape[-1])                                # (B_r, n_r)
    _, cache = run_with_cache(model, ref, [f"blocks.{i}.attn.hook_z" for i in layers])
    return {i: cache[f"blocks.{i}.attn.hook_z"] for i in layers}        # (B_r, h, n_r, d_head) each


def _ablation_hooks(model: Transformer, heads, mode: str, ref_z: dict | None, mask=None) -> dict:
    by_layer: dict[int, list[int]] = {}
    for layer, head in _check_heads(model, heads):
        by_layer.setdefault(layer, []).append(head)
    mask = None if mask is None else np.asarray(mask, bool)
    return {f"blocks.{layer}.attn.hook_z": _head_ablation(hs, mode, None if ref_z is None else ref_z[layer], mask)
            for layer, hs in by_layer.items()}


def _head_ablation(heads: list[int], mode: str, ref: np.ndarray | None, mask: np.ndarray | None):
    """A hook on hook_z (..., n_heads, n, d_head) that replaces ``heads`` as :func:`ablation_hooks` says; its
    ``with_mask(mask)`` is the same hook for a padded batch (:func:`attnlab.run_with_hooks` calls it when it
    pads a list of prompts, so padded positions stay out of the means)."""
    def hook(z, name):
        n = z.shape[-2]
        batch = z.reshape(-1, *z.shape[-3:])                            # (B, h, n, d_head)
        B = batch.shape[0]
        m = np.ones((B, n), bool) if mask is None else mask.reshape(B, n)   # (B, n) real tokens
        w = m[..., None].astype(batch.dtype)                            # (B, n, 1)
        first = n - m.sum(-1)                                           # (B,) padded columns (left padding)
        if ref is not None and ref.shape[-2] < m.sum(-1).max():
            raise ValueError(f"the reference has {ref.shape[-2]} tokens, the text {int(m.sum(-1).max())}: the means "
                             "need a reference at least as long")
        if ref is None and mode in ("mean", "resample") and B < 2:
            raise ValueError(f"mode {mode!r} without a reference takes other prompts of the batch: give a batch "
                             "of at least 2 prompts (B, n), a reference, or use mode 'prefix-mean'")
        # each column's position in its own prompt (0 at the first real token), to read a reference there
        at = np.clip(np.arange(n)[None, :] - first[:, None], 0, None)  # (B, n)
        new = batch.copy()
        for head in heads:
            x = batch[:, head] * w                                      # (B, n, d_head) pads zeroed
            if mode == "zero":
                new[:, head] = 0.0
            elif mode == "prefix-mean":
                count = np.maximum(np.cumsum(m, -1), 1)[..., None]      # (B, n, 1)
                new[:, head] = np.cumsum(x, axis=-2) / count            # (B, n, d_head)
            elif mode == "mean" and ref is None:
                others = np.maximum(m.sum(0)[None, :, None] - w, 1)     # (B, n, 1) other real prompts there
                new[:, head] = (x.sum(0) - x) / others                  # (B, n, d_head) the others' mean
            elif mode == "mean":
                new[:, head] = ref[:, head].mean(0)[at]                 # (B, n, d_head)
            elif ref is None:
                new[:, head] = np.roll(x, 1, axis=0)                    # (B, n, d_head) row b − 1's
            else:
                rows = (np.arange(B) % ref.shape[0])[:, None]           # (B, 1)
                new[:, head] = ref[rows, head, at]                      # (B, n, d_head)
        return new.reshape(z.shape)
    hook.with_mask = lambda m: _head_ablation(heads, mode, ref, np.asarray(m, bool))
    return hook


@dataclass(frozen=True, eq=False)
class Ablation:
    """Next-token loss on a text (or a batch of texts) with each head removed in turn."""
    mode: str
    loss: float                 # the intact model's loss, nats per token (averaged over the prompts)
    ablated: np.ndarray         # (n_layers, n_heads) the loss with that head removed

    @property
    def delta(self) -> np.ndarray:
        """(n_layers, n_heads) ablated − intact: how much the loss rises without the head."""
        return self.ablated - self.loss


def ablate(model: Transformer, ids, *, mode: str = "zero", reference=None, progress=None) -> Ablation:
    """The change in next-token loss on ``ids`` (n,), a batch (B, n) or a list of prompts of different
    lengths (padded on the left, their pads left out of the loss and the means) when each (layer, head) is
    removed, one at a time, by :func:`ablation_hooks` with ``mode`` and ``reference``. The loss is each
    prompt's mean, averaged over the prompts.

    The ablated runs are a sweep (:mod:`attnlab.interpret.sweeps`): batches of them share one forward pass,
    each starting at its head's block from the intact run's residual stream there; ``progress(done, total)``,
    if given, is called after each batched pass.

    Raises
    ------
    ValueError, TypeError
        A bidirectional model, an unknown mode, fewer than two tokens, ids the model cannot run, mode
        ``"mean"`` or ``"resample"`` on one prompt without a reference.
    """
    check_decoder(model, "ablation")
    mode = as_choice("mode", mode, MODES)
    ids, mask = _text_ids(model, ids)                                   # (n,) or (B, n); (B, n) or None
    c = model.config
    all_heads = [(i, h) for i in range(c.n_layers) for h in range(c.attention.n_heads)]
    ref_z = _reference_z(model, all_heads, mode, reference)
    if ref_z is None and mode in ("mean", "resample") and ids.ndim == 1:
        raise ValueError(f"mode {mode!r} takes each position's mean over other prompts: give a batch of at "
                         "least 2 texts (B, n) or a reference, or use mode 'prefix-mean' (the causal running "
                         "mean over the text's own positions)")

    sweep = [Intervention(_ablation_hooks(model, [head], mode, ref_z, mask)) for head in all_heads]
    base_out, cache = base_run(model, ids, sweep, attention_mask=mask)
    base = batch_loss(base_out.logits, ids, mask)
    losses = run_sweep(model, ids, sweep, lambda logits: batch_loss(logits, ids, mask), cache=cache,
                       attention_mask=mask, progress=progress)
    out = losses.reshape(c.n_layers, c.attention.n_heads)               # (n_layers, n_heads)
    return Ablation(mode=mode, loss=base, ablated=out)


def _text_ids(model: Transformer, ids) -> tuple[np.ndarray, np.ndarray | None]:
    """(ids (n,) or (B, n), the padded batch's mask (B, n) or None): a list of prompts is padded on the left."""
    if is_ragged(ids):
        b = pad_prompts(ids, vocab_size=model.config.vocab_size, is_causal=True)
        if b.lengths.min() < 2:
            raise ValueError(f"every prompt needs at least 2 tokens (one to predict), got lengths {b.lengths.tolist()}")
        return check_ids(model, b.ids), b.mask
    ids = check_ids(model, ids)
    if ids.ndim not in (1, 2) or ids.shape[-1] < 2:
        raise ValueError(f"ids must be (n,) or a batch (B, n) with at least 2 tokens (one to predict), got shape "
                         f"{ids.shape}")
    return ids, None


@dataclass(frozen=True, eq=False)
class Patching:
    """What patching each piece of the clean run into the corrupted run restores."""
    clean: float                # logit difference answer − wrong at the last position, clean run
    corrupt: float              # the same, corrupted run
    heads: np.ndarray           # (n_layers, n_heads) restored fraction, one head's z patched
    resid: np.ndarray           # (n_layers, n) restored fraction, hook_resid_pre of a layer at one position
    head_diff: np.ndarray       # (n_layers, n_heads) the patched logit differences themselves
    resid_diff: np.ndarray      # (n_layers, n)


def logit_diff(logits: np.ndarray, answer: int, wrong: int) -> float:
    """logits[-1, answer] − logits[-1, wrong], in float64."""
    return float(np.float64(logits[-1, answer]) - np.float64(logits[-1, wrong]))


def put_back(clean: np.ndarray, index: int):
    """A hook that puts back ``clean[index]`` along the first axis: one head's z from ``hook_z``
    (n_heads, n, d_head), or one position's residual from ``hook_resid_pre`` (n, d_model)."""
    def hook(x, name):
        x = x.copy()
        x[index] = clean[index]
        return x
    return hook


def check_patch_args(model: Transformer, clean_ids, corrupt_ids, answer, wrong):
    """The two texts as token ids (n,) of the same length, and answer and wrong as token ids of the vocabulary."""
    clean_ids, corrupt_ids = check_ids(model, clean_ids, name="clean_ids"), check_ids(model, corrupt_ids,
                                                                                      name="corrupt_ids")
    if clean_ids.ndim != 1 or clean_ids.shape != corrupt_ids.shape:
        raise ValueError(f"the clean and corrupted texts must be 1-D with the same number of tokens, got "
                         f"{clean_ids.shape[-1]} and {corrupt_ids.shape[-1]} tokens")
    V = model.config.vocab_size
    for name, t in (("answer", answer), ("wrong", wrong)):
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < V:
            raise ValueError(f"{name} must be a token id in [0, {V}), got {t!r}")
    return clean_ids, corrupt_ids



def unembed(model: Transformer, x: np.ndarray) -> np.ndarray:
    """Logits (..., vocab) of a residual stream x (..., d_model): the final norm (if any), then W_U."""
    check_decoder(model, "the logit lens")
    x = as_float_array("x", x)                                          # (..., d_model)
    if x.ndim < 1 or x.shape[-1] != model.config.d_model:
        raise ValueError(f"x must be a residual stream (..., d_model) with d_model = {model.config.d_model}, "
                         f"got shape {x.shape}")
    if model.ln_final is not None:
        x = model.ln_final(x)                                           # (..., d_model)
    return logits_of(model, x)                                          # (..., vocab)


@dataclass(frozen=True, eq=False)
class Lens:
    """Each layer's residual stream read as next-token predictions."""
    stages: tuple[str, ...]     # "embed", "block 0", …: the residual after that stage
    logits: np.ndarray          # (n_stages, n, vocab)
    top_ids: np.ndarray         # (n_stages, n, k) best first
    top_probs: np.ndarray       # (n_stages, n, k)


def logit_lens(model: Transformer, ids, *, top: int = 5):
    """The final norm and unembedding applied to the residual stream before each block and after the last:
    the top-``top`` next tokens of every position at every stage. The last stage is the model's own output.

    ``ids`` (n,) gives one :class:`Lens`; a list of prompts (lengths may differ) runs as one padded pass and
    gives a list of them, one per prompt, on its own positions.
    """
    check_decoder(model, "the logit lens")
    top = as_positive_int("top", top)
    L = model.config.n_layers
    names = [f"blocks.{i}.hook_resid_pre" for i in range(L)] + [f"blocks.{L - 1}.hook_resid_post"]
    if is_ragged(ids):
        out, cache = run_with_cache(model, ids, names)
        b = out.batch
        stages = np.stack([cache[n] for n in names])                    # (L + 1, B, n, d_model)
        return [_lens(model, b.own(stages[:, i], i), top) for i in range(len(b.lengths))]
    ids = check_ids(model, ids)
    if ids.ndim != 1:
        raise ValueError(f"ids must be 1-D (one text) or a list of texts, got shape {ids.shape}")
    _, cache = run_with_cache(model, ids, names)
    return _lens(model, np.stack([cache[n] for n in names]), top)


def _lens(model: Transformer, stages: np.ndarray, top: int) -> Lens:
    """A Lens of the residual stream at each stage, (L + 1, n, d_model)."""
    logits = unembed(model, stages)                                     # (L + 1, n, vocab)
    k = min(top, logits.shape[-1])
    p = softmax(logits.astype(np.float64))                              # (L + 1, n, vocab)
    order = np.argsort(-p, axis=-1, kind="stable")[..., :k]             # (L + 1, n, k)
    L = model.config.n_layers
    return Lens(stages=("embed", *(f"block {i}" for i in range(L))), logits=logits, top_ids=order,
                top_probs=np.take_along_axis(p, order, -1))
