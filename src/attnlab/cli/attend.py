"""attnlab attend: a trained model's attention on a text, one head as a grid, or facts about every head."""

from __future__ import annotations

import re

import numpy as np

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
    p.add_argument("--layers", metavar="LIST", help="several layers: 3, -1 (the last), 0,4,7 or 2-5; with "
                   "--summary its rows, else each chosen head's grid (default: every layer with --summary)")
    p.add_argument("--heads", metavar="LIST", help="several heads, as --layers (default: every head with --summary)")
    p.add_argument("--position", metavar="LIST", help="the query positions shown: -1 (the last, the common case), "
                   "0,3 or 2-5 (default all); each chosen head's weights from those queries, one line each")
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
    heads = chosen_heads(args, amap)                            # [(layer, head)] the grids or summary rows shown
    positions = pick(args.position, "--position", amap.weights.shape[-2], "query position")
    summary = summarize_heads(amap) if args.summary else None
    save_views(amap, args.layer, args.head, png=args.png, html=args.html)
    if args.json:
        layers = pick(args.layers, "--layers", amap.n_layers, "layer")   # every layer and head unless asked
        hs = pick(args.heads, "--heads", amap.n_heads, "head")
        data = {"model": model_arg(args), "tokens": list(result.tokens), "ids": result.ids,
                "layers": layers, "heads": hs, "positions": positions,   # the attentions' rows, each axis
                "attentions": amap.weights[np.ix_(layers, hs, positions)],   # (layer, head, query, key)
                "kv_heads": [amap.kv_head(h) for h in range(amap.n_heads)]}   # the KV head each query head reads
        if summary is not None:
            data["summary"] = summary_rows(summary, heads, positions)
        print_json(data)
        return 0
    kv = f" reading {amap.n_kv_heads} KV heads" if amap.grouped else ""
    print(f"{amap.source}: {len(result.tokens)} tokens, {amap.n_layers} layers x {amap.n_heads} heads{kv}")
    if summary is not None:
        print(format_summary(summary, amap, heads=heads, positions=positions))
        return 0
    if args.position is not None:
        for layer, head in heads:
            print(format_rows(amap, layer, head, positions))
    else:
        from rich.console import Console

        from ..viz import terminal_grid
        for layer, head in heads:
            Console(highlight=False).print(terminal_grid(amap, layer, head))
    for path in (args.png, args.html):
        if path:
            print(f"wrote {path}")
    return 0


def chosen_heads(args, amap) -> list[tuple[int, int]]:
    """The (layer, head) pairs to show: --layers × --heads (every one by default with --summary), else --layer
    and --head."""
    if args.layers is None and args.heads is None and not args.summary:
        return [(args.layer, args.head)]
    if args.layer != 0 or args.head != 0:
        if args.layers is not None or args.heads is not None:
            raise ValueError("give --layer/--head (one head) or --layers/--heads (several), not both")
    layers = pick(args.layers, "--layers", amap.n_layers, "layer")
    heads = [args.head] if args.heads is None and not args.summary else pick(args.heads, "--heads", amap.n_heads,
                                                                             "head")
    return [(i, j) for i in layers for j in heads]


def format_rows(amap, layer: int, head: int, positions: list[int]) -> str:
    """One head's weights from the chosen queries, one line each: every key it may see, with its weight."""
    a = amap.head(layer, head)                                  # (n_q, n_k)
    keep = amap.keep if amap.keep is not None else np.ones(a.shape, bool)
    q_tokens = amap.q_tokens
    lines = [f"layer {layer}, head {head}" + (f" ({amap.kv_note(head)})" if amap.kv_note(head) else "")]
    for q in positions:
        cells = "  ".join(f"{label(amap.tokens[k])} {a[q, k]:.2f}" for k in range(a.shape[1]) if keep[q, k])
        lines.append(f"  from {label(q_tokens[q])} (position {q}): {cells}")
    return "\n".join(lines)


def summary_rows(summary, heads: list[tuple[int, int]], positions: list[int]) -> list[dict]:
    """The summary's rows of the chosen heads, each with the top keys of the chosen query positions."""
    chosen, rows = set(heads), []
    for r in summary.rows():
        if (r["layer"], r["head"]) in chosen:
            rows.append(dict(r, top_keys=[r["top_keys"][q] for q in positions]))
    return rows


def pick(spec: str | None, flag: str, size: int, what: str) -> list[int]:
    """The indices ``spec`` names among 0 … size − 1, in order: None = all of them; ``"3"``, ``"-1"`` (the last),
    ``"0,4,7"``, ``"2-5"`` (2 to 5). A ValueError names ``flag`` and the range."""
    if spec is None:
        return list(range(size))
    out = []
    for part in str(spec).split(","):
        part = part.strip()
        one, span = re.fullmatch(r"-?\d+", part), re.fullmatch(r"(\d+)-(\d+)", part)
        if one:
            first = last = int(part)
        elif span and int(span[1]) <= int(span[2]):
            first, last = int(span[1]), int(span[2])
        else:
            raise ValueError(f"{flag} must be {what} indices such as 3, -1 (the last), 0,4,7 or 2-5, got {spec!r}")
        for i in range(first, last + 1):
            if not -size <= i < size:
                raise ValueError(f"{flag} has {i}; there are {size} {what}s, 0 … {size - 1} (or -1 … -{size})")
            out.append(i % size)
    return list(dict.fromkeys(out))


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


def format_summary(summary, amap=None, *, heads=None, positions=None) -> str:
    """One line per head: entropy, mean distance, then each query's most-attended key; with grouped-query
    attention (``amap.grouped``) a column for the KV head each query head reads, and a line saying so.
    ``heads`` [(layer, head)] and ``positions`` (query positions) choose what is shown (default all)."""
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
    n_q = summary.top_key.shape[-1]
    rows = summary.rows() if heads is None else summary_rows(summary, heads, positions or list(range(n_q)))
    if heads is not None and positions is not None and len(positions) < n_q:
        lines.append(f"(most-attended keys of query positions {', '.join(map(str, positions))} only; entropy and "
                     "distance are each head's means over every query)")
    for r in rows:
        tops = " ".join(f"{label(t['query'])}→{label(t['key'])}" for t in r["top_keys"])
        kv = f" {amap.kv_head(r['head']):>3}" if grouped else ""
        lines.append(f"{r['layer']:>5} {r['head']:>4}{kv}  {r['entropy']:7.3f}  {r['mean_distance']:8.3f}  {tops}")
    from ..viz.terminal import summary_note
    return "\n".join(lines + [n for n in [summary_note(summary.tokens, summary.top_key)] if n])
