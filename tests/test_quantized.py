"""Weights that stay quantized (issue 21): GGUF blocks multiplied without a float32 copy.

Every tensor here is written by ``gguf.GGUFWriter`` in its type (``gguf.quants.quantize``) and read back by
``gguf.GGUFReader``; the reference is ``gguf.quants.dequantize`` of the same bytes, multiplied in float64.
"""

import itertools
import warnings

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf.constants import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize, quantize  # noqa: E402

from attnlab.kernels.quantized import KERNEL_TYPES, QuantizedMatrix, QuantizedRows  # noqa: E402

TYPES = sorted(KERNEL_TYPES)
FILES = itertools.count()


def width(qtype: str) -> int:
    """The narrowest d_in a test uses in ``qtype``: a K-quant's super-block is 256 values, the others' 32."""
    return max(64, gguf.constants.GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][0])


def encoded(w: np.ndarray, t) -> np.ndarray:
    """``w`` (d_out, d_in) as bytes of type ``t``: ``gguf.quants.quantize`` where gguf has a quantizer; for a
    K-quant it has none, so random values, scales and minima, each super-block's float16 d (and dmin) scaled to
    w's size (where gguf.quants reads them: Q4_K's first 4 bytes, Q6_K's last 2)."""
    try:
        return quantize(w, t)
    except NotImplementedError:
        block, nbytes = gguf.constants.GGML_QUANT_SIZES[t]
        rng = np.random.default_rng(w.size)
        raw = rng.integers(0, 256, (w.shape[0], w.shape[1] // block, nbytes), dtype=np.uint8)
        if t == GGMLQuantizationType.Q6_K:                                  # d last, after int8 scales
            raw[..., -2:] = np.array([np.abs(w).mean() / 600], np.float16).view(np.uint8)
        else:                                                                # Q4_K: d and dmin first
            scale = np.float16(np.abs(w).mean() / 300)
            raw[..., :4] = np.array([scale, scale], np.float16).view(np.uint8)
        return raw.reshape(w.shape[0], -1)


def written(tmp_path, tensors: dict, qtype: str) -> dict:
    """``tensors`` (name -> float32 (d_out, d_in)) written to a GGUF file in ``qtype`` and read back: name ->
    (raw bytes (d_out, bytes), d_in), as the file holds them."""
    path = tmp_path / f"w{next(FILES)}_{qtype}.gguf"                # a new file each call: the reader maps it
    writer = gguf.GGUFWriter(str(path), "llama")
    t = GGMLQuantizationType[qtype]
    for name, w in tensors.items():
        writer.add_tensor(name, encoded(w, t), raw_dtype=t)                # shape from the bytes
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = gguf.GGUFReader(str(path))
    out = {}
    for tensor in reader.tensors:
        assert tensor.tensor_type == t
        out[tensor.name] = (np.asarray(tensor.data), int(tensor.shape[0]))   # GGUF's shape: d_in first
    return out


def rel_err(got, ref) -> float:
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


@pytest.fixture
def numba_on(monkeypatch):
    pytest.importorskip("numba")
    monkeypatch.delenv("ATTNLAB_NO_NUMBA", raising=False)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("n_tokens", [1, 3, 20])          # the kernel (<= 8 tokens) and the chunked path
def test_product_equals_the_dequantized_float32_product(tmp_path, rng, numba_on, qtype, n_tokens):
    n = width(qtype)
    w = (rng.standard_normal((99, n)) * 0.05).astype(np.float32)           # (d_out, d_in): 24 groups of 4 and 3
    raw, d_in = written(tmp_path, {"w": w}, qtype)["w"]
    W = QuantizedMatrix(raw, qtype, d_in)
    assert W.shape == (n, 99) and d_in == n
    exact = dequantize(raw, GGMLQuantizationType[qtype])                   # (d_out, d_in) float32
    x = rng.standard_normal((n_tokens, n)).astype(np.float32)              # (N, d_in)
    ref = x.astype(np.float64) @ exact.T.astype(np.float64)                # (N, d_out)
    got = x @ W
    assert got.shape == (n_tokens, 99) and got.dtype == np.float32
    assert rel_err(got, ref) < 1e-6
    assert rel_err(got, x @ exact.T) < 1e-5                                # the float32 path's logits
    assert rel_err(x[0] @ W, ref[0]) < 1e-6                                # (d_in,) in, (d_out,) out


def test_planes_are_grouped_as_the_kernels_read_them(numba_on):
    from attnlab.kernels import _quant_fused, quantized

    assert quantized.GROUP == _quant_fused.GROUP
    plane = np.arange(6 * 3).reshape(6, 3)                                 # (rows, blocks)
    g = quantized.grouped(plane)                                           # (2 groups, 3 blocks, 4 rows)
    assert g.shape == (2, 3, 4) and g[1, 2, 1] == plane[5, 2] and (g[1, :, 2:] == 0).all()
    np.testing.assert_array_equal(quantized.ungrouped(g, 6), plane)


@pytest.mark.parametrize("qtype", TYPES)
def test_kernel_rebuilds_exactly_the_values_gguf_does(tmp_path, rng, numba_on, qtype):
    from attnlab.kernels import _quant_fused

    n = 2 * width(qtype)
    w = (rng.standard_normal((7, n)) * 3).astype(np.float32)
    raw, d_in = written(tmp_path, {"w": w}, qtype)["w"]
    W = QuantizedMatrix(raw, qtype, d_in)
    exact = dequantize(raw, GGMLQuantizationType[qtype])                   # (7, n)
    out = np.empty((7, n), np.float32)
    _quant_fused.dequantize(qtype, W.qs, W.d, W.m, np.arange(7), out)
    np.testing.assert_array_equal(out, exact)                              # numba, from the planes
    np.testing.assert_array_equal(W.dequantize().T, exact)                 # numpy, from the planes
    np.testing.assert_array_equal(W.dequantize(np.array([6, 2])).T, exact[[6, 2]])


@pytest.mark.parametrize("qtype", TYPES)
def test_numpy_path_without_numba_gives_the_same_product(tmp_path, rng, monkeypatch, qtype):
    w = (rng.standard_normal((40, width(qtype))) * 0.05).astype(np.float32)
    raw, d_in = written(tmp_path, {"w": w}, qtype)["w"]
    W = QuantizedMatrix(raw, qtype, d_in)
    x = rng.standard_normal((2, 5, d_in)).astype(np.float32)               # leading axes kept
    monkeypatch.setenv("ATTNLAB_NO_NUMBA", "1")
    exact = dequantize(raw, GGMLQuantizationType[qtype])
    np.testing.assert_allclose(x @ W, x @ exact.T, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(W.T[np.array([[39, 0], [5, -1]])], exact[[[39, 0], [5, 39]]])   # rows looked up


def test_rows_table_looks_up_and_unembeds(tmp_path, rng, numba_on):
    table = (rng.standard_normal((50, 32)) * 0.1).astype(np.float32)      # (vocab, d_model)
    raw, d = written(tmp_path, {"token_embd": table}, "Q8_0")["token_embd"]
    E = QuantizedRows.from_raw(raw, "Q8_0", d)
    exact = dequantize(raw, GGMLQuantizationType.Q8_0)                     # (vocab, d)
    ids = np.array([[3, 7], [49, 0]])
    np.testing.assert_array_equal(E[ids], exact[ids])                      # (2, 2, d)
    x = rng.standard_normal((4, 32)).astype(np.float32)
    assert E.shape == (50, 32) and E.T.shape == (32, 50)
    assert rel_err(x @ E.T, x.astype(np.float64) @ exact.T) < 1e-6         # tied logits


def test_side_by_side_weights_multiply_as_each_one(tmp_path, rng, numba_on):
    from attnlab.kernels.matmul import fuse_columns

    ws = {n: (rng.standard_normal((w, 64)) * 0.05).astype(np.float32) for n, w in (("q", 64), ("k", 32), ("v", 32))}
    files = written(tmp_path, ws, "Q4_1")
    parts = [QuantizedMatrix(*files[n][:1], "Q4_1", 64) for n in ("q", "k", "v")]
    fused, _ = fuse_columns(*parts)
    assert all(np.shares_memory(p.qs, fused.qs) for p in parts)             # each reads its rows of it
    x = rng.standard_normal((1, 64)).astype(np.float32)
    np.testing.assert_allclose(x @ fused, np.concatenate([x @ p for p in parts], axis=-1), rtol=1e-6, atol=1e-7)
    assert fuse_columns(*parts[:2], np.zeros((64, 32), np.float32))[0] is None
    odd = QuantizedMatrix(written(tmp_path, {"o": ws["k"][:30]}, "Q4_1")["o"][0], "Q4_1", 64)
    assert fuse_columns(parts[0], odd)[0] is None                         # 30 rows end inside a group of 4


def test_bad_arguments_name_what_was_expected(tmp_path, rng, numba_on):
    raw, d_in = written(tmp_path, {"w": np.ones((4, 64), np.float32)}, "Q4_0")["w"]
    with pytest.raises(ValueError, match="qtype must be one of"):
        QuantizedMatrix(raw, "Q5_K", d_in)
    with pytest.raises(ValueError, match="raw must be uint8"):
        QuantizedMatrix(raw, "Q4_0", 32)
    with pytest.raises(ValueError, match=r"x @ W needs x \(\.\.\., 64\)"):
        np.ones((1, 63), np.float32) @ QuantizedMatrix(raw, "Q4_0", d_in)


def test_weight_from_gguf_falls_back_to_float32_and_warns_once(tmp_path, rng, monkeypatch):
    from attnlab.kernels import quantized

    raw, d_in = written(tmp_path, {"w": (rng.standard_normal((8, 64))).astype(np.float32)}, "Q8_0")["w"]
    monkeypatch.setenv("ATTNLAB_NO_NUMBA", "1")
    monkeypatch.setattr(quantized, "_warned", [])
    with pytest.warns(RuntimeWarning, match="quantized weights need numba"):
        w = quantized.weight_from_gguf(raw, "Q8_0", d_in)
    assert isinstance(w, np.ndarray) and w.shape == (64, 8)
    np.testing.assert_array_equal(w, dequantize(raw, GGMLQuantizationType.Q8_0).T)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quantized.weight_from_gguf(raw, "Q8_0", d_in)                      # said once


def quantized_and_float(model, tmp_path, qtype: str):
    """``model`` with every weight matrix written to a GGUF file in ``qtype`` (the embedding in Q8_0, as
    SmolLM2's file has it) and read back: the quantized model, and the float32 model of the same values."""
    import dataclasses

    from attnlab.stack.transformer import Transformer

    mats = {}
    for i, b in enumerate(model.blocks):
        for part, names in (("attn", ("W_Q", "W_K", "W_V", "W_O")), ("mlp", ("W_gate", "W_in", "W_out"))):
            for n in names:
                mats[f"{i}.{part}.{n}"] = np.ascontiguousarray(getattr(getattr(b, part), n).T)   # (d_out, d_in)
    files = written(tmp_path, mats, qtype)
    table = written(tmp_path, {"W_E": model.W_E}, "Q8_0")["W_E"]

    def build(weight, rows):
        blocks = []
        for i, b in enumerate(model.blocks):
            new = {}
            for part, obj in (("attn", b.attn), ("mlp", b.mlp)):
                names = ("W_Q", "W_K", "W_V", "W_O") if part == "attn" else ("W_gate", "W_in", "W_out")
                new[part] = dataclasses.replace(obj, **{n: weight(*files[f"{i}.{part}.{n}"]) for n in names})
            blocks.append(dataclasses.replace(b, **new))
        return Transformer(config=model.config, W_E=rows(*table), blocks=blocks, ln_final=model.ln_final)

    quant = build(lambda raw, d: QuantizedMatrix(raw, qtype, d), lambda raw, d: QuantizedRows.from_raw(raw, "Q8_0", d))
    exact = build(lambda raw, d: dequantize(raw, GGMLQuantizationType[qtype]).T,
                  lambda raw, d: dequantize(raw, GGMLQuantizationType.Q8_0))
    return quant, exact


@pytest.mark.parametrize("qtype", TYPES)
def test_quantized_model_logits_equal_the_float32_model(tmp_path, rng, numba_on, qtype):
    from attnlab.layer.config import AttentionConfig
    from attnlab.layer.positions import RoPE
    from attnlab.stack.layers import RMSNorm
    from attnlab.stack.transformer import ModelConfig, Transformer, forward, new_caches

    n = width(qtype)                                       # a K-quant's rows: 256 values at least
    att = AttentionConfig(d_model=n, n_heads=4, n_kv_heads=2, d_head=n // 4, n_ctx=64, positions=RoPE(10000.0))
    cfg = ModelConfig(vocab_size=100, n_layers=2, attention=att, d_mlp=96 if n == 64 else n, activation="silu",
                      mlp="gated", norm=RMSNorm, tied_embeddings=True)
    quant, exact = quantized_and_float(Transformer.init(cfg, rng=rng, std=0.1), tmp_path, qtype)
    assert quant.blocks[0].attn.W_QKV is not None and quant.blocks[0].mlp.W_gate_in is not None
    ids = rng.integers(0, 100, 12)
    assert rel_err(forward(quant, ids).logits, forward(exact, ids).logits) < 1e-5     # prefill (chunked path)
    cq, ce = new_caches(quant, 16), new_caches(exact, 16)
    forward(quant, ids[:8], caches=cq), forward(exact, ids[:8], caches=ce)
    for t in ids[8:]:                                                                   # decode steps (kernel)
        got, want = forward(quant, [t], caches=cq).logits, forward(exact, [t], caches=ce).logits
        assert rel_err(got, want) < 1e-5


def test_column_selection_and_finiteness(tmp_path, rng, numba_on):
    w = (rng.standard_normal((64, 32)) * 0.05).astype(np.float32)
    raw, d_in = written(tmp_path, {"w": w}, "Q4_1")["w"]
    W = QuantizedMatrix(raw, "Q4_1", d_in)
    assert W[:, :] is W and W.finite()
    order = rng.permutation(64)
    x = rng.standard_normal((1, 32)).astype(np.float32)
    np.testing.assert_allclose(x @ W[:, order], (x @ W)[:, order], rtol=1e-6, atol=1e-7)
    with pytest.raises(TypeError, match=r"W\[:, cols\] only"):
        W[0]
    W.d[3, 0] = np.inf
    assert not W.finite()


@pytest.mark.parametrize("qtype", TYPES)
def test_parallel_and_serial_rows_give_the_same_product(tmp_path, rng, numba_on, qtype):
    from attnlab.kernels import _quant_fused
    from attnlab.kernels.quantized import kernel_threads

    w = (rng.standard_normal((100, width(qtype))) * 0.05).astype(np.float32)
    raw, d_in = written(tmp_path, {"w": w}, qtype)["w"]
    W = QuantizedMatrix(raw, qtype, d_in)
    x = rng.standard_normal((2, d_in)).astype(np.float32)
    serial, parallel = np.empty((2, 100), np.float32), np.empty((2, 100), np.float32)
    _quant_fused.matvec(qtype, W.qs, W.d, W.m, x, serial, 1)
    _quant_fused.matvec(qtype, W.qs, W.d, W.m, x, parallel, 3)             # 3 ranges of 34, 34, 32 rows
    np.testing.assert_array_equal(serial, parallel)
    assert kernel_threads() == {"threads": 1, "reason": "rule: the calling thread (numba's threads spin on a shared machine)"}


@pytest.mark.parametrize("qtype, tied", [("Q4_0", True), ("Q4_1", False), ("Q8_0", True)])
def test_load_model_quantized_equals_the_float32_load(tmp_path, numba_on, qtype, tied):
    """A tiny llama GGUF (tests/test_gguf.py's writer) loaded both ways: every weight of the type stays
    quantized, and the logits of a prefill and of decode steps equal the float32 load's within 1e-5."""
    pytest.importorskip("tokenizers")
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("_test_gguf", Path(__file__).with_name("test_gguf.py"))
    module = importlib.util.module_from_spec(spec)        # the tests are not a package: their writer by path
    spec.loader.exec_module(module)
    write_gguf = module.write_gguf
    from attnlab.models import load_model
    from attnlab.stack.transformer import forward, new_caches

    path = tmp_path / "tiny.gguf"
    write_gguf(path, qtype=GGMLQuantizationType[qtype], tied=tied)
    quant, _ = load_model(str(path), quantized=True)
    exact, _ = load_model(str(path))
    assert isinstance(quant.blocks[1].mlp.W_out, QuantizedMatrix) and isinstance(exact.blocks[1].mlp.W_out, np.ndarray)
    ids = np.arange(1, 40) * 7 % 264
    assert rel_err(forward(quant, ids).logits, forward(exact, ids).logits) < 1e-5
    cq, ce = new_caches(quant, 48), new_caches(exact, 48)
    forward(quant, ids, caches=cq), forward(exact, ids, caches=ce)
    for t in (5, 77, 200):
        assert rel_err(forward(quant, [t], caches=cq).logits, forward(exact, [t], caches=ce).logits) < 1e-5


def test_quantized_is_for_gguf_sources_only():
    from attnlab.models import load_model

    with pytest.raises(ValueError, match="quantized=True keeps a GGUF file's blocks"):
        load_model("minilm", quantized=True)
    with pytest.raises(ValueError, match="quantized must be True, False or 'q8-activations'"):
        load_model("smollm2", quantized="yes")
    with pytest.raises(TypeError, match="quantized must be True, False or 'q8-activations'"):
        load_model("smollm2", quantized=1)


def tiny_gguf_writer():
    """tests/test_gguf.py's writer of tiny llama GGUF files (the tests are not a package: loaded by path)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("_test_gguf", Path(__file__).with_name("test_gguf.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write_gguf


def test_rows_table_multiplies_from_the_left_as_its_float32_table(tmp_path, rng, numba_on):
    """``y @ W.T`` (a backward pass through ``x @ W``): the dequantized rows, a block of rows at a time."""
    w = (rng.standard_normal((70, 64)) * 0.05).astype(np.float32)          # (d_out, d_in)
    raw, d_in = written(tmp_path, {"w": w}, "Q4_1")["w"]
    W = QuantizedMatrix(raw, "Q4_1", d_in)
    y = rng.standard_normal((2, 3, 70)).astype(np.float32)
    exact = dequantize(raw, GGMLQuantizationType.Q4_1)                     # (d_out, d_in)
    got = y @ W.T
    assert got.shape == (2, 3, 64)
    assert rel_err(got, y.astype(np.float64) @ exact.astype(np.float64)) < 1e-6
    with pytest.raises(ValueError, match=r"y @ W needs y \(\.\.\., 70\)"):
        np.ones(64, np.float32) @ W.T


@pytest.mark.parametrize("command", [["lens", "abc"], ["attend", "abc", "--summary"],
                                     ["detect", "abc", "--top", "1"]])
def test_commands_that_run_a_model_take_quantized(tmp_path, capsys, numba_on, command):
    """``--quantized`` on a command that runs a model: the same report as the float32 load of the same file
    (a Q8_0 GGUF written by GGUFWriter), to the printed digits."""
    pytest.importorskip("tokenizers")
    import json

    from attnlab.cli import main

    path = tmp_path / "tiny.gguf"
    tiny_gguf_writer()(path, qtype=GGMLQuantizationType.Q8_0)
    outs = []
    for extra in ([], ["--quantized"]):
        assert main([*command, "--model", str(path), "--json", *extra]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert_same_report(*outs)



def test_scan_takes_quantized(tmp_path, capsys, numba_on):
    """``scan --quantized`` (each process loads the GGUF quantized): the same means as the float32 scan."""
    pytest.importorskip("tokenizers")
    import json

    from attnlab.cli import main

    path, corpus = tmp_path / "tiny.gguf", tmp_path / "corpus.txt"
    tiny_gguf_writer()(path, qtype=GGMLQuantizationType.Q8_0)
    corpus.write_text("abc cab\nbca abc bca\n", encoding="utf-8")
    outs = []
    for extra in ([], ["--quantized"]):
        assert main(["scan", str(corpus), "--workers", "0", "--model", str(path), "--json", *extra]) == 0
        out = json.loads(capsys.readouterr().out)
        outs.append({k: out[k] for k in ("lines", "tokens", "means")})
    assert outs[0]["lines"] == 2 and outs[0]["tokens"] > 0
    assert_same_report(*outs)
    from attnlab.interpret.scan import _loaded
    model, _ = _loaded(str(path), True)                                     # what the quantized scan ran
    assert any(isinstance(w, QuantizedMatrix) for w in model.params().values())

def assert_same_report(a, b, where="report"):
    """Two JSON reports equal, their numbers within 1e-5 (the quantized products round in another order)."""
    assert type(a) is type(b) or {type(a), type(b)} <= {int, float}, where
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same_report(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_report(x, y, f"{where}[{i}]")
    elif isinstance(a, (int, float)) and not isinstance(a, bool):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6), where
    else:
        assert a == b, where


def test_quantized_flag_refuses_a_source_that_is_not_gguf(capsys):
    from attnlab.cli import main

    assert main(["lens", "abc", "--model", "induction", "--quantized"]) == 2
    assert "quantized=True keeps a GGUF file's blocks" in capsys.readouterr().err


def test_load_model_quantized_without_numba_keeps_float32_and_says_so(tmp_path, monkeypatch):
    """Without the kernel (ATTNLAB_NO_NUMBA), ``quantized=True`` loads the float32 weights, with one warning."""
    pytest.importorskip("tokenizers")
    from attnlab.kernels import quantized
    from attnlab.models import load_model
    from attnlab.stack.transformer import forward

    path = tmp_path / "tiny.gguf"
    tiny_gguf_writer()(path, qtype=GGMLQuantizationType.Q4_1)
    exact, _ = load_model(str(path))
    monkeypatch.setenv("ATTNLAB_NO_NUMBA", "1")
    monkeypatch.setattr(quantized, "_warned", [])
    with pytest.warns(RuntimeWarning, match="quantized weights need numba"):
        model, _ = load_model(str(path), quantized=True)
    assert isinstance(model.blocks[0].mlp.W_out, np.ndarray)
    ids = np.arange(1, 20) * 7 % 264
    np.testing.assert_array_equal(forward(model, ids).logits, forward(exact, ids).logits)
