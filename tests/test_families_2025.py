"""Qwen3, OLMo-2 and Gemma-3 (text) against transformers' eager implementation, and QK-norm's own checks.

Random small models, in shapes the older tests do not use (odd head counts, grouped-query groups of 3, d_head
other than d_model / n_heads, windows of 4 and 5), are written offline by ``save_pretrained`` (safetensors,
float32) into tmp folders and read back by both libraries. Held to: attentions within 1e-5, hidden states and
logits within 1e-5 relative (to the largest value), 40 greedy tokens identical on a prompt longer than every
window, the KV-cache decode equal to the full forward, QK-norm's activation equal to transformers' q_norm
output. QK-norm's backward is held to central differences in float64. Nothing is downloaded.
"""

import dataclasses
import os

import numpy as np
import pytest

from attnlab.layer.config import AttentionConfig
from attnlab.layer.positions import RoPE, YaRN
from attnlab.layer.qknorm import QKNorm
from attnlab.layer.tape import Tape
from attnlab.stack.backward import backward
from attnlab.stack.blocks import OutputNormBlock, PreNormBlock, SandwichBlock
from attnlab.stack.hooks import run_with_cache, run_with_hooks
from attnlab.stack.layers import RMSNorm
from attnlab.stack.transformer import ModelConfig, Transformer, forward, generate, new_caches

import _hf_models as _hf
from _hf_models import assert_forward_matches, hf_greedy, perturb_norms_and_biases, relative, saved_folders

NONE = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
VOCAB = 300


def _configs(transformers):
    return {
        # GQA groups of 3 (6 query heads on 2), d_head 10 ≠ 48/6, windows of 5 from layer 1 on, YaRN ×4 over 16
        "qwen3": (lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
            vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=6,
            num_key_value_heads=2, head_dim=10, max_position_embeddings=512, initializer_range=0.1,
            use_sliding_window=True, sliding_window=5, max_window_layers=1, tie_word_embeddings=False,
            rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                             "rope_theta": 10000.0}, **NONE)), PreNormBlock, (5,)),
        # 5 query heads (odd) on one KV head, d_head 12 ≠ 40/5, tied logits, attention biases
        "qwen3-mqa": (lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
            vocab_size=VOCAB, hidden_size=40, intermediate_size=64, num_hidden_layers=2, num_attention_heads=5,
            num_key_value_heads=1, head_dim=12, max_position_embeddings=512, initializer_range=0.1,
            tie_word_embeddings=True, attention_bias=True, **NONE)), PreNormBlock, ()),
        # 3 heads (odd) of 14 on 3 KV heads, the whole projection normalised (42 and 42 wide), NTK "dynamic" ×2
        # (plain RoPE within its 512 positions, as transformers' dynamic RoPE)
        "olmo2": (lambda: transformers.Olmo2ForCausalLM(transformers.Olmo2Config(
            vocab_size=VOCAB, hidden_size=36, intermediate_size=64, num_hidden_layers=2, num_attention_heads=3,
            num_key_value_heads=3, head_dim=14, max_position_embeddings=512, initializer_range=0.1,
            rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 500.0}, **NONE)),
            OutputNormBlock, ()),
        # OLMo-2 with GQA groups of 3: k normalised over 2·8 features, q over 6·8
        "olmo2-gqa": (lambda: transformers.Olmo2ForCausalLM(transformers.Olmo2Config(
            vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
            num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.1, **NONE)), OutputNormBlock, ()),
        # 7 layers: 5 local (window 4, base 10,000) then 1 global (base 1,000,000, linear ×8), then local again;
        # 3 query heads on 1 KV head, d_head 16 ≠ 48/3
        "gemma3": (lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
            vocab_size=VOCAB, hidden_size=48, intermediate_size=64, num_hidden_layers=7, num_attention_heads=3,
            num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=20, sliding_window=4,
            max_position_embeddings=512, initializer_range=0.1, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0,
            rope_scaling={"rope_type": "linear", "factor": 8.0}, **NONE)), SandwichBlock, (4,)),
    }


torch = transformers = None
KINDS = ("qwen3", "qwen3-mqa", "olmo2", "olmo2-gqa", "gemma3")


