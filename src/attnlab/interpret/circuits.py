"""A head's QK and OV circuits as low-rank products, and how heads of different layers compose
(Elhage et al., 2021, "A Mathematical Framework for Transformer Circuits").

In attnlab's row-vector convention (x W), head h of a layer reads the residual x (d_model,) and

    QK = W_Q[h] W_K[h]ᵀ          (d_model, d_model), rank <= d_head: the score is x_q QK x_kᵀ / √d_head
    OV = W_V[h] W_O[h]           (d_model, d_model), rank <= d_head: what a key's x writes, weighted

W_Q[h] is the head's d_head columns of W_Q, W_O[h] its d_head rows of W_O (a GQA head reads the K/V head of
its group). Both are kept as :class:`FactoredMatrix` (A (d_in, r), B (r, d_out)): a d_model² matrix is never
built to get its norm or its singular values.

The block's pre-norm weight is folded in by default (``fold_ln``): x is normalised, then scaled by ln_1's
weight, before W_Q, W_K, W_V, so the circuit as the normalised residual sees it is diag(w) W. A LayerNorm's
centring and the biases are left out, as in TransformerLens's circuits. Positions are left out too (RoPE
rotates q and k by position; the QK circuit here is that of two tokens at the same position).

The composition score of a product of two circuits is ``‖W_A W_B‖_F / (‖W_A‖_F ‖W_B‖_F)`` (TL's
``composition_score``): for a head h1 of an earlier layer and h2 of a later one,

    Q-composition: OV_h1 QK_h2      (h1's output read as h2's query)
    K-composition: OV_h1 QK_h2ᵀ     (h1's output read as h2's key)
    V-composition: OV_h1 OV_h2      (h1's output read as h2's value)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..stack.blocks import PostNormBlock
from ..stack.transformer import Transformer


@dataclass(frozen=True, eq=False)
class FactoredMatrix:
    """The matrix A B, kept as its factors A (d_in, r) and B (r, d_out), in float64."""
    A: np.ndarray
    B: np.ndarray

    def __post_init__(self):
        A, B = np.asarray(self.A, np.float64), np.asarray(self.B, np.float64)
        if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:
            raise ValueError(f"A and B must be (d_in, r) and (r, d_out), got shapes {A.shape} and {B.shape}")
        object.__setattr__(self, "A", A)
        object.__setattr__(self, "B", B)

    @property
    def shape(self) -> tuple[int, int]:
        return self.A.shape[0], self.B.shape[1]

    @property
    def AB(self) -> np.ndarray:
        """The product itself (d_in, d_out)."""
        return self.A @ self.B

    @property
    def T(self) -> "FactoredMatrix":
        return FactoredMatrix(self.B.T, self.A.T)

    def __matmul__(self, other):
        """Another FactoredMatrix or a dense matrix on the right: still factored (the inner rank kept)."""
        if isinstance(other, FactoredMatrix):
            return FactoredMatrix(self.A, (self.B @ other.A) @ other.B)
        return FactoredMatrix(self.A, self.B @ np.asarray(other, np.float64))

    def __rmatmul__(self, other):
        return FactoredMatrix(np.asarray(other, np.float64) @ self.A, self.B)

    def _core(self):
        """Q_A, the r × r core R_A R_Bᵀ, Q_B: A B = Q_A (R_A R_Bᵀ) Q_Bᵀ with orthonormal Q_A, Q_B."""
        qa, ra = np.linalg.qr(self.A)                                   # (d_in, r), (r, r)
        qb, rb = np.linalg.qr(self.B.T)                                 # (d_out, r), (r, r)
        return qa, ra @ rb.T, qb

    def svd(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """U (d_in, r), S (r,), Vh (r, d_out) with A B = U diag(S) Vh, from the r × r core."""
        qa, core, qb = self._core()
        u, s, vh = np.linalg.svd(core)                                  # (r, r), (r,), (r, r)
        return qa @ u, s, vh @ qb.T

    @property
    def singular_values(self) -> np.ndarray:
        return np.linalg.svd(self._core()[1], compute_uv=False)       # (r,) largest first

    def norm(self) -> float:
        """The Frobenius norm ‖A B‖_F."""
        return float(np.linalg.norm(self._core()[1]))


def _check_head(model: Transformer, layer, head) -> tuple[int, int]:
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a Transformer, got {type(model).__name__}")
    c = model.config
    for name, v, top in (("layer", layer, c.n_layers), ("head", head, c.attention.n_heads)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < top:
            raise ValueError(f"{name} must be an int in [0, {top}), got {v!r}")
    return int(layer), int(head)


def _norm_before_attention(model: Transformer) -> bool:
    """ln_1 normalises the attention's input (pre-norm, parallel, sandwich), not the stream after it."""
    return not issubclass(model.config.block, PostNormBlock)


