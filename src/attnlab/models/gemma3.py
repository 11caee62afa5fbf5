"""The Gemma-3 family, text only (Gemma Team, 2025), from Hugging Face safetensors checkpoints
(``Gemma3ForCausalLM``, ``Gemma3TextConfig``).

Gemma-3 is Gemma-2 (:mod:`attnlab.models.gemma2`: sandwich blocks, √d_model token rows, the score scale
``query_pre_attn_scalar^-½``, tied logits, Gemma's 1 + w norms) with three changes, all read from config.json:

- QK-norm per head (:class:`attnlab.layer.qknorm.QKNorm`): q and k RMS-normalised over each head's d_head
  before RoPE, scaled by 1 + ``self_attn.q_norm`` / ``k_norm`` (loaded with the 1 added);
- five local layers to one global (``layer_types``, or ``sliding_window_pattern``, default 6: every 6th layer
  global): the local layers see a ``sliding_window`` band and rotate at the base ``rope_local_base_freq``
  (10,000), the global ones see everything and rotate at ``rope_theta`` (1,000,000) with the
  ``rope_scaling`` (linear ×8 in the 4B–27B models). Positions turn at two speeds, so each layer has its own
  position scheme (transformers 5 writes both under ``rope_parameters``, by layer type);
- no soft-caps by default (``attn_logit_softcapping`` and ``final_logit_softcapping`` are read if set).
"""

from __future__ import annotations

import dataclasses

from ..layer.positions import RoPE
from ..layer.qknorm import QKNorm
from ..stack.blocks import SandwichBlock
from ..stack.transformer import ModelConfig, Transformer
from ..text.tokens import json_folder_tokenizer
from .checkpoint import config_float, config_int
from .families import Family, checkpoint_loader, register
from .gemma2 import (LAYER_TYPES, gemma2_config, gemma2_from_tensors, gguf_score_scale, gguf_sliding_layers,
                     sandwich_from_gguf)
from .llama import llama_gguf_config, rope_scheme

LOCAL_BASE = 10_000.0        # rope_local_base_freq's default
GLOBAL_BASE = 1_000_000.0    # rope_theta's default in Gemma-3


def layer_kinds(config: dict, source: str, n_layers: int) -> list[str]:
    """Each layer's kind, "sliding_attention" (local) or "full_attention" (global): ``layer_types``, or every
    ``sliding_window_pattern``-th layer global (5 local : 1 global by default)."""
    kinds = config.get("layer_types")
    if not kinds:
        every = config_int(config, "sliding_window_pattern", source, 6)
        kinds = [LAYER_TYPES[int((i + 1) % every == 0)] for i in range(n_layers)]
    if len(kinds) != n_layers or set(kinds) - set(LAYER_TYPES):
        raise ValueError(f"{source}: config.json field 'layer_types' must name {n_layers} layers, each one of "
                         f"{list(LAYER_TYPES)}, got {kinds!r}")
    return list(kinds)


def two_speeds(config: dict, source: str) -> dict[str, RoPE]:
    """The RoPE of each layer kind: transformers 5's ``rope_parameters`` by layer type, or the older fields
    (``rope_theta`` and ``rope_scaling`` for the global layers, ``rope_local_base_freq`` for the local ones)."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and set(params) & set(LAYER_TYPES):
        return {kind: rope_scheme({"rope_parameters": params.get(kind) or {}, "rope_theta": base,
                                   "max_position_embeddings": config.get("max_position_embeddings")}, source)
                for kind, base in (("sliding_attention", LOCAL_BASE), ("full_attention", GLOBAL_BASE))}
    local = config.get("rope_local_base_freq", LOCAL_BASE)
    return {"sliding_attention": rope_scheme({"rope_theta": local}, source),
            "full_attention": rope_scheme(dict(config, rope_theta=config.get("rope_theta", GLOBAL_BASE)), source)}


def gemma3_config(config: dict, source: str) -> ModelConfig:
    """The stack's config from Gemma-3's text config.json: Gemma-2's (:func:`gemma2_config`), QK-norm per head
    with ``rms_norm_eps``, and each layer's window and RoPE by its kind."""
    n_layers = config_int(config, "num_hidden_layers", source)
    kinds = layer_kinds(config, source, n_layers)
    rope = two_speeds(config, source)
    plain = {k: v for k, v in config.items() if k not in ("rope_parameters", "rope_scaling", "layer_types")}
    cfg = gemma2_config(dict(plain, layer_types=kinds, rope_theta=rope["full_attention"].theta), source)
    qk = QKNorm("head", config_float(config, "rms_norm_eps", source, 1e-6))
    attention = dataclasses.replace(cfg.attention, positions=rope["full_attention"], qk_norm=qk)
    layers = tuple(dataclasses.replace(a, positions=rope[kind], qk_norm=qk) for a, kind in zip(cfg.layers, kinds))
    return dataclasses.replace(cfg, attention=attention, layers=layers, family="gemma3")


def gemma3_gguf_config(file) -> tuple[ModelConfig, str]:
    """The stack's config from a gemma3 GGUF file's metadata, as llama.cpp reads it: the global layers' RoPE
    from ``gemma3.rope.freq_base`` and ``rope.scaling.*``, the local ones' from ``gemma3.rope.freq_base_swa``
    (10,000) unscaled; ``gemma3.attention.sliding_window`` on the local layers (five of six, or
    ``attention.sliding_window_pattern``; no window stated: every layer global); QK-norm per head; the score
    scale of :func:`attnlab.models.gemma2.gguf_score_scale`; ``gemma3.final_logit_softcapping`` if stated."""
    cfg, why = llama_gguf_config(file, "gemma3")
    window = file.integer("gemma3.attention.sliding_window", 0, least=0)
    local = RoPE(file.number("gemma3.rope.freq_base_swa", LOCAL_BASE))
    attention = dataclasses.replace(cfg.attention, scale=gguf_score_scale(cfg, 62),
                                    qk_norm=QKNorm("head", cfg.norm_eps))
    slides = gguf_sliding_layers(file, cfg.n_layers, "gemma3", period=6) if window else [False] * cfg.n_layers
    layers = tuple(dataclasses.replace(attention, window=window, positions=local) if s else attention for s in slides)
    softcap = file.number("gemma3.final_logit_softcapping") if file.has("gemma3.final_logit_softcapping") else None
    return dataclasses.replace(cfg, attention=attention, layers=layers, activation="gelu_pytorch_tanh",
                               block=SandwichBlock, embed_scale=cfg.d_model ** 0.5, logit_softcap=softcap,
                               family="gemma3"), why


def load_gemma3_gguf(file) -> Transformer:
    """A gemma3 GGUF file's model: Gemma-2's layout (:func:`attnlab.models.gemma2.sandwich_from_gguf`) with
    ``attn_q_norm`` and ``attn_k_norm``, Gemma's 1 already added by llama.cpp's converter."""
    cfg, why = gemma3_gguf_config(file)
    return sandwich_from_gguf(file, cfg, why, "gemma3")


GEMMA3 = register(Family(name="gemma3_text", title="Gemma-3",
                         matches=lambda config: config.get("model_type") == "gemma3_text",
                         load=checkpoint_loader(gemma3_config, gemma2_from_tensors),
                         tokenizer=lambda folder, config: json_folder_tokenizer(folder),
                         gguf_architecture="gemma3", load_gguf=load_gemma3_gguf))