@pytest.fixture(scope="module")
def hf():
    global torch, transformers
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    return _configs(transformers)


@pytest.fixture(scope="module")
def folders(tmp_path_factory, hf):
    def make(kind: str):
        model = hf[kind][0]()
        perturb_norms_and_biases(model, torch, 0.3)
        return model
    return saved_folders(tmp_path_factory, make, torch)


def hf_model(folder):
    return _hf.hf_model(folder, torch, transformers)


@pytest.mark.parametrize("kind", KINDS)
def test_attentions_hidden_states_and_logits_match_transformers(folders, hf, kind):
    from attnlab.models import load_network

    folder = folders(kind)
    model = load_network(folder)
    assert isinstance(model.blocks[0], hf[kind][1]) and model.config.attention.qk_norm is not None
    ids = np.random.default_rng(1).integers(0, VOCAB, 24)              # longer than every window
    out, theirs = assert_forward_matches(model, folder, ids, torch, transformers)
    for window in hf[kind][2]:                                          # the windows did act
        layers = [i for i, a in enumerate(model.config.layers) if a.window == window]
        assert layers and (theirs[layers][:, :, -1, :-window] == 0).all()


def test_gemma3_layers_rotate_at_two_speeds(folders):
    from attnlab.models import load_network

    c = load_network(folders("gemma3")).config
    kinds = [(a.window, a.positions) for a in c.layers]
    local, full = (4, RoPE(10_000.0)), (None, RoPE(1_000_000.0, scaling={"rope_type": "linear", "factor": 8.0}))
    assert kinds == [local] * 5 + [full] + [local]
    assert c.attention.qk_norm == QKNorm("head", 1e-6) and c.logit_softcap is None and c.attention.softcap is None


def test_gemma3_older_config_spelling_reads_the_same(folders, tmp_path):
    """Hub configs written before transformers 5 state the two bases as rope_theta / rope_local_base_freq /
    rope_scaling and the pattern as sliding_window_pattern: the same model."""
    import json
    import shutil

    from attnlab.models import load_network

    folder = tmp_path / "old"
    shutil.copytree(folders("gemma3"), folder)
    config = json.loads((folder / "config.json").read_text())
    params = config.pop("rope_parameters")
    del config["layer_types"]
    config.update(rope_theta=params["full_attention"]["rope_theta"],
                  rope_local_base_freq=params["sliding_attention"]["rope_theta"],
                  rope_scaling={"rope_type": "linear", "factor": 8.0}, sliding_window_pattern=6)
    (folder / "config.json").write_text(json.dumps(config))
    assert load_network(folder).config == load_network(folders("gemma3")).config


@pytest.mark.parametrize("kind", KINDS)
def test_40_greedy_tokens_match_transformers_generate(folders, kind):
    from attnlab.models import load_network

    folder = folders(kind)
    ids = np.random.default_rng(2).integers(0, VOCAB, 12)              # longer than every window (4, 5)
    ours = generate(load_network(folder), ids, 40)
    np.testing.assert_array_equal(ours, hf_greedy(folder, ids, 40, torch, transformers))


