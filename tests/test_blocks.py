"""Block kinds: each kind's forward against its residual lines written out in float64, the parameter tree
walked from the kinds' slots, and the hook points every kind shares (the norms', the MLP's, resid_mid,
each head's result)."""

import numpy as np
import pytest

from attnlab.layer.config import AttentionConfig
from attnlab.layer.positions import RoPE
from attnlab.stack.blocks import BLOCKS, OutputNormBlock, ParallelBlock, PostNormBlock, PreNormBlock, SandwichBlock
from attnlab.stack.hooks import hook_names, run_with_cache, run_with_hooks
from attnlab.stack.layers import ACTIVATIONS, LayerNorm, RMSNorm
from attnlab.stack.transformer import ModelConfig, Transformer, forward, param_names


def model_of(block, rng, norm=LayerNorm, mlp="mlp", activation="gelu_new", is_causal=True):
    a = AttentionConfig(d_model=12, n_heads=3, n_kv_heads=3, n_ctx=10, positions=RoPE(theta=50.0))
    c = ModelConfig(vocab_size=9, n_layers=2, attention=a, d_mlp=20, mlp=mlp, activation=activation, norm=norm,
                    block=block, is_causal=is_causal, tied_embeddings=True)
    model = Transformer.init(c, rng=rng, std=0.5, dtype=np.float64)
    for name, arr in model.params().items():                 # every array random: norms, biases included
        arr[:] = rng.normal(1.0 if name.endswith("weight") else 0.0, 0.3, arr.shape)
    return model


def ln(x, p, eps=1e-5):
    """LayerNorm or RMSNorm in float64, from its parameters."""
    if isinstance(p, RMSNorm):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * p.weight
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * p.weight + p.bias


def attn(x, p, is_causal):
    """Multi-head attention with RoPE (pairs 2i, 2i+1), written out."""
    from attnlab.layer.positions import rope
    c, n = p.config, x.shape[0]
    split = lambda y: y.reshape(n, c.n_heads, c.d_head).transpose(1, 0, 2)   # noqa: E731
    q, k, v = split(x @ p.W_Q + p.b_Q), split(x @ p.W_K + p.b_K), split(x @ p.W_V + p.b_V)
    q, k = rope(q, theta=c.positions.theta), rope(k, theta=c.positions.theta)
    s = q @ k.transpose(0, 2, 1) / np.sqrt(c.d_head)
    if is_causal:
        s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    return (a @ v).transpose(1, 0, 2).reshape(n, -1) @ p.W_O + p.b_O


def mlp(x, p):
    act = ACTIVATIONS[p.activation]
    if hasattr(p, "W_gate"):
        return (act(x @ p.W_gate) * (x @ p.W_in)) @ p.W_out
    return act(x @ p.W_in + p.b_in) @ p.W_out + p.b_out


RESIDUAL_LINES = {
    PreNormBlock: lambda b, x, causal: (lambda y: y + mlp(ln(y, b.ln_2), b.mlp))(x + attn(ln(x, b.ln_1), b.attn, causal)),
    PostNormBlock: lambda b, x, causal: (lambda y: ln(y + mlp(y, b.mlp), b.ln_2))(ln(x + attn(x, b.attn, causal), b.ln_1)),
    ParallelBlock: lambda b, x, causal: x + attn(ln(x, b.ln_1), b.attn, causal) + mlp(ln(x, b.ln_2), b.mlp),
    SandwichBlock: lambda b, x, causal: (lambda y: y + ln(mlp(ln(y, b.ln_2), b.mlp), b.ln_2_post))(
        x + ln(attn(ln(x, b.ln_1), b.attn, causal), b.ln_1_post)),
    OutputNormBlock: lambda b, x, causal: (lambda y: y + ln(mlp(y, b.mlp), b.ln_2_post))(
        x + ln(attn(x, b.attn, causal), b.ln_1_post)),
}
UNNORMED_INPUT = (PostNormBlock, OutputNormBlock)   # the sublayers read the stream as it is


