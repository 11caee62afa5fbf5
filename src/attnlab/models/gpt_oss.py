"""The gpt-oss family (OpenAI, 2025), from Hugging Face safetensors checkpoints (``GptOssForCausalLM``, config
``GptOssConfig``) whose experts are stored unquantized (float32 or bfloat16, as ``save_pretrained`` writes them).

On the stack (:mod:`attnlab.stack.transformer`): pre-norm blocks with RMSNorm, grouped-query attention with
biases on q, k, v and o, and logits ``x W_U``. What gpt-oss adds, each a small piece the stack plugs in:

- learned attention sinks: one logit per head in each softmax's denominator (``self_attn.sinks``;
  :mod:`attnlab.kernels.sinks`, ``AttentionConfig(sinks=True)``);
- sliding-window and full layers alternating as ``layer_types`` says (``sliding_window``; one
  AttentionConfig per layer, as Gemma-2's);
- YaRN RoPE (``rope_parameters``, :class:`attnlab.layer.positions.YaRN`), columns taken from rotate_half's
  layout into pairs as for Llama (:func:`attnlab.models.llama.half_to_pairs`);
- a mixture-of-experts MLP on every layer (:mod:`attnlab.stack.experts`): a softmax over the router's top k
  logits, experts with biases and the clamped SwiGLU (``swiglu_alpha``, ``swiglu_limit``). transformers
  stores each expert's gate and up projections interleaved in ``gate_up_proj`` (E, d, 2·d_expert): gate in the
  even columns, up in the odd ones.

The released checkpoints keep their experts in MXFP4 (``gate_up_proj_blocks`` and ``_scales``); those are
refused with a message saying so. Tokenizer: the folder's ``tokenizer.json``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..layer.config import AttentionConfig
from ..layer.multihead import MultiHeadAttention
from ..stack.blocks import PreNormBlock
from ..stack.experts import Experts, ExpertsConfig, SoftmaxTopKRouter
from ..stack.layers import RMSNorm
from ..stack.transformer import ModelConfig, Transformer
from ..text.tokens import json_folder_tokenizer
from .checkpoint import Tensors, config_eos_ids, config_float, config_int
from .families import Family, checkpoint_loader, register
from .gemma2 import gguf_sliding_layers, layer_windows
from .llama import (gguf_names, half_to_pairs, llama_gguf_config, llama_layout, llama_layout_model, rope_attention,
                    rope_scheme)


def positive_number(config: dict, key: str, source: str, default: float) -> float:
    """A positive number field of config.json (``swiglu_alpha``, ``swiglu_limit``), or an error naming it."""
    v = config.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ValueError(f"{source}: config.json field {key!r} must be a positive number, got {v!r}")
    return float(v)


def gpt_oss_config(config: dict, source: str) -> ModelConfig:
    """The stack's config from gpt-oss's config.json (hidden_size, head_dim, num_local_experts, layer_types, …)."""
    n = lambda key, default=None: config_int(config, key, source, default)   # noqa: E731
    d_model, n_heads, n_layers = n("hidden_size"), n("num_attention_heads"), n("num_hidden_layers")
    attention = AttentionConfig(d_model=d_model, n_heads=n_heads, n_kv_heads=n("num_key_value_heads", n_heads),
                                d_head=n("head_dim", d_model // n_heads), n_ctx=n("max_position_embeddings"),
                                positions=rope_scheme(config, source), sinks=True)
    d_expert = n("intermediate_size")
    experts = ExpertsConfig(n_experts=n("num_local_experts"), top_k=n("num_experts_per_tok"), d_expert=d_expert,
                            swiglu_alpha=positive_number(config, "swiglu_alpha", source, 1.702),
                            swiglu_limit=positive_number(config, "swiglu_limit", source, 7.0))
    return ModelConfig(vocab_size=n("vocab_size"), n_layers=n_layers, attention=attention,
                       layers=tuple(dataclasses.replace(attention, window=w)
                                    for w in layer_windows(config, source, n_layers)),
                       d_mlp=d_expert, activation="silu", mlp="gated", experts=experts, norm=RMSNorm,
                       norm_eps=config_float(config, "rms_norm_eps", source, 1e-5), block=PreNormBlock,
                       tied_embeddings=bool(config.get("tie_word_embeddings", False)), family="gpt_oss",
                       eos_ids=config_eos_ids(config, source, n("vocab_size")))


def sink_attention(t: Tensors, prefix: str, a: AttentionConfig, bias: bool) -> MultiHeadAttention:
    """The attention of ``{prefix}`` (``q_proj`` … ``o_proj``, ``sinks``), W_Q's and W_K's columns taken from
    rotate_half's layout into RoPE pairs (the sinks are per head: no reordering)."""
    d, w, w_kv = a.d_model, a.n_heads * a.d_head, a.n_kv_heads * a.d_head
    (W_Q, b_Q), (W_K, b_K), (W_V, b_V) = (t.linear(f"{prefix}.{n}_proj", d, width, bias=bias)
                                          for n, width in (("q", w), ("k", w_kv), ("v", w_kv)))
    W_O, b_O = t.linear(f"{prefix}.o_proj", w, d, bias=bias)
    q_order, k_order = half_to_pairs(a.n_heads, a.d_head), half_to_pairs(a.n_kv_heads, a.d_head)
    return MultiHeadAttention(W_Q[:, q_order], W_K[:, k_order], W_V, W_O, b_Q[q_order], b_K[k_order], b_V, b_O,
                              config=a, sinks=t.take(f"{prefix}.sinks", (a.n_heads,)))


