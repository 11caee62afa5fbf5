"""One command per section of the guide: floors, lookup, explain, scale, mask, embed, heads, order, cost, tokens.

Each section has a ``report_*`` function that calls the library and returns a :class:`Report`: the text
the command prints and the data ``--json`` prints. The tour calls the same functions, so the command
and the tour can never disagree.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace

import numpy as np

from .. import guide as g
from ..ngrams import LEVELS
from ._app import add_json_flag, print_json, seed_arg, stderr_progress


@dataclass(frozen=True)
class Report:
    text: str                                 # what the command prints
    data: dict = field(default_factory=dict)  # what --json prints


# --- formatting, as the guide prints (np.set_printoptions(precision=3, floatmode="fixed", suppress=True)) ---

def fmt(a, precision: int = 3) -> str:
    """An array as the guide prints it: ``[0.090 0.665 0.245]``."""
    return np.array2string(np.asarray(a), precision=precision, floatmode="fixed", suppress_small=True)


def indent(text: str, by: str = "  ") -> str:
    return "\n".join(by + line for line in text.splitlines())


def table(header: list[str], rows: list[list], *, align_left: int = 0) -> str:
    """Columns padded to fit, the first ``align_left`` columns left-aligned, the rest right-aligned."""
    cells = [list(map(str, header))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i < align_left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def labelled_grid(grid: np.ndarray, rows, cols, cell) -> str:
    """A grid with a row label per query and a column label per key."""
    body = [[r] + [cell(v) for v in row] for r, row in zip(rows, grid)]
    return table(["query \\ key"] + list(cols), body, align_left=1)


def emit(args, report: Report) -> int:
    if args.json:
        print_json(report.data)
    else:
        print(report.text)
    return 0


# --- 1. floors ---------------------------------------------------------------------------------

def report_floors(text: str, max_k: int = 5, *, level: str = "char", source: str = "the guide's toy text",
                  progress: bool = False) -> Report:
    rows = list(_with_progress(g.iter_floors(text, max_k, level=level), max_k + 1, "counting contexts", progress))
    unit = "characters" if level == "char" else "words"
    if not rows:                           # the library returns no rows; a command that prints none would mislead
        raise ValueError(f"{source} must hold at least 2 {unit} to score one prediction")
    lines = [f"Lowest possible cross-entropy with k {unit} of context, {source}:", "k floor contexts"]
    lines += [f"{r.k} {r.floor:.3f} {r.n_contexts}" for r in rows]
    return Report("\n".join(lines), {"level": level, "source": source,
                                     "rows": [vars(r) for r in rows]})


def cmd_floors(args) -> int:
    if args.file is None:
        text, source = g.TOY_TEXT, "the guide's toy text"
    else:
        text, source = g.read_utf8(args.file), args.file
    return emit(args, report_floors(text, args.max_k, level=args.level, source=source,
                                    progress=args.file is not None and not args.json))


def _with_progress(rows, total: int, what: str, show: bool):
    """Yield ``rows``, with a rich progress bar on stderr when ``show``."""
    if not show:
        yield from rows
        return
    with stderr_progress() as bar:
        task = bar.add_task(what, total=total)
        for r in rows:
            bar.advance(task)
            yield r


# --- 2. lookup ---------------------------------------------------------------------------------

def report_lookup(query=g.lookup.QUERY, keys=g.lookup.KEYS, values=g.lookup.VALUES, *, tokens=g.lookup.TOKENS,
                  scaled: bool = False, hard: float = g.lookup.HARD_SCORE) -> Report:
    r = g.soft_lookup(query, keys, values, scaled=scaled)
    if len(tokens) != len(r.keys):
        raise ValueError(f"tokens must name the {len(r.keys)} keys, got {len(tokens)}: {' '.join(tokens)}")
    hard_w, hard_out = g.hard_lookup(r, score=hard)
    top = int(np.argmax(r.scores))
    scale_note = f" × 1/√{len(r.query)}" if scaled else ""
    lines = [f"query q {fmt(r.query)} {r.query.shape}, keys K {r.keys.shape}, values V {r.values.shape}",
             f"1. score q against each key (dot product{scale_note}):"]
    for t, k, p, s in zip(tokens, r.keys, r.products, r.scores):
        terms = " + ".join(f"{qi:g}·{ki:g}" for qi, ki in zip(r.query, k))
        lines.append(f"   {t:>8}  {terms} = {p.sum():g}" + (f" -> {s:.3f}" if scaled else ""))
    lines += [f"   scores {fmt(r.scores)} {r.scores.shape}",
              f"2. weights = softmax(scores) = {fmt(r.weights)}, summing to {r.weights.sum():.3f}",
              "3. output = Σ weight · value:"]
    lines += [f"   {t:>8}  {w:.3f} · {fmt(v)}" for t, w, v in zip(tokens, r.weights, r.values)]
    lines += [f"   output {fmt(r.output)} {r.output.shape}",
              f"{fmt(r.scores)} {fmt(r.weights)} {fmt(r.output)}",
              f"Hard lookup: push {tokens[top]}'s score to {hard:g} and it takes {hard_w[top]:.8f} of the weight"
              f" ({'more' if hard_w[top] > 0.999999 else 'less'} than 0.999999); output {fmt(hard_out)}."]
    return Report("\n".join(lines), {
        "tokens": list(tokens), "query": r.query, "keys": r.keys, "values": r.values, "scale": r.scale,
        "scores": r.scores, "weights": r.weights, "output": r.output,
        "hard": {"token": tokens[top], "score": hard, "weights": hard_w, "output": hard_out}})


def parse_vector(name: str, text: str) -> np.ndarray:
    """'1,0' -> [1., 0.]"""
    try:
        return np.array([float(x) for x in text.replace(" ", "").split(",")])   # (d,)
    except ValueError:
        raise ValueError(f"{name} must be numbers separated by commas, like 1,0; got {text!r}") from None


def parse_matrix(name: str, text: str) -> np.ndarray:
    """'0,0;2,0;1,1' -> (3, 2); rows of different widths are an error."""
    rows = [parse_vector(name, r) for r in text.split(";")]
    widths = {len(r) for r in rows}
    if len(widths) > 1:
        raise ValueError(f"{name} rows must all have the same width, got widths "
                         f"{[len(r) for r in rows]} in {text!r}")
    return np.array(rows)                                                        # (n, d)


def cmd_lookup(args) -> int:
    q = g.lookup.QUERY if args.query is None else parse_vector("--query", args.query)
    k = g.lookup.KEYS if args.keys is None else parse_matrix("--keys", args.keys)
    v = g.lookup.VALUES if args.values is None else parse_matrix("--values", args.values)
    if args.tokens is not None:
        tokens = tuple(args.tokens)
    elif args.keys is None:
        tokens = g.lookup.TOKENS
    else:
        tokens = tuple(f"key{i + 1}" for i in range(len(k)))
    return emit(args, report_lookup(q, k, v, tokens=tokens, scaled=args.scale, hard=args.hard))


# --- 3. explain ---------------------------------------------------------------------------------

def report_explain(toy: g.GuideToy, sentence: str, *, is_causal: bool = True) -> Report:
    steps = g.explain(toy, sentence, is_causal=is_causal)
    lines = [f"A = softmax(QKᵀ/√d_k + M), output AV, on the toy embeddings of {sentence!r}"]
    for st in steps:
        lines.append(f"{st.symbol.name}  {_shape_str(st.symbol.shape)} = {st.shape}  {st.symbol.meaning}")
        lines.append(indent(fmt(st.value)))
    return Report("\n".join(lines), {"sentence": sentence, "is_causal": is_causal, "symbols": [
        {"name": st.symbol.name, "meaning": st.symbol.meaning, "general_shape": list(st.symbol.shape),
         "shape": list(st.shape), "value": st.value} for st in steps]})


def report_shapes(sentence: str = g.RUNNING_EXAMPLE, config_name: str = "gpt2-small") -> Report:
    config = g.COST_CONFIGS[config_name].attention
    n = len(gpt2_tokenize(sentence)[0])
    if n == 0:
        raise ValueError("sentence must hold at least one token, got an empty string")
    steps = g.shapes(n, config)
    letters = g.shape_sizes(n, config)
    rows = [[st.symbol.name, _shape_str(st.symbol.shape), str(st.shape)] for st in steps]
    text = (f"Shapes for {sentence!r} in {config_name}: " + ", ".join(f"{k} = {v}" for k, v in letters.items())
            + "\n" + table(["symbol", "general", "here"], rows, align_left=3))
    return Report(text, {"sentence": sentence, "config": config_name, "sizes": letters, "symbols": [
        {"name": st.symbol.name, "general_shape": list(st.symbol.shape), "shape": list(st.shape)} for st in steps]})


def _shape_str(letters) -> str:
    return f"({', '.join(letters)})"


def cmd_explain(args) -> int:
    if args.config is not None:
        sentence = g.RUNNING_EXAMPLE if args.sentence is None else args.sentence
        return emit(args, report_shapes(sentence, args.config))
    sentence = "the cat sat" if args.sentence is None else args.sentence   # an empty one is an error, not the default
    return emit(args, report_explain(g.guide_toy(), sentence, is_causal=not args.no_mask))


# --- 4. scale -----------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class ScaleRun:
    spreads: list
    top: g.TopWeight
    saturation: dict
    scaled_lookup: np.ndarray


def run_scale(seed: int = g.scaling.SEED, n_pairs: int = 10_000, n_trials: int = 2000) -> ScaleRun:
    """The guide's block: both experiments restart from default_rng(seed)."""
    spreads = g.dot_product_spread(n_pairs=n_pairs, rng=np.random.default_rng(seed))
    top = g.top_weight(n_trials=n_trials, rng=np.random.default_rng(seed))
    sat = {name: g.saturation(s) for name, s in (("[10, 0, 0]", (10.0, 0.0, 0.0)), ("[1, 0, 0]", (1.0, 0.0, 0.0)))}
    return ScaleRun(spreads=spreads, top=top, saturation=sat, scaled_lookup=g.soft_lookup(scaled=True).weights)