def _head_weights(model: Transformer, layer: int, fold_ln: bool) -> dict[str, np.ndarray]:
    """W_Q (h, d_model, d_head), W_K, W_V (h, d_model, d_head) per query head (GQA's K/V repeated), W_O
    (h, d_head, d_model), in float64, ln_1's weight folded into the first three when asked."""
    c, b = model.config.attention, model.blocks[layer]
    h, kv, d, dh = c.n_heads, c.n_kv_heads, c.d_model, c.d_head
    group = np.arange(h) // (h // kv)                                   # (h,) each query head's K/V head
    W = {"Q": b.attn.W_Q.reshape(d, h, dh).transpose(1, 0, 2),          # (h, d_model, d_head)
         "K": b.attn.W_K.reshape(d, kv, dh).transpose(1, 0, 2)[group],
         "V": b.attn.W_V.reshape(d, kv, dh).transpose(1, 0, 2)[group]}
    W = {k: v.astype(np.float64) for k, v in W.items()}
    if fold_ln and _norm_before_attention(model) and b.ln_1 is not None:
        w = b.ln_1.weight.astype(np.float64)[:, None]                   # (d_model, 1)
        W = {k: w * v for k, v in W.items()}
    W["O"] = b.attn.W_O.reshape(h, dh, d).astype(np.float64)            # (h, d_head, d_model)
    return W


def qk_circuit(model: Transformer, layer: int, head: int, *, fold_ln: bool = True) -> FactoredMatrix:
    """The head's QK circuit W_Q[h] W_K[h]ᵀ (d_model, d_model) as a :class:`FactoredMatrix` of rank d_head:
    the attention score of a query residual x_q on a key residual x_k is x_q QK x_kᵀ / √d_head (biases and
    positions left out)."""
    layer, head = _check_head(model, layer, head)
    W = _head_weights(model, layer, fold_ln)
    return FactoredMatrix(W["Q"][head], W["K"][head].T)


def ov_circuit(model: Transformer, layer: int, head: int, *, fold_ln: bool = True) -> FactoredMatrix:
    """The head's OV circuit W_V[h] W_O[h] (d_model, d_model) as a :class:`FactoredMatrix` of rank d_head:
    what a key's residual x contributes to the output, x OV, times its attention weight."""
    layer, head = _check_head(model, layer, head)
    W = _head_weights(model, layer, fold_ln)
    return FactoredMatrix(W["V"][head], W["O"][head])


@dataclass(frozen=True, eq=False)
class CircuitTokens:
    """The top singular directions of a circuit, each read as the tokens that align with it most."""
    singular_values: np.ndarray     # (k,) largest first
    in_tokens: np.ndarray           # (k, top) token ids whose input (the embedding) points most along u_i
    out_tokens: np.ndarray          # (k, top) token ids whose output side points most along v_i
    in_scores: np.ndarray           # (k, top) those projections
    out_scores: np.ndarray          # (k, top)


def embedding_inputs(model: Transformer, layer: int) -> np.ndarray:
    """The token embeddings W_E (vocab, d_model) as the block's attention reads them: through ln_1 in a
    pre-norm model (normalised, without the weight when the circuits fold it in). Positions left out."""
    W_E = model.W_E.astype(np.float64)                                  # (vocab, d_model)
    ln = model.blocks[layer].ln_1
    if not (_norm_before_attention(model) and ln is not None):
        return W_E
    x = W_E - W_E.mean(-1, keepdims=True) if hasattr(ln, "bias") else W_E
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + ln.eps)       # (vocab, d_model)


