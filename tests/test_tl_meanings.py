"""Hook points with TransformerLens's meanings (issue 34, part 7): the names a TL user's code reads hold what TL
holds there. Checked by hand in float64; against transformers' q_proj and RoPE in tests/test_llama.py."""

import numpy as np
import pytest

from attnlab.layer.config import AttentionConfig
from attnlab.layer.positions import RoPE, rope
from attnlab.stack.blocks import ParallelBlock
from attnlab.stack.hooks import hook_names, run_with_cache, run_with_hooks
from attnlab.stack.layers import ACTIVATIONS, LayerNorm, RMSNorm
from attnlab.stack.transformer import ModelConfig, Transformer


def llama_like(rng, norm=RMSNorm, block=None):
    a = AttentionConfig(d_model=8, n_heads=2, n_ctx=8, positions=RoPE(theta=50.0))
    c = ModelConfig(vocab_size=9, n_layers=2, attention=a, d_mlp=12, mlp="gated", activation="silu", norm=norm,
                    **({} if block is None else {"block": block}))
    model = Transformer.init(c, rng=rng, std=0.5, dtype=np.float64)
    for name, p in model.params().items():
        if name.endswith(("weight", "bias")):
            p[...] = name.endswith("weight") + rng.normal(0, 0.3, p.shape)
    return model


def test_names_can_be_a_function_as_tl_names_filter(rng):
    model = llama_like(rng)
    ids = np.array([1, 2, 3, 4])
    _, cache = run_with_cache(model, ids, names=lambda name: name.endswith("hook_pattern"))
    assert list(cache) == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]
    _, one = run_with_cache(model, ids, names="blocks.1.hook_resid_post")
    assert list(one) == ["blocks.1.hook_resid_post"]


def test_rms_norm_points_hold_what_tl_holds_there(rng):
    """TL's RMSNorm: hook_scale the divisor, hook_normalized x / scale before the weight; hook_out the output."""
    model = llama_like(rng)
    ids = np.array([4, 1, 7, 2, 2])
    _, cache = run_with_cache(model, ids)
    x, w = cache["blocks.1.hook_resid_pre"], model.blocks[1].ln_1.weight
    scale = np.sqrt((x * x).mean(-1, keepdims=True) + model.config.norm_eps)
    np.testing.assert_allclose(cache["blocks.1.ln_1.hook_scale"], scale, rtol=1e-13)
    np.testing.assert_allclose(cache["blocks.1.ln_1.hook_normalized"], x / scale, rtol=1e-13)
    np.testing.assert_allclose(cache["blocks.1.ln_1.hook_out"], x / scale * w, rtol=1e-13)
    np.testing.assert_allclose(cache["ln_final.hook_out"], run_with_hooks(model, ids, {}).hidden_states[-1],
                               rtol=1e-13)


def test_layer_norm_points_hold_what_tl_holds_there(rng):
    """TL's LayerNorm: hook_normalized is its output, weight and bias applied; hook_out the same."""
    model = llama_like(rng, LayerNorm)
    _, cache = run_with_cache(model, np.array([4, 1, 7]))
    x, ln = cache["blocks.0.hook_resid_pre"], model.blocks[0].ln_1
    xc = x - x.mean(-1, keepdims=True)
    want = xc / np.sqrt((xc * xc).mean(-1, keepdims=True) + ln.eps) * ln.weight + ln.bias
    np.testing.assert_allclose(cache["blocks.0.ln_1.hook_normalized"], want, rtol=1e-12)
    np.testing.assert_array_equal(cache["blocks.0.ln_1.hook_out"], cache["blocks.0.ln_1.hook_normalized"])


def test_q_and_k_before_rope_the_rotated_ones_after_and_the_new_points(rng):
    model = llama_like(rng)
    ids = np.array([3, 8, 0, 5, 6, 1])
    out, cache = run_with_cache(model, ids)
    b = model.blocks[1]
    x = cache["blocks.1.ln_1.hook_out"]                                  # what attention reads
    q = (x @ b.attn.W_Q + b.attn.b_Q).reshape(6, 2, 4).transpose(1, 0, 2)   # (h, n, d_head) projected
    np.testing.assert_allclose(cache["blocks.1.attn.hook_q"], q, rtol=1e-12)
    np.testing.assert_allclose(cache["blocks.1.attn.hook_rot_q"], rope(q, theta=50.0), rtol=1e-12)
    names = hook_names(model)
    assert names.index("blocks.1.attn.hook_v") < names.index("blocks.1.attn.hook_rot_q") \
        < names.index("blocks.1.attn.hook_scores")
    # the stream each sublayer reads, the gated MLP's linear path, the logits
    np.testing.assert_array_equal(cache["blocks.1.hook_attn_in"], cache["blocks.1.hook_resid_pre"])
    np.testing.assert_array_equal(cache["blocks.1.hook_mlp_in"], cache["blocks.1.hook_resid_mid"])
    m_in = cache["blocks.0.ln_2.hook_out"]
    np.testing.assert_allclose(cache["blocks.0.mlp.hook_pre_linear"], m_in @ model.blocks[0].mlp.W_in, rtol=1e-12)
    np.testing.assert_allclose(cache["blocks.0.mlp.hook_post"], ACTIVATIONS["silu"](cache["blocks.0.mlp.hook_pre"])
                               * cache["blocks.0.mlp.hook_pre_linear"], rtol=1e-12)
    np.testing.assert_array_equal(cache["hook_unembed"], out.logits)


def test_replacing_one_branch_input_leaves_the_other(rng):
    """In a parallel block attention and MLP read the same stream; hook_attn_in changes what attention reads only."""
    model = llama_like(rng, LayerNorm, ParallelBlock)
    ids = np.array([3, 8, 0, 5])
    _, base = run_with_cache(model, ids)
    seen = {}
    keep = lambda x, name: seen.setdefault(name, x)                      # noqa: E731
    run_with_hooks(model, ids, {"blocks.0.hook_attn_in": lambda x, _: x * 0.5, "blocks.0.hook_mlp_out": keep,
                                "blocks.0.hook_attn_out": keep})
    np.testing.assert_array_equal(seen["blocks.0.hook_mlp_out"], base["blocks.0.hook_mlp_out"])
    assert not np.allclose(seen["blocks.0.hook_attn_out"], base["blocks.0.hook_attn_out"])


def test_to_tl_puts_q_and_k_in_rotate_half_order(rng):
    """attnlab pairs features (2i, 2i+1); TL and transformers pair (i, i + d/2): to_tl() reorders each head."""
    model = llama_like(rng)
    _, cache = run_with_cache(model, np.array([1, 2, 3]))
    tl = cache.to_tl()
    q = cache["blocks.0.attn.hook_rot_q"]                                # (h, n, 4): pairs (0, 1), (2, 3)
    np.testing.assert_array_equal(tl["blocks.0.attn.hook_rot_q"][0], q[..., [0, 2, 1, 3]].swapaxes(0, 1))
    np.testing.assert_array_equal(tl["blocks.0.attn.hook_v"][0], cache["blocks.0.attn.hook_v"].swapaxes(0, 1))
    assert "blocks.0.ln1.hook_normalized" in tl


@pytest.mark.parametrize("rotary_dim", [None, 2])
def test_halves_order_undoes_the_loaders_pairing(rotary_dim):
    from attnlab.models.llama import half_to_pairs

    order = RoPE(rotary_dim=rotary_dim).halves_order(6)
    hf = np.arange(6) * 10                                              # a head in transformers' layout
    np.testing.assert_array_equal(hf[half_to_pairs(1, 6, rotary_dim)][order], hf)
