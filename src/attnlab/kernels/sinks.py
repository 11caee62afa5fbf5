"""Learned attention sinks (gpt-oss; Xiao et al., 2023 learned them as tokens): each head h has one logit
``sink_h`` that joins the softmax's denominator and has no value, so a query may put weight on nothing::

    a_ij = exp(s_ij) / (exp(sink_h) + Σ_j' exp(s_ij'))        out_i = Σ_j a_ij v_j

The weights of a row then sum to ``1 − p_sink,i``, ``p_sink,i = exp(sink_h) / (exp(sink_h) + Σ_j exp(s_ij))``.

Every path takes it through the same identity: with ``lse_i = log Σ_j exp(s_ij)`` (what the tiled kernels
keep), the sink only stretches each row's denominator, so

    lse'_i = log(exp(lse_i) + exp(sink_h))          out'_i = out_i · exp(lse_i − lse'_i) = out_i · σ(lse_i − sink_h)

The tiled kernels (numpy and fused) run unchanged and rescale their output and lse once per row (no sink: no
extra work at all); the naive grid and the decode step put the sink into their row's max and sum.

The backward: the sink is one more score whose value is 0, so ``dS = P ∘ (dP − D)`` keeps its form with the
sink-aware P and out (``D_i = dout_i · out_i``), and the sink's own score gets ``p_sink,i · (0 − D_i)``::

    dL/dsink_h = − Σ_i p_sink,i · (dout_i · out_i)          (summed over every query of head h)
"""

from __future__ import annotations

import numpy as np

from ._checks import unbroadcast


def per_row(sink: np.ndarray, batch: tuple) -> np.ndarray:
    """The sink broadcast to one per (batch, head) and a query axis: (..., h, 1)."""
    return np.broadcast_to(sink, batch)[..., None]


def rescale(out: np.ndarray, lse: np.ndarray, sink: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A sink-free ``(out, lse)`` (..., h, n_q, d_v), (..., h, n_q) to the sink-aware one: ``out · σ(lse − sink)``
    and ``logaddexp(lse, sink)``; a row that saw no key (lse = −inf) stays 0, its lse the sink."""
    sink = per_row(sink, lse.shape[:-1])                         # (..., h, 1)
    with np.errstate(over="ignore"):
        keep = 1 / (1 + np.exp(sink - lse))                      # (..., h, n_q) σ(lse − sink), 0 for lse = −inf
    return out * keep[..., None], np.logaddexp(lse, sink)        # (..., h, n_q, d_v), (..., h, n_q)


def softmax_with_sink(s: np.ndarray, sink: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The weights ``a`` (..., h, n_q, n_k) of scores ``s`` (−inf where masked) with the sink in each row's
    denominator, and the sink's own weight ``p_sink`` (..., h, n_q). ``sink`` broadcasts to (..., h)."""
    sink = per_row(sink, s.shape[:-2])[..., None]                # (..., h, 1, 1)
    m = np.maximum(np.max(s, axis=-1, keepdims=True, initial=-np.inf), sink)   # (..., h, n_q, 1) finite
    e = np.exp(s - m)                                            # (..., h, n_q, n_k) 0 where masked
    e_sink = np.exp(sink - m)                                    # (..., h, n_q, 1)
    total = e.sum(-1, keepdims=True) + e_sink                    # (..., h, n_q, 1) >= 1
    e /= total
    return e, (e_sink / total)[..., 0]                           # (..., h, n_q, n_k), (..., h, n_q)


def sink_grad(p_sink: np.ndarray, out: np.ndarray, do: np.ndarray, shape: tuple) -> np.ndarray:
    """dL/dsink in the sink's own ``shape``: ``− Σ_i p_sink,i (dout_i · out_i)``, summed over the queries and
    every axis the sink was broadcast along. ``p_sink`` (..., h, n_q), ``out`` and ``do`` (..., h, n_q, d_v)."""
    full = -np.einsum("...i,...id,...id->...", p_sink, out, do)   # (..., h)
    return unbroadcast(full, shape)


def sink_weight(lse: np.ndarray, sink: np.ndarray) -> np.ndarray:
    """``p_sink`` (..., h, n_q) from the sink-aware lse': ``exp(sink − lse')``."""
    return np.exp(per_row(sink, lse.shape[:-1]) - lse)           # (..., h, n_q)
