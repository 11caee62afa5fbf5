"""``--model``, defined once: every command that runs a model declares it with :func:`add_model_option` and loads
it with :func:`load`.

The help text and the errors are built from the registry of shipped models (:mod:`attnlab.models.registry`)
and from the families (:data:`attnlab.models.families.FAMILIES`), so a model or family added there shows up
in every command's ``--help`` and every error at once. Loading opens the model first (name, file, metadata,
tokenizer), lets the command check what the learner typed against the tokenizer, and only then reads the
weights, with a bar on stderr when it is a terminal (:mod:`attnlab.cli._progress`).
"""

from __future__ import annotations

import time
from pathlib import Path


def model_help(*, default: str | None, decoder: bool) -> str:
    from ..models.families import model_choices
    text = model_choices(decoder=decoder)
    return text + (f" (default {default})" if default else "")


def add_model_option(p, *, default: str | None = None, decoder: bool = False, required: bool = False,
                     quantized: bool = True, only: tuple[str, ...] | None = None, help: str | None = None) -> None:
    """``--model`` on the command ``p`` (and ``--quantized`` unless ``quantized=False``).

    ``default`` is the model taken without the flag (None: no default, or the command's own); ``decoder`` lists
    only the shipped causal LMs in the help; ``only`` restricts the flag to these shipped names (``bench``);
    ``help`` replaces the help's opening words (the list of what it takes is always appended).
    """
    from ..models.registry import SHIPPED
    text = (", ".join(SHIPPED[n].describe() for n in only) if only is not None else
            model_help(default=default, decoder=decoder))
    p.add_argument("--model", default=None, required=required, choices=only, help=f"{help}: {text}" if help else text)
    if quantized:
        add_quantized_flag(p)
    p.set_defaults(default_model=default, model_decoder=decoder)


QUANTIZED_CHOICES = {"exact": True, "q8": "q8-activations"}   # --quantized's values -> load_model's quantized=


def quantized_mode(text: str):
    """``--quantized``'s value as ``load_model``'s ``quantized=``: "exact" -> True, "q8" -> "q8-activations"."""
    import argparse
    if text not in QUANTIZED_CHOICES:
        raise argparse.ArgumentTypeError(f"expected one of {sorted(QUANTIZED_CHOICES)}, got {text!r}")
    return QUANTIZED_CHOICES[text]


def add_quantized_flag(p) -> None:
    """``--quantized [exact|q8]``, on every command that runs a model ``load_model`` reads."""
    p.add_argument("--quantized", nargs="?", const=True, default=False, type=quantized_mode, metavar="{exact,q8}",
                   help="keep a GGUF file's Q4_0/Q4_1/Q8_0/Q4_K/Q6_K weights in their type (numba's fused kernel: a "
                   "token reads the file's bytes, not 4.6x as many); 'exact' (the default): the same logits within "
                   "1e-5; 'q8': x rounded to 8 bits per block and integer dot products, as llama.cpp computes "
                   "(write it last or as --quantized=q8: a word after --quantized is read as its value); GGUF only "
                   "('smollm2' or a .gguf file)")


def model_arg(args) -> str:
    """--model, or the positional DIR (one of them, where the command has it), or the command's default."""
    dir_ = getattr(args, "dir", None)
    if dir_ is not None and args.model is not None and dir_ != args.model:
        raise ValueError(f"give the model once: DIR {dir_!r} and --model {args.model!r} differ")
    return dir_ or args.model or args.default_model


def open_source(args):
    """The :class:`attnlab.models.ModelSource` of ``--model``: name, file and metadata checked, nothing big read.
    An unknown name lists the models that ship and the closest one."""
    from ..models.families import open_model, unknown_model
    from ..models.registry import is_shipped, looks_like_name
    name = model_arg(args)
    if looks_like_name(name) and not is_shipped(name) and not Path(name).exists():   # as open_model would say,
        raise unknown_model(name, decoder=getattr(args, "model_decoder", False))     # but listing what fits here
    return open_model(name, quantized=getattr(args, "quantized", False) or False, cache=cache_folder())


def cache_folder() -> Path | None:
    """Where the command line keeps a GGUF model's float32 copy (:mod:`attnlab.models.weight_cache`):
    ``$ATTNLAB_CACHE``, else ``$XDG_CACHE_HOME/attnlab/weights``, else ``~/.cache/attnlab/weights`` (beside
    ``attnlab tune``'s profile, which clearing the weights leaves alone); None with ``ATTNLAB_CACHE=off``."""
    import os
    chosen = os.environ.get("ATTNLAB_CACHE", "")
    if chosen.lower() == "off":
        return None
    if chosen:
        return Path(chosen).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attnlab" / "weights"


def load(args, what: str | None = None, *, check=None):
    """``(model, tokenizer)`` of ``--model``; ``what`` (e.g. "patching"): the model must be a decoder.

    ``check(tokenizer, n_ctx)``, if given, runs after the tokenizer is built and before the weights are read
    (``n_ctx`` the context the model's file states, or None): the
    command's checks of its texts fail in a moment, not after the wait. The weights load under a bar on a
    terminal's stderr ("loading smollm2 (135M parameters, Q4_1 → float32)…"); ``args.load_seconds`` is then
    the wall time the load took.
    """
    from ..stack.transformer import check_decoder
    from ._progress import progress
    start = time.perf_counter()
    source = open_source(args)
    tokenizer = None
    if check is not None:                          # the texts need the tokenizer: build it before the wait
        tokenizer = source.tokenizer()
        check(tokenizer, source.n_ctx)
    with progress(f"loading {source.summary}…", quiet=getattr(args, "json", False)) as step:
        model = source.network(progress=step)      # a damaged checkpoint says so before a missing tokenizer
    tokenizer = tokenizer or source.tokenizer()
    args.load_seconds = time.perf_counter() - start
    if what is not None:
        check_decoder(model, what)
    return model, tokenizer
