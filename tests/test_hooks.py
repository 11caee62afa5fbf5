"""Named activations: run_with_cache against a float64 hand computation of attnlab's own LM, replacement through
run_with_hooks, nothing recorded when not asked, and the names checked."""

import numpy as np
import pytest

from attnlab.layer.config import AttentionConfig
from attnlab.stack.hooks import hook_names, run_with_cache, run_with_hooks
from attnlab.stack.layers import LayerNorm
from attnlab.lm.model import lm_config
from attnlab.layer.positions import ALiBi, Learned, RoPE, alibi_bias, alibi_slopes, rope
from attnlab.stack.transformer import ModelConfig, Transformer, forward, new_caches


def own_lm(rng, positions, n_kv_heads=None, n_ctx=8):
    config = lm_config(7, d_model=12, n_heads=4, n_kv_heads=n_kv_heads, d_head=4 if isinstance(positions, RoPE) else 3,
                       n_layers=2, n_ctx=n_ctx, positions=positions)
    model = Transformer.init(config, rng=rng, std=0.4, dtype=np.float64)
    for name, a in model.params().items():
        if name.split(".")[-1].startswith("b_"):
            a[:] = rng.normal(0, 0.3, a.shape)             # nonzero biases: they must land in the right place
    return model


def by_hand(model, ids):
    """attnlab's own LM written out in float64 loops, one head and one query at a time."""
    c, a = model.config, model.config.attention
    n, g = len(ids), a.n_heads // a.n_kv_heads
    x = model.W_E[ids] + (model.W_P[:n] if model.W_P is not None else 0)
    acts = {"hook_embed": model.W_E[ids]} | ({"hook_pos_embed": model.W_P[:n]} if model.W_P is not None else {})
    for i, block in enumerate(model.blocks):
        p = block.attn
        acts[f"blocks.{i}.hook_resid_pre"] = acts[f"blocks.{i}.hook_attn_in"] = x
        q = (x @ p.W_Q + p.b_Q).reshape(n, a.n_heads, a.d_head).transpose(1, 0, 2)
        k = (x @ p.W_K + p.b_K).reshape(n, a.n_kv_heads, a.d_head).transpose(1, 0, 2)
        v = (x @ p.W_V + p.b_V).reshape(n, a.n_kv_heads, a.d_head).transpose(1, 0, 2)
        acts.update({f"blocks.{i}.attn.hook_q": q, f"blocks.{i}.attn.hook_k": k, f"blocks.{i}.attn.hook_v": v})
        if isinstance(a.positions, RoPE):                  # TransformerLens's hook_rot_q, hook_rot_k: after RoPE
            q, k = rope(q, theta=a.positions.theta), rope(k, theta=a.positions.theta)
            acts.update({f"blocks.{i}.attn.hook_rot_q": q, f"blocks.{i}.attn.hook_rot_k": k})
        bias = alibi_bias(alibi_slopes(a.n_heads), n) if isinstance(a.positions, ALiBi) else np.zeros((a.n_heads, n, n))
        scores, pattern, z = (np.full((a.n_heads, n, n), -np.inf), np.zeros((a.n_heads, n, n)),
                              np.zeros((a.n_heads, n, a.d_head)))
        for h in range(a.n_heads):
            for t in range(n):
                for j in range(t + 1):
                    scores[h, t, j] = q[h, t] @ k[h // g, j] / np.sqrt(a.d_head) + bias[h, t, j]
                e = np.exp(scores[h, t, :t + 1] - scores[h, t, :t + 1].max())
                pattern[h, t, :t + 1] = e / e.sum()
                z[h, t] = pattern[h, t, :t + 1] @ v[h // g, :t + 1]
        out = z.transpose(1, 0, 2).reshape(n, -1) @ p.W_O + p.b_O
        acts.update({f"blocks.{i}.attn.hook_scores": scores, f"blocks.{i}.attn.hook_pattern": pattern,
                     f"blocks.{i}.attn.hook_z": z,
                     f"blocks.{i}.attn.hook_result": np.stack([z[h] @ p.W_O[h * a.d_head:(h + 1) * a.d_head]
                                                               for h in range(a.n_heads)]),
                     f"blocks.{i}.hook_attn_out": out})
        x = x + out
        acts[f"blocks.{i}.hook_resid_post"] = x
    acts["hook_unembed"] = x @ model.W_U + model.b_U
    return acts["hook_unembed"], acts


@pytest.mark.parametrize("positions, n_kv_heads", [(Learned(), None), (RoPE(theta=30.0), 2), (ALiBi(), 1)])
def test_own_lm_run_with_cache_equals_a_float64_hand_computation(rng, positions, n_kv_heads):
    model = own_lm(rng, positions, n_kv_heads)
    ids = np.array([3, 0, 6, 6, 1, 2])
    out, cache = run_with_cache(model, ids)
    logits, acts = by_hand(model, ids)
    assert list(cache) == hook_names(model) == list(acts)   # every name, in the order of the pass
    for name, want in acts.items():
        np.testing.assert_allclose(cache[name], want, rtol=1e-12, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(out.logits, logits, rtol=1e-12, atol=1e-12)
    assert cache["blocks.0.attn.hook_k"].shape == (model.config.attention.n_kv_heads, 6, model.config.attention.d_head)
    # Recording changes nothing: the same pass as asking for the weights, bit for bit; the pass without them
    # may take the fused softmax (numba's polynomial exp2), equal to rounding.
    np.testing.assert_array_equal(out.logits, forward(model, ids, return_weights=True).logits)
    np.testing.assert_allclose(out.logits, forward(model, ids).logits, rtol=1e-13, atol=1e-13)


def test_a_batch_gets_a_leading_axis_and_names_can_be_picked(rng):
    model = own_lm(rng, Learned())
    ids = rng.integers(0, 7, (3, 5))
    out, cache = run_with_cache(model, ids, names=["blocks.1.attn.hook_pattern", "blocks.0.hook_resid_post"])
    assert list(cache) == ["blocks.0.hook_resid_post", "blocks.1.attn.hook_pattern"]
    assert cache["blocks.1.attn.hook_pattern"].shape == (3, 4, 5, 5)
    for b in range(3):
        _, one = run_with_cache(model, ids[b], names=["blocks.1.attn.hook_pattern"])
        np.testing.assert_allclose(cache["blocks.1.attn.hook_pattern"][b], one["blocks.1.attn.hook_pattern"],
                                   rtol=1e-12)


def test_hooks_replace_activations(rng):
    """Zeroing head 2's z in layer 0 equals removing its rows of W_O; a pattern set to 'look at yourself'
    makes z equal v (one KV head per query head here)."""
    model = own_lm(rng, Learned())
    ids = np.array([1, 2, 3, 4])

    def ablate(z, name):
        z = z.copy()
        z[2] = 0.0
        return z

    got = run_with_hooks(model, ids, {"blocks.0.attn.hook_z": ablate}).logits
    W_O = model.blocks[0].attn.W_O
    saved = W_O[6:9].copy()
    W_O[6:9] = 0.0                                        # head 2's rows of W_O (d_head 3)
    try:
        want = forward(model, ids).logits
    finally:
        W_O[6:9] = saved
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert not np.allclose(got, forward(model, ids).logits)

    seen = {}

    def look_at_yourself(a, name):
        return np.broadcast_to(np.eye(4), a.shape)

    def keep(z, name):
        seen[name] = z                                    # returns None: the pass goes on with z as it is

    _, cache = run_with_cache(model, ids, names=["blocks.1.attn.hook_v"])
    run_with_hooks(model, ids, {"blocks.1.attn.hook_pattern": look_at_yourself, "blocks.1.attn.hook_z": keep})
    np.testing.assert_allclose(seen["blocks.1.attn.hook_z"], cache["blocks.1.attn.hook_v"], rtol=1e-12)


def test_nothing_is_recorded_or_gridded_when_not_asked(rng, monkeypatch):
    """Without hooks the pass takes attention's own path (the grid path is never entered); a hook on q alone
    does not build the grid either."""
    import attnlab.layer.multihead

    model = own_lm(rng, Learned())
    calls = []
    real = attnlab.layer.multihead._attention_on_the_grid
    monkeypatch.setattr(attnlab.layer.multihead, "_attention_on_the_grid", lambda *a, **k: calls.append(1) or real(*a, **k))
    forward(model, [1, 2, 3])
    run_with_cache(model, [1, 2, 3], names=["blocks.0.attn.hook_q", "blocks.1.hook_resid_post"])
    assert calls == []
    run_with_cache(model, [1, 2, 3], names=["blocks.1.attn.hook_pattern"])
    assert calls == [1]                                   # only the layer asked for


def test_run_with_cache_through_kv_caches_sees_the_new_tokens(rng):
    model = own_lm(rng, RoPE(), n_kv_heads=2)
    ids = np.array([1, 2, 3, 4, 5])
    _, full = run_with_cache(model, ids)
    caches = new_caches(model, 5)
    run_with_cache(model, ids[:3], caches=caches)
    _, step = run_with_cache(model, ids[3:], caches=caches)
    np.testing.assert_allclose(step["blocks.1.attn.hook_pattern"], full["blocks.1.attn.hook_pattern"][:, 3:],
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(step["blocks.1.attn.hook_k"], full["blocks.1.attn.hook_k"][:, 3:], rtol=1e-10)
    assert caches[1].k.shape == (2, 5, 4)                 # the cache holds the 2 KV heads only


def test_hook_names_follow_the_model(rng):
    gpt_like = Transformer.init(ModelConfig(vocab_size=5, n_layers=1, attention=AttentionConfig(d_model=8, n_heads=2),
                                            d_mlp=16, norm=LayerNorm), rng=rng)
    names = hook_names(gpt_like)
    assert "blocks.0.hook_mlp_out" in names and names[-3:] == ["ln_final.hook_normalized", "ln_final.hook_out",
                                                                "hook_unembed"]
    assert "blocks.0.hook_mlp_out" not in hook_names(own_lm(rng, Learned()))


def test_bad_hooks_are_named(rng):
    model = own_lm(rng, Learned())
    with pytest.raises(ValueError, match=r"hooks has no activation named 'blocks.0.attn.hook_patern'; did you mean "
                                         r"\['blocks.0.attn.hook_pattern'"):
        run_with_hooks(model, [1], {"blocks.0.attn.hook_patern": print})
    with pytest.raises(ValueError, match="hooks has no activation named 'blocks.9.hook_resid_pre'"):
        run_with_cache(model, [1], names=["blocks.9.hook_resid_pre"])
    with pytest.raises(TypeError, match=r"hooks\['blocks.0.hook_resid_pre'\] must be a function"):
        run_with_hooks(model, [1], {"blocks.0.hook_resid_pre": 3})
    with pytest.raises(ValueError, match=r"the hook on 'blocks.0.attn.hook_q' returned shape \(2, 1, 3\); it must "
                                         r"keep the shape \(4, 1, 3\)"):
        run_with_hooks(model, [1], {"blocks.0.attn.hook_q": lambda q, name: q[:2]})
    with pytest.raises(TypeError, match="names must be None, a hook name, a list of hook names or a function"):
        run_with_cache(model, [1], names=3)
