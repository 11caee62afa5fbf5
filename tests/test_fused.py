"""The fused tile kernel (numba) against the numpy path and the float64 reference: every mask kind, window,
q_offset, float16/32/64, fully masked rows, extreme scores; its exponential; the path chooser and its log;
the on-disk cache. Tests of the kernel itself skip without numba; the path tests run on both kernels."""

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnlab import attention
from attnlab.kernels import _kernels
from attnlab.kernels import tiled
from attnlab.kernels._checks import check_attention_args
from attnlab.kernels._kernels import KERNEL_ENV, NO_NUMBA_ENV
from attnlab.kernels.attention import attention_path
from attnlab.kernels.naive import naive_attention
from attnlab.kernels.tiled import tiled_attention

SRC = Path(__file__).resolve().parents[1] / "src"


def reference(q, k, v, **kw):
    """The naive grid in float64: the reference every path is held to."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    return naive_attention(check_attention_args(q, k, v, **kw))[0]


def both_kernels(q, k, v, monkeypatch, **kw):
    """tiled_attention on the numpy kernel and on the fused one (small tiles: every edge is crossed)."""
    outs = {}
    monkeypatch.delenv(NO_NUMBA_ENV, raising=False)
    for kernel in ("numpy", "fused"):
        monkeypatch.setenv(KERNEL_ENV, kernel)
        assert _kernels.tile_kernel() == kernel
        outs[kernel] = tiled_attention(q, k, v, block_q=5, block_k=7, **kw)
    return outs


def tol(dtype):
    return {np.float16: 2e-3, np.float32: 2e-6, np.float64: 1e-12}[dtype]


MASK_KINDS = ["none", "causal", "window", "offset", "dense", "padding", "causal+dense"]


def mask_kwargs(kind, rng, n_q, n_k):
    if kind == "none":
        return {}
    if kind == "causal":
        return {"is_causal": True}
    if kind == "window":
        return {"is_causal": True, "window": 4}
    if kind == "offset":
        return {"is_causal": True, "q_offset": 3, "window": 6}
    if kind == "dense":
        return {"mask": rng.random((n_q, n_k)) < 0.6}
    if kind == "padding":
        keep = np.ones((2, 1, 1, n_k), bool)                 # (B, 1, 1, n_k) the last keys of batch 1 are padding
        keep[1, ..., n_k // 2:] = False
        return {"mask": keep}
    return {"is_causal": True, "mask": rng.random((n_q, n_k)) < 0.7}


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("n_q, n_k", [(23, 23), (17, 31), (31, 17)])
def test_fused_and_numpy_match_the_float64_reference(rng, monkeypatch, kind, dtype, n_q, n_k):
    pytest.importorskip("numba")
    q, k, v = (rng.normal(size=(2, 3, n, 8)).astype(dtype) for n in (n_q, n_k, n_k))
    kw = mask_kwargs(kind, rng, n_q, n_k)
    ref = reference(q, k, v, **kw)
    outs = both_kernels(q, k, v, monkeypatch, **kw)
    for kernel, out in outs.items():
        assert out.dtype == dtype, kernel
        np.testing.assert_allclose(out.astype(np.float64), ref, rtol=tol(dtype), atol=tol(dtype), err_msg=kernel)
    np.testing.assert_allclose(outs["fused"].astype(np.float64), outs["numpy"].astype(np.float64),
                               rtol=tol(dtype), atol=tol(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fully_masked_rows_give_zero_and_lse_minus_inf_on_both_kernels(rng, monkeypatch, dtype):
    pytest.importorskip("numba")
    q, k, v = (rng.normal(size=(4, 9, 8)).astype(dtype) for _ in range(3))
    keep = rng.random((4, 9, 9)) < 0.5
    keep[:, [2, 6]] = False                                   # two queries see no key at all
    ref = reference(q, k, v, mask=keep)
    for kernel in ("numpy", "fused"):
        monkeypatch.setenv(NO_NUMBA_ENV, "1" if kernel == "numpy" else "0")
        out, lse = tiled_attention(q, k, v, mask=keep, block_q=3, block_k=4, return_lse=True)
        assert np.all(out[:, [2, 6]] == 0) and np.all(lse[:, [2, 6]] == -np.inf) and np.isfinite(out).all()
        np.testing.assert_allclose(out, ref, rtol=tol(dtype), atol=tol(dtype), err_msg=kernel)
    # q_offset so negative that the first queries see nothing through causality
    out = tiled_attention(q, k, v, is_causal=True, q_offset=-3, block_q=3, block_k=4)
    assert np.all(out[:, :3] == 0)
    np.testing.assert_allclose(out, reference(q, k, v, is_causal=True, q_offset=-3), rtol=tol(dtype),
                               atol=tol(dtype))


@pytest.mark.parametrize("spread", [1.0, 40.0, 1e3, 3e4])
@pytest.mark.parametrize("is_causal", [False, True])
def test_extreme_scores_on_both_kernels(rng, monkeypatch, spread, is_causal):
    """Scores up to ±1e8 in float64 (so float32 holds the same inputs), growing across key blocks and far
    below zero in whole rows: the running max moves, nothing overflows or underflows to NaN."""
    pytest.importorskip("numba")
    n = 29
    q = rng.normal(size=(2, n, 8)) * np.sqrt(spread)
    k = rng.normal(size=(2, n, 8)) * np.linspace(0.1, 1, n)[:, None] * np.sqrt(spread)   # later keys score higher
    k[1] -= 3 * np.sqrt(spread)                                                            # whole rows far below 0
    v = rng.normal(size=(2, n, 3))
    ref = reference(q, k, v, is_causal=is_causal)
    outs = both_kernels(q, k, v, monkeypatch, is_causal=is_causal)
    for kernel, out in outs.items():
        np.testing.assert_allclose(out, ref, rtol=1e-10, atol=1e-10, err_msg=kernel)
    outs32 = both_kernels(*(x.astype(np.float32) for x in (q, k, v)), monkeypatch, is_causal=is_causal)
    for kernel, out in outs32.items():
        assert np.isfinite(out).all()
        # float32 scores of size S carry an absolute error ~S·6e-8, which the softmax turns into weights' error
        np.testing.assert_allclose(out, ref, rtol=0, atol=max(2e-6, spread * 64 * 6e-8 * 4), err_msg=kernel)


def test_pow2_float32_polynomial_accuracy():
    fused = pytest.importorskip("attnlab.kernels._fused")
    x = np.linspace(-126, 127.9, 2_000_003).astype(np.float32)   # (n,)
    out = np.empty_like(x)
    fused.pow2_array(x, out)
    ref = np.exp2(x.astype(np.float64))
    assert np.max(np.abs(out / ref - 1)) < 1.5e-7                 # float32 eps is 6e-8
    low = np.array([-126.5, -200.0, -1e30, -np.inf], np.float32)
    fused.pow2_array(low, out[:4])
    assert np.all(out[:4] == 0)                                   # below 2^-126: 0, and -inf (masked) gives 0
    x64 = np.linspace(-1000, 1000, 10_001)
    out64 = np.empty_like(x64)
    fused.pow2_array(x64, out64)
    np.testing.assert_allclose(out64, np.exp2(x64), rtol=1e-15)


def test_tile_softmax_against_numpy_steps(rng):
    """One tile, by hand in numpy: row bounds (causal diagonal and window) zero the rest; the running max,
    shift, rescale of l and acc (the row sums are the caller's, added here as FusedTile adds them)."""
    fused = pytest.importorskip("attnlab.kernels._fused")
    br, bk, d_v = 6, 11, 3
    s0 = rng.normal(size=(br, bk)).astype(np.float32) * 30            # base-2 scores beyond the slack
    for first in (True, False):
        for hi0, lo0 in ((bk + 99, -99), (3, -99), (5, -2)):
            s, m = s0.copy(), np.full(br, -np.inf, np.float32)
            shift, l = np.zeros(br, np.float32), np.full(br, 2.0, np.float32)
            acc = np.ones((br, d_v), np.float32)
            if not first:
                m[:], shift[:] = 1.0, 1.0
            fused.tile_softmax(s, m, shift, l, acc, hi0, lo0, first, True)
            l = s.sum(1) if first else l + s.sum(1)                           # FusedTile's row sums
            cols = np.arange(bk)[None, :]
            rows = np.arange(br)[:, None]
            vis = (cols < hi0 + rows) & (cols >= lo0 + rows)                  # (br, bk)
            m_ref = np.maximum(-np.inf if first else 1.0, np.where(vis, s0, -np.inf).max(1))
            old = 0.0 if first else 1.0
            move = (np.abs(m_ref - old) > fused.SHIFT_SLACK2) & (m_ref > -np.inf)
            shift_ref = np.where(move, m_ref, old)
            arg = (s0 - shift_ref[:, None].astype(np.float32)).astype(np.float64)   # float32 subtraction, as the kernel
            p = np.where(vis & (arg >= -126), np.exp2(arg), 0)                     # subnormals flushed to 0
            alpha = np.where(move, np.exp2(old - shift_ref), 1.0)
            l_ref = p.sum(1) if first else 2.0 * alpha + p.sum(1)
            np.testing.assert_allclose(m, m_ref, rtol=1e-7)
            np.testing.assert_allclose(shift, shift_ref, rtol=1e-7)
            np.testing.assert_allclose(s, p, rtol=2e-6, atol=1e-30)
            np.testing.assert_allclose(l, l_ref, rtol=2e-6)
            if not first:
                np.testing.assert_allclose(acc, np.broadcast_to(alpha[:, None], acc.shape), rtol=2e-6)


def test_compiled_functions_release_the_gil_and_are_cached():
    fused = pytest.importorskip("attnlab.kernels._fused")
    for f in (fused.tile_softmax, fused.exp_row, fused.row_max, fused.pow2_array):
        assert f.targetoptions["nogil"] and type(f._cache).__name__ == "FunctionCache"   # not NullCache


def test_a_second_process_compiles_nothing(tmp_path):
    """numba's cache on disk: after one process has compiled the kernel, the next loads it (straight from the
    cache, attnlab.kernels._numba_load, which numba's hit counter does not see): no miss, one kernel held."""
    pytest.importorskip("numba")
    code = ("import numpy as np; from attnlab.kernels.tiled import tiled_attention; from attnlab.kernels import _fused\n"
            "x = np.ones((1, 200, 8), np.float32)\n"
            "tiled_attention(x, x, x, is_causal=True)\n"
            "s = _fused.tile_softmax.stats\n"
            "print(len(s.cache_misses), len(_fused.tile_softmax.overloads))\n")
    env = {**os.environ, "PYTHONPATH": str(SRC), "NUMBA_CACHE_DIR": str(tmp_path), KERNEL_ENV: "fused"}
    env.pop(NO_NUMBA_ENV, None)
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            for _ in range(2)]
    first, second = (r.stdout.split() for r in runs)
    assert first == ["1", "1"] and second == ["0", "1"], (first, second, runs[1].stderr)   # compiled, then loaded


