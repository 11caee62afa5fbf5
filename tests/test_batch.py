"""A list of prompts of different lengths as one padded batch: each row equals its prompt run alone."""

import numpy as np
import pytest

from attnlab.layer.config import AttentionConfig
from attnlab.layer.positions import ALiBi, Learned, RoPE, Sinusoidal
from attnlab.stack.batch import pad_prompts
from attnlab.stack.blocks import PostNormBlock
from attnlab.stack.hooks import run_with_cache, run_with_hooks
from attnlab.stack.layers import LayerNorm, RMSNorm
from attnlab.stack.transformer import ModelConfig, Transformer, forward


def model_of(rng, positions, *, causal=True, dtype=np.float64):
    att = AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2 if isinstance(positions, RoPE) else None, n_ctx=16,
                          positions=positions)
    if causal:
        cfg = ModelConfig(vocab_size=30, n_layers=2, attention=att, d_mlp=24, norm=RMSNorm if isinstance(
            positions, RoPE) else LayerNorm, mlp="gated" if isinstance(positions, RoPE) else "mlp",
            activation="silu" if isinstance(positions, RoPE) else "gelu_new")
    else:
        cfg = ModelConfig(vocab_size=30, n_layers=2, attention=att, d_mlp=24, norm=LayerNorm, block=PostNormBlock,
                          is_causal=False, has_logits=False, embed_norm=True)
    return Transformer.init(cfg, rng=rng, std=0.3, dtype=dtype)


PROMPTS = [[3, 7, 1, 9, 2, 5, 11], [4, 4, 8], [12, 1, 2, 3, 4], [6]]


@pytest.mark.parametrize("positions", [Learned(), Sinusoidal(), RoPE(), ALiBi()], ids=lambda p: p.name)
def test_each_row_of_a_padded_batch_is_its_prompt_alone(rng, positions):
    model = model_of(rng, positions)
    out, cache = run_with_cache(model, PROMPTS)
    b = out.batch
    assert b.side == "left" and b.ids.shape == (4, 7) and b.mask.sum() == 16
    worst = 0.0
    for i, p in enumerate(PROMPTS):
        alone, own = run_with_cache(model, np.array(p))
        worst = max(worst, np.abs(b.own(out.logits[i], i) - alone.logits).max())
        names = ["blocks.1.hook_resid_post", "blocks.0.attn.hook_z", "blocks.1.attn.hook_pattern",
                 "blocks.1.attn.hook_q"]
        # each row's positions count from its first real token: RoPE turns q and k at the prompt's own positions
        names += ["blocks.1.attn.hook_rot_q", "blocks.0.attn.hook_rot_k"] if positions.rotates else []
        for name in names:
            got = b.own(cache[name][i], i)
            if name.endswith("pattern"):
                got = b.own(got, i, axis=-1)                            # the keys too
            np.testing.assert_allclose(got, own[name], rtol=0, atol=1e-9, err_msg=name)
    assert worst < 1e-6, worst
    # a padded key gets weight 0 from every query, in every head
    pattern = cache["blocks.0.attn.hook_pattern"]                      # (B, h, n, n)
    assert np.all(pattern[~np.broadcast_to(b.mask[:, None, None, :], pattern.shape)] == 0)


def test_an_encoder_is_padded_on_the_right(rng):
    model = model_of(rng, Learned(), causal=False)
    out, cache = run_with_cache(model, PROMPTS)
    assert out.batch.side == "right" and np.all(out.batch.mask[:, 0])
    for i, p in enumerate(PROMPTS):
        alone = forward(model, np.array(p))
        err = np.abs(out.batch.own(out.hidden_states[-1][i], i) - alone.hidden_states[-1]).max()
        assert err < 1e-6, err


def test_float32_rows_match_too(rng):
    model = model_of(rng, RoPE(), dtype=np.float32)
    out = run_with_hooks(model, PROMPTS, {})
    for i, p in enumerate(PROMPTS):
        err = np.abs(out.batch.own(out.logits[i], i) - forward(model, np.array(p)).logits).max()
        assert err < 1e-5, err


