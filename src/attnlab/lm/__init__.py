"""attnlab's own small attention language model, trained with attnlab's own backward pass and Adam.

Token embedding + positions (learned, sinusoidal, RoPE or ALiBi) -> layers of causal multi-head attention
with W_O and a residual -> unembedding: a :class:`attnlab.stack.transformer.Transformer` of the shape
:func:`lm_config` states, run by the stack like every other model. ``attnlab train`` and ``attnlab
generate`` drive it; its losses are set beside the n-gram floors of the guide's first section and add-α
count predictors.
"""

from .model import cross_entropy, lm_config, loss, loss_and_grad
from .training import split_heldout

__all__ = ["cross_entropy", "lm_config", "loss", "loss_and_grad", "split_heldout"]