def report_scale(run: ScaleRun) -> Report:
    t = run.top
    lines = ["Spread (standard deviation) of u · v for random N(0, 1) vectors, close to √d_k:"]
    lines += [f"{s.d_k} {s.std:.2f}" for s in run.spreads]
    lines += [f"Average largest of {t.n_keys} weights at width {t.d_k}, unscaled and divided by √{t.d_k}:",
              f"{t.mean:.3f} {t.mean_scaled:.3f}",
              "The hand example divided by √2:", fmt(run.scaled_lookup),
              "Saturation: the top weight, and after nudging its score up by 0.1:"]
    (a0, a1), (b0, b1) = run.saturation["[10, 0, 0]"], run.saturation["[1, 0, 0]"]
    lines += [f"[10, 0, 0] {a0:.5f} -> {a1:.5f}   (barely moves: tiny gradients)",
              f"[1, 0, 0]  {b0:.3f} -> {b1:.3f}   (a gradient training can use)"]
    return Report("\n".join(lines), {
        "spread": {str(s.d_k): s.std for s in run.spreads},
        "top_weight": {"d_k": t.d_k, "n_keys": t.n_keys, "n_trials": len(t.top), "unscaled": t.mean,
                       "scaled": t.mean_scaled},
        "scaled_lookup": run.scaled_lookup,
        "saturation": {k: {"before": v[0], "after": v[1]} for k, v in run.saturation.items()}})