def test_a_fresh_process_runs_short_calls_on_numpy_and_loads_no_numba():
    """The issue's first-call goal: numba (import and cache load, over 100 MiB resident) loads only for calls
    of at least FUSED_MIN_SCORES scores, so a fresh process's first short calls allocate about what its
    second does."""
    pytest.importorskip("numba")
    code = ("import sys, numpy as np\n"
            "from attnlab import attention\n"
            "from attnlab.kernels import _kernels\n"
            "def rss():\n"
            "    return int(open('/proc/self/statm').read().split()[1]) * 4096 / 2**20\n"
            "q = np.random.default_rng(0).standard_normal((1, 12, 256, 64), dtype=np.float32)\n"
            "r0 = rss(); attention(q, q, q, is_causal=True); r1 = rss(); attention(q, q, q, is_causal=True)\n"
            "print(r1 - r0, rss() - r1, 'numba' in sys.modules, _kernels.kernel_in_use())\n")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    env.pop(NO_NUMBA_ENV, None)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    first, second, numba_loaded, kernel = run.stdout.split()
    assert (numba_loaded, kernel) == ("False", "numpy"), run.stdout
    assert float(first) - float(second) <= 50, run.stdout                 # MiB


def test_the_tile_kernel_rule_is_a_size_rule():
    """fused from FUSED_MIN_SCORES scores for masked calls; unmasked ones only where numpy's exponential is exp;
    a tune profile's thresholds replace both; the same arguments always give the same answer."""
    rule, n = _kernels.tile_kernel_rule, _kernels.FUSED_MIN_SCORES
    assert rule(n - 1, masked=True, exp_name="exp2")[0] == "numpy"
    assert rule(n, masked=True, exp_name="exp2")[0] == "fused"
    assert rule(10 * n, masked=False, exp_name="exp2")[0] == "numpy"        # AVX-512 exp2 beats fused unmasked
    assert rule(n, masked=False, exp_name="exp")[0] == "fused"
    tuned = {"masked": 1000, "full": None}
    assert rule(999, masked=True, exp_name="exp2", tuned_min=tuned)[0] == "numpy"
    assert rule(1000, masked=True, exp_name="exp2", tuned_min=tuned)[0] == "fused"
    kernel, why = rule(10 * n, masked=False, exp_name="exp", tuned_min=tuned)
    assert kernel == "numpy" and why.startswith("tune profile")
    assert all(rule(s, masked=m, exp_name="exp") == rule(s, masked=m, exp_name="exp")
               for s in (0, n, 2 * n) for m in (True, False))


