"""BERT-family encoders (Devlin et al., 2019), read from a Hugging Face safetensors checkpoint.

One block, post-norm::

    x = LN(x + Attention(x))          no mask: every token sees both sides
    x = LN(x + MLP(x))                GELU, exact (erf) form

Linear weights are stored as [out, in] and transposed once at load time. Both key layouts load:
MiniLM's (``embeddings.…``, ``encoder.layer.0.…``) and the ``bert.``-prefixed one of BertForMaskedLM.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..multihead import MultiHeadAttention
from .checkpoint import Tensors, check_layer_count, config_float, config_int
from .layers import MLP, LayerNorm, activation_name
from .output import ModelOutput, attention_and_weights, check_ids, check_model


@dataclass(frozen=True)
class BertConfig:
    """Sizes of a BERT encoder, from config.json (HF names in the comments)."""
    n_layers: int            # num_hidden_layers
    n_heads: int             # num_attention_heads
    d_model: int             # hidden_size
    d_mlp: int               # intermediate_size (4·d_model in BERT)
    n_ctx: int               # max_position_embeddings: rows of the position table
    vocab_size: int
    n_types: int = 2         # type_vocab_size: segment A/B
    ln_eps: float = 1e-12    # layer_norm_eps
    activation: str = "gelu"  # hidden_act

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")

    @classmethod
    def from_json(cls, config: dict, source: str) -> "BertConfig":
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{source}: position_embedding_type {config['position_embedding_type']!r} is not "
                             "supported; attnlab reads BERT with absolute positions")
        n = lambda key, default=None: config_int(config, key, source, default)   # noqa: E731
        return cls(n_layers=n("num_hidden_layers"), n_heads=n("num_attention_heads"), d_model=n("hidden_size"),
                   d_mlp=n("intermediate_size"), n_ctx=n("max_position_embeddings"), vocab_size=n("vocab_size"),
                   n_types=n("type_vocab_size", 2), ln_eps=config_float(config, "layer_norm_eps", source, 1e-12),
                   activation=activation_name(config, "hidden_act", source))


@dataclass(frozen=True, eq=False)
class BertBlock:
    attn: MultiHeadAttention
    ln_attn: LayerNorm       # attention.output.LayerNorm
    mlp: MLP
    ln_mlp: LayerNorm        # output.LayerNorm


@dataclass(frozen=True, eq=False)
class Bert:
    """A BERT encoder's parameters. ``bert(ids)`` runs the forward pass (see :func:`bert_forward`)."""
    config: BertConfig
    W_E: np.ndarray          # (vocab_size, d_model) word embeddings
    W_P: np.ndarray          # (n_ctx, d_model) position embeddings
    W_T: np.ndarray          # (n_types, d_model) token-type (segment) embeddings
    ln_embed: LayerNorm
    blocks: tuple            # of BertBlock

    def __call__(self, ids, token_types=None, *, return_weights: bool = False) -> ModelOutput:
        return bert_forward(self, ids, token_types, return_weights=return_weights)

    def embed(self, ids, token_types=None) -> np.ndarray:
        return bert_embed(self, ids, token_types)


def bert_embed(model: Bert, ids, token_types=None) -> np.ndarray:
    """Token ids (n,) -> the first block's input (n, d_model): word, position and segment rows, normalised.

    ``token_types`` (n,) defaults to all 0 (one segment).
    """
    check_model(model, Bert)
    cfg = model.config
    ids = check_ids(ids, cfg.vocab_size, cfg.n_ctx)                   # (n,)
    types = np.zeros_like(ids) if token_types is None else check_ids(token_types, cfg.n_types, cfg.n_ctx,
                                                                      name="token_types")   # (n,)
    if types.shape != ids.shape:
        raise ValueError(f"token_types must have shape {ids.shape} like ids, got {types.shape}")
    x = model.W_E[ids] + model.W_P[: len(ids)] + model.W_T[types]   # (n, d_model)
    return model.ln_embed(x)                                        # (n, d_model)


