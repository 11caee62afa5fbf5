"""One head's grid of weights in the terminal: coloured cells (rich) or plain text, fitted to a width.

Each cell is 4 columns wide and shows the weight to two places (``.42``, ``1.0``); a masked cell shows
``·`` on grey. What does not fit is elided in the middle (the first and last keys and queries stay) and
a line under the grid says which ones were left out.
"""

from __future__ import annotations

import textwrap
import unicodedata
from dataclasses import dataclass

import numpy as np

from ..kernels._checks import as_positive_int
from .attnmap import AttentionMap
from ._style import DARK_ABOVE, MASKED_COLOUR, display_token, shade

CELL = 4                 # columns per cell: a space and ".42"
LABEL_MOST = 12          # query labels are cut to this many columns
ELIDED = "…"

Piece = tuple[str, str | None]        # text and a rich style (None = plain)


@dataclass(frozen=True)
class GridLayout:
    """What fits: the lines of the grid as styled pieces, the note on what was elided, and the legend of
    numbered keys (empty when every key's label fits its 3-column header)."""
    title: str
    lines: tuple[tuple[Piece, ...], ...]
    note: str
    legend: tuple[str, ...] = ()


def cell_width(text: str) -> int:
    """Terminal columns ``text`` takes: 2 for wide East Asian characters, 0 for combining marks.

    >>> cell_width("cat"), cell_width("猫")
    (3, 2)
    """
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
               for c in text)


def fit_cells(text: str, width: int) -> str:
    """``text`` cut (with "…") or padded with spaces to exactly ``width`` terminal columns."""
    if cell_width(text) > width:
        while text and cell_width(text) > width - 1:
            text = text[:-1]
        text += ELIDED
    return text + " " * (width - cell_width(text))


def _kept(n: int, room: int) -> list[int | None]:
    """Indices 0..n-1 that fit in ``room`` slots: all, or the first and last with None (elided) between."""
    if n <= room:
        return list(range(n))
    head = (room - 1) // 2
    return [*range(head), None, *range(n - (room - 1 - head), n)]


def _span(idx: list[int | None], n: int, what: str) -> str:
    shown = [i for i in idx if i is not None]
    if len(shown) == n:
        return ""
    gap = [i for i in range(n) if i not in set(shown)]
    return f"{what} {gap[0]}–{gap[-1]} ({len(gap)} of {n})"


def _short(token: str) -> str:
    """A key's label for a 3-column header: without the leading space GPT-2 tokens carry; a token of spaces
    only (a character-level model's " ") shows them as ␣, never as a blank."""
    return display_token(token).strip() or _visible(token)


def _visible(token: str) -> str:
    """A label that is never blank: a token of spaces only is shown as ␣ per space.

    >>> _visible(" "), _visible(" cat")
    ('␣', ' cat')
    """
    text = display_token(token)
    return text.replace(" ", "␣") if not text.strip() else text


def _cell(w: float, kept: bool) -> Piece:
    if not kept:
        return ("  · ", f"#909090 on {MASKED_COLOUR}")
    text = " 1.0" if w >= 0.995 else " " + f"{w:.2f}"[1:]      # "0.42" -> " .42"
    r, g, b = shade(w)
    return (text, f"{'white' if w > DARK_ABOVE else 'black'} on rgb({r},{g},{b})")


