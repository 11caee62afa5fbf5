"""The Phi-3 family (Abdin et al., 2024), from Hugging Face safetensors checkpoints (``Phi3ForCausalLM``).

On the stack (:mod:`attnlab.stack.transformer`) Phi-3 is Llama's model (pre-norm RMSNorm blocks, grouped-query
attention with RoPE, a gated SiLU MLP), stored with fused weights: ``qkv_proj`` holds q, k and v one after
the other, ``gate_up_proj`` the gate and the up projection; both are split at load time. A
``sliding_window`` limits every layer's attention; ``partial_rotary_factor`` below 1 turns only part of
each head. The "longrope" frequency scaling of the 128k models is refused, naming it.
"""

from __future__ import annotations

from ..layer.config import AttentionConfig
from ..stack.blocks import PreNormBlock
from ..stack.layers import GatedMLP, RMSNorm, activation_name
from ..stack.transformer import ModelConfig, Transformer
from ..text.tokens import json_folder_tokenizer
from .checkpoint import Tensors, config_eos_ids, config_float, config_int
from .families import Family, checkpoint_loader, register
from .llama import (fused_columns, gguf_names, llama_gguf_config, llama_layout, llama_layout_model, rope_attention,
                    rope_scheme)


def phi3_config(config: dict, source: str) -> ModelConfig:
    """The stack's config from Phi-3's config.json (hidden_size, num_key_value_heads, sliding_window, …)."""
    n = lambda key, default=None: config_int(config, key, source, default)   # noqa: E731
    d_model, n_heads = n("hidden_size"), n("num_attention_heads")
    d_head = n("head_dim", d_model // n_heads)
    window = config.get("sliding_window")
    attention = AttentionConfig(d_model=d_model, n_heads=n_heads, n_kv_heads=n("num_key_value_heads", n_heads),
                                d_head=d_head, n_ctx=n("max_position_embeddings"),
                                positions=rope_scheme(config, source, d_head),
                                window=None if window is None else n("sliding_window"))
    return ModelConfig(vocab_size=n("vocab_size"), n_layers=n("num_hidden_layers"), attention=attention,
                       d_mlp=n("intermediate_size"), activation=activation_name(config, "hidden_act", source),
                       mlp="gated", norm=RMSNorm, norm_eps=config_float(config, "rms_norm_eps", source, 1e-5),
                       block=PreNormBlock, tied_embeddings=bool(config.get("tie_word_embeddings", False)),
                       family="phi3", eos_ids=config_eos_ids(config, source, n("vocab_size")))


def phi3_from_tensors(tensors: Tensors, cfg: ModelConfig) -> Transformer:
    """The model from a checkpoint's tensors, every shape checked against the config."""
    a, d, d_mlp = cfg.attention, cfg.d_model, cfg.d_mlp
    width, width_kv = a.n_heads * a.d_head, a.n_kv_heads * a.d_head
    t = llama_layout(tensors, cfg)

    def norm(prefix: str) -> RMSNorm:
        return RMSNorm.load(t, prefix, d_model=d, eps=cfg.norm_eps)

    def block(i: int) -> PreNormBlock:
        p = f"layers.{i}"
        W, b = t.linear(f"{p}.self_attn.qkv_proj", d, width + 2 * width_kv)   # (d_model, q | k | v columns)
        cuts = (0, width, width + width_kv, width + 2 * width_kv)
        q, k, v = ((W[:, c0:c1], b[c0:c1]) for c0, c1 in zip(cuts, cuts[1:]))
        attn = rope_attention(q, k, v, t.linear(f"{p}.self_attn.o_proj", width, d), a)
        gate_up = t.linear(f"{p}.mlp.gate_up_proj", d, 2 * d_mlp)[0]           # (d_model, gate | up)
        mlp = GatedMLP(gate_up[:, :d_mlp], gate_up[:, d_mlp:], t.linear(f"{p}.mlp.down_proj", d_mlp, d)[0],
                       cfg.activation)
        return PreNormBlock(attn=attn, ln_1=norm(f"{p}.input_layernorm"), mlp=mlp,
                            ln_2=norm(f"{p}.post_attention_layernorm"))

    return llama_layout_model(t, cfg, block, norm)


def load_phi3_gguf(file) -> Transformer:
    """A phi3 GGUF file's model, as llama.cpp reads it: ``blk.{i}.attn_qkv`` (q | k | v rows; or ``attn_q``,
    ``attn_k``, ``attn_v`` apart), ``ffn_up`` holding the gate's rows then the up projection's, q and k in
    rotate_half's layout over the first ``phi3.rope.dimension_count`` features of a head. Every layer attends
    to the whole context: llama.cpp turns ``phi3.attention.sliding_window`` off, and so does attnlab. The
    128k models' "longrope" factors (``rope_factors_long``/``short``) are refused, naming them."""
    cfg, why = llama_gguf_config(file, "phi3", partial_rope=True)
    for name in ("rope_factors_long.weight", "rope_factors_short.weight"):
        if name in file.tensors.arrays or f"blk.0.{name}" in file.tensors.arrays:
            raise ValueError(f"{file.path}: the GGUF file has a {name.split('.')[0]!r} tensor (Phi-3's longrope "
                             "scaling); attnlab reads Phi-3 files without it")
    a, d, d_mlp = cfg.attention, cfg.d_model, cfg.d_mlp
    width, width_kv = a.n_heads * a.d_head, a.n_kv_heads * a.d_head
    names = gguf_names("phi3", rope_pairs=False)
    t = llama_layout(file.tensors, cfg, names, why)

    def norm(prefix: str) -> RMSNorm:
        return RMSNorm.load(t, prefix, d_model=d, eps=cfg.norm_eps)

    def block(i: int) -> PreNormBlock:
        p = f"blk.{i}"
        if f"{p}.attn_qkv.weight" in t.arrays:
            q, k, v = fused_columns(t.linear(f"{p}.attn_qkv", d, width + 2 * width_kv), (width, width_kv, width_kv))
        else:
            q, k, v = (t.linear(f"{p}.attn_{n}", d, w) for n, w in (("q", width), ("k", width_kv), ("v", width_kv)))
        attn = rope_attention(q, k, v, t.linear(f"{p}.attn_output", width, d), a)
        (gate, _), (up, _) = fused_columns(t.linear(f"{p}.ffn_up", d, 2 * d_mlp), (d_mlp, d_mlp))
        mlp = GatedMLP(gate, up, t.linear(f"{p}.ffn_down", d_mlp, d)[0], cfg.activation)
        return PreNormBlock(attn=attn, ln_1=norm(f"{p}.attn_norm"), mlp=mlp, ln_2=norm(f"{p}.ffn_norm"))

    return llama_layout_model(t, cfg, block, norm, names)


PHI3 = register(Family(name="phi3", title="Phi-3", matches=lambda config: config.get("model_type") == "phi3",
                       load=checkpoint_loader(phi3_config, phi3_from_tensors),
                       tokenizer=lambda folder, config: json_folder_tokenizer(folder),
                       gguf_architecture="phi3", load_gguf=load_phi3_gguf))
