"""What attention is, and isn't: one head's weights set beside what each token does to the prediction.

The guide's last section warns that a grid of weights shows where one head drew from, not what was in the
values, what the other heads did, or what later layers made of it (Jain & Wallace, 2019; Wiegreffe & Pinter,
2019). :func:`weights_vs_importance` measures that, for one head and one prediction, token by token:

- ``weight``: the attention weight the token gets in the head (at the prediction's query; for an encoder,
  the mean over every query, since its prediction pools them all);
- ``value_in_head``: how far the head's output moves when that token's value is removed from that head only,
  ``‖a_qj v_j‖ / ‖z_q‖`` (the weight times the value's length: Kobayashi et al., 2020);
- ``value_removed``: how much the final prediction changes when that token's value is removed from that
  head (``z_q −= a_qj v_j`` at the prediction's queries, the rest of the model as it was);
- ``left_out``: how much the final prediction changes when the token is left out of the input altogether
  (leave-one-token-out, gradient-free);

and ``head_ablated``: the change when the whole head's output is zeroed.

The prediction is, for a decoder, the log-probability of the model's own next token at the last position
(a change is the drop in it, in nats); for an encoder such as MiniLM, the mean-pooled sentence vector
(a change is 1 − cosine between the vectors with and without).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels._checks import as_token_ids
from ..stack.hooks import run_with_cache, run_with_hooks
from ..stack.transformer import Transformer


@dataclass(frozen=True, eq=False)
class WeightsVsImportance:
    """One head's weights beside each token's importance for one prediction (see the module docstring)."""
    layer: int
    head: int
    query: int | None          # the prediction's query position; None = every query (an encoder)
    prediction: str            # what is measured, in words
    weight: np.ndarray         # (n,) the weight each token gets in the head
    value_in_head: np.ndarray  # (n,) ‖a_qj v_j‖ / ‖z_q‖ (averaged over queries for an encoder)
    value_removed: np.ndarray  # (n,) change of the prediction with the token's value removed from the head
    left_out: np.ndarray       # (n,) change of the prediction with the token left out (NaN: the query itself)
    head_ablated: float        # change of the prediction with the whole head zeroed

    @property
    def most_attended(self) -> int:
        return int(np.argmax(self.weight))

    @property
    def most_important(self) -> int:
        """The token whose leaving out changes the prediction most."""
        return int(np.nanargmax(self.left_out))


def weights_vs_importance(model: Transformer, ids, *, layer: int, head: int) -> WeightsVsImportance:
    """Head ``head`` of layer ``layer`` (from 0): its weights beside value removal, head ablation and
    leave-one-token-out, for the model's prediction on ``ids`` (n,).

    Raises
    ------
    ValueError
        ``ids`` is not 1-D with at least 2 tokens, or ``layer``/``head`` is out of range.
    """
    c = model.config
    ids = as_token_ids("ids", ids, c.vocab_size)                        # (n,)
    if ids.ndim != 1 or ids.size < 2:
        raise ValueError(f"ids must be 1-D with at least 2 tokens, got shape {ids.shape}")
    for name, value, most in (("layer", layer, c.n_layers), ("head", head, c.attention.n_heads)):
        if not isinstance(value, (int, np.integer)) or not 0 <= value < most:
            raise ValueError(f"{name} must be an integer from 0 to {most - 1}, got {value!r}")
    decoder = c.has_logits and c.is_causal
    predict = _next_token(model, ids) if decoder else _pooled(model)
    clean, acts = run_with_cache(model, ids, names=[f"blocks.{layer}.attn.hook_pattern",
                                                    f"blocks.{layer}.attn.hook_v", f"blocks.{layer}.attn.hook_z"])
    base = predict.value(clean)
    a = acts[f"blocks.{layer}.attn.hook_pattern"][head].astype(np.float64)      # (n, n) queries × keys
    v = acts[f"blocks.{layer}.attn.hook_v"][head // (c.attention.n_heads // c.attention.n_kv_heads)]   # (n, d_head)
    z = acts[f"blocks.{layer}.attn.hook_z"][head].astype(np.float64)           # (n, d_head)
    n = ids.size
    rows = [n - 1] if decoder else list(range(n))                              # the prediction's queries
    part = a[rows][:, :, None] * v.astype(np.float64)[None]                    # (q, n, d_head) a_qj v_j
    share = np.linalg.norm(part, axis=-1) / np.linalg.norm(z[rows], axis=-1, keepdims=True)   # (q, n)
    removed = np.array([predict.change(base, run_with_hooks(model, ids, {f"blocks.{layer}.attn.hook_z":
                        _remove_value(head, rows, part[:, j])})) for j in range(n)])          # (n,)
    ablated = predict.change(base, run_with_hooks(model, ids, {f"blocks.{layer}.attn.hook_z": _zero_head(head)}))
    left = np.array([np.nan if decoder and j == n - 1 else
                     predict.change(base, predict.run(np.delete(ids, j))) for j in range(n)])  # (n,)
    return WeightsVsImportance(layer=layer, head=head, query=n - 1 if decoder else None,
                               prediction=predict.what, weight=a[rows].mean(0), value_in_head=share.mean(0),
                               value_removed=removed, left_out=left, head_ablated=float(ablated))


def _remove_value(head: int, rows: list[int], part: np.ndarray):
    """A hook on ``hook_z`` (h, n, d_head): take a_qj v_j, ``part`` (q, d_head), out of ``head`` at ``rows``."""
    def hook(z, name):
        z = z.copy()
        z[head, rows] -= part.astype(z.dtype)
        return z
    return hook


def _zero_head(head: int):
    def hook(z, name):
        z = z.copy()
        z[head] = 0.0
        return z
    return hook


class _next_token:
    """A decoder's prediction: log p of its own top next token after the last position."""

    def __init__(self, model, ids):
        self.model = model
        logits = run_with_hooks(model, ids, {}).logits[-1].astype(np.float64)          # (V,)
        self.token = int(np.argmax(logits))
        self.what = "log p of the model's next token (a change: its drop, in nats)"

    def value(self, out) -> float:
        z = out.logits[-1].astype(np.float64)                                        # (V,)
        z = z - z.max()
        return float(z[self.token] - np.log(np.exp(z).sum()))

    def change(self, base: float, out) -> float:
        return base - self.value(out)

    def run(self, ids):
        return run_with_hooks(self.model, ids, {})


class _pooled:
    """An encoder's prediction: the mean-pooled last hidden state, as sentence-transformers pools MiniLM."""

    def __init__(self, model):
        self.model = model
        self.what = "the mean-pooled sentence vector (a change: 1 − cosine)"

    def value(self, out) -> np.ndarray:
        return out.hidden_states[-1].astype(np.float64).mean(0)                     # (d_model,)

    def change(self, base: np.ndarray, out) -> float:
        e = self.value(out)
        return float(1 - base @ e / (np.linalg.norm(base) * np.linalg.norm(e)))

    def run(self, ids):
        return run_with_hooks(self.model, ids, {})


def sink_head(model: Transformer, ids, sinks) -> tuple[int, int, float]:
    """``(layer, head, weight)``: the head that gives the tokens at positions ``sinks`` (e.g. [CLS], [SEP],
    a first token) the most weight on average over the queries."""
    out = run_with_hooks(model, ids, {}, return_weights=True)
    w = np.stack([a[:, :, list(sinks)].sum(-1).mean(-1) for a in out.attentions])    # (n_layers, n_heads)
    layer, head = np.unravel_index(np.argmax(w), w.shape)
    return int(layer), int(head), float(w[layer, head])
