"""attnlab generate: continue a text with any decoder ``attnlab.models.load_model`` reads (SmolLM2, the default;
a .gguf file; a GPT-2, Llama, Mistral or Qwen2 folder, or one written by ``attnlab train --out``), through the KV
cache, the text streamed as it comes.

The prompt is encoded and the continuation decoded with the folder's own tokenizer: the character- or word-level
vocabulary of an ``attnlab train`` folder, the ``vocab.json``/``merges.txt`` or ``tokenizer.json`` of the others.
Generation ends after the folder's end-of-text token (config.json's ``eos_token_id``, ``ModelConfig.eos_ids``),
that token included, as transformers' ``generate`` does; ``--no-stop`` runs every token. attnlab's own folders
have none.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from ._app import add_command, add_json_flag, non_negative_float, positive_int, print_json, probability, seed_arg
from ._model import add_model_option, load


def register(sub) -> None:
    g = add_command(sub, "generate", help="continue a text with a decoder (default SmolLM2-135M), streamed, "
                                          "through the KV cache",
                    section="No peeking: the causal mask",
                    shows="Shows a text continued one token at a time through the KV cache by a decoder (default "
                          "'smollm2', SmolLM2-135M-Instruct; or 'induction', the small model shipped with attnlab, "
                          "a .gguf file or a decoder folder), streamed as it comes",
                    more="The causal mask stays on during generation, as the guide says; see docs/lm.md and "
                         "docs/gguf.md.",
                    examples=("attnlab generate --prompt 'The cat sat on the' --tokens 12 --temperature 0",
                              "attnlab generate induction --prompt '|abcdeabc' --tokens 4 --temperature 0",
                              "attnlab generate induction --prompt '|xyzxy' --tokens 8 --seed 1"))
    g.add_argument("dir", metavar="DIR", nargs="?", default=None,
                   help="the same as --model (kept for folders written by 'attnlab train --out')")
    add_model_flag(g)
    g.add_argument("--prompt", required=True, help="text to start from, encoded with the model's tokenizer")
    g.add_argument("--tokens", type=positive_int, default=100, help="tokens to generate (default 100)")
    add_sampling_flags(g, temperature=1.0)
    g.add_argument("--no-stop", action="store_true",
                   help="run all --tokens even past the model's end-of-text token (config.json's eos_token_id, "
                        "a GGUF's tokenizer.ggml.eos_token_id), where generation otherwise stops, that token "
                        "included")
    add_json_flag(g)
    g.set_defaults(func=cmd_generate)


def add_model_flag(p, default: str = "smollm2") -> None:
    """``--model`` of a decoder (generate, chat): :func:`attnlab.cli._model.add_model_option`."""
    add_model_option(p, default=default, decoder=True)


def add_sampling_flags(p, *, temperature: float) -> None:
    p.add_argument("--temperature", type=non_negative_float, default=temperature,
                   help=f"divides the logits; 0 = greedy (default {temperature:g})")
    p.add_argument("--top-k", type=positive_int, default=None, help="sample only from the k most likely tokens")
    p.add_argument("--top-p", type=probability, default=None,
                   help="sample only from the fewest most likely tokens whose probability reaches p (nucleus)")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the sampler (default 0)")


def sampling(args, model) -> dict:
    """``--temperature``, ``--top-k``, ``--top-p`` as ``generate`` takes them (all checked when parsed): a
    ``--top-k`` of the whole vocabulary or more cuts nothing, so it is capped there rather than refused."""
    top_k = None if args.top_k is None else min(args.top_k, model.config.vocab_size)
    return {"temperature": args.temperature, "top_k": top_k, "top_p": args.top_p}


def cmd_generate(args) -> int:
    from ..kernels._threads import one_blas_thread
    from ..stack.transformer import generate
    from ..text.tokens import TextStream

    if not args.prompt:
        raise ValueError("--prompt is empty: give the text to continue")
    prompt = None

    def check(tokenizer):
        nonlocal prompt
        prompt = encode_prompt(tokenizer, args.prompt)
    model, tokenizer = load(args, "generate", check=check)
    n_new, cap = capped_tokens(args.tokens, prompt.size, model.config.n_ctx)
    stop = () if args.no_stop else model.config.eos_ids
    stream = None if args.json else TextStream(tokenizer, prompt)
    if cap and not args.json:
        print(f"attnlab: {cap}", file=sys.stderr)
    if stream is not None:
        print(stream.printed, end="", flush=True)
    clock = Clock()

    def on_token(i):
        clock.token()
        if stream is not None:
            print(stream.push(i), end="", flush=True)
    with one_blas_thread():
        ids = generate(model, prompt, n_new, **sampling(args, model), rng=np.random.default_rng(args.seed),
                       stop=stop, on_token=on_token)
    timings = clock.timings(args.load_seconds, prompt.size)
    text, joined = continuation(tokenizer, args.prompt, prompt, ids)
    note = greedy_note(tokenizer, ids) if args.temperature == 0 else None
    if args.json:
        out = {"prompt": args.prompt, "generated": text, "ids": ids, "text": joined, "note": note}
        if model.config.eos_ids:                 # a folder without an end-of-text token keeps its output as it was
            out["stopped"] = bool(len(stop) and ids[-1] in stop)     # ended at the end-of-text token
        if cap:
            out["capped"] = cap
        out["timings"] = timings
        print_json(out)
    else:
        print(stream.flush())
        if note:
            print(note, file=sys.stderr)
        print(timings_line(timings), file=sys.stderr)
    return 0


def capped_tokens(tokens: int, n_prompt: int, n_ctx: int) -> tuple[int, str | None]:
    """``--tokens``, cut to the room the context leaves after the prompt, and the one line that says so."""
    if n_prompt > n_ctx:
        raise ValueError(f"the prompt has {n_prompt} tokens, more than the model's context n_ctx {n_ctx}")
    room = max(n_ctx - n_prompt, 1)
    if tokens <= room:
        return tokens, None
    return room, (f"--tokens {tokens} is past the model's context of {n_ctx} tokens (the prompt holds {n_prompt}): "
                  f"generating {room}")


class Clock:
    """Wall times of a generation, as llama.cpp reports them: the prompt's pass ends at the first new token,
    decoding is every token after it. (Reported only: nothing computed depends on them.)"""

    def __init__(self):
        self.start, self.first, self.last, self.n = time.perf_counter(), None, None, 0

    def token(self) -> None:
        self.last = time.perf_counter()
        self.first = self.first or self.last
        self.n += 1

    def timings(self, load_seconds: float, n_prompt: int) -> dict:
        prompt_s = (self.first or time.perf_counter()) - self.start
        decode_s = (self.last - self.first) if self.n > 1 else 0.0
        return {"load_seconds": load_seconds, "prompt_tokens": n_prompt, "prompt_seconds": prompt_s,
                "prompt_tokens_per_second": n_prompt / prompt_s if prompt_s > 0 else None,
                "decode_tokens": max(self.n - 1, 0), "decode_seconds": decode_s,
                "decode_tokens_per_second": (self.n - 1) / decode_s if decode_s > 0 else None}


def timings_line(t: dict) -> str:
    """``load 1.02 s · prompt 7 tokens, 52.3 tokens/s · decode 11 tokens, 31.0 tokens/s`` (llama.cpp's three)."""
    def rate(n, per_s):
        return f"{n} tokens" + ("" if per_s is None else f", {per_s:.1f} tokens/s")
    return (f"load {t['load_seconds']:.2f} s · prompt {rate(t['prompt_tokens'], t['prompt_tokens_per_second'])} · "
            f"decode {rate(t['decode_tokens'], t['decode_tokens_per_second'])}")


def encode_prompt(tokenizer, prompt: str) -> np.ndarray:
    """The prompt's ids (n,); an error naming --prompt (and, for an own vocabulary, listing it)."""
    from ..text.tokens import Vocab

    try:
        ids = tokenizer.encode(prompt)                                   # (n,)
    except ValueError as e:
        if not isinstance(tokenizer, Vocab):
            raise ValueError(f"--prompt: {e}") from None
        hint = ""
        if prompt.lower() != prompt:
            try:
                tokenizer.encode(prompt.lower())
                hint = f" (the lowercase --prompt {prompt.lower()!r} fits)"
            except ValueError:
                pass
        raise ValueError(f"--prompt: {e}; it holds {vocabulary_list(tokenizer)}{hint}") from None
    if ids.size == 0:
        raise ValueError("--prompt must hold at least one token")
    return ids


def continuation(tokenizer, prompt: str, prompt_ids: np.ndarray, ids: np.ndarray) -> tuple[str, str]:
    """``(generated, text)``: the new tokens as text, and prompt and continuation together.

    An own vocabulary joins its symbols (words by a space). A subword tokenizer decodes prompt and continuation
    as one sequence, since a token's leading space may show only in context (SentencePiece's "▁cat"); the
    generated text is what that adds to the prompt's own decoding.
    """
    from ..text.tokens import Vocab

    if isinstance(tokenizer, Vocab):
        generated = tokenizer.decode(ids)
        return generated, prompt + ("" if tokenizer.level == "char" else " ") + generated
    text = tokenizer.decode(np.concatenate([prompt_ids, ids]))          # (n + n_new,) ids as one text
    head = tokenizer.decode(prompt_ids)
    return (text[len(head):] if text.startswith(head) else tokenizer.decode(ids)), text


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