def test_a_model_pass_counts_every_layers_scores():
    """Inside a model's pass the size rule counts the pass's scores (numba loads once for all its layers): a
    masked call of few scores runs fused in a pass of FUSED_MIN_SCORES; unmasked AVX-512 calls and tuned
    thresholds are as before; outside a step a call counts its own."""
    rule, n = _kernels.tile_kernel_rule, _kernels.FUSED_MIN_SCORES
    assert rule(1000, masked=True, exp_name="exp2", pass_scores=n - 1)[0] == "numpy"
    kernel, why = rule(1000, masked=True, exp_name="exp2", pass_scores=n)
    assert kernel == "fused" and "the model's pass" in why
    assert rule(1000, masked=False, exp_name="exp2", pass_scores=10 * n)[0] == "numpy"
    assert rule(1000, masked=True, exp_name="exp2", tuned_min={"masked": 2000, "full": None},
                pass_scores=10 * n)[0] == "numpy"                   # a tune profile measured per call
    from attnlab.kernels._step import one_step, pass_scores
    assert pass_scores() == 0
    with one_step(n):
        assert pass_scores() == n
        with one_step(1):                                           # nested: the outer pass's
            assert pass_scores() == n
    assert pass_scores() == 0


def test_forward_and_forward_from_run_one_kernel_per_pass(rng, monkeypatch):
    """A pass of 2^24 scores over its layers (4 layers · 4 heads · 1024²) runs the fused kernel in every layer,
    from the first or from a later one: forward_from on forward's residual stream gives forward's bits."""
    pytest.importorskip("numba")
    monkeypatch.delenv(NO_NUMBA_ENV, raising=False)
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    from attnlab.layer.config import AttentionConfig
    from attnlab.layer.positions import RoPE
    from attnlab.stack.layers import RMSNorm
    from attnlab.stack.transformer import ModelConfig, Transformer, forward, forward_from, pass_scores
    att = AttentionConfig(d_model=32, n_heads=4, n_kv_heads=2, d_head=8, n_ctx=1024, positions=RoPE(10000.0))
    cfg = ModelConfig(vocab_size=50, n_layers=4, attention=att, d_mlp=32, activation="silu", mlp="gated",
                      norm=RMSNorm, tied_embeddings=True)
    model = Transformer.init(cfg, rng=rng)
    ids = rng.integers(0, 50, 1024)
    assert pass_scores(model, ids.shape) == _kernels.FUSED_MIN_SCORES
    seen = []
    real = _kernels.kernel_choice
    monkeypatch.setattr(_kernels, "kernel_choice", lambda *a, **kw: seen.append(real(*a, **kw)) or seen[-1])
    out = forward(model, ids)
    assert {kernel for kernel, _ in seen} == {"fused"}
    seen.clear()
    later = forward_from(model, out.hidden_states[2], 2)            # block 2's input, as forward made it
    assert {kernel for kernel, _ in seen} == {"fused"} and np.array_equal(later.logits, out.logits)


