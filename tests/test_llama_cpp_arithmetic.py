"""The q8 mode's arithmetic between its products is llama.cpp's (attnlab.stack.llama_cpp): a tiny llama GGUF
written by GGUFWriter, loaded with ``quantized="q8-activations"``, gives bit for bit the logits of a numpy
reference that states the whole pass op by op in attnlab.kernels.ggml_arith's functions and the model's own
products (the products are held to their integer reference in tests/test_q8_activations.py). Against llama.cpp
itself: tests/test_q8_llama_cpp.py (needs llama_cpp)."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("numba")
pytest.importorskip("tokenizers")

from attnlab.kernels import ggml_arith as G  # noqa: E402
from attnlab.kernels.matmul import linear  # noqa: E402
from attnlab.layer.multihead import LlamaCppAttention, MultiHeadAttention  # noqa: E402
from attnlab.layer.positions import LlamaCppRoPE, RoPE, scheme_from_json  # noqa: E402
from attnlab.stack.layers import LlamaCppRMSNorm, RMSNorm  # noqa: E402
from attnlab.stack.llama_cpp import llama_cpp_arithmetic, takes  # noqa: E402


@pytest.fixture(autouse=True)
def numba_on(monkeypatch):
    monkeypatch.delenv("ATTNLAB_NO_NUMBA", raising=False)


def tiny(tmp_path, qtype="Q4_1", **sizes):
    """tests/test_gguf.py's tiny llama GGUF (the tests are not a package: loaded by path)."""
    from gguf.constants import GGMLQuantizationType
    spec = importlib.util.spec_from_file_location("_test_gguf", Path(__file__).with_name("test_gguf.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = tmp_path / f"tiny_{qtype}.gguf"
    module.write_gguf(path, qtype=GGMLQuantizationType[qtype], tied=False, **sizes)
    return path


def reference(model, ids, start, caches_kv):
    """The pass over ``ids`` at positions start … as ggml computes it: (n, vocab) logits; ``caches_kv`` a list of
    (k, v) float32 arrays (h_kv, capacity, d_head) per layer, written at the new positions."""
    from attnlab.stack.hooks import run_with_cache
    c = model.config
    h, h_kv, d = c.attention.n_heads, c.attention.n_kv_heads, c.attention.d_head
    x = run_with_cache(model, np.asarray(ids), ["blocks.0.hook_resid_pre"])[1]["blocks.0.hook_resid_pre"]
    n = len(ids)
    for b, (K, V) in zip(model.blocks, caches_kv):
        a = b.attn
        qkv = G.rms_norm(x, b.ln_1.weight, b.ln_1.eps) @ a.W_QKV                        # (n, (h + 2·h_kv)·d)
        q = G.rope(qkv[:, :h * d].reshape(n, h, d).transpose(1, 0, 2), range(start, start + n), 10000.0)
        k = G.rope(qkv[:, h * d:(h + h_kv) * d].reshape(n, h_kv, d).transpose(1, 0, 2), range(start, start + n),
                   10000.0)                                                               # (h_kv, n, d)
        K[:, start:start + n] = G.half(k)                                                 # the float16 cache
        V[:, start:start + n] = G.half(qkv[:, (h + h_kv) * d:].reshape(n, h_kv, d).transpose(1, 0, 2))
        o = G.attention(q, K[:, :start + n], V[:, :start + n], start, d ** -0.5)          # (h, n, d)
        x = o.transpose(1, 0, 2).reshape(n, h * d) @ a.W_O + x                            # (n, d_model)
        gu = G.rms_norm(x, b.ln_2.weight, b.ln_2.eps) @ b.mlp.W_gate_in                   # (n, 2·d_mlp)
        m = gu.shape[1] // 2
        x = G.swiglu(gu[:, :m], gu[:, m:]) @ b.mlp.W_out + x                              # (n, d_model)
    return linear(G.rms_norm(x, model.ln_final.weight, model.ln_final.eps), model.W_U)    # (n, vocab)


@pytest.mark.parametrize("qtype, d_head", [("Q4_1", 16), ("Q8_0", 64)])
def test_q8_mode_gives_the_reference_bits_in_a_prefill_and_a_decode_step(tmp_path, qtype, d_head):
    from attnlab.models import load_model
    from attnlab.stack.transformer import forward, new_caches

    model, _ = load_model(str(tiny(tmp_path, qtype, d_head=d_head, n_layers=3)), quantized="q8-activations")
    assert type(model.blocks[0].attn) is LlamaCppAttention and type(model.ln_final) is LlamaCppRMSNorm
    assert type(model.config.attention.positions) is LlamaCppRoPE and model.blocks[1].mlp.activation == "silu_llama_cpp"
    c = model.config.attention
    ids = np.arange(1, 20) * 7 % 264
    caches = new_caches(model, 32)                                    # the mode's rule: float16
    kv = [tuple(np.zeros((c.n_kv_heads, 32, c.d_head), np.float32) for _ in "kv") for _ in model.blocks]
    np.testing.assert_array_equal(forward(model, ids, caches=caches).logits, reference(model, ids, 0, kv))
    for s, t in enumerate((5, 77)):                                   # one token at a time: ggml_vec_dot_f16's order
        np.testing.assert_array_equal(forward(model, [t], caches=caches).logits, reference(model, [t], 19 + s, kv))
    # without caches: the same pass (the keys and values rounded to float16 as llama.cpp's cache rounds them)
    np.testing.assert_array_equal(forward(model, ids).logits, forward(model, ids, caches=new_caches(model, 32)).logits)


def test_exact_modes_keep_their_own_parts(tmp_path):
    from attnlab.models import load_model

    path = tiny(tmp_path)
    for quantized in (False, True):
        model, _ = load_model(str(path), quantized=quantized)
        assert type(model.blocks[0].attn) is MultiHeadAttention and type(model.ln_final) is RMSNorm
        assert type(model.config.attention.positions) is RoPE and model.blocks[0].mlp.activation == "silu"


def test_a_model_without_its_parts_comes_back_as_it_is():
    from attnlab.layer.config import AttentionConfig
    from attnlab.stack.layers import LayerNorm
    from attnlab.stack.transformer import ModelConfig, Transformer

    c = ModelConfig(vocab_size=11, n_layers=1, attention=AttentionConfig(d_model=16, n_heads=2, n_ctx=8),
                    d_mlp=32, norm=LayerNorm)                         # GPT-2-like: LayerNorm, learned positions
    model = Transformer.init(c, rng=np.random.default_rng(0))
    assert not takes(model) and llama_cpp_arithmetic(model) is model


def test_llama_cpp_rope_round_trips_and_refuses_scaling():
    scheme = LlamaCppRoPE(theta=100000.0)
    assert scheme_from_json(scheme.to_json()) == scheme
    with pytest.raises(ValueError, match="no scaling"):
        LlamaCppRoPE(rotary_dim=8)
    x = np.random.default_rng(1).standard_normal((2, 3, 16)).astype(np.float32)
    np.testing.assert_array_equal(scheme.rotate(x, start=4), G.rope(x, [4, 5, 6], 100000.0))
    np.testing.assert_allclose(scheme.rotate(x, start=4), RoPE(theta=100000.0).rotate(x, start=4), atol=2e-6)


def test_llama_cpp_rms_norm_is_ggml_s_and_its_hooks_see_it():
    from attnlab.layer.hookpoints import Hooks

    w = np.linspace(0.5, 1.5, 16).astype(np.float32)
    x = np.random.default_rng(2).standard_normal((3, 16)).astype(np.float32)
    norm = LlamaCppRMSNorm(w, 1e-5)
    np.testing.assert_array_equal(norm(x), G.rms_norm(x, w, 1e-5))
    np.testing.assert_allclose(norm(x), RMSNorm(w, 1e-5)(x), rtol=1e-6)
    seen = {}
    hooks = Hooks(list(LlamaCppRMSNorm.HOOKS), {n: (lambda a, n: seen.__setitem__(n, a))
                                                 for n in LlamaCppRMSNorm.HOOKS})
    np.testing.assert_array_equal(norm(x, hooks), norm(x))
    assert seen["hook_scale"].shape == (3, 1) and seen["hook_normalized"].shape == (3, 16)


def test_the_parts_give_the_same_bits_with_numba_and_without(monkeypatch):
    """With ATTNLAB_NO_NUMBA the parts take ggml_arith's numpy functions: the same bits as the numba kernels."""
    from attnlab.layer.config import AttentionConfig
    from attnlab.layer.multihead import LlamaCppAttention
    from attnlab.stack.layers import silu_llama_cpp

    rng = np.random.default_rng(3)
    config = AttentionConfig(d_model=128, n_heads=4, n_kv_heads=2, positions=LlamaCppRoPE(theta=10000.0))
    attn = LlamaCppAttention.init(config, rng=rng, std=0.3)
    norm = LlamaCppRMSNorm(rng.standard_normal(128).astype(np.float32), 1e-5)
    x = rng.standard_normal((9, 128)).astype(np.float32)
    runs = []
    for off in ("", "1"):
        monkeypatch.setenv("ATTNLAB_NO_NUMBA", off)
        runs.append((norm(x), silu_llama_cpp(x), attn(x, is_causal=True), attn(x[:1], is_causal=True)))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
