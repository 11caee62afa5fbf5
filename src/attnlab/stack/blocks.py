"""Block kinds: how a block wires its attention, its MLP and its norms, each kind one small class.

Every kind's ``forward`` is its residual lines, as nanoGPT's ``Block`` is::

    PreNormBlock   (GPT-2, Llama)    x = x + attn(ln_1(x));           x = x + mlp(ln_2(x))
    PostNormBlock  (BERT)            x = ln_1(x + attn(x));           x = ln_2(x + mlp(x))
    ParallelBlock  (GPT-NeoX, GPT-J) x = x + attn(ln_1(x)) + mlp(ln_2(x))
    SandwichBlock  (Gemma-2)         x = x + ln_1_post(attn(ln_1(x))); x = x + ln_2_post(mlp(ln_2(x)))

A block's fields are its parts (an attention layer, norms, an MLP; a norm or the MLP may be None). What a
field holds for a model is a :class:`Slot`: its class, its arrays' shapes, how to build it from arrays and
how to draw it at random. :meth:`Block.slots` states a kind's slots once; the parameter tree (``params``,
``param_names``, ``from_params``, ``init`` and the shape checks of :class:`~attnlab.stack.transformer.Transformer`)
walks them, and the hook names too. A new kind is one more class here, registered in :data:`BLOCKS`.

Each kind's backward sits beside its forward (llm.c's pairs): ``forward_saved`` runs the residual lines
without hooks or a cache and keeps each part's saved forward (the parts' own ``forward``/``backward``
pairs, :mod:`attnlab.stack.layers` and :func:`attnlab.layer.multihead.multihead_attention_forward`);
``backward`` undoes them line by line, bottom to top, and records the gradient at each named point it
passes (the hook names, block-relative) for attribution patching.

Hooks are at the same named points in every kind (see :mod:`attnlab.stack.hooks`): ``hook_resid_pre``,
the parts' own (``ln_1.hook_scale``, ``attn.hook_q``, ``mlp.hook_pre``, …), ``hook_attn_out`` and
``hook_mlp_out`` (what each sublayer adds to the stream), ``hook_resid_mid`` (the stream between the two
sublayers; a parallel block has none) and ``hook_resid_post``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

import numpy as np

from ..layer.config import AttentionConfig
from ..layer.hookpoints import NO_HOOKS
from ..layer.multihead import (MultiHeadAttention, multihead_attention, multihead_attention_backward_named,
                               multihead_attention_forward, param_shapes)


@dataclass(frozen=True)
class Slot:
    """What one field of a block holds for a given model."""
    cls: type                                    # the part's class (MultiHeadAttention, LayerNorm, GatedMLP, …)
    shapes: dict                                 # array name -> shape, in the part's order
    make: Callable[[dict], object]               # arrays by name -> the part
    draw: Callable[..., object]                  # (rng, std, dtype) -> the part, drawn at random
    config: AttentionConfig | None = None        # the config an attention part must carry

    def problem(self, part) -> str | None:
        """Why ``part`` does not fit this slot, or None."""
        if not isinstance(part, self.cls):
            return f"must be a {self.cls.__name__}, got {type(part).__name__}"
        if self.config is not None and part.config != self.config:
            return f"has config {part.config}, the model's is {self.config}"
        got = {k: v.shape for k, v in part.params().items()}
        if got != self.shapes:
            return f"has shapes {got}, the config asks for {self.shapes}"
        return None


def attention_slot(a: AttentionConfig) -> Slot:
    return Slot(MultiHeadAttention, param_shapes(a), lambda p: MultiHeadAttention(**p, config=a),
                lambda rng, std, dtype: MultiHeadAttention.init(a, rng=rng, std=std, dtype=dtype), config=a)


def norm_slot(c) -> Slot | None:
    """The config's norm (d_model wide), or None for a model without norms."""
    if c.norm is None:
        return None
    return Slot(c.norm, {k: (c.d_model,) for k in c.norm.PARAMS},
                lambda p: c.norm(*(p[k] for k in c.norm.PARAMS), c.norm_eps),
                lambda rng, std, dtype: c.norm.init(c.d_model, c.norm_eps, dtype))


