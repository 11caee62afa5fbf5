"""Gemma-2, GPT-NeoX and Phi-3 against transformers' eager implementation.

Random models are written offline by ``save_pretrained`` into tmp folders (float32) and read back by both
libraries. Held to: attentions within 1e-5, hidden states and logits within 1e-5 relative (to the largest
value), 40 greedy tokens identical, and 300 tokens through the tiled path. Nothing is downloaded.
"""

import os

import numpy as np
import pytest

from attnlab.models import load_network
from attnlab.stack.blocks import ParallelBlock, PreNormBlock, SandwichBlock
from attnlab.stack.transformer import forward, generate

import _hf_models as _hf
from _hf_models import assert_forward_matches, hf_greedy, perturb_norms_and_biases, relative, saved_folders

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NONE = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
SIZES = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=512, initializer_range=0.1)

MODELS = {
    # both soft-caps low enough to bite, its own score scale, windows of 5 on layer 0 (full attention on 1)
    "gemma2": (lambda: transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
        **SIZES, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=5,
        attn_logit_softcapping=1.5, final_logit_softcapping=2.0, **NONE)), SandwichBlock),
    # a quarter of each 16-wide head rotates; attention and MLP in parallel
    "neox-parallel": (lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        **SIZES, rotary_pct=0.25, use_parallel_residual=True, **NONE)), ParallelBlock),
    "neox-sequential": (lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        **SIZES, rotary_pct=0.25, use_parallel_residual=False, **NONE)), PreNormBlock),
    # fused qkv and gate_up, 2 KV heads, a window of 6
    "phi3": (lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(
        **SIZES, num_key_value_heads=2, sliding_window=6, **NONE)), PreNormBlock),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    def make(kind: str):
        model = MODELS[kind][0]()
        perturb_norms_and_biases(model, torch)
        return model
    return saved_folders(tmp_path_factory, make, torch)


def hf_model(folder):
    return _hf.hf_model(folder, torch, transformers)


@pytest.mark.parametrize("kind", list(MODELS))
def test_attentions_hidden_states_and_logits_match_transformers(folders, kind):
    folder = folders(kind)
    model = load_network(folder)
    assert isinstance(model.blocks[0], MODELS[kind][1])
    ids = np.random.default_rng(1).integers(0, 300, 24)            # longer than every window
    out, theirs = assert_forward_matches(model, folder, ids, torch, transformers)
    if kind == "gemma2":                                            # the caps and the windows did act
        raw = out.hidden_states[-1] @ model.W_E.T                  # the logits before their cap of 2
        assert np.abs(raw).max() > 3 and np.abs(out.logits).max() < 2
        assert (theirs[0][:, -1, :-5] == 0).all() and (theirs[1][:, -1, :-5] > 0).all()   # window 5, then full


@pytest.mark.parametrize("kind", list(MODELS))
def test_40_greedy_tokens_match_transformers_generate(folders, kind):
    folder = folders(kind)
    ids = np.random.default_rng(2).integers(0, 300, 12)
    ours = generate(load_network(folder), ids, 40)
    np.testing.assert_array_equal(ours, hf_greedy(folder, ids, 40, torch, transformers))


@pytest.mark.parametrize("kind", list(MODELS))
def test_300_tokens_through_the_tiled_path_match_transformers(folders, kind, monkeypatch):
    import attnlab.kernels.tiled

    folder = folders(kind)
    model = load_network(folder)
    ids = np.random.default_rng(3).integers(0, 300, 300)
    calls, real = [], attnlab.kernels.tiled.tiled_forward
    monkeypatch.setattr(attnlab.kernels.tiled, "tiled_forward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    logits = forward(model, ids).logits
    assert len(calls) == 2                                          # each layer went through the tiled kernel
    with torch.no_grad():
        want = hf_model(folder)(torch.from_numpy(ids)[None]).logits[0].numpy()
    assert relative(logits, want) < 1e-5


def test_what_is_not_read_is_refused_by_name(folders, tmp_path):
    import json
    import shutil

    for kind, edit, match in (("gemma2", {"attention_bias": True}, "sets attention_bias=True"),
                              ("gemma2", {"layer_types": ["sliding_attention", "chunked"]}, "'layer_types' must name"),
                              ("phi3", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
                               "rope_type 'longrope'")):
        folder = tmp_path / f"{kind}-{len(match)}"
        shutil.copytree(folders(kind), folder)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **edit}))
        with pytest.raises(ValueError, match=match):
            load_network(folder)
