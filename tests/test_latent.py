"""Multi-head latent attention (issue 32, MLA): the layer against a float64 reference written out from the
DeepSeek-V2 equations, the latent KV cache (r + d_rope numbers a token), the absorbed decode against the plain
one, the backward against central differences, and the DeepSeek-V3 family against transformers (eager,
float32) on random small configs: with and without a query latent, dense and MoE layers, YaRN; skipped
without torch and transformers.
"""
import numpy as np
import pytest

from attnlab.layer.latent import LatentAttention, LatentCache, LatentConfig, latent_attention
from attnlab.layer.positions import Learned, RoPE
from attnlab.layer.tape import Tape
from attnlab.lm.model import loss, loss_and_grad
from attnlab.stack.backward import backward
from attnlab.stack.experts import ExpertsConfig
from attnlab.stack.hooks import run_with_cache
from attnlab.stack.layers import RMSNorm
from attnlab.stack.transformer import ModelConfig, Transformer, forward, generate, new_caches

V = 17


def latent(q_lora_rank=5, **kw):
    return LatentConfig(**{"d_model": 12, "n_heads": 3, "n_ctx": 40, "positions": RoPE(theta=50.0),
                           "q_lora_rank": q_lora_rank, "kv_lora_rank": 7, "d_nope": 4, "d_rope": 2, "d_v": 5, **kw})


def random_layer(c, rng, dtype=np.float64):
    """Every array random, norms around 1."""
    layer = LatentAttention.init(c, rng=rng, std=0.4, dtype=dtype)
    for name, p in layer.params().items():
        if not name.startswith("W"):
            p[...] = name.endswith("norm") + rng.normal(0, 0.3, p.shape)
    return layer


