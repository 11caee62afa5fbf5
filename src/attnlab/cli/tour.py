"""attnlab tour: the guide, section by section, printing every number it prints and drawing its figures.

The tour is the ordered list :data:`SECTIONS` of functions ``section(ctx) -> Section``. Each returns its
printed text, its data (for ``--json``) and the figures it wrote into ``ctx.out``; the tour prints them
under a heading and writes ``index.html`` with the figures beside the text. To add a section, append a
function to SECTIONS.
"""

from __future__ import annotations

import base64
import html
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import guide as g
from .._io import atomic_path
from ..masks import causal_mask
from . import guide as cg
from ._app import add_json_flag, jsonable, print_json

DEFAULT_OUT = "attnlab-tour"


@dataclass(frozen=True)
class Figure:
    file: str                # name inside the output folder
    caption: str


@dataclass(frozen=True)
class Section:
    title: str
    text: str
    data: dict = field(default_factory=dict)
    figures: tuple[Figure, ...] = ()


@dataclass(frozen=True, eq=False)
class TourContext:
    """What sections share: where figures go, and the guide's toy (trained once)."""
    out: Path
    toy: g.GuideToy


def section_floors(ctx: TourContext) -> Section:
    r = cg.report_floors(g.TOY_TEXT, 5)
    return Section("Why context pays: n-gram floors", r.text, r.data)


def section_lookup(ctx: TourContext) -> Section:
    r = cg.report_lookup()
    return Section("The idea: a soft lookup", r.text, r.data)


def section_shapes(ctx: TourContext) -> Section:
    r = _needs_tokenizer(lambda: cg.report_shapes(g.RUNNING_EXAMPLE, "gpt2-small"))
    return Section("Where queries, keys and values come from", r.text, r.data)


def _needs_tokenizer(report):
    """A report that needs GPT-2's tokenizer, or a note saying how to get it: the tour goes on without it."""
    try:
        return report()
    except FileNotFoundError as e:
        return cg.Report(f"(skipped: {e})", {"skipped": str(e)})


def section_scale(ctx: TourContext) -> Section:
    from ..viz.charts import save_histograms
    run = cg.run_scale()
    r = cg.report_scale(run)
    spread = {f"d_k = {s.d_k}": s.dots for s in run.spreads}
    panels = [("u · v spreads as √d_k", "u · v", spread),
              ("divided by √d_k: the same spread", "u · v / √d_k",
               {f"d_k = {s.d_k}": s.dots / np.sqrt(s.d_k) for s in run.spreads}),
              (f"largest of {run.top.n_keys} weights, d_k = {run.top.d_k}", "largest weight",
               {f"unscaled (mean {run.top.mean:.3f})": run.top.top,
                f"divided by √{run.top.d_k} (mean {run.top.mean_scaled:.3f})": run.top.top_scaled})]
    save_histograms(ctx.out / "sqrt_dk.png", panels, title="Why attention divides the scores by √d_k")
    return Section("Keeping the softmax usable: the square root of d_k", r.text, r.data,
                   (Figure("sqrt_dk.png", "dot products and the largest weight, unscaled and scaled"),))


def section_mask(ctx: TourContext) -> Section:
    from ..viz import save_head, save_mask
    tokens = _needs_tokenizer(lambda: cg.report_tokens(g.RUNNING_EXAMPLE))
    mask = cg.report_mask(g.RUNNING_EXAMPLE.split())
    embed = cg.report_embed(ctx.toy)
    save_mask(ctx.out / "mask.png", g.RUNNING_EXAMPLE.split(), title="causal mask M for the running example")
    figures = [Figure("mask.png", "the causal mask M: 0 where a token may look, −∞ (hatched) where not")]
    for i, grid in enumerate(embed.data["grids"]):
        words = grid["sentence"].split()
        name = f"attention_{i + 1}.png"
        save_head(ctx.out / name, grid["weights"], words, keep=causal_mask(len(words)),
                  title=f"A for '{grid['sentence']}' (untrained)")
        figures.append(Figure(name, f"attention weights for '{grid['sentence']}', random W_Q, W_K, W_V"))
    text = "\n".join([tokens.text, mask.text, embed.text])
    return Section("No peeking: the causal mask", text,
                   {"tokens": tokens.data, "mask": mask.data, "embed": embed.data}, tuple(figures))


def section_explain(ctx: TourContext) -> Section:
    r = cg.report_explain(ctx.toy, "the cat sat")
    return Section("The equation, symbol by symbol", r.text, r.data)


def section_heads(ctx: TourContext) -> Section:
    r = cg.report_heads()
    return Section("Several heads at once", r.text, r.data)


def section_order(ctx: TourContext) -> Section:
    r = cg.report_order(ctx.toy)
    return Section("Order: giving tokens a position", r.text, r.data)