def read_circuit(model: Transformer, circuit: FactoredMatrix, layer: int, *, kind: str, k: int = 3,
                 top: int = 8) -> CircuitTokens:
    """The ``k`` largest singular values of ``circuit`` and, for each, the ``top`` tokens read through the
    embedding: the input side (u_i) against :func:`embedding_inputs`; the output side (v_i) against the
    embedding again for ``kind="qk"`` (the key tokens), against the unembedding W_U for ``kind="ov"`` (the
    tokens the head's output promotes). A singular vector's sign is arbitrary: the pair (u_i, v_i) is
    flipped so that its largest input projection is positive."""
    if kind not in ("qk", "ov"):
        raise ValueError(f"kind must be 'qk' or 'ov', got {kind!r}")
    U, S, Vh = circuit.svd()                                            # (d, r), (r,), (r, d)
    k = min(k, S.size)
    E = embedding_inputs(model, layer)                                  # (vocab, d_model)
    if kind == "qk":
        out_side = E.T                                                  # (d_model, vocab)
    elif model.config.tied_embeddings:
        out_side = model.W_E.T.astype(np.float64)
    else:
        out_side = model.W_U.astype(np.float64)
    p_in = E @ U[:, :k]                                                 # (vocab, k)
    p_out = Vh[:k] @ out_side                                           # (k, vocab)
    flip = np.where(np.abs(p_in.max(0)) >= np.abs(p_in.min(0)), 1.0, -1.0)   # (k,)
    p_in, p_out = p_in * flip, p_out * flip[:, None]
    top = min(top, E.shape[0])
    ins = np.argsort(-p_in.T, axis=-1, kind="stable")[:, :top]         # (k, top)
    outs = np.argsort(-p_out, axis=-1, kind="stable")[:, :top]         # (k, top)
    return CircuitTokens(singular_values=S[:k], in_tokens=ins, out_tokens=outs,
                         in_scores=np.take_along_axis(p_in.T, ins, -1),
                         out_scores=np.take_along_axis(p_out, outs, -1))


@dataclass(frozen=True, eq=False)
class CompositionScores:
    """Q, K and V composition of every earlier head (l1, h1) into every later head (l2, h2):
    each (n_layers, n_heads, n_layers, n_heads), [l1, h1, l2, h2], 0 where l1 >= l2."""
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray


def composition_scores(model: Transformer, *, fold_ln: bool = True) -> CompositionScores:
    """Elhage et al.'s composition scores between heads of different layers, from the factors alone: with
    A = Q_A R_A (QR), ‖A M Bᵀ‖_F = ‖R_A M R_Bᵀ‖_F, so each pair costs d_head³ whatever d_model."""
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a Transformer, got {type(model).__name__}")
    c = model.config
    L, H = c.n_layers, c.attention.n_heads
    W = [_head_weights(model, i, fold_ln) for i in range(L)]
    r = lambda M: np.linalg.qr(M)[1]                                   # noqa: E731  (h, d, dh) -> (h, dh, dh)
    R_Q, R_K, R_V = (np.stack([r(w[x]) for w in W]) for x in "QKV")     # (L, h, dh, dh) each
    R_O = np.stack([r(np.swapaxes(w["O"], -1, -2)) for w in W])         # (L, h, dh, dh): W_Oᵀ = Q R
    norm = lambda M: np.sqrt((M * M).sum((-1, -2)))                    # noqa: E731
    n_ov = norm(R_V @ np.swapaxes(R_O, -1, -2))                         # (L, h) ‖W_V W_O‖
    n_qk = norm(R_Q @ np.swapaxes(R_K, -1, -2))                         # (L, h) ‖W_Q W_Kᵀ‖
    out = {m: np.zeros((L, H, L, H)) for m in "qkv"}
    for l1 in range(L):
        for l2 in range(l1 + 1, L):
            out1 = np.einsum("aij,ajk->aik", R_V[l1], W[l1]["O"])      # (h1, dh, d_model) R_V1 W_O1
            # mid[x][a, b] = R_V1[a] W_O1[a] W_x2[b] (dh, dh): h1's output read by h2's x projection
            mid = {x: np.einsum("aij,bjk->abik", out1, W[l2][x]) for x in "QKV"}   # (h1, h2, dh, dh)
            for x, other in (("Q", R_K[l2]), ("K", R_Q[l2]), ("V", R_O[l2])):
                M = mid[x] @ np.swapaxes(other, -1, -2)[None]           # (h1, h2, dh, dh)
                denom = n_ov[l1][:, None] * (n_ov[l2] if x == "V" else n_qk[l2])[None]   # (h1, h2)
                with np.errstate(invalid="ignore", divide="ignore"):
                    out[x.lower()][l1, :, l2, :] = np.where(denom > 0, norm(M) / denom, 0.0)   # a zero head: 0
    return CompositionScores(q=out["q"], k=out["k"], v=out["v"])
