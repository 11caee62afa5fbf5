"""One command per section of the guide: floors, lookup, explain, scale, mask, embed, heads, order, cost, tokens.

Each section has a ``report_*`` function that calls the library and returns a :class:`Report`: the text
the command prints and the data ``--json`` prints. The tour calls the same functions, so the command
and the tour can never disagree.
"""

from __future__ import annotations

import argparse
import re
import textwrap
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np

from .. import guide as g
from ..text.ngrams import LEVELS
from ._app import add_command, add_json_flag, as_typed, print_json, seed_arg, stderr_progress


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
    left = [f"{r.k} {r.floor:.3f} {r.n_contexts}" for r in rows]          # the guide's three columns
    width = max(len("k floor contexts"), *map(len, left))
    lines = [f"Lowest possible cross-entropy with k {unit} of context, {source}:",
             f"{'k floor contexts'.ljust(width)}  predictions"]
    lines += [f"{a.ljust(width)}  {r.n_predictions}" for a, r in zip(left, rows)]
    lines.append(f"Each floor is an average over its predictions: the {unit} at positions max(k, 1) … "
                 f"{rows[0].n_predictions}, so k = 0 and k = 1 score the same {rows[0].n_predictions} and each "
                 f"longer context one fewer.")
    last = rows[-1]
    if last.k >= 2:
        lines.append(f"At k = {last.k}: {last.n_contexts} distinct contexts for {last.n_predictions} predictions. "
                     "A context seen once predicts its next " + unit[:-1] + " with certainty, so the later "
                     "floors flatter what more context buys.")
    rises = [(a, b) for a, b in zip(rows, rows[1:]) if b.floor > a.floor + 1e-12]
    for a, b in rises:
        lines.append(f"k = {b.k} is above k = {a.k} ({b.floor:.3f} > {a.floor:.3f}) because it is scored on "
                     f"fewer predictions ({b.n_predictions} vs {a.n_predictions}); on the same predictions a "
                     "longer context never raises the floor.")
    return Report("\n".join(lines), {"level": level, "source": source,
                                     "rows": [vars(r) for r in rows],
                                     "rises": [{"k": b.k, "above_k": a.k} for a, b in rises]})


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
    top = int(np.argmax(r.scores))
    tied = [t for t, s in zip(tokens, r.scores) if s == r.scores[top] and t != tokens[top]]
    hard_w, hard_out = g.hard_lookup(r, index=top, score=max(hard, float(r.scores[top])))
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
              hard_line(tokens[top], float(r.scores[top]), hard, float(hard_w[top]), _gap(r.scores, top, hard),
                        hard_out, r.values[top])]
    if tied:
        lines.append(f"({tokens[top]!r} ties with {', '.join(map(repr, tied))} for the top score; the first is "
                     "pushed.)")
    return Report("\n".join(lines), {
        "tokens": list(tokens), "query": r.query, "keys": r.keys, "values": r.values, "scale": r.scale,
        "scores": r.scores, "weights": r.weights, "output": r.output,
        "hard": {"token": tokens[top], "score": max(hard, float(r.scores[top])), "weights": hard_w,
                 "output": hard_out, "is_hard": bool(hard_w[top] > HARD_WEIGHT)}})


def _gap(scores, top: int, hard: float) -> float:
    """How far the pushed top score stands above the next one."""
    others = np.delete(np.asarray(scores), top)
    return max(hard, float(scores[top])) - float(others.max()) if others.size else float("inf")


HARD_WEIGHT = 0.999999       # the guide's "more than 0.999999 of the weight": a hard lookup


def hard_line(token: str, score: float, hard: float, weight: float, gap: float, out, value) -> str:
    """What pushing the top score to ``hard`` does, said without claiming a push that did not happen."""
    if score >= hard:
        head = f"Hard lookup: the score of {token!r} is already {score:g} (at least --hard {hard:g}); it takes {weight:.8f}"
    else:
        head = f"Hard lookup: push the score of {token!r} from {score:g} to {hard:g} and it takes {weight:.8f}"
    if weight > HARD_WEIGHT:
        return (f"{head} of the weight (more than {HARD_WEIGHT}); output {fmt(out)}, the value of {token!r}, "
                f"{fmt(value)}, almost exactly.")
    rest = 1 - weight
    return (f"{head} of the weight, so the output {fmt(out)} is still a blend ({rest:.6f} goes to the other keys, "
            f"the next score is only {gap:g} below). A dictionary-like lookup needs the top score far "
            f"above the rest; raise --hard.")


def parse_vector(name: str, text: str) -> np.ndarray:
    """'1,0' or '1 0' -> [1., 0.]: numbers split by commas or spaces, never run together."""
    parts = [p for p in re.split(r"[,\s]+", text.strip()) if p]
    try:
        if not parts:
            raise ValueError
        return np.array([float(x) for x in parts])   # (d,)
    except ValueError:
        raise ValueError(f"{name} must be numbers separated by commas or spaces, like 1,0 or '1 0'; "
                         f"got {text!r}") from None


def parse_matrix(name: str, text: str) -> np.ndarray:
    """'0,0;2,0;1,1' -> (3, 2); rows of different widths are an error."""
    rows = [parse_vector(name, r) for r in text.split(";")]
    widths = {len(r) for r in rows}
    if len(widths) > 1:
        raise ValueError(f"{name} rows must all have the same width, got widths "
                         f"{[len(r) for r in rows]} in {text!r}")
    return np.array(rows)                                                        # (n, d)