def reference(layer, x):
    """MLA written out head by head in float64, from the equations (no cache, causal, plain RoPE pairs)."""
    c = layer.config
    p = {k: v.astype(np.float64) for k, v in layer.params().items()}
    x = x.astype(np.float64)
    n, r, h = x.shape[0], c.kv_lora_rank, c.n_heads
    rms = lambda a, w: a / np.sqrt((a * a).mean(-1, keepdims=True) + c.latent_eps) * w   # noqa: E731
    q = x @ p["W_Q"] if "W_Q" in p else rms(x @ p["W_DQ"] + p["b_DQ"], p["q_norm"]) @ p["W_UQ"]   # (n, h·d_qk)
    ckv = x @ p["W_DKV"] + p["b_DKV"]                            # (n, r + d_rope)
    lat, k_r = rms(ckv[:, :r], p["kv_norm"]), ckv[:, r:]

    def rope(a):                                                 # (n, d_rope), pairs (2i, 2i+1)
        out = a.copy()
        for t in range(n):
            for i in range(c.d_rope // 2):
                ang = t * 50.0 ** (-2 * i / c.d_rope)
                u, w = a[t, 2 * i], a[t, 2 * i + 1]
                out[t, 2 * i], out[t, 2 * i + 1] = u * np.cos(ang) - w * np.sin(ang), u * np.sin(ang) + w * np.cos(ang)
        return out
    d_qk, outs = c.d_nope + c.d_rope, []
    for i in range(h):
        qi = q[:, i * d_qk:(i + 1) * d_qk]
        qi = np.concatenate([qi[:, :c.d_nope], rope(qi[:, c.d_nope:])], 1)
        ki = np.concatenate([lat @ p["W_UK"][:, i * c.d_nope:(i + 1) * c.d_nope], rope(k_r)], 1)
        vi = lat @ p["W_UV"][:, i * c.d_v:(i + 1) * c.d_v]
        s = qi @ ki.T * d_qk ** -0.5 + np.triu(np.full((n, n), -np.inf), 1)
        a = np.exp(s - s.max(1, keepdims=True))
        outs.append(a / a.sum(1, keepdims=True) @ vi)
    return np.concatenate(outs, 1) @ p["W_O"] + p["b_O"]


@pytest.mark.parametrize("q_lora_rank", [5, None])
def test_the_layer_matches_the_equations_written_out(q_lora_rank, rng):
    layer = random_layer(latent(q_lora_rank), rng)
    x = rng.normal(size=(9, 12))
    np.testing.assert_allclose(latent_attention(layer, x, is_causal=True), reference(layer, x), rtol=0, atol=1e-12)


def test_every_path_of_the_layer(rng, tile_kernel):
    """200 tokens take the tiled kernel (d_v != d_qk), its taped pass too; a decode step the decode kernel, in
    the absorbed form (d_k = r + d_rope, one key/value head) — on the numpy and the fused kernels."""
    layer = random_layer(latent(n_ctx=256), rng)
    x = rng.normal(size=(200, 12))
    want = reference(layer, x)
    np.testing.assert_allclose(latent_attention(layer, x, is_causal=True), want, rtol=0, atol=1e-11)
    tape = Tape()
    np.testing.assert_allclose(latent_attention(layer, x, is_causal=True, tape=tape), want, rtol=0, atol=1e-11)
    assert type(tape.value.attn).__name__ == "TiledSaved"
    cache = layer.new_cache(200)
    latent_attention(layer, x[:199], is_causal=True, cache=cache)
    np.testing.assert_allclose(latent_attention(layer, x[199:], is_causal=True, cache=cache), want[199:], rtol=0,
                               atol=1e-11)


def test_the_cache_keeps_the_latent_and_the_shared_key_only(rng):
    """r + d_rope numbers a token (7 + 2), not 2·h·d_head; and it holds [c | rope(k_r)], seen at hook_kv_latent."""
    c = latent()
    layer = random_layer(c, rng, np.float32)
    cache = layer.new_cache(10)
    assert isinstance(cache, LatentCache) and cache.k.shape == (1, 10, 9)
    assert cache.bytes_per_token == (7 + 2) * 4
    assert np.shares_memory(cache.v, cache.k) and cache.v.shape == (1, 10, 7)
    seen = {}
    x = rng.normal(size=(4, 12)).astype(np.float32)
    latent_attention(layer, x, is_causal=True, cache=cache, hook=_Keep(seen))
    assert cache.length == 4
    np.testing.assert_array_equal(cache.values[0], seen["hook_kv_latent"])      # the latent itself


class _Keep:
    """Hooks that record every point they pass."""
    def __init__(self, seen):
        self.seen = seen

    def wants(self, name):
        return name in ("hook_kv_latent",)

    def __call__(self, name, a):
        self.seen[name] = a
        return a


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("q_lora_rank", [5, None])
def test_absorbed_decode_equals_the_plain_form(dtype, tol, q_lora_rank, rng):
    """A decode step with W_UK folded into the query and W_UV after the weighted sum gives what rebuilding
    every head's K and V from the cached latent gives, and what the full pass gives at that row."""
    layer = random_layer(latent(q_lora_rank), rng, dtype)
    x = rng.normal(size=(2, 11, 12)).astype(dtype)
    full = latent_attention(layer, x, is_causal=True)            # (2, 11, 12)
    for step in (1, 3):                                          # a step of one token, and of three
        plain, absorbed = layer.new_cache(16, batch_shape=(2,)), layer.new_cache(16, batch_shape=(2,))
        n0 = 11 - step
        for cache in (plain, absorbed):
            latent_attention(layer, x[:, :n0], is_causal=True, cache=cache)
        a = latent_attention(layer, x[:, n0:], is_causal=True, cache=absorbed, absorb=True)
        b = latent_attention(layer, x[:, n0:], is_causal=True, cache=plain, absorb=False)
        assert a.dtype == dtype
        scale = np.abs(b).max()
        np.testing.assert_allclose(a, b, rtol=0, atol=tol * scale)
        np.testing.assert_allclose(a, full[:, n0:], rtol=0, atol=tol * scale)


def test_a_decode_step_is_absorbed_unless_a_hook_asks_for_the_heads_keys(rng, monkeypatch):
    import attnlab.layer.latent as mod
    layer = random_layer(latent(), rng)
    cache = layer.new_cache(8)
    latent_attention(layer, rng.normal(size=(3, 12)), is_causal=True, cache=cache)
    calls = []
    monkeypatch.setattr(mod, "_absorbed", lambda *a: calls.append(1) or np.zeros((3, 1, 5)))
    latent_attention(layer, rng.normal(size=(1, 12)), is_causal=True, cache=cache)
    assert calls == [1]


# DeepSeek-V3's mixture of experts on layer 1 (layer 0 dense): the group-limited sigmoid router, shared experts
MOE = ExpertsConfig(n_experts=4, top_k=2, d_expert=3, router="group_sigmoid", glu="silu", bias=False, n_group=2,
                    topk_group=1, routed_scaling_factor=2.5, n_shared=1, first_dense=1)


def model_config(q_lora_rank=5, experts=None, **kw):
    return ModelConfig(vocab_size=V, n_layers=2, attention=latent(q_lora_rank, **kw), d_mlp=10, activation="silu",
                       mlp="gated", norm=RMSNorm, experts=experts)


def tiny(rng, dtype=np.float64, **kw):
    model = Transformer.init(model_config(**kw), rng=rng, std=0.4, dtype=dtype)
    for name, p in model.params().items():
        if name.endswith(("weight", "norm")) or ".b_" in name or name == "b_U":
            p[...] = name.endswith(("weight", "norm")) + rng.normal(0, 0.3, p.shape)
    return model


@pytest.mark.parametrize("q_lora_rank,experts", [(5, None), (None, None), (5, MOE)], ids=["q_lora", "q", "moe"])
def test_the_backward_matches_central_differences(q_lora_rank, experts, rng, param_grads):
    model = tiny(rng, q_lora_rank=q_lora_rank, experts=experts)
    ids, targets = rng.integers(0, V, (2, 6)), rng.integers(0, V, (2, 6))
    value, grads = loss_and_grad(model, ids, targets)
    f = lambda: loss(model, ids, targets)                       # noqa: E731
    assert value == pytest.approx(f(), rel=1e-13)
    entries = lambda p: [np.unravel_index(j, p.shape) for j in rng.choice(p.size, size=min(4, p.size),   # noqa: E731
                                                                           replace=False)]
    param_grads(grads, model.params(), f, entries, tag=(q_lora_rank, experts is not None))


def test_the_layers_backward_on_the_tiled_path(rng, param_grads):
    """200 tokens: the taped pass keeps the tiled kernel's lse; the layer's gradients match central differences."""
    from attnlab.layer.latent import latent_attention_backward_named
    layer = random_layer(latent(n_ctx=256), rng)
    x, w = rng.normal(size=(200, 12)), rng.normal(size=(200, 12))
    tape = Tape()
    latent_attention(layer, x, is_causal=True, tape=tape)
    assert type(tape.value.attn).__name__ == "TiledSaved"
    dx, grads, _ = latent_attention_backward_named(layer, tape.value, w)
    f = lambda: float((latent_attention(layer, x, is_causal=True) * w).sum())   # noqa: E731
    entries = lambda p: [np.unravel_index(j, p.shape) for j in rng.choice(p.size, size=min(2, p.size),   # noqa: E731
                                                                           replace=False)]
    param_grads(grads, layer.params(), f, entries)
    param_grads({"x": dx}, {"x": x}, f, lambda p: [(0, 3), (150, 7), (199, 0)])


def test_gradients_at_the_latent_and_the_query(rng, numeric_grad):
    """backward's gradient at blocks.0.attn.hook_kv_latent and hook_q is the derivative of forward with an
    additive patch there."""
    model = tiny(rng)
    ids = rng.integers(0, V, 6)
    w = rng.normal(size=(6, V))
    tape = Tape()
    forward(model, ids, tape=tape)
    names = ["blocks.0.attn.hook_kv_latent", "blocks.0.attn.hook_q", "blocks.1.attn.hook_z"]
    _, named = backward(model, tape, w, grad_names=names)
    _, acts = run_with_cache(model, ids, names=names)
    for name in names:
        delta = np.zeros_like(acts[name])
        hooks = {name: lambda a, _: a + delta}
        metric = lambda: float((forward(model, ids, hooks=hooks).logits * w).sum())   # noqa: E731
        np.testing.assert_allclose(named[name], numeric_grad(metric, delta), rtol=1e-6, atol=1e-8)


def test_run_with_cache_on_a_latent_model(rng):
    """The latent's hook (..., n, r), the heads' z (..., h, n, d_v), and each head's write into the stream from z
    and W_O adding up to what the attention adds."""
    model = tiny(rng)
    ids = rng.integers(0, V, 6)
    _, cache = run_with_cache(model, ids)
    assert cache["blocks.0.attn.hook_kv_latent"].shape == (6, 7)
    assert cache["blocks.1.attn.hook_z"].shape == (3, 6, 5) and cache["blocks.1.attn.hook_pattern"].shape == (3, 6, 6)
    heads = cache.stack_head_results(layer=2)                   # (2·h, n, d_model)
    b_O = model.blocks[1].attn.b_O
    np.testing.assert_allclose(heads[3:].sum(0) + b_O, cache["blocks.1.hook_attn_out"], rtol=0, atol=1e-12)


def test_a_padded_batch_gives_each_prompt_its_own_activations(rng):
    """Left padding: each row's positions count from its first real token, so the rope slices turn as unpadded."""
    model = tiny(rng)
    a, b = rng.integers(0, V, 6), rng.integers(0, V, 4)
    ids = np.stack([a, np.concatenate([[0, 0], b])])
    mask = np.stack([np.ones(6, bool), np.arange(6) >= 2])
    out = forward(model, ids, attention_mask=mask).logits
    np.testing.assert_allclose(out[0], forward(model, a).logits, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out[1, 2:], forward(model, b).logits, rtol=0, atol=1e-12)


def test_generate_decodes_from_latent_caches(rng):
    """Greedy tokens from the cached, absorbed decode equal those of the full pass re-run each step."""
    model = tiny(rng, dtype=np.float32)
    caches = new_caches(model, 20)
    assert all(isinstance(c, LatentCache) and c.bytes_per_token == 9 * 4 for c in caches)
    ids = rng.integers(0, V, 5)
    got = generate(model, ids, 12)
    seq = list(ids)
    for _ in range(12):
        seq.append(int(forward(model, np.array(seq)).logits[-1].argmax()))
    assert got.tolist() == seq[5:]


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="n_kv_heads"):
        latent(n_kv_heads=1)
    with pytest.raises(ValueError, match="d_head"):
        latent(d_head=5)
    with pytest.raises(ValueError, match="kv_lora_rank"):
        latent(kv_lora_rank=0)
    with pytest.raises(ValueError, match="positions must be RoPE"):
        latent(positions=Learned())
    with pytest.raises(TypeError, match="LatentCache"):
        latent_attention(LatentAttention.init(latent(), rng=np.random.default_rng(0)), np.zeros((2, 12)),
                         cache=object())
    with pytest.raises(ValueError, match="absorb"):
        latent_attention(LatentAttention.init(latent(), rng=np.random.default_rng(0)), np.zeros((2, 12)), absorb=True)


