"""attnlab generate: sample from any decoder folder ``attnlab.models.load_model`` reads (GPT-2, Llama, Mistral,
Qwen2, or one written by ``attnlab train --out``), through the KV cache.

The prompt is encoded and the continuation decoded with the folder's own tokenizer: the character- or word-level
vocabulary of an ``attnlab train`` folder, the ``vocab.json``/``merges.txt`` or ``tokenizer.json`` of the others.
Generation ends after the folder's end-of-text token (config.json's ``eos_token_id``, ``ModelConfig.eos_ids``),
that token included, as transformers' ``generate`` does; ``--no-stop`` runs every token. attnlab's own folders
have none.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from ._app import add_command, add_json_flag, positive_int, print_json, seed_arg


def register(sub) -> None:
    g = add_command(sub, "generate", help="sample text from a decoder checkpoint folder, through the KV cache",
                    section="No peeking: the causal mask",
                    shows="Shows text sampled one token at a time through the KV cache from a decoder folder (or "
                          "'induction', the small model shipped with attnlab)",
                    more="The causal mask stays on during generation, as the guide says; see docs/lm.md.",
                    examples=("attnlab generate induction --prompt '|abcdeabc' --tokens 4 --temperature 0",
                              "attnlab generate induction --prompt '|xyzxy' --tokens 8 --seed 1"))
    g.add_argument("dir", metavar="DIR", help="a decoder folder: written by 'attnlab train --out', or a GPT-2, "
                                              "Llama, Mistral or Qwen2 folder (config.json, safetensors, tokenizer)")
    g.add_argument("--prompt", required=True, help="text to start from, encoded with the folder's tokenizer")
    g.add_argument("--tokens", type=positive_int, default=100, help="tokens to generate (default 100)")
    g.add_argument("--temperature", type=float, default=1.0, help="divides the logits; 0 = greedy (default 1)")
    g.add_argument("--seed", type=seed_arg, default=0, help="seed of the sampler (default 0)")
    g.add_argument("--no-stop", action="store_true",
                   help="run all --tokens even past the folder's end-of-text token (config.json's eos_token_id), "
                        "where generation otherwise stops, that token included")
    add_json_flag(g)
    g.set_defaults(func=cmd_generate)


def cmd_generate(args) -> int:
    from ..kernels._threads import one_blas_thread
    from ..stack.transformer import generate

    model, tokenizer = load_decoder(args.dir)
    prompt = encode_prompt(tokenizer, args.prompt)
    stop = () if args.no_stop else model.config.eos_ids
    with one_blas_thread():
        ids = generate(model, prompt, args.tokens, temperature=args.temperature,
                       rng=np.random.default_rng(args.seed), stop=stop)
    text, joined = continuation(tokenizer, args.prompt, prompt, ids)
    note = greedy_note(tokenizer, ids) if args.temperature == 0 else None
    if args.json:
        out = {"prompt": args.prompt, "generated": text, "ids": ids, "text": joined, "note": note}
        if model.config.eos_ids:                 # a folder without an end-of-text token keeps its output as it was
            out["stopped"] = bool(len(stop) and ids[-1] in stop)     # ended at the end-of-text token
        print_json(out)
    else:
        print(joined)
        if note:
            print(note, file=sys.stderr)
    return 0


def load_decoder(folder: str):
    """``(model, tokenizer)`` of a folder ``load_model`` reads; an encoder is refused, naming it and why."""
    from ..interpret.trained import resolve
    from ..models import MINILM, load_model
    from ..stack.transformer import check_decoder

    folder = str(resolve(folder))                # "induction": the small model shipped with attnlab
    if folder != MINILM and not (Path(folder) / "config.json").is_file():
        raise FileNotFoundError(2, "no checkpoint here (config.json is missing)", folder)
    model, tokenizer = load_model(folder)
    check_decoder(model, "generate")
    return model, tokenizer


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
