"""The Llama family (Touvron et al., 2023; Llama 3, Grattafiori et al., 2024) and its kin Mistral (Jiang et
al., 2023) and Qwen2 (Yang et al., 2024), from Hugging Face safetensors checkpoints (one file or shards;
float32, float16 or bfloat16).

On the stack (:mod:`attnlab.stack.transformer`) all three are the same model: token embeddings and no position table,
pre-norm blocks with RMSNorm, grouped-query attention (``num_key_value_heads`` key/value heads) with RoPE
(``rope_theta``, and Llama 3's frequency scaling), a gated SiLU MLP (SwiGLU), a final RMSNorm, and logits
``x W_U`` (or ``x W_Eᵀ`` with ``tie_word_embeddings``). What differs, in config.json:

- Mistral: ``sliding_window``, each query sees only that many keys up to itself;
- Qwen2: biases on q, k and v (never on o);
- Llama: ``attention_bias`` puts biases on q, k, v and o.

RoPE's pairs. attnlab's :func:`attnlab.layer.positions.rope` turns features (2i, 2i+1) of each head as one pair,
as Su et al. (2021) write it. Hugging Face's code turns features (i, i + d_head/2) ("rotate_half"), and its
Llama weights are stored for that layout. Both turn pair i by the same angle ``pos · θ_i``, so reordering
each head's columns of W_Q and W_K (and b_Q, b_K) from (0, 1, …, d_head−1) to (0, d/2, 1, d/2+1, …)
makes attnlab's rotation act on the same numbers. q and k are permuted alike within a head, so every score
``q · k``, every weight and every output is unchanged; only ``hook_q`` and ``hook_k`` list a head's
features in that order.

config.json is read in both spellings transformers has used: ``rope_theta`` and ``rope_scaling``
(transformers 4) or one ``rope_parameters`` dict (transformers 5). Tokenizer: the folder's
``tokenizer.json``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..kernels.matmul import streamed
from ..layer.config import AttentionConfig
from ..stack.layers import GatedMLP, RMSNorm, activation_name
from ..layer.multihead import MultiHeadAttention
from ..layer.positions import ROPE_BASE, RoPE
from ..stack.blocks import PreNormBlock
from ..stack.transformer import ModelConfig, Transformer
from ..text.tokens import json_folder_tokenizer
from .checkpoint import Tensors, config_eos_ids, config_float, config_int, read_checkpoint
from .families import Family, register

MODEL_TYPES = ("llama", "mistral", "qwen2")
TITLES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}   # as the families write their names
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
# each scaling's fields as config.json states them: (needed, optional), read by rope_scaling_of
SCALING_KEYS = {"llama3": (LLAMA3_KEYS, ()), "linear": (("factor",), ()),
                "yarn": (("factor", "original_max_position_embeddings"),
                         ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim")),
                "dynamic": (("factor",), ())}


def rope_scheme(config: dict, source: str, d_head: int | None = None) -> RoPE:
    """RoPE with the config's base θ and, for ``rope_type`` "llama3", "linear", "yarn" or "dynamic" (NTK-aware), its
    frequency scaling (:func:`rope_scaling_of`); any other scaling type is refused, naming it. With ``d_head``, a ``partial_rotary_factor`` below 1 (Phi-3,
    GPT-NeoX) rotates only the first ``d_head · factor`` features of each head."""
    params = config.get("rope_parameters")                       # transformers 5: one dict
    if params is None:                                           # transformers 4: two fields
        scaling = config.get("rope_scaling")
        if scaling is not None and not isinstance(scaling, dict):
            raise ValueError(f"{source}: config.json field 'rope_scaling' must be an object or null, got {scaling!r}")
        params = dict(scaling or {}, rope_theta=config.get("rope_theta", ROPE_BASE))
    if not isinstance(params, dict):
        raise ValueError(f"{source}: config.json field 'rope_parameters' must be an object, got {params!r}")
    theta = params.get("rope_theta", config.get("rope_theta", ROPE_BASE))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise ValueError(f"{source}: config.json field 'rope_theta' must be a positive number, got {theta!r}")
    kind = params.get("rope_type", params.get("type", "default"))
    factor = params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1 or (
            factor < 1 and d_head is None):
        raise ValueError(f"{source}: config.json field 'partial_rotary_factor' must be in (0, 1] (1 for this "
                         f"family), got {factor!r}")
    rotary_dim = None if factor == 1 or d_head is None else int(d_head * factor)
    if kind in (None, "default"):
        return RoPE(float(theta), rotary_dim=rotary_dim)
    if kind not in SCALING_KEYS:
        raise ValueError(f"{source}: config.json asks for rope_type {kind!r} (in 'rope_scaling' or "
                         f"'rope_parameters'); attnlab reads 'default', {', '.join(map(repr, SCALING_KEYS))}")
    scaling = rope_scaling_of(params, kind, config, source)
    return RoPE(float(theta), scaling=scaling, rotary_dim=rotary_dim)


def rope_scaling_of(params: dict, kind: str, config: dict, source: str) -> dict:
    """The scaling dict of ``rope_type`` ``kind`` from config.json's rope parameters, each field checked (a
    positive number). YaRN's trained context defaults to max_position_embeddings, as transformers' does;
    "dynamic" is NTK-aware scaling fixed for the stated context (:class:`attnlab.layer.positions.NTKScaling`:
    plain RoPE within max_position_embeddings, where transformers' dynamic RoPE is too)."""
    needed, optional = SCALING_KEYS[kind]
    params = dict(params)
    if kind == "yarn" and params.get("original_max_position_embeddings") is None:
        params["original_max_position_embeddings"] = config.get("max_position_embeddings")
    scaling = {"rope_type": kind}
    for key in needed + tuple(k for k in optional if params.get(k) is not None):
        v = params.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"{source}: config.json's {kind} rope scaling needs a positive {key!r}, got {v!r}")
        scaling[key] = float(v)
    if kind == "yarn" and params.get("truncate") is not None:
        scaling["truncate"] = bool(params["truncate"])
    if kind == "dynamic":
        scaling["max_position_embeddings"] = float(config_int(config, "max_position_embeddings", source))
    return scaling