def mlp_slot(c) -> Slot | None:
    """The config's MLP (d_model -> d_mlp -> d_model), or None for attention-only blocks."""
    if c.d_mlp is None:
        return None
    cls = c.mlp_class
    return Slot(cls, cls.shapes(c.d_model, c.d_mlp), lambda p: cls(*(p[k] for k in cls.PARAMS), c.activation),
                lambda rng, std, dtype: cls.init(c.d_model, c.d_mlp, c.activation, rng=rng, std=std, dtype=dtype))


def _norm(norm, name: str, x: np.ndarray, hook) -> np.ndarray:
    """``norm(x)`` with its hooks, or x where the model has no norms."""
    return x if norm is None else norm(x, hook.scoped(name + "."))


# the backward's helpers: each part's forward keeps its own saved state in ``saved[field]``; its backward
# puts the part's gradients into ``grads`` ("ln_1.weight", …) and the gradients at its points into ``named``

def _keep(block, field: str, x: np.ndarray, saved: dict, **options) -> np.ndarray:
    """Part ``field`` of the block on x, its saved forward in ``saved[field]``; x itself where it is None."""
    part = getattr(block, field)
    if part is None:
        return x
    if field == "attn":
        y, saved[field] = multihead_attention_forward(part, x, **options)
    else:
        y, saved[field] = part.forward(x)
    return y


def _undo(block, field: str, saved: dict, dy: np.ndarray, grads: dict, named: dict) -> np.ndarray:
    """Backward of :func:`_keep`: dL/dx from dL/dy; dy itself where the part is None."""
    part = getattr(block, field)
    if part is None:
        return dy
    if field == "attn":
        dx, g, points = multihead_attention_backward_named(part, saved[field], dy)
        g = g.params()
        named.update({f"attn.{k}": v for k, v in points.items()})
    else:
        if field.startswith("ln"):
            named[f"{field}.hook_normalized"] = dy
        dx, g = part.backward(saved[field], dy)
    grads.update({f"{field}.{k}": v for k, v in g.items()})
    return dx


class Block:
    """What every block kind shares: the walk over its parts. Subclasses are frozen dataclasses whose
    fields are the parts, and state ``slots``, ``POINTS`` and ``forward``."""
    name = ""              # its key in BLOCKS
    final_norm = True      # the stack normalises once more before the logits (ln_final)
    POINTS: tuple = ()     # hook points in pass order: "hook_…" names, part fields, (name, the part it needs)

    @classmethod
    def slots(cls, c, a: AttentionConfig) -> dict[str, Slot | None]:
        """What each field holds for a model of config ``c`` whose layer has attention config ``a``."""
        raise NotImplementedError

    def params(self) -> dict[str, np.ndarray]:
        """Every array by name ("attn.W_Q", "ln_1.weight", …), the arrays themselves."""
        return {f"{f.name}.{k}": v for f in fields(self) if getattr(self, f.name) is not None
                for k, v in getattr(self, f.name).params().items()}

    @classmethod
    def param_names(cls, c, a: AttentionConfig) -> list[str]:
        return [f"{field}.{k}" for field, s in cls.slots(c, a).items() if s is not None for k in s.shapes]

    @classmethod
    def from_params(cls, c, a: AttentionConfig, p: dict) -> "Block":
        """The block from arrays named as :meth:`params` names them."""
        return cls(**{field: None if s is None else s.make({k: p[f"{field}.{k}"] for k in s.shapes})
                      for field, s in cls.slots(c, a).items()})

    @classmethod
    def init(cls, c, a: AttentionConfig, *, rng, std: float, dtype) -> "Block":
        """Random parts, drawn in field order."""
        return cls(**{field: None if s is None else s.draw(rng, std, dtype) for field, s in cls.slots(c, a).items()})

    def problems(self, c, a: AttentionConfig) -> list[str]:
        """What does not fit the config, one line per part ("ln_2 must be None: …")."""
        out = []
        for field, s in self.slots(c, a).items():
            part = getattr(self, field)
            if s is None and part is not None:
                out.append(f"{field} must be None: the config has none there")
            elif s is not None and (why := s.problem(part)) is not None:
                out.append(f"{field} {why}")
        return out

    @classmethod
    def hook_names(cls, c, a: AttentionConfig) -> list[str]:
        """The block's hook names (without the ``blocks.{i}.`` prefix), in the order the pass reaches them."""
        slots, names = cls.slots(c, a), []
        for point in cls.POINTS:
            if isinstance(point, tuple):                     # (name, the part it needs)
                names += [point[0]] if slots[point[1]] is not None else []
            elif point in slots:                             # a part: its own points
                names += [f"{point}.{h}" for h in slots[point].cls.HOOKS] if slots[point] is not None else []
            else:
                names.append(point)
        return names

    def attention_input(self, x: np.ndarray) -> np.ndarray:
        """What the attention of this block reads, given the block's input x (..., n, d_model)."""
        return _norm(self.ln_1, "ln_1", x, NO_HOOKS)

    def forward_saved(self, x: np.ndarray, *, is_causal: bool):
        """The block's residual lines on x (..., n, d_model) without hooks or a cache: ``(x_out, saved)``,
        saved holding each part's saved forward by field name, for :meth:`backward`."""
        raise NotImplementedError

    def backward(self, saved: dict, dx: np.ndarray):
        """Backward of :meth:`forward_saved`: ``(dx_in, grads, named)`` from dL/dx_out, grads by the names
        of :meth:`params`, named the gradients at the block's points ("hook_resid_pre", "attn.hook_z", …)."""
        raise NotImplementedError

    def attend(self, x: np.ndarray, hook, *, is_causal: bool, cache, mask=None) -> np.ndarray:
        """The attention sublayer on x (..., n, d_model), its hooks under ``attn.``; ``mask`` (B, 1, 1, n_k)
        True = a real key (a padded batch's keys), ANDed with the causal mask."""
        return multihead_attention(self.attn, x, mask=mask, is_causal=is_causal, cache=cache,
                                   hook=hook.scoped("attn."))


