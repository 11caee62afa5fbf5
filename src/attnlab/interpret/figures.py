"""Figures of what heads do: layer × head heatmaps (detectors, ablation, patching, a corpus scan), the
induction run's curves, and its two heads on a repeated sequence. matplotlib is imported inside."""

from __future__ import annotations

import numpy as np

from ..viz.png import _figure, _save


def _heatmap(ax, grid: np.ndarray, *, title: str, xlabel: str, xticks=None, diverging: bool = False,
             fmt: str = "{:.2f}") -> None:
    grid = np.asarray(grid, dtype=float)                                 # (rows, cols)
    if diverging:
        lim = float(np.nanmax(np.abs(grid))) or 1.0
        im = ax.imshow(grid, cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto")
        dark = lambda v: abs(v) > 0.5 * lim                                # noqa: E731
    else:
        low, high = min(0.0, float(np.nanmin(grid))), float(np.nanmax(grid))
        im = ax.imshow(grid, cmap="viridis", vmin=low, aspect="auto")
        dark = lambda v: v < low + 0.6 * (high - low)                      # noqa: E731  viridis is dark low
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("layer")
    ax.set_yticks(range(grid.shape[0]))
    ax.set_xticks(range(grid.shape[1]))
    if xticks is not None:
        ax.set_xticklabels(xticks, rotation=90, fontsize=7)
    if grid.size <= 48:                                                  # small grids only: text is slow to draw
        for (i, j), v in np.ndenumerate(grid):
            ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=6, color="white" if dark(v) else "black")
    ax.figure.colorbar(im, ax=ax, shrink=0.8)


def save_head_grids(path, grids: dict, *, title: str = "", xlabel: str = "head", xticks=None,
                    diverging: bool = False) -> None:
    """One layer × head (or layer × position) heatmap per entry of ``grids`` {name: (rows, cols)}, side by side."""
    grids = {k: np.asarray(v) for k, v in grids.items()}
    widths = [max(3.0, 0.35 * g.shape[1] + 1.5) for g in grids.values()]
    rows = max(g.shape[0] for g in grids.values())
    fig = _figure(sum(widths), max(2.4, 0.35 * rows + 1.6))
    axes = fig.subplots(1, len(grids), squeeze=False, width_ratios=widths)[0]
    for ax, (name, g) in zip(axes, grids.items()):
        _heatmap(ax, g, title=name, xlabel=xlabel, xticks=xticks, diverging=diverging)
    if title:
        fig.suptitle(title, fontsize=11)
    _save(fig, path)


def save_induction_curves(path, run) -> None:
    """Loss on first occurrences and on repeats against the step, the phase change marked; below it, each
    head's previous-token and induction score over training."""
    h = run.history
    steps = [e.step for e in h]
    fig = _figure(7.0, 6.0)
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.plot(steps, [e.first_loss for e in h], label="first occurrences")
    top.plot(steps, [e.repeat_loss for e in h], label="repeats")
    from .induction import eval_batch, offset_baseline
    top.axhline(np.log(run.config.task.vocab_size), color="#777777", linestyle=":", linewidth=1, label="log V")
    top.axhline(offset_baseline(eval_batch(run.config), run.config.task), color="#777777", linestyle="-.",
                linewidth=1, label="one layer's guess by offset, without induction")
    phase = run.phase_change_step()
    if phase is not None:
        for ax in (top, bottom):
            ax.axvline(phase, color="#c0392b", linestyle="--", linewidth=1)
        top.annotate(f"phase change, step {phase}", (phase, 0.95), xycoords=("data", "axes fraction"),
                     xytext=(4, 0), textcoords="offset points", fontsize=8, color="#c0392b", va="top")
    top.set_ylabel("loss, nats")
    top.legend(fontsize=8, frameon=False)
    top.set_title(f"{run.config.n_layers}-layer attention-only model on repeated random tokens", fontsize=10)
    prev = np.stack([e.previous_token for e in h])                       # (evals, L, H)
    ind = np.stack([e.induction for e in h])                             # (evals, L, H)
    for layer in range(prev.shape[1]):
        for head in range(prev.shape[2]):
            bottom.plot(steps, prev[:, layer, head], linestyle="-", linewidth=1,
                        label=f"L{layer}H{head} previous-token")
            bottom.plot(steps, ind[:, layer, head], linestyle="--", linewidth=1, label=f"L{layer}H{head} induction")
    bottom.set_ylim(0, 1)
    bottom.set_xlabel("step")
    bottom.set_ylabel("detector score")
    bottom.legend(fontsize=6, frameon=False, ncol=2)
    _save(fig, path)


def save_two_heads(path, weights, tokens, heads) -> None:
    """``heads`` [(layer, head, name), …] of ``weights`` (n_layers, n_heads, n, n) side by side on ``tokens``."""
    from ..viz.png import draw_grid
    n = len(tokens)
    fig = _figure(4.2 * len(heads), 4.4)
    axes = fig.subplots(1, len(heads), squeeze=False)[0]
    for ax, (layer, head, name) in zip(axes, heads):
        draw_grid(ax, weights[layer][head], tokens, tokens, keep=np.tril(np.ones((n, n), bool)), annotate=False)
        ax.set_title(f"layer {layer}, head {head}: {name}", fontsize=10)
    _save(fig, path)


def save_token_curve(path, stages, p, *, title: str = "") -> None:
    """One token's probability ``p`` (n_stages,) after each stage of the stack (the logit lens), one point each."""
    fig = _figure(7.5, 3.2)
    ax = fig.subplots()
    x = np.arange(len(stages))
    ax.plot(x, p, marker="o", markersize=3)
    ax.set_xticks(x[::3], [s.replace("block ", "") for s in stages][::3], fontsize=8)
    ax.set_xlabel("after block (embed = before the first)")
    ax.set_ylabel("probability")
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=10)
    _save(fig, path)
