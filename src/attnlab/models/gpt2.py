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


def gpt2_gguf_config(file) -> tuple[ModelConfig, str]:
    """The stack's config from a gpt2 GGUF file's metadata (``gpt2.embedding_length``, ``gpt2.block_count``,
    ``gpt2.attention.head_count``, ``gpt2.feed_forward_length``, ``gpt2.context_length``,
    ``gpt2.attention.layer_norm_epsilon``), and the keys it came from, for shape errors."""
    n = lambda name, *default: file.integer(f"gpt2.{name}", *default)          # noqa: E731
    d_model, n_heads = n("embedding_length"), n("attention.head_count")
    if d_model % n_heads:
        raise ValueError(f"{file.path}: GGUF metadata 'gpt2.embedding_length' {d_model} is not a multiple of "
                         f"'gpt2.attention.head_count' {n_heads}")
    vocab = n("vocab_size", len(file.value("tokenizer.ggml.tokens", ())) or 1)
    eos = file.integer("tokenizer.ggml.eos_token_id", -1, least=-1)
    attention = AttentionConfig(d_model=d_model, n_heads=n_heads, n_ctx=n("context_length"), positions=Learned())
    cfg = ModelConfig(vocab_size=vocab, n_layers=n("block_count"), attention=attention,
                      d_mlp=n("feed_forward_length", 4 * d_model), activation="gelu_new", norm=LayerNorm,
                      norm_eps=file.number("gpt2.attention.layer_norm_epsilon", 1e-5), block=PreNormBlock,
                      is_causal=True, tied_embeddings="output.weight" not in file.tensors.arrays, family="gpt2",
                      eos_ids=(eos,) if 0 <= eos < vocab else ())
    return cfg, (f"gpt2.embedding_length={d_model}, gpt2.attention.head_count={n_heads}, "
                 f"gpt2.feed_forward_length={cfg.d_mlp}")


def load_gpt2_gguf(file) -> Transformer:
    """A gpt2 GGUF file's model: llama.cpp's converter stores every Conv1D weight transposed, as a Linear's
    (d_out, d_in) (``blk.{i}.attn_qkv``, q | k | v rows, ``attn_output``, ``ffn_up``, ``ffn_down``), the
    positions as ``position_embd``, and the unembedding ``output`` when there is one (the logits use it, as
    llama.cpp's do; without it they are tied to ``token_embd``)."""
    from .llama import fused_columns, unembedding

    cfg, why = gpt2_gguf_config(file)
    a, d, d_mlp = cfg.attention, cfg.d_model, cfg.d_mlp
    t = file.tensors.for_config(prefix="", layers=r"blk\.(\d+)\.", n_layers=cfg.n_layers, field="gpt2.block_count",
                                why=why)

    def norm(prefix: str) -> LayerNorm:
        return LayerNorm.load(t, prefix, d_model=d, eps=cfg.norm_eps)

    def block(i: int) -> PreNormBlock:
        p = f"blk.{i}"
        (W_Q, b_Q), (W_K, b_K), (W_V, b_V) = fused_columns(t.linear(f"{p}.attn_qkv", d, 3 * d, bias=True), (d, d, d))
        W_O, b_O = t.linear(f"{p}.attn_output", d, d, bias=True)
        attn = MultiHeadAttention(W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, b_Q=b_Q, b_K=b_K, b_V=b_V, b_O=b_O, config=a)
        mlp = MLP(*t.linear(f"{p}.ffn_up", d, d_mlp, bias=True), *t.linear(f"{p}.ffn_down", d_mlp, d, bias=True),
                  cfg.activation)
        return PreNormBlock(attn=attn, ln_1=norm(f"{p}.attn_norm"), mlp=mlp, ln_2=norm(f"{p}.ffn_norm"))

    W_E = t.take("token_embd.weight", (cfg.vocab_size, d), f"vocab_size={cfg.vocab_size}, {why}")   # (vocab, d)
    return Transformer(config=cfg, W_E=W_E, blocks=tuple(block(i) for i in range(cfg.n_layers)),
                       W_P=t.take("position_embd.weight", (a.n_ctx, d), f"gpt2.context_length={a.n_ctx}, {why}"),
                       ln_final=norm("output_norm"), **unembedding(t, cfg, "output.weight"))


GPT2 = register(Family(name="gpt2", title="GPT-2", matches=lambda config: config.get("model_type") == "gpt2",
                       load=checkpoint_loader(gpt2_config, gpt2_from_tensors),
                       tokenizer=lambda folder, config: bpe_folder_tokenizer(folder),
                       gguf_architecture="gpt2", load_gguf=load_gpt2_gguf))
