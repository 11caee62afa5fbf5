"""A self-contained interactive HTML view of an AttentionMap: one file, no server, no network.

The page holds its own CSS, JavaScript and data. It shows:

- a head view: queries on the left, keys on the right; hovering over (or clicking) a query draws
  its row of weights as lines and shades the keys;
- the head's grid as a heatmap, linked to the head view;
- a model view of thumbnails (layers × heads; click one to pick it) and a per-head summary table;
- with the map's queries and keys, bertviz's neuron view: for one query, q, k and q ∘ k per dimension
  against each key, with the scores and weights.

Everything is drawn on canvases, so 512 tokens (262,144 cells a head) stay responsive. The weights
travel as 16-bit fractions of 1 (error under 1e-5), zlib-deflated and base64-encoded inside a JSON
block; the browser inflates them with its built-in ``DecompressionStream``. User text (tokens, the
source) is escaped: it goes into the JSON block with ``<``, ``>`` and ``&`` as ``\\u`` escapes and
reaches the page only through ``textContent`` and canvas text.
"""

from __future__ import annotations

import base64
import html
import json
import zlib
from importlib import resources

import numpy as np

from .._io import atomic_path
from .attnmap import AttentionMap
from ._style import BLUES, DARK_ABOVE, MASKED_COLOUR
from .summary import SUMMARY_FIELDS, summarize_heads

MAX_HTML_CELLS = 64 * 1024 * 1024   # 128 MB of 16-bit weights before compression: past that a browser struggles
MAX_NEURON_NUMBERS = 4 * 1024 * 1024   # q and k of every head as float32 (16 MB): past that, no neuron view
_JSON_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                               "\u2028": "\\u2028", "\u2029": "\\u2029"})


def _packed(arr: np.ndarray) -> str:
    """Bytes of ``arr``, zlib-deflated, as base64 text."""
    return base64.b64encode(zlib.compress(arr.tobytes(), 1)).decode("ascii")   # level 1: within 3% of level 6, 3x faster


def script_json(data) -> str:
    """``data`` as JSON that is safe inside ``<script type="application/json">``: no ``<``, ``>`` or ``&``.

    >>> script_json({"token": "</script><b>"})
    '{"token": "\\\\u003c/script\\\\u003e\\\\u003cb\\\\u003e"}'
    """
    text = json.dumps(data, ensure_ascii=False, allow_nan=False)
    return text.translate(_JSON_ESCAPES)


def view_data(amap: AttentionMap, layer: int = 0, head: int = 0) -> dict:
    """Everything the page draws, as JSON-ready values; the page opens at ``layer``, ``head``."""
    if not isinstance(amap, AttentionMap):
        raise TypeError(f"amap must be an attnlab.AttentionMap, got {type(amap).__name__}")
    amap.head(layer, head)                                                    # checks both indices
    n_layers, n_heads, n_q, n_k = amap.weights.shape
    if amap.weights.size > MAX_HTML_CELLS:
        raise ValueError(f"amap has {amap.weights.size:,} weights ({n_layers} layers × {n_heads} heads × {n_q} × {n_k}), "
                         f"more than one page can hold ({MAX_HTML_CELLS:,}); pass fewer layers or tokens")
    fractions = np.empty(amap.weights.shape, "<u2")                          # (L, h, n_q, n_k)
    for i, a in enumerate(amap.weights):                                      # a: (h, n_q, n_k); NaN drawn as 0
        fractions[i] = np.rint(np.clip(np.nan_to_num(a, nan=0.0), 0.0, 1.0) * 65535)   # (h, n_q, n_k)
    summary = summarize_heads(amap).table()
    return {
        "source": amap.source, "tokens": list(amap.tokens),
        "n_layers": n_layers, "n_heads": n_heads, "n_q": n_q, "n_k": n_k, "start": [int(layer), int(head)],
        "kv_heads": [amap.kv_head(h) for h in range(n_heads)] if amap.grouped else None,   # KV head per query head
        "weights": _packed(fractions),
        "keep": None if amap.keep is None else _packed(amap.keep.astype(np.uint8)),   # (n_q, n_k)
        "summary_fields": list(SUMMARY_FIELDS),
        "summary": {k: np.round(v, 4).tolist() for k, v in summary.items()},     # (L, h) each
        "ramp": list(BLUES), "masked": MASKED_COLOUR, "dark_above": DARK_ABOVE,
        "neuron": neuron_data(amap),
    }