@pytest.mark.parametrize("kind", KINDS)
def test_300_tokens_through_the_tiled_path_match_transformers(folders, kind, monkeypatch):
    import attnlab.kernels.tiled
    from attnlab.models import load_network

    folder = folders(kind)
    model = load_network(folder)
    ids = np.random.default_rng(3).integers(0, VOCAB, 300)             # past YaRN's 16 trained positions too
    calls, real = [], attnlab.kernels.tiled.tiled_forward
    monkeypatch.setattr(attnlab.kernels.tiled, "tiled_forward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    logits = forward(model, ids).logits
    assert len(calls) == model.config.n_layers                          # each layer went through the tiled kernel
    with torch.no_grad():
        want = hf_model(folder)(torch.from_numpy(ids)[None]).logits[0].numpy()
    assert relative(logits, want) < 1e-5


@pytest.mark.parametrize("kind", KINDS)
def test_kv_cache_decode_equals_the_full_forward(folders, kind):
    from attnlab.models import load_network

    model = load_network(folders(kind))
    ids = np.random.default_rng(4).integers(0, VOCAB, 20)
    full = forward(model, ids).logits                                    # (20, vocab)
    caches = new_caches(model, 20)
    steps = [forward(model, ids[:7], caches=caches).logits]
    steps += [forward(model, ids[t:t + 1], caches=caches).logits for t in range(7, 20)]
    np.testing.assert_allclose(np.concatenate(steps), full, rtol=0, atol=1e-5 * np.abs(full).max())


@pytest.mark.parametrize("kind,module", [("qwen3", "q_norm"), ("qwen3", "k_norm"), ("olmo2", "q_norm"),
                                         ("gemma3", "k_norm")])
def test_hook_normed_is_transformers_q_norm_output(folders, kind, module):
    """``attn.hook_q_normed`` / ``hook_k_normed`` hold what transformers' q_norm / k_norm return, in
    TransformerLens's layout (rotate_half's feature order, heads after positions)."""
    from attnlab.models import load_network

    folder = folders(kind)
    model = load_network(folder)
    ids = np.random.default_rng(5).integers(0, VOCAB, 9)
    name = f"blocks.1.attn.hook_{module[0]}_normed"
    _, cache = run_with_cache(model, ids, [name])
    ours = cache.to_tl()[name][0]                                        # (n, h, d_head)
    seen = []
    hf = hf_model(folder)
    getattr(hf.model.layers[1].self_attn, module).register_forward_hook(lambda m, i, o: seen.append(o))
    with torch.no_grad():
        hf(torch.from_numpy(ids)[None])
    theirs = seen[0][0].numpy()
    theirs = theirs.reshape(ours.shape) if theirs.ndim == 2 else (theirs if theirs.shape == ours.shape else
                                                                   np.swapaxes(theirs, 0, 1))
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5 * np.abs(theirs).max())


def test_a_hook_on_the_normed_query_steers_the_pass(folders):
    from attnlab.models import load_network

    model = load_network(folders("qwen3"))
    ids = np.arange(10)
    plain = forward(model, ids).logits
    same = run_with_hooks(model, ids, {"blocks.0.attn.hook_q_normed": lambda q, name: q}).logits
    np.testing.assert_array_equal(same, plain)
    zeroed = run_with_hooks(model, ids, {"blocks.0.attn.hook_q_normed": lambda q, name: 0 * q}).logits
    assert np.abs(zeroed - plain).max() > 1e-3


# --- QK-norm on its own: no transformers needed --------------------------------------------------------

def _qk_model(over: str, block, rng):
    """Two layers, 6 query heads on 2 (groups of 3), d_head 6 ≠ 12/6, YaRN; the second with a window of 3."""
    a = AttentionConfig(d_model=12, n_heads=6, n_kv_heads=2, d_head=6, n_ctx=32,
                        positions=RoPE(100.0, scaling=YaRN(4.0, 8)), qk_norm=QKNorm(over, 1e-5))
    c = ModelConfig(vocab_size=11, n_layers=2, attention=a, d_mlp=10, activation="silu", mlp="gated", norm=RMSNorm,
                    block=block, layers=(a, dataclasses.replace(a, window=3)))
    model = Transformer.init(c, rng=rng, std=0.4, dtype=np.float64)
    for p in model.params().values():                                     # norms and biases away from 1 and 0
        if p.ndim == 1:
            p += 0.3 * rng.normal(size=p.shape)
    return model


