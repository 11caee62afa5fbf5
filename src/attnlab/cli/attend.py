"""attnlab attend: a trained model's attention on a text, one head as a grid, or facts about every head."""

from __future__ import annotations

from ._app import add_command, add_json_flag, print_json
from ._model import add_model_option, load, model_arg


def register(sub) -> None:
    p = add_command(sub, "attend", help="show a trained model's attention on a text (BERT, GPT-2, Llama, Mistral, "
                                        "Qwen2 or your own)", section="Several heads at once",
                    shows="Shows a trained model's attention weights on TEXT, one head's grid (rows queries, "
                          "columns keys; layers and heads from 0) or a summary of every head",
                    more="The tour's section “A trained model's head” uses it; see docs/trained.md.",
                    examples=("attnlab attend 'The cat sat on the mat' --layer 0 --head 2   # a previous-token head",
                              "attnlab attend 'The cat sat on the mat' --summary"))
    p.add_argument("text", help="the text to run, e.g. 'The cat sat on the mat'")
    add_model_option(p, default="minilm")
    p.add_argument("--layer", type=int, default=0, help="layer to show, from 0 (default 0)")
    p.add_argument("--head", type=int, default=0, help="head to show, from 0 (default 0)")
    p.add_argument("--summary", action="store_true",
                   help="list every head's most-attended key per query, entropy and mean attention distance "
                        "(and, with grouped-query attention, the KV head it reads)")
    p.add_argument("--png", metavar="FILE", help="also save the chosen head as a PNG heatmap")
    p.add_argument("--html", metavar="FILE",
                   help="also save every layer and head as one self-contained interactive HTML page")
    add_json_flag(p)
    p.set_defaults(func=cmd_attend)


def cmd_attend(args) -> int:
    from ..models import attend
    from ..viz.summary import summarize_heads

    result = attend(args.text, load(args))
    amap = result.attentions
    amap.head(args.layer, args.head)                            # checks the indices first
    summary = summarize_heads(amap) if args.summary else None
    save_views(amap, args.layer, args.head, png=args.png, html=args.html)
    if args.json:
        data = {"model": model_arg(args), "tokens": list(result.tokens), "ids": result.ids,
                "attentions": amap.weights,                     # (layer, head, query, key)
                "kv_heads": [amap.kv_head(h) for h in range(amap.n_heads)]}   # the KV head each query head reads
        if summary is not None:
            data["summary"] = summary.rows()
        print_json(data)
        return 0
    kv = f" reading {amap.n_kv_heads} KV heads" if amap.grouped else ""
    print(f"{amap.source}: {len(result.tokens)} tokens, {amap.n_layers} layers x {amap.n_heads} heads{kv}")
    if summary is not None:
        print(format_summary(summary, amap))
        return 0
    from rich.console import Console

    from ..viz import terminal_grid
    Console(highlight=False).print(terminal_grid(amap, args.layer, args.head))
    for path in (args.png, args.html):
        if path:
            print(f"wrote {path}")
    return 0


def save_views(amap, layer: int, head: int, *, png=None, html=None) -> None:
    """The chosen head as a PNG heatmap, and the whole map as the interactive HTML page."""
    from ..viz import save_head, save_html
    if png:
        kv = amap.kv_note(head)
        save_head(png, amap.head(layer, head), amap.q_tokens, k_tokens=amap.tokens, keep=amap.keep,
                  title=f"{amap.source}: layer {layer}, head {head}" + (f" ({kv})" if kv else ""))
    if html:
        save_html(html, amap, layer=layer, head=head)


def label(token: str) -> str:
    """A token in a line of text: spaces made visible (␣), line breaks as every view shows them, at most 8
    characters."""
    from ..viz._style import display_token
    return display_token(token.replace(" ", "␣"), 8)


def format_summary(summary, amap=None) -> str:
    """One line per head: entropy, mean distance, then each query's most-attended key; with grouped-query
    attention (``amap.grouped``) a column for the KV head each query head reads, and a line saying so."""
    from ..viz.terminal import SUMMARY_LEGEND
    grouped = amap is not None and amap.grouped
    kv_head = "  kv" if grouped else ""
    lines = [*SUMMARY_LEGEND]
    if grouped:
        g = amap.n_heads // amap.n_kv_heads
        lines.append(f"kv: grouped-query attention, {amap.n_heads} query heads share {amap.n_kv_heads} key/value "
                     f"heads; heads {g}·k to {g}·k+{g - 1} all read KV head k (the same keys and values, their "
                     "own queries).")
    lines.append(f"layer head{kv_head}  entropy  distance  most-attended key per query")
    for r in summary.rows():
        tops = " ".join(f"{label(t['query'])}→{label(t['key'])}" for t in r["top_keys"])
        kv = f" {amap.kv_head(r['head']):>3}" if grouped else ""
        lines.append(f"{r['layer']:>5} {r['head']:>4}{kv}  {r['entropy']:7.3f}  {r['mean_distance']:8.3f}  {tops}")
    from ..viz.terminal import summary_note
    return "\n".join(lines + [n for n in [summary_note(summary.tokens, summary.top_key)] if n])
