"""attnlab chat: talk to an instruction-tuned model (default SmolLM2-135M-Instruct) through its own chat
template, the reply streamed as it comes, one KV cache kept for the whole conversation.

``--message TEXT`` asks once and exits. Without it, on a terminal, each line typed is a message (an empty
line or Ctrl-D ends); from a pipe, each non-empty line of stdin is one message. Tokens per second go to
stderr after each reply, so stdout holds only the replies.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from ._app import add_command, add_json_flag, positive_int, print_json
from ._model import load
from .generate import add_model_flag, add_sampling_flags, sampling


def register(sub) -> None:
    p = add_command(sub, "chat", help="talk to a chat model (default SmolLM2-135M-Instruct), streamed, one KV "
                                      "cache across the turns",
                    beyond="docs/gguf.md",
                    shows="Shows an instruction-tuned model's replies, its own chat template rendered with Jinja2, "
                          "each reply streamed as it comes and stopped at its end-of-turn token",
                    more="Every turn feeds only its new tokens: one KV cache holds the whole conversation.",
                    examples=("attnlab chat --message 'What is the capital of France?' --tokens 12",))
    add_model_flag(p)
    p.add_argument("--message", default=None, help="one message: print the reply and exit (default: a loop on "
                                                   "a terminal, or one message per line of stdin)")
    p.add_argument("--system", default=None, help="a system message (default: the template's own)")
    p.add_argument("--tokens", type=positive_int, default=256, help="the longest reply, in tokens (default 256)")
    add_sampling_flags(p, temperature=0.0)
    add_json_flag(p)
    p.set_defaults(func=cmd_chat)


def messages_in(args):
    """The user's messages: --message, lines typed at a prompt on a terminal, or the lines of a pipe."""
    if args.message is not None:
        yield args.message
        return
    if sys.stdin.isatty():
        while True:
            try:
                line = input("you> ")
            except EOFError:
                print(file=sys.stderr)
                return
            if not line.strip():
                return
            yield line
    else:
        for line in sys.stdin:
            if line.strip():
                yield line.rstrip("\n")


def cmd_chat(args) -> int:
    from ..kernels._threads import one_blas_thread
    from ..stack.chat import Chat
    from ..text.tokens import TextStream

    model, tokenizer = load(args, "chat")
    chat = Chat(model, tokenizer, system=args.system)
    rng, turns = np.random.default_rng(args.seed), []
    for message in messages_in(args):
        stream = TextStream(tokenizer)
        show = None if args.json else (lambda i: print(stream.push(i), end="", flush=True))   # noqa: E731
        start = time.perf_counter()
        with one_blas_thread():
            reply = chat.say(message, max_tokens=args.tokens, rng=rng, **sampling(args, model), on_token=show)
        seconds = time.perf_counter() - start
        ended = bool(reply[-1] in chat.stop)
        turns.append({"message": message, "reply": tokenizer.decode(reply), "ids": reply, "ended": ended,
                      "tokens_per_second": reply.size / seconds, "context_tokens": chat.length})
        if not args.json:
            print(stream.flush())
            cut = "" if ended else f"; cut at --tokens {args.tokens}"
            print(f"({reply.size} tokens, {reply.size / seconds:.1f} tokens/s, {chat.length} in the cache{cut})",
                  file=sys.stderr)
    if args.json:
        print_json({"model": model.name, "turns": turns})
    return 0
