"""The 8-bit-activation mode (issue 33): x rounded to 8 bits per block, integer dot products, as llama.cpp.

The numba kernels (:mod:`attnlab.kernels._q8_fused`) are held to the numpy reference of the same integer
arithmetic (:func:`attnlab.kernels.q8_activations.reference_matmul`) bit for bit, on weights written by
``gguf.GGUFWriter`` in each type and read back by ``gguf.GGUFReader``; the rounding of x is checked by hand.
"""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from _gguf_tensor import written  # noqa: E402
pytest.importorskip("numba")
from gguf.constants import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

from attnlab.kernels import _q8_fused  # noqa: E402
from attnlab.kernels.q8_activations import (INT_TYPES, MODE, Q8ActivationMatrix, quantize_q8,  # noqa: E402
                                            reference_matmul)


@pytest.fixture(autouse=True)
def numba_on(monkeypatch):
    monkeypatch.delenv("ATTNLAB_NO_NUMBA", raising=False)





def tiny_gguf(path, qtype: str, tied: bool = True):
    """tests/test_gguf.py's tiny llama GGUF writer (the tests are not a package: loaded by path)."""
    spec = importlib.util.spec_from_file_location("_test_gguf", Path(__file__).with_name("test_gguf.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_gguf(path, qtype=GGMLQuantizationType[qtype], tied=tied)


def test_x_is_rounded_as_llama_cpp_rounds_it_by_hand():
    """amax 254: d = 2 and x·(127/254) = x/2, ties to even (1 -> 0, 3 -> 2, 5 -> 2, −3 -> −2); s = d·Σq;
    a block of zeros gives q 0, d 0, s 0 (no division by zero)."""
    x = np.zeros((1, 64), np.float32)
    x[0, :5] = [254, 1, 3, 5, -3]
    qx, d, s = quantize_q8(x)
    np.testing.assert_array_equal(qx[0, 0, :6], [127, 0, 2, 2, -2, 0])
    assert (d[0, 0], s[0, 0]) == (2.0, 2.0 * 129)
    assert (d[0, 1], s[0, 1]) == (0.0, 0.0) and not qx[0, 1].any()
    kq, kd, ks = _q8_fused.quantize(x)                                     # the kernel's rounding: the same
    np.testing.assert_array_equal(kq, qx), np.testing.assert_array_equal(kd, d), np.testing.assert_array_equal(ks, s)


def test_fma32_rounds_once_as_vfmadd_does(rng):
    """The reference's fused multiply-add: by hand, a·b + c whose float64 sum lands exactly halfway between
    two float32 (1 + 1.5·2⁻²³) although the exact value lies below it (−2⁻⁵⁴): rounding twice gives
    1 + 2⁻²², once 1 + 2⁻²³; and random values against exact rational arithmetic, correctly rounded."""
    from fractions import Fraction

    from attnlab.kernels.q8_activations import fma32

    a, b = np.array([2**-24 * (1 + 2**-15)], np.float32), np.array([1 - 2**-15], np.float32)
    c = np.array([1 + 2**-23], np.float32)
    assert (a.astype(np.float64) * b + c).astype(np.float32)[0] == np.float32(1 + 2**-22)   # rounded twice
    assert fma32(a, b, c)[0] == np.float32(1 + 2**-23)
    a, b, c = (rng.standard_normal(400).astype(np.float32) for _ in range(3))
    got = fma32(a, b, c)
    for i in range(400):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        near = np.float32(float(exact))
        candidates = (np.nextafter(near, np.float32(-np.inf)), near, np.nextafter(near, np.float32(np.inf)))
        want = min(candidates, key=lambda v: (abs(Fraction(float(v)) - exact), int(np.array(v).view(np.uint32)) & 1))
        assert got[i] == want, i


def test_a_q8_0_dot_by_hand(tmp_path):
    """A Q8_0 row of d = 0.5 and values 1, 2, …, 32 against x = 2·(1, 0, 1, 0, …) (amax 2: d_x = 2/127,
    q = 127 where x = 2): 0.5 · (2/127 as float16) · 127 · (1 + 3 + … + 31)."""
    raw = np.zeros((4, 34), np.uint8)                                       # 4 rows of one Q8_0 block
    raw[:, :2] = np.array([0.5], np.float16).view(np.uint8)
    raw[:, 2:] = np.arange(1, 33, dtype=np.int8).view(np.uint8)
    x = np.zeros((1, 32), np.float32)
    x[0, ::2] = 2.0
    got = x @ Q8ActivationMatrix(raw, "Q8_0", 32)
    want = np.float32(0.5) * np.float32(np.float16(np.float32(2.0) / np.float32(127.0))) * np.float32(127 * 256)
    np.testing.assert_array_equal(got, np.full((1, 4), want, np.float32))


@pytest.mark.parametrize("qtype", INT_TYPES)
@pytest.mark.parametrize("n_tokens", [1, 3, 20])
def test_kernel_equals_the_numpy_reference_bit_for_bit(tmp_path, rng, qtype, n_tokens):
    w = (rng.standard_normal((99, 160)) * 0.05).astype(np.float32)         # (d_out, d_in): groups of 4, 3 left
    raw, d_in = written(tmp_path, w, qtype)
    W = Q8ActivationMatrix(raw, qtype, d_in)
    x = rng.standard_normal((n_tokens, d_in)).astype(np.float32)
    x[0, 32:64] = 0.0                                                       # a block of zeros
    got = x @ W
    np.testing.assert_array_equal(got, reference_matmul(x, W))
    exact = x @ dequantize(raw, GGMLQuantizationType[qtype]).T              # the weights' values in float32
    assert np.linalg.norm(got - exact) / np.linalg.norm(exact) < 2e-2       # x's 8 bits: ~0.5% per product


@pytest.mark.parametrize("qtype", INT_TYPES)
def test_each_token_and_each_thread_count_gives_the_same_outputs(tmp_path, rng, qtype):
    """A token's outputs are its own: in a batch of 12 or alone, on 1 thread or 3 ranges of rows."""
    w = (rng.standard_normal((40, 64)) * 0.05).astype(np.float32)
    W = Q8ActivationMatrix(written(tmp_path, w, qtype)[0], qtype, 64)
    x = rng.standard_normal((12, 64)).astype(np.float32)
    batch = x @ W
    for i in (0, 5, 11):
        np.testing.assert_array_equal(x[i:i + 1] @ W, batch[i:i + 1])
    parallel = np.empty_like(batch)
    _q8_fused.matmul(qtype, *W.kernel_planes, x, parallel, threads=3)
    np.testing.assert_array_equal(parallel, batch)


def test_bad_arguments_name_what_was_expected(tmp_path, rng):
    from attnlab.models import load_model

    w = (rng.standard_normal((8, 64)) * 0.05).astype(np.float32)
    raw, _ = written(tmp_path, w, "Q4_1")
    with pytest.raises(ValueError, match=r"qtype must be one of .* for 8-bit activations, got 'Q4_K'"):
        Q8ActivationMatrix(raw, "Q4_K", 256)
    with pytest.raises(ValueError, match=r"x @ W needs x \(\.\.\., 64\)"):
        np.ones((1, 32), np.float32) @ Q8ActivationMatrix(raw, "Q4_1", 64)
    with pytest.raises(ValueError, match="quantized must be True, False or 'q8-activations', got 'q4'"):
        load_model("smollm2", quantized="q4")
    with pytest.raises(ValueError, match="quantized='q8-activations' keeps a GGUF file's blocks"):
        load_model("minilm", quantized=MODE)


@pytest.mark.parametrize("qtype, tied", [("Q4_0", True), ("Q4_1", False), ("Q8_0", True)])
def test_load_model_q8_keeps_the_blocks_and_stays_near_the_float32_logits(tmp_path, qtype, tied):
    """A tiny llama GGUF loaded with ``quantized="q8-activations"``: its weights of the type (and a Q8_0 tied
    embedding's unembedding) multiply as llama.cpp does; the logits stay near the float32 load's, and the same
    input gives the same logits bit for bit."""
    pytest.importorskip("tokenizers")
    from attnlab.models import load_model
    from attnlab.stack.transformer import forward, new_caches

    path = tmp_path / "tiny.gguf"
    tiny_gguf(path, qtype, tied)
    q8, _ = load_model(str(path), quantized=MODE)
    f32, _ = load_model(str(path))
    assert isinstance(q8.blocks[1].mlp.W_out, Q8ActivationMatrix)
    ids = np.arange(1, 40) * 7 % 264
    got, want = forward(q8, ids).logits, forward(f32, ids).logits
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 6e-2      # random weights of std 0.2: x's rounding grows
    np.testing.assert_array_equal(forward(q8, ids).logits, got)
    full = forward(f32, np.append(ids, 5)).logits[-1:]
    # a decode step after the prefill, on a float32 KV cache and on the mode's own float16 one (q, the cache and the
    # attention weights rounded to float16, as llama.cpp computes; measured here 5.1% and 7.4% from float32's)
    for kv_dtype, bound in (("float32", 6e-2), (None, 1e-1)):
        cache = new_caches(q8, 48, kv_dtype=kv_dtype)
        forward(q8, ids, caches=cache)
        step = forward(q8, [5], caches=cache).logits                       # (1, vocab)
        assert np.linalg.norm(step - full) / np.linalg.norm(full) < bound  # random weights of std 0.2: roundings grow


def test_cli_takes_quantized_q8_and_refuses_another_value(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    from attnlab.cli import main

    path = tmp_path / "tiny.gguf"
    tiny_gguf(path, "Q4_1")
    reports = []
    for extra in ([], ["--quantized"], ["--quantized", "q8"], ["--quantized=exact"]):
        assert main(["lens", "abc", "--model", str(path), "--json", *extra]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    assert reports[1] == reports[3]                                          # --quantized means exact
    assert reports[0].keys() == reports[2].keys()
    assert main(["lens", "abc", "--model", str(path), "--quantized=q4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) >= 1 and err[-1].startswith("attnlab: error:") and "q4" in err[-1]


HASWELL = "+avx2,+fma,+f16c,+bmi2"    # numba takes the host's features unless told: these, and Haswell's own


@pytest.mark.parametrize("cpu", ["haswell", "avx-vnni"])
def test_the_kernels_without_vnni_give_the_same_bits(tmp_path, cpu):
    """Compiled for a CPU without VNNI (``NUMBA_CPU_NAME=haswell`` and its features alone, no AVX-512: the
    products as plain vector IR, which LLVM lowers to ``vpmaddwd`` and ``vphaddd``), or
    with 256-bit VNNI only (AVX-VNNI: two rows' 64 bytes as two 256-bit ``vpdpbusd``; here ``VNNI_512`` turned
    off before anything compiles, where the CPU has VNNI at all), the kernels still equal the numpy reference
    bit for bit (a fresh process and numba cache)."""
    import subprocess
    import sys

    if cpu == "avx-vnni" and not _q8_fused.VNNI:
        pytest.skip("this CPU has no VNNI: the 256-bit VNNI path cannot run here")
    setup = ("assert not _q8_fused.VNNI" if cpu == "haswell" else "_q8_fused.VNNI_512 = False")
    code = """
import numpy as np
from gguf.constants import GGMLQuantizationType as T
from gguf.quants import quantize
from attnlab.kernels import _q8_fused
from attnlab.kernels.q8_activations import Q8ActivationMatrix, reference_matmul
""" + setup + """
rng = np.random.default_rng(1)
for qtype in ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1"):
    W = Q8ActivationMatrix(quantize((rng.standard_normal((30, 96)) * 0.05).astype(np.float32), T[qtype]), qtype, 96)
    for n in (3, 21):                  # 21: two tiles of the prefill's GEMM, then five tokens one by one
        x = rng.standard_normal((n, 96)).astype(np.float32)
        got = x @ W
        assert np.array_equal(got, reference_matmul(x, W)), qtype
        assert np.array_equal(got, np.concatenate([x[i:i + 1] @ W for i in range(n)])), qtype
print("ok")
"""
    import os
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), 
               **({"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": HASWELL} if cpu == "haswell" else {}))
    env.pop("ATTNLAB_NO_NUMBA", None)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


def test_greedy_logits_follow_their_own_argmax(tmp_path):
    """llama_process.greedy_logits (the attnlab side of the llama.cpp comparison): each generated id is the
    argmax of the row before it, and the rows equal one forward over the whole sequence (float32 model)."""
    pytest.importorskip("tokenizers")
    from attnlab.cli.llama_process import greedy_logits
    from attnlab.models import load_model
    from attnlab.stack.transformer import forward

    path = tmp_path / "tiny.gguf"
    tiny_gguf(path, "Q8_0")
    model, _ = load_model(str(path))
    ids, logits = greedy_logits(model, [3, 17, 42], steps=5)
    assert len(ids) == 8 and logits.shape == (8, model.config.vocab_size)
    assert ids[3:] == [int(i) for i in logits[2:7].argmax(-1)]
    np.testing.assert_allclose(logits, forward(model, np.asarray(ids)).logits, rtol=1e-4, atol=1e-4)


def test_bench_q8_rows_print_every_row_with_and_without_llama_cpp():
    """bench_q8's table (the rows ``attnlab bench --model smollm2`` adds): decode, each prefill, and the
    llama.cpp rows only when it ran."""
    from attnlab.cli.bench_q8 import q8_table

    x = {"ratio": 0.9, "ratio_min": 0.8, "ratio_max": 1.1}
    prefill = [{"tokens": n, "ms": {"float32": 1.0, "exact": 2.0, "q8": 3.0}} for n in (512, 2048)]
    r = {"llama_cpp": None, "threads": 1, "decode": {"q8": 10.0, "exact": 12.0, "q8_vs_exact": x}, "prefill": prefill}
    lines = q8_table(r)
    assert lines[0].startswith("decode q8") and "not importable" in lines[1]
    assert [ln.split()[1] for ln in lines[2:]] == ["512", "2048"]
    with_llama = dict(r, llama_cpp="0.3.36", decode=dict(r["decode"], llama_cpp=8.0, q8_vs_llama_cpp=x,
                                                          exact_vs_llama_cpp=x),
                      prefill=[dict(p, ms=dict(p["ms"], llama_cpp=4.0), vs_llama_cpp={"q8": x}) for p in prefill])
    lines = q8_table(with_llama)
    assert sum("vs llama.cpp" in ln for ln in lines) == 2 and sum("vs llama_cpp" in ln for ln in lines) == 2
