"""Block kinds: how a block wires its attention, its MLP and its norms, each kind one small class.

A kind states its residual lines once, as data (:class:`Line`: ``x = after(x + Σ branch(x))``, each branch a
chain of the block's parts), as nanoGPT's ``Block`` writes them::

    PreNormBlock   (GPT-2, Llama)    x = x + attn(ln_1(x));           x = x + mlp(ln_2(x))
    PostNormBlock  (BERT)            x = ln_1(x + attn(x));           x = ln_2(x + mlp(x))
    ParallelBlock  (GPT-NeoX, GPT-J) x = x + attn(ln_1(x)) + mlp(ln_2(x))
    SandwichBlock  (Gemma-2)         x = x + ln_1_post(attn(ln_1(x))); x = x + ln_2_post(mlp(ln_2(x)))
    OutputNormBlock (OLMo-2)         x = x + ln_1_post(attn(x));       x = x + ln_2_post(mlp(x))

One interpreter runs the lines forward (:meth:`Block.forward`) for inference, hooks and training alike: with
a tape (:class:`attnlab.layer.tape.Tape`) each part keeps what its backward needs, under its field name.
One runs them backward (:meth:`Block.backward`), bottom to top, from what the tape holds, and records the
gradient at each named point it passes (the hook names, block-relative) for attribution patching. The hook
names themselves (:meth:`Block.hook_names`) follow the lines too. Each part's own pair sits beside it
(:mod:`attnlab.stack.layers`, :func:`attnlab.layer.multihead.multihead_attention`).

A block's fields are its parts (an attention layer, norms, an MLP; a norm or the MLP may be None). What a
field holds for a model is a :class:`Slot`: its class, its arrays' shapes, how to build it from arrays and
how to draw it at random. :meth:`Block.slots` states a kind's slots once; the parameter tree (``params``,
``param_names``, ``from_params``, ``init`` and the shape checks of :class:`~attnlab.stack.transformer.Transformer`)
walks them, and the hook names too. A new kind is one more class here, registered in :data:`BLOCKS`.

Hooks are at the same named points in every kind (see :mod:`attnlab.stack.hooks`): ``hook_resid_pre``,
the parts' own (``ln_1.hook_scale``, ``attn.hook_q``, ``mlp.hook_pre``, …), ``hook_attn_out`` and
``hook_mlp_out`` (what each sublayer adds to the stream), ``hook_resid_mid`` (the stream between the two
lines; a parallel block has one line, so none) and ``hook_resid_post``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

import numpy as np

from ..kernels._kernels import step_kernels
from ..layer import latent
from ..layer.config import AttentionConfig
from ..layer.hookpoints import NO_HOOKS
from ..layer.multihead import (LlamaCppAttention, MultiHeadAttention, hook_points, multihead_attention,
                               multihead_attention_backward_named, param_shapes)
from .decode_step import decode_step, step_plan
from .experts import Experts


@dataclass(frozen=True)
class Slot:
    """What one field of a block holds for a given model."""
    cls: type                                    # the part's class (MultiHeadAttention, LayerNorm, GatedMLP, …)
    shapes: dict                                 # array name -> shape, in the part's order
    make: Callable[[dict], object]               # arrays by name -> the part
    draw: Callable[..., object]                  # (rng, std, dtype) -> the part, drawn at random
    config: AttentionConfig | None = None        # the config an attention part must carry
    points: tuple | None = None                  # its hook points, where they depend on the config (RoPE's)

    @property
    def hooks(self) -> tuple:
        """The part's hook points, in pass order."""
        return self.cls.HOOKS if self.points is None else self.points

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


# each attention layer's class -> its forward and its backward (named), as the block's attn field calls them
ATTENTION = {MultiHeadAttention: (multihead_attention, multihead_attention_backward_named),
             LlamaCppAttention: (multihead_attention, multihead_attention_backward_named),   # the q8 mode's
             latent.LatentAttention: (latent.latent_attention, latent.latent_attention_backward_named)}


def attention_slot(a: AttentionConfig) -> Slot:
    if isinstance(a, latent.LatentConfig):                       # multi-head latent attention (DeepSeek)
        return Slot(latent.LatentAttention, latent.param_shapes(a), lambda p: latent.LatentAttention.from_params(p, a),
                    lambda rng, std, dtype: latent.LatentAttention.init(a, rng=rng, std=std, dtype=dtype), config=a,
                    points=latent.hook_points(a))
    return Slot(MultiHeadAttention, param_shapes(a), lambda p: MultiHeadAttention(**p, config=a),
                lambda rng, std, dtype: MultiHeadAttention.init(a, rng=rng, std=std, dtype=dtype), config=a,
                points=hook_points(a))