# --- DeepSeek-V3 against transformers ---------------------------------------------------------------------------

YARN = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=16, beta_fast=32, beta_slow=1,
            mscale=1.0, mscale_all_dim=0.8, rope_theta=10000.0)
SHAPES = {
    "dense": dict(first_k_dense_replace=3),
    "no_q_lora_moe": dict(q_lora_rank=None, first_k_dense_replace=1, n_shared_experts=2, rope_interleave=False,
                          attention_bias=True),
    "moe_yarn": dict(first_k_dense_replace=1, rope_parameters=YARN, num_attention_heads=5, qk_nope_head_dim=6,
                     v_head_dim=3, kv_lora_rank=9),
}


def _transformers():
    pytest.importorskip("torch")
    return pytest.importorskip("transformers")


@pytest.fixture(scope="module", params=sorted(SHAPES))
def deepseek(request, tmp_path_factory):
    """A random small DeepseekV3ForCausalLM saved with save_pretrained, and attnlab's load of the folder."""
    transformers = _transformers()
    import torch
    from attnlab.models import load_network
    kw = dict(vocab_size=61, hidden_size=32, intermediate_size=40, moe_intermediate_size=12, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=None, n_routed_experts=8, n_group=2, topk_group=1,
              num_experts_per_tok=3, kv_lora_rank=12, q_lora_rank=10, qk_rope_head_dim=4, v_head_dim=6,
              qk_nope_head_dim=8, max_position_embeddings=64, initializer_range=0.2, eos_token_id=None,
              bos_token_id=None, routed_scaling_factor=2.5)
    kw.update(SHAPES[request.param])
    if kw["num_key_value_heads"] is None:
        kw["num_key_value_heads"] = kw["num_attention_heads"]
    torch.manual_seed(sorted(SHAPES).index(request.param))
    cfg = transformers.DeepseekV3Config(**kw)
    cfg._attn_implementation = "eager"
    hf = transformers.DeepseekV3ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
        for layer in hf.model.layers[kw["first_k_dense_replace"]:]:
            layer.mlp.gate.e_score_correction_bias.copy_(torch.randn(kw["n_routed_experts"]) * 0.05)
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    return request.param, hf, load_network(folder)


