"""Issue 34, part 1: BLAS's threads by a rule on a pass's rows, and a batch's products as one 2-D product.

(a) A model pass over few rows runs BLAS on one thread (on a loaded 2-core machine a loop of SmolLM2's 14-token
passes took 4.5x the CPU and wall time on BLAS's two threads): which count a pass gets is
:func:`attnlab.kernels._threads.blas_threads_rule`, a rule on the rows and the cores, applied once per pass.
(b) ``x @ W`` with batch axes in x called BLAS once per batch row; :func:`attnlab.kernels.matmul.linear` makes it
one 2-D product where that changes no bit of any row, so a token's output does not depend on its batch.
"""

import numpy as np
import pytest

from attnlab.kernels import _threads
from attnlab.kernels._threads import ROWS_PER_BLAS_THREAD, blas_threads_for, blas_threads_rule
from attnlab.kernels.matmul import SMALL_PRODUCT_MACS, linear, merges_rows
from attnlab.layer.config import AttentionConfig
from attnlab.layer.positions import RoPE
from attnlab.stack.backward import grad, logit_difference
from attnlab.stack.layers import MLP, GatedMLP, RMSNorm
from attnlab.stack.transformer import ModelConfig, Transformer, forward, forward_from, new_caches

# ----------------------------------------------------------------------------------------------------------------
# (a) the rule, and its scope


@pytest.mark.parametrize("rows, cores, threads", [
    (1, 2, 1), (14, 2, 1), (126, 2, 1), (255, 2, 1),    # a decode step, the prompt, a sweep's batch
    (256, 2, 2), (512, 2, 2), (2048, 2, 2),             # prefills keep both cores
    (2048, 1, 1),                                       # one core: one thread, whatever the rows
    (14, 64, 1), (1000, 64, 7), (10**6, 64, 64),        # one thread per ROWS_PER_BLAS_THREAD rows, at most the cores
])
def test_the_rule_gives_one_blas_thread_per_128_rows_at_most_the_cores(rows, cores, threads):
    assert ROWS_PER_BLAS_THREAD == 128
    assert blas_threads_rule(rows, cores) == threads


class FakeBLAS:
    """A BLAS as threadpoolctl's controller shows it: a thread count to read and set."""
    def __init__(self, threads):
        self.num_threads, self.set_to = threads, []

    def set_num_threads(self, n):
        self.set_to.append(n)
        self.num_threads = n


@pytest.fixture
def blas(monkeypatch):
    """A 2-core machine whose BLAS runs 2 threads: the rule's count is what the pass sees."""
    lib = FakeBLAS(2)
    monkeypatch.setattr(_threads, "blas_controllers", lambda: (lib,))
    monkeypatch.setattr(_threads, "usable_cores", lambda: 2)
    return lib


def test_a_small_pass_lowers_blas_to_one_thread_and_restores_it(blas):
    with blas_threads_for(14):
        assert blas.num_threads == 1
    assert blas.num_threads == 2 and blas.set_to == [1, 2]


def test_a_large_pass_leaves_blas_as_it_is(blas):
    with blas_threads_for(512):
        assert blas.num_threads == 2
    assert blas.set_to == []                            # not even set to the same count


def test_the_scope_never_raises_blas_threads(blas):
    blas.num_threads = 1                                # a command pinned BLAS to one thread
    with blas_threads_for(4096):
        assert blas.num_threads == 1
    assert blas.set_to == []


def test_the_scope_restores_blas_when_the_pass_fails(blas):
    with pytest.raises(RuntimeError):
        with blas_threads_for(14):
            raise RuntimeError("a failed pass")
    assert blas.num_threads == 2


def test_nested_scopes_keep_the_outer_count(blas):
    with blas_threads_for(14):
        with blas_threads_for(4096):
            assert blas.num_threads == 1
        assert blas.num_threads == 1
    assert blas.num_threads == 2


def small_model(**kw) -> Transformer:
    att = AttentionConfig(d_model=16, n_heads=2, d_head=8, n_ctx=600, positions=RoPE(10000.0))
    cfg = ModelConfig(vocab_size=11, n_layers=2, attention=att, d_mlp=24, activation="silu", mlp="gated",
                      norm=RMSNorm, tied_embeddings=True, **kw)
    return Transformer.init(cfg, rng=np.random.default_rng(0), dtype=np.float32)


