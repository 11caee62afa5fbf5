"""The decode step: one query per head against a KV cache, every cached key visible.

Generation runs this once per new token: the step streams every cached key and value once, so it is
memory-bound, and it takes as few passes over the scores as it can (the naive path's extra passes and
allocations cost it 40% at 1024 tokens). With grouped-query attention the query heads of a group are one
(g, d_k) @ (d_k, n_k) matmul against their key/value head: each cached head is read once per group.

With numba (the extra ``attnlab[fast]``) the whole step is one call of a fused kernel
(:func:`attnlab.kernels._fused.decode_groups`): scores, the softmax and the weighted sum of every key/value
head and its group, each cached key and value read once, no temporaries; numpy takes seven calls and two
(h, n_k) temporaries. ``ATTNLAB_NO_NUMBA=1`` (or numba missing) keeps the numpy path.

Which of the two is faster depends on the machine and the shape, so :func:`decode_step` (what the front door
calls) measures it: the fused kernel has no per-call overhead, while numpy's matrix-vector products (BLAS)
stream a long context faster when each key/value head serves one query head (12 heads × 1024 keys on one
core of the EPYC: 0.23 against 0.31 ms), and the fused kernel wins when it serves a group (9 on 3 heads:
0.16 against 0.24 ms) or the context is short (64 keys: 0.02 against 0.03 ms). The first
``DECODE_TRIALS`` calls of each kind of step (the heads, group, widths, dtype and the context's power of
two) run the fused kernel, the next as many numpy, each timed; the later ones run the faster median. Generation calls the same kind
of step hundreds of times, so the race costs a few calls.
"""

from __future__ import annotations

import math
import time

import numpy as np

from . import _kernels
from ._checks import Checked, cap_scores, fold, unfold


def takes_decode_path(c: Checked) -> bool:
    """True for one query per head against at least one key, every key visible (causality with the default
    q_offset hides nothing from the last position), no bias."""
    return (c.q.shape[-2] == 1 and c.k.shape[-2] > 0 and c.keep is None and c.bias is None
            and not c.causal_hides_keys)


# Calls of each kind of step that each kernel runs, timed, before the faster one is kept: on a loaded machine
# one call of 0.2 ms can take twice that, and five give a median that holds.
DECODE_TRIALS = 5
# Per kind of step ((lead, h_kv, groups, d_k, d_v, dtype, n_k's bit length)): the kernel that won, or each
# kernel's measured seconds while they race.
RACES: dict[tuple, str | dict[str, list[float]]] = {}


def decode_step(c: Checked, kernel: str) -> np.ndarray:
    """The front door's decode step (..., h, 1, d_v): with ``kernel`` "fused", whichever of the fused and numpy
    kernels ran this kind of step faster here (DECODE_TRIALS timed calls of each, fused first); with "numpy",
    numpy. The bookkeeping calls no numpy function."""
    if kernel != "fused" or not fused_fits(c):
        return decode_attention(c, "numpy")
    key = (c.q.shape[:-3], c.k.shape[-3], c.groups, c.q.shape[-1], c.v.shape[-1], c.q.dtype,
           c.k.shape[-2].bit_length())
    race = RACES.setdefault(key, {"fused": [], "numpy": []})
    if isinstance(race, str):
        return decode_attention(c, race)
    pick = "fused" if len(race["fused"]) < DECODE_TRIALS else "numpy"
    t0 = time.perf_counter()
    out = decode_attention(c, pick)
    race[pick].append(time.perf_counter() - t0)
    if len(race["numpy"]) == DECODE_TRIALS:
        RACES[key] = "fused" if median(race["fused"]) <= median(race["numpy"]) else "numpy"
    return out


def median(xs: list[float]) -> float:
    """The median of a short list, in Python (no numpy call on the decode step's path)."""
    s = sorted(xs)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2


def fused_fits(c: Checked) -> bool:
    """Whether the fused kernel takes these inputs: the key/value heads' leading axes are the query's (no
    broadcasting), and d_head > 0 (d_head 0, the uniform average, stays with numpy)."""
    return c.q.shape[:-3] == c.k.shape[:-3] == c.v.shape[:-3] and c.q.ndim >= 3 and c.q.shape[-1] > 0


def decode_attention(c: Checked, kernel: str | None = None) -> np.ndarray:
    """The decode step's output (..., h, 1, d_v) in the compute dtype: the fused kernel when ``kernel`` is
    "fused" (None: :func:`attnlab.kernels._kernels.tile_kernel` decides) and the key/value heads' leading axes
    are the query's (no broadcasting), else numpy.

    Every key is visible, so the row max is finite and the sum is at least 1; the output is divided by the
    sum instead of the weights.
    """
    kernel = _kernels.tile_kernel() if kernel is None else kernel
    if kernel == "fused" and fused_fits(c):
        return _decode_fused(c)
    g = c.groups
    qs = fold(c.q * c.scale, g)                          # (..., h_kv, g, d_k) scaled once, not the scores
    s = qs @ np.swapaxes(c.k, -1, -2)                    # (..., h_kv, g, n_k) S = q Kᵀ/√d_k
    s = cap_scores(s, c.softcap)                         # (..., h_kv, g, n_k) cap · tanh(S / cap), or S
    s -= s.max(axis=-1, keepdims=True)                   # (..., h_kv, g, n_k)
    p = np.exp(s, out=s)                                 # (..., h_kv, g, n_k) unnormalised weights
    out = p @ c.v                                        # (..., h_kv, g, d_v)
    out /= p.sum(axis=-1, keepdims=True)                 # (..., h_kv, g, d_v) out = Σ_j a_j v_j
    return unfold(out, g)                                # (..., h, 1, d_v)


def _decode_fused(c: Checked) -> np.ndarray:
    """:func:`decode_attention` by :func:`attnlab.kernels._fused.decode_groups`: (..., h, 1, d_v)."""
    *lead, h, _, d_k = c.q.shape
    h_kv, n_k, d_v = c.k.shape[-3], c.k.shape[-2], c.v.shape[-1]
    g, n_b = h // h_kv, math.prod(lead)                  # n_b given, not -1: d_k = 0 has no size to infer
    q = c.q.reshape(n_b, h_kv, g, d_k)                   # (B, h_kv, g, d_k) the query heads of each group
    k = c.k.reshape(n_b, h_kv, n_k, d_k)                 # (B, h_kv, n_k, d_k) views of the cache
    v = c.v.reshape(n_b, h_kv, n_k, d_v)                 # (B, h_kv, n_k, d_v)
    out = np.empty((q.shape[0], h_kv, g, d_v), c.q.dtype)   # (B, h_kv, g, d_v)
    s = np.empty((g, n_k), c.q.dtype)                    # (g, n_k) scratch: one group's scores
    cap2 = 0.0 if c.softcap is None else c.softcap * _kernels.LOG2E   # the cap in base 2; 0 = none
    _kernels.fused_module().decode_groups(q, k, v, c.q.dtype.type(c.scale * _kernels.LOG2E), out, s,
                                          c.q.dtype.type(cap2))
    return out.reshape(*lead, h, 1, d_v)                 # (..., h, 1, d_v)
