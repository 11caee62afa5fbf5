"""A batch of prompts of different lengths: padded into one (B, n) array with an attention mask.

Decoders are padded on the left, so every prompt ends at the last column (the next-token logits of all of
them are at position −1, and a patch at "k positions from the end" means the same for each); encoders on
the right, so every prompt starts at column 0. The mask is True at a prompt's own tokens;
:func:`attnlab.stack.transformer.forward` gives padded keys weight 0 and counts each row's positions from
its first real token, so each row equals its prompt run alone. Padded positions hold numbers that mean
nothing: every metric of :mod:`attnlab.interpret` leaves them out (:meth:`Batch.own`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels._checks import as_token_ids


@dataclass(frozen=True, eq=False)
class Batch:
    """Padded prompts: ``ids`` (B, n), ``mask`` (B, n) True at real tokens, ``lengths`` (B,), ``side``."""
    ids: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    side: str                   # "left" (decoders) or "right" (encoders)

    @property
    def pad(self) -> np.ndarray:
        """(B,) padded columns of each row."""
        return self.ids.shape[-1] - self.lengths

    def own(self, x: np.ndarray, b: int, *, axis: int = -2) -> np.ndarray:
        """Row ``b``'s own positions of ``x`` (its padded positions dropped) along ``axis``."""
        n, p = self.ids.shape[-1], int(self.pad[b])
        keep = slice(p, n) if self.side == "left" else slice(0, n - p)
        index = [slice(None)] * x.ndim
        index[axis] = keep
        return x[tuple(index)]

    @property
    def last(self) -> np.ndarray:
        """(B,) the column of each prompt's last token."""
        n = self.ids.shape[-1]
        return np.full(len(self.lengths), n - 1) if self.side == "left" else self.lengths - 1


def is_ragged(ids) -> bool:
    """Whether ``ids`` is a list (or tuple) of prompts, not one array: a batch to pad."""
    if isinstance(ids, Batch):
        return True
    return isinstance(ids, (list, tuple)) and len(ids) > 0 and all(np.ndim(p) == 1 for p in ids) and \
        not all(isinstance(p, (int, np.integer)) for p in ids)


def pad_prompts(prompts, *, vocab_size: int, is_causal: bool, pad_id: int = 0) -> Batch:
    """Prompts (a list of 1-D token ids, lengths may differ) as one :class:`Batch`: on the left for a decoder
    (``is_causal``), on the right for an encoder, pads ``pad_id`` (any id: they are masked)."""
    if isinstance(prompts, Batch):
        return prompts
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise TypeError(f"prompts must be a non-empty list of 1-D token-id arrays, got {type(prompts).__name__}")
    rows = [as_token_ids(f"prompts[{i}]", p, vocab_size) for i, p in enumerate(prompts)]
    for i, r in enumerate(rows):
        if r.ndim != 1 or r.size == 0:
            raise ValueError(f"prompts[{i}] must be 1-D with at least one token, got shape {r.shape}")
    lengths = np.array([r.size for r in rows])                         # (B,)
    n = int(lengths.max())
    ids = np.full((len(rows), n), pad_id, np.int64)                     # (B, n)
    mask = np.zeros((len(rows), n), bool)                               # (B, n)
    for b, r in enumerate(rows):
        cols = slice(n - r.size, n) if is_causal else slice(0, r.size)
        ids[b, cols], mask[b, cols] = r, True
    return Batch(ids=ids, mask=mask, lengths=lengths, side="left" if is_causal else "right")