@pytest.mark.parametrize("over,block", [("head", PreNormBlock), ("all", OutputNormBlock), ("head", SandwichBlock)])
def test_qk_norm_backward_matches_finite_differences(over, block, rng, param_grads):
    model = _qk_model(over, block, rng)
    assert "blocks.0.attn.q_norm" in model.params() and "blocks.1.attn.k_norm" in model.params()
    ids = np.array([[1, 4, 2, 9, 3, 7, 5], [0, 2, 8, 8, 1, 6, 10]])
    dlogits = rng.normal(size=(2, 7, 11))
    tape = Tape()
    forward(model, ids, tape=tape)
    grads, named = backward(model, tape, dlogits, grad_names=["blocks.1.attn.hook_q_normed",
                                                              "blocks.0.attn.hook_k_normed", "blocks.0.attn.hook_q"])
    f = lambda: float(np.sum(forward(model, ids).logits * dlogits))     # noqa: E731
    norms = {k: v for k, v in model.params().items() if k.endswith(("_norm", "W_Q", "W_K"))}
    param_grads({k: grads[k] for k in norms}, norms, f, lambda p: list(np.ndindex(p.shape))[::5], tag=(over,))
    # at the named point: dL/d hook_q_normed by nudging what the hook returns
    q = run_with_cache(model, ids, ["blocks.1.attn.hook_q_normed"])[1]["blocks.1.attn.hook_q_normed"].copy()
    g = named["blocks.1.attn.hook_q_normed"]
    for i in [(0, 1, 3, 2), (1, 2, 6, 5), (0, 0, 0, 0)]:
        bumped = []
        for eps in (1e-6, -1e-6):
            moved = q.copy()
            moved[i] += eps
            bumped.append(float(np.sum(run_with_hooks(model, ids, {"blocks.1.attn.hook_q_normed":
                                                                   lambda x, name, m=moved: m}).logits * dlogits)))
        assert g[i] == pytest.approx((bumped[0] - bumped[1]) / 2e-6, rel=1e-5, abs=1e-8)


@pytest.mark.parametrize("over", ["head", "all"])
def test_qk_norm_by_hand_and_in_every_path(over, rng):
    """Each head's (or each token's whole) q has root mean square 1 after the norm (weight 1), whatever its
    size: the scores stay bounded; the decode and the padded-batch paths agree with the plain one."""
    model = _qk_model(over, PreNormBlock, rng)
    for name, p in model.params().items():
        if name.endswith("_norm"):
            p[:] = 1.0
    ids = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    _, cache = run_with_cache(model, ids, ["blocks.0.attn.hook_q", "blocks.0.attn.hook_q_normed"])
    q, normed = cache["blocks.0.attn.hook_q"], cache["blocks.0.attn.hook_q_normed"]   # (h, n, d_head)
    axes = (-1,) if over == "head" else (0, 2)
    rms = np.sqrt(np.mean(q ** 2, axis=axes, keepdims=True) + 1e-5)
    np.testing.assert_allclose(normed, q / rms, rtol=1e-12)
    np.testing.assert_allclose(np.sqrt(np.mean(normed ** 2, axis=axes)), 1.0, rtol=1e-4)
    full = forward(model, ids).logits
    caches = new_caches(model, 8)
    steps = np.concatenate([forward(model, ids[:3], caches=caches).logits] +
                           [forward(model, ids[t:t + 1], caches=caches).logits for t in range(3, 8)])
    np.testing.assert_allclose(steps, full, rtol=1e-12, atol=1e-12)
    padded = forward(model, np.array([[0, 0, *ids]]), attention_mask=np.array([[False, False] + [True] * 8])).logits
    np.testing.assert_allclose(padded[0, 2:], full, rtol=1e-10, atol=1e-10)


def test_qk_norm_config_is_checked_and_round_trips():
    a = AttentionConfig(d_model=8, n_heads=2, positions=RoPE(), qk_norm=QKNorm("all", 1e-6))
    assert AttentionConfig.from_json(a.to_json()) == a
    assert "qk_norm" not in AttentionConfig(d_model=8, n_heads=2).to_json()     # older JSON unchanged
    with pytest.raises(ValueError, match="qk_norm over must be one of 'head', 'all', got 'token'"):
        QKNorm("token")
    with pytest.raises(TypeError, match="qk_norm must be a QKNorm or None"):
        AttentionConfig(d_model=8, n_heads=2, qk_norm="head")
    from attnlab.layer.multihead import MultiHeadAttention
    p = MultiHeadAttention.init(a, rng=np.random.default_rng(0))
    assert p.params()["q_norm"].shape == (8,) and (p.q_norm == 1).all()
    with pytest.raises(ValueError, match="q_norm must be given with the config's qk_norm"):
        MultiHeadAttention(**{k: v for k, v in p.params().items() if k != "q_norm"}, config=a)
