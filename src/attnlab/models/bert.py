"""The BERT family of encoders (Devlin et al., 2019), from a Hugging Face safetensors checkpoint.

BERT on the stack (:mod:`attnlab.stack.transformer`): learned positions and token types, a norm on the embeddings,
post-norm blocks with a GELU (exact erf form) MLP, no causal mask (``is_causal=False``: every token sees
both sides) and no language-model head. Linear weights are stored as [out, in] and transposed once at
load time. Both key layouts load: MiniLM's (``embeddings.…``, ``encoder.layer.0.…``) and the
``bert.``-prefixed one of BertForMaskedLM. Tokenizer: the folder's ``tokenizer.json`` (WordPiece).
"""

from __future__ import annotations

import functools
import numpy as np

from ..layer.config import AttentionConfig
from ..stack.layers import MLP, LayerNorm, activation_name
from ..layer.multihead import MultiHeadAttention
from ..layer.positions import Learned
from ..stack.blocks import PostNormBlock
from ..stack.transformer import ModelConfig, Transformer
from ..text.tokens import json_folder_tokenizer
from .checkpoint import Tensors, config_float, config_int
from .families import Family, checkpoint_loader, register


def bert_config(config: dict, source: str) -> ModelConfig:
    """The stack's config from BERT's config.json (hidden_size, num_attention_heads, …)."""
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{source}: position_embedding_type {config['position_embedding_type']!r} is not "
                         "supported; attnlab reads BERT with absolute positions")
    n = lambda key, default=None: config_int(config, key, source, default)   # noqa: E731
    attention = AttentionConfig(d_model=n("hidden_size"), n_heads=n("num_attention_heads"),
                                n_ctx=n("max_position_embeddings"), positions=Learned())
    return ModelConfig(vocab_size=n("vocab_size"), n_layers=n("num_hidden_layers"), attention=attention,
                       d_mlp=n("intermediate_size"), activation=activation_name(config, "hidden_act", source),
                       norm=LayerNorm, norm_eps=config_float(config, "layer_norm_eps", source, 1e-12),
                       block=PostNormBlock, is_causal=False, has_logits=False, n_types=n("type_vocab_size", 2),
                       embed_norm=True, family="bert")


def bert_from_tensors(tensors: Tensors, cfg: ModelConfig) -> Transformer:
    """The encoder from a checkpoint's tensors, every shape checked against the config."""
    a, d, d_mlp = cfg.attention, cfg.d_model, cfg.d_mlp
    width = a.n_heads * a.d_head
    t = tensors.for_config(prefix="bert.", layers=r"encoder\.layer\.(\d+)\.", n_layers=cfg.n_layers,
                           field="num_hidden_layers",
                           why=f"hidden_size={d}, num_attention_heads={a.n_heads}, intermediate_size={d_mlp}")
    norm = functools.partial(LayerNorm.load, t, d_model=d, eps=cfg.norm_eps)   # norm(prefix)

    def linear(prefix: str, d_in: int, d_out: int) -> tuple[np.ndarray, np.ndarray]:
        w = t.take(f"{prefix}.weight", (d_out, d_in))             # (out, in) as torch stores it
        return w.T, t.take(f"{prefix}.bias", (d_out,))            # (in, out), (out,)

    def block(i: int) -> PostNormBlock:
        p = f"encoder.layer.{i}"
        (W_Q, b_Q), (W_K, b_K), (W_V, b_V) = (linear(f"{p}.attention.self.{n}", d, width)
                                              for n in ("query", "key", "value"))
        W_O, b_O = linear(f"{p}.attention.output.dense", width, d)
        W_in, b_in = linear(f"{p}.intermediate.dense", d, d_mlp)
        W_out, b_out = linear(f"{p}.output.dense", d_mlp, d)
        return PostNormBlock(attn=MultiHeadAttention(W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, b_O, config=a),
                             ln_1=norm(f"{p}.attention.output.LayerNorm"),
                             mlp=MLP(W_in, b_in, W_out, b_out, cfg.activation), ln_2=norm(f"{p}.output.LayerNorm"))

    e = "embeddings"
    return Transformer(
        config=cfg, blocks=tuple(block(i) for i in range(cfg.n_layers)),
        W_E=t.take(f"{e}.word_embeddings.weight", (cfg.vocab_size, d), f"vocab_size={cfg.vocab_size}, {t.why}"),
        W_P=t.take(f"{e}.position_embeddings.weight", (a.n_ctx, d), f"max_position_embeddings={a.n_ctx}, {t.why}"),
        W_T=t.take(f"{e}.token_type_embeddings.weight", (cfg.n_types, d), f"type_vocab_size={cfg.n_types}"),
        ln_embed=norm(f"{e}.LayerNorm"))


BERT = register(Family(name="bert", title="BERT", matches=lambda config: config.get("model_type") == "bert",
                       load=checkpoint_loader(bert_config, bert_from_tensors),
                       tokenizer=lambda folder, config: json_folder_tokenizer(folder)))
