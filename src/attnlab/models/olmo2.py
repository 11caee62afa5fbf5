"""The OLMo-2 family (OLMo et al., 2024), from Hugging Face safetensors checkpoints (``Olmo2ForCausalLM``).

On the stack: Llama's attention and gated SiLU MLP, with two changes.

- Norm placement (:class:`~attnlab.stack.blocks.OutputNormBlock`): each sublayer reads the stream as it is and
  its output is RMS-normalised before it joins the stream, ``x = x + post_attention_layernorm(attn(x))``, then
  ``x = x + post_feedforward_layernorm(mlp(x))``; a final norm before the logits.
- QK-norm over the whole projection (:class:`attnlab.layer.qknorm.QKNorm` ``over="all"``): all of a token's q
  features (h·d_head) divided by one root mean square and scaled by ``self_attn.q_norm`` (h·d_head,), k over
  its h_kv·d_head by ``k_norm``, before RoPE.
"""

from __future__ import annotations

import dataclasses

from ..layer.qknorm import QKNorm
from ..stack.blocks import OutputNormBlock
from ..stack.layers import RMSNorm
from ..stack.transformer import ModelConfig, Transformer
from ..text.tokens import json_folder_tokenizer
from .checkpoint import Tensors, config_float, read_checkpoint
from .families import Family, register
from .llama import gated_mlp, llama_config, llama_layout, llama_layout_model, qk_norm_weights, rope_attention


def olmo2_config(config: dict, source: str) -> ModelConfig:
    """The stack's config from OLMo-2's config.json: Llama's fields, output-norm blocks, QK-norm over the whole
    q and k projections with ``rms_norm_eps``."""
    cfg = llama_config(config, source)
    qk = QKNorm("all", config_float(config, "rms_norm_eps", source, 1e-6))
    return dataclasses.replace(cfg, attention=dataclasses.replace(cfg.attention, qk_norm=qk), block=OutputNormBlock)


def olmo2_from_tensors(tensors: Tensors, cfg: ModelConfig, bias: bool = False) -> Transformer:
    """The model from a checkpoint's tensors, every shape checked against the config."""
    a, d = cfg.attention, cfg.d_model
    width, width_kv = a.n_heads * a.d_head, a.n_kv_heads * a.d_head
    t = llama_layout(tensors, cfg)

    def norm(prefix: str) -> RMSNorm:
        return RMSNorm.load(t, prefix, d_model=d, eps=cfg.norm_eps)

    def block(i: int) -> OutputNormBlock:
        p = f"layers.{i}"
        attn = rope_attention(*(t.linear(f"{p}.self_attn.{n}_proj", d, w, bias=bias)
                                for n, w in (("q", width), ("k", width_kv), ("v", width_kv))),
                              t.linear(f"{p}.self_attn.o_proj", width, d, bias=bias), a,
                              norms=qk_norm_weights(t, f"{p}.self_attn.q_norm", f"{p}.self_attn.k_norm", a))
        return OutputNormBlock(attn=attn, ln_1_post=norm(f"{p}.post_attention_layernorm"),
                               mlp=gated_mlp(t, cfg, *(f"{p}.mlp.{n}_proj" for n in ("gate", "up", "down"))),
                               ln_2_post=norm(f"{p}.post_feedforward_layernorm"))

    return llama_layout_model(t, cfg, block, norm)


def load_olmo2(folder, config: dict) -> Transformer:
    """An OLMo-2 folder's model (``attention_bias`` gives q, k, v and o biases)."""
    tensors = read_checkpoint(folder)
    return olmo2_from_tensors(tensors, olmo2_config(config, tensors.source), bool(config.get("attention_bias", False)))


OLMO2 = register(Family(name="olmo2", title="OLMo-2", matches=lambda config: config.get("model_type") == "olmo2",
                        load=load_olmo2,
                        tokenizer=lambda folder, config: json_folder_tokenizer(folder)))
