"""A small attention language model, trained with attnlab's own backward pass and Adam.

Token embedding + positions (learned, sinusoidal, RoPE or ALiBi) -> layers of causal multi-head attention
with W_O and a residual -> unembedding. ``attnlab train`` and ``attnlab generate`` drive it; its losses are
set beside the n-gram floors of the guide's first section and add-α count predictors.
"""

from .model import AttentionLM, LMConfig, forward, generate, loss, loss_and_grad
from .text import Vocab, split_heldout

__all__ = ["AttentionLM", "LMConfig", "Vocab", "forward", "generate", "loss", "loss_and_grad", "split_heldout"]