def norm_slot(c) -> Slot | None:
    """The config's norm (d_model wide), or None for a model without norms."""
    if c.norm is None:
        return None
    return Slot(c.norm, {k: (c.d_model,) for k in c.norm.PARAMS},
                lambda p: c.norm(*(p[k] for k in c.norm.PARAMS), c.norm_eps),
                lambda rng, std, dtype: c.norm.init(c.d_model, c.norm_eps, dtype))


def mlp_slot(c) -> Slot | None:
    """The config's MLP (d_model -> d_mlp -> d_model), its experts MLP where it has one (see
    ``ModelConfig.at_layer``), or None for attention-only blocks."""
    if c.experts is not None:
        e = c.experts
        return Slot(Experts, e.shapes(c.d_model), lambda p: Experts.from_params(p, e),
                    lambda rng, std, dtype: Experts.init(c.d_model, e, rng=rng, std=std, dtype=dtype), config=e)
    if c.d_mlp is None:
        return None
    cls = c.mlp_class
    return Slot(cls, cls.shapes(c.d_model, c.d_mlp), lambda p: cls(*(p[k] for k in cls.PARAMS), c.activation),
                lambda rng, std, dtype: cls.init(c.d_model, c.d_mlp, c.activation, rng=rng, std=std, dtype=dtype))


@dataclass(frozen=True)
class Line:
    """One residual line of a block: ``x = after(x + Σ_b branch_b(x))``, each branch a chain of the block's parts
    (field names) applied first to last; ``after`` a norm on the sum (post-norm), or None.

    A branch is there when its sublayer (its ``attn`` or ``mlp`` field) is: an attention-only block has no MLP
    line. What a branch adds is seen at ``hook_attn_out`` or ``hook_mlp_out``, by its sublayer."""
    branches: tuple               # of tuples of field names, e.g. (("ln_1", "attn"),)
    after: str | None = None      # a norm field, on the line's sum


def line(*branches: tuple, after: str | None = None) -> Line:
    """A :class:`Line` of these branches: ``line(("ln_1", "attn"))`` is ``x = x + attn(ln_1(x))``."""
    return Line(branches=tuple(branches), after=after)


def sublayer(branch: tuple) -> str:
    """The branch's sublayer, "attn" or "mlp": the part it is there for."""
    return next(f for f in branch if f in ("attn", "mlp"))


def _undo(field: str, part, tape, dy: np.ndarray, grads: dict, named: dict) -> np.ndarray:
    """Backward of one part from what its forward kept on ``tape`` under ``field``: dL/dx from dL/dy; the
    part's gradients go into ``grads`` ("ln_1.weight", …), the gradients at its points into ``named``."""
    if field == "attn":
        dx, g, points = ATTENTION[type(part)][1](part, tape[field], dy)
        g = g if isinstance(g, dict) else g.params()
        named.update({f"attn.{k}": v for k, v in points.items()})
    else:
        dx, g, points = part.backward_named(tape[field], dy)
        named.update({f"{field}.{k}": v for k, v in points.items()})
    grads.update({f"{field}.{k}": v for k, v in g.items()})
    return dx


