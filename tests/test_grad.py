"""grad(model, ids, metric, at=[...]): the gradient of any scalar metric of the logits at any hook point, from the
taped forward and the hand-written backward, against central differences through the forward's own hooks (float64).
torch autograd on the same weights is in tests/test_llama.py."""

import numpy as np
import pytest

from attnlab.layer.config import AttentionConfig
from attnlab.layer.positions import Learned, RoPE
from attnlab.stack.backward import grad, grad_hook_names, logit_difference, logit_of
from attnlab.stack.blocks import ParallelBlock, PostNormBlock, SandwichBlock
from attnlab.stack.hooks import run_with_hooks
from attnlab.stack.layers import LayerNorm, RMSNorm
from attnlab.stack.transformer import ModelConfig, Transformer

V = 11
WIRINGS = {
    "gpt2": dict(attention=AttentionConfig(d_model=8, n_heads=2, n_ctx=8, positions=Learned()), d_mlp=12,
                 activation="gelu_new", norm=LayerNorm, tied_embeddings=True),
    "llama": dict(attention=AttentionConfig(d_model=8, n_heads=4, n_kv_heads=2, d_head=2, n_ctx=8,
                                            positions=RoPE(theta=50.0)), d_mlp=12, activation="silu", mlp="gated",
                  norm=RMSNorm),
    "neox": dict(attention=AttentionConfig(d_model=8, n_heads=2, n_ctx=8, positions=RoPE(rotary_dim=2)), d_mlp=12,
                 activation="gelu_new", norm=LayerNorm, block=ParallelBlock),   # not gelu: a fit
    "gemma2": dict(attention=AttentionConfig(d_model=8, n_heads=2, n_ctx=8, positions=RoPE(), softcap=2.0), d_mlp=12,
                   activation="gelu_new", mlp="gated", norm=RMSNorm, block=SandwichBlock, embed_scale=2.8,
                   logit_softcap=4.0, tied_embeddings=True),
    "post_norm": dict(attention=AttentionConfig(d_model=8, n_heads=2, n_ctx=8), d_mlp=12, norm=LayerNorm,
                      block=PostNormBlock),
}


def tiny(wiring, rng):
    model = Transformer.init(ModelConfig(vocab_size=V, n_layers=2, **WIRINGS[wiring]), rng=rng, std=0.4,
                             dtype=np.float64)
    for name, p in model.params().items():
        if name.endswith(("weight", "bias")) or ".b_" in name or name == "b_U":
            p[...] = name.endswith("weight") + rng.normal(0, 0.3, p.shape)
    return model


@pytest.mark.parametrize("wiring", sorted(WIRINGS))
def test_grad_at_every_point_matches_perturbing_it_through_the_hooks(wiring, rng):
    model = tiny(wiring, rng)
    ids = rng.integers(0, V, (2, 6))
    metric = logit_difference(3, 7)
    names = grad_hook_names(model)
    g = grad(model, ids, metric, at=names)
    assert set(g.at) == set(names) and g.value == pytest.approx(metric(run_with_hooks(model, ids, {}).logits)[0])
    for want in ("hook_attn_in", "hook_mlp_in", "attn.hook_q", "ln_1.hook_normalized", "ln_1.hook_out"):
        assert f"blocks.0.{want}" in names or (want.startswith("ln_1") and wiring == "post_norm")
    if model.config.attention.positions.rotates:
        assert "blocks.1.attn.hook_rot_k" in names
    for name in names:
        for i in [np.unravel_index(j, g.at[name].shape) for j in rng.choice(g.at[name].size, size=2, replace=False)]:
            def shifted(delta):
                def hook(x, _):
                    x = x.copy()
                    x[i] += delta
                    return x
                return metric(run_with_hooks(model, ids, {name: hook}).logits)[0]
            numeric = (shifted(1e-6) - shifted(-1e-6)) / 2e-6
            assert g.at[name][i] == pytest.approx(numeric, rel=1e-5, abs=1e-8), (name, i)


def test_grad_of_a_parameter_and_of_one_logit(rng):
    model = tiny("llama", rng)
    ids = rng.integers(0, V, 5)
    g = grad(model, ids, logit_of(4, position=2))
    w = model.params()["blocks.1.mlp.W_in"]
    f = lambda: run_with_hooks(model, ids, {}).logits[2, 4]            # noqa: E731
    w[1, 2] += 1e-6
    up = f()
    w[1, 2] -= 2e-6
    down = f()
    w[1, 2] += 1e-6
    assert g.params["blocks.1.mlp.W_in"][1, 2] == pytest.approx((up - down) / 2e-6, rel=1e-6)


def test_grad_says_what_is_wrong(rng):
    model = tiny("gpt2", rng)
    with pytest.raises(ValueError, match="metric must return \\(value, dvalue/dlogits\\)"):
        grad(model, [1, 2], lambda logits: float(logits[-1, 3]))
    with pytest.raises(ValueError, match="grad_names has \\['blocks.0.attn.hook_pattern'\\]"):
        grad(model, [1, 2], logit_of(3), at=["blocks.0.attn.hook_pattern"])
    with pytest.raises(ValueError, match="answer must be a token id"):
        logit_difference(-1, 2)
