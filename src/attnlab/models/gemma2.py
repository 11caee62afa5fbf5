"""The Gemma-2 family (Gemma Team, 2024), from Hugging Face safetensors checkpoints (``Gemma2ForCausalLM``).

On the stack (:mod:`attnlab.stack.transformer`): sandwich blocks (:class:`~attnlab.stack.blocks.SandwichBlock`:
an RMSNorm before and after each sublayer), grouped-query attention with RoPE, a gated MLP with the tanh GELU,
a final RMSNorm and tied logits. What Gemma-2 adds, all read from config.json:

- token rows multiplied by √hidden_size (``embed_scale``);
- its own score scale ``query_pre_attn_scalar^-½`` and scores soft-capped at ``attn_logit_softcapping``;
- a sliding window (``sliding_window``) on the layers ``layer_types`` marks "sliding_attention" (every other
  layer, the first included, in older configs), full attention on the others: one AttentionConfig per layer;
- logits soft-capped at ``final_logit_softcapping``.

Gemma's RMSNorm scales by ``1 + weight``; the norms are loaded with that 1 added, so they are plain RMSNorms.
RoPE's column order is taken into pairs as for Llama (:func:`attnlab.models.llama.rope_attention`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..layer.config import AttentionConfig
from ..stack.blocks import SandwichBlock
from ..stack.layers import RMSNorm, activation_name
from ..stack.transformer import ModelConfig, Transformer
from ..text.tokens import json_folder_tokenizer
from .checkpoint import Tensors, config_eos_ids, config_float, config_int
from .families import Family, checkpoint_loader, register
from .llama import (gated_mlp, gguf_names, llama_gguf_config, llama_layout, llama_layout_model, qk_norm_weights,
                    rope_attention, rope_scheme)

LAYER_TYPES = ("sliding_attention", "full_attention")


def optional_positive(config: dict, key: str, source: str) -> float | None:
    """A positive number field of config.json that may be null (a soft-cap that is off)."""
    v = config.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0):
        raise ValueError(f"{source}: config.json field {key!r} must be a positive number or null, got {v!r}")
    return None if v is None else float(v)


def layer_windows(config: dict, source: str, n_layers: int) -> list[int | None]:
    """Each layer's window: ``sliding_window`` where ``layer_types`` says "sliding_attention", else None."""
    kinds = config.get("layer_types") or [LAYER_TYPES[i % 2] for i in range(n_layers)]
    if len(kinds) != n_layers or set(kinds) - set(LAYER_TYPES):
        raise ValueError(f"{source}: config.json field 'layer_types' must name {n_layers} layers, each one of "
                         f"{list(LAYER_TYPES)}, got {kinds!r}")
    window = config_int(config, "sliding_window", source) if "sliding_attention" in kinds else None
    return [window if kind == "sliding_attention" else None for kind in kinds]