class Block:
    """What every block kind shares: the walk over its parts. Subclasses are frozen dataclasses whose fields
    are the parts, and state ``slots`` and ``LINES``; one interpreter runs the lines forward (:meth:`forward`:
    hooks, a cache, a mask, a tape), one runs them backward from the tape (:meth:`backward`), and the hook
    names follow them (:meth:`hook_names`)."""
    name = ""              # its key in BLOCKS
    final_norm = True      # the stack normalises once more before the logits (ln_final)
    LINES: tuple = ()      # the residual lines, in pass order (see Line)

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
        """The block's hook names (without the ``blocks.{i}.`` prefix), in the order the pass reaches them:
        ``hook_resid_pre``; per line (``hook_resid_mid`` before the second), each branch's input's point
        (``hook_attn_in``, ``hook_mlp_in``), its parts' own points and its output's point, then the ``after``
        norm's points; ``hook_resid_post``."""
        slots = cls.slots(c, a)
        points = lambda field: [f"{field}.{h}" for h in slots[field].hooks] if slots[field] else []   # noqa: E731
        names = ["hook_resid_pre"]
        for j, ln in enumerate(cls.LINES):
            branches = [b for b in ln.branches if slots[sublayer(b)] is not None]
            if not branches:
                continue
            names += ["hook_resid_mid"] if j else []
            for b in branches:
                names += [f"hook_{sublayer(b)}_in", *(p for field in b for p in points(field)),
                          f"hook_{sublayer(b)}_out"]
            names += points(ln.after) if ln.after else []
        return names + ["hook_resid_post"]

    def __post_init__(self):
        object.__setattr__(self, "_lines", self._resolve_lines())
        plan = None
        if type(self) is PreNormBlock:                                     # Llama's block: its fused decode step
            plan = step_plan(self.attn, self.ln_1, self.mlp, self.ln_2)
        object.__setattr__(self, "_step", plan)

    def _resolve_lines(self) -> tuple:
        """The lines this block runs, its parts looked up once: ``(mid, branches, after)`` each, ``mid`` True for
        a line after the first (``hook_resid_mid`` before it), ``branches`` ``(((field, part, hook prefix), …),
        in point, out point)`` without the absent parts, ``after`` ``(field, part, hook prefix)`` or None."""
        got = []
        part = lambda f: (f, getattr(self, f), f + ".")                    # noqa: E731
        for j, ln in enumerate(self.LINES):
            branches = tuple((tuple(part(f) for f in b if getattr(self, f) is not None),
                              f"hook_{sublayer(b)}_in", f"hook_{sublayer(b)}_out")
                             for b in ln.branches if getattr(self, sublayer(b)) is not None)
            after = None if ln.after is None or getattr(self, ln.after) is None else part(ln.after)
            if branches:
                got.append((j > 0, branches, after))
        return tuple(got)

    def attention_input(self, x: np.ndarray) -> np.ndarray:
        """What the attention of this block reads, given the block's input x (..., n, d_model): x through the
        parts before ``attn`` on its branch (ln_1 in a pre-norm block; nothing in a post-norm one)."""
        for _, branches, _ in self._lines:
            for chain, _, _ in branches:
                for field, part, _ in chain:
                    if field == "attn":
                        return x
                    x = part(x)                                            # (..., n, d_model)
        raise AssertionError("every block kind has an attention branch")

    def forward(self, x: np.ndarray, h, *, is_causal: bool, cache=None, mask=None, tape=None,
                positions=None) -> np.ndarray:
        """The block's residual lines on x (..., n, d_model): the one forward of inference, hooks and training.

        ``h`` the hooks (block-relative names), ``cache`` this layer's KV cache, ``mask`` (B, 1, 1, n_k) True =
        a real key (a padded batch's keys, ANDed with the causal mask) and ``positions`` (B, n) its rows' own
        positions (RoPE's angles), ``tape`` (scoped to the block) keeps each part's saved forward under its
        field name for :meth:`backward`."""
        if h is NO_HOOKS and tape is None:                                  # nothing listens: no hook calls
            return self._forward_plain(x, is_causal=is_causal, cache=cache, mask=mask, positions=positions)
        x = h("hook_resid_pre", x)                                         # (..., n, d_model)
        for mid, branches, after in self._lines:
            if mid:
                x = h("hook_resid_mid", x)
            y = None
            for chain, into, out in branches:                              # x = after(x + Σ_b chain_b(x))
                z = h(into, x)                                             # (..., n, d_model) what it reads
                for field, part, prefix in chain:                          # each part, its hooks under its name
                    t = None if tape is None else tape.scoped(field)
                    if field == "attn":
                        z = ATTENTION[type(part)][0](part, z, mask=mask, is_causal=is_causal, cache=cache,
                                                hook=h.scoped(prefix), tape=t, positions=positions)
                    else:
                        z = part(z, h.scoped(prefix), t)                   # (..., n, d_model)
                z = h(out, z)                                              # (..., n, d_model) what it adds
                y = z if y is None else y + z
            x = x + y                                                      # (..., n, d_model)
            if after is not None:
                field, part, prefix = after
                x = part(x, h.scoped(prefix), None if tape is None else tape.scoped(field))   # (..., n, d_model)
        return h("hook_resid_post", x)                                     # (..., n, d_model)

    def _forward_plain(self, x: np.ndarray, *, is_causal: bool, cache, mask, positions) -> np.ndarray:
        """:meth:`forward` without hooks and without a tape: the same parts on the same arrays in the same order
        (the same bits), without the calls at the points nobody listens to; a decode step of one float32 token
        through the fused one-token kernels where the block has a plan for them (:mod:`attnlab.stack.decode_step`)."""
        if (self._step is not None and cache is not None and x.ndim == 2 and x.shape[0] == 1
                and x.dtype == np.float32):
            fused = step_kernels()
            if fused is not None:
                y = decode_step(self._step, x, cache, fused, is_causal=is_causal)
                if y is not None:
                    return y
        for _, branches, after in self._lines:
            y = None
            for chain, _, _ in branches:                                   # x = after(x + Σ_b chain_b(x))
                z = x
                for field, part, _ in chain:
                    if field == "attn":
                        z = ATTENTION[type(part)][0](part, z, mask=mask, is_causal=is_causal, cache=cache,
                                                hook=NO_HOOKS, tape=None, positions=positions)
                    else:
                        z = part(z)                                        # (..., n, d_model)
                y = z if y is None else y + z
            x = x + y                                                      # (..., n, d_model)
            if after is not None:
                x = after[1](x)                                            # (..., n, d_model)
        return x

    def backward(self, tape, dx: np.ndarray):
        """Backward of :meth:`forward` from what it kept on ``tape`` (scoped to the block): ``(dx_in, grads,
        named)`` from dL/dx_out, grads by the names of :meth:`params`, named the gradients at the block's points
        ("hook_resid_pre", "attn.hook_z", …). The lines are undone bottom to top, each chain last part first."""
        g, named = {}, {"hook_resid_post": dx}
        for mid, branches, after in reversed(self._lines):
            # forward: x = after(x + Σ_b chain_b(x))
            if after is not None:
                dx = _undo(*after[:2], tape, dx, g, named)                 # (..., n, d_model)
            d_in = dx                                                      # the residual passes dx through
            for chain, into, out in branches:
                named[out] = dx
                dz = dx                                                    # (..., n, d_model)
                for field, part, _ in reversed(chain):
                    # forward: z = part(z)
                    dz = _undo(field, part, tape, dz, g, named)            # (..., n, d_model)
                named[into] = dz
                d_in = d_in + dz                                           # each branch adds its part
            dx = d_in
            if mid:
                named["hook_resid_mid"] = dx
        named["hook_resid_pre"] = dx
        return dx, g, named