def test_kernel_choice_follows_the_environment(monkeypatch):
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    monkeypatch.setenv(NO_NUMBA_ENV, "1")
    assert _kernels.kernel_choice(10**12) == ("numpy", f"{NO_NUMBA_ENV} is set")
    monkeypatch.delenv(NO_NUMBA_ENV)
    monkeypatch.setenv(KERNEL_ENV, "numpy")
    assert _kernels.kernel_choice(10**12)[0] == "numpy"
    monkeypatch.setenv(KERNEL_ENV, "cuda")
    with pytest.raises(ValueError, match="ATTNLAB_KERNEL must be 'fused', 'numpy' or unset, got 'cuda'"):
        _kernels.kernel_choice(1)
    monkeypatch.delenv(KERNEL_ENV)
    monkeypatch.setattr(_kernels, "numba_installed", lambda: False)
    assert _kernels.kernel_choice(10**12) == ("numpy", "numba is not installed")
    monkeypatch.setenv(KERNEL_ENV, "fused")
    with pytest.raises(ValueError, match="needs numba"):
        _kernels.kernel_choice(1)


def test_loading_numba_changes_no_choice(rng, monkeypatch):
    """Once numba is loaded (by a big call, by load_fused), a small call still runs what the rule says."""
    pytest.importorskip("numba")
    monkeypatch.delenv(NO_NUMBA_ENV, raising=False)
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    q = rng.normal(size=(4, 200, 8)).astype(np.float32)
    before = attention_path(q, q, q, is_causal=True)
    _kernels.load_fused()
    after = attention_path(q, q, q, is_causal=True)
    assert before == after and after.kernel == "numpy" and "FUSED_MIN_SCORES" in after.reason


