"""DeepSeek-V3 (DeepSeek-AI, 2024), from Hugging Face safetensors checkpoints (``DeepseekV3Config`` /
``DeepseekV3ForCausalLM``).

On the stack: token embeddings, pre-norm blocks with RMSNorm, multi-head latent attention in every layer
(:class:`attnlab.layer.latent.LatentAttention`: K and V from a shared latent of ``kv_lora_rank``, RoPE on a
``qk_rope_head_dim`` slice, the query through its own latent of ``q_lora_rank`` or straight from x when that
is null), a gated SiLU MLP in the first ``first_k_dense_replace`` layers and the mixture of experts after
them (:mod:`attnlab.stack.experts`: the group-limited sigmoid router, routed and shared experts), a final
RMSNorm, untied logits.

Tensor names: ``self_attn.q_a_proj`` (W_DQ, with a bias under ``attention_bias``), ``q_a_layernorm``,
``q_b_proj`` (W_UQ) or ``q_proj`` (W_Q), ``kv_a_proj_with_mqa`` (W_DKV: the latent's r columns then the
shared key's d_rope), ``kv_a_layernorm``, ``kv_b_proj`` (per head, d_nope rows of W_UK then d_v rows of W_UV),
``o_proj``.

RoPE's pairs. With ``rope_interleave`` (DeepSeek's default) the rope slice's features pair as (2i, 2i+1),
attnlab's own order, and the columns are taken as they are; without it transformers turns (i, i + d_rope/2)
(rotate_half) and the rope columns are reordered into pairs, as for Llama (:func:`attnlab.models.llama.half_to_pairs`).

The softmax scale is (qk_nope_head_dim + qk_rope_head_dim)^-½, times mscale² when YaRN's
``rope_scaling`` states ``mscale_all_dim`` (mscale = 0.1·mscale_all_dim·ln(factor) + 1).
"""

from __future__ import annotations

import math
import re

import numpy as np

from ..layer.latent import LatentAttention, LatentConfig
from ..stack.blocks import PreNormBlock
from ..stack.experts import Experts, ExpertsConfig
from ..stack.layers import RMSNorm, activation_name
from ..stack.transformer import ModelConfig, Transformer
from ..text.tokens import json_folder_tokenizer
from .checkpoint import Tensors, config_eos_ids, config_float, config_int
from .families import Family, checkpoint_loader, register
from .llama import gated_mlp, half_to_pairs, llama_layout, llama_layout_model, rope_scheme