def cmd_scale(args) -> int:
    return emit(args, report_scale(run_scale(args.seed, args.pairs, args.trials)))


# --- 5. mask ------------------------------------------------------------------------------------

def report_mask(tokens) -> Report:
    m = g.mask_table(tokens)
    text = ("M, added to the scores (rows: queries, columns: keys):\n"
            + labelled_grid(m.M, m.tokens, m.tokens, lambda x: "0" if x == 0 else "−∞")
            + "\nThe same as a bool mask (True = may attend):\n"
            + labelled_grid(m.keep, m.tokens, m.tokens, lambda x: "True" if x else "False"))
    return Report(text, {"tokens": list(m.tokens), "M": m.M, "keep": m.keep})


MASK_MOST = 1024          # tokens in a printed mask: more is no table anyone reads (PNGs stop there too)


def mask_tokens(n: int | None, tokens) -> list[str]:
    if tokens is None:
        if n is None:
            return g.RUNNING_EXAMPLE.split()
        if n < 1:
            raise ValueError(f"N must be at least 1, got {n}")
        if n > MASK_MOST:
            raise ValueError(f"N must be at most {MASK_MOST:,} (the table has N × N cells), got {n:,}")
        return [f"t{i + 1}" for i in range(n)]
    if n is not None and n != len(tokens):
        raise ValueError(f"N is {n} but --tokens names {len(tokens)} tokens")
    return list(tokens)


def cmd_mask(args) -> int:
    tokens = mask_tokens(args.n, args.tokens)
    report = report_mask(tokens)
    if args.png:
        from ..viz import save_mask
        save_mask(args.png, tokens)
    return emit(args, report)