def test_no_numba_env_forces_the_numpy_path(rng, monkeypatch):
    q = rng.normal(size=(2, 200, 8)).astype(np.float32)
    monkeypatch.setenv(NO_NUMBA_ENV, "1")
    path = attention_path(q, q, q, is_causal=True)
    assert (path.name, path.kernel) == ("tiled", "numpy") and "numpy (exp" in str(path)
    monkeypatch.setenv(NO_NUMBA_ENV, "0")
    monkeypatch.setenv(KERNEL_ENV, "fused")
    expected = "fused" if _kernels.numba_installed() else None
    if expected:
        assert attention_path(q, q, q).kernel == expected


def test_the_debug_log_names_the_path(rng, caplog, tile_kernel):
    q = rng.normal(size=(200, 8))
    with caplog.at_level(logging.DEBUG, logger="attnlab.kernels.attention"):
        attention(q, q, q, is_causal=True)
        attention(q[:1], q, q)
        attention(q[:5], q[:5], q[:5])
    messages = [r.getMessage() for r in caplog.records if r.name == "attnlab.kernels.attention"]
    assert len(messages) == 3
    assert messages[0].startswith(f"attention path: tiled, {tile_kernel}")
    assert messages[1].startswith("attention path: decode") and messages[2].startswith("attention path: naive")


def test_numpy_exp_follows_the_cpu_rule_or_the_profile():
    from attnlab.kernels.profile import cpu_features
    assert _kernels.exp_rule({"AVX2", "AVX512F", "AVX512_SKX"})[0] == "exp2"
    assert _kernels.exp_rule({"AVX2", "FMA3"})[0] == "exp"
    choice = _kernels.numpy_exp()
    assert choice is _kernels.numpy_exp() and choice.name == _kernels.exp_rule(cpu_features())[0]
    assert choice.unit == (tiled.LOG2E if choice.name == "exp2" else 1.0) and choice.reason.startswith("rule")


@pytest.mark.parametrize("name", ["exp", "exp2"])
def test_the_numpy_path_is_exact_in_either_base(rng, monkeypatch, name):
    """Whichever exponential this machine picks, the numpy tile step gives the float64 reference."""
    choice = _kernels.ExpChoice(name=name, unit=tiled.LOG2E if name == "exp2" else 1.0, reason="test")
    monkeypatch.setattr(tiled, "tile_step", lambda kernel: tiled.NumpyTile(choice))
    q, k, v = (rng.normal(size=(2, 19, 8)) * 4 for _ in range(3))
    for kw in ({}, {"is_causal": True}, {"is_causal": True, "window": 5}):
        out, lse = tiled_attention(q, k, v, block_q=4, block_k=6, return_lse=True, **kw)
        np.testing.assert_allclose(out, reference(q, k, v, **kw), rtol=1e-12, atol=1e-12)


