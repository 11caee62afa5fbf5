"""The whole stack's backward (stack/backward.py, lm.loss_and_grad): finite differences in float64 on tiny
models of every wiring the families use, and the gradients of named activations against perturbing them
through the forward's own hooks."""

import numpy as np
import pytest

from attnlab.layer.config import AttentionConfig
from attnlab.layer.positions import Learned, RoPE
from attnlab.lm.model import IGNORE, loss, loss_and_grad
from attnlab.stack.backward import grad_hook_names
from attnlab.stack.hooks import run_with_hooks
from attnlab.stack.blocks import ParallelBlock, PostNormBlock, SandwichBlock
from attnlab.stack.layers import LayerNorm, RMSNorm
from attnlab.stack.transformer import ModelConfig, Transformer

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 4}
V = 11

WIRINGS = {
    "gpt2": dict(attention=AttentionConfig(d_model=8, n_heads=2, n_ctx=6), d_mlp=12, activation="gelu_new",
                 norm=LayerNorm, tied_embeddings=True),
    "bert": dict(attention=AttentionConfig(d_model=8, n_heads=2, n_ctx=6), d_mlp=12, activation="gelu",
                 norm=LayerNorm, block=PostNormBlock, is_causal=False, has_logits=False, n_types=2, embed_norm=True),
    "llama": dict(attention=AttentionConfig(d_model=8, n_heads=4, n_kv_heads=2, d_head=2, n_ctx=6,
                                            positions=RoPE(theta=500.0, scaling=LLAMA3)),
                  d_mlp=12, activation="silu", mlp="gated", norm=RMSNorm),
    "own": dict(attention=AttentionConfig(d_model=8, n_heads=2, n_ctx=6, positions=Learned())),
    "neox-parallel": dict(attention=AttentionConfig(d_model=8, n_heads=2, n_ctx=6, positions=RoPE()), d_mlp=12,
                          activation="gelu", norm=LayerNorm, block=ParallelBlock),
    "gemma2-sandwich": dict(attention=AttentionConfig(d_model=8, n_heads=2, n_ctx=6, positions=RoPE()), d_mlp=12,
                            activation="gelu_new", mlp="gated", norm=RMSNorm, block=SandwichBlock),
    "mistral-window": dict(attention=AttentionConfig(d_model=8, n_heads=2, n_ctx=6, window=2, positions=RoPE()),
                           d_mlp=12, activation="relu", norm=RMSNorm),
}


def tiny(wiring, rng):
    """A float64 model of the wiring with every weight random, biases and norm weights too."""
    model = Transformer.init(ModelConfig(vocab_size=V, n_layers=2, **WIRINGS[wiring]), rng=rng, std=0.4,
                             dtype=np.float64)
    for name, p in model.params().items():
        if name.endswith(("weight", "bias")) or ".b_" in name or name == "b_U":
            p[...] = (name.endswith("weight")) + rng.normal(0, 0.3, p.shape)
    return model


def data(model, rng):
    ids, targets = rng.integers(0, V, (2, 5)), rng.integers(0, V, (2, 5))
    if not model.config.is_causal:
        targets[rng.random(targets.shape) < 0.5] = IGNORE                # a masked-LM scores some positions
        targets[0, 0] = 3
    return ids, targets


def sample_entries(p, rng, k=4):
    """Up to k random positions of p."""
    flat = rng.choice(p.size, size=min(k, p.size), replace=False)
    return [np.unravel_index(i, p.shape) for i in flat]


@pytest.mark.parametrize("wiring", sorted(WIRINGS))
def test_every_parameter_gradient_matches_finite_differences(wiring, rng, param_grads):
    model = tiny(wiring, rng)
    ids, targets = data(model, rng)
    types = rng.integers(0, 2, ids.shape) if model.config.n_types else None
    value, grads = loss_and_grad(model, ids, targets, token_types=types)
    f = lambda: loss(model, ids, targets, token_types=types)           # noqa: E731
    assert value == pytest.approx(f(), rel=1e-12)
    param_grads(grads, model.params(), f, lambda p: sample_entries(p, rng))


@pytest.mark.parametrize("wiring", ["gpt2", "bert", "llama", "neox-parallel", "gemma2-sandwich"])
def test_named_activation_gradients_match_perturbing_them_through_the_hooks(wiring, rng):
    model = tiny(wiring, rng)
    ids, targets = data(model, rng)
    names = [n for n in grad_hook_names(model) if n.startswith(("blocks.", "ln_"))]
    assert "blocks.0.attn.hook_z" in names and "blocks.1.hook_resid_pre" in names
    _, grads = loss_and_grad(model, ids, targets, grad_names=names)
    from attnlab.lm.model import cross_entropy
    from attnlab.stack.transformer import logits_of

    for name in names:
        g = grads[name]
        for i in sample_entries(g, rng, k=2):
            def shifted(delta):
                def hook(x, _):
                    x = x.copy()
                    x[i] += delta
                    return x
                hidden = run_with_hooks(model, ids, {name: hook}).hidden_states[-1]
                return cross_entropy(logits_of(model, hidden), targets)[0]
            numeric = (shifted(1e-6) - shifted(-1e-6)) / 2e-6
            assert g[i] == pytest.approx(numeric, rel=1e-5, abs=1e-8), (name, i)