def neuron_data(amap: AttentionMap) -> dict | None:
    """q (L, h, n_q, d_head) and k (L, h, n_k, d_head) as packed float32 for the neuron view, with the
    score's scale; None without them, or with more than MAX_NEURON_NUMBERS numbers (the page says so)."""
    if amap.queries is None:
        return None
    total = amap.queries.size + amap.keys.size
    if total > MAX_NEURON_NUMBERS:
        return {"omitted": f"q and k hold {total:,} numbers, more than the page carries ({MAX_NEURON_NUMBERS:,})"}
    return {"d_head": int(amap.queries.shape[-1]), "scale": amap.scale,
            "q": _packed(amap.queries.astype("<f4")), "k": _packed(amap.keys.astype("<f4"))}


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def render_html(amap: AttentionMap, *, layer: int = 0, head: int = 0) -> str:
    """The whole interactive page for ``amap`` as one string of HTML (inline CSS, JS and data), opening at
    ``layer`` and ``head``.

    Raises
    ------
    TypeError
        ``amap`` is not an AttentionMap.
    ValueError
        ``amap`` holds more than ``MAX_HTML_CELLS`` weights.
    """
    data = view_data(amap, layer, head)
    source = html.escape(amap.source or "attention weights")
    headers = "".join(f'<th title="{html.escape(d)}">{html.escape(f)}</th>' for f, d in SUMMARY_FIELDS.items())
    legend = "".join(f"<dt>{html.escape(f)}</dt><dd>{html.escape(d)}</dd>" for f, d in SUMMARY_FIELDS.items())
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>attnlab · {source}</title>
<style>
{_asset("html_view.css")}</style>
</head>
<body>
<header>
<h1>Attention weights</h1>
<p class="source">{source}</p>
<div class="controls"><label>Layer <select id="layer"></select></label><label>Head <select id="head"></select></label><span id="status">loading…</span></div>
</header>
<main>
<section>
<h2>Head view</h2>
<p class="hint">Queries on the left, keys on the right. Hover over a query to see its row of weights as lines and shaded keys (click to pin it); hover over a key to see which queries take from it.</p>
<div class="scroll"><canvas id="head-view" aria-label="head view"></canvas></div>
</section>
<section>
<h2>Grid</h2>
<p class="hint">Rows are queries, columns keys; grey cells are masked. Hover for a value, click to pin a row.</p>
<canvas id="grid" aria-label="attention grid"></canvas>
<p id="readout"></p>
<p id="row"></p>
</section>
<section>
<h2>Model view</h2>
<p class="hint">Every layer and head; each pixel shows the largest weight it covers. Click a thumbnail to pick that head.</p>
<canvas id="model-view" aria-label="model view"></canvas>
<h2 id="summary-title" style="margin-top:12px">Per-head summary</h2>
<table id="summary"><thead><tr><th>head</th>{headers}</tr></thead><tbody></tbody></table>
<dl id="summary-legend" class="hint">{legend}</dl>
</section>
<section id="neuron-section">
<h2>Neuron view</h2>
<p class="hint">For the active query (hover or click one): its q, then for each key k, q ∘ k (each dimension's share of the score, red positive, blue negative), the score scale · q·k (before any position bias such as ALiBi's) and the weight. q and k are as attention saw them, after RoPE.</p>
<div class="scroll"><canvas id="neuron" aria-label="neuron view"></canvas></div>
<p id="neuron-readout"></p>
</section>
</main>
<script type="application/json" id="attnlab-data">{script_json(data)}</script>
<script>
{_asset("html_view.js")}</script>
</body>
</html>
"""


def save_html(path, amap: AttentionMap, *, layer: int = 0, head: int = 0) -> None:
    """Write the interactive page for ``amap`` to ``path``: one file that works offline, opening at ``layer``
    and ``head``.

    Raises
    ------
    OSError
        ``path`` cannot be written (its folder is missing, or it is a folder).
    """
    page = render_html(amap, layer=layer, head=head)
    with atomic_path(path) as tmp:
        tmp.write_text(page, encoding="utf-8")


def repr_html(amap: AttentionMap, *, height: int = 760) -> str:
    """The page inside an ``<iframe srcdoc>`` for Jupyter: its scripts run apart from the notebook's."""
    return (f'<iframe srcdoc="{html.escape(render_html(amap), quote=True)}" sandbox="allow-scripts" '
            f'style="width:100%;height:{int(height)}px;border:1px solid #ddd" title="attention weights"></iframe>')


class HTMLView:
    """An AttentionMap as Jupyter shows it (``_repr_html_``): the interactive page in an iframe."""

    def __init__(self, amap: AttentionMap, height: int = 760):
        if not isinstance(amap, AttentionMap):
            raise TypeError(f"amap must be an attnlab.AttentionMap, got {type(amap).__name__}")
        self.amap, self.height = amap, height

    def _repr_html_(self) -> str:
        return repr_html(self.amap, height=self.height)


def show(amap: AttentionMap, *, height: int = 760) -> HTMLView:
    """In Jupyter, ``show(amap)`` as a cell's last line draws the interactive view of ``amap``."""
    return HTMLView(amap, height)
