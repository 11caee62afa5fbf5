"""Charts for the guide's experiments: histograms side by side, and growth curves on log axes.

matplotlib's object API only (no pyplot: no global state, no display), written through atomic_path.
"""

from __future__ import annotations

import numpy as np

from ..kernels._checks import as_float_array, as_positive_int
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
    """Both cosines of :func:`attnlab.guide.context.compare_in_context` against the hidden state: the token rows
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


def save_floors(path, k, floors, predictions, *, title: str | None = None) -> None:
    """The n-gram floors as bars against the context length k, each bar marked with its number of predictions
    (a floor averages over its own predictions, so rows with fewer are not strictly comparable).

    Parameters
    ----------
    k, floors, predictions : (m,) each: context lengths, lowest cross-entropies (nats), predictions scored
    """
    floors = as_float_array("floors", np.asarray(floors, dtype=float), finite=True)   # (m,)
    k, predictions = np.asarray(k), np.asarray(predictions)                           # (m,) each
    if floors.ndim != 1 or not floors.size or k.shape != floors.shape or predictions.shape != floors.shape:
        raise ValueError(f"k, floors and predictions must be three 1-D arrays of one length, got shapes "
                         f"{k.shape}, {floors.shape} and {predictions.shape}")
    fig = _figure(6.4, 3.6)
    ax = fig.add_subplot()
    bars = ax.bar(k, floors, color=COLOURS[0], width=0.7)
    ax.bar_label(bars, [f"{f:.3f}\n{p} pred." for f, p in zip(floors, predictions)], fontsize=8, padding=2)
    ax.set_xticks(k)
    ax.set_xlabel("characters of context k")
    ax.set_ylabel("lowest cross-entropy (nats)")
    ax.set_ylim(0, float(floors.max()) * 1.25)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(title or "the floor each context length allows", fontsize=10)
    _save(fig, path)


def save_lookup(path, query, keys, values, tokens, *, title: str | None = None) -> None:
    """The soft lookup for 2-D keys: the query and the keys as arrows on a plane, and beside it each key's
    score q · k and softmax weight as bars, with the output Σ weight · value.

    Parameters
    ----------
    query : (2,)   keys : (m, 2)   values : (m, d_v)   tokens : m names for the keys
    """
    from ..kernels.softmax import softmax
    q = as_float_array("query", np.asarray(query, dtype=float), finite=True)        # (2,)
    k = as_float_array("keys", np.asarray(keys, dtype=float), finite=True)          # (m, 2)
    v = as_float_array("values", np.asarray(values, dtype=float), finite=True)      # (m, d_v)
    if q.shape != (2,) or k.ndim != 2 or k.shape[1] != 2 or v.ndim != 2 or len(v) != len(k) or len(tokens) != len(k):
        raise ValueError(f"query must have shape (2,), keys (m, 2), values (m, d_v) and tokens m names; got "
                         f"{q.shape}, {k.shape}, {v.shape} and {len(tokens)} names")
    scores = k @ q                                                                  # (m,)
    w = softmax(scores)                                                             # (m,)
    fig = _figure(8.4, 3.6)
    plane, bars = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.3]})
    reach = 1.4 * max(float(np.abs(np.vstack([k, q[None]])).max()), 1.0)
    for key, tok in zip(k, tokens):
        plane.annotate("", key, (0, 0), arrowprops=dict(arrowstyle="->", color=COLOURS[0], lw=2))
        plane.plot(*key, "o", color=COLOURS[0], markersize=5)             # a key at the origin is a dot alone
        plane.annotate(str(tok), key, xytext=(-4, 6), textcoords="offset points", color=COLOURS[0], fontsize=9,
                       ha="right")
    plane.annotate("", q, (0, 0), arrowprops=dict(arrowstyle="->", color=COLOURS[1], lw=2))
    plane.annotate("query", q, xytext=(4, -12), textcoords="offset points", color=COLOURS[1], fontsize=9)
    plane.set(xlim=(-reach, reach), ylim=(-reach, reach), aspect="equal")
    plane.axhline(0, color="#bbbbbb", linewidth=0.8)
    plane.axvline(0, color="#bbbbbb", linewidth=0.8)
    plane.set_title("keys (blue) and the query (orange)", fontsize=9)
    y = np.arange(len(k))                                                           # (m,)
    b = bars.barh(y, w, color=COLOURS[0])
    bars.bar_label(b, [f"{wi:.3f}  (score {si:.2f})" for wi, si in zip(w, scores)], fontsize=8, padding=3)
    bars.set_yticks(y, [str(t) for t in tokens])
    bars.invert_yaxis()
    bars.set_xlim(0, 1.45)
    bars.set_xlabel("weight = softmax(q · k)")
    out = ", ".join(f"{x:.3f}" for x in w @ v)
    bars.set_title(f"weights; output Σ weight · value = [{out}]", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    _save(fig, path)


def save_score_grids(path, panels, *, title: str | None = None) -> None:
    """Labelled grids side by side, values written in the cells: scores on a red-blue scale centred on 0
    (−∞ cells grey, hatched, marked −∞), weights on the Blues scale from 0 to 1.

    Parameters
    ----------
    panels : sequence of (panel title, (n_q, n_k) array, query labels, key labels, "scores" | "weights")
    """
    from .png import _hatched, _tick_labels
    panels = list(panels)
    if not panels:
        raise ValueError("panels must hold at least one (title, grid, rows, cols, kind) panel, got none")
    fig = _figure(3.4 * len(panels), 3.2)
    for ax, (panel_title, grid, rows, cols, kind) in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        grid = as_float_array(f"grid of {panel_title!r}", np.asarray(grid, dtype=float))   # (n_q, n_k)
        if grid.ndim != 2 or grid.shape != (len(rows), len(cols)) or kind not in ("scores", "weights"):
            raise ValueError(f"panel {panel_title!r} must be a ({len(rows)}, {len(cols)}) grid of kind 'scores' "
                             f"or 'weights', got shape {grid.shape} and kind {kind!r}")
        gone = np.isneginf(grid)                                                   # (n_q, n_k)
        if kind == "scores":
            reach = float(np.abs(grid[~gone]).max(initial=1e-9))
            cmap, lo, hi = "RdBu_r", -reach, reach
        else:
            cmap, lo, hi = "Blues", 0.0, 1.0
        ax.set_facecolor("#d9d9d9")
        ax.imshow(np.ma.masked_array(grid, gone), cmap=cmap, vmin=lo, vmax=hi, aspect="equal")
        if gone.any():
            ax.add_collection(_hatched(gone))
        for (i, j), x in np.ndenumerate(grid):
            dark = not gone[i, j] and (abs(x) > 0.6 * hi if kind == "scores" else x > 0.6)
            ax.text(j, i, "−∞" if gone[i, j] else f"{x:.3f}", ha="center", va="center", fontsize=8,
                    color="white" if dark else "black")
        _tick_labels(ax, list(rows), list(cols), 1, 8)
        ax.set_title(panel_title, fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    _save(fig, path)


def save_vectors(path, panels, *, title: str | None = None) -> None:
    """Vectors as grouped bars, one group per coordinate, one bar per vector; panels side by side.

    Parameters
    ----------
    panels : sequence of (panel title, {label: (d,) vector})
    """
    panels = list(panels)
    if not panels:
        raise ValueError("panels must hold at least one (title, {label: vector}) panel, got none")
    fig = _figure(4.2 * len(panels), 3.2)
    axes = fig.subplots(1, len(panels), squeeze=False, sharey=True)[0]
    for ax, (panel_title, series) in zip(axes, panels):
        data = {str(k): as_float_array(f"vector {k!r}", np.asarray(v, dtype=float), finite=True).ravel()
                for k, v in series.items()}
        if not data or len({len(d) for d in data.values()}) != 1:
            raise ValueError(f"panel {panel_title!r} must hold vectors of one length, got "
                             f"{[len(d) for d in data.values()]}")
        width = 0.8 / len(data)
        for i, (colour, (label, d)) in enumerate(zip(COLOURS, data.items())):
            ax.bar(np.arange(len(d)) + (i - (len(data) - 1) / 2) * width, d, width, color=colour, label=label)
        ax.axhline(0, color="#888888", linewidth=0.8)
        ax.set_xticks(np.arange(len(next(iter(data.values())))))
        ax.set_xlabel("coordinate")
        ax.set_title(panel_title, fontsize=9)
        ax.legend(fontsize=8, frameon=False)
        ax.grid(True, axis="y", alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    _save(fig, path)


def save_token_bars(path, tokens, panels, *, title: str | None = None) -> None:
    """One bar per token in each panel, panels stacked, the tokens on a shared axis: e.g. one head's attention
    weight on each token above how much leaving that token out changes the prediction.

    Parameters
    ----------
    tokens : sequence of n labels
    panels : sequence of (panel title, (n,) values); NaN draws no bar
    """
    tokens, panels = [str(t) for t in tokens], list(panels)
    if not panels:
        raise ValueError("panels must hold at least one (title, values) panel, got none")
    fig = _figure(max(6.6, 0.55 * len(tokens) + 1.5), 1.9 * len(panels) + 0.6)
    axes = fig.subplots(len(panels), 1, squeeze=False, sharex=True)[:, 0]
    for ax, colour, (panel_title, values) in zip(axes, COLOURS, panels):
        v = np.asarray(values, dtype=float).ravel()                    # (n,)
        if v.shape != (len(tokens),):
            raise ValueError(f"panel {panel_title!r} must hold one value per token ({len(tokens)}), got {v.shape}")
        ax.bar(np.arange(len(v)), np.nan_to_num(v), color=colour)
        ax.set_title(panel_title, fontsize=9, loc="left")
        ax.grid(True, axis="y", alpha=0.3)
    axes[-1].set_xticks(np.arange(len(tokens)), tokens, rotation=45, ha="right", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    _save(fig, path)


def save_shapes(path, steps, *, title: str | None = None) -> None:
    """Matrix products as boxes, left × right = result, one row per product; each box's sides are
    log2(size) + 1, so 5 and 768 both fit, and its true shape is written in it.

    Parameters
    ----------
    steps : sequence of ((name, (rows, cols)), (name, (rows, cols)), (name, (rows, cols))): left, right, result
    """
    from matplotlib.patches import Rectangle
    steps = list(steps)
    if not steps:
        raise ValueError("steps must hold at least one (left, right, result) product, got none")
    side = lambda n: np.log2(as_positive_int("a matrix size", n)) + 1                          # noqa: E731
    tallest = [max(side(shape[0]) for _, shape in step) for step in steps]
    wide = max(sum(side(shape[1]) for _, shape in step) + 3 for step in steps)
    high = sum(tallest) + 1.5 * (len(steps) - 1)
    inches = 7.0 / wide
    fig = _figure(7.0, high * inches + (0.5 if title else 0.2), layout=None)
    ax = fig.add_axes((0.01, 0.01, 0.98, 1 - (0.5 if title else 0.2) / (high * inches + (0.5 if title else 0.2))))
    top = 0.0
    for step, tall in zip(steps, tallest):
        x = 0.0
        for i, (name, (rows, cols)) in enumerate(step):
            w, h = side(cols), side(rows)
            ax.add_patch(Rectangle((x, top - (tall + h) / 2), w, h, facecolor="#deebf7", edgecolor=COLOURS[0]))
            ax.text(x + w / 2, top - tall / 2, f"{name}\n{rows}×{cols}", ha="center", va="center", fontsize=12)
            x += w + 1.5
            if i < 2:
                ax.text(x - 0.75, top - tall / 2, "×" if i == 0 else "=", ha="center", va="center", fontsize=16)
        top -= tall + 1.5
    ax.set_xlim(-0.3, wide + 0.3)
    ax.set_ylim(top + 1.3, 0.2)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=12)
    _save(fig, path)