# Names for custom keys: the words of the toy text in the order they first appear ("the cat sat" first).
KEY_NAMES = tuple(dict.fromkeys(g.TOY_TEXT.split()))


def key_names(n: int) -> tuple[str, ...]:
    """``n`` labels for keys: the cat sat on mat … then t13, t14, … past the toy's 12 words."""
    return tuple(KEY_NAMES[i] if i < len(KEY_NAMES) else f"t{i + 1}" for i in range(n))


def cmd_lookup(args) -> int:
    q = g.lookup.QUERY if args.query is None else parse_vector("--query", args.query)
    k = g.lookup.KEYS if args.keys is None else parse_matrix("--keys", args.keys)
    v = g.lookup.VALUES if args.values is None else parse_matrix("--values", args.values)
    tokens = tuple(args.tokens) if args.tokens is not None else key_names(len(k))
    return emit(args, report_lookup(q, k, v, tokens=tokens, scaled=args.scale, hard=args.hard))


# --- 3. explain ---------------------------------------------------------------------------------

def report_explain(toy: g.GuideToy, sentence: str, *, is_causal: bool = True, d_k: int | None = None,
                   seed: int | None = None) -> Report:
    steps = g.explain(toy, sentence, is_causal=is_causal)
    d = toy.W_Q.shape
    how = (f"d_model = {d[0]}, d_k = d_v = {d[1]}" + (f", W^Q, W^K, W^V from seed {seed}" if seed is not None else ""))
    lines = [f"A = softmax(QKᵀ/√d_k + M), output AV, on the toy embeddings of {sentence!r} ({how})",
             "Rows and columns that stand for tokens are labelled with them; the others are coordinates."]
    for st in steps:
        lines.append(f"{st.symbol.name}  {_shape_str(st.symbol.shape)} = {st.shape}  {st.symbol.meaning}")
        lines.append(indent(labelled_matrix(st.value, st.rows, st.cols)))
    return Report("\n".join(lines), {"sentence": sentence, "is_causal": is_causal, "d_k": d[1], "seed": seed,
                                     "tokens": sentence.split(), "symbols": [
        {"name": st.symbol.name, "meaning": st.symbol.meaning, "general_shape": list(st.symbol.shape),
         "shape": list(st.shape), "rows": st.rows, "cols": st.cols, "value": st.value} for st in steps]})


def labelled_matrix(a: np.ndarray, rows=None, cols=None) -> str:
    """A matrix with its row and column labels (token words); axes without labels get their index.

    >>> print(labelled_matrix(np.array([[0.0, -np.inf], [1.5, 2.0]]), ["the", "cat"], ["the", "cat"]))
           the    cat
    the  0.000   -inf
    cat  1.500  2.000
    """
    a = np.asarray(a)
    if rows is None and cols is None:
        return fmt(a)
    rows = [str(i) for i in range(a.shape[0])] if rows is None else list(rows)
    cols = [str(j) for j in range(a.shape[1])] if cols is None else list(cols)
    body = [[r] + [f"{x:.3f}" if np.isfinite(x) else ("-inf" if x < 0 else "inf") for x in row]
            for r, row in zip(rows, a)]
    return table([""] + cols, body, align_left=1)


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
        given = [flag for flag, v in (("--d-k", args.d_k), ("--seed", args.seed), ("--no-mask", args.no_mask or None))
                 if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)}: for the toy example only; --config prints shapes, not numbers")
        sentence = g.RUNNING_EXAMPLE if args.sentence is None else args.sentence
        return emit(args, report_shapes(sentence, args.config))
    sentence = "the cat sat" if args.sentence is None else args.sentence   # an empty one is an error, not the default
    toy = g.guide_toy()
    if args.d_k is not None or args.seed is not None:
        d_model = toy.embeddings.E.shape[1]
        d_k = d_model if args.d_k is None else args.d_k
        seed = g.toy.PROJECTION_SEED if args.seed is None else args.seed
        W_Q, W_K, W_V = g.random_projections(d_model, d_k, rng=np.random.default_rng(seed))
        toy = g.GuideToy(embeddings=toy.embeddings, W_Q=W_Q, W_K=W_K, W_V=W_V)
    return emit(args, report_explain(toy, sentence, is_causal=not args.no_mask, d_k=args.d_k,
                                     seed=g.toy.PROJECTION_SEED if args.seed is None else args.seed))


# --- 4. scale -----------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class ScaleRun:
    spreads: list
    top: g.TopWeight
    saturation: dict
    scaled_lookup: np.ndarray


SATURATION_SCORES = ((10.0, 0.0, 0.0), (1.0, 0.0, 0.0))   # the guide's saturated and usable softmax


def run_scale(seed: int = g.scaling.SEED, n_pairs: int = 10_000, n_trials: int = 2000, *, widths=(4, 64),
              n_keys: int = 16, scores=SATURATION_SCORES) -> ScaleRun:
    """The guide's block: both experiments restart from default_rng(seed); the top weight is measured at the
    widest of ``widths``."""
    if isinstance(n_pairs, int) and not isinstance(n_pairs, bool) and n_pairs == 1:
        raise ValueError("pairs must be at least 2: the spread of one dot product is always 0")
    widths = tuple(widths)
    if not widths:
        raise ValueError("widths must hold at least one d_k, got none")
    spreads = g.dot_product_spread(widths, n_pairs=n_pairs, rng=np.random.default_rng(seed))
    top = g.top_weight(max(widths), n_keys, n_trials=n_trials, rng=np.random.default_rng(seed))
    sat = {"[" + ", ".join(f"{x:g}" for x in sc) + "]": g.saturation(sc) for sc in scores}
    return ScaleRun(spreads=spreads, top=top, saturation=sat, scaled_lookup=g.soft_lookup(scaled=True).weights)