def experts_mlp(t: Tensors, prefix: str, d: int, c: ExpertsConfig) -> Experts:
    """The experts MLP of ``{prefix}`` (``router``, ``experts``); gate and up de-interleaved from gate_up_proj."""
    if f"{prefix}.experts.gate_up_proj_blocks" in t.arrays:
        raise ValueError(f"{t.source}: {prefix}.experts are stored in MXFP4 (gate_up_proj_blocks, _scales); attnlab "
                         "reads gpt-oss with unquantized experts (dequantize them first, e.g. load with "
                         "transformers' Mxfp4Config(dequantize=True) and save_pretrained)")
    E, m = c.n_experts, c.d_expert
    gate_up = t.take(f"{prefix}.experts.gate_up_proj", (E, d, 2 * m))             # (E, d, 2·m) gate, up interleaved
    b_gate_up = t.take(f"{prefix}.experts.gate_up_proj_bias", (E, 2 * m))        # (E, 2·m)
    router = SoftmaxTopKRouter(t.take(f"{prefix}.router.weight", (E, d)).T,       # (d, E)
                               t.take(f"{prefix}.router.bias", (E,)), c.top_k)
    return Experts(router, np.ascontiguousarray(gate_up[..., ::2]), np.ascontiguousarray(gate_up[..., 1::2]),
                   t.take(f"{prefix}.experts.down_proj", (E, m, d)), c,          # (E, d, m) × 2, (E, m, d)
                   np.ascontiguousarray(b_gate_up[..., ::2]), np.ascontiguousarray(b_gate_up[..., 1::2]),
                   t.take(f"{prefix}.experts.down_proj_bias", (E, d)))


def gpt_oss_from_tensors(tensors: Tensors, cfg: ModelConfig, *, bias: bool = True) -> Transformer:
    """The model from a checkpoint's tensors, every shape checked against the config."""
    d = cfg.d_model
    t = llama_layout(tensors, cfg, why=(f"hidden_size={d}, num_attention_heads={cfg.attention.n_heads}, "
                                        f"num_key_value_heads={cfg.attention.n_kv_heads}, head_dim="
                                        f"{cfg.attention.d_head}, num_local_experts={cfg.experts.n_experts}, "
                                        f"intermediate_size={cfg.experts.d_expert}"))

    def norm(prefix: str) -> RMSNorm:
        return RMSNorm.load(t, prefix, d_model=d, eps=cfg.norm_eps)

    def block(i: int) -> PreNormBlock:
        p = f"layers.{i}"
        return PreNormBlock(attn=sink_attention(t, f"{p}.self_attn", cfg.layer_attention(i), bias),
                            ln_1=norm(f"{p}.input_layernorm"), mlp=experts_mlp(t, f"{p}.mlp", d, cfg.experts),
                            ln_2=norm(f"{p}.post_attention_layernorm"))

    return llama_layout_model(t, cfg, block, norm)


def load_gpt_oss(folder, config: dict) -> Transformer:
    """A gpt-oss folder's model (``attention_bias``: biases on q, k, v and o, as released)."""
    bias = config.get("attention_bias", True)
    if not isinstance(bias, bool):
        raise ValueError(f"config.json field 'attention_bias' must be true or false, got {bias!r}")
    return checkpoint_loader(gpt_oss_config, lambda t, cfg: gpt_oss_from_tensors(t, cfg, bias=bias))(folder, config)


GGUF_ARCH = "gpt-oss"      # llama.cpp's name for it


