"""attnlab: the attention mechanism of transformers, in numpy.

It follows the guide "Attention: letting tokens look at each other" (part 4 of How LLMs work):
a learner can compute an attention output by hand, read the equation symbol by symbol, draw the
causal mask and count the cost; an engineer gets a correct, fast attention.

Axis letters, used in every shape comment::

    ...      leading axes that broadcast: batch, heads
    B        batch
    h        heads (n_heads)
    n        tokens in the sequence;  n_q queries, n_k keys
    d_model  width of a token's vector
    d_k      width of a query and a key;  d_v  width of a value
    d_head   width of one head's q, k, v (GPT-2: d_model / h = 64)
    n_ctx    positions a model has rows for (GPT-2: 1024)
"""

from .kernels.attention import (attention, attention_backward, attention_forward, attention_grad, attention_path,
                                attention_weights)
from .viz.attnmap import AttentionMap
from .layer.cache import KVCache
from .layer.streaming import SinkWindow, StreamingCache
from .layer.config import GPT2_SMALL, AttentionConfig
from .stack.activation_cache import ActivationCache
from .stack.hooks import hook_names, run_with_cache, run_with_hooks
from .kernels.masks import additive_mask, causal_mask
from .layer.multihead import (MultiHeadAttention, merge_heads, multihead_attention, multihead_attention_grad,
                        multihead_attention_with_weights, split_heads)
from .layer.positions import (ALiBi, Learned, RoPE, Sinusoidal, alibi_bias, alibi_slopes, learned_positions, rope,
                        sinusoidal_positions)
from .kernels.softmax import softmax
from .stack.blocks import BLOCKS, ParallelBlock, PostNormBlock, PreNormBlock, SandwichBlock
from .stack.transformer import ModelConfig, ModelOutput, Transformer, forward, generate, new_caches
from .viz.summary import HeadSummary, summarize_heads
from .kernels.tiled import attention_weights_rows

__version__ = "0.1.0"

__all__ = [
    "ALiBi",
    "ActivationCache",
    "AttentionConfig",
    "AttentionMap",
    "BLOCKS",
    "GPT2_SMALL",
    "HeadSummary",
    "KVCache",
    "Learned",
    "ModelConfig",
    "ModelOutput",
    "MultiHeadAttention",
    "ParallelBlock",
    "PostNormBlock",
    "PreNormBlock",
    "RoPE",
    "SandwichBlock",
    "SinkWindow",
    "Sinusoidal",
    "StreamingCache",
    "Transformer",
    "additive_mask",
    "alibi_bias",
    "alibi_slopes",
    "attention",
    "attention_backward",
    "attention_forward",
    "attention_grad",
    "attention_path",
    "attention_weights",
    "attention_weights_rows",
    "causal_mask",
    "forward",
    "generate",
    "hook_names",
    "learned_positions",
    "merge_heads",
    "multihead_attention",
    "multihead_attention_grad",
    "multihead_attention_with_weights",
    "new_caches",
    "rope",
    "run_with_cache",
    "run_with_hooks",
    "sinusoidal_positions",
    "softmax",
    "split_heads",
    "summarize_heads",
]