def bert_forward(model: Bert, ids, token_types=None, *, return_weights: bool = False) -> ModelOutput:
    """Token ids (n,) -> hidden states (n_layers+1, n, d_model), and with ``return_weights=True`` every head's
    attention weights (n_layers, h, n, n) as ``attentions`` (None otherwise: a long input then takes
    attention's tiled path).

    ``hidden_states[0]`` is the embedding output, ``hidden_states[i]`` the output of block i.
    ``token_types`` (n,) defaults to all 0 (one segment).
    """
    x = bert_embed(model, ids, token_types)                         # (n, d_model)
    hidden, weights = [x], []
    for block in model.blocks:
        y, a = attention_and_weights(block.attn, x, return_weights)   # (n, d_model), (h, n, n) or None
        x = block.ln_attn(x + y)                        # (n, d_model)
        x = block.ln_mlp(x + block.mlp(x))              # (n, d_model)
        hidden.append(x)
        weights.append(a)
    return ModelOutput(hidden_states=np.stack(hidden),                      # (L+1, n, d_model)
                       attentions=np.stack(weights) if return_weights else None)   # (L, h, n, n)


def load_bert(tensors: Tensors, config: dict) -> Bert:
    """A :class:`Bert` from a checkpoint's tensors and its config.json (either key layout)."""
    cfg = BertConfig.from_json(config, tensors.source)
    t = tensors.strip_prefix("bert.")
    check_layer_count(t, r"encoder\.layer\.(\d+)\.", cfg.n_layers, "num_hidden_layers")
    d, d_mlp = cfg.d_model, cfg.d_mlp
    why = f"hidden_size={d}, intermediate_size={d_mlp}"

    norm = functools.partial(LayerNorm.load, t, d_model=d, eps=cfg.ln_eps, why=why)   # norm(prefix)

    def linear(prefix: str, d_in: int, d_out: int) -> tuple[np.ndarray, np.ndarray]:
        w = t.take(f"{prefix}.weight", (d_out, d_in), why)       # (out, in) as torch stores it
        return w.T, t.take(f"{prefix}.bias", (d_out,), why)       # (in, out), (out,)

    def block(i: int) -> BertBlock:
        p = f"encoder.layer.{i}"
        (W_Q, b_Q), (W_K, b_K), (W_V, b_V) = (linear(f"{p}.attention.self.{n}", d, d)
                                              for n in ("query", "key", "value"))
        W_O, b_O = linear(f"{p}.attention.output.dense", d, d)
        W_in, b_in = linear(f"{p}.intermediate.dense", d, d_mlp)
        W_out, b_out = linear(f"{p}.output.dense", d_mlp, d)
        return BertBlock(attn=MultiHeadAttention(W_Q, W_K, W_V, W_O, b_Q, b_K, b_V, b_O, n_heads=cfg.n_heads),
                         ln_attn=norm(f"{p}.attention.output.LayerNorm"),
                         mlp=MLP(W_in, b_in, W_out, b_out, cfg.activation), ln_mlp=norm(f"{p}.output.LayerNorm"))

    e = "embeddings"
    return Bert(config=cfg,
                W_E=t.take(f"{e}.word_embeddings.weight", (cfg.vocab_size, d), f"vocab_size={cfg.vocab_size}, {why}"),
                W_P=t.take(f"{e}.position_embeddings.weight", (cfg.n_ctx, d),
                           f"max_position_embeddings={cfg.n_ctx}, {why}"),
                W_T=t.take(f"{e}.token_type_embeddings.weight", (cfg.n_types, d), f"type_vocab_size={cfg.n_types}"),
                ln_embed=norm(f"{e}.LayerNorm"), blocks=tuple(block(i) for i in range(cfg.n_layers)))


def bert_tokenizer(folder: Path):
    """The folder's ``tokenizer.json`` with padding and truncation turned off (MiniLM's pads to 128)."""
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(2, "No tokenizer.json in the BERT model folder", str(path))
    tok = Tokenizer.from_file(str(path))
    tok.no_padding()
    tok.no_truncation()
    return tok