def layout_grid(amap: AttentionMap, layer: int, head: int, *, width: int = 80, max_rows: int = 40) -> GridLayout:
    """Lay out one head's grid in ``width`` columns and at most ``max_rows`` query rows."""
    if not isinstance(amap, AttentionMap):
        raise TypeError(f"amap must be an attnlab.AttentionMap, got {type(amap).__name__}")
    a = amap.head(layer, head)                                     # (n_q, n_k)
    width, max_rows = as_positive_int("width", width), as_positive_int("max_rows", max_rows)
    n_q, n_k = a.shape
    numbered = any(cell_width(_short(t)) > CELL - 1 for t in amap.tokens)   # key labels too long for a header
    offset = n_k - n_q                                                # query i is key i + offset
    q_labels = [_visible(t) for t in amap.q_tokens]
    if numbered:
        q_labels = [f"{i + offset} {t}" for i, t in enumerate(q_labels)]
    label = min(max(3, *map(cell_width, q_labels)), LABEL_MOST)
    if width < label + 1 + 3 * CELL:
        raise ValueError(f"width must leave room for a label and 3 cells, at least {label + 1 + 3 * CELL}, got {width}")
    cols = _kept(n_k, (width - label - 1) // CELL)
    rows = _kept(n_q, max(max_rows, 3))
    keep = np.ones_like(a, bool) if amap.keep is None else amap.keep  # (n_q, n_k)
    head_label = (lambda j: str(j)) if numbered else (lambda j: _short(amap.tokens[j]))
    header = [(" " * (label + 1), None)] + [
        (" " + fit_cells(ELIDED if j is None else head_label(j), CELL - 1), "bold") for j in cols]
    lines = [tuple(header)]
    for i in rows:
        if i is None:
            lines.append(((fit_cells("⋮", label) + " ", "dim"),))
            continue
        cells = [(" " + fit_cells(ELIDED, CELL - 1), "dim") if j is None else _cell(a[i, j], keep[i, j])
                 for j in cols]
        lines.append(((fit_cells(q_labels[i], label) + " ", "bold"), *cells))
    elided = [s for s in (_span(cols, n_k, "keys"), _span(rows, n_q, "queries")) if s]
    notes = ["· = masked."] if (~keep).any() else []
    if elided:
        notes.append(f"Elided to fit {width} columns: " + "; ".join(elided) + ".")
    legend: tuple[str, ...] = ()
    if numbered:
        notes.append("Keys are numbered to fit their 3-column headers (rows carry the same numbers); the legend "
                     "above gives each in full, and --json gives every token.")
        legend = _legend([f"{j}={_visible(amap.tokens[j])}" for j in cols if j is not None], width)
    sink = sink_note(amap, layer, head)
    if sink:
        notes.append(sink)
    note = " ".join(notes)
    kv = amap.kv_note(head)
    title = f"layer {layer}, head {head}" + (f" ({kv})" if kv else "") + (f" — {amap.source}" if amap.source else "")
    return GridLayout(title=title, lines=tuple(lines), note=note, legend=legend)


def _legend(items: list[str], width: int) -> tuple[str, ...]:
    """``items`` joined by two spaces into lines of at most ``width`` terminal columns (an item too long is cut)."""
    lines, line = [], ""
    for item in items:
        item = item if cell_width(item) <= width else fit_cells(item, width).rstrip()
        if line and cell_width(line) + 2 + cell_width(item) > width:
            lines.append(line)
            line = ""
        line = f"{line}  {item}" if line else item
    if line:
        lines.append(line)
    return tuple(lines)


SUMMARY_LEGEND = (
    "entropy: of a query's weights, in nats, averaged over the queries (0 = all on one key, log n = even spread)",
    "distance: mean |query position − key position| weighted by attention, in tokens (1 = the previous token)",
    "query→key: each query's most-attended key",
)

def summary_note(tokens, top_key: np.ndarray) -> str:
    """How many heads send most queries' strongest weight to [CLS]/[SEP], and why; "" when none do.

    ``top_key`` (n_layers, n_heads, n_q) is each query's most-attended key (``HeadSummary.top_key``).
    """
    special = [j for j, t in enumerate(tokens) if t in SPECIAL]
    if not special:
        return ""
    share = np.isin(top_key, special).mean(axis=-1)                  # (n_layers, n_heads)
    parked = int((share > 0.5).sum())
    if not parked:
        return ""
    return (f"{parked} of {share.size} heads send most queries' strongest weight to [CLS] or [SEP]: a head with "
            "nothing to fetch parks its weight on a special token, which works as a no-op (Clark et al., 2019, "
            "'What does BERT look at?'); it does not mean those tokens carry the meaning.")


SPECIAL = ("[CLS]", "[SEP]", "<|endoftext|>", "<s>", "</s>")


def sink_note(amap: AttentionMap, layer: int, head: int) -> str:
    """Why a head puts most of its queries' weight on [CLS]/[SEP] or on the first token, or "" when it doesn't.

    >>> m = AttentionMap(tokens=("[CLS]", "a", "b", "[SEP]"), weights=np.tile([0.9, 0.05, 0.0, 0.05], (4, 1)))
    >>> sink_note(m, 0, 0).split(":")[0]
    'Most queries here put their largest weight on [CLS]'
    """
    a = amap.head(layer, head)                                       # (n_q, n_k)
    top = np.argmax(a, axis=1)                                       # (n_q,)
    n_q = len(top)
    if n_q < 2:
        return ""
    special = [j for j, t in enumerate(amap.tokens) if t in SPECIAL]
    on_special = np.isin(top, special)                               # (n_q,)
    if on_special.sum() * 2 > n_q:
        names = "/".join(dict.fromkeys(amap.tokens[j] for j in top[on_special]))
        return (f"Most queries here put their largest weight on {names}: a trained head with nothing to fetch "
                f"for a query parks its weight on a special token, which works as a no-op (Clark et al., 2019, "
                f"'What does BERT look at?'). It does not mean {names} carries the meaning.")
    keep = np.ones_like(a, bool) if amap.keep is None else amap.keep  # (n_q, n_k)
    free = keep.sum(axis=1) >= 3                                     # (n_q,) queries with a real choice
    if free.any() and (top[free] == 0).sum() * 2 > free.sum() and a[free, 0].mean() > 0.5:
        return ("Most queries here put their largest weight on the first token: trained heads use it as a "
                "resting place when nothing else matches (an 'attention sink', Xiao et al., 2023).")
    return ""


def terminal_grid(amap: AttentionMap, layer: int, head: int, width: int = 80, *, max_rows: int = 40):
    """One head's weights as a rich renderable: coloured cells with token labels, at most ``width`` wide.

    Print it with ``rich.console.Console().print(...)``. Query rows beyond ``max_rows`` and keys beyond
    the width are elided in the middle, and the last line says which.

    Raises
    ------
    ValueError
        ``layer``/``head`` out of range, or ``width`` too narrow for a label and three cells.
    """
    from rich.console import Group
    from rich.text import Text

    g = layout_grid(amap, layer, head, width=width, max_rows=max_rows)
    grid = [Text.assemble(*((t, s or "") for t, s in line), no_wrap=True, overflow="crop") for line in g.lines]
    legend = [Text(line, style="bold", no_wrap=True, overflow="crop") for line in g.legend]
    note = Text("\n".join(textwrap.wrap(g.note, width)), style="dim")
    return Group(Text(fit_cells(g.title, width).rstrip(), style="bold"), *grid, *legend, note)


def terminal_text(amap: AttentionMap, layer: int, head: int, width: int = 80, *, max_rows: int = 40) -> str:
    """The same grid as plain text without colours, for logs and terminals without rich.

    >>> from attnlab import AttentionMap
    >>> m = AttentionMap(tokens=("a", "b"), weights=np.array([[1.0, 0.0], [0.25, 0.75]]),
    ...                  keep=np.array([[True, False], [True, True]]))
    >>> print(terminal_text(m, 0, 0))
    layer 0, head 0
         a   b
    a    1.0  ·
    b    .25 .75
    · = masked.
    """
    g = layout_grid(amap, layer, head, width=width, max_rows=max_rows)
    grid = ["".join(t for t, _ in line).rstrip() for line in g.lines]
    return "\n".join([fit_cells(g.title, width).rstrip(), *grid, *g.legend, *textwrap.wrap(g.note, width)])
