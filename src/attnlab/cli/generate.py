"""attnlab generate: sample from a checkpoint written by ``attnlab train --out``, through the KV cache."""

from __future__ import annotations

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
    prompt = vocab.encode(args.prompt)
    if prompt.size == 0:
        raise ValueError("--prompt must hold at least one token")
    with one_blas_thread():
        ids = generate(model, prompt, args.tokens, temperature=args.temperature,
                       rng=np.random.default_rng(args.seed))
    text = vocab.decode(ids)
    joined = args.prompt + ("" if vocab.level == "char" else " ") + text
    if args.json:
        print_json({"prompt": args.prompt, "generated": text, "ids": ids, "text": joined})
    else:
        print(joined)
    return 0
