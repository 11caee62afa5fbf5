"""gpt-oss against transformers' eager implementation (float32): learned sinks, alternating sliding and full
layers, YaRN RoPE, biased q/k/v/o and the experts MLP.

Random models are written offline by ``save_pretrained`` into tmp folders (float32, experts unquantized) and
read back by both libraries. Held to: attentions within 1e-5, hidden states and logits within 1e-5 relative
(to the largest value), 40 greedy tokens identical on a prompt longer than the window, the KV-cache decode
equal to the full forward, 300 tokens through the tiled path. Nothing is downloaded.
"""

import json
import os
import shutil

import numpy as np
import pytest

from attnlab.models import load_network
from attnlab.stack.experts import Experts
from attnlab.stack.transformer import forward, generate, new_caches

import _hf_models as _hf
from _hf_models import assert_forward_matches, hf_greedy, relative, saved_folders

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

YARN = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0, "original_max_position_embeddings": 64,
        "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
CONFIGS = {
    # 4 experts, top 2, GQA 4:2, window 6 on layer 0 then full, as gpt-oss alternates
    "small": dict(vocab_size=300, hidden_size=64, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=6,
                  max_position_embeddings=512, rope_parameters=YARN),
    # a shape the tests were not written around: 3 layers full/sliding/sliding, MQA, head_dim ≠ d/h, top 3 of 5,
    # a low clamp so the limit bites, d_head 24
    "odd": dict(vocab_size=257, hidden_size=40, intermediate_size=28, num_hidden_layers=3, num_attention_heads=6,
                num_key_value_heads=1, head_dim=24, num_local_experts=5, num_experts_per_tok=3, sliding_window=9,
                layer_types=["full_attention", "sliding_attention", "sliding_attention"], swiglu_limit=1.5,
                max_position_embeddings=512, rope_parameters=dict(YARN, factor=4.0, original_max_position_embeddings=128)),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    def make(kind: str):
        cfg = transformers.GptOssConfig(**CONFIGS[kind], bos_token_id=None, eos_token_id=None, pad_token_id=None)
        model = transformers.GptOssForCausalLM(cfg)
        with torch.no_grad():                           # transformers starts norms at 1, biases and sinks at 0
            for name, p in model.named_parameters():
                if "norm" in name or name.endswith(("bias", "sinks")):
                    p.add_((1.0 if name.endswith("sinks") else 0.2) * torch.randn_like(p))
                elif "experts" in name or "router" in name:
                    p.normal_(0, 0.3)                   # experts and router big enough to choose and clamp
        return model
    return saved_folders(tmp_path_factory, make, torch)


def hf_model(folder):
    return _hf.hf_model(folder, torch, transformers)


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_attentions_hidden_states_and_logits_match_transformers(folders, kind):
    folder = folders(kind)
    model = load_network(folder)
    assert isinstance(model.blocks[0].mlp, Experts) and model.blocks[0].attn.sinks is not None
    ids = np.random.default_rng(1).integers(0, CONFIGS[kind]["vocab_size"], 24)   # longer than every window
    out, theirs = assert_forward_matches(model, folder, ids, torch, transformers)
    rows = theirs.sum(-1)                                           # the sinks took weight: rows sum below 1
    assert rows.max() < 1 - 1e-3


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_40_greedy_tokens_match_transformers_generate(folders, kind):
    folder = folders(kind)
    ids = np.random.default_rng(2).integers(0, CONFIGS[kind]["vocab_size"], 14)   # longer than the windows
    ours = generate(load_network(folder), ids, 40)
    np.testing.assert_array_equal(ours, hf_greedy(folder, ids, 40, torch, transformers))


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_kv_cache_decode_equals_the_full_forward(folders, kind):
    model = load_network(folders(kind))
    ids = np.random.default_rng(4).integers(0, CONFIGS[kind]["vocab_size"], 20)
    full = forward(model, ids).logits
    caches = new_caches(model, 32)
    steps = [forward(model, ids[:5], caches=caches).logits]
    steps += [forward(model, ids[i:i + 1], caches=caches).logits for i in range(5, 20)]
    assert relative(np.concatenate(steps), full) < 1e-5


def test_300_tokens_through_the_tiled_path_match_transformers(folders, monkeypatch):
    import attnlab.kernels.tiled

    folder = folders("small")
    model = load_network(folder)
    ids = np.random.default_rng(3).integers(0, 300, 300)
    calls, real = [], attnlab.kernels.tiled.tiled_forward
    monkeypatch.setattr(attnlab.kernels.tiled, "tiled_forward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    logits = forward(model, ids).logits
    assert len(calls) == 2                                          # each layer went through the tiled kernel
    with torch.no_grad():
        want = hf_model(folder)(torch.from_numpy(ids)[None]).logits[0].numpy()
    assert relative(logits, want) < 1e-5


def test_router_choices_are_hooked_and_match_transformers(folders):
    from attnlab.stack.hooks import run_with_cache

    folder = folders("small")
    model = load_network(folder)
    ids = np.random.default_rng(5).integers(0, 300, 10)
    _, cache = run_with_cache(model, ids)
    hf = hf_model(folder)
    with torch.no_grad():                                           # their norm and router on our stream
        x = hf.model.layers[1].post_attention_layernorm(torch.from_numpy(cache["blocks.1.hook_resid_mid"]))
        logits, scores, chosen = hf.model.layers[1].mlp.router(x)
    np.testing.assert_allclose(cache["blocks.1.mlp.hook_router_logits"], logits.numpy(), atol=1e-5)
    np.testing.assert_array_equal(cache["blocks.1.mlp.hook_expert_ids"], chosen.numpy())
    np.testing.assert_allclose(cache["blocks.1.mlp.hook_expert_weights"], scores.numpy(), atol=1e-6)
    p = cache["blocks.0.attn.hook_sink"]                            # (h, n): what each query gave its sink
    np.testing.assert_allclose(p + cache["blocks.0.attn.hook_pattern"].sum(-1), 1, rtol=1e-5)


def test_what_is_not_read_is_refused_by_name(folders, tmp_path):
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "mxfp4"
    shutil.copytree(folders("small"), folder)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.mlp.experts.gate_up_proj_blocks"] = np.zeros((4, 96, 2, 16), np.uint8)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(ValueError, match="MXFP4"):
        load_network(folder)
    config = json.loads((folders("small") / "config.json").read_text())
    for edit, match in (({"layer_types": ["sliding_attention", "chunked"]}, "'layer_types' must name"),
                        ({"swiglu_limit": -1}, "'swiglu_limit' must be a positive number")):
        bad = tmp_path / f"bad-{len(match)}"
        shutil.copytree(folders("small"), bad)
        (bad / "config.json").write_text(json.dumps({**config, **edit}))
        with pytest.raises(ValueError, match=match):
            load_network(bad)


def test_gradients_match_transformers_autograd(folders):
    """The loss's gradient, sinks and experts and router included, against torch's autograd of the same model."""
    from attnlab.lm.model import loss_and_grad

    folder = folders("small")
    model = load_network(folder)
    rng = np.random.default_rng(6)
    ids, targets = rng.integers(0, 300, 16), rng.integers(0, 300, 16)
    value, grads = loss_and_grad(model, ids, targets)
    hf = hf_model(folder)
    logits = hf(torch.from_numpy(ids)[None]).logits[0]
    theirs = torch.nn.functional.cross_entropy(logits, torch.from_numpy(targets))
    theirs.backward()
    assert value == pytest.approx(theirs.item(), rel=1e-5)
    g = {n: p.grad.numpy() for n, p in hf.named_parameters()}
    for i in range(2):
        p = f"model.layers.{i}."
        want = {f"blocks.{i}.attn.sinks": g[p + "self_attn.sinks"],
                f"blocks.{i}.attn.W_V": g[p + "self_attn.v_proj.weight"].T,
                f"blocks.{i}.mlp.router.W": g[p + "mlp.router.weight"].T,
                f"blocks.{i}.mlp.router.b": g[p + "mlp.router.bias"],
                f"blocks.{i}.mlp.W_gate": g[p + "mlp.experts.gate_up_proj"][..., ::2],
                f"blocks.{i}.mlp.W_in": g[p + "mlp.experts.gate_up_proj"][..., 1::2],
                f"blocks.{i}.mlp.b_out": g[p + "mlp.experts.down_proj_bias"],
                f"blocks.{i}.ln_2.weight": g[p + "post_attention_layernorm.weight"]}
        for name, w in want.items():
            assert relative(grads[name], w) < 1e-4, name
