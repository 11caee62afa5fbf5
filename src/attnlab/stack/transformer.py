"""One decoder (or encoder) stack for every model: attnlab's own LM, GPT-2 and BERT run this code.

A forward pass, top to bottom::

    x = W_E[ids] (+ W_P[positions]) (+ W_T[token types]), (then LN for BERT)      (..., n, d_model)
    for each block:
        x = block.forward(x)    its residual lines: pre-norm (GPT-2, Llama), post-norm (BERT), parallel
                                (GPT-NeoX) or sandwich (Gemma-2), see attnlab.stack.blocks
    x = ln_final(x)             (every kind but post-norm, in models with norms)
    logits = x W_Eᵀ (tied, GPT-2) or x W_U + b_U (attnlab's LM); an encoder has none   (..., n, vocab)

attnlab's own LM is the plainest case: no norms, no MLP, its positions learned, sinusoidal, RoPE or ALiBi.
What differs between models is stated in :class:`ModelConfig`; a family (:mod:`attnlab.models.families`)
only maps its checkpoint's names onto :class:`Transformer`. :func:`forward`, :func:`new_caches` and
:func:`generate` serve all of them; ``forward(..., hooks=…)`` (and :func:`attnlab.stack.hooks.run_with_cache`,
``run_with_hooks``) runs the same pass with named activations, and ``forward(..., tape=…)`` the same pass for
training: each piece keeps what its backward needs (:mod:`attnlab.stack.backward`).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

import numpy as np

from ..kernels._checks import (as_positive_float, as_positive_int, as_stop_ids, as_token_ids, cap_scores, cap_slope,
                               check_flag, check_rng)
from ..kernels._step import one_step
from ..kernels._threads import blas_threads_for
from ..kernels.matmul import as_weight, linear, streamed
from ..layer.cache import KVCache
from ..layer.config import AttentionConfig
from ..layer.hookpoints import NO_HOOKS, Hooks
from ..layer.tape import Tape
from .blocks import BLOCKS, Block, PostNormBlock, PreNormBlock
from .experts import ExpertsConfig
from .layers import ACTIVATIONS, MLPS, NORMS, LayerNorm, RMSNorm
from .sampling import check_temperature, check_top, sample_next


@dataclass(frozen=True)
class ModelConfig:
    """Everything that sets a model's shapes and wiring, stated once.

    ``family`` names where the model came from ("gpt2", "bert", "attnlab"); it is shown, never tested.
    """
    vocab_size: int                 # rows of W_E
    n_layers: int                   # blocks
    attention: AttentionConfig      # d_model, n_heads, n_kv_heads, d_head, n_ctx, positions, window
    d_mlp: int | None = None        # width of the MLP's hidden layer; None = attention-only blocks
    activation: str = "gelu_new"    # the MLP's nonlinearity, a key of attnlab.stack.layers.ACTIVATIONS
    mlp: str = "mlp"                # the MLP's kind, a key of attnlab.stack.layers.MLPS ("gated": Llama's SwiGLU)
    norm: type | None = None        # a norm class of attnlab.stack.layers.NORMS (LayerNorm, RMSNorm); None = no norms
    norm_eps: float = 1e-5
    block: type = PreNormBlock      # the block kind, a class of attnlab.stack.blocks.BLOCKS: how a block wires
    #                                 its parts (PreNormBlock: GPT-2, Llama; PostNormBlock: BERT; …)
    is_causal: bool = True          # a decoder; False = an encoder, every token sees both sides (BERT)
    tied_embeddings: bool = False   # logits = x W_Eᵀ (GPT-2) rather than x W_U + b_U
    has_logits: bool = True         # False for an encoder without a language-model head
    n_types: int = 0                # rows of the token-type (segment) table W_T (BERT: 2); 0 = none
    embed_norm: bool = False        # a norm on the embeddings (BERT)
    embed_scale: float = 1.0        # the token rows are multiplied by it (Gemma: √d_model)
    logit_softcap: float | None = None   # logits capped to cap · tanh(logits / cap) (Gemma-2); None = no cap
    layers: tuple = ()              # one AttentionConfig per layer where they differ (Gemma-2's alternating
    #                                 windows), each with attention's sizes; () = every layer has `attention`
    experts: ExpertsConfig | None = None   # a mixture-of-experts MLP (gpt-oss, DeepSeek-V3) in place of the
    #                                 dense one, on every layer from experts.first_dense on; None = dense MLPs
    family: str = field(default="", compare=False)
    eos_ids: tuple[int, ...] = field(default=(), compare=False)   # config.json's eos_token_id: the ids that end
    #                                 a text, generate's stop; () = none (attnlab's own folders)

    def __post_init__(self):
        for name in ("vocab_size", "n_layers"):
            as_positive_int(name, getattr(self, name))
        if not isinstance(self.attention, AttentionConfig):
            raise TypeError(f"attention must be an AttentionConfig, got {type(self.attention).__name__}")
        as_positive_int("d_mlp", self.d_mlp, allow_none=True)
        if self.d_mlp is not None and self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}")
        if self.mlp not in MLPS:
            raise ValueError(f"mlp must be one of {sorted(MLPS)}, got {self.mlp!r}")
        if self.norm is not None and self.norm not in NORMS.values():
            raise ValueError(f"norm must be None or one of {[c.__name__ for c in NORMS.values()]}, got {self.norm!r}")
        if self.block not in BLOCKS.values():
            raise ValueError(f"block must be one of {[c.__name__ for c in BLOCKS.values()]}, got {self.block!r}")
        for name in ("is_causal", "tied_embeddings", "has_logits", "embed_norm"):
            check_flag(name, getattr(self, name))
        if self.embed_norm and self.norm is None:
            raise ValueError("embed_norm=True needs a norm")
        if isinstance(self.n_types, bool) or not isinstance(self.n_types, int) or self.n_types < 0:
            raise ValueError(f"n_types must be an int >= 0, got {self.n_types!r}")
        as_positive_float("embed_scale", self.embed_scale)
        if self.logit_softcap is not None:
            as_positive_float("logit_softcap", self.logit_softcap)
        self._check_layers()
        if self.experts is not None and not isinstance(self.experts, ExpertsConfig):
            raise TypeError(f"experts must be an ExpertsConfig or None, got {type(self.experts).__name__}")
        if self.experts is not None and self.d_mlp is None:
            raise ValueError("experts needs d_mlp (the dense layers' width, and the blocks' MLP line)")
        if not isinstance(self.eos_ids, tuple):
            raise TypeError(f"eos_ids must be a tuple of token ids, got {type(self.eos_ids).__name__}")
        as_stop_ids("eos_ids", self.eos_ids, self.vocab_size)

    def _check_layers(self) -> None:
        layers = self.layers
        if not isinstance(layers, tuple) or not all(isinstance(a, AttentionConfig) for a in layers):
            raise TypeError(f"layers must be a tuple of AttentionConfig (one per layer) or (), got {layers!r}")
        if layers and len(layers) != self.n_layers:
            raise ValueError(f"layers must hold one AttentionConfig per layer ({self.n_layers}), got {len(layers)}")
        sizes = ("d_model", "n_heads", "n_kv_heads", "d_head", "n_ctx")
        same_kind = lambda p: p == self.attention.positions or (p.rotates and self.attention.positions.rotates)   # noqa: E731
        for i, a in enumerate(layers):
            if any(getattr(a, k) != getattr(self.attention, k) for k in sizes) or not same_kind(a.positions):
                raise ValueError(f"layers[{i}] must share attention's sizes and positions ({', '.join(sizes)}); "
                                 f"only window, scale, softcap, qk_norm and RoPE's own base and scaling (Gemma-3's "
                                 f"local and global layers) may differ by layer: got {a}, attention is {self.attention}")

    @property
    def d_model(self) -> int:
        return self.attention.d_model

    @property
    def n_ctx(self) -> int:
        return self.attention.n_ctx

    @property
    def final_norm(self) -> bool:
        """A pre-norm stack (every kind but post-norm) normalises once more before the logits (GPT-2's ln_f)."""
        return self.block.final_norm and self.norm is not None

    @property
    def mlp_class(self) -> type:
        return MLPS[self.mlp]

    def at_layer(self, i: int) -> "ModelConfig":
        """The config as layer i's block sees it: without the experts on a dense layer (below first_dense)."""
        if self.experts is None or i >= self.experts.first_dense:
            return self
        return dataclasses.replace(self, experts=None)

    def layer_attention(self, i: int) -> AttentionConfig:
        """The attention config of layer i."""
        return self.layers[i] if self.layers else self.attention

    def to_json(self) -> dict:
        return {"vocab_size": self.vocab_size, "n_layers": self.n_layers, "attention": self.attention.to_json(),
                "d_mlp": self.d_mlp, "activation": self.activation, "mlp": self.mlp,
                "norm": None if self.norm is None else self.norm.name, "norm_eps": self.norm_eps,
                "block": self.block.name, "is_causal": self.is_causal, "tied_embeddings": self.tied_embeddings,
                "has_logits": self.has_logits, "n_types": self.n_types, "embed_norm": self.embed_norm,
                "embed_scale": self.embed_scale, "logit_softcap": self.logit_softcap,
                "layers": [a.to_json() for a in self.layers], "family": self.family,
                **({} if self.experts is None else {"experts": self.experts.to_json()})}

    @classmethod
    def from_json(cls, data: dict) -> "ModelConfig":
        """The inverse of :meth:`to_json`; a ValueError naming what does not fit."""
        try:
            data = dict(data)
            data["attention"] = AttentionConfig.from_json(data["attention"])
            data["layers"] = tuple(AttentionConfig.from_json(a) for a in data.get("layers", ()))
            if data.get("experts") is not None:
                data["experts"] = ExpertsConfig.from_json(data["experts"])
            norm = data.get("norm")
            if norm is not None and norm not in NORMS:
                raise ValueError(f"norm must be one of {sorted(NORMS)}, got {norm!r}")
            data["norm"] = None if norm is None else NORMS[norm]
            if "pre_norm" in data:                               # folders written before block kinds
                data["block"] = (PreNormBlock if data.pop("pre_norm") else PostNormBlock).name
            block = data.get("block", PreNormBlock.name)
            if block not in BLOCKS:
                raise ValueError(f"block must be one of {sorted(BLOCKS)}, got {block!r}")
            data["block"] = BLOCKS[block]
            return cls(**data)
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a model config ({type(e).__name__}: {e})") from None


@dataclass(frozen=True, eq=False)
class Transformer:
    """A model's parameters, checked against its :class:`ModelConfig`. Run it with :func:`forward`."""
    config: ModelConfig
    W_E: np.ndarray                       # (vocab_size, d_model) token embeddings
    blocks: tuple[Block, ...]             # n_layers, each of the config's block kind
    W_P: np.ndarray | None = None         # (n_ctx, d_model) with learned positions
    W_T: np.ndarray | None = None         # (n_types, d_model) token types (segments)
    ln_embed: LayerNorm | None = None     # on the embeddings (BERT)
    ln_final: LayerNorm | RMSNorm | None = None   # before the logits (pre-norm models)
    W_U: np.ndarray | None = None         # (d_model, vocab_size), untied unembedding
    b_U: np.ndarray | None = None         # (vocab_size,)
    name: str = ""                        # where it was loaded from ("minilm", a folder): shown, never tested

    def __post_init__(self):
        c = model_config(self.config)
        object.__setattr__(self, "blocks", tuple(self.blocks))
        if len(self.blocks) != c.n_layers:
            raise ValueError(f"the config has n_layers {c.n_layers}, got {len(self.blocks)} blocks")
        untied = c.has_logits and not c.tied_embeddings
        expected = {"W_E": (c.vocab_size, c.d_model),
                    "W_P": (c.n_ctx, c.d_model) if c.attention.positions.has_table else None,
                    "W_T": (c.n_types, c.d_model) if c.n_types else None,
                    "W_U": (c.d_model, c.vocab_size) if untied else None,
                    "b_U": (c.vocab_size,) if untied else None}
        for name, shape in expected.items():
            if getattr(self, name) is not None:
                object.__setattr__(self, name, as_weight(name, getattr(self, name)))
            got = None if getattr(self, name) is None else getattr(self, name).shape
            if got != shape:
                raise ValueError(f"{name} has shape {got}, the config (vocab_size {c.vocab_size}, d_model "
                                 f"{c.d_model}, n_ctx {c.n_ctx}, {c.attention.positions.name} positions) asks for "
                                 f"{shape}")
        # the unembedding (W_U, or W_Eᵀ when tied) in the layout x @ W streams fastest (attnlab.kernels.matmul;
        # a row lookup W_E[ids] does not mind either layout)
        if c.tied_embeddings and c.has_logits and isinstance(self.W_E, np.ndarray):
            object.__setattr__(self, "W_E", streamed(self.W_E.T).T)        # (vocab, d_model)
        elif self.W_U is not None:
            object.__setattr__(self, "W_U", streamed(self.W_U))             # (d_model, vocab)
        for name, want in (("ln_embed", c.embed_norm), ("ln_final", c.final_norm)):
            _check_norm(name, getattr(self, name), want, c)
        for i, b in enumerate(self.blocks):
            if not isinstance(b, c.block):
                raise TypeError(f"blocks[{i}] must be a {c.block.__name__} (the config's block), got "
                                f"{type(b).__name__}")
            problems = b.problems(c.at_layer(i), c.layer_attention(i))
            if problems:
                raise ValueError(f"blocks[{i}].{problems[0]} (d_model {c.d_model}, d_mlp {c.d_mlp}, norm "
                                 f"{None if c.norm is None else c.norm.__name__}, mlp {c.mlp!r})")

    @classmethod
    def init(cls, config: ModelConfig, *, rng: np.random.Generator, std: float = 0.02,
             dtype=np.float32) -> "Transformer":
        """Random weights from N(0, std²) as GPT-2 initialises them; zero biases, norms the identity."""
        c, rng = model_config(config), check_rng(rng)
        draw = lambda *shape: rng.normal(0.0, std, shape).astype(dtype)   # noqa: E731
        norm = (lambda: c.norm.init(c.d_model, c.norm_eps, dtype)) if c.norm else (lambda: None)   # noqa: E731
        blocks = tuple(c.block.init(c.at_layer(i), c.layer_attention(i), rng=rng, std=std, dtype=dtype) for i in range(c.n_layers))
        W_E = draw(c.vocab_size, c.d_model)                        # drawn after the blocks, as attnlab always has
        W_P = draw(c.n_ctx, c.d_model) if c.attention.positions.has_table else None
        untied = c.has_logits and not c.tied_embeddings
        return cls(config=c, W_E=W_E, blocks=blocks, W_P=W_P,
                   W_T=draw(c.n_types, c.d_model) if c.n_types else None,
                   ln_embed=norm() if c.embed_norm else None, ln_final=norm() if c.final_norm else None,
                   W_U=draw(c.d_model, c.vocab_size) if untied else None,
                   b_U=np.zeros(c.vocab_size, dtype) if untied else None)

    @property
    def dtype(self) -> np.dtype:
        return self.W_E.dtype

    @property
    def n_params(self) -> int:
        return sum(a.size for a in self.params().values())

    def params(self) -> dict[str, np.ndarray]:
        """Every array by name ("W_E", "blocks.0.attn.W_Q", "blocks.0.ln_1.weight", …): the arrays
        themselves, not copies, so an optimizer can update them in place."""
        out = {"W_E": self.W_E}
        for name in ("W_P", "W_T"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.ln_embed is not None:
            out.update({f"ln_embed.{k}": v for k, v in self.ln_embed.params().items()})
        for i, b in enumerate(self.blocks):
            out.update({f"blocks.{i}.{k}": v for k, v in b.params().items()})
        if self.ln_final is not None:
            out.update({f"ln_final.{k}": v for k, v in self.ln_final.params().items()})
        for name in ("W_U", "b_U"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_params(cls, config: ModelConfig, params: dict) -> "Transformer":
        """The inverse of :meth:`params`: refuses missing or extra names, and shapes the config does not ask for."""
        c = model_config(config)
        template = param_names(c)
        if set(params) != set(template):
            missing, extra = sorted(set(template) - set(params)), sorted(set(params) - set(template))
            raise ValueError(f"the weights do not fit the config: missing {missing}, extra {extra}")
        p = params
        norm = lambda prefix: c.norm(*(p[f"{prefix}.{k}"] for k in c.norm.PARAMS), c.norm_eps)   # noqa: E731
        blocks = [c.block.from_params(c.at_layer(i), c.layer_attention(i), {k[len(f"blocks.{i}."):]: v for k, v in p.items()
                                                                 if k.startswith(f"blocks.{i}.")})
                  for i in range(c.n_layers)]
        return cls(config=c, W_E=p["W_E"], blocks=blocks, W_P=p.get("W_P"), W_T=p.get("W_T"),
                   ln_embed=norm("ln_embed") if c.embed_norm else None,
                   ln_final=norm("ln_final") if c.final_norm else None, W_U=p.get("W_U"), b_U=p.get("b_U"))


def model_config(config) -> ModelConfig:
    """``config`` if it is a ModelConfig, else a TypeError."""
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
    return config


def param_names(config: ModelConfig) -> list[str]:
    """The names :meth:`Transformer.params` uses for a model of this config, in order."""
    c = config
    norm = lambda prefix: [f"{prefix}.{k}" for k in c.norm.PARAMS] if c.norm else []   # noqa: E731
    names = ["W_E"] + ["W_P"] * c.attention.positions.has_table + ["W_T"] * (c.n_types > 0)
    names += norm("ln_embed") if c.embed_norm else []
    for i in range(c.n_layers):
        names += [f"blocks.{i}.{k}" for k in c.block.param_names(c.at_layer(i), c.layer_attention(i))]
    names += norm("ln_final") if c.final_norm else []
    return names + (["W_U", "b_U"] if c.has_logits and not c.tied_embeddings else [])


def _check_norm(name: str, norm, wanted: bool, c: ModelConfig) -> None:
    if not wanted:
        if norm is not None:
            raise ValueError(f"{name} must be None: the config has no norm there")
        return
    if not isinstance(norm, c.norm) or norm.weight.shape != (c.d_model,):
        got = type(norm).__name__ if not isinstance(norm, c.norm) else f"weight {norm.weight.shape}"
        raise ValueError(f"{name} must be a {c.norm.__name__} of width d_model {c.d_model}, got {got}")


@dataclass(frozen=True, eq=False)
class ModelOutput:
    """A forward pass's results for ids (..., n).

    ``hidden_states[0]`` is the embedding output and ``hidden_states[i]`` the output of block i (with a final
    norm, the last one has it applied, as transformers returns it); each (..., n, d_model). ``attentions``
    holds one (..., n_heads, n, n_k) array per layer when the pass was asked for them
    (``return_weights=True``), else None. ``logits`` (..., n, vocab_size) is None for an encoder.
    """
    logits: np.ndarray | None
    hidden_states: list
    attentions: list | None = None
    batch: object | None = None     # the padding (attnlab.stack.batch.Batch) when a list of prompts ran


def check_ids(model: Transformer, ids, *, start: int = 0, name: str = "ids") -> np.ndarray:
    """``ids`` as int64 token ids (..., n) of the vocabulary, at least one token, fitting the position table
    after the ``start`` tokens already processed (a KV cache)."""
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be an attnlab.stack.transformer.Transformer, got {type(model).__name__}")
    arr = as_token_ids(name, ids, model.config.vocab_size)
    if arr.ndim == 0 or arr.shape[-1] == 0:
        raise ValueError(f"{name} must hold at least one token id (..., n), got shape {arr.shape}")
    n_ctx = model.config.n_ctx
    if model.config.attention.positions.has_table and start + arr.shape[-1] > n_ctx:
        already = f" after {start} already processed" if start else ""
        raise ValueError(f"{name} has {arr.shape[-1]} tokens{already}, but the model has only {n_ctx} positions "
                         f"(n_ctx, the rows of its position table); shorten the text")
    return arr


def type_ids(model: Transformer, ids: np.ndarray, token_types) -> np.ndarray | None:
    """The token types (..., n) of a model with a token-type table (all 0 when none are given), else None;
    token types given to a model without the table are refused."""
    if model.W_T is None:
        if token_types is not None:
            raise ValueError("token_types given, but the model has no token-type table (n_types 0)")
        return None
    c = model.config
    types = np.zeros_like(ids) if token_types is None else as_token_ids("token_types", token_types, c.n_types)
    if types.shape != ids.shape:
        raise ValueError(f"token_types must have shape {ids.shape} like ids, got {types.shape}")
    return types                                                        # (..., n)


def embed(model: Transformer, ids: np.ndarray, *, start: int = 0, token_types=None, hook=NO_HOOKS,
          position_ids=None, tape: Tape | None = None) -> np.ndarray:
    """The first block's input (..., n, d_model): token rows (``hook_embed``) times ``embed_scale``, plus position
    rows (learned or sinusoidal, ``hook_pos_embed``) at start, start + 1, … (or at ``position_ids`` (..., n), a
    padded batch's), plus token-type rows, normalised where the model says so. With a ``tape`` (the whole
    pass's), keeps what :func:`embed_backward` needs under "embed" (and the norm's under "ln_embed")."""
    c, n = model.config, ids.shape[-1]
    x = hook("hook_embed", model.W_E[ids])                              # (..., n, d_model)
    if c.embed_scale != 1.0:
        x = x * x.dtype.type(c.embed_scale)                             # (..., n, d_model) Gemma's √d_model
    pos = c.attention.positions.embed(model.W_P, n, start=start, d_model=c.d_model, dtype=model.dtype)
    if pos is not None and position_ids is not None:
        pos = pos[position_ids]                                         # (..., n, d_model) each row its own
    if pos is not None:
        x = x + hook("hook_pos_embed", pos)                             # (..., n, d_model)
    types = type_ids(model, ids, token_types)                            # (..., n) or None
    if types is not None:
        x = x + model.W_T[types]                                        # (..., n, d_model)
    if tape is not None:
        tape.scoped("embed").keep(SavedEmbedding(ids=ids, types=types, start=start, position_ids=position_ids))
    if model.ln_embed is not None:
        x = model.ln_embed(x, hook.scoped("ln_embed."), None if tape is None else tape.scoped("ln_embed"))
    return x


@dataclass(frozen=True, eq=False)
class SavedEmbedding:
    """What :func:`embed` keeps for :func:`embed_backward`: which rows it read."""
    ids: np.ndarray                  # (..., n)
    types: np.ndarray | None         # (..., n) token types, with a token-type table
    start: int                       # the first position
    position_ids: np.ndarray | None  # (..., n) a padded batch's positions (from start), or None: start, start + 1, …


def embed_backward(model: Transformer, tape: Tape, dx: np.ndarray):
    """Backward of :func:`embed` from what it kept on ``tape`` (the whole pass's): ``(grads, named)``, grads
    dL/dW_E (a row per token id, summed over its uses), dL/dW_P, dL/dW_T and the embedding norm's, by the names
    of :meth:`Transformer.params`, named the gradients at ``hook_embed``, ``hook_pos_embed`` and the norm's
    points, from dL/dx (..., n, d_model)."""
    saved, d, grads, named = tape["embed"], model.config.d_model, {}, {}
    if model.ln_embed is not None:
        # forward: x = ln_embed(x)
        dx, g, points = model.ln_embed.backward_named(tape["ln_embed"], dx)   # (..., n, d_model)
        grads.update({f"ln_embed.{k}": v for k, v in g.items()})
        named.update({f"ln_embed.{k}": v for k, v in points.items()})
    # forward: x = hook_embed · embed_scale + hook_pos_embed (+ W_T[types])
    scale = model.config.embed_scale
    named["hook_embed"] = d_rows = dx if scale == 1.0 else dx * dx.dtype.type(scale)   # (..., n, d_model)
    if model.config.attention.positions.adds_rows:
        lead = tuple(range(dx.ndim - 2)) if saved.position_ids is None else ()
        named["hook_pos_embed"] = dx.sum(lead) if lead else dx          # (n, d_model) or (..., n, d_model)
    # forward: hook_embed = W_E[ids]: each id's row gathers the gradient of every place it was read
    rows = dx.reshape(-1, d)                                            # (N, d_model)
    grads["W_E"] = np.zeros_like(model.W_E)                             # (vocab, d_model)
    np.add.at(grads["W_E"], saved.ids.reshape(-1), d_rows.reshape(-1, d))
    if model.W_P is not None:
        n = saved.ids.shape[-1]
        grads["W_P"] = np.zeros_like(model.W_P)                         # (n_ctx, d_model)
        if saved.position_ids is None:
            # forward: x += W_P[start … start + n − 1], the same rows for every sequence of the batch
            grads["W_P"][saved.start:saved.start + n] = dx.reshape(-1, n, d).sum(0)   # (n, d_model)
        else:
            # forward: x += W_P[start + position_ids], each row's own
            np.add.at(grads["W_P"], saved.start + saved.position_ids.reshape(-1), rows)
    if model.W_T is not None:
        # forward: x += W_T[types]
        grads["W_T"] = np.zeros_like(model.W_T)                         # (n_types, d_model)
        np.add.at(grads["W_T"], saved.types.reshape(-1), rows)
    return grads, named


def hook_names(model: Transformer) -> list[str]:
    """Every name ``model`` has an activation for, in the order the forward pass reaches them (see
    :mod:`attnlab.stack.hooks`)."""
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a Transformer, got {type(model).__name__}")
    c = model.config
    names = ["hook_embed"] + ["hook_pos_embed"] * c.attention.positions.adds_rows
    names += [f"ln_embed.{h}" for h in model.ln_embed.HOOKS] if model.ln_embed is not None else []
    for i in range(c.n_layers):
        names += [f"blocks.{i}.{h}" for h in c.block.hook_names(c.at_layer(i), c.layer_attention(i))]
    names += [f"ln_final.{h}" for h in model.ln_final.HOOKS] if model.ln_final is not None else []
    return names + ["hook_unembed"] * c.has_logits


def forward(model: Transformer, ids, *, caches: list[KVCache] | None = None, token_types=None, hooks=None,
            return_weights: bool = False, attention_mask=None, logits_to_keep: int = 0,
            tape: Tape | None = None) -> ModelOutput:
    """Token ids (..., n) through the whole model: a :class:`ModelOutput`.

    Parameters
    ----------
    model : Transformer
    ids : int array (..., n)
        Token ids; leading axes are a batch.
    caches : list of KVCache, optional
        One per layer (:func:`new_caches`): the ids continue the tokens already cached, take the next
        positions, append their keys and values, and attend to all n_k tokens so far. Decoders only.
    token_types : int array (..., n), optional
        Segment ids, for models with a token-type table (BERT); default all 0.
    hooks : dict, optional
        Named activations {name: fn} (see :mod:`attnlab.stack.hooks` and :func:`hook_names`): each
        ``fn(array, name)`` sees that activation and returns a replacement of the same shape, or None.
    return_weights : bool
        Also return every layer's attention weights (..., n_heads, n, n_k), read at each layer's
        ``attn.hook_pattern`` (after any hook there). Without them (and without hooks on the scores or the
        pattern) a long input takes attention's tiled path, which never builds the (n, n_k) grids.
    attention_mask : bool array (..., n), optional
        A padded batch (:func:`attnlab.stack.batch.pad_prompts`): True at a prompt's own tokens. Padded keys
        get weight 0 in every head; each row's positions count from its first real token (the learned and
        sinusoidal rows it adds, the angles RoPE turns its q and k by; ALiBi sees only offsets), so each row's
        activations are its prompt's alone.
        A query with no real key before it (left padding) outputs 0. Not with caches.
    logits_to_keep : int
        The logits of the last ``logits_to_keep`` positions only, (..., logits_to_keep, vocab), as transformers'
        argument of that name; 0 (the default) keeps all n. A prompt before generation needs only its last
        position's: the others would cost a (n, d_model) × (d_model, vocab) product (for SmolLM2 at n = 512, a
        fifth of the prefill's arithmetic).
    tape : Tape, optional
        An empty :class:`~attnlab.layer.tape.Tape`: the same pass also keeps, piece by piece, what its backward
        needs (:func:`attnlab.stack.backward.backward`): training, attribution and gradients at hook points run
        this forward. Not with caches.

    Raises
    ------
    ValueError, TypeError
        Ids outside the vocabulary or past the position table, caches that do not fit the model, hooks
        on names the model does not have.
    """
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a Transformer (from attnlab.models.load_model or Transformer.init), "
                        f"got {type(model).__name__}")
    return_weights = check_flag("return_weights", return_weights)
    if isinstance(logits_to_keep, bool) or not isinstance(logits_to_keep, (int, np.integer)) or logits_to_keep < 0:
        raise ValueError(f"logits_to_keep must be an int >= 0 (0 = every position's), got {logits_to_keep!r}")
    c = model.config
    fns, weights = ({} if hooks is None else hooks), [None] * c.n_layers
    if return_weights:                                                  # the weights come through hook_pattern
        fns = dict(fns, **{f"blocks.{i}.attn.hook_pattern": _keeping(fns.get(f"blocks.{i}.attn.hook_pattern"),
                                                                     weights, i) for i in range(c.n_layers)})
    h = NO_HOOKS if isinstance(fns, dict) and not fns else Hooks(hook_names(model), fns)   # Hooks checks fns
    check_tape(tape, caches)
    start = check_caches(model, caches)
    ids = check_ids(model, ids, start=start)                            # (..., n)
    keys, position_ids = padding(attention_mask, ids, caches)           # (..., 1, 1, n), (..., n) or None
    x = embed(model, ids, start=start, token_types=token_types, hook=h, position_ids=position_ids, tape=tape)
    hidden = [x]                                                        # (..., n, d_model)
    # each attention path chosen once for the whole pass (one_step), and BLAS's threads by the pass's rows
    with one_step(pass_scores(model, ids.shape, start)), blas_threads_for(ids.size):
        for i, (block, cache) in enumerate(zip(model.blocks, caches or itertools.repeat(None))):
            x = block.forward(x, NO_HOOKS if h is NO_HOOKS else h.scoped(f"blocks.{i}."), is_causal=c.is_causal,
                              cache=cache, mask=keys, tape=None if tape is None else tape.scoped(f"blocks.{i}."),
                              positions=position_ids)
            hidden.append(x)
        if model.ln_final is not None:
            x = model.ln_final(x, h.scoped("ln_final."), None if tape is None else tape.scoped("ln_final"))
            hidden[-1] = x                                              # as transformers returns it
        kept = x[..., -logits_to_keep:, :] if logits_to_keep else x      # (..., k, d_model) the rows to unembed
        logits = h("hook_unembed", logits_of(model, kept, tape)) if c.has_logits else None   # (..., k, vocab)
    attentions = [a.astype(x.dtype, copy=False) for a in weights] if return_weights else None
    return ModelOutput(logits=logits, hidden_states=hidden, attentions=attentions)


def forward_from(model: Transformer, resid, layer: int, *, hooks=None, attention_mask=None,
                 logits_to_keep: int = 0) -> ModelOutput:
    """The rest of a pass from block ``layer`` on: ``resid`` (..., n, d_model) is the residual stream into that
    block (its ``hook_resid_pre``, as :func:`attnlab.stack.hooks.run_with_cache` records it; with ``layer`` =
    n_layers, the last block's ``hook_resid_post``), run through blocks ``layer`` … n_layers − 1, the final
    norm and the logits as :func:`forward` runs them. What a sweep of interventions at or after a layer
    shares, the blocks below it, is then run once (:mod:`attnlab.interpret.sweeps`).

    ``hooks`` as :func:`forward` takes them, on points of blocks ``layer`` and after (or the final norm);
    ``attention_mask`` (n,) or (..., n) broadcasting to resid's leading axes: a padded batch's real tokens.
    Leading axes of ``resid`` beyond the mask's are a batch of runs sharing it. ``hidden_states`` holds
    ``resid`` and each later block's output. Decoders and encoders alike; no caches.
    """
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a Transformer, got {type(model).__name__}")
    c = model.config
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer <= c.n_layers:
        raise ValueError(f"layer must be an int in [0, {c.n_layers}] (the block to start at), got {layer!r}")
    x = np.ascontiguousarray(resid)          # (..., n, d_model) a broadcast view copied: ops keep C order
    if x.ndim < 2 or x.shape[-1] != c.d_model or x.dtype != model.dtype:
        raise ValueError(f"resid must be a residual stream (..., n, d_model = {c.d_model}) of the model's dtype "
                         f"{model.dtype}, got {x.dtype} {x.shape}")
    fns = {} if hooks is None else hooks
    h = NO_HOOKS if isinstance(fns, dict) and not fns else Hooks(hook_names(model), fns)   # Hooks checks fns
    early = [name for name in fns if _layer_of(name, c.n_layers) < layer]
    if early:
        raise ValueError(f"hooks has {early[0]!r}, before block {layer} where this pass starts: it would never run")
    keys = None
    if attention_mask is not None:
        m = np.asarray(attention_mask)
        if m.dtype != np.bool_ or m.shape[-1] != x.shape[-2] or m.ndim > x.ndim - 1:
            raise ValueError(f"attention_mask must be a bool array (..., n = {x.shape[-2]}) broadcasting to resid's "
                             f"{x.shape[:-1]}, got {m.dtype} {m.shape}")
        keys = m[..., None, None, :]                                    # (..., 1, 1, n)
    hidden = [x]
    # the pass's kernels and BLAS threads as forward counts them
    with one_step(pass_scores(model, x.shape[:-1])), blas_threads_for(x.size // c.d_model):
        for i in range(layer, c.n_layers):
            x = model.blocks[i].forward(x, h.scoped(f"blocks.{i}."), is_causal=c.is_causal, cache=None, mask=keys)
            hidden.append(x)                                            # (..., n, d_model)
        if model.ln_final is not None:
            x = model.ln_final(x, h.scoped("ln_final."))                # (..., n, d_model)
            hidden[-1] = x
        kept = x[..., -logits_to_keep:, :] if logits_to_keep else x      # (..., k, d_model)
        logits = logits_of(model, kept) if c.has_logits else None       # (..., k, vocab)
    return ModelOutput(logits=logits, hidden_states=hidden)


def pass_scores(model: Transformer, shape: tuple, start: int = 0) -> int:
    """The attention scores a whole pass of ``model`` computes over tokens of ``shape`` (..., n) after ``start``
    cached ones: every layer's batch · heads · n · (start + n), a Python int. The fused kernels' size rule counts
    them (:func:`attnlab.kernels._step.one_step`): the same for every pass over these shapes, whichever layer it
    starts at, so a pass from a layer on (:func:`forward_from`) runs the kernels :func:`forward` ran."""
    c = model.config
    *lead, n = shape                                                    # (..., n)
    heads = sum(c.layer_attention(i).n_heads for i in range(c.n_layers))
    return int(np.prod(lead, dtype=np.int64)) * heads * n * (start + n)


def _layer_of(name: str, n_layers: int) -> int:
    """The block a hook name belongs to: i for ``blocks.{i}.…``, −1 before the blocks, n_layers after them."""
    if name.startswith("blocks."):
        return int(name.split(".")[1])
    return n_layers if name.startswith("ln_final.") else -1


def padding(attention_mask, ids: np.ndarray, caches) -> tuple[np.ndarray | None, np.ndarray | None]:
    """A padded batch's key mask (..., 1, 1, n) for every head and query, and each row's position ids (..., n)
    (0 at its first real token; pads before it 0 too); (None, None) without a mask."""
    if attention_mask is None:
        return None, None
    m = np.asarray(attention_mask)
    if m.dtype != np.bool_ or m.shape != ids.shape:
        raise ValueError(f"attention_mask must be a bool array shaped like ids {ids.shape} (True = a real token), "
                         f"got {m.dtype} {m.shape}")
    if caches is not None:
        raise ValueError("attention_mask is for one pass over a padded batch, not with caches")
    if not m.any(-1).all():
        raise ValueError("attention_mask has a row with no real token")
    return m[..., None, None, :], np.maximum(np.cumsum(m, -1) - 1, 0)


def check_tape(tape, caches) -> None:
    if tape is not None and not isinstance(tape, Tape):
        raise TypeError(f"tape must be an attnlab.layer.tape.Tape (empty, one per pass), got {type(tape).__name__}")
    if tape is not None and caches is not None:
        raise ValueError("tape is for one pass without caches (a training step's), got both")


@dataclass(frozen=True, eq=False)
class SavedLogits:
    """What :func:`logits_of` keeps for :func:`logits_backward`."""
    x: np.ndarray                    # (..., k, d_model) the rows unembedded
    capped: np.ndarray | None        # (..., k, vocab) the soft-capped logits, with a cap


def logits_of(model: Transformer, x: np.ndarray, tape: Tape | None = None) -> np.ndarray:
    """The logits (..., vocab) of the last stream x (..., d_model), after the final norm: ``x W_U + b_U``, or
    ``x W_Eᵀ`` without W_U (tied embeddings; an encoder without a head is scored against its word embeddings,
    as BertForMaskedLM's decoder is tied to them), soft-capped where the config says (Gemma-2's
    final_logit_softcapping). With a ``tape`` (the whole pass's), keeps what :func:`logits_backward` needs
    under "unembed"."""
    c = model.config
    logits = linear(x, model.W_E.T) if model.W_U is None else linear(x, model.W_U) + model.b_U   # (..., vocab)
    logits = cap_scores(logits, c.logit_softcap)                        # (..., vocab) in place: a fresh array
    if tape is not None:
        tape.scoped("unembed").keep(SavedLogits(x=x, capped=None if c.logit_softcap is None else logits.copy()))
    return logits


def logits_backward(model: Transformer, tape: Tape, dlogits: np.ndarray):
    """Backward of :func:`logits_of` from what it kept on ``tape``: ``(dx, grads)`` from dL/dlogits (..., k, vocab),
    grads holding dL/dW_U and dL/db_U, or the unembedding's part of dL/dW_E when there is no W_U (the
    embedding adds its own)."""
    saved, c = tape["unembed"], model.config
    x, V, d = saved.x, c.vocab_size, c.d_model
    if saved.capped is not None:
        # forward: logits = cap · tanh(z / cap), so dz = dlogits · (1 − tanh²)
        dlogits = dlogits * cap_slope(saved.capped, c.logit_softcap)    # (..., k, vocab)
    dlogits2 = dlogits.reshape(-1, V)                                   # (N, vocab)
    if model.W_U is not None:
        # forward: z = x @ W_U + b_U
        grads = {"W_U": x.reshape(-1, d).T @ dlogits2, "b_U": dlogits2.sum(0)}   # (d_model, vocab), (vocab,)
        return dlogits @ model.W_U.T, grads                             # (..., k, d_model)
    # forward: z = x @ W_Eᵀ
    return dlogits @ model.W_E, {"W_E": dlogits2.T @ x.reshape(-1, d)}   # (..., k, d_model), (vocab, d_model)


def _keeping(fn, weights: list, i: int):
    """A hook on layer i's pattern that runs ``fn`` (a user's hook, or None) and keeps what the pass goes on
    with in ``weights[i]``."""
    def keep(a, name):
        out = a if fn is None else fn(a, name)
        weights[i] = a if out is None else np.asarray(out)
        return out
    return keep


def check_caches(model: Transformer, caches) -> int:
    """How many tokens the caches already hold (0 without caches); one cache per layer, all in step."""
    if caches is None:
        return 0
    if not model.config.is_causal:
        raise ValueError("caches are for decoders: this model is an encoder (is_causal=False), every token "
                         "sees the ones after it")
    if not isinstance(caches, (tuple, list)) or not all(isinstance(c, KVCache) for c in caches):
        raise TypeError("caches must be a list of KVCache, one per layer (see new_caches)")
    if len(caches) != model.config.n_layers:
        raise ValueError(f"caches must hold one KVCache per layer ({model.config.n_layers}), got {len(caches)}")
    lengths = {c.length for c in caches}
    if len(lengths) != 1:
        raise ValueError(f"caches must all hold the same number of tokens, got lengths {sorted(lengths)}")
    return lengths.pop()


def new_caches(model: Transformer, capacity: int, *, batch_shape: tuple = (), kv_dtype=None) -> list[KVCache]:
    """One empty KV cache per layer, each with room for ``capacity`` tokens of its n_kv_heads key/value heads
    (at most n_ctx with a learned position table), holding ``kv_dtype``: None for the rule
    (:func:`attnlab.layer.cache.kv_dtype_rule`: float16 under 8-bit activations, as llama.cpp keeps its cache,
    else the model's dtype), or float16 / the model's dtype."""
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a Transformer, got {type(model).__name__}")
    capacity = as_positive_int("capacity", capacity)
    c = model.config
    if not c.is_causal:
        raise ValueError("caches are for decoders: this model is an encoder (is_causal=False)")
    if c.attention.positions.has_table and capacity > c.n_ctx:
        raise ValueError(f"capacity must be at most the model's n_ctx={c.n_ctx} (the rows of its position "
                         f"table), got {capacity}")
    return [b.attn.new_cache(capacity, batch_shape=batch_shape, kv_dtype=kv_dtype) for b in model.blocks]


def check_decoder(model: Transformer, what: str) -> None:
    """``what`` needs next-token logits: a causal model with an unembedding; an error naming the model and why."""
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a Transformer, got {type(model).__name__}")
    c = model.config
    why = [w for w, bad in (("is_causal False: every token sees both sides, bidirectional", not c.is_causal),
                            ("no logits: no language-model head to predict a next token", not c.has_logits)) if bad]
    if why:
        raise ValueError(f"{what} needs a decoder (GPT-2, Llama, Mistral, Qwen2 or attnlab's own LM); "
                         f"{model.name or 'this model'} is a {c.family or 'model'} encoder ({'; '.join(why)})")


def generate(model: Transformer, ids, n_new: int, *, temperature: float = 0.0,
             rng: np.random.Generator | None = None, stop=None, top_k: int | None = None,
             top_p: float | None = None, on_token=None, caches: list[KVCache] | None = None) -> np.ndarray:
    """``n_new`` token ids (n_new,) after the prompt ``ids`` (n,): greedy (``temperature=0``) or sampled from
    softmax(logits / temperature) with ``rng``, cut to the ``top_k`` tokens and the ``top_p`` nucleus
    (:func:`attnlab.stack.sampling.sample_next`).

    ``stop`` (a token id or a collection of ids, e.g. ``model.config.eos_ids``) ends generation at the first
    of them produced; it is the last of the returned ids (m,), m <= n_new, as in transformers' ``generate``
    with ``eos_token_id``. None (or an empty collection) runs all n_new tokens. ``on_token(id)`` is called
    with each new id as soon as it is chosen (streaming).

    The prompt runs once; each new token is then one decode step against the layers' KV caches. The model
    sees at most n_ctx tokens, as in training: when the caches are full they are emptied and the last
    n_ctx / 2 tokens are read again in one pass, then decoding goes on. With ``caches`` given (a
    conversation), ``ids`` continue the tokens they hold, and the last returned id is not yet in them;
    when they are full it is an error, since the tokens before them are not at hand to read again, unless
    the caches drop tokens by a policy of their own (``make_room``: a sink + window cache,
    :class:`attnlab.layer.streaming.StreamingCache`), which lets generation go on past them.

    Raises
    ------
    ValueError, TypeError
        An encoder, a prompt that is not 1-D or does not fit n_ctx, ``n_new`` not a positive int, a bad
        temperature, top_k or top_p, no ``rng`` when sampling, a ``stop`` that is not token ids of the
        vocabulary, caches without room for the prompt.
    """
    check_decoder(model, "generate")
    c = model.config
    ids = as_token_ids("ids", ids, c.vocab_size)
    if ids.ndim != 1 or ids.size == 0:
        raise ValueError(f"ids must be a 1-D prompt of at least one token, got shape {ids.shape}")
    start = check_caches(model, caches)
    if start + ids.size > (c.n_ctx if caches is None else caches[0].capacity):
        room = c.n_ctx if caches is None else f"the caches' capacity {caches[0].capacity} ({start} held)"
        raise ValueError(f"the prompt has {ids.size} tokens, more than the model's context n_ctx {room}")
    n_new = as_positive_int("n_new", n_new)
    temperature = check_temperature(temperature)
    if temperature > 0 and not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator when temperature > 0, got {type(rng).__name__}")
    top_k, top_p = check_top(top_k, top_p, c.vocab_size)
    stop = as_stop_ids("stop", () if stop is None else stop, c.vocab_size)     # (k,)
    tokens = np.concatenate([ids, np.empty(n_new, np.int64)])                 # (n + n_new,)
    given = caches is not None
    capacity = caches[0].capacity if given else min(c.n_ctx, tokens.size - 1)
    caches = caches if given else new_caches(model, capacity)
    logits = forward(model, ids, caches=caches, logits_to_keep=1).logits[-1]  # (vocab,) after the whole prompt
    for t in range(ids.size, tokens.size):
        tokens[t] = sample_next(logits, temperature, rng, top_k=top_k, top_p=top_p)
        if on_token is not None:
            on_token(int(tokens[t]))
        if tokens[t] in stop:
            return tokens[ids.size:t + 1]                                      # (m,) ending with the stop id
        if t + 1 == tokens.size:
            break
        if not all([cache.make_room(1) for cache in caches]):                # full: re-read the recent half
            if given:
                raise ValueError(f"the caches are full ({capacity} tokens, the context): the conversation is "
                                 "longer than the model can see")
            for cache in caches:
                cache.reset()
            logits = forward(model, tokens[t + 1 - max(1, c.n_ctx // 2):t + 1], caches=caches,
                             logits_to_keep=1).logits[-1]
        else:
            logits = forward(model, tokens[t:t + 1], caches=caches).logits[-1]   # (vocab,) one decode step
    return tokens[ids.size:]
