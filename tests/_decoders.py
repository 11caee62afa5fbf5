"""The small models every option of ModelConfig and AttentionConfig makes, shared by the tests of the one
forward (test_one_forward) and of the decode step's bits (test_decode_step_bits)."""

import numpy as np

from attnlab.layer.config import AttentionConfig
from attnlab.layer.positions import ALiBi, Learned, RoPE, Sinusoidal
from attnlab.stack.blocks import ParallelBlock, PostNormBlock, SandwichBlock
from attnlab.stack.layers import LayerNorm, RMSNorm
from attnlab.stack.transformer import ModelConfig, Transformer

V = 13


def attn(**kw):
    return AttentionConfig(**{"d_model": 8, "n_heads": 2, "n_ctx": 12, **kw})


BASE = dict(d_mlp=12, activation="gelu_new", norm=LayerNorm)
GEMMA2 = dict(d_mlp=12, activation="gelu_pytorch_tanh", mlp="gated", norm=RMSNorm, block=SandwichBlock,
              tied_embeddings=True, embed_scale=4.0, logit_softcap=3.0,
              attention=attn(positions=RoPE(theta=100.0), n_kv_heads=1, scale=0.4, softcap=2.0),
              layers=(attn(positions=RoPE(theta=100.0), n_kv_heads=1, scale=0.4, softcap=2.0, window=2),
                      attn(positions=RoPE(theta=100.0), n_kv_heads=1, scale=0.4, softcap=2.0)))

# every option that changes the forward, one at a time on a small pre-norm model (the families' wirings last)
OPTIONS = {
    "plain": dict(BASE, attention=attn()),
    "embed_scale": dict(BASE, attention=attn(), embed_scale=4.0),
    "logit_softcap": dict(BASE, attention=attn(), logit_softcap=2.5),
    "softcap": dict(BASE, attention=attn(softcap=1.5)),
    "scale": dict(BASE, attention=attn(scale=0.7)),
    "window": dict(BASE, attention=attn(window=2)),
    "layers": dict(BASE, attention=attn(), layers=(attn(window=2, softcap=1.5), attn(scale=0.5))),
    "post_norm": dict(BASE, attention=attn(), block=PostNormBlock),
    "parallel": dict(BASE, attention=attn(positions=RoPE()), block=ParallelBlock),
    "sandwich": dict(BASE, attention=attn(positions=RoPE()), block=SandwichBlock),
    "rope": dict(BASE, attention=attn(positions=RoPE(theta=50.0))),
    "rotary_dim": dict(BASE, attention=attn(positions=RoPE(theta=50.0, rotary_dim=2))),
    "alibi": dict(BASE, attention=attn(positions=ALiBi())),
    "learned": dict(BASE, attention=attn(positions=Learned())),
    "sinusoidal": dict(BASE, attention=attn(positions=Sinusoidal())),
    "tied": dict(BASE, attention=attn(), tied_embeddings=True),
    "rms_norm": dict(BASE, attention=attn(), norm=RMSNorm),
    "no_norms": dict(attention=attn(), d_mlp=12),
    "attention_only": dict(attention=attn()),
    "gated_mlp": dict(BASE, attention=attn(), mlp="gated", activation="silu"),
    "gelu_relu": dict(BASE, attention=attn(), activation="relu"),
    "gqa": dict(BASE, attention=attn(n_heads=4, n_kv_heads=2, d_head=2, positions=RoPE())),
    "encoder": dict(BASE, attention=attn(), block=PostNormBlock, is_causal=False, n_types=2, embed_norm=True,
                    activation="gelu"),
    "encoder_no_head": dict(BASE, attention=attn(), block=PostNormBlock, is_causal=False, has_logits=False,
                            n_types=2, embed_norm=True),
    "gemma2": GEMMA2,
}




def random_model(options: dict, rng, *, n_layers: int = 2, dtype=np.float64) -> Transformer:
    """A model of ``options``, every array random (norm weights and biases too)."""
    model = Transformer.init(ModelConfig(vocab_size=V, n_layers=n_layers, **options), rng=rng, std=0.4, dtype=dtype)
    for name, p in model.params().items():
        if name.endswith(("weight", "bias")) or ".b_" in name or name == "b_U":
            p[...] = name.endswith("weight") + rng.normal(0, 0.3, p.shape)
    return model
