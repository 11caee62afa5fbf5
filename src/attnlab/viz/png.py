"""PNG heatmaps of attention weights and masks, with matplotlib.

Masked cells (the query may not see that key) are drawn hatched grey, so they never look like a
weight that merely came out as zero.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_bool_array, as_float_array
from .._io import atomic_path

MASKED_COLOUR = "#d0d0d0"
ANNOTATE_UP_TO = 12          # write the values in the cells when the grid is at most this wide


def _figure(width: float, height: float):
    from matplotlib.figure import Figure   # no pyplot: no global state, no display needed
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def draw_grid(ax, weights: np.ndarray, q_tokens, k_tokens, *, keep=None, vmax: float = 1.0,
              annotate: bool | None = None, cmap: str = "Blues"):
    """Draw one (n_q, n_k) grid of weights on ``ax``; returns the image for a colour bar."""
    n_q, n_k = weights.shape
    shown = np.ma.masked_array(weights, mask=None if keep is None else ~keep)   # (n_q, n_k)
    ax.set_facecolor(MASKED_COLOUR)
    im = ax.imshow(shown, cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest")
    if keep is not None and (~keep).any():
        rows, cols = np.nonzero(~keep)
        for i, j in zip(rows, cols):
            ax.add_patch(_hatch_patch(i, j))
    ax.set_xticks(range(n_k), k_tokens, rotation=90 if max(map(len, k_tokens), default=0) > 3 else 0)
    ax.set_yticks(range(n_q), q_tokens)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if annotate if annotate is not None else max(n_q, n_k) <= ANNOTATE_UP_TO:
        for i in range(n_q):
            for j in range(n_k):
                if keep is None or keep[i, j]:
                    w = weights[i, j]
                    ax.text(j, i, f"{w:.3f}", ha="center", va="center", fontsize=8,
                            color="white" if w > 0.6 * vmax else "black")
    return im


def _hatch_patch(i: int, j: int):
    from matplotlib.patches import Rectangle
    return Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///", edgecolor="#909090", linewidth=0)


def _check_grid(weights, tokens, k_tokens, keep):
    weights = as_float_array("weights", weights)
    if weights.ndim != 2:
        raise ValueError(f"weights must be one (n_q, n_k) grid, got shape {weights.shape}")
    k_tokens = tokens if k_tokens is None else k_tokens
    if len(tokens) != weights.shape[0] or len(k_tokens) != weights.shape[1]:
        raise ValueError(f"tokens ({len(tokens)} queries, {len(k_tokens)} keys) do not match "
                         f"weights of shape {weights.shape}")
    if keep is not None:
        keep = as_bool_array("keep", keep)
        if keep.shape != weights.shape:
            raise ValueError(f"keep must have the weights' shape {weights.shape}, got {keep.shape}")
    return weights, list(map(str, tokens)), list(map(str, k_tokens)), keep


def save_head(path, weights, tokens, *, k_tokens=None, keep=None, title: str | None = None) -> None:
    """One head's (n_q, n_k) weights as a labelled heatmap with a colour bar, written to ``path``."""
    weights, tokens, k_tokens, keep = _check_grid(weights, tokens, k_tokens, keep)
    n_q, n_k = weights.shape
    fig = _figure(2.0 + 0.55 * n_k, 1.6 + 0.45 * n_q)
    ax = fig.add_subplot()
    im = draw_grid(ax, weights, tokens, k_tokens, keep=keep)
    fig.colorbar(im, ax=ax, label="attention weight")
    if title:
        ax.set_title(title)
    _save(fig, path)


def save_mask(path, tokens, *, k_tokens=None, title: str | None = "causal mask M") -> None:
    """The causal mask for ``tokens``: 0 where a query may look (white), −∞ where it may not (hatched)."""
    from ..masks import causal_mask
    k_tokens = tokens if k_tokens is None else k_tokens
    keep = causal_mask(len(tokens), len(k_tokens))                 # (n_q, n_k)
    tokens, k_tokens = list(map(str, tokens)), list(map(str, k_tokens))
    fig = _figure(1.6 + 0.55 * len(k_tokens), 1.4 + 0.45 * len(tokens))
    ax = fig.add_subplot()
    ax.imshow(np.where(keep, 0.0, np.nan), cmap="Greys", vmin=0, vmax=1, aspect="auto")
    ax.set_facecolor(MASKED_COLOUR)
    for i, j in zip(*np.nonzero(~keep)):
        ax.add_patch(_hatch_patch(i, j))
    for i in range(keep.shape[0]):
        for j in range(keep.shape[1]):
            ax.text(j, i, "0" if keep[i, j] else "−∞", ha="center", va="center", fontsize=9)
    ax.set_xticks(range(len(k_tokens)), k_tokens)
    ax.set_yticks(range(len(tokens)), tokens)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title)
    _save(fig, path)


def _save(fig, path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
