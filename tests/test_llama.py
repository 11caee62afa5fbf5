"""attnlab's numpy Llama, Mistral and Qwen2 against transformers' eager implementation.

Random models are written offline by ``save_pretrained`` into tmp folders: once in float32 (one file) and
once in bfloat16 (several shards with a ``model.safetensors.index.json``). transformers loads the same
files in float32; bfloat16 widens to float32 exactly in both, so both dtypes are held to 1e-5. The
``tokenizer.json`` is trained here with `tokenizers`. Nothing is downloaded (HF_HUB_OFFLINE=1).
"""

import json
import os

import numpy as np
import pytest

from attnlab.models import attend, load_model, load_network
from attnlab.stack.transformer import forward, generate

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TEXT = "The cat sat on the mat, and the dog sat on the log."
CORPUS = [TEXT, "Grouped-query attention shares each key and value head among a group of query heads.",
          "The bank by the river lent the dog's owner money."] * 4
ATOL = 1e-5

# three small models, each exercising what its family adds
MODELS = {
    # Llama 3: 4 query heads on 2 KV heads, rope_theta 500000 with llama3 scaling (stretching positions past 16),
    # untied unembedding
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, initializer_range=0.1,
        rope_theta=500000.0, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 16},
        bos_token_id=None, eos_token_id=None, pad_token_id=None)),
    # Mistral: one KV head for 4 query heads (multi-query), a head width other than hidden/heads, a window of 5
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=8, max_position_embeddings=512, sliding_window=5, initializer_range=0.1,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)),
    # Qwen2: biases on q, k, v; tied embeddings
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.1, tie_word_embeddings=True,
        rope_theta=1000.0, bos_token_id=None, eos_token_id=None, pad_token_id=None)),
}


def write_tokenizer(folder) -> None:
    """A byte-level BPE tokenizer.json of 300 ids, trained on CORPUS, that puts <s> first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    assert tok.get_vocab_size() <= 300
    tok.save(str(folder / "tokenizer.json"))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(kind, dtype) -> a checkpoint folder, built once per module."""
    made = {}

    def get(kind: str, dtype: str):
        if (kind, dtype) not in made:
            torch.manual_seed(0)
            model = MODELS[kind]().eval()
            folder = tmp_path_factory.mktemp(f"{kind}-{dtype}")
            if dtype == "bfloat16":
                model.to(torch.bfloat16).save_pretrained(folder, max_shard_size="40KB")
            else:
                model.save_pretrained(folder)
            write_tokenizer(folder)
            made[kind, dtype] = folder
        return made[kind, dtype]
    return get


def hf_model(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                             attn_implementation="eager").eval()


def _stack(tensors):
    return np.stack([t[0].detach().numpy() for t in tensors])


CASES = [(kind, dtype) for kind in MODELS for dtype in ("float32", "bfloat16")]


@pytest.mark.parametrize("kind,dtype", CASES)
def test_attentions_hidden_states_and_logits_match_transformers(folders, kind, dtype):
    folder = folders(kind, dtype)
    if dtype == "bfloat16":
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) >= 3           # really sharded
    r = attend(TEXT, folder)
    assert r.tokens[0] == "<s>" and len(r.tokens) > 10
    with torch.no_grad():
        o = hf_model(folder)(torch.from_numpy(r.ids)[None], output_attentions=True, output_hidden_states=True)
    np.testing.assert_allclose(r.attentions.weights, _stack(o.attentions), rtol=0, atol=ATOL)
    np.testing.assert_allclose(r.hidden_states, _stack(o.hidden_states), rtol=0, atol=ATOL)
    np.testing.assert_allclose(r.logits, o.logits[0].numpy(), rtol=0, atol=ATOL)


