"""Sweeps (issue 34, part 1): patching, ablation and path patching run their interventions batched, each batch
one pass from the block of its first edit. Each result is compared with the straightforward loop kept here,
one whole hooked forward per intervention, as the code ran before; and the pass from a block
(``forward_from``) with the whole pass."""

import numpy as np
import pytest

from attnlab.interpret import ablate, patch, path_patch
from attnlab.interpret import sweeps
from attnlab.interpret.interventions import MODES, _ablation_hooks, batch_loss
from attnlab.interpret.patching import _cells, pairs, path_patch_heads, put_back
from attnlab.layer.config import AttentionConfig
from attnlab.layer.positions import Learned, RoPE
from attnlab.stack.batch import pad_prompts
from attnlab.stack.hooks import run_with_cache, run_with_hooks
from attnlab.stack.layers import LayerNorm, RMSNorm
from attnlab.stack.transformer import ModelConfig, Transformer, forward, forward_from


def random_model(rng, kind, dtype=np.float64):
    if kind == "gpt2":
        att = AttentionConfig(d_model=16, n_heads=4, n_ctx=16, positions=Learned())
        cfg = ModelConfig(vocab_size=23, n_layers=3, attention=att, d_mlp=32, norm=LayerNorm, tied_embeddings=True)
    else:
        att = AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2, n_ctx=16, positions=RoPE())
        cfg = ModelConfig(vocab_size=23, n_layers=3, attention=att, d_mlp=24, mlp="gated", activation="silu",
                          norm=RMSNorm, norm_eps=1e-6)
    model = Transformer.init(cfg, rng=rng, std=0.4, dtype=dtype)
    for name, a in model.params().items():          # every bias nonzero
        if name.endswith(("bias", "b_Q", "b_K", "b_V", "b_O", "b_in", "b_out", "b_U")):
            a[:] = rng.normal(0, 0.2, a.shape)
    return model


@pytest.fixture(params=["gpt2", "llama"])
def model(request, rng):
    return random_model(rng, request.param)


PROMPTS = [[3, 7, 1, 9, 2, 5, 11, 4], [4, 4, 8, 1, 2], [12, 1, 2, 3, 4, 9, 9]]


def corrupted(prompts):
    return [[(t + 5) % 23 if i in (1, 3) else t for i, t in enumerate(p)] for p in prompts]


# ------------------------------------------------------------------------------------------------------------
# the loops the sweeps replaced, one whole hooked forward per intervention

def patch_loop(model, clean, corrupt, what, answer=3, wrong=5):
    """patch()'s grid of patched metrics, one run_with_hooks per cell."""
    p = pairs(model, clean, corrupt)
    _, cells, shape = _cells(model, what, p.clean.shape[-1])
    _, cache = run_with_cache(model, p.clean, sorted({name for _, name, _ in cells}), attention_mask=p.mask)
    values = np.full(shape, np.nan)
    rows = np.arange(len(p.last))
    for at, name, index in cells:
        z = run_with_hooks(model, p.corrupt, {name: put_back(cache[name], index)}, attention_mask=p.mask).logits
        last = z[rows, p.last].astype(np.float64)                       # (B, vocab)
        values[at] = (last[:, answer] - last[:, wrong]).mean()
    return values


def ablate_loop(model, ids, mask, mode, ref_z=None):
    c = model.config
    out = np.empty((c.n_layers, c.attention.n_heads))
    for layer in range(c.n_layers):
        for head in range(c.attention.n_heads):
            hooks = _ablation_hooks(model, [(layer, head)], mode, ref_z, mask)
            out[layer, head] = batch_loss(run_with_hooks(model, ids, hooks, attention_mask=mask).logits, ids, mask)
    return out


def path_patch_loop(model, clean, corrupt, senders, receivers, answer=3, wrong=5):
    """path_patch's metric as it was computed before: two whole passes with every layer's z frozen."""
    p = pairs(model, clean, corrupt)
    L = model.config.n_layers
    z_names = [f"blocks.{i}.attn.hook_z" for i in range(L)]
    _, clean_z = run_with_cache(model, p.clean, z_names, attention_mask=p.mask)
    _, corrupt_z = run_with_cache(model, p.corrupt, z_names, attention_mask=p.mask)

    def frozen(i):
        z = corrupt_z[z_names[i]].copy()
        for layer, head in senders:
            if layer == i:
                z[..., head, :, :] = clean_z[z_names[i]][..., head, :, :]
        return lambda x, name: z
    recorded = {}
    hooks = {z_names[i]: frozen(i) for i in range(L)}
    for name in receivers:
        hooks[name] = lambda x, name: recorded.__setitem__(name, x)
    run_with_hooks(model, p.corrupt, hooks, attention_mask=p.mask)
    back = {name: put_back(recorded[name], (slice(None),)) for name in receivers}
    z = run_with_hooks(model, p.corrupt, back, attention_mask=p.mask).logits
    last = z[np.arange(len(p.last)), p.last].astype(np.float64)
    return float((last[:, answer] - last[:, wrong]).mean())


