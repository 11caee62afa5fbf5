"""Issue 34, part 7: ablation hooks on a list of prompts. ``run_with_hooks`` pads the list; the hooks must then
leave the padded positions out of their means, as a hand computation from each prompt run alone does."""

import numpy as np
import pytest

from attnlab.interpret import ablation_hooks
from attnlab.layer.config import AttentionConfig
from attnlab.layer.positions import RoPE
from attnlab.stack.batch import pad_prompts
from attnlab.stack.hooks import run_with_cache, run_with_hooks
from attnlab.stack.layers import RMSNorm
from attnlab.stack.transformer import ModelConfig, Transformer

HEADS = [(0, 0), (0, 1), (0, 2), (0, 3)]        # every head of layer 0: their means come from intact passes


@pytest.fixture
def model(rng):
    att = AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2, n_ctx=32, positions=RoPE())
    cfg = ModelConfig(vocab_size=31, n_layers=2, attention=att, d_mlp=24, mlp="gated", activation="silu",
                      norm=RMSNorm, norm_eps=1e-6)
    return Transformer.init(cfg, rng=rng, std=0.4, dtype=np.float64)


@pytest.fixture
def prompts(rng):
    return [rng.integers(0, 31, n) for n in (14, 12, 15, 5)]


def alone_with_z(model, ids, z0):
    """Logits (n, vocab) of one prompt run alone with layer 0's hook_z replaced by z0 (h, n, d_head)."""
    return run_with_hooks(model, ids, {"blocks.0.attn.hook_z": lambda z, name: z0}).logits


def own_z(model, prompts):
    return [run_with_cache(model, p, ["blocks.0.attn.hook_z"])[1]["blocks.0.attn.hook_z"] for p in prompts]


def test_mean_ablation_of_a_list_leaves_the_padding_out(model, prompts):
    out = run_with_hooks(model, prompts, ablation_hooks(model, HEADS, mode="mean"))
    zs, n = own_z(model, prompts), max(len(p) for p in prompts)
    pad = [n - len(p) for p in prompts]
    for b, p in enumerate(prompts):
        z0 = zs[b].copy()                                               # (h, n_b, d_head)
        for j in range(len(p)):                                         # column pad_b + j of the padded batch
            col = pad[b] + j
            others = [zs[o][:, col - pad[o]] for o in range(len(prompts)) if o != b and col >= pad[o]]
            z0[:, j] = np.mean(others, axis=0) if others else 0.0       # (h, d_head) the others' mean there
        want = alone_with_z(model, p, z0)                               # (n_b, vocab)
        np.testing.assert_allclose(out.batch.own(out.logits[b], b), want, atol=1e-10, rtol=0)


def test_prefix_mean_ablation_of_a_list_is_each_prompt_alone(model, prompts):
    hooks = ablation_hooks(model, HEADS, mode="prefix-mean")
    out = run_with_hooks(model, prompts, hooks)
    for b, p in enumerate(prompts):
        want = run_with_hooks(model, p, hooks).logits                   # its own running means, no padding
        np.testing.assert_allclose(out.batch.own(out.logits[b], b), want, atol=1e-10, rtol=0)


def test_a_padded_batch_with_its_mask_gives_the_hooks_the_mask(model, prompts):
    b = pad_prompts(prompts, vocab_size=31, is_causal=True)
    listed = run_with_hooks(model, prompts, ablation_hooks(model, HEADS, mode="mean")).logits
    given = run_with_hooks(model, b.ids, ablation_hooks(model, HEADS, mode="mean"), attention_mask=b.mask).logits
    built = run_with_hooks(model, b.ids, ablation_hooks(model, HEADS, mode="mean", attention_mask=b.mask),
                           attention_mask=b.mask).logits
    np.testing.assert_allclose(listed, built, atol=1e-12, rtol=0)
    np.testing.assert_allclose(given, built, atol=1e-12, rtol=0)