def threads_seen(blas, name="blocks.1.hook_resid_pre"):
    """A hook recording BLAS's thread count inside a pass, and the list it records into."""
    seen = []
    return {name: lambda x, _: seen.append(blas.num_threads)}, seen


@pytest.mark.parametrize("shape, threads", [((14,), 1), ((9, 14), 1), ((256,), 2), ((2, 300), 2)])
def test_a_forward_pass_runs_on_the_rules_threads_for_its_rows(blas, shape, threads):
    model = small_model()
    hooks, seen = threads_seen(blas)
    ids = np.arange(np.prod(shape)).reshape(shape) % 11
    forward(model, ids, hooks=hooks)
    assert seen == [threads] and blas.num_threads == 2
    seen.clear()
    out = forward(model, ids[..., :1], caches=new_caches(model, 4, batch_shape=shape[:-1]), hooks=hooks)
    assert seen == [1] and out.logits.shape[-2] == 1    # a decode step: B rows


def test_a_sweeps_pass_counts_every_stacked_run(blas):
    model = small_model()
    hooks, seen = threads_seen(blas)
    resid = np.zeros((9, 14, 16), np.float32)           # (K, n, d_model) 126 rows
    forward_from(model, resid, 1, hooks=hooks)
    resid = np.zeros((20, 14, 16), np.float32)          # 280 rows
    forward_from(model, resid, 1, hooks=hooks)
    assert seen == [1, 2] and blas.num_threads == 2


def test_grads_backward_runs_on_the_forwards_threads(blas, monkeypatch):
    from attnlab.stack import backward as backward_module
    model = small_model()
    seen, real = [], backward_module.backward
    monkeypatch.setattr(backward_module, "backward", lambda *a, **k: (seen.append(blas.num_threads), real(*a, **k))[1])
    grad(model, np.arange(14) % 11, logit_difference(3, 5))
    assert seen == [1] and blas.num_threads == 2


def test_blas_threads_change_no_bit():
    """What lets the rule change threads freely: BLAS splits rows and columns over its threads, never the sums."""
    limiter = _threads.blas_limiter()
    if limiter is None or not _threads.blas_controllers():
        pytest.skip("threadpoolctl (or a BLAS it sees) is not installed")
    rng = np.random.default_rng(1)
    for rows, d_in, d_out in [(1, 576, 3072), (14, 1536, 576), (512, 576, 960), (300, 64, 49)]:
        x, w = rng.standard_normal((rows, d_in), dtype=np.float32), rng.standard_normal((d_in, d_out), dtype=np.float32)
        with limiter.limit(limits=1, user_api="blas"):
            one = x @ w
        with limiter.limit(limits=2, user_api="blas"):
            two = x @ w
        np.testing.assert_array_equal(one, two)


# ----------------------------------------------------------------------------------------------------------------
# (b) a batch's rows as one 2-D product


class Recorded(np.ndarray):
    """A weight that records the shape of each left operand it is multiplied with."""
    calls: list

    def __array_ufunc__(self, ufunc, method, *inputs, **kw):
        if ufunc is np.matmul:
            Recorded.calls.append(inputs[0].shape)
        return getattr(ufunc, method)(*(np.asarray(i) for i in inputs), **kw)


def recorded(w: np.ndarray) -> Recorded:
    Recorded.calls = []
    return w.view(Recorded)


def test_merges_rows_only_where_each_batch_rows_product_takes_blas_blocked_kernel():
    assert merges_rows(14, 576, 3072) and merges_rows(4, 576, 576) and merges_rows(2, 1536, 576)
    assert not merges_rows(1, 576, 49152)                           # a decode step's row: the matrix-vector kernel
    assert not merges_rows(3, 576, 576)                             # 995,328 multiply-adds: the small-matrix kernel
    assert 3 * 576 * 576 <= SMALL_PRODUCT_MACS < 4 * 576 * 576


def test_a_batch_is_one_2d_product_with_each_rows_bits(rng):
    x = rng.standard_normal((9, 14, 576), dtype=np.float32)        # (K, n, d_model) a sweep's stacked runs
    w = recorded(rng.standard_normal((576, 3072), dtype=np.float32))
    y = linear(x, w)
    assert Recorded.calls == [(126, 576)]                           # one product, 9 · 14 rows
    assert type(y) is np.ndarray and y.shape == (9, 14, 3072)
    for k in range(9):
        np.testing.assert_array_equal(y[k], np.asarray(x[k] @ w))  # each run's rows: its own product's bits


