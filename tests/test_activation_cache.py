"""The ActivationCache: its identities (the parts sum to the residual; the heads plus b_O are hook_attn_out; the
attributions sum to the logit difference), the lens stages, and TransformerLens's layout, on GPT-2- and
Llama-shaped random models in float64 with every bias and norm weight nonzero."""

import numpy as np
import pytest

from attnlab.layer.config import AttentionConfig
from attnlab.layer.positions import Learned, RoPE
from attnlab.stack.activation_cache import ActivationCache
from attnlab.stack.blocks import PostNormBlock
from attnlab.stack.hooks import run_with_cache
from attnlab.stack.layers import LayerNorm, RMSNorm
from attnlab.stack.transformer import ModelConfig, Transformer


def random_model(rng, kind):
    if kind == "gpt2":
        att = AttentionConfig(d_model=16, n_heads=4, n_ctx=12, positions=Learned())
        cfg = ModelConfig(vocab_size=23, n_layers=3, attention=att, d_mlp=32, norm=LayerNorm, tied_embeddings=True,
                          family="gpt2")
    else:
        att = AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2, n_ctx=12, positions=RoPE())
        cfg = ModelConfig(vocab_size=23, n_layers=3, attention=att, d_mlp=24, mlp="gated", activation="silu",
                          norm=RMSNorm, norm_eps=1e-6, family="llama")
    model = Transformer.init(cfg, rng=rng, std=0.3, dtype=np.float64)
    for name, a in model.params().items():          # every bias and norm parameter nonzero
        if name.endswith(("bias", "b_Q", "b_K", "b_V", "b_O", "b_in", "b_out", "b_U")):
            a[:] = rng.normal(0, 0.2, a.shape)
        elif name.endswith("weight"):
            a[:] = 1 + rng.normal(0, 0.2, a.shape)
    return model


@pytest.fixture(params=["gpt2", "llama"])
def model(request, rng):
    return random_model(rng, request.param)


def test_cache_is_a_mapping_like_the_old_dict(model, rng):
    ids = rng.integers(0, 23, 9)
    _, cache = run_with_cache(model, ids)
    assert isinstance(cache, ActivationCache) and list(cache) == list(dict(cache))
    assert cache["pattern", 1] is cache["blocks.1.attn.hook_pattern"] and "blocks.0.hook_resid_pre" in cache
    assert len(cache) == len(dict(cache.items()))


def test_the_parts_sum_to_the_residual(model, rng):
    ids = rng.integers(0, 23, (2, 9))
    out, cache = run_with_cache(model, ids)
    L = model.config.n_layers
    parts, labels = cache.decompose_resid(return_labels=True)                      # (parts, B, n, d_model)
    embeds = ["embed", "pos_embed"] if model.W_P is not None else ["embed"]            # RoPE adds no rows
    assert labels[:len(embeds) + 2] == embeds + ["0_attn_out", "0_mlp_out"] and len(labels) == len(embeds) + 2 * L
    resid = cache[f"blocks.{L - 1}.hook_resid_post"]
    err = np.abs(parts.sum(0) - resid).max()
    assert err < 1e-12, err
    for layer in range(L):
        np.testing.assert_allclose(cache.decompose_resid(layer).sum(0), cache["resid_pre", layer], rtol=0, atol=1e-12)
    # through the frozen final norm (the norm's own scale at that residual), plus its bias: the model's output
    normed, labels = cache.decompose_resid(apply_ln=True, return_labels=True)
    err = np.abs(normed.sum(0) - out.hidden_states[-1]).max()
    assert err < 1e-12, err
    assert (labels[-1] == "ln_final.b") == isinstance(model.ln_final, LayerNorm)
    one = cache.decompose_resid(pos_slice=-1)                                     # (parts, B, d_model)
    np.testing.assert_array_equal(one, parts[..., -1, :])


def test_the_heads_plus_b_O_are_the_attention_output(model, rng):
    ids = rng.integers(0, 23, 8)
    _, cache = run_with_cache(model, ids)
    h = model.config.attention.n_heads
    heads, labels = cache.stack_head_results(return_labels=True)                  # (L·h, n, d_model)
    assert heads.shape == (3 * h, 8, 16) and labels[h + 1] == "L1H1"
    for i in range(3):
        got = heads[i * h:(i + 1) * h].sum(0) + model.blocks[i].attn.b_O
        err = np.abs(got - cache["attn_out", i]).max()
        assert err < 1e-12, err
    # one head by hand: z_h (n, d_head) times its rows of W_O
    d = model.config.attention.d_head
    want = cache["z", 2][1] @ model.blocks[2].attn.W_O[d:2 * d]
    np.testing.assert_allclose(heads[2 * h + 1], want, rtol=0, atol=1e-13)
    np.testing.assert_array_equal(cache.stack_head_results(1, pos_slice=[0, 3]), heads[:h, [0, 3]])
    # from hook_result when recorded (the default), else from hook_z and W_O: the same numbers
    assert "blocks.0.attn.hook_result" in cache
    _, z_only = run_with_cache(model, ids, [f"blocks.{i}.attn.hook_z" for i in range(3)])
    np.testing.assert_allclose(z_only.stack_head_results(), heads, rtol=0, atol=1e-13)
    np.testing.assert_allclose(z_only.stack_head_results(pos_slice=-1), heads[:, -1], rtol=0, atol=1e-13)


