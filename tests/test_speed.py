"""The decode step's shape of work (issue 21): a bounded number of calls per layer whatever the head count,
and the fused decode kernel against the numpy path. Speed itself is measured in benchmarks/, never here."""

import numpy as np
import pytest

from attnlab.cli.bench_model import Decoder, decode_calls, weight_bytes


@pytest.fixture(scope="module")
def shaped():
    """Tiny stand-ins: 2 layers, a 1,000-token vocabulary (the count does not depend on it)."""
    from attnlab.layer.config import AttentionConfig
    from attnlab.layer.positions import RoPE
    from attnlab.stack.layers import RMSNorm
    from attnlab.stack.transformer import ModelConfig, Transformer

    def make(n_heads, n_kv_heads, n_layers=2):
        att = AttentionConfig(d_model=96, n_heads=n_heads, n_kv_heads=n_kv_heads, d_head=16, n_ctx=256,
                              positions=RoPE(10000.0))
        cfg = ModelConfig(vocab_size=1000, n_layers=n_layers, attention=att, d_mlp=128, activation="silu",
                          mlp="gated", norm=RMSNorm, tied_embeddings=True)
        return Transformer.init(cfg, rng=np.random.default_rng(0))
    return make


@pytest.mark.parametrize("kernel", ["fused", "numpy"])
def test_decode_calls_per_layer_do_not_depend_on_the_head_count(shaped, kernel, monkeypatch):
    if kernel == "numpy":
        monkeypatch.setenv("ATTNLAB_NO_NUMBA", "1")
    else:
        pytest.importorskip("numba")
        monkeypatch.delenv("ATTNLAB_NO_NUMBA", raising=False)
        monkeypatch.setenv("ATTNLAB_KERNEL", "fused")                 # every decode step fused, whatever its size
    counts = {h: decode_calls(Decoder(shaped(*h), context=8)) for h in ((6, 2), (12, 4), (4, 4), (12, 12), (2, 1))}
    for few, many in (((6, 2), (12, 4)), ((4, 4), (12, 12))):        # groups of 3, groups of 1: 2-3x the heads
        assert counts[few] == counts[many], counts
    for kind in ("numpy_numba", "python"):                            # grouped or not: a branch, a few calls
        assert max(c[kind] for c in counts.values()) - min(c[kind] for c in counts.values()) <= 4, counts
    two, four = decode_calls(Decoder(shaped(6, 2, 2), 8)), decode_calls(Decoder(shaped(6, 2, 4), 8))
    per_layer = (four["numpy_numba"] - two["numpy_numba"]) / 2           # what one more layer adds
    assert per_layer <= 55, per_layer                     # 69 when written, 50 after issue 21: norms, checks, the kernels


def test_weight_bytes_counts_each_weight_once(shaped):
    m = shaped(6, 2)
    assert weight_bytes(m) == 4 * m.n_params                          # float32; W_E once (tied)


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 2e-6)])
@pytest.mark.parametrize("batch, h, h_kv, n_k", [((), 9, 3, 1), ((), 9, 3, 70), ((2,), 4, 4, 33), ((2, 3), 6, 1, 17)])
def test_fused_decode_kernel_equals_the_numpy_path(rng, monkeypatch, dtype, tol, batch, h, h_kv, n_k):
    pytest.importorskip("numba")
    from attnlab.kernels import _kernels, decode
    from attnlab.kernels._checks import check_attention_args

    q = rng.standard_normal((*batch, h, 1, 16)).astype(dtype) * 3     # (..., h, 1, d) large scores too
    k = rng.standard_normal((*batch, h_kv, n_k, 16)).astype(dtype)
    v = rng.standard_normal((*batch, h_kv, n_k, 8)).astype(dtype)
    c = check_attention_args(q, k, v)
    monkeypatch.delenv("ATTNLAB_NO_NUMBA", raising=False)
    assert _kernels.load_fused() is not None
    fused = decode.decode_attention(c, "fused")
    np.testing.assert_allclose(fused, decode.decode_attention(c, "numpy"), rtol=tol, atol=tol)


def test_bench_model_refuses_an_unknown_model_in_one_line(capsys):
    from attnlab.cli import main

    assert main(["bench", "--model", "gpt5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error:") and "'gpt5'" in err and err.count("\n") == 1


def test_llama_cpp_row_is_absent_without_llama_cpp(monkeypatch):
    import importlib.util

    from attnlab.cli import llama_process

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    assert llama_process.llama_step("unused.gguf", 64, threads=2) is None       # no process started, no row


def test_a_decode_step_checks_once_at_the_door(shaped):
    """The layers' attention goes through attend, which skips the argument checks the public door already made:
    a 2-layer decode step makes at most 12 calls into kernels/_checks.py per layer (53 in all before issue 30)."""
    from attnlab.cli.bench_model import fixed_cost, python_calls

    calls = python_calls(Decoder(shaped(6, 2), context=8))
    assert calls["by_file"].get("kernels/_checks.py", 0) <= 2 * 12 + 1, calls["by_file"]
    assert calls["total"] == sum(calls["by_file"].values())
    cost = fixed_cost(n_layers=2, rounds=1)
    assert cost["ms"] > 0 and cost["n_layers"] == 2 and cost["python_calls"] > 0
