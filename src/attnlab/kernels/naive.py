"""The naive reference: the guide's equation with the whole (n_q, n_k) grid of scores in memory.

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V

(with a soft-cap, Gemma-2's, the scores are first capped: ``cap · tanh(Q Kᵀ · scale / cap)``)

Forward and backward side by side; the faster paths (:mod:`attnlab.kernels.tiled`, :mod:`attnlab.kernels.decode`) are tested
against this one. Grouped-query attention runs folded (:func:`attnlab.kernels._checks.fold`): the query heads of a
group are stacked as rows, so a group is one matmul against its key/value head and K, V are never repeated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from . import _kernels
from ._checks import Checked, cap_scores, cap_slope, fold, unfold
from ._kernels import LOG2E
from ._threads import l2_cache_bytes, run_items, usable_cores
from .masks import causal_mask
from .sinks import softmax_with_sink
from .softmax import softmax


@dataclass(frozen=True, eq=False)
class NaiveSaved:
    """What the naive forward keeps for its backward: the checked inputs, the output and the weights."""
    c: Checked
    inputs: tuple            # the caller's query, key, value: the gradients take their shapes and dtypes
    out: np.ndarray          # (..., h, n_q, d_v) in the compute dtype
    a: np.ndarray            # (..., h, n_q, n_k) the weights
    p_sink: np.ndarray | None = None   # (..., h, n_q) the sink's weight, with a sink (kernels.sinks)


def visible(c: Checked) -> np.ndarray | None:
    """Which scores survive: the caller's mask AND the causal one (window, q_offset), (..., h, n_q, n_k)
    bool, or None when every key is visible to every query."""
    if not c.causal_hides_keys:
        return c.keep
    causal = causal_mask(c.q.shape[-2], c.k.shape[-2], window=c.window, q_offset=c.q_offset)   # (n_q, n_k)
    return causal if c.keep is None else c.keep & causal                 # (..., h, n_q, n_k)


def naive_weights(c: Checked, kernel: str = "numpy") -> np.ndarray:
    """The grid of weights A = softmax(S + M), (..., h, n_q, n_k), in the compute dtype. ``kernel="fused"``
    (numba, no bias): the scale, shift, exponential, sum and division in one pass per row
    (:func:`attnlab.kernels._fused.softmax_rows`), where numpy takes six passes and two temporaries."""
    if c.sink is not None:
        return softmax_with_sink(naive_scores(c), c.sink)[0]   # (..., h, n_q, n_k) rows sum to 1 − p_sink
    fused = kernel == "fused" and c.bias is None
    scaled = not fused or c.softcap is not None          # a capped score is capped after scaling
    s = naive_scores(c, scaled=scaled)                   # (..., h, n_q, n_k) S + M, unscaled when fused
    if not fused:
        return softmax(s)                                # (..., h, n_q, n_k) A, rows with no key are 0
    if s.size:
        # matmul lays its output out as its inputs are (a query of swapped batch axes gives swapped scores): the
        # rows are a view, written in place, only of a C-contiguous grid
        s = np.ascontiguousarray(s)                      # (..., h, n_q, n_k) s itself when it is C-contiguous
        rows = s.reshape(-1, s.shape[-1])                # (rows, n_k) a view of s
        maxima = np.empty(rows.shape[0], s.dtype)        # (rows,)
        scale2 = (1.0 if scaled else c.scale) * LOG2E    # the fused softmax's own scale, to base 2
        _kernels.fused_module().softmax_rows(rows, s.dtype.type(scale2), maxima)
    return s                                             # (..., h, n_q, n_k) A, rows with no key are 0


def naive_scores(c: Checked, *, scaled: bool = True) -> np.ndarray:
    """The grid of scores S + M, (..., h, n_q, n_k): scaled and capped (the fused softmax scales in its own
    pass, so without a cap it asks ``scaled=False``), biased, -inf where masked (compute dtype)."""
    s = capped_scores(c, scaled=scaled)                  # (..., h, n_q, n_k)
    if c.bias is not None:
        s = s + c.bias                                   # (..., h, n_q, n_k)
    keep = visible(c)
    if keep is not None and s.shape == np.broadcast_shapes(s.shape, keep.shape):
        np.copyto(s, -np.inf, where=~keep)               # (..., h, n_q, n_k) S + M, in place
    elif keep is not None:
        s = np.where(keep, s, -np.inf)                   # (..., h, n_q, n_k) S + M, a mask with more batch axes
    return s


def capped_scores(c: Checked, *, scaled: bool = True) -> np.ndarray:
    """S = Q Kᵀ · scale, then soft-capped where the config says (..., h, n_q, n_k): no bias, no mask yet."""
    g = c.groups
    s = unfold(fold(c.q, g) @ np.swapaxes(c.k, -1, -2), g)   # (..., h, n_q, n_k) raw scores; a group: one matmul
    if not scaled:
        assert c.softcap is None, "a soft-cap acts on scaled scores"
        return s
    s *= c.scale                                         # (..., h, n_q, n_k) S = QKᵀ/√d_k
    return cap_scores(s, c.softcap)                      # (..., h, n_q, n_k) cap · tanh(S / cap), or S


def naive_attention(c: Checked, kernel: str = "numpy") -> tuple[np.ndarray, np.ndarray]:
    """The reference forward: ``(out, a)``, (..., h, n_q, d_v) and (..., h, n_q, n_k), in the compute dtype."""
    a = naive_weights(c, kernel)                         # (..., h, n_q, n_k)
    out = unfold(fold(a, c.groups) @ c.v, c.groups)      # (..., h, n_q, d_v) out = A V
    return out, a


def naive_sink_attention(c: Checked) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`naive_attention` with the sink (``c.sink``): ``(out, a, p_sink)``, p_sink (..., h, n_q) the
    weight each query gave the sink."""
    a, p_sink = softmax_with_sink(naive_scores(c), c.sink)   # (..., h, n_q, n_k), (..., h, n_q)
    out = unfold(fold(a, c.groups) @ c.v, c.groups)      # (..., h, n_q, d_v) out = A V: the sink has no value
    return out, a, p_sink


