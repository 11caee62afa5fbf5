"""The Qwen3 family (Qwen Team, 2025), from Hugging Face safetensors checkpoints (``Qwen3ForCausalLM``).

Qwen3 is Qwen2 (:mod:`attnlab.models.llama`: pre-norm RMSNorm blocks, grouped-query attention with RoPE, a
gated SiLU MLP) with two changes: q and k are RMS-normalised per head before RoPE (QK-norm,
:class:`attnlab.layer.qknorm.QKNorm` over each head's d_head, one weight (d_head,) for q and one for k:
``self_attn.q_norm`` and ``k_norm``), and q, k, v have no biases (``attention_bias``, default false, gives
all four projections one). A sliding window, where ``use_sliding_window`` turns it on, is on the layers
``layer_types`` marks "sliding_attention" (from ``max_window_layers`` on); RoPE's scaling may be YaRN's.
"""

from __future__ import annotations

import dataclasses

from ..layer.qknorm import QKNorm
from ..stack.transformer import ModelConfig
from ..text.tokens import json_folder_tokenizer
from .checkpoint import config_float, config_int, read_checkpoint
from .families import Family, register
from .gemma2 import LAYER_TYPES
from .llama import gguf_names, llama_config, llama_from_tensors, llama_gguf_config


def layer_windows(config: dict, source: str, n_layers: int) -> list[int | None]:
    """Each layer's window: ``sliding_window`` on the layers ``layer_types`` marks "sliding_attention", with
    ``use_sliding_window`` (transformers' rule: the layers from ``max_window_layers`` on, when not stated)."""
    window = config.get("sliding_window") if config.get("use_sliding_window", False) else None
    first = config_int(config, "max_window_layers", source, n_layers) if window is not None else n_layers
    kinds = config.get("layer_types") or [LAYER_TYPES[int(window is not None and i >= first)] for i in range(n_layers)]
    if len(kinds) != n_layers or set(kinds) - set(LAYER_TYPES):
        raise ValueError(f"{source}: config.json field 'layer_types' must name {n_layers} layers, each one of "
                         f"{list(LAYER_TYPES)}, got {kinds!r}")
    window = config_int(config, "sliding_window", source) if window is not None else None
    return [window if kind == "sliding_attention" else None for kind in kinds]


def qwen3_config(config: dict, source: str) -> ModelConfig:
    """The stack's config from Qwen3's config.json: Qwen2's fields (see :func:`llama_config`), QK-norm per head
    with ``rms_norm_eps``, and each layer's window."""
    cfg = llama_config({k: v for k, v in config.items() if k != "sliding_window"}, source)
    attention = dataclasses.replace(cfg.attention, qk_norm=QKNorm("head", config_float(config, "rms_norm_eps", source, 1e-6)))
    windows = layer_windows(config, source, cfg.n_layers)
    layers = tuple(dataclasses.replace(attention, window=w) for w in windows) if any(windows) else ()
    return dataclasses.replace(cfg, attention=attention, layers=layers)


def load_qwen3(folder, config: dict):
    """A Qwen3 folder's model: Llama's tensor names, and ``self_attn.q_norm`` / ``k_norm`` per layer."""
    tensors = read_checkpoint(folder)
    bias = bool(config.get("attention_bias", False))
    return llama_from_tensors(tensors, qwen3_config(config, tensors.source), qkv_bias=bias, o_bias=bias)


def load_qwen3_gguf(file):
    """A qwen3 GGUF file's model: Qwen2's keys under ``qwen3.``, no biases, ``blk.{i}.attn_q_norm`` and
    ``attn_k_norm`` (d_head,) per layer, q and k (and their norms) in rotate_half's layout taken into pairs.
    Every layer attends to the whole context, as llama.cpp reads Qwen3."""
    cfg, why = llama_gguf_config(file, "qwen3")
    cfg = dataclasses.replace(cfg, attention=dataclasses.replace(cfg.attention, qk_norm=QKNorm("head", cfg.norm_eps)))
    return llama_from_tensors(file.tensors, cfg, names=gguf_names("qwen3", rope_pairs=False), why=why)


QWEN3 = register(Family(name="qwen3", title="Qwen3", matches=lambda config: config.get("model_type") == "qwen3",
                        load=load_qwen3, tokenizer=lambda folder, config: json_folder_tokenizer(folder),
                        gguf_architecture="qwen3", load_gguf=load_qwen3_gguf))