@pytest.mark.parametrize("block", list(BLOCKS.values()))
@pytest.mark.parametrize("norm, kind, activation", [(LayerNorm, "mlp", "gelu_new"), (RMSNorm, "gated", "silu")])
def test_each_kind_is_its_residual_lines(rng, block, norm, kind, activation):
    model = model_of(block, rng, norm, kind, activation)
    ids = np.array([1, 4, 4, 0, 8, 2, 7])
    x = model.W_E[ids]
    for b in model.blocks:
        x = RESIDUAL_LINES[block](b, x, True)
    if model.ln_final is not None:
        x = ln(x, model.ln_final)
    np.testing.assert_allclose(forward(model, ids).logits, x @ model.W_E.T, rtol=1e-11, atol=1e-11)
    assert (model.ln_final is None) == (block is PostNormBlock)


@pytest.mark.parametrize("block", list(BLOCKS.values()))
def test_the_parameter_tree_walks_the_slots(rng, block):
    model = model_of(block, rng)
    params = model.params()
    assert list(params) == param_names(model.config)
    again = Transformer.from_params(model.config, {k: v.copy() for k, v in params.items()})
    ids = np.array([3, 1, 2])
    np.testing.assert_array_equal(forward(again, ids).logits, forward(model, ids).logits)
    n_norms = 4 if block is SandwichBlock else 2
    assert sum(k.startswith("blocks.0.ln_") and k.endswith(".weight") for k in params) == n_norms
    assert Transformer.init(model.config, rng=np.random.default_rng(0)).n_params == model.n_params


def test_a_part_that_does_not_fit_is_named(rng):
    model = model_of(SandwichBlock, rng)
    b = model.blocks[0]
    with pytest.raises(TypeError, match=r"blocks\[0\] must be a SandwichBlock \(the config's block\), got PreNormBlock"):
        Transformer(config=model.config, W_E=model.W_E, blocks=(PreNormBlock(b.attn, b.ln_1, b.mlp, b.ln_2),) * 2,
                    ln_final=model.ln_final)
    short = SandwichBlock(b.attn, b.ln_1, None, b.mlp, b.ln_2, b.ln_2_post)
    with pytest.raises(ValueError, match=r"blocks\[1\].ln_1_post must be a LayerNorm, got NoneType"):
        Transformer(config=model.config, W_E=model.W_E, blocks=(b, short), ln_final=model.ln_final)
    narrow = SandwichBlock(b.attn, b.ln_1, LayerNorm(np.ones(5), np.zeros(5), 1e-5), b.mlp, b.ln_2, b.ln_2_post)
    with pytest.raises(ValueError, match=r"blocks\[0\].ln_1_post has shapes \{'weight': \(5,\), 'bias': \(5,\)\}, "
                                         r"the config asks for \{'weight': \(12,\), 'bias': \(12,\)\}"):
        Transformer(config=model.config, W_E=model.W_E, blocks=(narrow, b), ln_final=model.ln_final)