def gpt_oss_gguf_config(file) -> tuple[ModelConfig, str]:
    """The stack's config from a gpt-oss GGUF file's metadata (``gpt-oss.expert_count``,
    ``expert_used_count``, ``expert_feed_forward_length``, ``attention.sliding_window`` on every other layer
    from the first, YaRN from ``rope.scaling.*``). YaRN's ramp is not truncated, as gpt-oss's own code and
    transformers have it (llama.cpp floors and ceils its ends)."""
    n = lambda name, *default: file.integer(f"{GGUF_ARCH}.{name}", *default)      # noqa: E731
    cfg, why = llama_gguf_config(file, GGUF_ARCH, yarn_truncate=False)
    d_expert = n("expert_feed_forward_length", cfg.d_mlp)
    experts = ExpertsConfig(n_experts=n("expert_count"), top_k=n("expert_used_count"), d_expert=d_expert)
    attention = dataclasses.replace(cfg.attention, sinks=True)
    window = n("attention.sliding_window")
    layers = tuple(dataclasses.replace(attention, window=window if slides else None)
                   for slides in gguf_sliding_layers(file, cfg.n_layers, GGUF_ARCH))
    return (dataclasses.replace(cfg, attention=attention, layers=layers, d_mlp=d_expert, experts=experts,
                                family="gpt_oss"),
            f"{why}, {GGUF_ARCH}.expert_count={experts.n_experts}, {GGUF_ARCH}.expert_feed_forward_length={d_expert}")


def gguf_experts(t: Tensors, prefix: str, d: int, c: ExpertsConfig) -> Experts:
    """The experts MLP of ``{prefix}`` as llama.cpp's converter writes it: the router ``ffn_gate_inp`` (E, d),
    each expert's gate and up rows apart (``ffn_gate_exps``, ``ffn_up_exps`` (E, d_expert, d)) and
    ``ffn_down_exps`` (E, d, d_expert), with their biases; MXFP4 experts are dequantized as they are read."""
    E, m = c.n_experts, c.d_expert
    router = SoftmaxTopKRouter(t.take(f"{prefix}.ffn_gate_inp.weight", (E, d)).T,       # (d, E)
                               t.take(f"{prefix}.ffn_gate_inp.bias", (E,)), c.top_k)
    W_gate, W_in = (np.ascontiguousarray(t.take(f"{prefix}.ffn_{n}_exps.weight", (E, m, d)).transpose(0, 2, 1))
                    for n in ("gate", "up"))                                             # (E, d, m) each
    W_out = np.ascontiguousarray(t.take(f"{prefix}.ffn_down_exps.weight", (E, d, m)).transpose(0, 2, 1))  # (E, m, d)
    return Experts(router, W_gate, W_in, W_out, c, t.take(f"{prefix}.ffn_gate_exps.bias", (E, m)),
                   t.take(f"{prefix}.ffn_up_exps.bias", (E, m)), t.take(f"{prefix}.ffn_down_exps.bias", (E, d)))


def load_gpt_oss_gguf(file) -> Transformer:
    """A gpt-oss GGUF file's model: llama.cpp's names (``attn_sinks``, ``post_attention_norm`` before the
    experts, the experts above), biases on q, k, v and o, q and k in rotate_half's layout taken into pairs."""
    cfg, why = gpt_oss_gguf_config(file)
    d = cfg.d_model
    names = gguf_names(GGUF_ARCH, rope_pairs=False)
    t = llama_layout(file.tensors, cfg, names, why)

    def norm(prefix: str) -> RMSNorm:
        return RMSNorm.load(t, prefix, d_model=d, eps=cfg.norm_eps)

    def block(i: int) -> PreNormBlock:
        p, a = f"blk.{i}", cfg.layer_attention(i)
        w, w_kv = a.n_heads * a.d_head, a.n_kv_heads * a.d_head
        attn = rope_attention(*(t.linear(f"{p}.attn_{n}", d, width, bias=True)
                                for n, width in (("q", w), ("k", w_kv), ("v", w_kv))),
                              t.linear(f"{p}.attn_output", w, d, bias=True), a,
                              sinks=t.take(f"{p}.attn_sinks.weight", (a.n_heads,)))            # (h,)
        return PreNormBlock(attn=attn, ln_1=norm(f"{p}.attn_norm"), mlp=gguf_experts(t, p, d, cfg.experts),
                            ln_2=norm(f"{p}.post_attention_norm"))

    return llama_layout_model(t, cfg, block, norm, names)


GPT_OSS = register(Family(name="gpt_oss", title="gpt-oss", matches=lambda config: config.get("model_type") == "gpt_oss",
                          load=load_gpt_oss, tokenizer=lambda folder, config: json_folder_tokenizer(folder),
                          gguf_architecture=GGUF_ARCH, load_gguf=load_gpt_oss_gguf))
