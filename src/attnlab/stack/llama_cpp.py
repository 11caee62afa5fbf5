"""The ``q8-activations`` mode's arithmetic between its products: llama.cpp's, so its logits are llama.cpp's bits.

The q8 mode rounds x to 8 bits before every product (:mod:`attnlab.kernels.q8_activations`), and those products
are llama.cpp's ``ggml_vec_dot`` bit for bit. That alone left its logits about 3% from llama.cpp's on SmolLM2:
an 8-bit rounding makes the network discontinuous, so a last-place difference anywhere between the products
(the norm's sum, RoPE's cos and sin, the softmax's exp, float16 in attention) flips a few roundings of x and grows
to the quantization noise's scale. So the mode takes llama.cpp's arithmetic for every op between the products
(:mod:`attnlab.kernels.ggml_arith` states and tests each), as parts of the one stack, each a small object:

============  ==========================================================================
part          the q8 mode's                         in place of
============  ==========================================================================
norms         :class:`~attnlab.stack.layers.LlamaCppRMSNorm`        RMSNorm
positions     :class:`~attnlab.layer.positions.LlamaCppRoPE`        RoPE
attention     :class:`~attnlab.layer.multihead.LlamaCppAttention`   MultiHeadAttention's kernels
MLP           activation ``"silu_llama_cpp"``                         ``"silu"``
============  ==========================================================================

:func:`llama_cpp_arithmetic` swaps them into a Llama-like model (RMSNorm, RoPE without scaling, a SwiGLU MLP,
pre-norm blocks, no QK-norm, sinks or experts) and leaves any other model as it is. The exact modes never see
these parts: their logits stay within 1e-5 of float32.

Measured (benchmarks/ggml_ops_vs_llama_cpp.py, tests/test_q8_llama_cpp.py): SmolLM2-135M Q4_1 against llama.cpp
0.3.36 built natively for this Xeon (AVX-512; flash-attention off, its float16 cache): every tensor of all 30
layers llama.cpp's bits for a 12-token prompt and two decode steps, all 64 greedy tokens and every logit equal,
and the same for a 519-token prompt (two of llama.cpp's 512-token batches) and 16 steps. It is the AVX-512
build's arithmetic: an AVX2 build of llama.cpp takes another exp (``ggml_v_expf``'s AVX2 form) and 8-lane sums,
which these parts do not follow. Batched rows (a leading batch axis) and padded positions take the float32
arithmetic between the products.
"""

from __future__ import annotations

import dataclasses

from ..layer.multihead import LlamaCppAttention, MultiHeadAttention
from ..layer.positions import LlamaCppRoPE, RoPE
from .blocks import PreNormBlock
from .layers import GatedMLP, LlamaCppRMSNorm, RMSNorm
from .transformer import Transformer

ACTIVATION = "silu_llama_cpp"        # the MLP's activation in this arithmetic (attnlab.stack.layers.ACTIVATIONS)


def takes(model: Transformer) -> bool:
    """Whether :func:`llama_cpp_arithmetic` has parts for this model: a Llama-like stack."""
    c = model.config
    attentions = [c.layer_attention(i) for i in range(c.n_layers)]
    return (c.norm is RMSNorm and c.mlp == "gated" and c.activation == "silu" and c.block is PreNormBlock
            and c.experts is None and c.embed_norm is False
            and all(type(a.positions) is RoPE and a.positions.scaling is None and a.positions.rotary_dim is None
                    and a.qk_norm is None and not a.sinks for a in attentions)
            and all(type(b.attn) is MultiHeadAttention and isinstance(b.mlp, GatedMLP) for b in model.blocks))


def llama_cpp_arithmetic(model: Transformer) -> Transformer:
    """``model`` with llama.cpp's arithmetic between its products (the table above), the same weights; a model
    it has no parts for (:func:`takes`) comes back as it is."""
    if not takes(model):
        return model
    c = model.config
    turned = lambda a: dataclasses.replace(a, positions=LlamaCppRoPE(theta=a.positions.theta))   # noqa: E731
    config = dataclasses.replace(c, norm=LlamaCppRMSNorm, activation=ACTIVATION, attention=turned(c.attention),
                                 layers=tuple(turned(a) for a in c.layers))
    blocks = tuple(_block(b, config.layer_attention(i)) for i, b in enumerate(model.blocks))
    return dataclasses.replace(model, config=config, blocks=blocks, ln_final=_norm(model.ln_final))


def _norm(n: RMSNorm | None) -> LlamaCppRMSNorm | None:
    return None if n is None else LlamaCppRMSNorm(n.weight, n.eps)


def _block(b: PreNormBlock, attention) -> PreNormBlock:
    a = b.attn
    attn = LlamaCppAttention(W_Q=a.W_Q, W_K=a.W_K, W_V=a.W_V, W_O=a.W_O, b_Q=a.b_Q, b_K=a.b_K, b_V=a.b_V, b_O=a.b_O,
                             config=attention)
    return dataclasses.replace(b, attn=attn, ln_1=_norm(b.ln_1), ln_2=_norm(b.ln_2),
                               mlp=dataclasses.replace(b.mlp, activation=ACTIVATION))
