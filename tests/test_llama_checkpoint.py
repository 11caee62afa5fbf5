"""Llama-family checkpoints without torch: safetensors files written byte by byte here (float32, float16,
bfloat16; one file or shards), read back memory-mapped; the pieces the family adds (RMSNorm, SiLU, the gated
MLP, RoPE's pair order) against float64 hand computations; every bad input named in one line."""

import json
import subprocess
import sys

import numpy as np
import pytest

from attnlab.layer.config import AttentionConfig
from attnlab.stack.layers import GatedMLP, RMSNorm, rms_norm, silu
from attnlab.models import attend, load_model, load_network, read_safetensors
from attnlab.models.checkpoint import bfloat16_to_float32
from attnlab.models.llama import half_to_pairs
from attnlab.layer.positions import RoPE, rope
from attnlab.stack.transformer import ModelConfig, Transformer, forward

CONFIG = {"model_type": "llama", "vocab_size": 50, "hidden_size": 32, "intermediate_size": 48,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
          "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False}


def to_bits(x: np.ndarray, dtype: str) -> bytes:
    """float32 values as the bytes of a safetensors F32, F16 or BF16 tensor (BF16: the upper 16 bits)."""
    if dtype == "BF16":
        return (x.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()
    return x.astype({"F32": "<f4", "F16": "<f2"}[dtype]).tobytes()


def write_safetensors(path, tensors: dict, dtype: str) -> None:
    header, blobs, at = {}, [], 0
    for name, x in tensors.items():
        b = to_bits(x, dtype)
        header[name] = {"dtype": dtype, "shape": list(x.shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    path.write_bytes(len(head).to_bytes(8, "little") + head + b"".join(blobs))


def write_folder(folder, tensors: dict, config: dict = CONFIG, *, dtype: str = "F32", shards: int = 1):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if shards == 1:
        write_safetensors(folder / "model.safetensors", tensors, dtype)
        return folder
    names = list(tensors)
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k] for k in names[s::shards]}
        write_safetensors(folder / file, part, dtype)
        weight_map.update(dict.fromkeys(part, file))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


@pytest.fixture
def tensors(rng, random_llama_tensors):
    return random_llama_tensors(CONFIG, rng, std=0.2)


def _mapped(arr) -> bool:
    while arr is not None:
        if isinstance(arr, np.memmap):
            return True
        arr = arr.base
    return False


# --- reading the files ---------------------------------------------------------------------------------------

def test_float32_tensors_are_views_of_the_mapped_file_not_copies(tmp_path, tensors):
    write_folder(tmp_path, tensors)
    read = read_safetensors(tmp_path / "model.safetensors")
    assert all(_mapped(a) and not a.flags.writeable for a in read.values())
    for k, v in tensors.items():
        np.testing.assert_array_equal(read[k], v)
    model = load_network(tmp_path)
    assert _mapped(model.W_E) and _mapped(model.W_U) and _mapped(model.blocks[1].mlp.W_out)


def test_bfloat16_widens_to_float32_exactly(rng):
    x = rng.normal(0, 1, 1000).astype(np.float32)
    bits = (x.view(np.uint32) >> 16).astype(np.uint16)              # bf16 by truncation
    expect = (x.view(np.uint32) & 0xFFFF0000).view(np.float32)       # the same value as a float32
    np.testing.assert_array_equal(bfloat16_to_float32(bits), expect)
    assert bfloat16_to_float32(np.array([0x7F80, 0xFF80, 0x0001], np.uint16)).tolist()[:2] == [np.inf, -np.inf]


@pytest.mark.parametrize("dtype,shards", [("F16", 1), ("BF16", 1), ("BF16", 3), ("F32", 4)])
def test_float16_bfloat16_and_shards_load_as_the_same_model(tmp_path, tensors, dtype, shards):
    """Each dtype loads to the float32 of exactly the values stored; the model equals one loaded from those
    float32 values, shards or not."""
    rounded = {k: (bfloat16_to_float32((v.view(np.uint32) >> 16).astype(np.uint16)) if dtype == "BF16"
                   else v.astype(np.float16).astype(np.float32) if dtype == "F16" else v) for k, v in tensors.items()}
    ours = load_network(write_folder(tmp_path / "x", tensors, dtype=dtype, shards=shards))
    ref = load_network(write_folder(tmp_path / "ref", rounded))
    assert ours.dtype == np.float32
    for (name, a), b in zip(ours.params().items(), ref.params().values()):
        np.testing.assert_array_equal(a, b, err_msg=name)
    ids = np.arange(10)
    np.testing.assert_array_equal(forward(ours, ids).logits, forward(ref, ids).logits)


def test_tied_embeddings_use_W_E_for_the_logits(tmp_path, rng, random_llama_tensors):
    config = dict(CONFIG, tie_word_embeddings=True)
    model = load_network(write_folder(tmp_path, random_llama_tensors(config, rng, std=0.2), config))
    assert model.config.tied_embeddings and model.W_U is None
    out = forward(model, np.arange(5))
    np.testing.assert_allclose(out.logits, out.hidden_states[-1] @ model.W_E.T, rtol=1e-6)


def test_the_model_equals_a_float64_hand_computation(tmp_path, tensors):
    """The whole forward written out in float64 from the checkpoint's own names, with HF's rotate_half RoPE."""
    model = load_network(write_folder(tmp_path, tensors))
    t = {k: v.astype(np.float64) for k, v in tensors.items()}
    ids, d_head, h, h_kv = np.array([3, 1, 4, 1, 5, 9, 2, 6]), 8, 4, 2
    n = ids.size
    inv = 10000.0 ** (-np.arange(0, d_head, 2) / d_head)
    ang = np.arange(n)[:, None] * np.concatenate([inv, inv])             # (n, d_head) HF's cos/sin layout

    def rot(x):                                                          # (heads, n, d_head)
        half = np.concatenate([-x[..., d_head // 2:], x[..., :d_head // 2]], -1)
        return x * np.cos(ang) + half * np.sin(ang)

    def norm(x, w):
        return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6) * w

    x = t["model.embed_tokens.weight"][ids]
    for i in range(2):
        p = f"model.layers.{i}."
        a_in = norm(x, t[p + "input_layernorm.weight"])
        q = rot((a_in @ t[p + "self_attn.q_proj.weight"].T).reshape(n, h, d_head).transpose(1, 0, 2))
        k = rot((a_in @ t[p + "self_attn.k_proj.weight"].T).reshape(n, h_kv, d_head).transpose(1, 0, 2))
        v = (a_in @ t[p + "self_attn.v_proj.weight"].T).reshape(n, h_kv, d_head).transpose(1, 0, 2)
        k, v = np.repeat(k, h // h_kv, 0), np.repeat(v, h // h_kv, 0)   # the float64 reference repeats by hand
        s = q @ k.transpose(0, 2, 1) / np.sqrt(d_head) + np.triu(np.full((n, n), -np.inf), 1)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + (a @ v).transpose(1, 0, 2).reshape(n, h * d_head) @ t[p + "self_attn.o_proj.weight"].T
        m = norm(x, t[p + "post_attention_layernorm.weight"])
        gate = m @ t[p + "mlp.gate_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * (m @ t[p + "mlp.up_proj.weight"].T)) @ t[p + "mlp.down_proj.weight"].T
    logits = norm(x, t["model.norm.weight"]) @ t["lm_head.weight"].T
    np.testing.assert_allclose(forward(model, ids).logits, logits, rtol=0, atol=2e-5)


# --- the pieces ----------------------------------------------------------------------------------------------

def test_rms_norm_silu_and_gated_mlp_by_hand(rng):
    np.testing.assert_allclose(rms_norm(np.array([[3.0, 4.0]]), np.array([1.0, 2.0]), 0.0),
                               [[3 / np.sqrt(12.5), 8 / np.sqrt(12.5)]])
    np.testing.assert_allclose(silu(np.array([1.0, -2.0])), [1 / (1 + np.exp(-1)), -2 / (1 + np.exp(2))])
    assert silu(np.array([-1000.0], np.float32))[0] == 0 and silu(np.array([1.0], np.float16)).dtype == np.float16
    x16 = np.array([[300.0, 400.0]], np.float16)                         # squares overflow float16; not in float32
    np.testing.assert_allclose(RMSNorm(np.ones(2, np.float16), 1e-6)(x16), [[0.8486, 1.1318]], rtol=1e-3)
    mlp = GatedMLP.init(4, 6, "silu", rng=rng, std=0.5, dtype=np.float64)
    x = rng.normal(size=(3, 4))
    gate = x @ mlp.W_gate
    np.testing.assert_allclose(mlp(x), (gate / (1 + np.exp(-gate)) * (x @ mlp.W_in)) @ mlp.W_out)


def test_reordering_the_columns_makes_pair_rope_equal_rotate_half(rng):
    """rotate_half on features (i, i + d/2) equals attnlab's pair RoPE on the columns reordered, and q·k is
    the same either way."""
    d_head, n = 8, 6
    q, k = rng.normal(size=(2, n, d_head)), rng.normal(size=(2, n, d_head))
    inv = 10000.0 ** (-np.arange(0, d_head, 2) / d_head)
    ang = np.arange(n)[:, None] * np.concatenate([inv, inv])

    def rotate_half(x):
        return x * np.cos(ang) + np.concatenate([-x[..., d_head // 2:], x[..., :d_head // 2]], -1) * np.sin(ang)

    order = half_to_pairs(1, d_head)
    np.testing.assert_allclose(rope(q[..., order]), rotate_half(q)[..., order], atol=1e-12)
    np.testing.assert_allclose(rope(q[..., order]) @ np.swapaxes(rope(k[..., order]), -1, -2),
                               rotate_half(q) @ np.swapaxes(rotate_half(k), -1, -2), atol=1e-12)


def test_a_gated_rms_model_round_trips_through_params_and_json(rng):
    c = ModelConfig(vocab_size=11, n_layers=2, d_mlp=12, activation="silu", mlp="gated", norm=RMSNorm,
                    attention=AttentionConfig(d_model=8, n_heads=4, n_kv_heads=1, n_ctx=16, positions=RoPE(500.0)))
    model = Transformer.init(c, rng=rng)
    assert isinstance(model.blocks[0].mlp, GatedMLP) and "blocks.0.mlp.W_gate" in model.params()
    assert "blocks.0.ln_1.bias" not in model.params()
    again = Transformer.from_params(ModelConfig.from_json(json.loads(json.dumps(c.to_json()))), model.params())
    np.testing.assert_array_equal(forward(again, np.arange(7)).logits, forward(model, np.arange(7)).logits)
    with pytest.raises(ValueError, match="mlp must be one of"):
        ModelConfig(vocab_size=11, n_layers=1, d_mlp=4, mlp="swish", attention=c.attention)


# --- bad input, one line each --------------------------------------------------------------------------------

def _cli_error(*args) -> str:
    r = subprocess.run([sys.executable, "-m", "attnlab", *args], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    return r.stderr


def test_a_shard_listed_but_missing_is_named(tmp_path, tensors):
    folder = write_folder(tmp_path, tensors, dtype="BF16", shards=3)
    (folder / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00003.safetensors is listed in "
                                                "model.safetensors.index.json"):
        load_network(folder)
    assert "model-00002-of-00003.safetensors" in _cli_error("attend", "hi", "--model", str(folder))


def test_a_tensor_missing_from_every_shard_is_named(tmp_path, tensors):
    del tensors["model.layers.1.mlp.up_proj.weight"]
    folder = write_folder(tmp_path, tensors, shards=2)
    with pytest.raises(ValueError, match=r"\(2 shards\): missing tensor 'layers\.1\.mlp\.up_proj\.weight'"):
        load_network(folder)
    assert "up_proj" in _cli_error("attend", "hi", "--model", str(folder))


@pytest.mark.parametrize("change,message", [
    ({"num_key_value_heads": 3}, "num_attention_heads=4, which is not a multiple of num_key_value_heads=3"),
    ({"rope_scaling": {"rope_type": "longrope", "factor": 4.0}}, "rope_type 'longrope'"),
    ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4}}, "dynamic rope scaling needs a positive 'factor'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 0}}, "yarn rope scaling needs a positive 'factor'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "needs a positive 'low_freq_factor'"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"model_type": "qwen2", "use_sliding_window": True, "layer_types": ["full_attention", "sliding_attention"]},
     "some layers only"),
])
def test_a_config_attnlab_cannot_read_is_named(tmp_path, tensors, change, message):
    folder = write_folder(tmp_path, tensors, dict(CONFIG, **change))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_network(folder)
    assert "config.json" in _cli_error("attend", "hi", "--model", str(folder))


def test_both_config_spellings_give_the_same_rope(tmp_path, tensors):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
    v4 = load_network(write_folder(tmp_path / "v4", tensors, dict(CONFIG, rope_theta=5e5, rope_scaling=scaling)))
    v5 = load_network(write_folder(tmp_path / "v5", tensors, {**{k: v for k, v in CONFIG.items() if k != "rope_theta"},
                                                             "rope_parameters": dict(scaling, rope_theta=5e5)}))
    assert v4.config.attention.positions == v5.config.attention.positions == RoPE(5e5, scaling=scaling)


def test_attend_cli_names_the_kv_head_each_query_head_reads(tmp_path, tensors, capsys):
    from attnlab.cli import main

    pytest.importorskip("tokenizers")
    pytest.importorskip("matplotlib")
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = write_folder(tmp_path / "m", tensors)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate("the cat sat on mat".split())}, unk_token="the"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    argv = ["attend", "the cat sat on the mat", "--model", str(folder), "--layer", "1", "--head", "3"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "2 layers x 4 heads reading 2 KV heads" in out and "head 3 (reads KV head 1 with heads 2-3)" in out
    assert main(argv + ["--summary"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, s in enumerate(lines) if s.startswith("layer head  kv"))
    assert [s.split()[:3] for s in lines[header + 1:header + 5]] == [["0", "0", "0"], ["0", "1", "0"],
                                                                     ["0", "2", "1"], ["0", "3", "1"]]
    assert main(argv + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["kv_heads"] == [0, 0, 1, 1]
    png, page = tmp_path / "h.png", tmp_path / "h.html"
    assert main(argv + ["--png", str(png), "--html", str(page)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG" and '"kv_heads": [0, 0, 1, 1]' in page.read_text()


def test_text_longer_than_the_positions_is_refused(tmp_path, tensors):
    tok = pytest.importorskip("tokenizers")
    folder = write_folder(tmp_path, tensors)
    words = [chr(ord("a") + i) for i in range(26)]
    model = tok.Tokenizer(tok.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="a"))
    model.pre_tokenizer = tok.pre_tokenizers.Whitespace()
    model.save(str(folder / "tokenizer.json"))
    assert attend("a b c", folder).attentions.n_kv_heads == 2
    with pytest.raises(ValueError, match="text has 65 tokens, more than the model's 64 positions"):
        attend("a " * 65, folder)
    assert "65 tokens" in _cli_error("attend", "a " * 65, "--model", str(folder))
    _, tokenizer = load_model(folder)
    assert tokenizer.labels(tokenizer.encode("c a b")) == ("c", "a", "b")
