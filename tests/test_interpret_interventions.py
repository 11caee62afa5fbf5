"""Ablation, activation patching and the logit lens: float64 hand computations on attnlab's own LM, and one
ablated loss, one patched logit difference and one lens row against transformers' GPT-2 with forward hooks."""

import numpy as np
import pytest

from attnlab.interpret import ablate, logit_lens, next_token_loss, patch, unembed
from attnlab.lm.model import lm_config
from attnlab.layer.multihead import merge_heads, split_heads
from attnlab.stack.transformer import Transformer, forward


@pytest.fixture
def lm(rng):
    return Transformer.init(lm_config(13, d_model=16, n_heads=4, n_layers=2, n_ctx=10), rng=rng, std=0.4,
                            dtype=np.float64)


def by_hand(model, ids, *, z_edit=None, resid_edit=None):
    """attnlab's LM in float64, written out: x = W_E + W_P; per layer x += merge(softmax(q kᵀ/√d) v) W_O + b_O.
    ``z_edit(layer, z)`` and ``resid_edit(layer, x)`` change a head output or the residual, as a hook would."""
    n = len(ids)
    x = model.W_E[ids] + model.W_P[:n]                                   # (n, d_model)
    keep = np.tril(np.ones((n, n), bool))
    for i, b in enumerate(model.blocks):
        a = b.attn
        if resid_edit is not None:
            x = resid_edit(i, x)
        q, k, v = (split_heads(x @ W + bias, a.config.n_heads) for W, bias in
                   ((a.W_Q, a.b_Q), (a.W_K, a.b_K), (a.W_V, a.b_V)))     # (h, n, d_head)
        s = np.where(keep, q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1]), -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        z = (w / w.sum(-1, keepdims=True)) @ v                           # (h, n, d_head)
        if z_edit is not None:
            z = z_edit(i, z)
        x = x + merge_heads(z) @ a.W_O + a.b_O
    return x @ model.W_U + model.b_U                                     # (n, vocab)


def test_next_token_loss_by_hand():
    logits = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1], [1 / 3, 1 / 3, 1 / 3]]))
    assert next_token_loss(logits, np.array([0, 1, 2])) == pytest.approx((-np.log(0.25) - np.log(0.1)) / 2)


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablation_equals_a_hand_computation(lm, rng, mode):
    ids = rng.integers(0, 13, 9)
    r = ablate(lm, ids, mode=mode)
    assert r.loss == pytest.approx(next_token_loss(by_hand(lm, ids), ids), abs=1e-12)
    for layer, head in ((0, 1), (1, 3)):
        def edit(i, z):
            if i == layer:
                z = z.copy()
                z[head] = 0.0 if mode == "zero" else z[head].mean(0)
            return z
        assert r.ablated[layer, head] == pytest.approx(next_token_loss(by_hand(lm, ids, z_edit=edit), ids), abs=1e-12)
    assert r.ablated.shape == (2, 4) and np.all(r.delta == r.ablated - r.loss)


def test_patching_equals_a_hand_computation_and_has_its_limits(lm, rng):
    clean = rng.integers(0, 13, 8)
    corrupt = clean.copy()
    corrupt[2] = (clean[2] + 5) % 13                                        # the texts differ at position 2 only
    r = patch(lm, clean, corrupt, answer=3, wrong=5)
    diff = lambda logits: logits[-1, 3] - logits[-1, 5]                    # noqa: E731
    assert r.clean == pytest.approx(diff(by_hand(lm, clean)), abs=1e-12)
    assert r.corrupt == pytest.approx(diff(by_hand(lm, corrupt)), abs=1e-12)
    clean_z, clean_x = {}, {}
    by_hand(lm, clean, z_edit=lambda i, z: clean_z.setdefault(i, z), resid_edit=lambda i, x: clean_x.setdefault(i, x))

    def put_head(i, z, layer=1, head=2):
        if i == layer:
            z = z.copy()
            z[head] = clean_z[i][head]
        return z
    assert r.head_diff[1, 2] == pytest.approx(diff(by_hand(lm, corrupt, z_edit=put_head)), abs=1e-12)
    assert r.heads[1, 2] == pytest.approx((r.head_diff[1, 2] - r.corrupt) / (r.clean - r.corrupt))
    # into layer 0 the residual is the embedding: patching position 2 makes the run the clean run (all of it),
    # patching any other position changes nothing
    np.testing.assert_allclose(r.resid[0], np.eye(8)[2], rtol=0, atol=1e-9)
    # into layer 1, positions after 2 carry none of it on their own before the last one reads them
    assert r.resid[1, :2] == pytest.approx([0, 0], abs=1e-9)
    assert r.heads.shape == (2, 4) and r.resid.shape == (2, 8)
    with pytest.raises(ValueError, match="same number of tokens"):
        patch(lm, clean, corrupt[:-1], answer=3, wrong=5)
    with pytest.raises(ValueError, match="answer must be a token id"):
        patch(lm, clean, corrupt, answer=13, wrong=5)
    with pytest.raises(ValueError, match="nothing to restore"):
        patch(lm, clean, clean, answer=3, wrong=5)


