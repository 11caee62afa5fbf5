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

from ..layer.config import AttentionConfig
from ..stack.blocks import SandwichBlock
from ..stack.layers import RMSNorm, activation_name
from ..stack.transformer import ModelConfig, Transformer
from ..text.tokens import json_folder_tokenizer
from .checkpoint import Tensors, config_eos_ids, config_float, config_int
from .families import Family, checkpoint_loader, register
from .llama import gated_mlp, llama_layout, llama_layout_model, qk_norm_weights, rope_attention, rope_scheme

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


GEMMA2 = register(Family(name="gemma2", title="Gemma-2", matches=lambda config: config.get("model_type") == "gemma2",
                         load=checkpoint_loader(gemma2_config, gemma2_from_tensors),
                         tokenizer=lambda folder, config: json_folder_tokenizer(folder)))
