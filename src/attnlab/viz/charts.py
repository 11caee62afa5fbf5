"""Charts for the guide's experiments: histograms side by side, and growth curves on log axes.

matplotlib's object API only (no pyplot: no global state, no display), written through atomic_path.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_float_array, as_positive_int
from .png import _figure, _save

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def save_histograms(path, panels, *, title: str | None = None, bins: int = 60) -> None:
    """Panels of overlaid histograms, side by side.

    Parameters
    ----------
    path : path of the PNG
    panels : sequence of (panel title, x label, {label: samples (m,)})
        Each panel overlays its samples on shared bins.
    """
    bins = as_positive_int("bins", bins)
    panels = list(panels)
    if not panels:
        raise ValueError("panels must hold at least one (title, xlabel, {label: samples}) panel, got none")
    fig = _figure(4.6 * len(panels), 3.6)
    for ax, (panel_title, xlabel, series) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        data = {str(k): as_float_array(f"samples[{k!r}]", v, finite=True).ravel() for k, v in series.items()}
        if not data:
            raise ValueError(f"panel {panel_title!r} has no samples")
        lo = min(float(d.min()) for d in data.values())
        hi = max(float(d.max()) for d in data.values())
        edges = np.linspace(lo, hi if hi > lo else lo + 1, bins + 1)      # (bins + 1,) shared bins
        for colour, (label, d) in zip(COLOURS, data.items()):
            ax.hist(d, bins=edges, alpha=0.55, color=colour, label=label)
        ax.set_title(panel_title, fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("count")
        ax.legend(fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    _save(fig, path)


def save_growth(path, n, series, *, ylabel: str, title: str | None = None, marks=()) -> None:
    """Curves against ``n`` on log-log axes.

    Parameters
    ----------
    path : path of the PNG
    n : (m,) positive x values
    series : {label: (m,) positive y values}
    marks : sequence of (x, label)
        Vertical lines, e.g. a model's context length.
    """
    x = as_float_array("n", np.asarray(n, dtype=float), finite=True)                      # (points,)
    if x.ndim != 1 or (x <= 0).any():
        raise ValueError(f"n must be a 1-D array of positive numbers, got shape {x.shape}")
    fig = _figure(6.4, 4.2)
    ax = fig.add_subplot()
    for colour, (label, y) in zip(COLOURS, series.items()):
        y = as_float_array(f"series[{label!r}]", np.asarray(y, dtype=float), finite=True)   # (points,)
        if y.shape != x.shape or (y <= 0).any():
            raise ValueError(f"series[{label!r}] must hold {len(x)} positive values to match n, got {y.shape}")
        ax.loglog(x, y, marker="o", markersize=3, color=colour, label=label)
    for x_mark, label in marks:
        ax.axvline(x_mark, color="#777777", linestyle="--", linewidth=1)
        ax.annotate(label, (x_mark, 0.98), xycoords=("data", "axes fraction"), xytext=(-3, 0),
                    textcoords="offset points", ha="right", va="top",
                    rotation=90, fontsize=8, color="#555555")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens n")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, frameon=False)
    if title:
        ax.set_title(title)
    _save(fig, path)



def save_context(path, result, *, title: str | None = None) -> None:
    """Both cosines of :func:`attnlab.context.compare_in_context` against the hidden state: the token rows
    alone first, then the embeddings, then after each layer."""
    labels = ["W_E rows", "embeddings"] + [name.removeprefix("layer ") for name in result.layers[1:]]
    x = np.arange(len(labels))                                                          # (L + 2,)
    word = np.concatenate([[result.rows_word_cosine], result.word_cosine])              # (L + 2,)
    sentence = np.concatenate([[result.rows_sentence_cosine], result.sentence_cosine])  # (L + 2,)
    fig = _figure(6.4, 3.8)
    ax = fig.add_subplot()
    ax.plot(x, word, marker="o", color=COLOURS[0], label=f"{result.word!r} in A vs in B")
    ax.plot(x, sentence, marker="s", color=COLOURS[1], label="mean-pooled A vs B")
    ax.axvspan(1.5, len(labels) - 0.5, color="#f0f0f0", zorder=0)
    ax.annotate("attention layers", (0.98, 0.03), xycoords="axes fraction", ha="right", fontsize=8, color="#555555")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_xlabel("hidden state")
    ax.set_ylabel("cosine")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, frameon=False, loc="lower left")
    ax.set_title(title or f"{result.model}: {result.word!r} in two sentences", fontsize=10)
    _save(fig, path)