# ------------------------------------------------------------------------------------------------------------
# the pass from a block

def test_forward_from_each_block_is_the_whole_pass(model):
    b = pad_prompts(PROMPTS, vocab_size=23, is_causal=True)
    L = model.config.n_layers
    names = [f"blocks.{i}.hook_resid_pre" for i in range(L)] + [f"blocks.{L - 1}.hook_resid_post"]
    out, cache = run_with_cache(model, b.ids, names, attention_mask=b.mask)
    for layer in range(L + 1):
        resid = cache[names[layer]]                                     # (B, n, d_model)
        got = forward_from(model, resid, layer, attention_mask=b.mask)
        np.testing.assert_allclose(got.logits, out.logits, atol=1e-12, rtol=0)
        # K stacked copies sharing the mask: each is the pass again; logits_to_keep keeps the last rows
        many = forward_from(model, np.broadcast_to(resid, (3, *resid.shape)), layer, attention_mask=b.mask,
                            logits_to_keep=2).logits                    # (3, B, 2, vocab)
        np.testing.assert_allclose(many, np.broadcast_to(out.logits[:, -2:], many.shape), atol=1e-12, rtol=0)


def test_forward_from_runs_hooks_after_its_block_and_refuses_those_before(model):
    ids = np.array(PROMPTS[0])
    zero = {"blocks.2.attn.hook_z": lambda z, name: np.zeros_like(z)}
    whole, cache = run_with_cache(model, ids, ["blocks.1.hook_resid_pre"])
    hooked = run_with_hooks(model, ids, zero).logits
    got = forward_from(model, cache["blocks.1.hook_resid_pre"], 1, hooks=zero).logits
    np.testing.assert_allclose(got, hooked, atol=1e-12, rtol=0)
    assert not np.allclose(got, whole.logits)
    with pytest.raises(ValueError, match="blocks.0.attn.hook_z.*before block 1"):
        forward_from(model, cache["blocks.1.hook_resid_pre"], 1, hooks={"blocks.0.attn.hook_z": lambda z, n: z})
    with pytest.raises(ValueError, match=r"layer must be an int in \[0, 3\]"):
        forward_from(model, cache["blocks.1.hook_resid_pre"], 4)
    with pytest.raises(ValueError, match="resid must be a residual stream"):
        forward_from(model, np.zeros((8, 5)), 1)


# ------------------------------------------------------------------------------------------------------------
# patching, ablation, path patching: the sweep against the loop

@pytest.mark.parametrize("what", ["heads", "heads_by_pos", "k", "pattern", "resid_pre", "mlp_out",
                                  "hook_embed", "ln_final.hook_normalized"])
def test_patch_sweep_equals_the_loop(model, what):
    if what == "hook_embed" and model.config.attention.positions.name == "rope":
        what = "blocks.0.ln_1.hook_scale"
    clean, corrupt = PROMPTS, corrupted(PROMPTS)
    got = patch(model, clean, corrupt, answer=3, wrong=5, what=what)
    np.testing.assert_allclose(got.values, patch_loop(model, clean, corrupt, what), atol=1e-10, rtol=0)


def test_patch_sweep_in_small_batches_equals_the_loop(model, monkeypatch):
    # a tiny memory budget: one intervention per pass, and the grid stays the same
    clean, corrupt = np.array(PROMPTS[0]), np.array(corrupted(PROMPTS)[0])
    assert sweeps.batch_size(model, (1, 8), 1) > 1
    monkeypatch.setattr(sweeps, "SWEEP_BYTES", 1)
    assert sweeps.batch_size(model, (1, 8), 1) == 1
    got = patch(model, clean, corrupt, answer=3, wrong=5, what="heads_by_pos")
    np.testing.assert_allclose(got.values, patch_loop(model, clean, corrupt, "heads_by_pos"), atol=1e-10, rtol=0)


def test_float32_sweep_equals_the_loop_within_1e_6(rng):
    model = random_model(rng, "llama", dtype=np.float32)
    clean, corrupt = PROMPTS, corrupted(PROMPTS)
    got = patch(model, clean, corrupt, answer=3, wrong=5, what="heads")
    np.testing.assert_allclose(got.values, patch_loop(model, clean, corrupt, "heads"), atol=1e-6, rtol=0)