def test_attributions_sum_to_the_logit_difference(model, rng):
    ids = rng.integers(0, 23, (3, 10))
    out, cache = run_with_cache(model, ids)
    answer, wrong = np.array([3, 5, 7]), np.array([11, 2, 0])
    W_U = model.W_E.T if model.config.tied_embeddings else model.W_U
    # before the final norm: the parts' attributions sum to the residual's own logit difference
    parts = cache.decompose_resid(pos_slice=-1)                                   # (parts, B, d_model)
    attrs = cache.logit_attrs(parts, answer, wrong)                               # (parts, B)
    resid = cache[f"blocks.2.hook_resid_post"][:, -1]                             # (B, d_model)
    raw = np.einsum("bd,db->b", resid, W_U[:, answer] - W_U[:, wrong])
    err = np.abs(attrs.sum(0) - raw).max()
    assert attrs.shape == (parts.shape[0], 3) and err < 1e-12, err
    # the norm frozen at the final residual's scale: they sum to the model's own logit difference (less b_U's)
    normed = cache.decompose_resid(apply_ln=True, pos_slice=-1)
    logits = out.logits[:, -1]                                                    # (B, vocab)
    b_U = 0 if model.b_U is None else model.b_U[answer] - model.b_U[wrong]
    diff = logits[np.arange(3), answer] - logits[np.arange(3), wrong] - b_U
    err = np.abs(cache.logit_attrs(normed, answer, wrong).sum(0) - diff).max()
    assert err < 1e-12, err
    # the heads' attributions, through the frozen norm, are the heads' share of it: add the rest, get all of it
    heads = cache.stack_head_results(apply_ln=True, pos_slice=-1)                 # (L·h, B, d_model)
    rest = cache.decompose_resid(apply_ln=True, pos_slice=-1, return_labels=True)
    others = [p for p, lab in zip(*rest) if not lab.endswith("attn_out")]
    b_O = sum(cache.apply_ln_to_stack(np.broadcast_to(b.attn.b_O, (1, 3, 10, 16)), pos_slice=None)[0][:, :, -1]
              for b in model.blocks)
    total = (cache.logit_attrs(heads, answer, wrong).sum(0) + cache.logit_attrs(np.stack(others), answer, wrong).sum(0)
             + cache.logit_attrs(b_O, answer, wrong).sum(0))
    np.testing.assert_allclose(total, diff, rtol=0, atol=1e-12)


def test_accumulated_resid_is_the_lens(model, rng):
    from attnlab.interpret import logit_lens
    ids = rng.integers(0, 23, 7)
    _, cache = run_with_cache(model, ids)
    stages, labels = cache.accumulated_resid(return_labels=True)                  # (L + 1, n, d_model)
    assert labels == ["0_pre", "1_pre", "2_pre", "final_post"]
    W_U = model.W_E.T if model.config.tied_embeddings else model.W_U
    b_U = 0 if model.b_U is None else model.b_U
    np.testing.assert_allclose(stages @ W_U + b_U, logit_lens(model, ids).logits, rtol=0, atol=1e-12)
    raw = cache.accumulated_resid(1, incl_mid=True, apply_ln=False)
    np.testing.assert_array_equal(raw[0], cache["resid_pre", 0])
    np.testing.assert_allclose(raw[1], cache["resid_pre", 0] + cache["attn_out", 0], rtol=0, atol=0)
    assert raw.shape == (3, 7, 16)


def test_to_tl_has_transformer_lens_shapes_and_names(model, rng):
    ids = rng.integers(0, 23, 6)
    _, cache = run_with_cache(model, ids)
    tl = cache.to_tl()
    a = model.config.attention
    assert tl["blocks.0.attn.hook_q"].shape == (1, 6, a.n_heads, a.d_head)
    assert tl["blocks.0.attn.hook_k"].shape == (1, 6, a.n_kv_heads, a.d_head)
    assert tl["blocks.1.attn.hook_attn_scores"].shape == (1, a.n_heads, 6, 6)
    assert tl["blocks.1.hook_resid_pre"].shape == (1, 6, 16)
    np.testing.assert_array_equal(tl["blocks.2.attn.hook_z"][0, 4, 1], cache["z", 2][1, 4])
    _, batch = run_with_cache(model, np.stack([ids, ids]))
    assert batch.to_tl()["blocks.0.attn.hook_v"].shape == (2, 6, a.n_kv_heads, a.d_head)


def test_cache_errors_name_what_is_missing(rng):
    model = random_model(rng, "gpt2")
    _, cache = run_with_cache(model, [1, 2, 3], names=["blocks.0.hook_resid_pre"])
    with pytest.raises(KeyError, match="did not record"):
        cache.decompose_resid()
    with pytest.raises(ValueError, match=r"layer must be None or an int in \[0, 3\]"):
        cache.accumulated_resid(4)
    with pytest.raises(ValueError, match="tokens must be token ids in"):
        cache.logit_attrs(np.zeros((2, 16)), 23)
    with pytest.raises(ValueError, match=r"residual_stack must be \(parts, ..., d_model\)"):
        cache.logit_attrs(np.zeros((2, 5)), 1)
    with pytest.raises(TypeError, match="pos_slice must be"):
        cache.accumulated_resid(0, pos_slice="last")
    bert = Transformer.init(ModelConfig(vocab_size=7, n_layers=1, attention=AttentionConfig(d_model=8, n_heads=2,
                            n_ctx=8), d_mlp=16, norm=LayerNorm, block=PostNormBlock, is_causal=False, has_logits=False),
                            rng=rng)
    _, cache = run_with_cache(bert, [1, 2, 3])
    with pytest.raises(ValueError, match="post-norm"):
        cache.decompose_resid()
