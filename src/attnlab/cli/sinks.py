"""attnlab sinks: attention sinks measured on a trained model, and a sink + window cache (StreamingLLM)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ._app import add_command, add_json_flag, positive_int, print_json
from ._model import add_model_option, load, model_arg
from ._progress import progress

PIECE = 128          # tokens per piece of the corpus for the first-token figures
PIECES = 8           # pieces read (the corpus's first PIECES · PIECE tokens)
WINDOW = 256         # recent tokens a sink + window cache keeps
SINKS = (0, 1, 4)    # sink counts measured: window-only, one sink, StreamingLLM's four
TOKENS = 1024        # tokens of the long text: four windows
CHUNK = 16           # tokens per forward of the streaming read (1 = StreamingLLM exactly, slower)
AGREE = 1.02         # "4 sinks recover the full cache": their perplexity within 2% of the full cache's


def register(sub) -> None:
    p = add_command(sub, "sinks", help="attention sinks on a trained model, and a sink + window KV cache",
                    beyond="docs/sinks.md",
                    shows="Shows how much attention each head puts on the first token, what the first token's keys "
                          "and values are worth to the loss, and the loss of a long text read through a cache that "
                          "keeps the first k tokens plus a window of recent ones (StreamingLLM), against "
                          "window-only and the full cache",
                    more="The text is the package's own docstrings unless --text FILE is given (nothing downloads).",
                    examples=("attnlab sinks --model smollm2",
                              "attnlab sinks --model smollm2 --window 128 --tokens 512 --out sinks.png",
                              "attnlab sinks --model smollm2 --text attention-guide.txt --json"))
    add_model_option(p, default="smollm2", decoder=True)
    p.add_argument("--text", metavar="FILE", help="a UTF-8 text file to read (default: attnlab's own docstrings)")
    p.add_argument("--piece", type=positive_int, default=PIECE, help=f"tokens per piece of the text for the "
                   f"first-token figures, each piece's first token the one measured (default {PIECE})")
    p.add_argument("--pieces", type=positive_int, default=PIECES, help=f"pieces read (default {PIECES})")
    p.add_argument("--window", type=positive_int, default=WINDOW, help=f"recent tokens the cache keeps, the "
                   f"new one included (default {WINDOW})")
    p.add_argument("--sinks", default=",".join(map(str, SINKS)), metavar="K,K,…",
                   help=f"sink counts to measure, 0 = window-only (default {','.join(map(str, SINKS))})")
    p.add_argument("--tokens", type=positive_int, default=TOKENS, help=f"tokens of the long text, more than "
                   f"the window and the sinks (default {TOKENS})")
    p.add_argument("--chunk", type=positive_int, default=CHUNK, help=f"tokens per forward of the streaming read: "
                   f"1 is StreamingLLM exactly; c lets a chunk's queries see between window − c + 1 and window "
                   f"recent tokens (default {CHUNK})")
    p.add_argument("--out", metavar="FILE.png", help="a layer × head heatmap of the weight on the first token")
    add_json_flag(p)
    p.set_defaults(func=cmd_sinks)


def parse_sinks(text: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(k) for k in text.split(","))
    except ValueError:
        ks = ()
    if not ks or any(k < 0 for k in ks):
        raise ValueError(f"--sinks must be sink counts >= 0 separated by commas, e.g. 0,1,4; got {text!r}")
    return tuple(sorted(set(ks)))


def cmd_sinks(args) -> int:
    from ..interpret.sinks import package_text
    ks = parse_sinks(args.sinks)
    text = Path(args.text).read_text(encoding="utf-8") if args.text else package_text()
    found = {}

    def check(tokenizer, n_ctx):            # before the weights load: a text too short fails at once
        ids = tokenizer.encode(text)        # (n,)
        need = max(args.tokens, args.piece)
        if ids.size < need:
            raise ValueError(f"the text has {ids.size} tokens, fewer than --tokens {args.tokens} or --piece "
                             f"{args.piece}: give a longer --text or smaller numbers")
        if args.tokens <= args.window + max(ks):
            raise ValueError(f"--tokens ({args.tokens}) must exceed --window ({args.window}) plus the most "
                             f"sinks ({max(ks)}): the text must be longer than the cache")
        if args.chunk > args.window:
            raise ValueError(f"--chunk ({args.chunk}) must be at most --window ({args.window})")
        if n_ctx is not None and args.tokens > n_ctx:
            raise ValueError(f"--tokens ({args.tokens}) must fit the model's context n_ctx {n_ctx}: the full "
                             "cache reads them all")
        found["ids"] = ids
    model, tokenizer = load(args, "sinks", check=check)
    r = measure(model, found["ids"], ks, args)
    if args.out:
        from ..interpret.figures import save_head_grids
        save_head_grids(args.out, {"weight on the first token": r["first_token"]},
                        title=f"{model_arg(args)}: mean attention on key 0, {r['pieces']} pieces of {args.piece} "
                              "tokens")
    if args.json:
        print_json({"model": model_arg(args), **r})
        return 0
    print("\n".join(report(model_arg(args), r, args)))
    return 0


def measure(model, ids: np.ndarray, ks: tuple[int, ...], args) -> dict:
    """Every figure of the command, as data."""
    from ..interpret.sinks import (SinkWindow, first_token_attention, recomputed_loss, streaming_loss,
                                   without_first_token)
    n_pieces = min(args.pieces, ids.size // args.piece)
    pieces = [ids[i * args.piece:(i + 1) * args.piece] for i in range(n_pieces)]          # each (piece,)
    with progress("attention on the first token", quiet=args.json, total=n_pieces) as step:
        grids = []
        for i, piece in enumerate(pieces):
            grids.append(first_token_attention(model, [piece]))          # (L, h)
            step(i + 1)
    first = np.mean(grids, axis=0)                                      # (L, h) the pieces are the same length
    with progress("the loss without the first token", quiet=args.json, total=n_pieces) as step:
        removed = []
        for i, piece in enumerate(pieces):
            removed.append(without_first_token(model, piece))
            step(i + 1)
    with_first = np.concatenate([r.with_first for r in removed])         # (pieces · (piece − 2),)
    without = np.concatenate([r.without_first for r in removed])
    early = np.concatenate([r.without_first[:16] - r.with_first[:16] for r in removed])
    late = np.concatenate([r.without_first[16:] - r.with_first[16:] for r in removed])
    text = ids[:args.tokens]                                            # (tokens,)
    past = max(ks) + args.window                                        # targets from here on differ by policy
    policies = [("full", None)] + [(f"sinks={k}", SinkWindow(k, args.window)) for k in ks]
    streams = {}
    for name, policy in policies:
        with progress(f"reading {text.size} tokens, {name} cache", quiet=args.json) as step:
            loss = streaming_loss(model, text, policy, chunk=args.chunk if policy else max(args.chunk, 128),
                                   progress=step)
        streams[name] = {"nll_past_window": float(loss[past - 1:].mean()), "nll_all": float(loss.mean()),
                         "sinks": None if policy is None else policy.n_sink}
    with progress(f"reading {text.size} tokens, windows of {past} recomputed", quiet=args.json) as step:
        loss = recomputed_loss(model, text, past, chunk=args.chunk, progress=step)
    streams["recomputed"] = {"nll_past_window": float(loss[past - 1:].mean()), "nll_all": float(loss.mean()),
                             "sinks": None}
    full = streams["full"]["nll_past_window"]
    four = streams.get("sinks=4", {}).get("nll_past_window")
    again = streams["recomputed"]["nll_past_window"]
    return {"pieces": n_pieces, "piece": args.piece, "first_token": first,
            "first_token_by_layer": first.mean(-1),
            "loss_with_first": float(with_first.mean()), "loss_without_first": float(without.mean()),
            "increase_first_16": float(early.mean()), "increase_after_16": float(late.mean()) if late.size else None,
            "tokens": int(text.size), "window": args.window, "chunk": args.chunk, "scored_from": past,
            "streaming": streams,
            "four_sinks_recover": None if four is None else bool(np.exp(four - full) <= AGREE),
            "four_sinks_match_recomputed": None if four is None else bool(np.exp(four - again) <= AGREE)}


def uniform(n: int) -> float:
    """The mean weight on key 0 of queries 1 … n − 1 attending uniformly: query i gives it 1 / (i + 1)."""
    return float(np.mean(1.0 / np.arange(2, n + 1)))


def report(name: str, r: dict, args) -> list[str]:
    first = r["first_token"]                                            # (L, h)
    L, h = first.shape
    lines = [f"{name}: mean attention weight on the first token, by layer and head ({r['pieces']} pieces of "
             f"{r['piece']} tokens, queries 1 … {r['piece'] - 1}; uniform would be about "
             f"{uniform(r['piece']):.3f})",
             "layer  mean " + " ".join(f"{'H' + str(j):>5}" for j in range(h))]
    lines += [f"{i:>5} {first[i].mean():5.2f} " + " ".join(f"{v:5.2f}" for v in first[i]) for i in range(L)]
    share = float((first > 0.5).mean())
    lines += [f"{share:.0%} of the {L * h} heads put more than half their weight on the first token.",
              "",
              f"The first token's keys and values removed from every layer's cache: next-token loss on tokens "
              f"2 … {r['piece'] - 1} of each piece {r['loss_with_first']:.4f} → {r['loss_without_first']:.4f} nats "
              f"(+{r['loss_without_first'] - r['loss_with_first']:.4f}); +{r['increase_first_16']:.4f} on the "
              f"first 16 tokens after it"
              + ("" if r["increase_after_16"] is None else f", +{r['increase_after_16']:.4f} on the rest") + ".",
              "",
              f"A text of {r['tokens']} tokens read through a cache of the first k tokens plus the {r['window']} most "
              f"recent ones ({r['chunk']} tokens per forward), against the full cache; mean next-token loss of the "
              f"tokens from {r['scored_from']} on, where the caches differ:",
              f"{'cache':<12} {'nll':>8} {'ppl':>9} {'vs full':>8}"]
    full = r["streaming"]["full"]["nll_past_window"]
    for key, s in r["streaming"].items():
        label = (key if s["sinks"] is None else "window only" if s["sinks"] == 0 else
                 f"{s['sinks']} sink{'s' * (s['sinks'] > 1)}")
        nll = s["nll_past_window"]
        lines.append(f"{label:<12} {nll:8.4f} {np.exp(nll):9.2f} {np.exp(nll - full):7.3f}x")
    lines.append(f"(recomputed: each chunk's predictions from a fresh forward over the last {r['scored_from']} "
                 "tokens, no cache: StreamingLLM's baseline, the same window without the far context)")
    if r["four_sinks_recover"] is not None:
        yes = lambda v: "yes" if v else "no"                            # noqa: E731
        lines.append(f"StreamingLLM: 4 sinks recover the full cache's perplexity. On {name}, 4 sinks within "
                     f"{AGREE - 1:.0%} of the full cache's: {yes(r['four_sinks_recover'])}; of the recomputed "
                     f"window's (or below it): {yes(r['four_sinks_match_recomputed'])}.")
    return lines