@pytest.mark.parametrize("mode", MODES)
def test_ablate_sweep_equals_the_loop(model, mode):
    b = pad_prompts(PROMPTS, vocab_size=23, is_causal=True)
    got = ablate(model, PROMPTS, mode=mode)
    np.testing.assert_allclose(got.ablated, ablate_loop(model, b.ids, b.mask, mode), atol=1e-10, rtol=0)
    assert got.loss == pytest.approx(batch_loss(run_with_hooks(model, PROMPTS, {}).logits, b.ids, b.mask), abs=1e-12)
    one = ablate(model, np.array(PROMPTS[0]), mode="zero")                # one text (n,)
    np.testing.assert_allclose(one.ablated, ablate_loop(model, np.array(PROMPTS[0]), None, "zero"), atol=1e-10)


def test_ablate_sweep_with_a_reference_equals_the_loop(model):
    from attnlab.interpret.interventions import _reference_z
    ids = np.array(PROMPTS[0])
    ref = np.array([PROMPTS[0], corrupted(PROMPTS)[0]])
    heads = [(i, h) for i in range(3) for h in range(4)]
    for mode in ("mean", "resample"):
        got = ablate(model, ids, mode=mode, reference=ref)
        want = ablate_loop(model, ids, None, mode, _reference_z(model, heads, mode, ref))
        np.testing.assert_allclose(got.ablated, want, atol=1e-10, rtol=0)


def test_path_patch_sweep_equals_the_loop(model):
    clean, corrupt = PROMPTS, corrupted(PROMPTS)
    L = model.config.n_layers
    for receivers in (["blocks.2.hook_resid_post"], ["blocks.2.attn.hook_v"], ["blocks.1.hook_resid_mid"]):
        heads = [(0, 1), (1, 3), (0, 2)]
        got = path_patch_heads(model, clean, corrupt, heads, receivers, answer=3, wrong=5)
        for head in heads:
            want = path_patch_loop(model, clean, corrupt, [head], receivers)
            assert got[head].patched == pytest.approx(want, abs=1e-10)
        pair = path_patch(model, clean, corrupt, [(0, 1), (1, 3)], receivers, answer=3, wrong=5)
        assert pair.patched == pytest.approx(path_patch_loop(model, clean, corrupt, [(0, 1), (1, 3)], receivers),
                                             abs=1e-10)
    # a receiver below the senders records the corrupted run's own activation: nothing restored
    late = path_patch(model, clean, corrupt, [(L - 1, 0)], ["blocks.0.hook_resid_mid"], answer=3, wrong=5)
    assert late.patched == pytest.approx(late.corrupt, abs=1e-12)


def test_progress_counts_every_run(model):
    calls = []
    patch(model, PROMPTS, corrupted(PROMPTS), answer=3, wrong=5, progress=lambda d, t: calls.append((d, t)))
    n = 8
    total = 3 * 4 + 3 * n                                               # heads, then resid_pre by position
    assert calls[-1] == (total, total) and all(t == total for _, t in calls)
    assert [d for d, _ in calls] == sorted({d for d, _ in calls})       # rising, each pass once
    calls.clear()
    ablate(model, PROMPTS, progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (12, 12)
    calls.clear()
    path_patch_heads(model, PROMPTS, corrupted(PROMPTS), [(0, 1), (1, 2)], ["blocks.2.hook_resid_post"], answer=3,
                     wrong=5, progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (4, 4)


def test_batch_size_rule_by_hand(rng, monkeypatch):
    model = random_model(rng, "gpt2")                                   # d_model 16, d_mlp 32, 4 heads, vocab 23
    # per run: 4 · B·n · max(16, 32, 4·n) + 2 · B · kept · vocab floats of 8 bytes
    per = (4 * 2 * 10 * max(16, 32, 40) + 2 * 2 * 1 * 23) * 8
    monkeypatch.setattr(sweeps, "SWEEP_BYTES", 10 * per + 7)
    assert sweeps.batch_size(model, (2, 10), 1) == 10


def test_attention_of_a_query_with_swapped_batch_axes_is_the_same(tile_kernel, rng):
    # a stacked sweep's first matmul may lay its output out as (B, K, …): the fused softmax (numba) wrote into
    # a reshaped copy of such a grid, and returned the raw scores (NaN where a row had no key)
    from attnlab.kernels.attention import attention
    q, k = (rng.normal(size=(3, 2, 4, 8, 16)).transpose(1, 0, 2, 3, 4) for _ in range(2))   # (2, 3, h, n, d)
    v = rng.normal(size=(2, 3, 4, 8, 16))
    mask = rng.random((2, 3, 1, 8, 8)) > 0.3
    got = attention(q, k, v, mask=mask, is_causal=True)
    want = attention(np.ascontiguousarray(q), np.ascontiguousarray(k), v, mask=mask, is_causal=True)
    np.testing.assert_allclose(got, want, atol=1e-12, rtol=0)