# --- 6. embed -----------------------------------------------------------------------------------

EMBED_SENTENCES = ("the cat sat", "the cat sat on the")


def report_embed(toy: g.GuideToy, sentences=EMBED_SENTENCES, pair=("cat", "dog")) -> Report:
    cos = toy.embeddings.cosine(*pair)
    lines = [f"Guide 3's table retrained: {len(toy.embeddings.vocab)} words × {toy.embeddings.E.shape[1]} numbers",
             f"cos({pair[0]}, {pair[1]}) {cos:.2f}"]
    grids = []
    for s in sentences:
        _, a = toy.attend(s)
        grids.append({"sentence": s, "weights": a, "row_sums": a.sum(axis=1)})
        lines += [f"Causal attention weights for {s!r} (random W_Q, W_K, W_V), then the row sums:",
                  f"{fmt(a)} {fmt(a.sum(axis=1))}"]
    return Report("\n".join(lines), {"vocab": list(toy.embeddings.vocab), "cosine": {"words": list(pair),
                                     "value": cos}, "grids": grids})


def cmd_embed(args) -> int:
    emb = g.train_embeddings(rng=np.random.default_rng(args.seed))
    d = emb.E.shape[1]
    W_Q, W_K, W_V = g.random_projections(d, d, rng=np.random.default_rng(args.proj_seed))
    toy = g.GuideToy(embeddings=emb, W_Q=W_Q, W_K=W_K, W_V=W_V)
    return emit(args, report_embed(toy, tuple(args.sentence or EMBED_SENTENCES), tuple(args.pair)))


# --- 7. heads -----------------------------------------------------------------------------------

def report_heads(n: int = 5, seed: int = g.heads.SEED) -> Report:
    run = g.run_heads(n, rng=np.random.default_rng(seed))
    c = g.params()
    text = ("Shapes of Q, S, AV, the joined heads, and the output (12 heads of width 64):\n"
            + " ".join(str(s) for s in run.shapes.values())
            + f"\nParameters per layer: {c.per_layer:,} in W_Q, W_K, W_V, W_O; {c.per_layer_with_bias:,} with "
            f"biases (the layer counts {run.n_params:,})")
    return Report(text, {"shapes": {k: list(v) for k, v in run.shapes.items()}, "params": c.per_layer,
                         "params_with_bias": c.per_layer_with_bias, "layer_params": run.n_params})


def cmd_heads(args) -> int:
    return emit(args, report_heads(args.n, args.seed))


# --- 8. order -----------------------------------------------------------------------------------

def report_order(toy: g.GuideToy, seed: int = g.order.POSITION_SEED) -> Report:
    r = g.order_checks(toy, rng=np.random.default_rng(seed))
    text = (f"No mask, no positions: reversal commutes, {r.word!r} the same in both sentences:\n"
            f"{r.reversal_commutes} {r.same_vector}\n"
            f"With random position vectors (seed {seed}): reversal commutes, largest difference:\n"
            f"{r.with_positions_commutes} {r.with_positions_max_diff:.3f}\n"
            f"With the causal mask: {r.word!r} the same in both sentences, largest difference:\n"
            f"{r.masked_same_vector} {r.masked_max_diff:.3f}")
    return Report(text, vars(r) | {"seed": seed})


def cmd_order(args) -> int:
    return emit(args, report_order(g.guide_toy(), args.seed))


# --- 9. cost ------------------------------------------------------------------------------------