@dataclass(frozen=True, eq=False)
class PreNormBlock(Block):
    """GPT-2, Llama, attnlab's own LM (no norms, no MLP): each sublayer reads a normalised copy of the stream
    and adds its output back (Xiong et al., 2020)."""
    attn: MultiHeadAttention
    ln_1: object | None = None      # before the attention
    mlp: object | None = None       # an MLP or GatedMLP
    ln_2: object | None = None      # before the MLP
    name = "pre_norm"
    POINTS = ("hook_resid_pre", "ln_1", "attn", "hook_attn_out", ("hook_resid_mid", "mlp"), "ln_2", "mlp",
              ("hook_mlp_out", "mlp"), "hook_resid_post")

    @classmethod
    def slots(cls, c, a):
        return {"attn": attention_slot(a), "ln_1": norm_slot(c), "mlp": mlp_slot(c),
                "ln_2": norm_slot(c) if c.d_mlp is not None else None}

    def forward(self, x: np.ndarray, h, *, is_causal: bool, cache=None, mask=None) -> np.ndarray:
        x = h("hook_resid_pre", x)                                                         # (..., n, d_model)
        x = x + h("hook_attn_out", self.attend(_norm(self.ln_1, "ln_1", x, h), h, is_causal=is_causal, cache=cache,
                                               mask=mask))
        if self.mlp is not None:
            x = h("hook_resid_mid", x)
            x = x + h("hook_mlp_out", self.mlp(_norm(self.ln_2, "ln_2", x, h), h.scoped("mlp.")))
        return h("hook_resid_post", x)                                                     # (..., n, d_model)

    def forward_saved(self, x: np.ndarray, *, is_causal: bool):
        s = {}
        x = x + _keep(self, "attn", _keep(self, "ln_1", x, s), s, is_causal=is_causal)    # (..., n, d_model)
        if self.mlp is not None:
            x = x + _keep(self, "mlp", _keep(self, "ln_2", x, s), s)                       # (..., n, d_model)
        return x, s

    def backward(self, saved: dict, dx: np.ndarray):
        g, named = {}, {"hook_resid_post": dx}
        if self.mlp is not None:
            # forward: x = x + mlp(ln_2(x)): the residual passes dx through, the MLP adds its part
            named["hook_mlp_out"] = dx
            dx = dx + _undo(self, "ln_2", saved, _undo(self, "mlp", saved, dx, g, named), g, named)
            named["hook_resid_mid"] = dx
        # forward: x = x + attn(ln_1(x))
        named["hook_attn_out"] = dx
        dx = dx + _undo(self, "ln_1", saved, _undo(self, "attn", saved, dx, g, named), g, named)
        named["hook_resid_pre"] = dx
        return dx, g, named