def test_deepseek_v3_matches_transformers(deepseek):
    import torch
    name, hf, model = deepseek
    ids = np.random.default_rng(5).integers(0, 61, (2, 21))
    with torch.no_grad():
        want = hf(torch.tensor(ids), output_attentions=True, output_hidden_states=True)
    got = forward(model, ids, return_weights=True)
    rel = lambda a, b: np.abs(a - b).max() / np.abs(b).max()   # noqa: E731
    assert rel(got.logits, want.logits.numpy()) < 1e-5, name
    assert len(got.hidden_states) == len(want.hidden_states)
    for a, b in zip(got.hidden_states, want.hidden_states):
        assert rel(a, b.numpy()) < 1e-5, name
    for a, b in zip(got.attentions, want.attentions):
        assert rel(a, b.numpy()) < 1e-5, name


def test_deepseek_v3_greedy_tokens_equal_transformers(deepseek):
    import torch
    name, hf, model = deepseek
    ids = np.random.default_rng(6).integers(0, 61, 20)
    with torch.no_grad():
        want = hf.generate(torch.tensor(ids[None]), max_new_tokens=40, do_sample=False)[0, 20:].numpy()
    assert want.size == 40
    assert generate(model, ids, 40).tolist() == want.tolist(), name


def test_deepseek_v3_absorbed_decode_equals_the_plain_form(deepseek):
    """Through the whole model: the decode step absorbed (the default) or plain (a hook on each layer's keys
    asks for every head's K), the logits within 1e-5, and equal to the full pass's last row."""
    _, _, model = deepseek
    ids = np.random.default_rng(7).integers(0, 61, 15)
    logits = {}
    for absorb in (True, False):
        caches = new_caches(model, 16)
        forward(model, ids[:-1], caches=caches)
        hooks = {} if absorb else {f"blocks.{i}.attn.hook_k": lambda a, n: None for i in range(3)}
        logits[absorb] = forward(model, ids[-1:], caches=caches, hooks=hooks).logits[-1]
    scale = np.abs(logits[False]).max()
    np.testing.assert_allclose(logits[True], logits[False], rtol=0, atol=1e-5 * scale)
    np.testing.assert_allclose(logits[True], forward(model, ids).logits[-1], rtol=0, atol=1e-5 * scale)