@dataclass(frozen=True, eq=False)
class PreNormBlock(Block):
    """GPT-2, Llama, attnlab's own LM (no norms, no MLP): each sublayer reads a normalised copy of the stream
    and adds its output back (Xiong et al., 2020)."""
    attn: MultiHeadAttention
    ln_1: object | None = None      # before the attention
    mlp: object | None = None       # an MLP or GatedMLP
    ln_2: object | None = None      # before the MLP
    name = "pre_norm"
    LINES = (line(("ln_1", "attn")),           # x = x + attn(ln_1(x))
             line(("ln_2", "mlp")))            # x = x + mlp(ln_2(x))

    @classmethod
    def slots(cls, c, a):
        return {"attn": attention_slot(a), "ln_1": norm_slot(c), "mlp": mlp_slot(c),
                "ln_2": norm_slot(c) if c.d_mlp is not None else None}


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
    LINES = (line(("attn",), after="ln_1"),    # x = ln_1(x + attn(x))
             line(("mlp",), after="ln_2"))     # x = ln_2(x + mlp(x))
    slots = PreNormBlock.slots


@dataclass(frozen=True, eq=False)
class ParallelBlock(Block):
    """GPT-NeoX, GPT-J (Wang & Komatsuzaki, 2021): attention and MLP read the same input, each through its
    own norm, and both add to the stream at once."""
    attn: MultiHeadAttention
    ln_1: object | None = None      # before the attention
    mlp: object | None = None
    ln_2: object | None = None      # before the MLP
    name = "parallel"
    LINES = (line(("ln_1", "attn"), ("ln_2", "mlp")),)   # x = x + attn(ln_1(x)) + mlp(ln_2(x))
    slots = PreNormBlock.slots


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
    LINES = (line(("ln_1", "attn", "ln_1_post")),   # x = x + ln_1_post(attn(ln_1(x)))
             line(("ln_2", "mlp", "ln_2_post")))    # x = x + ln_2_post(mlp(ln_2(x)))

    @classmethod
    def slots(cls, c, a):
        with_mlp = c.d_mlp is not None
        return {"attn": attention_slot(a), "ln_1": norm_slot(c), "ln_1_post": norm_slot(c), "mlp": mlp_slot(c),
                "ln_2": norm_slot(c) if with_mlp else None, "ln_2_post": norm_slot(c) if with_mlp else None}


@dataclass(frozen=True, eq=False)
class OutputNormBlock(Block):
    """OLMo-2 (OLMo et al., 2024): each sublayer reads the stream as it is, and its output is normalised before
    it joins the stream (a sandwich without the norms before); a final norm before the logits."""
    attn: MultiHeadAttention
    ln_1_post: object | None = None   # on the attention's output
    mlp: object | None = None
    ln_2_post: object | None = None   # on the MLP's output
    name = "output_norm"
    LINES = (line(("attn", "ln_1_post")),   # x = x + ln_1_post(attn(x))
             line(("mlp", "ln_2_post")))    # x = x + ln_2_post(mlp(x))

    @classmethod
    def slots(cls, c, a):
        return {"attn": attention_slot(a), "ln_1_post": norm_slot(c), "mlp": mlp_slot(c),
                "ln_2_post": norm_slot(c) if c.d_mlp is not None else None}


BLOCKS = {cls.name: cls for cls in (PreNormBlock, PostNormBlock, ParallelBlock, SandwichBlock, OutputNormBlock)}