def test_an_unknown_or_missing_kernel_is_named(monkeypatch):
    with pytest.raises(ValueError, match="kernel must be 'fused' or 'numpy', got 'cuda'"):
        tiled.tile_step("cuda")
    tiled._tile_step.cache_clear()
    monkeypatch.setattr(_kernels, "fused_module", lambda: None)
    try:
        with pytest.raises(ValueError, match=r"needs numba \(pip install 'attnlab\[fast\]'\)"):
            tiled.tile_step("fused")
    finally:
        tiled._tile_step.cache_clear()


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_the_naive_path_fused_softmax_matches_the_reference(rng, kind, dtype, tile_kernel):
    """Below the tiled crossover attention() and attention_weights() take the naive grid; on the fused
    kernel its softmax is one numba pass per row (scale folded in), on numpy the reference's."""
    n_q, n_k = 13, 21
    q, k, v = (rng.normal(size=(2, 3, n, 8)).astype(dtype) for n in (n_q, n_k, n_k))
    kw = mask_kwargs(kind, rng, n_q, n_k)
    path = attention_path(q, k, v, **kw)
    assert (path.name, path.kernel) == ("naive", tile_kernel)
    out = attention(q, k, v, **kw)
    assert out.dtype == dtype
    np.testing.assert_allclose(out.astype(np.float64), reference(q, k, v, **kw), rtol=tol(dtype), atol=tol(dtype))
    from attnlab import attention_weights
    a = attention_weights(q, k, **kw)
    ref_a = naive_attention(check_attention_args(*(x.astype(np.float64) for x in (q, k, v)), **kw))[1]
    np.testing.assert_allclose(a.astype(np.float64), ref_a, rtol=tol(dtype), atol=tol(dtype))


def test_the_naive_path_fused_softmax_extreme_and_empty_rows(rng, tile_kernel):
    q = rng.normal(size=(3, 9, 8)) * 300.0                          # scores of ±1e5
    k = rng.normal(size=(3, 11, 8)) * 300.0
    v = rng.normal(size=(3, 11, 4))
    keep = rng.random((3, 9, 11)) < 0.5
    keep[:, 4] = False                                              # a query that sees no key
    for dtype in (np.float32, np.float64):
        x = [a.astype(dtype) for a in (q, k, v)]
        out = attention(*x, mask=keep)
        assert np.all(out[:, 4] == 0) and np.isfinite(out).all()
        np.testing.assert_allclose(out, reference(*x, mask=keep), rtol=0, atol=1e-10 if dtype == np.float64 else 2e-2)
    # a bias keeps the numpy softmax (the fused one takes none)
    assert attention_path(q, k, v, bias=np.zeros((9, 11))).kernel == "numpy"


def test_a_big_batch_on_the_naive_path_splits_over_threads_and_matches(rng, monkeypatch, tile_kernel):
    from attnlab.kernels import naive
    monkeypatch.setattr(naive, "SPLIT_MIN_SCORES", 64)
    q, k, v = (rng.normal(size=(5, 3, 8, 4)) for _ in range(3))
    keep = rng.random((5, 1, 8, 8)) < 0.7
    bias = rng.normal(size=(5, 3, 8, 8))
    for kw in ({}, {"mask": keep}, {"bias": bias}, {"is_causal": True}):
        c = check_attention_args(q, k, v, **kw)
        assert naive.split_rows(c, 2) == [(0, 2), (2, 5)] or naive.split_rows(c, 2) == [(0, 3), (3, 5)]
        np.testing.assert_allclose(naive.naive_attention_out(c, tile_kernel, workers=2), reference(q, k, v, **kw),
                                   rtol=1e-12, atol=1e-12)
    # nothing to split: one sequence, a key shared by every batch row (broadcast), too few scores, one worker
    assert naive.split_rows(check_attention_args(q[:1], k[:1], v[:1]), 2) == []
    assert naive.split_rows(check_attention_args(q, k[0], v[0]), 2) == []
    assert naive.split_rows(check_attention_args(q, k, v), 1) == []
    monkeypatch.setattr(naive, "SPLIT_MIN_SCORES", 10**9)
    assert naive.split_rows(check_attention_args(q, k, v), 2) == []