@pytest.mark.parametrize("shape, d_in, d_out", [((9, 1, 576), 576, 3072),   # a batch's decode step
                                                ((4, 3, 576), 576, 576),    # small products
                                                ((3, 5, 24), 24, 16)])      # a small model
def test_products_that_might_change_bits_stay_one_per_batch_row(rng, shape, d_in, d_out):
    x = rng.standard_normal(shape, dtype=np.float32)
    w = recorded(rng.standard_normal((d_in, d_out), dtype=np.float32))
    y = linear(x, w)
    assert Recorded.calls == [shape]                                # numpy's own batched call, as before
    for k in range(shape[0]):
        np.testing.assert_array_equal(y[k], np.asarray(x[k] @ w))


def test_2d_inputs_and_quantized_weights_pass_through(rng):
    x = rng.standard_normal((14, 576), dtype=np.float32)
    w = recorded(rng.standard_normal((576, 960), dtype=np.float32))
    linear(x, w)
    assert Recorded.calls == [(14, 576)]

    class Quantized:                                                # numpy hands x @ w to w.__rmatmul__
        __array_ufunc__ = None
        shape = (576, 960)

        def __rmatmul__(self, x):
            return ("own", x.shape)
    assert linear(rng.standard_normal((9, 14, 576), dtype=np.float32), Quantized()) == ("own", (9, 14, 576))


def test_the_mlps_multiply_a_batch_as_one_product(rng):
    x = rng.standard_normal((9, 14, 576), dtype=np.float32)
    W_out = recorded(rng.standard_normal((1536, 576), dtype=np.float32))
    gated = GatedMLP(rng.standard_normal((576, 1536), dtype=np.float32),
                     rng.standard_normal((576, 1536), dtype=np.float32), W_out, "silu")
    assert gated.W_out is W_out                                     # kept as given (its layout already "C")
    y = gated(x)
    assert Recorded.calls == [(126, 1536)]
    np.testing.assert_array_equal(y[4], gated(x[4]))
    W_in = recorded(rng.standard_normal((576, 1536), dtype=np.float32))
    plain = MLP(W_in, np.zeros(1536, np.float32), rng.standard_normal((1536, 576), dtype=np.float32),
                np.zeros(576, np.float32), "gelu_new")
    y = plain(x)
    assert Recorded.calls == [(126, 576)]
    np.testing.assert_array_equal(y[2], plain(x[2]))


def smollm2_layer(n_layers: int = 1) -> Transformer:
    """SmolLM2-135M's shapes (9 heads of 64, 3 KV heads, d_mlp 1536, RoPE, RMSNorm, gated, tied), a small vocabulary."""
    att = AttentionConfig(d_model=576, n_heads=9, n_kv_heads=3, d_head=64, n_ctx=64, positions=RoPE(100000.0))
    cfg = ModelConfig(vocab_size=37, n_layers=n_layers, attention=att, d_mlp=1536, activation="silu", mlp="gated",
                      norm=RMSNorm, norm_eps=1e-5, tied_embeddings=True)
    return Transformer.init(cfg, rng=np.random.default_rng(2), dtype=np.float32)


def test_a_tokens_output_does_not_depend_on_its_batch():
    """Nine 14-token prompts in one pass, each equal bit for bit to its pass alone: activations and logits."""
    model = smollm2_layer(2)
    ids = np.random.default_rng(3).integers(0, 37, (9, 14))
    batch = forward(model, ids)
    for k in range(9):
        alone = forward(model, ids[k])
        np.testing.assert_array_equal(batch.logits[k], alone.logits)
        for a, b in zip(batch.hidden_states, alone.hidden_states):
            np.testing.assert_array_equal(a[k], b)


def test_a_sweeps_stacked_runs_equal_each_run_alone():
    model = smollm2_layer(2)
    resid = np.random.default_rng(4).standard_normal((6, 14, 576)).astype(np.float32)   # (K, n, d_model)
    together = forward_from(model, resid, 1, logits_to_keep=1).logits                   # (K, 1, vocab)
    for k in range(6):
        np.testing.assert_array_equal(together[k], forward_from(model, resid[k], 1, logits_to_keep=1).logits)