def yarn_mscale(factor: float, mscale: float) -> float:
    """YaRN's attention temperature: 0.1·mscale·ln(factor) + 1 (1 for factor ≤ 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def rope_parameters(config: dict) -> dict:
    """The rope dict, in either spelling transformers has used (``rope_parameters``, or ``rope_scaling`` and
    ``rope_theta``)."""
    params = config.get("rope_parameters")
    if params is None:
        params = dict(config.get("rope_scaling") or {}, rope_theta=config.get("rope_theta", 10000.0))
    return params if isinstance(params, dict) else {}


def softmax_scale(config: dict, d_qk: int) -> float:
    """(d_nope + d_rope)^-½, times mscale(factor, mscale_all_dim)² under a scaling that states mscale_all_dim."""
    scale = d_qk ** -0.5
    p = rope_parameters(config)
    if p.get("rope_type", p.get("type", "default")) not in (None, "default") and p.get("mscale_all_dim"):
        m = yarn_mscale(float(p["factor"]), float(p["mscale_all_dim"]))
        scale *= m * m
    return scale


def deepseek_v3_config(config: dict, source: str) -> ModelConfig:
    """The stack's config from a DeepSeek-V3 config.json; what attnlab does not read is refused by name."""
    n = lambda key, default=None: config_int(config, key, source, default)   # noqa: E731
    if config.get("quantization_config") is not None:
        q = config["quantization_config"]
        kind = q.get("quant_method") if isinstance(q, dict) else None
        raise ValueError(f"{source}: config.json has a quantization_config ({kind!r}: DeepSeek's published weights are "
                         "float8 blocks); attnlab reads float checkpoints (F32, F16, BF16): dequantize them first")
    for key, ours in (("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")):
        if config.get(key) not in (None, ours):
            raise ValueError(f"{source}: config.json has {key}={config[key]!r}; attnlab reads DeepSeek-V3's router "
                             f"({key}={ours!r})")
    n_layers = n("num_hidden_layers")
    q_lora = config.get("q_lora_rank")
    d_nope, d_rope = n("qk_nope_head_dim"), n("qk_rope_head_dim")
    n_heads = n("num_attention_heads")
    if n("num_key_value_heads", n_heads) != n_heads:
        raise ValueError(f"{source}: config.json has num_key_value_heads={n('num_key_value_heads')}, "
                         f"num_attention_heads={n_heads}; DeepSeek's latent attention gives every head its own K and V")
    attention = LatentConfig(d_model=n("hidden_size"), n_heads=n_heads, n_ctx=n("max_position_embeddings"),
                             positions=rope_scheme(config, source), scale=softmax_scale(config, d_nope + d_rope),
                             q_lora_rank=None if q_lora is None else n("q_lora_rank"), kv_lora_rank=n("kv_lora_rank"),
                             d_nope=d_nope, d_rope=d_rope, d_v=n("v_head_dim"))
    return ModelConfig(vocab_size=n("vocab_size"), n_layers=n_layers, attention=attention,
                       d_mlp=n("intermediate_size"), activation=activation_name(config, "hidden_act", source),
                       mlp="gated", norm=RMSNorm, norm_eps=config_float(config, "rms_norm_eps", source, 1e-6),
                       block=PreNormBlock, is_causal=True,
                       tied_embeddings=bool(config.get("tie_word_embeddings", False)), family="deepseek_v3",
                       eos_ids=config_eos_ids(config, source, n("vocab_size")), experts=experts_config(config, source))


def positive(config: dict, key: str, source: str, default: float) -> float:
    """config.json's ``key``, a positive number (``default`` where it is absent or null)."""
    v = config.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise ValueError(f"{source}: config.json field {key!r} must be a positive number, got {v!r}")
    return float(v)


def experts_config(config: dict, source: str) -> ExpertsConfig | None:
    """The mixture of experts on the layers from ``first_k_dense_replace`` on (None when every layer is dense):
    DeepSeek's group-limited sigmoid router, ``n_routed_experts`` gated experts of ``moe_intermediate_size``,
    ``n_shared_experts`` shared ones."""
    n = lambda key, default=None: config_int(config, key, source, default)   # noqa: E731
    first_dense = config.get("first_k_dense_replace")
    first_dense = 0 if first_dense is None else n("first_k_dense_replace")
    if first_dense >= n("num_hidden_layers") or not config.get("n_routed_experts"):
        return None
    return ExpertsConfig(n_experts=n("n_routed_experts"), top_k=n("num_experts_per_tok"),
                         d_expert=n("moe_intermediate_size"), router="group_sigmoid",
                         glu=activation_name(config, "hidden_act", source), bias=False,
                         n_group=n("n_group", 1) if config.get("n_group") is not None else 1,
                         topk_group=n("topk_group", 1) if config.get("topk_group") is not None else 1,
                         norm_topk_prob=bool(config.get("norm_topk_prob", True)),
                         routed_scaling_factor=positive(config, "routed_scaling_factor", source, 1.0),
                         n_shared=n("n_shared_experts", 0) if config.get("n_shared_experts") is not None else 0,
                         first_dense=first_dense)