def test_padding_bad_input(rng):
    model = model_of(rng, Learned())
    with pytest.raises(ValueError, match="attention_mask must be a bool array shaped like ids"):
        forward(model, np.zeros((2, 3), np.int64), attention_mask=np.ones((2, 4), bool))
    with pytest.raises(ValueError, match="a row with no real token"):
        forward(model, np.zeros((2, 3), np.int64), attention_mask=np.array([[True] * 3, [False] * 3]))
    with pytest.raises(ValueError, match=r"prompts\[1\] must hold at least one token id"):
        pad_prompts([[1, 2], []], vocab_size=30, is_causal=True)


def test_detect_on_a_list_is_the_mean_of_each_prompt_alone(rng):
    from attnlab.interpret import detect_heads
    model = model_of(rng, RoPE())
    prompts = [p for p in PROMPTS if len(p) > 1]
    got = detect_heads(model, prompts)
    for k, v in got.items():
        want = np.mean([detect_heads(model, np.array(p))[k] for p in prompts], axis=0)
        np.testing.assert_allclose(v, want, rtol=0, atol=1e-12, err_msg=k)


@pytest.mark.parametrize("mode", ["zero", "prefix-mean"])
def test_ablate_on_a_list_is_the_mean_of_each_prompt_alone(rng, mode):
    from attnlab.interpret import ablate
    model = model_of(rng, Learned())
    prompts = [p for p in PROMPTS if len(p) > 1]
    got = ablate(model, prompts, mode=mode)
    alone = [ablate(model, np.array(p), mode=mode) for p in prompts]
    assert got.loss == pytest.approx(np.mean([a.loss for a in alone]), abs=1e-12)
    np.testing.assert_allclose(got.ablated, np.mean([a.ablated for a in alone], 0), rtol=0, atol=1e-12)


def test_mean_ablation_of_a_padded_batch_leaves_pads_out_and_stays_causal(rng):
    from attnlab.interpret import ablate, ablation_hooks
    model = model_of(rng, Learned())
    same = [[3, 7, 1, 9], [4, 4, 8, 2], [12, 1, 2, 3]]
    np.testing.assert_allclose(ablate(model, same, mode="mean").ablated,
                               ablate(model, np.array(same), mode="mean").ablated, rtol=0, atol=1e-12)
    b = pad_prompts(PROMPTS, vocab_size=30, is_causal=True)
    later = b.ids.copy()
    later[:, -1] = (later[:, -1] + 5) % 30
    for mode in ("mean", "prefix-mean", "resample"):
        hooks = ablation_hooks(model, [(0, 1), (1, 2)], mode=mode, attention_mask=b.mask)
        x, y = (run_with_hooks(model, ids, hooks, attention_mask=b.mask).logits for ids in (b.ids, later))
        np.testing.assert_allclose(x[:, :-1], y[:, :-1], rtol=0, atol=1e-12, err_msg=mode)
    # a pad changes nothing: the batch's means are over real tokens only
    repadded = b.ids.copy()
    repadded[~b.mask] = 17
    hooks = ablation_hooks(model, [(0, 1)], mode="mean", attention_mask=b.mask)
    x, y = (run_with_hooks(model, ids, hooks, attention_mask=b.mask).logits for ids in (b.ids, repadded))
    np.testing.assert_allclose(x[b.mask], y[b.mask], rtol=0, atol=1e-12)


def test_lens_on_a_list_is_each_prompts_lens(rng):
    from attnlab.interpret import logit_lens
    model = model_of(rng, Sinusoidal())
    for got, p in zip(logit_lens(model, PROMPTS, top=3), PROMPTS):
        want = logit_lens(model, np.array(p), top=3)
        np.testing.assert_allclose(got.logits, want.logits, rtol=0, atol=1e-9)
        np.testing.assert_array_equal(got.top_ids, want.top_ids)