@pytest.mark.parametrize("kind,dtype", CASES)
def test_40_greedy_tokens_match_transformers_generate(folders, kind, dtype):
    folder = folders(kind, dtype)
    model, tokenizer = load_model(folder)
    ids = tokenizer.encode(TEXT)
    ours = generate(model, ids, 40)
    with torch.no_grad():
        prompt = torch.from_numpy(ids)[None]
        theirs = hf_model(folder).generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=40,
                                           do_sample=False, pad_token_id=0)[0, ids.size:].numpy()
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("kind", list(MODELS))
def test_long_input_through_the_tiled_path_matches_transformers(folders, kind, monkeypatch):
    """256 tokens: without weights asked for, attention takes its tiled kernel (n ≥ 192). float32 sums over
    256 positions, in a different order in each library, reach 8e-6 here, so this one is held to 3e-5 (the
    tiled and the naive path agree to 3e-6 among themselves)."""
    folder = folders(kind, "float32")
    ids = np.random.default_rng(0).integers(0, 300, 256)
    model = load_network(folder)
    import attnlab.kernels.tiled
    calls, real = [], attnlab.kernels.tiled.tiled_forward
    monkeypatch.setattr(attnlab.kernels.tiled, "tiled_forward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    logits = forward(model, ids).logits
    assert len(calls) == 2                                  # each layer went through the tiled kernel
    np.testing.assert_allclose(logits, forward(model, ids, return_weights=True).logits, rtol=0, atol=1e-5)
    with torch.no_grad():
        theirs = hf_model(folder)(torch.from_numpy(ids)[None]).logits[0].numpy()
    np.testing.assert_allclose(logits, theirs, rtol=0, atol=3e-5)


def test_llama_with_attention_bias_tied_embeddings_and_a_wide_head(tmp_path):
    """``attention_bias`` puts biases on q, k, v and o; head_dim 32 is not hidden_size / heads (16)."""
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=1, head_dim=32, attention_bias=True,
                                   tie_word_embeddings=True, max_position_embeddings=64, initializer_range=0.1,
                                   bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():                                   # transformers starts biases at 0: make them count
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
    model.save_pretrained(tmp_path)
    ours = load_network(tmp_path)
    assert ours.config.attention.d_head == 32 and np.abs(ours.blocks[0].attn.b_O).max() > 0
    ids = np.random.default_rng(1).integers(0, 300, 20)
    out = forward(ours, ids, return_weights=True)
    with torch.no_grad():
        o = hf_model(tmp_path)(torch.from_numpy(ids)[None], output_attentions=True, output_hidden_states=True)
    np.testing.assert_allclose(np.stack(out.attentions), _stack(o.attentions), rtol=0, atol=ATOL)
    np.testing.assert_allclose(np.stack(out.hidden_states), _stack(o.hidden_states), rtol=0, atol=ATOL)
    np.testing.assert_allclose(out.logits, o.logits[0].numpy(), rtol=0, atol=ATOL)


def test_to_tl_gives_q_and_k_before_and_after_rope_as_transformers_holds_them(folders):
    """TransformerLens's meanings: hook_q / hook_k are the projections before RoPE, hook_rot_q / hook_rot_k after,
    each head's features in rotate_half's order (transformers' and TL's) once to_tl() lays them out."""
    from attnlab.stack.hooks import run_with_cache
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    folder = folders("llama", "float32")
    model = load_network(folder)
    ids = np.array([0, 5, 9, 17, 3, 44, 8])
    _, cache = run_with_cache(model, ids, names=lambda name: name.startswith("blocks.1.attn.hook_"))
    tl = cache.to_tl()
    hf = hf_model(folder)
    with torch.no_grad():
        o = hf(torch.from_numpy(ids)[None], output_hidden_states=True)
        layer = hf.model.layers[1]
        x = layer.input_layernorm(o.hidden_states[1])                     # (1, n, d_model)
        q = layer.self_attn.q_proj(x).view(1, len(ids), 4, 16)            # (1, n, h, d_head) TL's hook_q
        k = layer.self_attn.k_proj(x).view(1, len(ids), 2, 16)
        cos, sin = hf.model.rotary_emb(x, torch.arange(len(ids))[None])
        rot_q, rot_k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)   # (1, h, n, d_head)
    for name, want in (("hook_q", q), ("hook_k", k), ("hook_rot_q", rot_q.transpose(1, 2)),
                       ("hook_rot_k", rot_k.transpose(1, 2))):
        np.testing.assert_allclose(tl[f"blocks.1.attn.{name}"], want.numpy(), rtol=0, atol=ATOL, err_msg=name)


def test_grad_at_hook_points_matches_torch_autograd_on_the_same_weights(folders):
    """attnlab.stack.backward.grad (the taped forward, the hand-written backward) against torch autograd through
    transformers' Llama: a logit difference's gradient at each block's residual stream, the queries before RoPE
    (TL's hook_q; transformers' q_proj output), the gated MLP's linear path (up_proj), the final norm's output."""
    from attnlab.stack.backward import grad, logit_difference

    folder = folders("llama", "float32")
    model = load_network(folder)
    ids = np.array([0, 5, 9, 17, 3, 44, 8, 2])
    at = ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre", "blocks.1.attn.hook_q", "blocks.0.mlp.hook_pre_linear",
          "ln_final.hook_out"]
    g = grad(model, ids, logit_difference(7, 11), at=at)
    hf = hf_model(folder)
    kept = {}

    def keep(name):
        def hook(module, inputs, output):
            output.retain_grad()
            kept[name] = output
        return hook

    hf.model.layers[1].self_attn.q_proj.register_forward_hook(keep("q"))
    hf.model.layers[0].mlp.up_proj.register_forward_hook(keep("up"))
    hf.model.norm.register_forward_hook(keep("final"))
    o = hf(torch.from_numpy(ids)[None], output_hidden_states=True)
    for h in o.hidden_states[:2]:
        h.retain_grad()
    metric = o.logits[0, -1, 7] - o.logits[0, -1, 11]
    metric.backward()
    assert g.value == pytest.approx(metric.item(), abs=1e-4)
    order = model.config.attention.positions.halves_order(16)
    q = np.swapaxes(g.at["blocks.1.attn.hook_q"][..., order], 0, 1).reshape(len(ids), -1)   # (n, h·d_head) HF's
    for ours, theirs in ((g.at["blocks.0.hook_resid_pre"], o.hidden_states[0].grad), (q, kept["q"].grad),
                         (g.at["blocks.1.hook_resid_pre"], o.hidden_states[1].grad),
                         (g.at["blocks.0.mlp.hook_pre_linear"], kept["up"].grad),
                         (g.at["ln_final.hook_out"], kept["final"].grad)):
        theirs = theirs[0].numpy()
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5 * np.abs(theirs).max())