def rope_order(a: LatentConfig, interleaved: bool) -> tuple[np.ndarray, np.ndarray]:
    """Column orders taking a query's (h·(d_nope + d_rope)) and W_DKV's (r + d_rope) rope slices into RoPE
    pairs: the identity when the checkpoint's rope already pairs (2i, 2i+1)."""
    d_qk, r = a.d_nope + a.d_rope, a.kv_lora_rank
    q, kv = np.arange(a.n_heads * d_qk), np.arange(r + a.d_rope)
    if interleaved:
        return q, kv
    turn = half_to_pairs(1, a.d_rope)                                    # (d_rope,)
    q = q.reshape(a.n_heads, d_qk)                                       # (h, d_qk)
    q = np.concatenate([q[:, :a.d_nope], q[:, a.d_nope:][:, turn]], axis=1).ravel()
    return q, np.concatenate([kv[:r], r + turn])


def latent_attention_from(t: Tensors, a: LatentConfig, prefix: str, *, bias: bool,
                          interleaved: bool) -> LatentAttention:
    """One layer's MLA from ``{prefix}.q_a_proj`` … ``{prefix}.o_proj``."""
    d, h, r, d_qk = a.d_model, a.n_heads, a.kv_lora_rank, a.d_nope + a.d_rope
    q_order, kv_order = rope_order(a, interleaved)
    p = {}
    if a.q_lora_rank is None:
        p["W_Q"] = t.linear(f"{prefix}.q_proj", d, h * d_qk)[0][:, q_order]
    else:
        p["W_DQ"], p["b_DQ"] = t.linear(f"{prefix}.q_a_proj", d, a.q_lora_rank, bias=bias)
        p["q_norm"] = t.take(f"{prefix}.q_a_layernorm.weight", (a.q_lora_rank,))
        p["W_UQ"] = t.linear(f"{prefix}.q_b_proj", a.q_lora_rank, h * d_qk)[0][:, q_order]
    W_DKV, b_DKV = t.linear(f"{prefix}.kv_a_proj_with_mqa", d, r + a.d_rope, bias=bias)
    p["W_DKV"], p["b_DKV"] = W_DKV[:, kv_order], b_DKV[kv_order]
    p["kv_norm"] = t.take(f"{prefix}.kv_a_layernorm.weight", (r,))
    W_UKV = t.linear(f"{prefix}.kv_b_proj", r, h * (a.d_nope + a.d_v))[0].reshape(r, h, a.d_nope + a.d_v)
    p["W_UK"] = W_UKV[..., :a.d_nope].reshape(r, h * a.d_nope)          # (r, h·d_nope)
    p["W_UV"] = W_UKV[..., a.d_nope:].reshape(r, h * a.d_v)             # (r, h·d_v)
    p["W_O"], p["b_O"] = t.linear(f"{prefix}.o_proj", h * a.d_v, d, bias=bias)
    return LatentAttention.from_params(p, a)


def experts_from(t: Tensors, d: int, e: ExpertsConfig, prefix: str) -> Experts:
    """One layer's experts from ``{prefix}.gate`` (the router and its correction bias), ``{prefix}.experts.{j}``
    (gate_proj, up_proj, down_proj, as DeepSeek's checkpoints and transformers' save_pretrained store them; or
    the fused ``experts.gate_up_proj`` and ``experts.down_proj`` of transformers' modules) and
    ``{prefix}.shared_experts``."""
    E, m = e.n_experts, e.d_expert
    p = {"router.W": t.linear(f"{prefix}.gate", d, E)[0],                       # (d, E)
         "router.correction": t.take(f"{prefix}.gate.e_score_correction_bias", (E,))}
    if f"{prefix}.experts.gate_up_proj" in t.arrays:
        gate_up = t.take(f"{prefix}.experts.gate_up_proj", (E, 2 * m, d))       # (E, 2·m, d) gate rows, then up
        p["W_gate"], p["W_in"] = gate_up[:, :m].transpose(0, 2, 1), gate_up[:, m:].transpose(0, 2, 1)
        p["W_out"] = t.take(f"{prefix}.experts.down_proj", (E, d, m)).transpose(0, 2, 1)   # (E, m, d)
    else:
        each = lambda name, d_in, d_out: np.stack([t.linear(f"{prefix}.experts.{j}.{name}", d_in, d_out)[0]
                                                   for j in range(E)])          # noqa: E731  (E, d_in, d_out)
        p["W_gate"], p["W_in"], p["W_out"] = each("gate_proj", d, m), each("up_proj", d, m), each("down_proj", m, d)
    if e.n_shared:
        w = e.n_shared * m
        p.update({"shared.W_gate": t.linear(f"{prefix}.shared_experts.gate_proj", d, w)[0],
                  "shared.W_in": t.linear(f"{prefix}.shared_experts.up_proj", d, w)[0],
                  "shared.W_out": t.linear(f"{prefix}.shared_experts.down_proj", w, d)[0]})
    return Experts.from_params(p, e)