@pytest.mark.parametrize("block", list(BLOCKS.values()))
def test_every_hook_name_is_reached_in_order_and_the_new_points_hold_what_they_say(rng, block):
    model = model_of(block, rng)
    ids = np.array([5, 1, 1, 3, 6])
    out, cache = run_with_cache(model, ids)
    assert list(cache) == hook_names(model)
    assert ("blocks.0.hook_resid_mid" in cache) == (block is not ParallelBlock)
    b, x = model.blocks[0], model.W_E[ids]
    np.testing.assert_array_equal(cache["hook_embed"], x)
    a_in = x if block in UNNORMED_INPUT else ln(x, b.ln_1)
    if block not in UNNORMED_INPUT:
        np.testing.assert_allclose(cache["blocks.0.ln_1.hook_normalized"], a_in, rtol=1e-12)
        mu = x.mean(-1, keepdims=True)
        np.testing.assert_allclose(cache["blocks.0.ln_1.hook_scale"],
                                   np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5), rtol=1e-12)
    m_in = cache["blocks.0.ln_2.hook_normalized"] if block not in UNNORMED_INPUT else cache["blocks.0.hook_resid_mid"]
    np.testing.assert_allclose(cache["blocks.0.mlp.hook_pre"], m_in @ b.mlp.W_in + b.mlp.b_in, rtol=1e-12)
    np.testing.assert_allclose(cache["blocks.0.mlp.hook_post"], ACTIVATIONS["gelu_new"](cache["blocks.0.mlp.hook_pre"]),
                               rtol=1e-12)
    # each head's result: its own rows of W_O; together with b_O they are the attention's output
    result = cache["blocks.1.attn.hook_result"]                      # (h, n, d_model)
    assert result.shape == (3, 5, 12)
    y = result.sum(0) + model.blocks[1].attn.b_O                     # (n, d_model)
    y = ln(y, model.blocks[1].ln_1_post) if hasattr(block, "ln_1_post") else y   # sandwich, output-norm: normalised first
    np.testing.assert_allclose(y, cache["blocks.1.hook_attn_out"], rtol=1e-11, atol=1e-12)
    # the stream adds up: resid_post = resid_pre + attn_out + mlp_out, except where a norm sits on the sum
    if block is not PostNormBlock:
        np.testing.assert_allclose(cache["blocks.1.hook_resid_post"], cache["blocks.1.hook_resid_pre"]
                                   + cache["blocks.1.hook_attn_out"] + cache["blocks.1.hook_mlp_out"], rtol=1e-12)


def test_replacing_a_heads_result_equals_zeroing_its_z(rng):
    model = model_of(PreNormBlock, rng)
    ids = np.array([5, 1, 1, 3, 6])

    def zero(h):
        def fn(a, name):
            a = a.copy()
            a[h] = 0.0
            return a
        return fn

    by_result = run_with_hooks(model, ids, {"blocks.0.attn.hook_result": zero(1)}).logits
    by_z = run_with_hooks(model, ids, {"blocks.0.attn.hook_z": zero(1)}).logits
    np.testing.assert_allclose(by_result, by_z, rtol=1e-11, atol=1e-12)
    assert not np.allclose(by_result, forward(model, ids).logits)
    # looking only changes no bit: the result is summed only when a hook replaced it
    looked = run_with_hooks(model, ids, {"blocks.0.attn.hook_result": lambda a, name: None}).logits
    np.testing.assert_array_equal(looked, forward(model, ids).logits)


def test_a_norms_scale_can_be_frozen(rng):
    """Replacing ln_final's hook_scale with the scale of another input divides by that one instead."""
    model = model_of(PreNormBlock, rng)
    ids, other = np.array([1, 2, 3]), np.array([4, 5, 6])
    _, frozen = run_with_cache(model, other, names=["ln_final.hook_scale"])
    out, cache = run_with_cache(model, ids, names=["blocks.1.hook_resid_post"])
    got = run_with_hooks(model, ids, {"ln_final.hook_scale": lambda s, name: frozen["ln_final.hook_scale"]}).logits
    x, p = cache["blocks.1.hook_resid_post"], model.ln_final
    want = ((x - x.mean(-1, keepdims=True)) / frozen["ln_final.hook_scale"] * p.weight + p.bias) @ model.W_E.T
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_config_json_names_the_block_and_reads_the_old_pre_norm_flag(rng):
    c = model_of(SandwichBlock, rng).config
    assert c.to_json()["block"] == "sandwich" and ModelConfig.from_json(c.to_json()) == c
    old = dict(c.to_json(), pre_norm=False)
    del old["block"]
    assert ModelConfig.from_json(old).block is PostNormBlock
    with pytest.raises(ValueError, match=r"block must be one of \['output_norm', 'parallel', 'post_norm', 'pre_norm', 'sandwich'\], "
                                         r"got 'gpt-j'"):
        ModelConfig.from_json(dict(c.to_json(), block="gpt-j"))
    with pytest.raises(ValueError, match="block must be one of"):
        ModelConfig(vocab_size=3, n_layers=1, attention=c.attention, block=object)