def test_the_lens_last_stage_is_the_model_and_the_first_the_embedding(lm, rng):
    ids = rng.integers(0, 13, 7)
    lens = logit_lens(lm, ids, top=3)
    assert lens.stages == ("embed", "block 0", "block 1") and lens.top_ids.shape == (3, 7, 3)
    np.testing.assert_allclose(lens.logits[-1], forward(lm, ids).logits, rtol=0, atol=1e-12)
    emb = (lm.W_E[ids] + lm.W_P[:7]) @ lm.W_U + lm.b_U                       # (n, vocab)
    np.testing.assert_allclose(lens.logits[0], emb, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(lens.top_ids[-1, :, 0], forward(lm, ids).logits.argmax(-1))
    assert (np.diff(lens.top_probs, axis=-1) <= 0).all()


def test_encoders_are_refused(rng):
    from attnlab.layer.config import AttentionConfig
    from attnlab.stack.layers import LayerNorm
    from attnlab.stack.blocks import PostNormBlock
    from attnlab.stack.transformer import ModelConfig
    cfg = ModelConfig(vocab_size=7, n_layers=1, attention=AttentionConfig(d_model=8, n_heads=2, n_ctx=8),
                      d_mlp=16, norm=LayerNorm, block=PostNormBlock, is_causal=False, has_logits=False, family="bert")
    enc = Transformer.init(cfg, rng=rng)
    for call in (lambda: ablate(enc, [1, 2, 3]), lambda: patch(enc, [1, 2], [2, 1], answer=1, wrong=2),
                 lambda: logit_lens(enc, [1, 2])):
        with pytest.raises(ValueError, match="bidirectional"):
            call()
    with pytest.raises(ValueError, match="mode must be one of"):
        ablate(Transformer.init(lm_config(7, d_model=8, n_heads=2, n_layers=1, n_ctx=8), rng=rng), [1, 2], mode="x")


def test_bad_input_is_named(lm):
    with pytest.raises(ValueError, match=r"logits must be \(n, vocab\) with n >= 2, got shape \(5,\)"):
        next_token_loss(np.zeros(5), [0, 1])
    with pytest.raises(ValueError, match=r"ids must be \(n,\) = \(3,\) like the logits' rows, got shape \(4,\)"):
        next_token_loss(np.zeros((3, 5)), [0, 1, 2, 3])
    with pytest.raises(ValueError, match="ids must be in"):
        next_token_loss(np.zeros((2, 5)), [0, 9])
    with pytest.raises(ValueError, match=r"x must be a residual stream \(..., d_model\) with d_model = 16, got shape"):
        unembed(lm, np.zeros((3, 7)))


# ---- against transformers' GPT-2, with forward hooks ------------------------------------------------------

@pytest.fixture(scope="module")
def gpt2_pair(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from attnlab.models import load_network
    folder = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=32, vocab_size=300,
                                  initializer_range=0.2, bos_token_id=0, eos_token_id=0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(folder)
    hf = transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    return load_network(folder), hf


def _z_hook(edit, n_heads=4):
    """A pre-hook on the output projection (GPT-2's attn.c_proj, Llama's o_proj), whose input is the merged
    heads (1, n, n_heads · d_head): z before W_O."""
    def hook(module, args):
        b, n, d = args[0].shape
        z = args[0].clone().view(b, n, n_heads, d // n_heads)                # (1, n, h, d_head)
        edit(z)
        return (z.view(b, n, d),) + tuple(args[1:])
    return hook


def _hf_loss(hf, module, pre_hook, ids):
    """transformers' next-token loss on ``ids`` with ``pre_hook`` on ``module`` for that one run."""
    import torch
    handle = module.register_forward_pre_hook(pre_hook)
    try:
        with torch.no_grad():
            t = torch.from_numpy(ids)[None]
            return hf(t, labels=t).loss.item()
    finally:
        handle.remove()


def test_ablation_matches_transformers_hooks(gpt2_pair):
    ours, hf = gpt2_pair
    ids = np.random.default_rng(3).integers(0, 300, 20)
    r = ablate(ours, ids, mode="mean")

    def mean_head(z):
        z[0, :, 2] = z[0, :, 2].mean(0)
    loss = _hf_loss(hf, hf.transformer.h[1].attn.c_proj, _z_hook(mean_head), ids)
    assert abs(r.ablated[1, 2] - loss) < 1e-4


def test_patching_matches_transformers_hooks(gpt2_pair):
    import torch
    ours, hf = gpt2_pair
    rng = np.random.default_rng(4)
    clean = rng.integers(0, 300, 12)
    corrupt = clean.copy()
    corrupt[3] = (clean[3] + 7) % 300
    answer, wrong = 11, 42
    r = patch(ours, clean, corrupt, answer=answer, wrong=wrong)
    store = {}
    block = hf.transformer.h[1]
    h1 = block.attn.c_proj.register_forward_pre_hook(lambda m, a: store.setdefault("z", a[0].clone()))
    with torch.no_grad():
        c_logits = hf(torch.from_numpy(clean)[None]).logits[0]
    h1.remove()

    def put(z):
        z[0, :, 1] = store["z"].view(1, 12, 4, 16)[0, :, 1]
    h2 = block.attn.c_proj.register_forward_pre_hook(_z_hook(put))
    try:
        with torch.no_grad():
            p_logits = hf(torch.from_numpy(corrupt)[None]).logits[0]
    finally:
        h2.remove()
    assert abs(r.clean - (c_logits[-1, answer] - c_logits[-1, wrong]).item()) < 1e-4
    assert abs(r.head_diff[1, 1] - (p_logits[-1, answer] - p_logits[-1, wrong]).item()) < 1e-4

    # one layer's residual at one position: a pre-hook on the block replaces hidden_states there
    with torch.no_grad():
        hidden = hf(torch.from_numpy(clean)[None], output_hidden_states=True).hidden_states

    def put_resid(module, args, kwargs):
        x = (args[0] if args else kwargs["hidden_states"]).clone()
        x[0, 3] = hidden[1][0, 3]
        if args:
            return (x,) + tuple(args[1:]), kwargs
        return args, {**kwargs, "hidden_states": x}
    h3 = block.register_forward_pre_hook(put_resid, with_kwargs=True)
    try:
        with torch.no_grad():
            q_logits = hf(torch.from_numpy(corrupt)[None]).logits[0]
    finally:
        h3.remove()
    assert abs(r.resid_diff[1, 3] - (q_logits[-1, answer] - q_logits[-1, wrong]).item()) < 1e-4


def test_lens_matches_transformers(gpt2_pair):
    import torch
    ours, hf = gpt2_pair
    ids = np.random.default_rng(5).integers(0, 300, 15)
    lens = logit_lens(ours, ids, top=5)
    with torch.no_grad():
        o = hf(torch.from_numpy(ids)[None], output_hidden_states=True)
        row = hf.lm_head(hf.transformer.ln_f(o.hidden_states[1]))[0]       # after block 0, through ln_f and W_U
    np.testing.assert_allclose(lens.logits[1], row.numpy(), rtol=0, atol=1e-4)
    np.testing.assert_allclose(lens.logits[-1], o.logits[0].numpy(), rtol=0, atol=1e-4)
    np.testing.assert_array_equal(lens.top_ids[1, :, 0], row.numpy().argmax(-1))


def test_llama_gqa_ablation_and_detectors_match_transformers(tmp_path):
    """A Llama-family folder (4 query heads on 2 KV heads): detectors score its weights, and a mean-ablated
    head matches a pre-hook on transformers' o_proj, whose input is the merged heads."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from attnlab.interpret import detect_heads, score_patterns
    from attnlab.models import load_network
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=120, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None))
    hf.save_pretrained(tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    ours = load_network(tmp_path)
    ids = np.random.default_rng(6).integers(0, 120, 16)
    with torch.no_grad():
        o = hf(torch.from_numpy(ids)[None], output_attentions=True)
    weights = np.stack([a[0].numpy() for a in o.attentions])                  # (L, H, n, n)
    s = detect_heads(ours, ids)
    for k, v in score_patterns(weights, ids).items():
        np.testing.assert_allclose(s[k], v, rtol=0, atol=1e-5)
    r = ablate(ours, ids, mode="mean")

    def mean_head(z):
        z[0, :, 3] = z[0, :, 3].mean(0)
    loss = _hf_loss(hf, hf.model.layers[0].self_attn.o_proj, _z_hook(mean_head), ids)
    assert abs(r.ablated[0, 3] - loss) < 1e-4
