"""Ablation, activation patching and the logit lens, all through the stack's named activations.

None of these writes a forward pass of its own: each runs :func:`attnlab.stack.hooks.run_with_hooks` or
``run_with_cache`` with a function that replaces one activation.

- Ablation removes one head: its output before W_O (``blocks.{l}.attn.hook_z``, (n_heads, n, d_head)) is
  zeroed, or replaced by its mean over positions, and the change in next-token loss is measured.
- Activation patching (Meng et al., 2022; Wang et al., 2022) runs a corrupted text and puts back one piece
  of the clean run: one head's z, or one layer's residual stream (``hook_resid_pre``) at one position.
  What it restores of the clean logit difference (answer − wrong, at the last position) is

      restored = (patched − corrupt) / (clean − corrupt)        0 = nothing, 1 = all of it.

- The logit lens (nostalgebraist, 2020) applies the final norm and the unembedding to each layer's residual
  stream, as if the model stopped there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels._checks import as_choice, as_float_array, as_positive_int, as_token_ids
from ..stack.hooks import run_with_cache, run_with_hooks
from ..kernels.softmax import softmax
from ..stack.transformer import Transformer, check_decoder, check_ids, logits_of

MODES = ("zero", "mean")


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


def head_ablation(head: int, mode: str):
    """A hook on ``hook_z`` (..., n_heads, n, d_head) that removes ``head``: zeros, or its mean over positions."""
    def hook(z, name):
        z = z.copy()
        z[..., head, :, :] = 0.0 if mode == "zero" else z[..., head, :, :].mean(-2, keepdims=True)
        return z
    return hook


@dataclass(frozen=True, eq=False)
class Ablation:
    """Next-token loss on a text with each head removed in turn."""
    mode: str
    loss: float                 # the intact model's loss, nats per token
    ablated: np.ndarray         # (n_layers, n_heads) the loss with that head removed

    @property
    def delta(self) -> np.ndarray:
        """(n_layers, n_heads) ablated − intact: how much the loss rises without the head."""
        return self.ablated - self.loss


def ablate(model: Transformer, ids, *, mode: str = "zero") -> Ablation:
    """The change in next-token loss on ``ids`` (n,) when each (layer, head) is removed, one at a time.

    Raises
    ------
    ValueError, TypeError
        A bidirectional model, an unknown mode, fewer than two tokens, ids the model cannot run.
    """
    check_decoder(model, "ablation")
    mode = as_choice("mode", mode, MODES)
    ids = _text_ids(model, ids)                                         # (n,)
    c = model.config
    base = next_token_loss(run_with_hooks(model, ids, {}).logits, ids)
    out = np.empty((c.n_layers, c.attention.n_heads))                   # (n_layers, n_heads)
    for layer in range(c.n_layers):
        for head in range(c.attention.n_heads):
            hooks = {f"blocks.{layer}.attn.hook_z": head_ablation(head, mode)}
            out[layer, head] = next_token_loss(run_with_hooks(model, ids, hooks).logits, ids)
    return Ablation(mode=mode, loss=base, ablated=out)


def _text_ids(model: Transformer, ids) -> np.ndarray:
    ids = check_ids(model, ids)
    if ids.ndim != 1 or ids.size < 2:
        raise ValueError(f"ids must be 1-D with at least 2 tokens (one to predict), got shape {ids.shape}")
    return ids


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


def patch(model: Transformer, clean_ids, corrupt_ids, *, answer: int, wrong: int) -> Patching:
    """Activation patching of every head and of every layer's residual stream at every position.

    Parameters
    ----------
    clean_ids, corrupt_ids : int arrays (n,)
        Two texts of the same number of tokens.
    answer, wrong : int
        Token ids; the metric is logits[-1, answer] − logits[-1, wrong].

    Raises
    ------
    ValueError, TypeError
        A bidirectional model, texts of different lengths, token ids outside the vocabulary, clean and
        corrupted runs with the same logit difference (nothing to restore).
    """
    check_decoder(model, "patching")
    clean_ids, corrupt_ids = check_patch_args(model, clean_ids, corrupt_ids, answer, wrong)
    c, n = model.config, clean_ids.size
    names = [f"blocks.{i}.{h}" for i in range(c.n_layers) for h in ("attn.hook_z", "hook_resid_pre")]
    clean_out, cache = run_with_cache(model, clean_ids, names)
    clean = logit_diff(clean_out.logits, answer, wrong)
    corrupt = logit_diff(run_with_hooks(model, corrupt_ids, {}).logits, answer, wrong)
    if clean == corrupt:
        raise ValueError("the clean and corrupted texts give the same logit difference: nothing to restore")

    def run(name: str, index: int) -> float:          # the corrupted run with clean[name][index] put back
        return logit_diff(run_with_hooks(model, corrupt_ids, {name: put_back(cache[name], index)}).logits,
                          answer, wrong)
    head_diff = np.array([[run(f"blocks.{i}.attn.hook_z", h) for h in range(c.attention.n_heads)]
                          for i in range(c.n_layers)])                                  # (n_layers, n_heads)
    resid_diff = np.array([[run(f"blocks.{i}.hook_resid_pre", p) for p in range(n)]
                           for i in range(c.n_layers)])                                 # (n_layers, n)
    frac = lambda d: (d - corrupt) / (clean - corrupt)                                       # noqa: E731
    return Patching(clean=clean, corrupt=corrupt, heads=frac(head_diff), resid=frac(resid_diff),
                    head_diff=head_diff, resid_diff=resid_diff)


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


def logit_lens(model: Transformer, ids, *, top: int = 5) -> Lens:
    """The final norm and unembedding applied to the residual stream before each block and after the last:
    the top-``top`` next tokens of every position at every stage. The last stage is the model's own output.
    """
    check_decoder(model, "the logit lens")
    top = as_positive_int("top", top)
    ids = check_ids(model, ids)
    if ids.ndim != 1:
        raise ValueError(f"ids must be 1-D (one text), got shape {ids.shape}")
    L = model.config.n_layers
    names = [f"blocks.{i}.hook_resid_pre" for i in range(L)] + [f"blocks.{L - 1}.hook_resid_post"]
    _, cache = run_with_cache(model, ids, names)
    logits = unembed(model, np.stack([cache[n] for n in names]))        # (L + 1, n, vocab)
    k = min(top, logits.shape[-1])
    p = softmax(logits.astype(np.float64))                              # (L + 1, n, vocab)
    order = np.argsort(-p, axis=-1, kind="stable")[..., :k]             # (L + 1, n, k)
    return Lens(stages=("embed", *(f"block {i}" for i in range(L))), logits=logits, top_ids=order,
                top_probs=np.take_along_axis(p, order, -1))