@dataclass(frozen=True, eq=False)
class PostNormBlock(Block):
    """BERT, the original transformer (Vaswani et al., 2017): each sublayer's residual sum is normalised; no
    final norm."""
    attn: MultiHeadAttention
    ln_1: object | None = None      # after the attention's residual
    mlp: object | None = None
    ln_2: object | None = None      # after the MLP's residual
    name = "post_norm"
    final_norm = False
    POINTS = ("hook_resid_pre", "attn", "hook_attn_out", "ln_1", ("hook_resid_mid", "mlp"), "mlp",
              ("hook_mlp_out", "mlp"), "ln_2", "hook_resid_post")
    slots = PreNormBlock.slots

    def forward(self, x: np.ndarray, h, *, is_causal: bool, cache=None, mask=None) -> np.ndarray:
        x = h("hook_resid_pre", x)                                                         # (..., n, d_model)
        x = _norm(self.ln_1, "ln_1", x + h("hook_attn_out", self.attend(x, h, is_causal=is_causal, cache=cache,
                                                                        mask=mask)), h)
        if self.mlp is not None:
            x = h("hook_resid_mid", x)
            x = _norm(self.ln_2, "ln_2", x + h("hook_mlp_out", self.mlp(x, h.scoped("mlp."))), h)
        return h("hook_resid_post", x)                                                     # (..., n, d_model)

    def forward_saved(self, x: np.ndarray, *, is_causal: bool):
        s = {}
        x = _keep(self, "ln_1", x + _keep(self, "attn", x, s, is_causal=is_causal), s)    # (..., n, d_model)
        if self.mlp is not None:
            x = _keep(self, "ln_2", x + _keep(self, "mlp", x, s), s)                       # (..., n, d_model)
        return x, s

    def backward(self, saved: dict, dx: np.ndarray):
        g, named = {}, {"hook_resid_post": dx}
        if self.mlp is not None:
            # forward: x = ln_2(x + mlp(x))
            dx = _undo(self, "ln_2", saved, dx, g, named)
            named["hook_mlp_out"] = dx
            dx = dx + _undo(self, "mlp", saved, dx, g, named)
            named["hook_resid_mid"] = dx
        # forward: x = ln_1(x + attn(x))
        dx = _undo(self, "ln_1", saved, dx, g, named)
        named["hook_attn_out"] = dx
        dx = dx + _undo(self, "attn", saved, dx, g, named)
        named["hook_resid_pre"] = dx
        return dx, g, named

    def attention_input(self, x: np.ndarray) -> np.ndarray:
        return x


@dataclass(frozen=True, eq=False)
class ParallelBlock(Block):
    """GPT-NeoX, GPT-J (Wang & Komatsuzaki, 2021): attention and MLP read the same input, each through its
    own norm, and both add to the stream at once."""
    attn: MultiHeadAttention
    ln_1: object | None = None      # before the attention
    mlp: object | None = None
    ln_2: object | None = None      # before the MLP
    name = "parallel"
    POINTS = ("hook_resid_pre", "ln_1", "attn", "hook_attn_out", "ln_2", "mlp", ("hook_mlp_out", "mlp"),
              "hook_resid_post")
    slots = PreNormBlock.slots

    def forward(self, x: np.ndarray, h, *, is_causal: bool, cache=None, mask=None) -> np.ndarray:
        x = h("hook_resid_pre", x)                                                         # (..., n, d_model)
        y = h("hook_attn_out", self.attend(_norm(self.ln_1, "ln_1", x, h), h, is_causal=is_causal, cache=cache,
                                           mask=mask))
        if self.mlp is not None:
            y = y + h("hook_mlp_out", self.mlp(_norm(self.ln_2, "ln_2", x, h), h.scoped("mlp.")))
        return h("hook_resid_post", x + y)                                                 # (..., n, d_model)

    def forward_saved(self, x: np.ndarray, *, is_causal: bool):
        s = {}
        y = _keep(self, "attn", _keep(self, "ln_1", x, s), s, is_causal=is_causal)        # (..., n, d_model)
        if self.mlp is not None:
            y = y + _keep(self, "mlp", _keep(self, "ln_2", x, s), s)                       # (..., n, d_model)
        return x + y, s

    def backward(self, saved: dict, dx: np.ndarray):
        # forward: x = x + attn(ln_1(x)) + mlp(ln_2(x)): dx reaches all three terms
        g, named = {}, {"hook_resid_post": dx, "hook_attn_out": dx}
        dx_in = dx + _undo(self, "ln_1", saved, _undo(self, "attn", saved, dx, g, named), g, named)
        if self.mlp is not None:
            named["hook_mlp_out"] = dx
            dx_in = dx_in + _undo(self, "ln_2", saved, _undo(self, "mlp", saved, dx, g, named), g, named)
        named["hook_resid_pre"] = dx_in
        return dx_in, g, named