def test_the_naive_batch_runs_in_chunks_that_fit_the_cache(rng, monkeypatch, tile_kernel):
    from attnlab.kernels import naive
    q, k, v = (rng.normal(size=(7, 3, 8, 4)) for _ in range(3))               # one row's grid: 3·8·8·8 = 1.5 KiB
    c = check_attention_args(q, k, v, is_causal=True)
    monkeypatch.setattr(naive, "l2_cache_bytes", lambda: 2 * 1536)             # two rows' grids fit
    assert naive.split_rows(c, 1) == [(0, 2), (2, 4), (4, 6), (6, 7)]          # on one worker too
    np.testing.assert_allclose(naive.naive_attention_out(c, tile_kernel, workers=1),
                               reference(q, k, v, is_causal=True), rtol=1e-12, atol=1e-12)
    monkeypatch.setattr(naive, "l2_cache_bytes", lambda: 100)                 # not even one row: one at a time
    assert len(naive.split_rows(c, 1)) == 7
    monkeypatch.setattr(naive, "l2_cache_bytes", lambda: 2**30)               # all of it fits: one call
    assert naive.split_rows(c, 1) == []


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_the_tiled_backward_matches_the_float64_reference_on_both_kernels(rng, kind, tile_kernel):
    """The backward rebuilds each tile's weights as exp(s - lse): numpy's exp, or one fused pass."""
    from attnlab.kernels.naive import naive_attention_grad
    from attnlab.kernels.tiled import tiled_attention_grad
    n_q, n_k = 17, 23
    q, k, v = (rng.normal(size=(2, 3, n, 8)) * 2 for n in (n_q, n_k, n_k))
    do = rng.normal(size=(2, 3, n_q, 8))
    kw = mask_kwargs(kind, rng, n_q, n_k)
    c = check_attention_args(q, k, v, **kw)
    ref = naive_attention_grad(c, do)
    for dtype, rtol in ((np.float64, 1e-10), (np.float32, 2e-4)):
        x = [a.astype(dtype) for a in (q, k, v, do)]
        grads = tiled_attention_grad(*x, block_q=5, block_k=7, **kw)
        for g, r, name in zip(grads, ref, "qkv"):
            assert g.dtype == dtype
            np.testing.assert_allclose(g, r, rtol=rtol, atol=rtol, err_msg=f"d{name} {dtype.__name__}")


@pytest.mark.parametrize("h, h_kv, softcap", [(12, 12, None), (9, 3, None), (4, 2, 5.0)])
def test_fused_decode_on_a_cache_view_equals_the_numpy_path(rng, h, h_kv, softcap):
    """A KV cache hands out views of a longer buffer (numba's layout "A"): the fused decode step reads them in
    place, as fast as contiguous arrays, and gives the numpy path's output."""
    pytest.importorskip("numba")
    from attnlab.kernels import decode
    from attnlab.layer.cache import KVCache

    q = rng.standard_normal((2, h, 1, 16)).astype(np.float32) * 2        # (B, h, 1, d)
    k, v = (rng.standard_normal((2, h_kv, 37, 16)).astype(np.float32) for _ in range(2))
    keys, values = KVCache.empty(h_kv, 64, 16, batch_shape=(2,)).append(k, v)   # (B, h_kv, 37, d) views
    assert not keys.flags.c_contiguous
    c = check_attention_args(q, keys, values, softcap=softcap)
    _kernels.load_fused()
    fused, plain = decode.decode_attention(c, "fused"), decode.decode_attention(c, "numpy")
    np.testing.assert_allclose(fused, plain, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(fused, reference(q, k, v, softcap=softcap), rtol=2e-6, atol=2e-6)


def test_the_decode_kernel_rule(rng, monkeypatch):
    """numpy for a decode step unless it has grouped heads and passes FUSED_MIN_SCORES; a tune profile's
    table (per group kind and context) replaces the rule; the front door reports it."""
    from attnlab.kernels import decode
    rule, n = decode.decode_kernel_rule, _kernels.FUSED_MIN_SCORES
    assert rule(1000, 3, 64)[0] == "numpy" and rule(n, 3, 64)[0] == "fused" and rule(n, 1, 64)[0] == "numpy"
    table = {"grouped": {"64": "fused", "1024": "numpy"}, "ungrouped": {"64": "numpy"}}
    assert [rule(10, 3, n_k, table)[0] for n_k in (1, 64, 1023, 1024, 10**6)] == ["fused"] * 3 + ["numpy"] * 2
    assert rule(10, 1, 5000, table)[0] == "numpy" and rule(10, 3, 64, table)[1].startswith("tune profile")
    monkeypatch.delenv(NO_NUMBA_ENV, raising=False)
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    q = rng.standard_normal((1, 9, 1, 8)).astype(np.float32)
    k = rng.standard_normal((1, 3, 20, 8)).astype(np.float32)
    path = attention_path(q, k, k)
    assert (path.name, path.kernel) == ("decode", "numpy") and "FUSED_MIN_SCORES" in path.reason
