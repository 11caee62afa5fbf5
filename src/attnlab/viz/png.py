"""PNG heatmaps of attention weights and masks, with matplotlib.

Four views: one head (``save_head``), all heads of a layer (``save_layer``), thumbnails of every
layer and head (``save_model_view``) and the causal mask (``save_mask``). Masked cells (the query may
not see that key) are drawn grey, hatched when cells are big enough, so they never look like a weight
that merely came out as zero (near-white).

Many tokens: a grid never grows past ``MOST_INCHES``; beyond that the image is downscaled, token labels
are thinned to every k-th and a note in the title says so. Past ``MAX_PNG_TOKENS`` a cell would be
smaller than a pixel and the functions refuse, pointing to the HTML view.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..kernels._checks import as_bool_array, as_float_array, as_positive_int
from .._io import atomic_path
from .attnmap import AttentionMap
from ._style import DARK_ABOVE, MASKED_COLOUR, display_token

DPI = 100
ANNOTATE_UP_TO = 12          # write the values in the cells when the grid is at most this wide
CELL_INCHES = 0.45           # one cell of a labelled grid: room for a value like 0.665
MOST_INCHES = 12.0           # the widest or tallest a single grid gets; more tokens are downscaled
MAX_PNG_TOKENS = 1024        # at MOST_INCHES·DPI = 1200 px, more tokens than this leave a cell under a pixel
HATCH_FROM_PX = 6            # hatch masked cells at least this many pixels wide (finer hatching is noise)
LABEL_CHARS = 16             # token labels longer than this are cut with "…"


@dataclass(frozen=True)
class Fit:
    """How a grid of n_q × n_k cells fits: its size in inches, label spacing and a note if downscaled."""
    width: float
    height: float
    step: int           # label every step-th token
    note: str           # "" unless the grid was downscaled
    n_k: int            # keys across the width

    @property
    def cell_px(self) -> float:
        """Width of one cell in pixels."""
        return self.width * DPI / max(self.n_k, 1)

    @property
    def interpolation(self) -> str:
        """"nearest" while a cell covers a pixel; below that, average cells rather than drop them."""
        return "nearest" if self.cell_px >= 1 else "antialiased"


def fit_grid(n_q: int, n_k: int, *, cell: float = CELL_INCHES, most: float = MOST_INCHES,
             label_pt: float = 8.0) -> Fit:
    """The size of one grid, downscaled to at most ``most`` inches a side, and how densely to label it.

    >>> fit_grid(5, 5).step, fit_grid(5, 5).note
    (1, '')
    >>> f = fit_grid(512, 512)
    >>> f.width, f.step
    (12.0, 7)
    """
    n = max(n_q, n_k)
    if n > MAX_PNG_TOKENS:
        raise ValueError(f"tokens: {n} tokens are too many for a readable PNG (at most {MAX_PNG_TOKENS}, "
                         "where a cell is one pixel); cut the input or use save_html, which draws long inputs")
    width, height = min(n_k * cell, most), min(n_q * cell, most)
    label_in = 1.3 * label_pt / 72                   # one label's line height, with a little air
    step = max(1, math.ceil(n * label_in / max(width, height, 1e-9)))
    note = ""
    if n * cell > most:
        note = f"downscaled: {n} tokens in {max(width, height):g} in"
        note += f", one token in {step} labelled" if step > 1 else ""
        note += ", values not written"
    return Fit(width=width, height=height, step=step, note=note, n_k=n_k)


def _figure(width: float, height: float, layout: str | None = "constrained"):
    from matplotlib.figure import Figure   # no pyplot: no global state, no display needed
    return Figure(figsize=(width, height), dpi=DPI, layout=layout)


def _labels(tokens) -> list[str]:
    return [display_token(str(t), LABEL_CHARS) for t in tokens]


def _label_room(tokens, fontsize: float) -> float:
    """Inches beside a grid for its longest token label and the axis name."""
    return 0.45 + 0.6 * fontsize / 72 * max(map(len, _labels(tokens)), default=1)


def draw_grid(ax, weights: np.ndarray, q_tokens, k_tokens, *, keep=None, vmax: float = 1.0,
              annotate: bool | None = None, cmap: str = "Blues", step: int = 1, hatch: bool = True,
              fontsize: float = 8, interpolation: str = "nearest"):
    """Draw one (n_q, n_k) grid of weights on ``ax``; returns the image for a colour bar.

    Masked cells (``keep`` False) show the grey axes face through the masked array, hatched if ``hatch``.
    ``step`` labels every step-th token; ``q_tokens``/``k_tokens`` None leaves that axis unlabelled.
    ``interpolation="antialiased"`` averages cells that are smaller than a pixel instead of dropping them.
    """
    n_q, n_k = weights.shape
    shown = np.ma.masked_array(weights, mask=None if keep is None else ~keep)   # (n_q, n_k)
    ax.set_facecolor(MASKED_COLOUR)
    im = ax.imshow(shown, cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto", interpolation=interpolation)
    ax.set_box_aspect(n_q / n_k)                     # square cells, whatever room the layout leaves
    if keep is not None and hatch and (~keep).any():
        ax.add_collection(_hatched(~keep))
    _tick_labels(ax, q_tokens, k_tokens, step, fontsize)
    if annotate if annotate is not None else max(n_q, n_k) <= ANNOTATE_UP_TO:
        for i, j in zip(*np.nonzero(np.ones_like(weights, bool) if keep is None else keep)):
            w = weights[i, j]
            ax.text(j, i, f"{w:.3f}", ha="center", va="center", fontsize=fontsize,
                    color="white" if w > DARK_ABOVE * vmax else "black")
    return im


def _tick_labels(ax, q_tokens, k_tokens, step: int, fontsize: float) -> None:
    for tokens, set_ticks, name in ((k_tokens, ax.set_xticks, "key"), (q_tokens, ax.set_yticks, "query")):
        if tokens is None:
            set_ticks([])
            continue
        where = range(0, len(tokens), step)
        labels = _labels(tokens)[::step]
        rotate = name == "key" and max(map(len, labels), default=0) > 3
        set_ticks(list(where), labels, fontsize=fontsize, rotation=90 if rotate else 0)
    if k_tokens is not None:
        ax.set_xlabel("key", fontsize=fontsize)
    if q_tokens is not None:
        ax.set_ylabel("query", fontsize=fontsize)


def _hatched(masked: np.ndarray):
    """One hatched collection over the masked cells, a rectangle per run of masked cells in a row."""
    from matplotlib.collections import PatchCollection
    from matplotlib.patches import Rectangle
    edges = np.diff(np.pad(masked.astype(np.int8), ((0, 0), (1, 1))), axis=1)   # (n_q, n_k + 1)
    rects = []
    for i, row in enumerate(edges):
        for start, stop in zip(np.flatnonzero(row == 1), np.flatnonzero(row == -1)):
            rects.append(Rectangle((start - 0.5, i - 0.5), stop - start, 1))
    return PatchCollection(rects, facecolor="none", edgecolor="#909090", hatch="///", linewidth=0)


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


def _check_map(amap) -> AttentionMap:
    if not isinstance(amap, AttentionMap):
        raise TypeError(f"amap must be an attnlab.AttentionMap, got {type(amap).__name__}")
    return amap


def _title(*parts: str) -> str:
    return "\n".join(p for p in parts if p)


def save_head(path, weights, tokens, *, k_tokens=None, keep=None, title: str | None = None) -> None:
    """One head's (n_q, n_k) weights as a labelled heatmap with a colour bar, written to ``path``.

    Raises
    ------
    ValueError
        The shapes disagree, or there are more than ``MAX_PNG_TOKENS`` tokens.
    OSError
        ``path`` cannot be written (its folder is missing or read-only).
    """
    _save(head_figure(weights, tokens, k_tokens=k_tokens, keep=keep, title=title), path)


def head_figure(weights, tokens, *, k_tokens=None, keep=None, title: str | None = None):
    """The matplotlib Figure that ``save_head`` writes (for notebooks, or to draw on further)."""
    weights, tokens, k_tokens, keep = _check_grid(weights, tokens, k_tokens, keep)
    n_q, n_k = weights.shape
    fit = fit_grid(n_q, n_k)
    fig = _figure(fit.width + _label_room(tokens, 8) + 1.3, fit.height + _label_room(k_tokens, 8) + 0.6)
    ax = fig.add_subplot()
    im = draw_grid(ax, weights, tokens, k_tokens, keep=keep, step=fit.step, annotate=None if not fit.note else False,
                   hatch=fit.cell_px >= HATCH_FROM_PX, interpolation=fit.interpolation)
    fig.colorbar(im, ax=ax, label="attention weight")
    ax.set_title(_title(title or "", fit.note), fontsize=10)
    return fig


def save_layer(path, amap: AttentionMap, layer: int) -> None:
    """Every head of one layer side by side, sharing one colour bar, written to ``path``.

    Raises
    ------
    ValueError
        ``layer`` is out of range, or there are more than ``MAX_PNG_TOKENS`` tokens.
    OSError
        ``path`` cannot be written.
    """
    _save(layer_figure(amap, layer), path)


def layer_figure(amap: AttentionMap, layer: int):
    """The matplotlib Figure that ``save_layer`` writes."""
    amap = _check_map(amap)
    amap.head(layer, 0)                                        # checks the layer index
    h, n_q, n_k = amap.weights.shape[1:]
    cols = min(h, 4)
    rows = math.ceil(h / cols)
    fit = fit_grid(n_q, n_k, cell=0.4, most=16.0 / cols, label_pt=7)
    fig = _figure(cols * (fit.width + _label_room(amap.q_tokens, 7) + 0.1) + 1.0,
                  rows * (fit.height + _label_room(amap.tokens, 7) + 0.4) + (0.9 if fit.note else 0.5))
    axes = fig.subplots(rows, cols, squeeze=False)
    for head, ax in enumerate(axes.ravel()):
        if head >= h:
            ax.set_axis_off()
            continue
        im = draw_grid(ax, amap.weights[layer, head], amap.q_tokens, amap.tokens, keep=amap.keep,
                       step=fit.step, annotate=max(n_q, n_k) <= 8, hatch=fit.cell_px >= HATCH_FROM_PX, fontsize=7,
                       interpolation=fit.interpolation)
        ax.set_title(f"head {head}", fontsize=9)
    fig.colorbar(im, ax=axes.ravel().tolist(), label="attention weight", shrink=0.8)
    fig.suptitle(_title(f"layer {layer}: all {h} heads" + (f" ({amap.source})" if amap.source else ""),
                        fit.note), fontsize=11)
    return fig


def save_model_view(path, amap: AttentionMap, *, labels_up_to: int = 8) -> None:
    """Thumbnails of every head, one row per layer and one column per head, written to ``path``.

    Token labels go on the left column and bottom row when there are at most ``labels_up_to`` tokens;
    a thumbnail has no room for more, and the title says they were left out.

    Raises
    ------
    ValueError
        There are more than ``MAX_PNG_TOKENS`` tokens.
    OSError
        ``path`` cannot be written.
    """
    _save(model_view_figure(amap, labels_up_to=labels_up_to), path)


def model_view_figure(amap: AttentionMap, *, labels_up_to: int = 8):
    """The matplotlib Figure that ``save_model_view`` writes."""
    amap = _check_map(amap)
    labels_up_to = as_positive_int("labels_up_to", labels_up_to)
    n_layers, h, n_q, n_k = amap.weights.shape
    thumb = min(1.3, 14.0 / h, 14.0 / n_layers)                # inches per thumbnail
    fit = fit_grid(n_q, n_k, cell=thumb / max(n_q, n_k), most=thumb)
    labelled = max(n_q, n_k) <= labels_up_to
    note = "" if labelled else f"{max(n_q, n_k)} tokens: token labels left out (see save_layer or save_html)"
    margin = 0.6 if labelled else 0.3
    fig = _figure(h * (thumb + 0.1) + margin + 1.4, n_layers * (thumb + 0.1) + margin + 0.8, layout=None)
    axes = fig.subplots(n_layers, h, squeeze=False)
    fig.subplots_adjust(left=(margin + 0.3) / fig.get_figwidth(), right=1 - 1.0 / fig.get_figwidth(),
                        bottom=margin / fig.get_figheight(), top=1 - 0.7 / fig.get_figheight(),
                        wspace=0.08, hspace=0.08)
    for (layer, head), ax in np.ndenumerate(axes):
        q_labels = amap.q_tokens if labelled and head == 0 else None
        k_labels = amap.tokens if labelled and layer == n_layers - 1 else None
        im = draw_grid(ax, amap.weights[layer, head], q_labels, k_labels, keep=amap.keep, annotate=False,
                       hatch=fit.cell_px >= HATCH_FROM_PX, fontsize=6,
                       interpolation=fit.interpolation)
        ax.set_xlabel("")
        ax.set_ylabel(f"layer {layer}" if head == 0 else "", fontsize=7)
        if layer == 0:
            ax.set_title(f"head {head}", fontsize=7)
    fig.colorbar(im, ax=axes.ravel().tolist(), label="attention weight", fraction=0.02)
    fig.suptitle(_title(f"model view: {n_layers} layers × {h} heads" + (f" ({amap.source})" if amap.source else ""),
                        note), fontsize=10)
    return fig


def save_mask(path, tokens, *, k_tokens=None, title: str | None = "causal mask M") -> None:
    """The causal mask for ``tokens``: 0 where a query may look (white), −∞ where it may not (hatched grey)."""
    _save(mask_figure(tokens, k_tokens=k_tokens, title=title), path)


def mask_figure(tokens, *, k_tokens=None, title: str | None = "causal mask M"):
    """The matplotlib Figure that ``save_mask`` writes."""
    from ..kernels.masks import causal_mask
    k_tokens = tokens if k_tokens is None else k_tokens
    keep = causal_mask(len(tokens), len(k_tokens))                 # (n_q, n_k)
    fit = fit_grid(len(tokens), len(k_tokens))
    fig = _figure(fit.width + 1.6, fit.height + 1.6)
    ax = fig.add_subplot()
    ax.imshow(np.where(keep, 0.0, np.nan), cmap="Greys", vmin=0, vmax=1, aspect="auto")   # (n_q, n_k)
    ax.set_facecolor(MASKED_COLOUR)
    if fit.cell_px >= HATCH_FROM_PX:
        ax.add_collection(_hatched(~keep))
    if not fit.note:
        for (i, j), k in np.ndenumerate(keep):
            ax.text(j, i, "0" if k else "−∞", ha="center", va="center", fontsize=9,
                    bbox=None if k else dict(facecolor=MASKED_COLOUR, edgecolor="none", pad=1))   # over the hatching
    _tick_labels(ax, list(map(str, tokens)), list(map(str, k_tokens)), fit.step, 9)
    ax.set_title(_title(title or "", fit.note), fontsize=10)
    return fig


def _save(fig, path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
