"""Shapes of an attention layer, as a frozen dataclass."""

from __future__ import annotations

from dataclasses import dataclass

from ._checks import as_positive_int


@dataclass(frozen=True)
class AttentionConfig:
    """The sizes of one multi-head attention layer.

    Defaults are GPT-2 small's (Radford et al., 2019), the model the guide takes as its example.
    """
    d_model: int = 768       # width of each token's vector
    n_heads: int = 12        # heads run side by side
    d_head: int | None = None  # width of one head's q, k, v; None = d_model // n_heads, as GPT-2 does
    n_ctx: int = 1024        # positions the model has rows for (GPT-2's W_P)

    def __post_init__(self):
        for name in ("d_model", "n_heads", "n_ctx"):
            as_positive_int(name, getattr(self, name))
        if self.d_head is None:
            if self.d_model % self.n_heads:
                raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}) "
                                 "when d_head is not given")
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        as_positive_int("d_head", self.d_head)

    @property
    def n_params(self) -> int:
        """W_Q, W_K, W_V, W_O without biases."""
        return 4 * self.d_model * self.n_heads * self.d_head

    @property
    def n_params_with_bias(self) -> int:
        """Plus the four bias rows: three of n_heads·d_head, one of d_model."""
        return self.n_params + 3 * self.n_heads * self.d_head + self.d_model


GPT2_SMALL = AttentionConfig(d_model=768, n_heads=12, d_head=64, n_ctx=1024)