def report_scale(run: ScaleRun) -> Report:
    t = run.top
    roots = ", ".join(f"{np.sqrt(s.d_k):.2f}" for s in run.spreads)
    lines = [f"Spread (standard deviation) of u · v for {len(run.spreads[0].dots):,} random N(0, 1) pairs, "
             f"close to √d_k ({roots}):", "d_k spread"]
    lines += [f"{s.d_k} {s.std:.2f}" for s in run.spreads]
    lines += [f"Average largest of {t.n_keys} weights at width {t.d_k} over {len(t.top):,} trials, unscaled and "
              f"divided by √{t.d_k} (an even spread would be 1/{t.n_keys} = {1 / t.n_keys:.3f}):",
              f"{t.mean:.3f} {t.mean_scaled:.3f}",
              "The hand example divided by √2:", fmt(run.scaled_lookup),
              "Saturation: the top weight, and after nudging its score up by 0.1:"]
    width = max(map(len, run.saturation))
    for name, (a0, a1) in run.saturation.items():
        slope = a0 * (1 - a0)                          # d weight / d score of softmax's top weight
        why = "barely moves: tiny gradients" if slope < 0.01 else "a gradient training can use"
        digits = 5 if a0 > 0.999 else 3
        lines.append(f"{name.ljust(width)} {a0:.{digits}f} -> {a1:.{digits}f}   ({why}; slope w(1 − w) = "
                     f"{slope:.2g})")
    return Report("\n".join(lines), {
        "spread": {str(s.d_k): s.std for s in run.spreads},
        "top_weight": {"d_k": t.d_k, "n_keys": t.n_keys, "n_trials": len(t.top), "unscaled": t.mean,
                       "scaled": t.mean_scaled},
        "scaled_lookup": run.scaled_lookup,
        "saturation": {k: {"before": v[0], "after": v[1]} for k, v in run.saturation.items()}})


def cmd_scale(args) -> int:
    scores = SATURATION_SCORES if args.scores is None else tuple(
        tuple(parse_vector("--scores", x)) for x in args.scores)
    return emit(args, report_scale(run_scale(args.seed, args.pairs, args.trials, widths=args.d_k,
                                             n_keys=args.keys, scores=scores)))


# --- 5. mask ------------------------------------------------------------------------------------

GRID_WIDTH = 80          # columns a printed grid fits, as the terminal grids of attnlab.viz do


def report_mask(tokens) -> Report:
    m = g.mask_table(tokens)
    additive = labelled_grid(m.M, m.tokens, m.tokens, lambda x: "0" if x == 0 else "−∞")
    boolean = labelled_grid(m.keep, m.tokens, m.tokens, lambda x: "True" if x else "False")
    if max(map(len, (additive + "\n" + boolean).splitlines())) <= GRID_WIDTH:
        text = ("M, added to the scores (rows: queries, columns: keys):\n" + additive
                + "\nThe same as a bool mask (True = may attend):\n" + boolean)
    else:
        text = "\n".join(textwrap.wrap(
            f"M, added to the scores (rows: queries, columns: keys in the same order), one character per cell "
            f"to fit {GRID_WIDTH} columns: 0 where a query may attend (M = 0, True), - where it may not "
            f"(M = −∞, False):", GRID_WIDTH)) + "\n" + compact_grid(m.keep, m.tokens)
    return Report(text, {"tokens": list(m.tokens), "M": m.M, "keep": m.keep})


