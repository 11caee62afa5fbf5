"""The GPT-2 family (Radford et al., 2019), any size, from a Hugging Face safetensors checkpoint.

GPT-2 on the stack (:mod:`attnlab.stack.transformer`): learned positions, pre-norm blocks with a GELU (tanh form)
MLP, a final norm ``ln_f``, logits ``x W_Eᵀ`` (``lm_head`` is tied to ``wte``). Conv1D weights are stored
as [in, out], which is attnlab's own layout: no transposes. Keys load with or without ``transformer.``.
Tokenizer: the folder's ``vocab.json`` and ``merges.txt`` (byte-level BPE).
"""

from __future__ import annotations

import numpy as np

from ..layer.config import AttentionConfig
from ..stack.layers import MLP, LayerNorm, activation_name
from ..layer.multihead import MultiHeadAttention
from ..layer.positions import Learned
from ..stack.blocks import PreNormBlock
from ..stack.transformer import ModelConfig, Transformer
from ..text.tokens import bpe_folder_tokenizer
from .checkpoint import Tensors, config_eos_ids, config_float, config_int
from .families import Family, checkpoint_loader, register


def gpt2_config(config: dict, source: str) -> ModelConfig:
    """The stack's config from GPT-2's config.json (HF names: n_embd, n_head, n_layer, n_positions, …)."""
    for key, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                    ("add_cross_attention", False)):
        if config.get(key, ok) != ok:
            raise ValueError(f"{source}: config.json sets {key}={config[key]!r}; attnlab reads GPT-2 with "
                             f"{key}={ok}")
    n = lambda key, default=None: config_int(config, key, source, default)   # noqa: E731
    d_model = n("n_embd")
    attention = AttentionConfig(d_model=d_model, n_heads=n("n_head"), n_ctx=n("n_positions"), positions=Learned())
    return ModelConfig(vocab_size=n("vocab_size"), n_layers=n("n_layer"), attention=attention,
                       d_mlp=n("n_inner") if config.get("n_inner") else 4 * d_model,
                       activation=activation_name(config, "activation_function", source), norm=LayerNorm,
                       norm_eps=config_float(config, "layer_norm_epsilon", source, 1e-5), block=PreNormBlock,
                       is_causal=True, tied_embeddings=True, family="gpt2",
                       eos_ids=config_eos_ids(config, source, n("vocab_size")))


def gpt2_from_tensors(tensors: Tensors, cfg: ModelConfig) -> Transformer:
    """The model from a checkpoint's tensors, every shape checked against the config."""
    a, d, d_mlp = cfg.attention, cfg.d_model, cfg.d_mlp
    width = a.n_heads * a.d_head
    t = tensors.for_config(prefix="transformer.", layers=r"h\.(\d+)\.", n_layers=cfg.n_layers, field="n_layer",
                           why=f"n_embd={d}, n_head={a.n_heads}, MLP width {d_mlp}")

    def conv1d(prefix: str, d_in: int, d_out: int) -> tuple[np.ndarray, np.ndarray]:
        return t.take(f"{prefix}.weight", (d_in, d_out)), t.take(f"{prefix}.bias", (d_out,))

    def norm(prefix: str) -> LayerNorm:
        return LayerNorm.load(t, prefix, d_model=d, eps=cfg.norm_eps)

    def block(i: int) -> PreNormBlock:
        p = f"h.{i}"
        attn = MultiHeadAttention.from_gpt2(*conv1d(f"{p}.attn.c_attn", d, 3 * width),
                                            *conv1d(f"{p}.attn.c_proj", width, d), config=a)
        mlp = MLP(*conv1d(f"{p}.mlp.c_fc", d, d_mlp), *conv1d(f"{p}.mlp.c_proj", d_mlp, d), cfg.activation)
        return PreNormBlock(attn=attn, ln_1=norm(f"{p}.ln_1"), mlp=mlp, ln_2=norm(f"{p}.ln_2"))

    W_E = t.take("wte.weight", (cfg.vocab_size, d), f"vocab_size={cfg.vocab_size}, {t.why}")
    if "lm_head.weight" in t.arrays and not np.array_equal(t.arrays["lm_head.weight"], W_E):
        raise ValueError(f"{t.source}: tensor 'lm_head.weight' differs from 'wte.weight'; attnlab reads GPT-2 "
                         "with the unembedding tied to the embedding")
    return Transformer(config=cfg, W_E=W_E, blocks=tuple(block(i) for i in range(cfg.n_layers)),
                       W_P=t.take("wpe.weight", (a.n_ctx, d), f"n_positions={a.n_ctx}, {t.why}"),
                       ln_final=norm("ln_f"))


GPT2 = register(Family(name="gpt2", title="GPT-2", matches=lambda config: config.get("model_type") == "gpt2",
                       load=checkpoint_loader(gpt2_config, gpt2_from_tensors),
                       tokenizer=lambda folder, config: bpe_folder_tokenizer(folder)))
