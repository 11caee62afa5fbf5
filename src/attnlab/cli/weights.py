"""attnlab explain-weights: the guide's last section, "What attention is, and isn't", measured on a real model.

One head's attention weights beside what each token does to the model's prediction: its value removed from
the head, the head ablated, the token left out (see :mod:`attnlab.interpret.weights`).
"""

from __future__ import annotations

import textwrap

import numpy as np

from ._app import add_command, add_json_flag, print_json
from ._model import add_model_option, load, model_arg

TEXT = "The cat sat on the mat"         # the tour's text for a trained model
GUIDE_CLOSE = ("A grid shows where one head in one layer drew information from. It doesn't show what was in the "
               "values, what the other heads did, or what later layers did with the result.",
               "Treat a grid as a hint about one step.")      # the guide's own words, its last paragraph


def register(sub) -> None:
    p = add_command(sub, "explain-weights", help="one head's attention weights beside what each token does to "
                    "the prediction", section="What attention is, and isn't",
                    shows="Shows one head's attention weights beside each token's importance for the model's "
                          "prediction: its value removed from the head, the head ablated, the token left out",
                    more="By default the head that puts most weight on [CLS]/[SEP] (or a decoder's first "
                         "token): the classic case where the most-attended token is not the most important.",
                    examples=("attnlab explain-weights", "attnlab explain-weights --layer 0 --head 2",
                              "attnlab explain-weights '|abcdeabcd' --model induction"))
    p.add_argument("text", nargs="?", metavar="TEXT", help=f"the text (default {TEXT!r}; for a model with its "
                   "own vocabulary, such as --model induction, give one, e.g. '|abcdeabcd')")
    add_model_option(p, default="minilm", quantized=False)
    p.add_argument("--layer", type=int, help="the layer, from 0 (default: with --head, or the sink head's)")
    p.add_argument("--head", type=int, help="the head, from 0 (default: the head that puts most weight on "
                   "[CLS]/[SEP] or the first token)")
    add_json_flag(p)
    p.set_defaults(func=cmd_explain_weights)


def cmd_explain_weights(args) -> int:
    model, tokenizer = load(args)
    text = args.text if args.text is not None else TEXT
    if (args.layer is None) != (args.head is None):
        raise ValueError("give both --layer and --head, or neither (then the sink head is taken)")
    r = explain_weights(model, tokenizer, text, layer=args.layer, head=args.head, name=model_arg(args))
    if args.json:
        print_json(r)
    else:
        print(explain_weights_text(r))
    return 0


def explain_weights(model, tokenizer, text: str, *, layer=None, head=None, name: str = "") -> dict:
    """Everything the command prints, as data: the tour and ``--json`` use it."""
    from ..interpret.weights import sink_head, weights_vs_importance
    from ..kernels._threads import one_blas_thread
    from .interpret import encode_text
    ids = encode_text(tokenizer, text, "TEXT", least=2, why="one to attend from, one to attend to")
    tokens = list(tokenizer.labels(ids))
    sinks = sink_positions(model, tokens)
    with one_blas_thread():                       # many small passes: one BLAS thread is many times faster
        if layer is None:
            layer, head, _ = sink_head(model, ids, sinks)
        r = weights_vs_importance(model, ids, layer=layer, head=head)
    return {"model": name, "text": text, "tokens": tokens, "layer": r.layer, "head": r.head, "query": r.query,
            "prediction": r.prediction, "sinks": sinks, "weight": r.weight, "value_in_head": r.value_in_head,
            "value_removed": r.value_removed, "left_out": r.left_out, "head_ablated": r.head_ablated,
            "most_attended": r.most_attended, "most_important": r.most_important, "guide": list(GUIDE_CLOSE)}


def sink_positions(model, tokens) -> list[int]:
    """Where a head parks weight it has no use for: [CLS] and [SEP] in an encoder, the first token in a
    decoder."""
    if model.config.is_causal:
        return [0]
    return [i for i, t in enumerate(tokens) if t in ("[CLS]", "[SEP]")] or [0]


def explain_weights_text(r: dict) -> str:
    from .attend import label
    tokens = [label(t) for t in r["tokens"]]
    at, imp = r["most_attended"], r["most_important"]
    where = "its last query" if r["query"] is not None else "averaged over every query"
    lines = [f"{r['model']} on {r['text']!r}: layer {r['layer']}, head {r['head']} (from 0), weights {where}; the "
             f"prediction is {r['prediction']}.",
             "columns: weight = the head's attention weight on the token; in head = its share of the head's "
             "output, ‖a·v‖/‖z‖; value out = the prediction's change with its value removed from this head; "
             "left out = the change with the token left out of the text",
             f"{'token':>8}  {'weight':>6}  {'in head':>7}  {'value out':>9}  {'left out':>8}"]
    for j, t in enumerate(tokens):
        mark = ("  ← most attended" if j == at else "") + ("  ← most important" if j == imp else "")
        left = "   (query)" if np.isnan(r["left_out"][j]) else f"{r['left_out'][j]:8.4f}"
        lines.append(f"{t:>8}  {r['weight'][j]:6.3f}  {r['value_in_head'][j]:7.3f}  {r['value_removed'][j]:9.2e}"
                     f"  {left}{mark}")
    lines.append(f"The whole head zeroed changes the prediction by {r['head_ablated']:.2e}.")
    lines += notice(r, tokens)
    lines += r["guide"]
    return "\n".join(line if line.startswith(" ") else "\n".join(textwrap.wrap(line, 100)) for line in lines)


def notice(r: dict, tokens) -> list[str]:
    """What to read off the table: whether the most-attended token is the one that matters."""
    at, imp = r["most_attended"], r["most_important"]
    w, share, left = r["weight"], r["value_in_head"], r["left_out"]
    if at == imp:
        return [f"Here the most-attended token, {tokens[at]}, is also the one whose leaving out changes the "
                "prediction most: this time the weights point at what matters. The grid alone could not have "
                "told you so."]
    out = [f"The most-attended token, {tokens[at]} ({w[at]:.3f} of the weight), is not the most important: "
           f"leaving it out changes the prediction by {left[at]:.4f}, leaving out {tokens[imp]} (weight "
           f"{w[imp]:.3f}) by {left[imp]:.4f}."]
    if share[at] < w[at] - 0.1:
        out.append(f"Its value is short, so the weight overstates it even inside the head: {tokens[at]} makes up "
                   f"{share[at]:.3f} of the head's output. A head with nothing to fetch parks its weight on such "
                   "a token, a no-op.")
    return out
