"""Attribution patching (Nanda, 2023; Syed et al., 2023): activation patching's first-order estimate, for every
head and every residual position at once, from one forward and one backward pass.

Activation patching (:func:`attnlab.interpret.patch`) runs the corrupted text once per piece, with that
piece of the clean run put back. Its effect on the metric m (the logit difference answer − wrong at the
last position) is, to first order around the corrupted run,

    m(corrupt with a_clean put back) − m(corrupt)  ≈  ∂m/∂a |corrupt · (a_clean − a_corrupt)

so one backward pass of m on the corrupted run (:func:`attnlab.stack.backward.backward`, which gives the
gradient at every named activation) and the two runs' activations give every piece's estimate at once:
per head, the product summed over its positions and d_head (``hook_z``); per layer and position, summed
over d_model (``hook_resid_pre``). Divided by m(clean) − m(corrupt), as :class:`Patching` reports it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels._threads import blas_threads_for
from ..layer.tape import Tape
from ..stack.backward import backward
from ..stack.hooks import run_with_cache
from ..stack.transformer import Transformer, check_decoder, check_ids
from .interventions import Patching, check_patch_args, logit_diff


@dataclass(frozen=True, eq=False)
class Attribution:
    """Attribution patching's estimates, in :class:`Patching`'s units (the share of the clean logit
    difference restored)."""
    clean: float                # logit difference answer − wrong at the last position, clean run
    corrupt: float              # the same, corrupted run
    heads: np.ndarray           # (n_layers, n_heads) estimated share restored by one head's clean z
    resid: np.ndarray           # (n_layers, n) estimated share restored by one layer's clean residual at one position


def attribute(model: Transformer, clean_ids, corrupt_ids, *, answer, wrong) -> Attribution:
    """Attribution patching of every head (``hook_z``) and every layer's residual stream at every position
    (``hook_resid_pre``): clean run recorded, corrupted run forward and backward, once each.

    Parameters
    ----------
    clean_ids, corrupt_ids : int arrays (n,), or (B, n) for a batch of pairs
        Two texts of the same number of tokens (B pairs, each clean row against its corrupted row).
    answer, wrong : int, or int arrays (B,) for a batch
        Token ids; the metric is logits[-1, answer] − logits[-1, wrong], its mean over a batch's rows.

    Raises
    ------
    ValueError, TypeError
        As :func:`attnlab.interpret.patch` does; for a batch, ids that are not (B, n) alike, or answers that
        are not one id or B ids.
    """
    check_decoder(model, "attribution patching")
    clean_ids, corrupt_ids, answer, wrong = check_attribution_args(model, clean_ids, corrupt_ids, answer, wrong)
    c = model.config
    names = [f"blocks.{i}.{h}" for i in range(c.n_layers) for h in ("attn.hook_z", "hook_resid_pre")]
    clean_out, clean_acts = run_with_cache(model, clean_ids, names)
    tape = Tape()
    corrupt_out, corrupt_acts = run_with_cache(model, corrupt_ids, names, tape=tape)   # the one forward, taped
    logits = corrupt_out.logits                                         # (..., n, vocab)
    clean, corrupt = mean_logit_diff(clean_out.logits, answer, wrong), mean_logit_diff(logits, answer, wrong)
    if clean == corrupt:
        raise ValueError("the clean and corrupted texts give the same logit difference: nothing to restore")
    # forward: m = mean over the rows of logits[..., -1, answer] − logits[..., -1, wrong]
    rows = logits[..., -1, :].reshape(-1, c.vocab_size)                 # (B, vocab) the last positions
    d_last = np.zeros_like(rows)                                        # (B, vocab)
    np.add.at(d_last, (np.arange(len(rows)), np.broadcast_to(answer, len(rows))), 1 / len(rows))
    np.add.at(d_last, (np.arange(len(rows)), np.broadcast_to(wrong, len(rows))), -1 / len(rows))
    dlogits = np.zeros_like(logits)                                     # (..., n, vocab)
    dlogits[..., -1, :] = d_last.reshape(logits[..., -1, :].shape)
    with blas_threads_for(logits.size // logits.shape[-1]):              # as the forward ran: by its rows
        _, grads = backward(model, tape, dlogits, grad_names=names)
    diff = {k: clean_acts[k].astype(np.float64) - corrupt_acts[k] for k in names}
    n, h = logits.shape[-2], c.attention.n_heads
    z, r = "attn.hook_z", "hook_resid_pre"
    heads = np.array([(grads[f"blocks.{i}.{z}"] * diff[f"blocks.{i}.{z}"]).reshape(-1, h, n * c.attention.d_head)
                      .sum((0, 2)) for i in range(c.n_layers)])        # (n_layers, n_heads) over rows, positions
    resid = np.array([(grads[f"blocks.{i}.{r}"] * diff[f"blocks.{i}.{r}"]).reshape(-1, n, c.d_model)
                      .sum((0, 2)) for i in range(c.n_layers)])         # (n_layers, n) over rows
    scale = clean - corrupt
    return Attribution(clean=clean, corrupt=corrupt, heads=heads / scale, resid=resid / scale)


def check_attribution_args(model: Transformer, clean_ids, corrupt_ids, answer, wrong):
    """One pair of texts (n,) as :func:`attnlab.interpret.patch` takes it, or a batch of pairs (B, n) with one
    answer and wrong token for all or one per row (B,): ``(clean, corrupt, answer, wrong)``."""
    if np.ndim(clean_ids) < 2 and np.ndim(corrupt_ids) < 2:
        clean_ids, corrupt_ids = check_patch_args(model, clean_ids, corrupt_ids, answer, wrong)
        return clean_ids, corrupt_ids, answer, wrong
    clean_ids, corrupt_ids = check_ids(model, clean_ids, name="clean_ids"), check_ids(model, corrupt_ids,
                                                                                      name="corrupt_ids")
    if clean_ids.ndim != 2 or clean_ids.shape != corrupt_ids.shape:
        raise ValueError(f"clean_ids and corrupt_ids must be one text each (n,) or a batch of pairs (B, n) of the "
                         f"same shape, got shapes {clean_ids.shape} and {corrupt_ids.shape}")
    B, V = clean_ids.shape[0], model.config.vocab_size
    out = []
    for name, t in (("answer", answer), ("wrong", wrong)):
        t = np.asarray(t)
        if t.dtype.kind not in "iu" or t.shape not in ((), (B,)) or t.min() < 0 or t.max() >= V:
            raise ValueError(f"{name} must be a token id in [0, {V}), or {B} of them (one per row), got {t!r}")
        out.append(t.astype(np.int64))
    return clean_ids, corrupt_ids, *out


def mean_logit_diff(logits: np.ndarray, answer, wrong) -> float:
    """logits[..., -1, answer] − logits[..., -1, wrong] in float64, its mean over a batch's rows (``answer`` and
    ``wrong`` one id or one per row)."""
    if logits.ndim == 2:
        return logit_diff(logits, answer, wrong)
    last = logits[:, -1, :].astype(np.float64)                         # (B, vocab)
    rows = np.arange(len(last))
    return float((last[rows, np.broadcast_to(answer, len(rows))]
                  - last[rows, np.broadcast_to(wrong, len(rows))]).mean())


def rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's ρ of two arrays of the same shape: the correlation of their ranks (ties share the mean rank).

    >>> rank_correlation(np.array([1.0, 2.0, 3.0]), np.array([10.0, 30.0, 20.0]))
    0.5
    """
    def ranks(x):
        x = np.asarray(x, np.float64).ravel()
        order = np.argsort(x, kind="stable")
        r = np.empty(x.size)
        r[order] = np.arange(x.size)
        for v in np.unique(x):                      # ties: the mean of their ranks
            tie = x == v
            r[tie] = r[tie].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = np.sqrt((ra * ra).sum() * (rb * rb).sum())
    return float((ra * rb).sum() / denom) if denom > 0 else float("nan")


@dataclass(frozen=True, eq=False)
class Agreement:
    """How attribution patching's estimates compare with activation patching's measurements."""
    heads_rho: float            # Spearman's ρ over every (layer, head)
    resid_rho: float            # over every (layer, position)
    disagree: list              # the heads where they differ most: (layer, head, measured, estimated)


def compare(patching: Patching, attribution: Attribution, *, top: int = 5) -> Agreement:
    """Rank correlations of the two methods, and the ``top`` heads where their shares differ most."""
    gap = np.abs(patching.heads - attribution.heads)                    # (n_layers, n_heads)
    worst = np.argsort(gap, axis=None)[::-1][:top]
    disagree = [(int(i), int(j), float(patching.heads[i, j]), float(attribution.heads[i, j]))
                for i, j in zip(*np.unravel_index(worst, gap.shape))]
    return Agreement(heads_rho=rank_correlation(patching.heads, attribution.heads),
                     resid_rho=rank_correlation(patching.resid, attribution.resid), disagree=disagree)