def without_mtp(tensors: Tensors, n_layers: int) -> Tensors:
    """The tensors without the multi-token-prediction modules DeepSeek's checkpoints store as layers n_layers,
    n_layers + 1, … (``num_nextn_predict_layers``; transformers ignores them too): a decoder predicts one
    token at a time."""
    extra = re.compile(r"(model\.)?layers\.(\d+)\.")
    drop = {k for k in tensors.arrays if (m := extra.match(k)) and int(m.group(2)) >= n_layers}
    if not drop:
        return tensors
    return Tensors({k: v for k, v in tensors.arrays.items() if k not in drop}, tensors.source, tensors.why,
                   tensors.header)


def deepseek_v3_from_tensors(tensors: Tensors, cfg: ModelConfig, config: dict | None = None) -> Transformer:
    """The model from a DeepSeek-V3 checkpoint's tensors, every shape checked against the config."""
    config = config or {}
    a = cfg.attention
    why = (f"hidden_size={cfg.d_model}, num_attention_heads={a.n_heads}, q_lora_rank={a.q_lora_rank}, "
           f"kv_lora_rank={a.kv_lora_rank}, qk_nope_head_dim={a.d_nope}, qk_rope_head_dim={a.d_rope}, "
           f"v_head_dim={a.d_v}, intermediate_size={cfg.d_mlp}")
    t = llama_layout(without_mtp(tensors, cfg.n_layers), cfg, why=why)
    bias, interleaved = bool(config.get("attention_bias", False)), bool(config.get("rope_interleave", True))

    def norm(prefix: str) -> RMSNorm:
        return RMSNorm.load(t, prefix, d_model=cfg.d_model, eps=cfg.norm_eps)

    def block(i: int) -> PreNormBlock:
        at = f"layers.{i}"
        attn = latent_attention_from(t, a, f"{at}.self_attn", bias=bias, interleaved=interleaved)
        if cfg.at_layer(i).experts is None:
            mlp = gated_mlp(t, cfg, f"{at}.mlp.gate_proj", f"{at}.mlp.up_proj", f"{at}.mlp.down_proj")
        else:
            mlp = experts_from(t, cfg.d_model, cfg.experts, f"{at}.mlp")
        return PreNormBlock(attn=attn, ln_1=norm(f"{at}.input_layernorm"), mlp=mlp,
                            ln_2=norm(f"{at}.post_attention_layernorm"))

    return llama_layout_model(t, cfg, block, norm)


def load_deepseek_v3(folder, config: dict) -> Transformer:
    return checkpoint_loader(deepseek_v3_config,
                             lambda t, cfg: deepseek_v3_from_tensors(t, cfg, config))(folder, config)


DEEPSEEK_V3 = register(Family(name="deepseek_v3", title="DeepSeek-V3",
                              matches=lambda config: config.get("model_type") == "deepseek_v3",
                              load=load_deepseek_v3, tokenizer=lambda folder, config: json_folder_tokenizer(folder)))