def sliding_window(config: dict, source: str) -> int | None:
    """Mistral's ``sliding_window`` (None = full attention); Qwen2's only when every layer slides."""
    window = config.get("sliding_window")
    if config.get("model_type") == "qwen2":
        kinds = set(config.get("layer_types") or [])
        if not config.get("use_sliding_window", False) and "sliding_attention" not in kinds:
            return None
        if kinds != {"sliding_attention"}:
            raise ValueError(f"{source}: config.json slides the window in some layers only (use_sliding_window, "
                             f"layer_types {sorted(kinds)}); attnlab reads Qwen2 with one kind of attention in "
                             "every layer")
    if window is None:
        return None
    return config_int(config, "sliding_window", source)


def llama_config(config: dict, source: str) -> ModelConfig:
    """The stack's config from a Llama, Mistral or Qwen2 config.json (hidden_size, num_attention_heads,
    num_key_value_heads, head_dim, intermediate_size, rms_norm_eps, max_position_embeddings, …)."""
    n = lambda key, default=None: config_int(config, key, source, default)   # noqa: E731
    d_model, n_heads = n("hidden_size"), n("num_attention_heads")
    n_kv_heads = n("num_key_value_heads", n_heads)
    if n_heads % n_kv_heads:
        raise ValueError(f"{source}: config.json has num_attention_heads={n_heads}, which is not a multiple of "
                         f"num_key_value_heads={n_kv_heads}; each key/value head must serve a whole group of "
                         "query heads")
    if config.get("head_dim") is None and d_model % n_heads:
        raise ValueError(f"{source}: config.json has hidden_size={d_model}, not a multiple of "
                         f"num_attention_heads={n_heads}, and no head_dim")
    if config.get("mlp_bias", False):
        raise ValueError(f"{source}: config.json sets mlp_bias=true; attnlab reads the gated MLP without biases")
    attention = AttentionConfig(d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads,
                                d_head=n("head_dim", d_model // n_heads), n_ctx=n("max_position_embeddings"),
                                positions=rope_scheme(config, source), window=sliding_window(config, source))
    return ModelConfig(vocab_size=n("vocab_size"), n_layers=n("num_hidden_layers"), attention=attention,
                       d_mlp=n("intermediate_size"), activation=activation_name(config, "hidden_act", source),
                       mlp="gated", norm=RMSNorm, norm_eps=config_float(config, "rms_norm_eps", source, 1e-6),
                       block=PreNormBlock, is_causal=True, tied_embeddings=bool(config.get("tie_word_embeddings", False)),
                       family=config.get("model_type", "llama"),
                       eos_ids=config_eos_ids(config, source, n("vocab_size")))


def attention_biases(config: dict) -> tuple[bool, bool]:
    """Whether q, k, v have biases, and whether o has one: Qwen2 (q, k, v), Llama's ``attention_bias`` (all)."""
    every = bool(config.get("attention_bias", False))
    return config.get("model_type") == "qwen2" or every, every


def half_to_pairs(n_heads: int, d_head: int, rotary_dim: int | None = None) -> np.ndarray:
    """Column order taking each head from rotate_half's layout (i pairs with i + r/2) to attnlab's
    (2i pairs with 2i+1): (n_heads·d_head,). With ``rotary_dim`` r < d_head only the first r features of a
    head rotate; the rest keep their places.

    >>> half_to_pairs(2, 4)
    array([0, 2, 1, 3, 4, 6, 5, 7])
    >>> half_to_pairs(1, 6, rotary_dim=4)
    array([0, 2, 1, 3, 4, 5])
    """
    r = d_head if rotary_dim is None else rotary_dim
    half = r // 2
    rot = np.stack([np.arange(half), np.arange(half) + half], axis=1).ravel()   # (r,) 0, r/2, 1, r/2+1, …
    one = np.concatenate([rot, np.arange(r, d_head)])                           # (d_head,)
    return (np.arange(n_heads)[:, None] * d_head + one).ravel()                 # (n_heads·d_head,)


def rope_attention(q: tuple, k: tuple, v: tuple, o: tuple, a: AttentionConfig, *,
                   pairs: bool = False, norms: dict | None = None, sinks=None) -> MultiHeadAttention:
    """The layer from Hugging Face's (weight (d_in, d_out), bias) pairs of q, k, v and o, W_Q's and W_K's
    columns (and b_Q's, b_K's) taken from rotate_half's layout into RoPE pairs, head by head (only the first
    rotary_dim features of a head with partial rotation); ``pairs``: the columns already pair (GGUF).
    ``norms``: QK-norm's ``q_norm`` and ``k_norm`` weights (:func:`qk_norm_weights`), reordered alike;
    ``sinks``: the learned sink logits (h,), per head, so never reordered (gpt-oss)."""
    r = getattr(a.positions, "rotary_dim", None)
    if pairs:
        q_order = k_order = one = slice(None)
    else:
        q_order, k_order = half_to_pairs(a.n_heads, a.d_head, r), half_to_pairs(a.n_kv_heads, a.d_head, r)
        one = half_to_pairs(1, a.d_head, r)                      # (d_head,) one head's order
    norms = {} if not norms else {"q_norm": norms["q_norm"][one if a.qk_norm.over == "head" else q_order],
                                  "k_norm": norms["k_norm"][one if a.qk_norm.over == "head" else k_order]}
    return MultiHeadAttention(q[0][:, q_order], k[0][:, k_order], v[0], o[0], q[1][q_order], k[1][k_order], v[1],
                              o[1], config=a, **norms, **({} if sinks is None else {"sinks": sinks}))


def qk_norm_weights(t: Tensors, q_norm: str, k_norm: str, a: AttentionConfig, *, plus_one: bool = False) -> dict:
    """QK-norm's weights ``{q_norm}.weight`` and ``{k_norm}.weight``, shaped as the config's qk_norm says
    ((d_head,) per head, or the whole projection's width); {} for a layer without QK-norm. ``plus_one``: stored
    as w for a norm that scales by 1 + w (Gemma's)."""
    if a.qk_norm is None:
        return {}
    shapes = a.qk_norm.shapes(a.n_heads, a.n_kv_heads, a.d_head)
    got = {"q_norm": t.take(f"{q_norm}.weight", shapes["q_norm"]), "k_norm": t.take(f"{k_norm}.weight", shapes["k_norm"])}
    return {name: 1 + w if plus_one else w for name, w in got.items()}


def gated_mlp(t: Tensors, cfg: ModelConfig, gate: str, up: str, down: str) -> GatedMLP:
    """The linears ``gate``, ``up`` and ``down``, no biases: W_gate, W_in (d_model, d_mlp), W_out (d_mlp, d_model)."""
    d, d_mlp = cfg.d_model, cfg.d_mlp
    return GatedMLP(t.linear(gate, d, d_mlp)[0], t.linear(up, d, d_mlp)[0], t.linear(down, d_mlp, d)[0],
                    cfg.activation)


@dataclass(frozen=True)
class TensorNames:
    """Where a checkpoint keeps each tensor of a Llama-family model (``{i}`` is the layer), and how its q/k
    columns are ordered: Hugging Face's rotate_half layout, or already in RoPE pairs (llama.cpp's GGUF)."""
    prefix: str
    layers: str                     # a pattern with one group, the layer index
    n_layers_field: str             # the config field stating the layer count, for messages
    embed: str
    unembed: str
    final_norm: str
    q: str
    k: str
    v: str
    o: str
    gate: str
    up: str
    down: str
    ln_1: str
    ln_2: str
    rope_pairs: bool = False        # True: q/k columns already pair (2i, 2i+1), nothing to reorder
    q_norm: str = "layers.{i}.self_attn.q_norm"   # QK-norm's weights, read only for a config with qk_norm
    k_norm: str = "layers.{i}.self_attn.k_norm"


HF_NAMES = TensorNames(prefix="model.", layers=r"layers\.(\d+)\.", n_layers_field="num_hidden_layers",
                       embed="embed_tokens.weight", unembed="lm_head.weight", final_norm="norm",
                       q="layers.{i}.self_attn.q_proj", k="layers.{i}.self_attn.k_proj",
                       v="layers.{i}.self_attn.v_proj", o="layers.{i}.self_attn.o_proj",
                       gate="layers.{i}.mlp.gate_proj", up="layers.{i}.mlp.up_proj", down="layers.{i}.mlp.down_proj",
                       ln_1="layers.{i}.input_layernorm", ln_2="layers.{i}.post_attention_layernorm")

# llama.cpp's names. Its converter stores each head's q and k rows permuted from rotate_half's layout into
# pairs (2i, 2i+1), for its own RoPE, which is attnlab's: the columns are used as the file has them (the
# cross-checks against transformers, which permutes them back, confirm it).
GGUF_NAMES = TensorNames(prefix="", layers=r"blk\.(\d+)\.", n_layers_field="llama.block_count",
                         embed="token_embd.weight", unembed="output.weight", final_norm="output_norm",
                         q="blk.{i}.attn_q", k="blk.{i}.attn_k", v="blk.{i}.attn_v", o="blk.{i}.attn_output",
                         gate="blk.{i}.ffn_gate", up="blk.{i}.ffn_up", down="blk.{i}.ffn_down",
                         ln_1="blk.{i}.attn_norm", ln_2="blk.{i}.ffn_norm", rope_pairs=True,
                         q_norm="blk.{i}.attn_q_norm", k_norm="blk.{i}.attn_k_norm")


def llama_from_tensors(tensors: Tensors, cfg: ModelConfig, *, qkv_bias: bool = False, o_bias: bool = False,
                       names: TensorNames = HF_NAMES, why: str | None = None) -> Transformer:
    """The model from a checkpoint's tensors, named as ``names`` says, every shape checked against the config
    (``why``: the config fields the shapes come from, for messages)."""
    a, d = cfg.attention, cfg.d_model
    width, width_kv = a.n_heads * a.d_head, a.n_kv_heads * a.d_head
    t = llama_layout(tensors, cfg, names, why)

    def block(i: int) -> PreNormBlock:
        name = lambda part: getattr(names, part).format(i=i)        # noqa: E731
        a_i = cfg.layer_attention(i)
        attn = rope_attention(*(t.linear(name(n), d, w, bias=qkv_bias) for n, w in (("q", width), ("k", width_kv),
                                                                                   ("v", width_kv))),
                              t.linear(name("o"), width, d, bias=o_bias), a_i, pairs=names.rope_pairs,
                              norms=qk_norm_weights(t, name("q_norm"), name("k_norm"), a_i))
        mlp = gated_mlp(t, cfg, name("gate"), name("up"), name("down"))
        return PreNormBlock(attn=attn, ln_1=norm(name("ln_1")), mlp=mlp, ln_2=norm(name("ln_2")))

    def norm(prefix: str) -> RMSNorm:
        return RMSNorm.load(t, prefix, d_model=d, eps=cfg.norm_eps)

    return llama_layout_model(t, cfg, block, norm, names)


def llama_layout(tensors: Tensors, cfg: ModelConfig, names: TensorNames = HF_NAMES, why: str | None = None) -> Tensors:
    """The tensors of a folder in Llama's layout (``model.layers.{i}.…``, or ``names``), their layer count
    checked against the config, the config's sizes named in every shape error (Llama, Gemma-2, Phi-3)."""
    a = cfg.attention
    why = why or (f"hidden_size={cfg.d_model}, num_attention_heads={a.n_heads}, num_key_value_heads="
                  f"{a.n_kv_heads}, head_dim={a.d_head}, intermediate_size={cfg.d_mlp}")
    return tensors.for_config(prefix=names.prefix, layers=names.layers, n_layers=cfg.n_layers,
                              field=names.n_layers_field, why=why)


def llama_layout_model(t: Tensors, cfg: ModelConfig, block, norm, names: TensorNames = HF_NAMES) -> Transformer:
    """The model of a Llama-layout folder from its ``block(i)`` and ``norm(prefix)``: the embedding (first,
    while nothing else is held), the blocks, the final norm and the unembedding (unless tied)."""
    W_E = t.take(names.embed, (cfg.vocab_size, cfg.d_model), f"vocab_size={cfg.vocab_size}, {t.why}")   # (vocab, d)
    if cfg.tied_embeddings and isinstance(W_E, np.ndarray):   # laid out for the logits x W_Eᵀ now, while nothing else is held
        W_E = streamed(W_E.T).T                                                                  # (vocab, d)
    return Transformer(config=cfg, W_E=W_E, blocks=tuple(block(i) for i in range(cfg.n_layers)),
                       ln_final=norm(names.final_norm), **unembedding(t, cfg, names.unembed))


def unembedding(t: Tensors, cfg: ModelConfig, name: str = "lm_head.weight") -> dict:
    """``W_U`` (d_model, vocab) from ``name`` and a zero ``b_U`` (vocab,), or neither with tied embeddings."""
    if cfg.tied_embeddings:
        return {}
    W_U = t.take(name, (cfg.vocab_size, cfg.d_model), f"vocab_size={cfg.vocab_size}, {t.why}").T   # (d, vocab)
    return {"W_U": W_U, "b_U": np.zeros(cfg.vocab_size, W_U.dtype)}


def load_llama(folder: Path, config: dict) -> Transformer:
    """A Llama, Mistral or Qwen2 folder's model: the tensors mapped from its file or shards, onto the stack."""
    tensors = read_checkpoint(folder)
    qkv_bias, o_bias = attention_biases(config)
    return llama_from_tensors(tensors, llama_config(config, tensors.source), qkv_bias=qkv_bias, o_bias=o_bias)


def llama_gguf_config(file, arch: str = "llama", *, partial_rope: bool = False,
                      yarn_truncate: bool | None = None) -> tuple[ModelConfig, str]:
    """The stack's config from the metadata of a GGUF file of a Llama-like ``arch`` (``{arch}.embedding_length``,
    ``{arch}.attention.head_count``, …: llama.cpp writes the same keys for llama, qwen2, gemma2 and phi3), and
    the keys it came from, for shape errors. ``partial_rope``: ``{arch}.rope.dimension_count`` may be below d_head
    (Phi-3), only that many features of a head turn; ``yarn_truncate`` as :func:`gguf_rope` takes it."""
    n = lambda name, *default: file.integer(f"{arch}.{name}", *default)          # noqa: E731
    d_model, n_heads = n("embedding_length"), n("attention.head_count")
    n_kv_heads = n("attention.head_count_kv", n_heads)
    if n_heads % n_kv_heads:
        raise ValueError(f"{file.path}: GGUF metadata '{arch}.attention.head_count' is {n_heads}, not a multiple of "
                         f"'{arch}.attention.head_count_kv' {n_kv_heads}; each key/value head must serve a whole "
                         "group of query heads")
    if not file.has(f"{arch}.attention.key_length") and d_model % n_heads:
        raise ValueError(f"{file.path}: GGUF metadata '{arch}.embedding_length' {d_model} is not a multiple of "
                         f"'{arch}.attention.head_count' {n_heads}, and there is no '{arch}.attention.key_length'")
    d_head = n("attention.key_length", d_model // n_heads)
    rotary = n("rope.dimension_count", d_head)
    if rotary != d_head and not (partial_rope and rotary < d_head and rotary % 2 == 0):
        raise ValueError(f"{file.path}: GGUF metadata '{arch}.rope.dimension_count' is {rotary}, not d_head "
                         f"{d_head}; attnlab rotates every feature of a {arch} head")
    vocab = n("vocab_size", len(file.value("tokenizer.ggml.tokens", ())) or 1)
    tied = "output.weight" not in file.tensors.arrays                          # no unembedding: x W_Eᵀ
    eos = file.integer("tokenizer.ggml.eos_token_id", -1, least=-1)
    attention = AttentionConfig(d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, d_head=d_head,
                                n_ctx=n("context_length"),
                                positions=gguf_rope(file, d_head, arch, None if rotary == d_head else rotary,
                                                    yarn_truncate=yarn_truncate))
    cfg = ModelConfig(vocab_size=vocab, n_layers=n("block_count"), attention=attention,
                      d_mlp=n("feed_forward_length"), activation="silu", mlp="gated", norm=RMSNorm,
                      norm_eps=file.number(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5), block=PreNormBlock,
                      is_causal=True, tied_embeddings=tied, family=arch,
                      eos_ids=(eos,) if 0 <= eos < vocab else ())
    why = (f"{arch}.embedding_length={d_model}, {arch}.attention.head_count={n_heads}, "
           f"{arch}.attention.head_count_kv={n_kv_heads}, d_head={d_head}, {arch}.feed_forward_length={cfg.d_mlp}")
    return cfg, why


def gguf_rope(file, d_head: int, arch: str = "llama", rotary_dim: int | None = None, *,
              yarn_truncate: bool | None = None) -> RoPE:
    """RoPE with ``{arch}.rope.freq_base``; its scaling from ``{arch}.rope.scaling.type``: "linear" with
    ``.factor``, "yarn" with ``.factor``, ``.original_context_length`` and, where stated, ``.yarn_beta_fast``,
    ``.yarn_beta_slow`` and ``.yarn_attn_factor`` (``yarn_truncate``: whether the ramp's ends are floored and
    ceiled, None = yes, as llama.cpp does); Llama 3's from the ``rope_freqs`` tensor llama.cpp's converter
    writes (one factor per pair)."""
    key = lambda name: f"{arch}.rope.{name}"                                    # noqa: E731
    theta = file.number(key("freq_base"), 10000.0)
    kind = file.string(key("scaling.type"), "none")
    if kind == "linear":
        return RoPE(theta, scaling={"rope_type": "linear", "factor": file.number(key("scaling.factor"))},
                    rotary_dim=rotary_dim)
    if kind == "yarn":
        scaling = {"rope_type": "yarn", "factor": file.number(key("scaling.factor")),
                   "original_max_position_embeddings": float(file.integer(key("scaling.original_context_length")))}
        for name, field in (("beta_fast", "beta_fast"), ("beta_slow", "beta_slow"), ("attn_factor", "attention_factor")):
            if file.has(key(f"scaling.yarn_{name}")):
                scaling[field] = file.number(key(f"scaling.yarn_{name}"))
        if yarn_truncate is not None:
            scaling["truncate"] = yarn_truncate
        return RoPE(theta, scaling=scaling, rotary_dim=rotary_dim)
    if kind != "none":
        raise ValueError(f"{file.path}: GGUF metadata {key('scaling.type')!r} is {kind!r}; attnlab reads "
                         "'none', 'linear' and 'yarn' (and Llama 3's rope_freqs tensor)")
    if "rope_freqs.weight" in file.tensors.arrays:
        r = rotary_dim or d_head
        factors = file.tensors.take("rope_freqs.weight", (r // 2,), f"rotary features {r}")   # (r/2,)
        return RoPE(theta, scaling={"rope_type": "factors", "factors": tuple(float(f) for f in factors)},
                    rotary_dim=rotary_dim)
    return RoPE(theta, rotary_dim=rotary_dim)


def gguf_names(arch: str, *, rope_pairs: bool) -> TensorNames:
    """llama.cpp's tensor names for a file of ``arch``; ``rope_pairs``: its converter permuted q and k into
    RoPE pairs (llama only: its RoPE for qwen2, gemma2 and phi3 is rotate_half's, "NeoX", and those rows stay
    as Hugging Face had them)."""
    return dataclasses.replace(GGUF_NAMES, n_layers_field=f"{arch}.block_count", rope_pairs=rope_pairs)


def fused_columns(w: tuple, widths: tuple) -> list[tuple]:
    """A fused linear's ``(weight (d_in, Σ widths), bias (Σ widths,))`` cut into one pair per width, left to
    right (Phi-3's and GPT-2's q | k | v). A quantized weight is cut by whole rows of blocks."""
    cuts = np.cumsum((0,) + tuple(widths))
    return [(w[0][:, c0:c1], w[1][c0:c1]) for c0, c1 in zip(cuts[:-1], cuts[1:])]


def load_llama_gguf(file) -> Transformer:
    """A llama GGUF file's model: its tensors dequantized one at a time, mapped onto the stack."""
    cfg, why = llama_gguf_config(file)
    return llama_from_tensors(file.tensors, cfg, names=GGUF_NAMES, why=why)


def load_qwen2_gguf(file) -> Transformer:
    """A qwen2 GGUF file's model: Llama's names and keys under ``qwen2.``, biases on q, k and v, and the q and k
    rows in rotate_half's layout (llama.cpp turns Qwen2 as NeoX does), taken into pairs as from a folder."""
    cfg, why = llama_gguf_config(file, "qwen2")
    return llama_from_tensors(file.tensors, cfg, qkv_bias=True, names=gguf_names("qwen2", rope_pairs=False), why=why)


GGUF_READERS = {"llama": load_llama_gguf, "qwen2": load_qwen2_gguf}   # model_type -> its GGUF architecture's reader


FAMILIES = tuple(register(Family(name=kind, matches=lambda config, kind=kind: config.get("model_type") == kind,
                                 load=load_llama, tokenizer=lambda folder, config: json_folder_tokenizer(folder),
                                 gguf_architecture=kind if kind in GGUF_READERS else None,
                                 load_gguf=GGUF_READERS.get(kind),
                                 title=TITLES[kind]))
                 for kind in MODEL_TYPES)