def compact_grid(keep: np.ndarray, tokens, width: int = GRID_WIDTH) -> str:
    """A bool grid with one character per cell (0: may attend, -: may not), keys in the rows' order, the
    middle keys elided (…) when they do not fit ``width``.

    >>> print(compact_grid(np.tril(np.ones((3, 3), bool)), ["a", "b", "c"]))
    a 0--
    b 00-
    c 000
    """
    labels = [str(t) for t in tokens]
    w, n = max(map(len, labels)), len(labels)
    room = width - w - 1                                          # one column per cell
    cols = list(range(n)) if n <= room else [*range(room // 2), None, *range(n - (room - 1 - room // 2), n)]
    lines = [f"{labels[i].ljust(w)} " + "".join("…" if j is None else "0-"[not row[j]] for j in cols)
             for i, row in enumerate(keep)]
    if n > room:
        lines.append(f"(keys {room // 2}–{n - (room - 1 - room // 2) - 1}, counted from 0, elided as …; --json "
                     "has the whole grid)")
    return "\n".join(lines)


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
    emit(args, report)
    if args.png and not args.json:
        print(f"wrote {args.png}")
    return 0


# --- 6. embed -----------------------------------------------------------------------------------

EMBED_SENTENCES = ("the cat sat", "the cat sat on the")


def report_embed(toy: g.GuideToy, sentences=EMBED_SENTENCES, pair=("cat", "dog")) -> Report:
    cos = toy.embeddings.cosine(*pair)
    E, vocab = toy.embeddings.E, toy.embeddings.vocab
    lines = [f"Guide 3's table retrained: {len(vocab)} words × {E.shape[1]} numbers",
             indent(labelled_matrix(E, vocab, None)),
             f"cos({pair[0]}, {pair[1]}) {cos:.2f}"]
    grids = []
    for s in sentences:
        _, a = toy.attend(s)
        words = s.split()
        grids.append({"sentence": s, "tokens": words, "weights": a, "row_sums": a.sum(axis=1)})
        grid = np.concatenate([a, a.sum(axis=1, keepdims=True)], axis=1)          # (n, n + 1)
        lines += [f"Causal attention weights for {s!r} (random W_Q, W_K, W_V; rows: queries, columns: keys):",
                  indent(labelled_matrix(grid, words, words + ["row sum"])),
                  "as the guide prints them, A then the row sums:",
                  f"{fmt(a)} {fmt(a.sum(axis=1))}"]
    return Report("\n".join(lines), {"vocab": list(vocab), "E": E, "cosine": {"words": list(pair),
                                     "value": cos}, "grids": grids})


def cmd_embed(args) -> int:
    emb = g.train_embeddings(rng=np.random.default_rng(args.seed))
    d = emb.E.shape[1]
    W_Q, W_K, W_V = g.random_projections(d, d, rng=np.random.default_rng(args.proj_seed))
    toy = g.GuideToy(embeddings=emb, W_Q=W_Q, W_K=W_K, W_V=W_V)
    return emit(args, report_embed(toy, tuple(args.sentence or EMBED_SENTENCES), tuple(args.pair)))


# --- 7. heads -----------------------------------------------------------------------------------

GRID_MOST = 12           # tokens and heads beyond which the per-head grids are left to --json
HEADS_FROM_ZERO = ("Heads are numbered from 0, as in code, in TransformerLens and in every figure and command "
                   "of attnlab: the guide's head 1 (columns 0 to 63) is head 0 here.")


def report_heads(n: int = 5, seed: int = g.heads.SEED, *, n_heads: int = 12, d_model: int = 768) -> Report:
    from ..layer.config import AttentionConfig

    config = AttentionConfig(d_model=d_model, n_heads=n_heads)
    run = g.run_heads(n, config, rng=np.random.default_rng(seed))
    c = g.params(replace(g.GPT2_SMALL_COST, attention=config))
    words = g.RUNNING_EXAMPLE.split()
    tokens = words if n == len(words) else [f"t{i + 1}" for i in range(n)]
    lines = [f"Shapes of Q, S, AV, the joined heads, and the output ({config.n_heads} heads of width "
             f"{config.d_head}, d_model {config.d_model}, n {n}):",
             " ".join(str(s) for s in run.shapes.values()),
             f"Parameters per layer: {c.per_layer:,} in W_Q, W_K, W_V, W_O; {c.per_layer_with_bias:,} with "
             f"biases (the layer counts {run.n_params:,})"]
    if n <= GRID_MOST and config.n_heads <= GRID_MOST:
        lines.append(f"Each head's causal weights A (rows: queries, columns: keys), X and W from seed {seed}; "
                     f"the tokens are random stand-ins for {' '.join(tokens)!r}, and the weights are untrained.")
        lines.append(HEADS_FROM_ZERO)
        for h, a in enumerate(run.weights):
            lines += [f"head {h}", indent(labelled_matrix(a, tokens, tokens))]
    else:
        lines.append(f"({config.n_heads} grids of {n} × {n} weights: too many to print; --json has them)")
    return Report("\n".join(lines), {"shapes": {k: list(v) for k, v in run.shapes.items()}, "params": c.per_layer,
                                     "params_with_bias": c.per_layer_with_bias, "layer_params": run.n_params,
                                     "n_heads": config.n_heads, "d_model": config.d_model, "d_head": config.d_head,
                                     "seed": seed, "tokens": tokens, "weights": run.weights})


def cmd_heads(args) -> int:
    return emit(args, report_heads(args.n, args.seed, n_heads=args.n_heads, d_model=args.d_model))


# --- 8. order -----------------------------------------------------------------------------------

def report_order(toy: g.GuideToy, seed: int = g.order.POSITION_SEED, sentence: str = g.order.SENTENCE,
                 swapped: str | None = g.order.SWAPPED) -> Report:
    r = g.order_checks(toy, sentence, swapped, rng=np.random.default_rng(seed))
    words = sentence.split()
    w = f"{r.word!r}"
    text = "\n".join([
        f"Sentences: {r.sentence!r} and {r.swapped!r}; compared word {w} (position {r.index} and {r.index_swapped}).",
        f"No mask, no positions: reversal commutes, {w} the same in both sentences:",
        f"{r.reversal_commutes} {r.same_vector}",
        f"With random position vectors (seed {seed}): reversal commutes, largest difference:",
        f"{r.with_positions_commutes} {r.with_positions_max_diff:.3f}",
        f"With the causal mask: {w} the same in both sentences, largest difference:",
        f"{r.masked_same_vector} {r.masked_max_diff:.3f}",
        "",
        "The vectors compared. Attention on the reversed rows, beside attention's output reversed (no mask):",
        indent(labelled_matrix(r.flipped, words[::-1], None)),
        indent(labelled_matrix(r.out_reversed, words[::-1], None)),
        f"The new vector of {w} in each sentence, no mask (" + ("equal: without positions attention sees a bag "
        "of words" if r.same_vector else "different: the two sentences hold different words") + "):",
        indent(labelled_matrix(np.stack(r.unmasked), [r.sentence, r.swapped], None)),
        f"The new vector of {w} in each sentence with the causal mask (it sees only the words up to itself):",
        indent(labelled_matrix(np.stack(r.masked), [r.sentence, r.swapped], None)),
    ])
    data = {k: getattr(r, k) for k in ("reversal_commutes", "same_vector", "with_positions_commutes",
                                       "with_positions_max_diff", "masked_same_vector", "masked_max_diff", "word",
                                       "index", "index_swapped", "sentence", "swapped", "flipped", "out_reversed")}
    return Report(text, data | {"seed": seed, "unmasked": list(r.unmasked), "masked": list(r.masked)})


def cmd_order(args) -> int:
    sentences = args.sentence or []
    if len(sentences) > 2:
        raise ValueError(f"--sentence takes one or two sentences, got {len(sentences)}")
    if not sentences:
        sentence, swapped = g.order.SENTENCE, g.order.SWAPPED
    else:
        sentence, swapped = sentences[0], (sentences[1] if len(sentences) == 2 else None)
    with as_typed(swapped="the second --sentence", sentence="the first --sentence"):
        return emit(args, report_order(g.guide_toy(), args.seed, sentence, swapped))


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
    a = config.attention
    if config.attention_bias:
        lines = ["Parameters per layer (no bias, with bias), and W_P:",
                 f"{p.per_layer} {p.per_layer_with_bias} {p.position_table}"]
    else:
        lines = [f"Parameters per layer ({config_name} has no attention biases, so one count), and W_P"
                 f"{'' if a.positions.has_table else ' (none: its positions are ' + type(a.positions).__name__ + ')'}:",
                 f"{p.per_layer} {p.position_table}"]
    workers = min(config.workers, a.n_heads)
    lines += [
             f"Scores per head and per layer at n = {n}, then at n_ctx = {n_ctx}:",
             f"{c.scores_per_head} {c.scores_per_layer} {at_ctx.scores_per_head} {at_ctx.scores_per_layer}",
             f"At n = {n:,}: {c.flops_per_layer:,} FLOPs per layer ({c.flops_projections:,} in the projections, "
             f"{c.flops_scores:,} in QKᵀ and AV); {c.flops_per_model:,} for {config.n_layers} layers",
             f"Score grid of one layer: {_bytes(c.grid_bytes_naive)} naive (all {c.scores_per_layer:,} scores at "
             f"once), {_bytes(c.grid_bytes_tiled)} tiled (Guide 10: a block of at most {config.block_q} × "
             f"{config.block_k} scores for each of {config.workers} cores computing at once, as on the machine "
             "attnlab is measured on, plus a running max and sum per query; `cost --help` lists the tiled "
             "column's options)",
             f"KV cache of all {config.n_layers} layers (the score grid above is one layer's): "
             f"{_bytes(g.kv_bytes_per_token(config))} per token, {_bytes(c.kv_cache_bytes)} at n = {n:,}, "
             f"{_bytes(at_ctx.kv_cache_bytes)} at n_ctx = {n_ctx} ({bytes_per_number} bytes per number)"]
    if a.n_kv_heads < a.n_heads:
        lines.append(f"Grouped-query attention: {a.n_heads} query heads share {a.n_kv_heads} key/value heads, so the "
                     f"cache is {a.n_heads // a.n_kv_heads}x smaller than the same model without GQA: "
                     f"{_bytes(g.kv_bytes_per_token(config))} vs {_bytes(g.kv_bytes_per_token(g.without_gqa(config)))} "
                     f"per token, {_bytes(at_ctx.kv_cache_bytes)} vs {_bytes(at_ctx.kv_cache_bytes_without_gqa)} at "
                     f"n_ctx = {n_ctx:,}")
    if c.grid_bytes_tiled > c.grid_bytes_naive:
        lines.append(f"At n = {n:,} tiling costs more than it saves: the running max and sum (2 numbers per query "
                     "per head) outweigh so small a grid. Tiling pays once n is large.")
    if n > n_ctx:
        why = "W_P has no row for those positions" if a.positions.has_table else "positions it was not trained for"
        lines.append(f"(n = {n:,} is beyond {config_name}'s n_ctx = {n_ctx:,}: {why})")
    rows = g.growth(config) if growth_table else []
    if rows:
        b = config.block_q
        share = Fraction(workers, a.n_heads)
        lines += [f"Growth. Up to n = {b:,} a block holds a head's whole n × n grid, so tiled memory grows as n² "
                  f"there too, but only for the {workers} head{'s' * (workers > 1)} in flight (one per core) of "
                  f"the {a.n_heads}: about {share} of naive's grid. Past {b:,} the block stops growing and only "
                  "the max and sum per query grow, linearly: that is the kink in the memory plot."
                  + _small_n_note(rows),
                  f"In the table the grid columns are one layer's, the KV cache all {config.n_layers} layers'.",
                  table(["n", "scores/layer", "FLOPs/layer", "grid naive", "grid tiled", "KV cache"],
                                   [[f"{r.n:,}", f"{r.scores_per_layer:,}", f"{r.flops_per_layer:.3g}",
                                     _bytes(r.grid_bytes_naive), _bytes(r.grid_bytes_tiled),
                                     _bytes(r.kv_cache_bytes)] for r in rows])]
    return Report("\n".join(lines), {"config": config_name, "n_layers": config.n_layers,
                                     "block_q": config.block_q, "block_k": config.block_k, "workers": config.workers,
                                     "bytes_per_number": bytes_per_number, "params": vars(p), "cost": vars(c),
                                     "at_n_ctx": vars(at_ctx), "kv_bytes_per_token": g.kv_bytes_per_token(config),
                                     "n_heads": a.n_heads, "n_kv_heads": a.n_kv_heads,
                                     "kv_bytes_per_token_without_gqa": g.kv_bytes_per_token(g.without_gqa(config)),
                                     "growth": [vars(r) for r in rows]})


def _small_n_note(rows) -> str:
    small = [r.n for r in rows if r.grid_bytes_tiled > r.grid_bytes_naive]
    if not small:
        return ""
    return (f" At n = {', '.join(map(str, small))} the tiled column is the larger: its max and sum per query "
            "outweigh so small a grid.")


def _bytes(b: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= size:
            return f"{b / size:.1f} {unit}"
    return f"{b} B"


def report_published(config_name: str, n: int = g.KV_N, bytes_per_number: int | None = None) -> Report:
    """The KV cache of a published model (:mod:`attnlab.guide.published`) at ``n`` tokens, what GQA, sliding
    windows and MLA each save in it, and the table of all five."""
    m, c = g.PUBLISHED[config_name], g.kv_cost(config_name, n, bytes_per_number)
    kind = ("multi-head latent attention: a latent of kv_lora_rank " f"{m.kv_lora_rank} + the RoPE key slice "
            f"{m.qk_rope_head_dim} = {g.kv_numbers_per_layer(m)} numbers per layer" if m.kv_lora_rank else
            f"{m.n_kv_heads} key/value head{'s' * (m.n_kv_heads > 1)} of {m.d_head} for {m.n_heads} query heads")
    lines = [f"{m.title}: {m.n_layers} layers, {kind}"
             + (f"; {m.n_local} local layers (sliding window {m.window:,}) and {m.n_global} global "
                f"({m.local_per_global} local : 1 global)" if m.window else "") + f"; {c.bytes_per_number} bytes "
             "per number.",
             f"  published: {m.fields}",
             f"  source: {m.source}",
             f"KV cache: {_bytes(c.per_token)} per token ({c.per_token:,} B)"
             + (f" while n <= {m.window:,}, then {_bytes(c.per_token_past_window)} ({c.per_token_past_window:,} B) "
                "per token, the global layers only" if m.window else "")
             + f"; {_bytes(c.at_n)} ({c.at_n:,} B) at n = {n:,}"
             + (f" (beyond its n_ctx {m.n_ctx:,})" if n > m.n_ctx else "") + "."]
    saving = {"gqa": f"grouped-query attention ({m.n_heads} query heads share {m.n_kv_heads} key/value heads)",
              "window": f"sliding windows ({m.n_local} of {m.n_layers} layers keep only {m.window} tokens)",
              "mla": f"latent attention (the latent instead of {m.n_heads} heads' keys of {m.d_head} + "
                     f"{m.qk_rope_head_dim} and values of {m.d_head})"}
    used = [k for k in g.MECHANISMS if c.saves(k) > 1]
    for k in used:
        undone = {"gqa": c.without_gqa, "window": c.without_window, "mla": c.without_mla}[k]
        lines.append(f"  {saving[k]} saves {c.saves(k):.2f}x: {_bytes(undone)} without it.")
    if not used:
        lines.append("  plain multi-head attention: every layer caches every head's keys and values, nothing saved.")
    elif len(used) > 1:
        lines.append(f"  together {c.saves('all'):.2f}x against plain multi-head attention ({_bytes(c.plain)}).")
    text, table_data = kv_table_text(n, bytes_per_number)
    return Report("\n".join(lines + ["", text]), {"config": config_name, "n": n, "published": vars(m),
                                                  "kv": vars(c), "table": table_data})


def kv_table_text(n: int = g.KV_N, bytes_per_number: int | None = None) -> tuple[str, list[dict]]:
    """The five published models' KV cache side by side: the table the tour's cost section shows."""
    rows = g.kv_table(n, bytes_per_number)
    head = (f"KV cache of published models at n = {n:,} tokens, in each one's dtype; \"saves\": the same model's "
            "cache without the mechanism, divided by its own (`attnlab cost --config NAME` for one, with sources):")
    body = table(["model", "bytes", "per token", "past window", f"at {n:,}", "GQA saves", "window saves",
                  "MLA saves", "vs plain MHA"],
                 [[r.name, str(r.bytes_per_number), _bytes(r.per_token), _bytes(r.per_token_past_window),
                   _bytes(r.at_n), f"{r.saves('gqa'):.2f}x", f"{r.saves('window'):.2f}x", f"{r.saves('mla'):.2f}x",
                   f"{r.saves('all'):.2f}x"] for r in rows])
    return head + "\n" + body, [{**vars(r), "saves": {k: r.saves(k) for k in (*g.MECHANISMS, "all")}}
                                 for r in rows]


def cmd_cost(args) -> int:
    name = args.config or "gpt2-small"
    if name not in g.COST_CONFIGS:
        return emit(args, report_published(name, bytes_per_number=args.bytes))
    r = report_cost(args.n, name, block_q=args.block_q, block_k=args.block_k, workers=args.workers,
                    bytes_per_number=args.bytes or 4, growth_table=not args.no_growth)
    if args.config in g.PUBLISHED:             # asked by name: its published row too
        p = report_published(name, bytes_per_number=args.bytes)
        r = Report(r.text + "\n\n" + p.text, {**r.data, "published": p.data})
    return emit(args, r)


# --- 10. tokens ---------------------------------------------------------------------------------

def gpt2_tokenize(text: str) -> tuple[list[int], list[str]]:
    """GPT-2 token ids and the text of each token; a missing tokenizer is an OSError (one line, exit 2)."""
    try:
        from ..text.tokens import gpt2_tokenizer
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
    p = add_command(sub, "floors", help="lowest possible cross-entropy for each context length k",
                    section="Why context pays",
                    shows="Shows the lowest cross-entropy any predictor can reach with k characters (or words) of "
                          "context, counted on the guide's toy text or your own file",
                    examples=("attnlab floors                 # the guide's 2.318 … 0.179",
                              "attnlab floors --max-k 8 --json"))
    p.add_argument("file", nargs="?", help="a UTF-8 text file (default: the guide's toy text)")
    p.add_argument("--max-k", type=_int, default=5, help="longest context (default 5)")
    p.add_argument("--level", choices=LEVELS, default="char", help="count characters or words")
    _done(p, cmd_floors)

    p = add_command(sub, "lookup", help="the soft lookup step by step, and its hard limit",
                    section="The idea: a soft lookup",
                    shows="Shows one query scored against every key, the softmax weights and the weighted sum of "
                          "the values, step by step, and the hard lookup a huge score turns it into",
                    examples=("attnlab lookup                 # the guide's [0.090 0.665 0.245]",
                              "attnlab lookup --query '0.2 1' --scale"))
    p.add_argument("--query", help="the query, e.g. 1,0 (default: the guide's)")
    p.add_argument("--keys", help="one key per token, rows split by ';', e.g. '0,0;2,0;1,1'")
    p.add_argument("--values", help="one value per token, e.g. '1,0;0,1;1,1'")
    p.add_argument("--tokens", nargs="+", help="names for the keys (default: the cat sat)")
    p.add_argument("--scale", action="store_true", help="divide the scores by √d_k")
    p.add_argument("--hard", type=float, default=g.lookup.HARD_SCORE, help="push the top score to this (20)")
    _done(p, cmd_lookup)

    p = add_command(sub, "explain", help="the equation symbol by symbol, or a model's shapes table",
                    section="Where queries, keys and values come from",
                    shows="Shows A = softmax(QKᵀ/√d_k + M) and AV symbol by symbol (X, W^Q … S, M, A) with shapes "
                          "and values on the toy embeddings, or a real model's shapes table",
                    examples=("attnlab explain 'the cat sat'", "attnlab explain --config gpt2-small"))
    p.add_argument("sentence", nargs="?", help="words of the toy vocabulary (default: 'the cat sat'); "
                   "with --config any text (default: 'The cat sat on the')")
    p.add_argument("--config", choices=sorted(g.COST_CONFIGS), help="print the shapes table for this model instead")
    p.add_argument("--no-mask", action="store_true", help="leave the causal mask off (M = 0)")
    p.add_argument("--d-k", type=_int, help="width of queries, keys and values (default 4, the toy's d_model)")
    p.add_argument("--seed", type=seed_arg, help=f"seed of W^Q, W^K, W^V (default {g.toy.PROJECTION_SEED}, the guide's)")
    _done(p, cmd_explain)

    p = add_command(sub, "scale", help="why the scores are divided by √d_k",
                    section="Keeping the softmax usable: the square root of d_k",
                    shows="Shows why the scores are divided by √d_k: dot products spread as √d_k, the largest "
                          "softmax weight saturates without the division, and a saturated weight barely moves",
                    examples=("attnlab scale                  # the guide's 1.98, 8.01 and 0.843 0.247",
                              "attnlab scale --d-k 4 16 256 --pairs 2000 --trials 500"))
    p.add_argument("--seed", type=seed_arg, default=g.scaling.SEED, help="the guide uses 0")
    p.add_argument("--pairs", type=_int, default=10_000, help="random pairs per width (10,000)")
    p.add_argument("--trials", type=_int, default=2000, help="random queries for the top weight (2,000)")
    p.add_argument("--d-k", type=_int, nargs="+", default=[4, 64], metavar="N",
                   help="widths for the spread (default 4 64); the top weight uses the widest")
    p.add_argument("--keys", type=_int, default=16, help="keys per query in the top-weight experiment (16)")
    p.add_argument("--scores", action="append", metavar="S",
                   help="scores to saturate, e.g. '10,0,0' (repeatable; default the guide's 10,0,0 and 1,0,0)")
    _done(p, cmd_scale)

    p = add_command(sub, "mask", help="the causal mask M, with 0 and −∞, and as bools",
                    section="No peeking: the causal mask",
                    shows="Shows the causal mask M added to the scores, 0 where a token may look and −∞ where it "
                          "may not, and the same mask as bools",
                    examples=("attnlab mask", "attnlab mask 8 --png mask.png"))
    p.add_argument("n", nargs="?", type=_int, metavar="N", help="number of tokens (default: the running example)")
    p.add_argument("--tokens", nargs="+", help="labels for the rows and columns")
    p.add_argument("--png", help="also draw the mask into this PNG file")
    _done(p, cmd_mask)

    p = add_command(sub, "embed", help="retrain the toy embeddings; attention grids with random W_Q, W_K, W_V",
                    section="No peeking: the causal mask",
                    shows="Shows Guide 3's toy embeddings retrained (cos(cat, dog) 0.95) and the causal attention "
                          "weights they give with random W^Q, W^K, W^V",
                    examples=("attnlab embed", "attnlab embed --sentence 'the dog ran to the cat'"))
    p.add_argument("--sentence", action="append", help="a sentence of toy words (repeatable; default: the guide's two)")
    p.add_argument("--pair", nargs=2, default=("cat", "dog"), metavar=("A", "B"), help="words to compare (cat dog)")
    p.add_argument("--seed", type=seed_arg, default=g.toy.EMBED_SEED, help="seed of the embedding table (0)")
    p.add_argument("--proj-seed", type=seed_arg, default=g.toy.PROJECTION_SEED, help="seed of W_Q, W_K, W_V (1)")
    _done(p, cmd_embed)

    p = add_command(sub, "heads", help="multi-head attention on GPT-2 small's shapes",
                    section="Several heads at once",
                    shows="Shows multi-head attention on GPT-2 small's shapes (or yours): the shapes, the "
                          "parameter counts and every head's grid, heads numbered from 0",
                    examples=("attnlab heads", "attnlab heads --n-heads 4 --d-model 64 --seed 5"))
    p.add_argument("--n", type=_int, default=5, help="tokens (default 5)")
    p.add_argument("--seed", type=seed_arg, default=g.heads.SEED, help="seed of X and the four matrices (the guide uses 0)")
    p.add_argument("--n-heads", type=_int, default=12, help="heads h (default 12, GPT-2 small's)")
    p.add_argument("--d-model", type=_int, default=768, help="width d_model, a multiple of h (default 768)")
    _done(p, cmd_heads)

    p = add_command(sub, "order", help="attention is blind to order until positions are added",
                    section="Order: giving tokens a position",
                    shows="Shows that attention without positions is blind to word order, and what position "
                          "vectors and the causal mask change (True True, False 0.749, False 0.020)",
                    examples=("attnlab order",
                              "attnlab order --sentence 'the dog ran to the cat' --sentence 'the cat ran to the dog'"))
    p.add_argument("--seed", type=seed_arg, default=g.order.POSITION_SEED, help="seed of the position vectors (2)")
    p.add_argument("--sentence", action="append", metavar="TEXT",
                   help="a sentence of toy words; give it twice for the second sentence (default: the guide's "
                        "'the cat saw the dog' and 'the dog saw the cat'; one sentence alone is set beside its "
                        "words reversed)")
    _done(p, cmd_order)

    p = add_command(sub, "cost", help="parameters, scores, FLOPs, score-grid and KV-cache memory",
                    section="The price of looking at everything",
                    shows="Shows what attention costs at n tokens: parameters, scores, FLOPs, score-grid memory "
                          "naive and tiled, the KV cache, and how each grows with n",
                    examples=("attnlab cost", "attnlab cost --n 4096 --no-growth",
                              "attnlab cost --config llama-3.2-1b --no-growth",
                              "attnlab cost --config deepseek-v3       # the KV cache of published shapes"))
    p.add_argument("--n", type=_int, default=5, help="sequence length (default 5, the running example)")
    p.add_argument("--config", choices=sorted(set(g.COST_CONFIGS) | set(g.PUBLISHED)),
                   help="the model whose sizes are counted (default gpt2-small, the guide's); "
                   f"{', '.join(g.PUBLISHED)}: the KV cache of the published shapes at {g.KV_N:,} tokens, what GQA, "
                   "sliding windows and MLA each save, and the table of all five")
    p.add_argument("--block-q", type=_int, help="the tiled column only (Guide 10): queries per block of "
                   f"scores ({g.CostConfig.block_q})")
    p.add_argument("--block-k", type=_int, help="the tiled column only: keys per block of scores "
                   f"({g.CostConfig.block_k})")
    p.add_argument("--workers", type=_int, help="the tiled column only: blocks held at once, one per worker "
                   f"thread ({g.CostConfig.workers})")
    p.add_argument("--bytes", type=_int, help="bytes per number (default 4, float32, what numpy computes in "
                   "here; a published model's: its checkpoint's dtype)")
    p.add_argument("--no-growth", action="store_true", help="leave out the growth table")
    _done(p, cmd_cost)

    p = add_command(sub, "tokens", help="GPT-2 BPE token ids",
                    section="No peeking: the causal mask",
                    shows="Shows a text's GPT-2 BPE token ids, the running example's inputs and targets "
                          "(464 3797 3332 319 262)",
                    examples=("attnlab tokens", "attnlab tokens 'The dog sat'"))
    p.add_argument("text", nargs="?", default=g.RUNNING_EXAMPLE, help="default: 'The cat sat on the'")
    _done(p, cmd_tokens)


def _done(p, func) -> None:
    add_json_flag(p)
    p.set_defaults(func=func)