def test_deepseek_v3_folders_ignore_the_mtp_layer_and_refuse_float8(tmp_path):
    """DeepSeek's checkpoints store the multi-token-prediction module as one more layer (transformers ignores
    it); their published float8 weights are refused by name."""
    import json
    transformers = _transformers()
    from safetensors.numpy import load_file, save_file
    from attnlab.models import load_network
    cfg = transformers.DeepseekV3Config(vocab_size=30, hidden_size=16, intermediate_size=20, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2, kv_lora_rank=6, q_lora_rank=None,
                                        qk_rope_head_dim=2, qk_nope_head_dim=4, v_head_dim=3, first_k_dense_replace=1,
                                        max_position_embeddings=32)
    transformers.DeepseekV3ForCausalLM(cfg).save_pretrained(tmp_path)
    want = forward(load_network(tmp_path), [1, 2, 3]).logits
    weights = load_file(tmp_path / "model.safetensors")
    weights["model.layers.1.eh_proj.weight"] = np.ones((16, 32), np.float32)      # the MTP module's
    weights["model.layers.1.self_attn.kv_a_layernorm.weight"] = np.ones(6, np.float32)
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    np.testing.assert_array_equal(forward(load_network(tmp_path), [1, 2, 3]).logits, want)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="quantization_config.*fp8"):
        load_network(tmp_path)


def test_deepseek_v3_on_the_tiled_path(deepseek):
    """200 tokens (no weights asked for): each layer's attention takes the tiled kernel; logits within 1e-5."""
    import torch
    name, hf, model = deepseek
    ids = np.random.default_rng(8).integers(0, 61, 200)
    with torch.no_grad():
        want = hf(torch.tensor(ids[None])).logits[0].numpy()
    got = forward(model, ids).logits
    assert np.abs(got - want).max() / np.abs(want).max() < 1e-5, name