# Splitting the batch over threads pays when each worker gets at least this many scores: a share then takes
# ~1 ms, against ~0.1 ms of handing it out (pinning BLAS, waking the pool).
SPLIT_MIN_SCORES = 2**20


def split_rows(c: Checked, workers: int) -> list[tuple[int, int]]:
    """Ranges of the first batch axis that the naive grid runs in, one call each, or [] for one call.

    The first axis must be the same in query, key, value and the output. The grid is cut so that each
    chunk's scores fit in a core's L2 cache (:func:`attnlab.kernels._threads.l2_cache_bytes`): then the scores,
    the softmax and the weighted sum find the chunk's grid in cache, where a whole batch's grid (32 × 12
    heads × 128² float32 scores: 25 MiB) went to memory and back three times (32 × 128 tokens, 12 heads:
    1.16 → 0.99 × torch on 2 cores, 1.30 → 1.22 on one core, process time). And into at least one chunk per
    worker when each worker gets at least SPLIT_MIN_SCORES scores."""
    arrays = [c.q, c.k, c.v] + [x for x in (c.keep, c.bias) if x is not None]
    if len(c.batch) < 2 or any(x.ndim != len(c.batch) + 2 for x in arrays):
        return []
    n_b = c.batch[0]
    if n_b < 2 or any(x.shape[0] != n_b for x in arrays):
        return []
    per_row = int(np.prod(c.batch[1:])) * c.q.shape[-2] * c.k.shape[-2]      # scores of one batch row
    size = max(1, l2_cache_bytes() // max(1, per_row * c.q.dtype.itemsize))  # rows whose grid fits the L2
    size = min(size, -(-n_b // split_workers(c, workers)))                    # and a chunk for every worker
    if size >= n_b:
        return []
    return [(b, min(b + size, n_b)) for b in range(0, n_b, size)]


def split_workers(c: Checked, workers: int) -> int:
    """How many workers the naive grid's chunks run on: as many as get SPLIT_MIN_SCORES scores each (at least
    one, at most ``workers`` and the first batch axis)."""
    scores = int(np.prod(c.batch)) * c.q.shape[-2] * c.k.shape[-2]
    return max(1, min(workers, c.batch[0] if c.batch else 1, scores // SPLIT_MIN_SCORES))


def naive_attention_out(c: Checked, kernel: str = "numpy", workers=None) -> np.ndarray:
    """:func:`naive_attention`'s output alone (..., h, n_q, d_v), in chunks of the batch that fit a core's cache,
    split over threads when that pays (:func:`split_rows`; numpy's matmul and the fused softmax release the
    GIL): a BERT-style batch of 32 × 12 heads runs as 32 calls over 2 workers, not one of 25 MiB."""
    workers = usable_cores() if workers is None else workers
    parts = split_rows(c, workers)
    if not parts:
        return naive_attention(c, kernel)[0]
    out = np.empty((*c.batch, c.q.shape[-2], c.v.shape[-1]), c.q.dtype)      # (B, ..., h, n_q, d_v)

    def work(part, _):
        b0, b1 = part
        cut = lambda x: None if x is None else x[b0:b1]                     # noqa: E731
        sub = replace(c, q=c.q[b0:b1], k=c.k[b0:b1], v=c.v[b0:b1], keep=cut(c.keep), bias=cut(c.bias),
                      batch=(b1 - b0, *c.batch[1:]))
        out[b0:b1] = naive_attention(sub, kernel)[0]                          # (b, ..., h, n_q, d_v)

    run_items(parts, work, lambda: None, min(split_workers(c, workers), len(parts)))
    return out


def naive_forward(c: Checked, inputs: tuple, kernel: str = "numpy") -> tuple[np.ndarray, NaiveSaved]:
    """:func:`naive_attention`'s output (compute dtype), and what :func:`naive_backward` needs."""
    if c.sink is not None:
        out, a, p_sink = naive_sink_attention(c)         # (..., h, n_q, d_v), (..., h, n_q, n_k), (..., h, n_q)
        return out, NaiveSaved(c=c, inputs=inputs, out=out, a=a, p_sink=p_sink)
    out, a = naive_attention(c, kernel)                  # (..., h, n_q, d_v), (..., h, n_q, n_k)
    return out, NaiveSaved(c=c, inputs=inputs, out=out, a=a)


def naive_backward(c: Checked, out: np.ndarray, a: np.ndarray, do: np.ndarray):
    """(dq, dk, dv) over the broadcast batch from the forward's ``out`` and weights ``a``; dk and dv have the
    key/value heads, each summed over its group of query heads."""
    g = c.groups
    a_f, do_f = fold(a, g), fold(do, g)                  # (..., h_kv, g·n_q, n_k), (..., h_kv, g·n_q, d_v)
    # forward: out = a @ v
    dv = np.swapaxes(a_f, -1, -2) @ do_f                 # (..., h_kv, n_k, d_v) summed over the group
    da = do_f @ np.swapaxes(c.v, -1, -2)                 # (..., h_kv, g·n_q, n_k)
    # forward: a = softmax(s), so ds = a * (da - Σ_j a·da); and Σ_j a·da = Σ_d out·dout
    da -= (fold(out, g) * do_f).sum(-1, keepdims=True)   # (..., h_kv, g·n_q, n_k) in place: da is ours
    ds = np.multiply(a_f, da, out=da)                    # (..., h_kv, g·n_q, n_k) zero wherever a was masked
    # forward: s = cap · tanh(s_raw / cap), so ds_raw = ds · (1 − tanh²) (the scores recomputed once)
    if c.softcap is not None:
        ds = ds * fold(cap_slope(capped_scores(c), c.softcap), g)   # (..., h_kv, g·n_q, n_k)
    # forward: s = (q @ kᵀ) * scale
    dq = unfold(ds @ c.k, g) * c.scale                   # (..., h, n_q, d_k)
    dk = np.swapaxes(ds, -1, -2) @ fold(c.q, g) * c.scale   # (..., h_kv, n_k, d_k) summed over the group
    return dq, dk, dv


def naive_attention_grad(c: Checked, do: np.ndarray):
    """The reference forward then backward: (dq, dk, dv) over the broadcast batch."""
    out, a = naive_attention(c)                          # (..., h, n_q, d_v), (..., h, n_q, n_k)
    return naive_backward(c, out, a, do)