def report_cost(n: int = 5, config_name: str = "gpt2-small", *, block_q: int | None = None,
                block_k: int | None = None, workers: int | None = None, bytes_per_number: int = 4,
                growth_table: bool = True) -> Report:
    """The cost section; the tiled kernel's blocks and workers default to the config's (the kernel's own)."""
    base = g.COST_CONFIGS[config_name]
    tiled = {k: v for k, v in (("block_q", block_q), ("block_k", block_k), ("workers", workers)) if v is not None}
    config = replace(base, bytes_per_number=bytes_per_number, **tiled)
    p, c = g.params(config), g.cost(n, config)
    n_ctx = config.attention.n_ctx
    at_ctx = g.cost(n_ctx, config)
    lines = ["Parameters per layer (no bias, with bias), and W_P:",
             f"{p.per_layer} {p.per_layer_with_bias} {p.position_table}",
             f"Scores per head and per layer at n = {n}, then at n_ctx = {n_ctx}:",
             f"{c.scores_per_head} {c.scores_per_layer} {at_ctx.scores_per_head} {at_ctx.scores_per_layer}",
             f"At n = {n:,}: {c.flops_per_layer:,} FLOPs per layer ({c.flops_projections:,} in the projections, "
             f"{c.flops_scores:,} in QKᵀ and AV); {c.flops_per_model:,} for {config.n_layers} layers",
             f"Score grid of one layer: {_bytes(c.grid_bytes_naive)} naive, {_bytes(c.grid_bytes_tiled)} tiled "
             f"({config.workers} workers × {'×'.join(map(str, g.tile_shape(n, config)))} tiles, plus a running max "
             "and sum per query)",
             f"KV cache: {_bytes(g.kv_bytes_per_token(config))} per token, {_bytes(c.kv_cache_bytes)} at n = {n:,}, "
             f"{_bytes(at_ctx.kv_cache_bytes)} at n_ctx = {n_ctx} ({bytes_per_number} bytes per number)"]
    if n > n_ctx:
        lines.append(f"(n = {n:,} is beyond {config_name}'s n_ctx = {n_ctx:,}: W_P has no row for those positions)")
    rows = g.growth(config) if growth_table else []
    if rows:
        lines += ["Growth:", table(["n", "scores/layer", "FLOPs/layer", "grid naive", "grid tiled", "KV cache"],
                                   [[f"{r.n:,}", f"{r.scores_per_layer:,}", f"{r.flops_per_layer:.3g}",
                                     _bytes(r.grid_bytes_naive), _bytes(r.grid_bytes_tiled),
                                     _bytes(r.kv_cache_bytes)] for r in rows])]
    return Report("\n".join(lines), {"config": config_name, "n_layers": config.n_layers,
                                     "block_q": config.block_q, "block_k": config.block_k, "workers": config.workers,
                                     "bytes_per_number": bytes_per_number, "params": vars(p), "cost": vars(c),
                                     "at_n_ctx": vars(at_ctx), "kv_bytes_per_token": g.kv_bytes_per_token(config),
                                     "growth": [vars(r) for r in rows]})


