"""The GPT-NeoX family (Black et al., 2022; Pythia, Biderman et al., 2023), from Hugging Face safetensors
checkpoints (``GPTNeoXForCausalLM``).

On the stack (:mod:`attnlab.stack.transformer`): LayerNorm, multi-head attention with partial RoPE (the first
``partial_rotary_factor`` of each head turns; ``rotary_pct`` in older configs), a GELU MLP with biases, a
final LayerNorm and an untied unembedding (``embed_out`` in Pythia's folders, ``lm_head`` in newer ones).
``use_parallel_residual`` picks the block: attention and MLP side by side on the same input
(:class:`~attnlab.stack.blocks.ParallelBlock`), or one after the other (:class:`~attnlab.stack.blocks.PreNormBlock`).

``query_key_value`` holds q, k and v of each head side by side, head after head ((n_heads, 3, d_head) rows):
it is split at load time, and the rotary part of q and k put into RoPE pairs as for Llama.
"""

from __future__ import annotations

import numpy as np

from ..layer.config import AttentionConfig
from ..stack.blocks import ParallelBlock, PreNormBlock
from ..stack.layers import MLP, LayerNorm, activation_name
from ..stack.transformer import ModelConfig, Transformer
from ..text.tokens import json_folder_tokenizer
from .checkpoint import Tensors, config_eos_ids, config_float, config_int
from .families import Family, checkpoint_loader, register
from .llama import rope_attention, rope_scheme, unembedding


def neox_rope(config: dict, source: str, d_head: int):
    """RoPE from ``rope_parameters`` (transformers 5), or from ``rotary_emb_base`` and ``rotary_pct``
    (transformers 4, whose default rotary_pct is 0.25)."""
    params = config.get("rope_parameters")
    if params is None:
        params = {**(config.get("rope_scaling") or {}), "rope_theta": config.get("rotary_emb_base", 10000.0),
                  "partial_rotary_factor": config.get("rotary_pct", 0.25)}
    return rope_scheme({"rope_parameters": params}, source, d_head)


def gpt_neox_config(config: dict, source: str) -> ModelConfig:
    """The stack's config from GPT-NeoX's config.json (hidden_size, num_attention_heads, rotary_pct, …)."""
    n = lambda key, default=None: config_int(config, key, source, default)   # noqa: E731
    d_model, n_heads = n("hidden_size"), n("num_attention_heads")
    if d_model % n_heads:
        raise ValueError(f"{source}: config.json has hidden_size={d_model}, not a multiple of "
                         f"num_attention_heads={n_heads}")
    attention = AttentionConfig(d_model=d_model, n_heads=n_heads, n_ctx=n("max_position_embeddings"),
                                positions=neox_rope(config, source, d_model // n_heads))
    parallel = config.get("use_parallel_residual", True)
    return ModelConfig(vocab_size=n("vocab_size"), n_layers=n("num_hidden_layers"), attention=attention,
                       d_mlp=n("intermediate_size"), activation=activation_name(config, "hidden_act", source),
                       norm=LayerNorm, norm_eps=config_float(config, "layer_norm_eps", source, 1e-5),
                       block=ParallelBlock if parallel else PreNormBlock,
                       tied_embeddings=bool(config.get("tie_word_embeddings", False)), family="gpt_neox",
                       eos_ids=config_eos_ids(config, source, n("vocab_size")))


def split_qkv(w: np.ndarray, b: np.ndarray, n_heads: int, d_head: int) -> tuple:
    """``query_key_value`` as (d_model, 3·n_heads·d_head) weights and (3·n_heads·d_head,) bias, columns head
    after head [q_h | k_h | v_h], into the (weight, bias) of q, k and v, each (d_model, n_heads·d_head)."""
    w3 = w.reshape(w.shape[0], n_heads, 3, d_head)                 # (d_model, h, 3, d_head)
    b3 = b.reshape(n_heads, 3, d_head)                             # (h, 3, d_head)
    return tuple((w3[:, :, j].reshape(w.shape[0], -1), b3[:, j].reshape(-1)) for j in range(3))


def gpt_neox_from_tensors(tensors: Tensors, cfg: ModelConfig) -> Transformer:
    """The model from a checkpoint's tensors, every shape checked against the config."""
    a, d, d_mlp = cfg.attention, cfg.d_model, cfg.d_mlp
    t = tensors.for_config(prefix="gpt_neox.", layers=r"layers\.(\d+)\.", n_layers=cfg.n_layers,
                           field="num_hidden_layers",
                           why=f"hidden_size={d}, num_attention_heads={a.n_heads}, intermediate_size={d_mlp}")

    bias = "layers.0.attention.query_key_value.bias" in t.arrays    # attention_bias (true unless said)

    def norm(prefix: str) -> LayerNorm:
        return LayerNorm.load(t, prefix, d_model=d, eps=cfg.norm_eps)

    def block(i: int):
        p = f"layers.{i}"
        q, k, v = split_qkv(*t.linear(f"{p}.attention.query_key_value", d, 3 * d, bias=bias), a.n_heads, a.d_head)
        attn = rope_attention(q, k, v, t.linear(f"{p}.attention.dense", d, d, bias=bias), a)
        mlp = MLP(*t.linear(f"{p}.mlp.dense_h_to_4h", d, d_mlp, bias=True),
                  *t.linear(f"{p}.mlp.dense_4h_to_h", d_mlp, d, bias=True), cfg.activation)
        return cfg.block(attn=attn, ln_1=norm(f"{p}.input_layernorm"), mlp=mlp,
                         ln_2=norm(f"{p}.post_attention_layernorm"))

    head = "embed_out.weight" if "embed_out.weight" in t.arrays else "lm_head.weight"
    return Transformer(config=cfg, W_E=t.take("embed_in.weight", (cfg.vocab_size, d), f"vocab_size={cfg.vocab_size}"),
                       blocks=tuple(block(i) for i in range(cfg.n_layers)), ln_final=norm("final_layer_norm"),
                       **unembedding(t, cfg, head))


GPT_NEOX = register(Family(name="gpt_neox", title="GPT-NeoX", matches=lambda config: config.get("model_type") == "gpt_neox",
                           load=checkpoint_loader(gpt_neox_config, gpt_neox_from_tensors),
                           tokenizer=lambda folder, config: json_folder_tokenizer(folder)))
