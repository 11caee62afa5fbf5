"""The tour's page: one offline HTML file that teaches, section by section, with live widgets.

Each section is a plain dict (the tour builds them; this module never imports the CLI)::

    {"id": "lookup", "title": "...", "prose": ["...", ...], "text": "the numbers", "figures": [(png bytes,
     caption), ...], "commands": ["attnlab ..."], "widget": "lookup" | "sqrt_dk" | "mask" | "viewer" | None,
     "exercises": [(question, answer), ...]}

Widgets are plain JavaScript on the page (``tour_page.js``), with no server and no network:

- ``lookup``: drag the query on a 2-D plane holding the three keys; scores, weight bars and output update;
- ``sqrt_dk``: a slider for d_k showing the spread of dot products and the largest weight, unscaled and scaled;
- ``mask``: a toggle for the causal mask on the running example, recomputing A = softmax(S + M);
- ``viewer``: the interactive attention view of :mod:`attnlab.viz.html`, embedded in an ``<iframe srcdoc>``.

Their numbers travel in one JSON block; every number a widget shows also sits, unrounded, in its element's
``data-value``, so a test can compare it with numpy's. Text is escaped; answers hide behind ``<details>``.
"""

from __future__ import annotations

import base64
import html
import re
from importlib import resources

from .html import script_json

WIDGETS = ("lookup", "sqrt_dk", "mask", "viewer")


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _inline(text: str) -> str:
    """Escaped text with `backticks` as <code>."""
    parts = re.split(r"`([^`]+)`", text)
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p) for i, p in enumerate(parts))


def _widget(kind: str, viewer_page: str | None) -> str:
    if kind == "lookup":
        return """<div class="widget" id="lookup-widget">
<svg id="lookup-plane" width="360" height="360" viewBox="0 0 360 360" role="img"
 aria-label="the query and the three keys on a plane; drag the query"></svg>
<div class="side">
<p class="hint">Drag the orange query anywhere on the plane (each axis runs from −8 to 8).</p>
<p>query q = [<span id="lookup-q0"></span>, <span id="lookup-q1"></span>]
<label class="inline"><input type="checkbox" id="lookup-scaled"> divide the scores by √2</label></p>
<table id="lookup-table" class="numbers"><thead><tr><th>key of</th><th>k</th><th>score q·k</th><th>weight</th>
<th class="bar-col"></th><th>value v</th></tr></thead><tbody></tbody></table>
<p>output = Σ weight · value = [<span id="lookup-out0"></span>, <span id="lookup-out1"></span>]</p>
<p id="lookup-verdict" class="verdict"></p>
</div></div>"""
    if kind == "sqrt_dk":
        return """<div class="widget" id="sqrtdk-widget">
<p><label>d_k = <output id="sqrtdk-dk"></output>
<input type="range" id="sqrtdk-slider" min="0" max="8" step="1" value="6" aria-label="d_k"></label>
<span class="hint">(√d_k = <span id="sqrtdk-root"></span>)</span></p>
<table class="numbers"><thead><tr><th></th><th>unscaled q·k</th><th>divided by √d_k</th></tr></thead><tbody>
<tr><th>spread (standard deviation) of q·k, 10,000 pairs</th><td id="sqrtdk-std"></td><td id="sqrtdk-std-scaled"></td></tr>
<tr><th>average largest of 16 weights, 2,000 queries</th><td id="sqrtdk-top"></td><td id="sqrtdk-top-scaled"></td></tr>
</tbody></table>
<canvas id="sqrtdk-hist" width="640" height="190" aria-label="histograms of the dot products"></canvas>
<p id="sqrtdk-note" class="verdict"></p>
</div>"""
    if kind == "mask":
        return """<div class="widget" id="mask-widget">
<p><label><input type="checkbox" id="mask-toggle" checked> causal mask M on</label>
<span class="hint">A = softmax(S + M), row by row; rows are queries, columns keys.</span></p>
<table id="mask-grid" class="grid"></table>
<p id="mask-note" class="verdict"></p>
</div>"""
    if kind == "viewer":
        if viewer_page is None:
            return ""
        return (f'<div class="widget"><iframe id="viewer" title="interactive attention view" sandbox="allow-scripts" '
                f'srcdoc="{html.escape(viewer_page, quote=True)}"></iframe></div>')
    raise ValueError(f"widget must be one of {WIDGETS}, got {kind!r}")


def _section(i: int, s: dict, viewer_page: str | None) -> str:
    prose = "".join(f"<p>{_inline(p)}</p>" for p in s.get("prose", ()))
    figs = "".join(f'<figure><img src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}" '
                   f'alt="{html.escape(cap)}"><figcaption>{html.escape(cap)}</figcaption></figure>'
                   for png, cap in s.get("figures", ()))
    widget = _widget(s["widget"], viewer_page) if s.get("widget") else ""
    commands = "".join(f"<li><code>{html.escape(c)}</code></li>" for c in s.get("commands", ()))
    exercises = "".join(
        f'<div class="exercise"><p><strong>Exercise.</strong> {_inline(q)}</p>'
        f'<details><summary>Show the answer</summary><div class="answer">{_inline(a)}</div></details></div>'
        for q, a in s.get("exercises", ()))
    sid = html.escape(s.get("id", f"s{i}"), quote=True)
    return (f'<section id="{sid}"><h2>{i}. {html.escape(s["title"])}</h2>'
            f'<div class="prose">{prose}</div>{widget}'
            f'<div class="row"><pre class="numbers-text">{html.escape(s.get("text", ""))}</pre>'
            + (f'<div class="figs">{figs}</div>' if figs else "") + "</div>"
            + (f'<div class="try"><p>Vary it yourself:</p><ul>{commands}</ul></div>' if commands else "")
            + exercises + "</section>")


def render_tour(sections: list[dict], widget_data: dict, *, intro: list[str] = (),
                viewer_page: str | None = None) -> str:
    """The whole tour page as one string of HTML: inline CSS, JavaScript, data and figures.

    ``widget_data`` holds what the widgets compute from (see ``tour_page.js``); ``viewer_page`` is a
    complete page from :func:`attnlab.viz.render_html`, embedded as the ``viewer`` widget.
    """
    toc = "".join(f'<li><a href="#{html.escape(s.get("id", f"s{i}"), quote=True)}">{html.escape(s["title"])}</a></li>'
                  for i, s in enumerate(sections, 1))
    body = "".join(_section(i, s, viewer_page) for i, s in enumerate(sections, 1))
    intro_html = "".join(f"<p>{_inline(p)}</p>" for p in intro)
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>attnlab tour: Attention, letting tokens look at each other</title>
<style>
{_asset("tour_page.css")}</style>
</head>
<body>
<header><h1>attnlab tour</h1>{intro_html}<nav><ol>{toc}</ol></nav></header>
<main>{body}</main>
<script type="application/json" id="tour-data">{script_json(widget_data)}</script>
<script>
{_asset("tour_page.js")}</script>
</body>
</html>
"""
