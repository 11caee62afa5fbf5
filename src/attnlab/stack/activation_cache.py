"""The activations of one pass, by name, and what TransformerLens users compute from them.

:func:`attnlab.stack.hooks.run_with_cache` returns an :class:`ActivationCache`: a read-only mapping
name -> array (so ``cache["blocks.0.attn.hook_pattern"]`` and ``dict(cache)`` work as before), with

- :meth:`~ActivationCache.accumulated_resid`: the residual stream before each block and after the last,
  optionally through the final norm, recomputed per stage (the logit lens; TL issue #1076 freezes it);
- :meth:`~ActivationCache.decompose_resid`: the residual as the sum of its writers: the embeddings, each
  attention layer's output, each MLP's output;
- :meth:`~ActivationCache.stack_head_results`: each head's own write, z_h W_O[h] (its slice of W_O), so
  that the heads of a layer plus b_O are its ``hook_attn_out``;
- :meth:`~ActivationCache.apply_ln_to_stack`: the final norm as the linear map it is once its scale is
  frozen at the residual's own, so a stack of parts still sums to ``ln_final(x)``;
- :meth:`~ActivationCache.logit_attrs`: direct logit attribution, each part of a stack times the
  unembedding of the tokens (minus that of the wrong ones);
- :meth:`~ActivationCache.to_tl`: TransformerLens's layout and names.

Each method takes ``pos_slice`` (None = every position, an int, a slice or a list of positions), applied
to the position axis. Stacks are (parts, ..., n, d_model), the parts first, as TL's.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .blocks import PostNormBlock
from .layers import LayerNorm, RMSNorm

#: TransformerLens's short names: cache["pattern", 1] is cache["blocks.1.attn.hook_pattern"].
SHORT_NAMES = {"resid_pre": "hook_resid_pre", "resid_mid": "hook_resid_mid", "resid_post": "hook_resid_post",
               "attn_out": "hook_attn_out", "mlp_out": "hook_mlp_out", "q": "attn.hook_q", "k": "attn.hook_k",
               "v": "attn.hook_v", "z": "attn.hook_z", "result": "attn.hook_result",
               "scores": "attn.hook_scores", "attn_scores": "attn.hook_scores", "pattern": "attn.hook_pattern",
               "pre": "mlp.hook_pre", "post": "mlp.hook_post", "rot_q": "attn.hook_rot_q", "rot_k": "attn.hook_rot_k",
               "pre_linear": "mlp.hook_pre_linear", "attn_in": "hook_attn_in", "mlp_in": "hook_mlp_in"}
_HEAD_AXIS_HOOKS = ("attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_rot_q", "attn.hook_rot_k", "attn.hook_z",
                    "attn.hook_result", "attn.hook_q_normed", "attn.hook_k_normed")
_ROTATED_HOOKS = ("attn.hook_q", "attn.hook_k", "attn.hook_rot_q", "attn.hook_rot_k", "attn.hook_q_normed",
                  "attn.hook_k_normed")   # RoPE's pair order


def positions(x: np.ndarray, pos_slice, *, axis: int = -2) -> np.ndarray:
    """``x`` with ``pos_slice`` (None, an int, a slice, a list of positions) applied to its position axis."""
    if pos_slice is None:
        return x
    if isinstance(pos_slice, bool) or not isinstance(pos_slice, (int, np.integer, slice, list, tuple, np.ndarray)):
        raise TypeError(f"pos_slice must be None, an int, a slice or a list of positions, got "
                        f"{type(pos_slice).__name__}")
    index = [slice(None)] * x.ndim
    index[axis] = list(pos_slice) if isinstance(pos_slice, tuple) else pos_slice
    return x[tuple(index)]


class ActivationCache(Mapping):
    """Activations by hook name, from one pass of ``model`` (see :mod:`attnlab.stack.hooks` for the names)."""

    def __init__(self, store: dict, model, *, batched: bool = True, batch=None):
        self._store, self.model, self.batched = store, model, batched   # batched: the ids had a batch axis
        self.batch = batch              # the padding (attnlab.stack.batch.Batch) of a list of prompts, or None

    def __getitem__(self, key):
        if isinstance(key, tuple) and len(key) == 2 and key[0] in SHORT_NAMES:
            key = f"blocks.{key[1]}.{SHORT_NAMES[key[0]]}"
        return self._store[key]

    def __iter__(self):
        return iter(self._store)

    def __len__(self) -> int:
        return len(self._store)

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} activations of {self.model.name or 'a model'})"

    def _need(self, names: list[str], what: str) -> list[np.ndarray]:
        missing = [n for n in names if n not in self._store]
        if missing:
            raise KeyError(f"{what} needs {missing[:3]}{' …' if len(missing) > 3 else ''}, which this cache did not "
                           "record; run_with_cache(model, ids) without names records every activation")
        return [self._store[n] for n in names]

    def _layer(self, layer) -> int:
        L = self.model.config.n_layers
        if layer is None:
            return L
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer <= L:
            raise ValueError(f"layer must be None or an int in [0, {L}] (the residual into that block; {L} = "
                             f"after the last), got {layer!r}")
        return int(layer)

    def _resid(self, layer: int) -> np.ndarray:
        """The residual stream into block ``layer`` (n_layers: out of the last), before any final norm."""
        L = self.model.config.n_layers
        name = f"blocks.{layer}.hook_resid_pre" if layer < L else f"blocks.{L - 1}.hook_resid_post"
        return self._need([name], "the residual stream")[0]

    # ---- the residual stream, stage by stage and part by part ------------------------------------------

    def accumulated_resid(self, layer=None, *, incl_mid: bool = False, apply_ln: bool = True, pos_slice=None,
                          return_labels: bool = False):
        """The residual stream into blocks 0 … ``layer`` (TL's convention: that layer's resid_pre included;
        None or n_layers: every block's and the stream after the last): (stages, ..., n, d_model).

        ``incl_mid`` adds each block's residual between attention and MLP (not in a post-norm or parallel
        block). ``apply_ln`` passes each stage through the final norm, its scale recomputed from that stage
        (the logit lens); a model without a final norm is left as it is."""
        end = self._layer(layer)
        L, labels, parts = self.model.config.n_layers, [], []
        for i in range(end + 1):
            if i < L:
                labels.append(f"{i}_pre")
                parts.append(self._resid(i))
                if incl_mid and i < end:
                    labels.append(f"{i}_mid")
                    parts.append(self._resid_mid(i))
            else:
                labels.append("final_post")
                parts.append(self._resid(L))
        stack = np.stack([positions(p, pos_slice) for p in parts])     # (stages, ..., n, d_model)
        if apply_ln and self.model.ln_final is not None:
            stack = self.model.ln_final(stack)                          # (stages, ..., n, d_model) per stage
        return (stack, labels) if return_labels else stack

    def _resid_mid(self, i: int) -> np.ndarray:
        if f"blocks.{i}.hook_resid_mid" in self._store:
            return self._store[f"blocks.{i}.hook_resid_mid"]
        self._check_pre_norm("the residual between attention and MLP")
        pre, out = self._need([f"blocks.{i}.hook_resid_pre", f"blocks.{i}.hook_attn_out"], "resid_mid")
        return pre + out                                                # (..., n, d_model)

    def _check_pre_norm(self, what: str) -> None:
        c = self.model.config
        if issubclass(c.block, PostNormBlock) and c.norm is not None:
            raise ValueError(f"{what} is a sum of parts only in a pre-norm model; {self.model.name or 'this model'} "
                             "normalises after each residual (post-norm, BERT)")

    def _embeds(self) -> tuple[list[str], list[np.ndarray]]:
        """The embedding's parts: hook_embed and hook_pos_embed (the position rows broadcast over the batch)
        where the cache has them and they make up the whole of it, else blocks.0.hook_resid_pre whole."""
        s, m = self._store, self.model
        only_tokens = m.W_T is None and m.ln_embed is None
        if "hook_embed" in s and only_tokens:
            if "hook_pos_embed" in s:
                shape = s["hook_embed"].shape
                return ["embed", "pos_embed"], [s["hook_embed"], np.broadcast_to(s["hook_pos_embed"], shape)]
            if m.config.attention.positions.name not in ("learned", "sinusoidal"):   # no position rows (RoPE)
                return ["embed"], [s["hook_embed"]]
        return ["embed"], [self._resid(0)]

    def decompose_resid(self, layer=None, *, mode: str = "all", apply_ln: bool = False, pos_slice=None,
                        incl_embeds: bool = True, return_labels: bool = False):
        """The residual stream into block ``layer`` (None: out of the last) as the sum of what wrote it:
        (parts, ..., n, d_model), the parts "embed" (and "pos_embed" where the cache has them), then
        "{i}_attn_out" and "{i}_mlp_out" of each earlier block (``mode`` "attn" or "mlp" keeps one kind).

        The parts sum to the residual (every block kind but post-norm, whose norms sit on the stream). With
        ``apply_ln`` they go through the final norm frozen at that residual's scale (:meth:`apply_ln_to_stack`), and a LayerNorm's bias is one
        more part, "ln_final.b", so that they sum to ``ln_final(residual)`` exactly.
        """
        if mode not in ("all", "attn", "mlp"):
            raise ValueError(f"mode must be 'all', 'attn' or 'mlp', got {mode!r}")
        self._check_pre_norm("the residual stream")
        end = self._layer(layer)
        labels, parts = self._embeds() if incl_embeds else ([], [])
        has_mlp = self.model.config.d_mlp is not None
        for i in range(end):
            kinds = [k for k in ("attn", "mlp") if mode in ("all", k) and (k == "attn" or has_mlp)]
            for k in kinds:
                labels.append(f"{i}_{k}_out")
                parts.append(self._need([f"blocks.{i}.hook_{k}_out"], "decompose_resid")[0])
        if not parts:
            raise ValueError("decompose_resid has no parts to stack: layer 0 without the embeddings")
        stack = np.stack([positions(p, pos_slice) for p in parts])     # (parts, ..., n, d_model)
        if apply_ln:
            stack, labels = self.apply_ln_to_stack(stack, end, pos_slice=pos_slice, labels=labels)
        return (stack, labels) if return_labels else stack

    def stack_head_results(self, layer=None, *, pos_slice=None, apply_ln: bool = False,
                           return_labels: bool = False):
        """Each head's own write into the residual, z_h W_O[h·d_head:(h+1)·d_head] (no b_O), for the heads
        of blocks 0 … layer − 1 (None: every block): (layer·n_heads, ..., n, d_model), labelled "L{i}H{h}".
        A layer's heads plus its b_O are its ``hook_attn_out``. Taken from ``attn.hook_result`` where the
        cache has it, else from ``attn.hook_z`` and the weights (no second pass)."""
        end = self._layer(layer)
        c = self.model.config
        h, d_head = c.attention.n_heads, c.attention.d_head
        head_axis = -2 if isinstance(pos_slice, (int, np.integer)) else -3   # an int drops the position axis
        parts = []
        for i in range(end):
            name = f"blocks.{i}.attn.hook_result"
            if name in self._store:
                r = positions(self._store[name], pos_slice)             # (..., h, n, d_model)
            else:
                z = positions(self._need([f"blocks.{i}.attn.hook_z"], "stack_head_results")[0], pos_slice)
                W_O = self.model.blocks[i].attn.W_O.reshape(h, d_head, c.d_model)   # (h, d_head, d_model)
                spec = "...hd,hde->...he" if head_axis == -2 else "...hnd,hde->...hne"
                r = np.einsum(spec, z, W_O)                             # (..., h, n, d_model)
            parts.append(np.moveaxis(r, head_axis, 0))                  # (h, ..., n, d_model)
        if not parts:
            raise ValueError("stack_head_results(layer=0) has no heads to stack")
        stack = np.concatenate(parts)                                   # (end·h, ..., n, d_model)
        labels = [f"L{i}H{j}" for i in range(end) for j in range(h)]
        if apply_ln:
            stack, _ = self.apply_ln_to_stack(stack, None, pos_slice=pos_slice, labels=None)
        return (stack, labels) if return_labels else stack

    # ---- the final norm, frozen; the unembedding ---------------------------------------------------------

    def ln_scale(self, layer=None, *, pos_slice=None) -> np.ndarray:
        """The final norm's scale (..., n, 1) at the residual into block ``layer`` (None: out of the last):
        √(var + eps) for a LayerNorm, √(mean of squares + eps) for an RMSNorm."""
        norm = self.model.ln_final
        if norm is None:
            raise ValueError(f"{self.model.name or 'this model'} has no final norm to freeze")
        x = positions(self._resid(self._layer(layer)), pos_slice).astype(np.float64)   # (..., n, d_model)
        if isinstance(norm, LayerNorm):
            x = x - x.mean(-1, keepdims=True)
        return np.sqrt((x * x).mean(-1, keepdims=True) + norm.eps)     # (..., n, 1)

    def apply_ln_to_stack(self, stack, layer=None, *, pos_slice=None, labels=None):
        """The final norm applied to each part of ``stack`` (parts, ..., n, d_model) as a linear map, its
        scale frozen at the residual into block ``layer`` (None: out of the last), the same positions:
        (part − mean(part)) / scale · weight (no centring for an RMSNorm). Returns ``(stack, labels)``; a
        LayerNorm's bias is appended as a last part "ln_final.b" when ``labels`` is given, so that parts
        that sum to the residual then sum to ``ln_final(residual)``. No final norm: the stack unchanged."""
        norm = self.model.ln_final
        stack = np.asarray(stack)
        if norm is None:
            return stack, labels
        scale = self.ln_scale(layer, pos_slice=pos_slice)               # (..., n, 1)
        x = stack.astype(np.float64)                                    # (parts, ..., n, d_model)
        if isinstance(norm, LayerNorm):
            x = x - x.mean(-1, keepdims=True)
        out = x / scale * norm.weight                                   # (parts, ..., n, d_model)
        if labels is not None and isinstance(norm, LayerNorm):
            out = np.concatenate([out, np.broadcast_to(norm.bias, out.shape[1:])[None]])
            labels = [*labels, "ln_final.b"]
        assert isinstance(norm, (LayerNorm, RMSNorm))
        return out.astype(stack.dtype, copy=False), labels

    def unembedding(self) -> np.ndarray:
        """W_U (d_model, vocab): W_Eᵀ when the embeddings are tied."""
        c = self.model.config
        if not c.has_logits:
            raise ValueError(f"{self.model.name or 'this model'} has no unembedding (an encoder without logits)")
        return self.model.W_E.T if c.tied_embeddings else self.model.W_U

    def logit_attrs(self, residual_stack, tokens, incorrect_tokens=None, *, pos_slice=None) -> np.ndarray:
        """Direct logit attribution: each part of ``residual_stack`` (parts, ..., d_model) dotted with the
        unembedding of ``tokens`` (an int, or ints broadcasting against the stack's middle axes ...), minus
        that of ``incorrect_tokens``: (parts, ...). ``pos_slice`` is applied to the stack's position axis
        first. b_U is not a part: the attributions of parts that sum to ``ln_final(x)`` sum to the logit
        (difference) minus b_U's."""
        stack = positions(np.asarray(residual_stack), pos_slice)        # (parts, ..., d_model)
        W_U = self.unembedding()                                        # (d_model, vocab)
        if stack.ndim < 2 or stack.shape[-1] != W_U.shape[0]:
            raise ValueError(f"residual_stack must be (parts, ..., d_model) with d_model {W_U.shape[0]}, got "
                             f"shape {stack.shape}")
        direction = self._token_directions(W_U, tokens, "tokens")     # (..., d_model)
        if incorrect_tokens is not None:
            direction = direction - self._token_directions(W_U, incorrect_tokens, "incorrect_tokens")
        return (stack.astype(np.float64) * direction).sum(-1)          # (parts, ...)

    @staticmethod
    def _token_directions(W_U: np.ndarray, tokens, name: str) -> np.ndarray:
        t = np.asarray(tokens)
        if t.dtype.kind not in "iu" or (t.size and (t.min() < 0 or t.max() >= W_U.shape[1])):
            raise ValueError(f"{name} must be token ids in [0, {W_U.shape[1]}), got {tokens!r}")
        return np.moveaxis(W_U[:, t], 0, -1).astype(np.float64)         # (..., d_model)

    # ---- TransformerLens's layout -----------------------------------------------------------------------

    def to_tl(self) -> dict[str, np.ndarray]:
        """The activations in TransformerLens's layout and names: a batch axis always (1 for one text); q,
        k, v, rot_q, rot_k, z and result as (batch, pos, head, d_head) (attnlab's are (batch, head, pos,
        d_head)); with RoPE, q, k, rot_q and rot_k with each head's features in rotate_half's order (TL's and
        Hugging Face's: feature i pairs with i + d/2; attnlab pairs 2i with 2i+1); the scores under TL's name
        ``attn.hook_attn_scores``; the block norms as ``ln1`` / ``ln2``. Patterns (batch, head, query_pos,
        key_pos) and the residual (batch, pos, d_model) are laid out alike. Views, not copies, but for the
        reordered q and k."""
        out = {}
        scheme = self.model.config.attention.positions
        for name, x in self._store.items():
            x = x if self.batched else x[None]
            if scheme.rotates and name.endswith(_ROTATED_HOOKS):
                x = x[..., scheme.halves_order(x.shape[-1])]            # (batch, head, pos, d) halves order
            if name.endswith(_HEAD_AXIS_HOOKS):
                x = np.swapaxes(x, -2, -3)                              # (batch, pos, head, d)
            tl = name.replace("attn.hook_scores", "attn.hook_attn_scores").replace(".ln_1.", ".ln1.")
            out[tl.replace(".ln_2.", ".ln2.")] = x
        return out