def _bytes(b: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= size:
            return f"{b / size:.1f} {unit}"
    return f"{b} B"


def cmd_cost(args) -> int:
    return emit(args, report_cost(args.n, args.config, block_q=args.block_q, block_k=args.block_k,
                                  workers=args.workers, bytes_per_number=args.bytes, growth_table=not args.no_growth))


# --- 10. tokens ---------------------------------------------------------------------------------

def gpt2_tokenize(text: str) -> tuple[list[int], list[str]]:
    """GPT-2 token ids and the text of each token; a missing tokenizer is an OSError (one line, exit 2)."""
    try:
        from ..tokens import gpt2_tokenizer
        enc = gpt2_tokenizer().encode(text)
    except ImportError as e:
        raise FileNotFoundError(f"GPT-2's tokenizer needs the package tokenizers ({e}); "
                                "install it with pip install 'attnlab[tour]'") from None
    return list(enc.ids), [text[a:b] for a, b in enc.offsets]


def report_tokens(text: str = g.RUNNING_EXAMPLE) -> Report:
    ids, pieces = gpt2_tokenize(text)
    if not ids:
        raise ValueError("text must hold at least one token, got an empty string")
    lines = [f"GPT-2 tokens of {text!r}:", " ".join(map(str, ids)),
             table(["id", "token"], [[i, repr(p)] for i, p in zip(ids, pieces)])]
    if len(ids) > 1:
        lines.append(f"inputs {' '.join(map(str, ids[:-1]))}  targets {' '.join(map(str, ids[1:]))}")
    return Report("\n".join(lines), {"text": text, "ids": ids, "tokens": pieces})


def cmd_tokens(args) -> int:
    return emit(args, report_tokens(args.text))


# --- registration -------------------------------------------------------------------------------

def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def register(sub) -> None:
    p = sub.add_parser("floors", help="lowest possible cross-entropy for each context length k")
    p.add_argument("file", nargs="?", help="a UTF-8 text file (default: the guide's toy text)")
    p.add_argument("--max-k", type=_int, default=5, help="longest context (default 5)")
    p.add_argument("--level", choices=LEVELS, default="char", help="count characters or words")
    _done(p, cmd_floors)

    p = sub.add_parser("lookup", help="the soft lookup step by step, and its hard limit")
    p.add_argument("--query", help="the query, e.g. 1,0 (default: the guide's)")
    p.add_argument("--keys", help="one key per token, rows split by ';', e.g. '0,0;2,0;1,1'")
    p.add_argument("--values", help="one value per token, e.g. '1,0;0,1;1,1'")
    p.add_argument("--tokens", nargs="+", help="names for the keys (default: the cat sat)")
    p.add_argument("--scale", action="store_true", help="divide the scores by √d_k")
    p.add_argument("--hard", type=float, default=g.lookup.HARD_SCORE, help="push the top score to this (20)")
    _done(p, cmd_lookup)

    p = sub.add_parser("explain", help="the equation symbol by symbol, or a model's shapes table")
    p.add_argument("sentence", nargs="?", help="words of the toy vocabulary (default: 'the cat sat'); "
                   "with --config any text (default: 'The cat sat on the')")
    p.add_argument("--config", choices=sorted(g.COST_CONFIGS), help="print the shapes table for this model instead")
    p.add_argument("--no-mask", action="store_true", help="leave the causal mask off (M = 0)")
    _done(p, cmd_explain)

    p = sub.add_parser("scale", help="why the scores are divided by √d_k")
    p.add_argument("--seed", type=seed_arg, default=g.scaling.SEED, help="the guide uses 0")
    p.add_argument("--pairs", type=_int, default=10_000, help="random pairs per width (10,000)")
    p.add_argument("--trials", type=_int, default=2000, help="random queries for the top weight (2,000)")
    _done(p, cmd_scale)

    p = sub.add_parser("mask", help="the causal mask M, with 0 and −∞, and as bools")
    p.add_argument("n", nargs="?", type=_int, metavar="N", help="number of tokens (default: the running example)")
    p.add_argument("--tokens", nargs="+", help="labels for the rows and columns")
    p.add_argument("--png", help="also draw the mask into this PNG file")
    _done(p, cmd_mask)

    p = sub.add_parser("embed", help="retrain the toy embeddings; attention grids with random W_Q, W_K, W_V")
    p.add_argument("--sentence", action="append", help="a sentence of toy words (repeatable; default: the guide's two)")
    p.add_argument("--pair", nargs=2, default=("cat", "dog"), metavar=("A", "B"), help="words to compare (cat dog)")
    p.add_argument("--seed", type=seed_arg, default=g.toy.EMBED_SEED, help="seed of the embedding table (0)")
    p.add_argument("--proj-seed", type=seed_arg, default=g.toy.PROJECTION_SEED, help="seed of W_Q, W_K, W_V (1)")
    _done(p, cmd_embed)

    p = sub.add_parser("heads", help="multi-head attention on GPT-2 small's shapes")
    p.add_argument("--n", type=_int, default=5, help="tokens (default 5)")
    p.add_argument("--seed", type=seed_arg, default=g.heads.SEED, help="the guide uses 0")
    _done(p, cmd_heads)

    p = sub.add_parser("order", help="attention is blind to order until positions are added")
    p.add_argument("--seed", type=seed_arg, default=g.order.POSITION_SEED, help="seed of the position vectors (2)")
    _done(p, cmd_order)

    p = sub.add_parser("cost", help="parameters, scores, FLOPs, score-grid and KV-cache memory")
    p.add_argument("--n", type=_int, default=5, help="sequence length (default 5, the running example)")
    p.add_argument("--config", choices=sorted(g.COST_CONFIGS), default="gpt2-small")
    p.add_argument("--block-q", type=_int, help=f"queries per tile of tiled attention ({g.CostConfig.block_q})")
    p.add_argument("--block-k", type=_int, help=f"keys per tile of tiled attention ({g.CostConfig.block_k})")
    p.add_argument("--workers", type=_int, help=f"tiles in flight at once ({g.CostConfig.workers})")
    p.add_argument("--bytes", type=_int, default=4, help="bytes per number (4: float32)")
    p.add_argument("--no-growth", action="store_true", help="leave out the growth table")
    _done(p, cmd_cost)

    p = sub.add_parser("tokens", help="GPT-2 BPE token ids")
    p.add_argument("text", nargs="?", default=g.RUNNING_EXAMPLE, help="default: 'The cat sat on the'")
    _done(p, cmd_tokens)


def _done(p, func) -> None:
    add_json_flag(p)
    p.set_defaults(func=func)