@dataclass(frozen=True, eq=False)
class SandwichBlock(Block):
    """Gemma-2 (Gemma Team, 2024): a norm before and after each sublayer, the output normalised before it
    joins the stream."""
    attn: MultiHeadAttention
    ln_1: object | None = None        # before the attention
    ln_1_post: object | None = None   # on the attention's output
    mlp: object | None = None
    ln_2: object | None = None        # before the MLP
    ln_2_post: object | None = None   # on the MLP's output
    name = "sandwich"
    POINTS = ("hook_resid_pre", "ln_1", "attn", "ln_1_post", "hook_attn_out", ("hook_resid_mid", "mlp"), "ln_2",
              "mlp", "ln_2_post", ("hook_mlp_out", "mlp"), "hook_resid_post")

    @classmethod
    def slots(cls, c, a):
        with_mlp = c.d_mlp is not None
        return {"attn": attention_slot(a), "ln_1": norm_slot(c), "ln_1_post": norm_slot(c), "mlp": mlp_slot(c),
                "ln_2": norm_slot(c) if with_mlp else None, "ln_2_post": norm_slot(c) if with_mlp else None}

    def forward(self, x: np.ndarray, h, *, is_causal: bool, cache=None, mask=None) -> np.ndarray:
        x = h("hook_resid_pre", x)                                                         # (..., n, d_model)
        y = self.attend(_norm(self.ln_1, "ln_1", x, h), h, is_causal=is_causal, cache=cache, mask=mask)
        x = x + h("hook_attn_out", _norm(self.ln_1_post, "ln_1_post", y, h))
        if self.mlp is not None:
            x = h("hook_resid_mid", x)
            y = self.mlp(_norm(self.ln_2, "ln_2", x, h), h.scoped("mlp."))
            x = x + h("hook_mlp_out", _norm(self.ln_2_post, "ln_2_post", y, h))
        return h("hook_resid_post", x)                                                     # (..., n, d_model)

    def forward_saved(self, x: np.ndarray, *, is_causal: bool):
        s = {}
        y = _keep(self, "attn", _keep(self, "ln_1", x, s), s, is_causal=is_causal)        # (..., n, d_model)
        x = x + _keep(self, "ln_1_post", y, s)                                             # (..., n, d_model)
        if self.mlp is not None:
            x = x + _keep(self, "ln_2_post", _keep(self, "mlp", _keep(self, "ln_2", x, s), s), s)
        return x, s

    def backward(self, saved: dict, dx: np.ndarray):
        g, named = {}, {"hook_resid_post": dx}
        if self.mlp is not None:
            # forward: x = x + ln_2_post(mlp(ln_2(x)))
            named["hook_mlp_out"] = dx
            dm = _undo(self, "mlp", saved, _undo(self, "ln_2_post", saved, dx, g, named), g, named)
            dx = dx + _undo(self, "ln_2", saved, dm, g, named)
            named["hook_resid_mid"] = dx
        # forward: x = x + ln_1_post(attn(ln_1(x)))
        named["hook_attn_out"] = dx
        dy = _undo(self, "attn", saved, _undo(self, "ln_1_post", saved, dx, g, named), g, named)
        dx = dx + _undo(self, "ln_1", saved, dy, g, named)
        named["hook_resid_pre"] = dx
        return dx, g, named


BLOCKS = {cls.name: cls for cls in (PreNormBlock, PostNormBlock, ParallelBlock, SandwichBlock)}   # name -> kind