def section_cost(ctx: TourContext) -> Section:
    from ..viz.charts import save_growth
    r = cg.report_cost(5)
    rows = g.growth()
    n = [c.n for c in rows]
    marks = [(g.GPT2_SMALL_COST.attention.n_ctx, "GPT-2 n_ctx = 1,024")]
    save_growth(ctx.out / "cost_memory.png", n,
                {"score grid, naive (one layer)": [c.grid_bytes_naive for c in rows],
                 "score grid, tiled (one layer)": [c.grid_bytes_tiled for c in rows],
                 "KV cache (12 layers)": [c.kv_cache_bytes for c in rows]},
                ylabel="bytes (float32)", title="GPT-2 small: memory as n grows", marks=marks)
    save_growth(ctx.out / "cost_compute.png", n,
                {"scores per layer (n²)": [c.scores_per_layer for c in rows],
                 "FLOPs per layer": [c.flops_per_layer for c in rows],
                 "FLOPs in QKᵀ and AV": [c.flops_scores for c in rows]},
                ylabel="count", title="GPT-2 small: compute as n grows", marks=marks)
    return Section("The price of looking at everything", r.text, r.data,
                   (Figure("cost_memory.png", "score-grid bytes, naive vs tiled, and the KV cache"),
                    Figure("cost_compute.png", "scores and FLOPs per layer")))


def section_trained(ctx: TourContext) -> Section:
    from ..viz import save_head
    from .attend import report_trained_head
    try:
        r = report_trained_head(g.RUNNING_EXAMPLE)
    except FileNotFoundError as e:           # the trained model's package is not installed: say so, go on
        return Section("A trained model's head", f"(skipped: {e})", {"skipped": str(e)})
    d = r.data
    figures = []
    for kind in ("trained", "untrained"):
        name = f"{kind}_head.png"
        save_head(ctx.out / name, np.array(d[kind]), d["tokens"],
                  title=f"{d['model']} layer {d['layer']}, head {d['head']}" if kind == "trained"
                  else "the same shape, untrained")
        figures.append(Figure(name, f"{kind} head on '{g.RUNNING_EXAMPLE}'"))
    return Section("A trained model's head", r.text, d, tuple(figures))


SECTIONS = [section_floors, section_lookup, section_shapes, section_scale, section_mask, section_explain,
            section_heads, section_order, section_cost, section_trained]


def prepare_out(out) -> Path:
    """Create the output folder; an unwritable one raises OSError before any work is done."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not os.access(out, os.W_OK | os.X_OK):
        raise PermissionError(13, "Permission denied", str(out))
    return out


def run_tour(out, sections=SECTIONS, *, on_section=None) -> list[Section]:
    """Run ``sections`` in order, writing figures and index.html into ``out``; return what they printed.

    ``on_section(i, total, section)`` is called after each one (the CLI prints there).
    """
    ctx = TourContext(out=prepare_out(out), toy=g.guide_toy())
    done = []
    for i, section in enumerate(sections):
        s = section(ctx)
        done.append(s)
        if on_section is not None:
            on_section(i, len(sections), s)
    with atomic_path(ctx.out / "index.html") as tmp:
        tmp.write_text(render_html(done, ctx.out), encoding="utf-8")
    return done


PAGE_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 110em; padding: 0 1em; color: #222; }
section { border-top: 1px solid #ddd; padding: 1em 0; }
.row { display: flex; flex-wrap: wrap; gap: 1.5em; align-items: flex-start; }
pre { background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; margin: 0; flex: 0 1 auto; }
.figs { display: flex; flex-wrap: wrap; gap: 1em; flex: 1 1 30em; }
figure { margin: 0; } figure img { max-width: 100%; } figcaption { font-size: 0.85em; color: #555; }
"""


def render_html(sections: list[Section], out: Path) -> str:
    """A self-contained page: every figure inlined as a data URI, every piece of text escaped."""
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>attnlab tour: Attention, letting tokens look at each other</title>",
             f"<style>{PAGE_STYLE}</style></head><body>",
             "<h1>attnlab tour</h1><p>Every number the guide <em>Attention: letting tokens look at each other</em> "
             "prints, reproduced with attnlab, section by section.</p>"]
    for i, s in enumerate(sections, 1):
        figs = "".join(f'<figure><img src="{_data_uri(out / f.file)}" alt="{html.escape(f.caption)}">'
                       f"<figcaption>{html.escape(f.caption)}</figcaption></figure>" for f in s.figures)
        parts.append(f"<section><h2>{i}. {html.escape(s.title)}</h2><div class=\"row\">"
                     f"<pre>{html.escape(s.text)}</pre>" + (f'<div class="figs">{figs}</div>' if figs else "")
                     + "</div></section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def register(sub) -> None:
    p = sub.add_parser("tour", help="run the guide's examples in order, with figures and an HTML page")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"folder for the figures and index.html (./{DEFAULT_OUT})")
    add_json_flag(p)
    p.set_defaults(func=cmd_tour)


def cmd_tour(args) -> int:
    def show(i, total, s):
        if not args.json:
            print(f"\n== [{i + 1}/{total}] {s.title} ==\n{s.text}", flush=True)
            for f in s.figures:
                print(f"   figure: {Path(args.out) / f.file}  ({f.caption})")

    sections = run_tour(args.out, on_section=show)
    page = Path(args.out) / "index.html"
    if args.json:
        print_json({"out": str(args.out), "index": str(page), "sections": [
            {"title": s.title, "data": jsonable(s.data), "figures": [f.file for f in s.figures]}
            for s in sections]})
    else:
        print(f"\nWrote {len(sections)} sections' figures and {page}")
    return 0
