"""QK-norm: q and k each normalised (an RMSNorm) after their projection and before RoPE, so no score can grow
without bound however large the residual stream gets (Dehghani et al., 2023; Wortsman et al., 2023).

Two kinds, one object (:class:`QKNorm`) that an :class:`~attnlab.layer.config.AttentionConfig` holds and the
one attention layer (:mod:`attnlab.layer.multihead`) calls between ``hook_q``/``hook_k`` and RoPE:

- ``over="head"`` (Qwen3, Gemma-3): each head's d_head features divided by their own root mean square, then
  scaled by one weight (d_head,) that every head shares (one for q, one for k);
- ``over="all"`` (OLMo-2): all of a token's q features (h·d_head) divided by one root mean square, scaled by
  a weight (h·d_head,) per feature; k likewise over its h_kv·d_head.

RMS is blind to the order of the features, so a checkpoint's q/k column permutation (RoPE's pairs) only
permutes the weights. The backward sits beside the forward, as :func:`attnlab.stack.layers.rms_norm`'s does.

>>> q = np.array([[[[3.0, 4.0]]]])                  # (B, h, n, d_head) = (1, 1, 1, 2): rms √12.5
>>> QKNorm(eps=0.0)(q, np.ones(2))[0].round(4)
array([[[[0.8485, 1.1314]]]])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels._checks import as_choice

KINDS = ("head", "all")


@dataclass(frozen=True)
class QKNorm:
    """RMSNorm of q and k before RoPE; ``over`` says over which features (see the module's docstring)."""
    over: str = "head"      # "head": each head's d_head (Qwen3, Gemma-3); "all": the whole projection (OLMo-2)
    eps: float = 1e-6       # added to the mean of squares, as config.json's rms_norm_eps
    name = "qk_norm"

    def __post_init__(self):
        as_choice("qk_norm over", self.over, KINDS)
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or not self.eps >= 0:
            raise ValueError(f"qk_norm eps must be a number >= 0, got {self.eps!r}")
        object.__setattr__(self, "eps", float(self.eps))

    def shapes(self, n_heads: int, n_kv_heads: int, d_head: int) -> dict[str, tuple]:
        """The weights' shapes: ``q_norm`` and ``k_norm``."""
        return {"q_norm": (d_head,) if self.over == "head" else (n_heads * d_head,),
                "k_norm": (d_head,) if self.over == "head" else (n_kv_heads * d_head,)}

    @property
    def axes(self) -> tuple:
        """The axes of (..., h, n, d_head) one root mean square is taken over."""
        return (-1,) if self.over == "head" else (-3, -1)

    def _weight(self, weight: np.ndarray, x: np.ndarray) -> np.ndarray:
        return weight if self.over == "head" else weight.reshape(x.shape[-3], 1, x.shape[-1])   # (h, 1, d_head)

    def __call__(self, x: np.ndarray, weight: np.ndarray, keep: bool = False):
        """``(y, saved)``: x (..., h, n, d_head) normalised and scaled, y of x's dtype; ``saved`` (the normalised
        x and the divisor, what :meth:`backward` needs) when ``keep``, else None. The mean of squares is taken
        in at least float32."""
        x32 = x if x.dtype.itemsize >= 4 else x.astype(np.float32)
        ms = np.mean(x32 * x32, axis=self.axes, keepdims=True)    # (..., h, n, 1) or (..., 1, n, 1)
        scale = np.sqrt(ms + self.eps)                            # (..., h|1, n, 1) √(mean(x²) + eps)
        xhat = (x32 / scale).astype(x.dtype, copy=False)          # (..., h, n, d_head)
        y = xhat * self._weight(weight, x)                        # (..., h, n, d_head)
        return y, ((xhat, scale) if keep else None)

    def backward(self, saved, dy: np.ndarray, weight: np.ndarray):
        """Backward of :meth:`__call__`: ``(dx, dweight)`` from dL/dy (..., h, n, d_head)."""
        xhat, scale = saved                                       # (..., h, n, d_head), (..., h|1, n, 1)
        # forward: y = xhat * weight
        if self.over == "head":
            dweight = (dy * xhat).reshape(-1, xhat.shape[-1]).sum(0)   # (d_head,)
        else:
            per = (dy * xhat).reshape(-1, *xhat.shape[-3:]).sum((0, 2))   # (h, d_head)
            dweight = per.reshape(-1)                             # (h·d_head,)
        dxhat = dy * self._weight(weight, dy)                     # (..., h, n, d_head)
        # forward: xhat = x / scale, scale = √(mean(x²) + eps) over the axes: take out dxhat's part along xhat
        dx = (dxhat - xhat * np.mean(dxhat * xhat, axis=self.axes, keepdims=True)) / scale   # (..., h, n, d_head)
        return dx.astype(dy.dtype, copy=False), dweight.astype(weight.dtype, copy=False)

    def to_json(self) -> dict:
        return {"over": self.over, "eps": self.eps}

    @classmethod
    def from_json(cls, data) -> "QKNorm | None":
        """The inverse of :meth:`to_json` (None stays None)."""
        if data is None:
            return None
        if not isinstance(data, dict):
            raise ValueError(f"qk_norm must be null or an object with 'over' and 'eps', got {data!r}")
        try:
            return cls(**data)
        except TypeError:
            raise ValueError(f"qk_norm takes 'over' and 'eps', got {sorted(data)}") from None
