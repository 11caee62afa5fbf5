"""attnlab generate: sample from a checkpoint written by ``attnlab train --out``, through the KV cache."""

from __future__ import annotations

import sys

import numpy as np

from ._app import add_json_flag, print_json, seed_arg


def register(sub) -> None:
    g = sub.add_parser("generate", help="sample text from a trained checkpoint, through the KV cache")
    g.add_argument("dir", metavar="DIR", help="a directory written by 'attnlab train --out'")
    g.add_argument("--prompt", required=True, help="text to start from (its tokens must be in the vocabulary)")
    g.add_argument("--tokens", type=int, default=100, help="tokens to generate (default 100)")
    g.add_argument("--temperature", type=float, default=1.0, help="divides the logits; 0 = greedy (default 1)")
    g.add_argument("--seed", type=seed_arg, default=0, help="seed of the sampler (default 0)")
    add_json_flag(g)
    g.set_defaults(func=cmd_generate)


def cmd_generate(args) -> int:
    from .._threads import one_blas_thread
    from ..lm.checkpoint import load_checkpoint
    from ..stack import generate

    model, vocab = load_checkpoint(args.dir)
    try:
        prompt = vocab.encode(args.prompt)
    except ValueError as e:
        hint = ""
        if args.prompt.lower() != args.prompt:
            try:
                vocab.encode(args.prompt.lower())
                hint = f" (the lowercase --prompt {args.prompt.lower()!r} fits)"
            except ValueError:
                pass
        raise ValueError(f"--prompt: {e}; it holds {vocabulary_list(vocab)}{hint}") from None
    if prompt.size == 0:
        raise ValueError("--prompt must hold at least one token")
    with one_blas_thread():
        ids = generate(model, prompt, args.tokens, temperature=args.temperature,
                       rng=np.random.default_rng(args.seed))
    text = vocab.decode(ids)
    joined = args.prompt + ("" if vocab.level == "char" else " ") + text
    note = greedy_note(vocab, ids) if args.temperature == 0 else None
    if args.json:
        print_json({"prompt": args.prompt, "generated": text, "ids": ids, "text": joined, "note": note})
    else:
        print(joined)
        if note:
            print(note, file=sys.stderr)
    return 0


def vocabulary_list(vocab, most: int = 60) -> str:
    """The vocabulary as a learner can read it: every char (or the first ``most`` words), quoted."""
    shown = [repr(s) for s in vocab.symbols[:most]]
    more = f" … and {vocab.size - most} more" if vocab.size > most else ""
    return f"{' '.join(shown)}{more}"


def greedy_note(vocab, ids) -> str:
    """What temperature 0 does, and whether the output fell into a loop."""
    ids = [int(i) for i in ids]
    repeats = lambda p: ids[-3 * p:-2 * p] == ids[-2 * p:-p] == ids[-p:]   # noqa: E731  the last p ids, 3 times
    loop = next((p for p in range(1, len(ids) // 3 + 1) if repeats(p)), None)
    text = ("(temperature 0 is greedy: every step takes the single most likely next token, so the same context "
            "always gives the same token")
    if loop is not None:
        text += f"; here it fell into a loop repeating {vocab.decode(ids[-loop:])!r}, since the model's "
        text += "top choice brings it back to a context it has seen. A temperature of 0.5–1 samples its way out"
    return text + ".)"
