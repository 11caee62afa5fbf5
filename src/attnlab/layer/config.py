"""Shapes of an attention layer, as a frozen dataclass: every size stated once, here."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..kernels._checks import as_positive_float, as_positive_int
from .positions import Learned, PositionScheme, check_scheme, scheme_from_json
from .qknorm import QKNorm


@dataclass(frozen=True)
class AttentionConfig:
    """The sizes of one multi-head attention layer, and its position scheme.

    Defaults are GPT-2 small's (Radford et al., 2019), the model the guide takes as its example.
    Grouped-query attention (Ainslie et al., 2023): ``n_kv_heads < n_heads`` key/value heads, each shared
    by ``n_heads / n_kv_heads`` query heads; multi-query attention is ``n_kv_heads=1``.
    """
    d_model: int = 768         # width of each token's vector
    n_heads: int = 12          # query heads run side by side
    d_head: int | None = None  # width of one head's q, k, v; None = d_model // n_heads, as GPT-2 does
    n_kv_heads: int | None = None   # key/value heads; None = n_heads (plain multi-head attention)
    n_ctx: int = 1024          # positions the model has rows for (GPT-2's W_P), or is trained for
    positions: PositionScheme = field(default_factory=Learned)   # Learned(), Sinusoidal(), RoPE(θ), ALiBi()
    window: int | None = None  # sliding window: each query sees the last `window` keys (with a causal mask)
    scale: float | None = None     # multiplies the scores; None = 1/√d_head (Gemma-2: query_pre_attn_scalar^-½)
    softcap: float | None = None   # scores capped to softcap · tanh(s / softcap) (Gemma-2); None = no cap
    sinks: bool = False        # a learned sink logit per head in each softmax's denominator (gpt-oss)
    qk_norm: QKNorm | None = None  # q and k RMS-normalised before RoPE (Qwen3, Gemma-3, OLMo-2); None = not

    def __post_init__(self):
        for name in ("d_model", "n_heads", "n_ctx"):
            as_positive_int(name, getattr(self, name))
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}) "
                                 "when d_head is not given")
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        as_positive_int("d_head", self.d_head)
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        as_positive_int("n_kv_heads", self.n_kv_heads)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads}): "
                             "each key/value head serves a whole group of query heads")
        as_positive_int("window", self.window, allow_none=True)
        for name in ("scale", "softcap"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, as_positive_float(name, getattr(self, name)))
        check_scheme(self.positions).check(self.d_model, self.d_head)
        if not isinstance(self.sinks, bool):
            raise TypeError(f"sinks must be True or False, got {type(self.sinks).__name__} {self.sinks!r}")
        if self.qk_norm is not None and not isinstance(self.qk_norm, QKNorm):
            raise TypeError(f"qk_norm must be a QKNorm or None, got {type(self.qk_norm).__name__}")

    @property
    def groups(self) -> int:
        """Query heads per key/value head."""
        return self.n_heads // self.n_kv_heads

    @property
    def n_params(self) -> int:
        """W_Q, W_K, W_V, W_O without biases (W_K and W_V have n_kv_heads·d_head columns)."""
        return 2 * self.d_model * self.d_head * (self.n_heads + self.n_kv_heads)

    @property
    def options(self) -> dict:
        """What the layer passes to :func:`attnlab.kernels.attention` besides q, k, v: window, scale, softcap."""
        return {"window": self.window, "scale": self.scale, "softcap": self.softcap}

    @property
    def n_params_with_bias(self) -> int:
        """Plus the four bias rows: b_Q of n_heads·d_head, b_K and b_V of n_kv_heads·d_head, b_O of d_model."""
        return self.n_params + (self.n_heads + 2 * self.n_kv_heads) * self.d_head + self.d_model

    def to_json(self) -> dict:
        return {"d_model": self.d_model, "n_heads": self.n_heads, "d_head": self.d_head,
                "n_kv_heads": self.n_kv_heads, "n_ctx": self.n_ctx, "positions": self.positions.to_json(),
                "window": self.window, "scale": self.scale, "softcap": self.softcap,
                **({"sinks": True} if self.sinks else {}),
                **({} if self.qk_norm is None else {"qk_norm": self.qk_norm.to_json()})}

    @classmethod
    def from_json(cls, data: dict) -> "AttentionConfig":
        """The inverse of :meth:`to_json`."""
        data = dict(data)
        data["positions"] = scheme_from_json(data.get("positions", "learned"))
        data["qk_norm"] = QKNorm.from_json(data.get("qk_norm"))
        return cls(**data)


GPT2_SMALL = AttentionConfig(d_model=768, n_heads=12, d_head=64, n_ctx=1024)