def gemma2_config(config: dict, source: str) -> ModelConfig:
    """The stack's config from Gemma-2's config.json (hidden_size, head_dim, query_pre_attn_scalar, …)."""
    for key in ("attention_bias", "use_bidirectional_attention"):
        if config.get(key):
            raise ValueError(f"{source}: config.json sets {key}={config[key]!r}; attnlab reads Gemma-2 without it")
    n = lambda key, default=None: config_int(config, key, source, default)   # noqa: E731
    d_model, n_heads, n_layers = n("hidden_size"), n("num_attention_heads"), n("num_hidden_layers")
    d_head = n("head_dim", d_model // n_heads)
    attention = AttentionConfig(d_model=d_model, n_heads=n_heads, n_kv_heads=n("num_key_value_heads", n_heads),
                                d_head=d_head, n_ctx=n("max_position_embeddings"),
                                positions=rope_scheme(config, source), scale=n("query_pre_attn_scalar") ** -0.5,
                                softcap=optional_positive(config, "attn_logit_softcapping", source))
    act_key = "hidden_activation" if config.get("hidden_activation") else "hidden_act"
    return ModelConfig(vocab_size=n("vocab_size"), n_layers=n_layers, attention=attention,
                       layers=tuple(dataclasses.replace(attention, window=w)
                                    for w in layer_windows(config, source, n_layers)),
                       d_mlp=n("intermediate_size"), activation=activation_name(config, act_key, source), mlp="gated",
                       norm=RMSNorm, norm_eps=config_float(config, "rms_norm_eps", source, 1e-6), block=SandwichBlock,
                       tied_embeddings=bool(config.get("tie_word_embeddings", True)), embed_scale=d_model ** 0.5,
                       logit_softcap=optional_positive(config, "final_logit_softcapping", source), family="gemma2",
                       eos_ids=config_eos_ids(config, source, n("vocab_size")))


def gemma2_from_tensors(tensors: Tensors, cfg: ModelConfig) -> Transformer:
    """The model from a checkpoint's tensors, every shape checked against the config."""
    a, d = cfg.attention, cfg.d_model
    width, width_kv = a.n_heads * a.d_head, a.n_kv_heads * a.d_head
    t = llama_layout(tensors, cfg)

    def norm(prefix: str) -> RMSNorm:
        w = t.take(f"{prefix}.weight", (d,))                          # (d_model,) Gemma scales by 1 + w
        return RMSNorm(1 + w, cfg.norm_eps)

    def block(i: int) -> SandwichBlock:
        p = f"layers.{i}"
        a_i = cfg.layer_attention(i)
        attn = rope_attention(*(t.linear(f"{p}.self_attn.{n}_proj", d, w)
                                for n, w in (("q", width), ("k", width_kv), ("v", width_kv))),
                              t.linear(f"{p}.self_attn.o_proj", width, d), a_i,
                              norms=qk_norm_weights(t, f"{p}.self_attn.q_norm", f"{p}.self_attn.k_norm", a_i,
                                                    plus_one=True))   # Gemma-3's QK-norm; {} for Gemma-2
        return SandwichBlock(attn=attn, ln_1=norm(f"{p}.input_layernorm"),
                             ln_1_post=norm(f"{p}.post_attention_layernorm"), mlp=gated_mlp(t, cfg, *(f"{p}.mlp.{n}_proj" for n in ("gate", "up", "down"))),
                             ln_2=norm(f"{p}.pre_feedforward_layernorm"),
                             ln_2_post=norm(f"{p}.post_feedforward_layernorm"))

    return llama_layout_model(t, cfg, block, norm)


def gguf_sliding_layers(file, n_layers: int, arch: str = "gemma2", period: int = 2) -> list[bool]:
    """Which layers slide, as llama.cpp reads it: ``{arch}.attention.sliding_window_pattern``, one bool per
    layer, or a period n (layer i slides unless i % n == n − 1); without it, ``period``: 2 (every other layer
    from the first: Gemma-2, gpt-oss) or 6 (five local to one global: Gemma-3)."""
    key = f"{arch}.attention.sliding_window_pattern"
    pattern = file.value(key, period)
    if isinstance(pattern, list):
        if len(pattern) != n_layers or not all(isinstance(x, (bool, int, np.integer)) for x in pattern):
            raise ValueError(f"{file.path}: GGUF metadata {key!r} must be {n_layers} booleans, one per layer")
        return [bool(x) for x in pattern]
    period = file.integer(key, period)
    return [i % period < period - 1 for i in range(n_layers)]


def gguf_score_scale(cfg: ModelConfig, layers_27b: int) -> float:
    """Gemma's score scale as llama.cpp sets it (a GGUF file states no query_pre_attn_scalar): ``d_head^-½``,
    but ``(d_model / n_heads)^-½`` for the 27B model, known by its layer count (46 for Gemma-2, 62 for Gemma-3)."""
    a = cfg.attention
    return (a.d_model // a.n_heads if cfg.n_layers == layers_27b else a.d_head) ** -0.5


def gemma2_gguf_config(file) -> tuple[ModelConfig, str]:
    """The stack's config from a gemma2 GGUF file's metadata, as llama.cpp reads it: the score scale
    ``key_length^-½`` (``(embedding_length / head_count)^-½`` for the 46-layer 27B, as Gemma's own code has it;
    the file does not state query_pre_attn_scalar), the soft-caps ``gemma2.attn_logit_softcapping`` and
    ``final_logit_softcapping`` (50 and 30 when absent), ``gemma2.attention.sliding_window`` (4096) on the
    sliding layers, tied logits (llama.cpp ignores any ``output.weight``)."""
    cfg, why = llama_gguf_config(file, "gemma2")
    a = cfg.attention
    scale = gguf_score_scale(cfg, 46)
    attention = dataclasses.replace(a, scale=scale, softcap=file.number("gemma2.attn_logit_softcapping", 50.0))
    window = file.integer("gemma2.attention.sliding_window", 4096)
    layers = tuple(dataclasses.replace(attention, window=window if slides else None)
                   for slides in gguf_sliding_layers(file, cfg.n_layers))
    return dataclasses.replace(cfg, attention=attention, layers=layers, activation="gelu_pytorch_tanh",
                               block=SandwichBlock, tied_embeddings=True, embed_scale=a.d_model ** 0.5,
                               logit_softcap=file.number("gemma2.final_logit_softcapping", 30.0)), why


def load_gemma2_gguf(file) -> Transformer:
    """A gemma2 GGUF file's model (:func:`sandwich_from_gguf`)."""
    cfg, why = gemma2_gguf_config(file)
    return sandwich_from_gguf(file, cfg, why, "gemma2")


def sandwich_from_gguf(file, cfg: ModelConfig, why: str, arch: str) -> Transformer:
    """A Gemma GGUF file's model (Gemma-2, Gemma-3): llama.cpp's names (``post_attention_norm``,
    ``post_ffw_norm`` for the sandwich's second norms, ``attn_q_norm``/``attn_k_norm`` with QK-norm), its norms
    loaded as they are (llama.cpp's converter already added Gemma's 1 to each weight), q and k in rotate_half's
    layout taken into pairs."""
    a, d = cfg.attention, cfg.d_model
    width, width_kv = a.n_heads * a.d_head, a.n_kv_heads * a.d_head
    names = gguf_names(arch, rope_pairs=False)
    t = llama_layout(file.tensors, cfg, names, why)

    def norm(prefix: str) -> RMSNorm:
        return RMSNorm.load(t, prefix, d_model=d, eps=cfg.norm_eps)

    def block(i: int) -> SandwichBlock:
        p, a_i = f"blk.{i}", cfg.layer_attention(i)
        attn = rope_attention(*(t.linear(f"{p}.attn_{n}", d, w) for n, w in (("q", width), ("k", width_kv),
                                                                             ("v", width_kv))),
                              t.linear(f"{p}.attn_output", width, d), a_i,
                              norms=qk_norm_weights(t, f"{p}.attn_q_norm", f"{p}.attn_k_norm", a_i))
        return SandwichBlock(attn=attn, ln_1=norm(f"{p}.attn_norm"), ln_1_post=norm(f"{p}.post_attention_norm"),
                             mlp=gated_mlp(t, cfg, *(f"{p}.ffn_{n}" for n in ("gate", "up", "down"))),
                             ln_2=norm(f"{p}.ffn_norm"), ln_2_post=norm(f"{p}.post_ffw_norm"))

    return llama_layout_model(t, cfg, block, norm, names)


GEMMA2 = register(Family(name="gemma2", title="Gemma-2", matches=lambda config: config.get("model_type") == "gemma2",
                         load=checkpoint_loader(gemma2_config, gemma2_from_tensors),
                         tokenizer=lambda folder, config: json_folder_tokenizer(folder),
                         gguf_architecture="gemma2", load_gguf=load_gemma2_gguf))
