"""The fused one-token kernels of a decode step (attnlab.kernels._step_fused, attnlab.stack.decode_step; issue 33,
part 3): each kernel against numpy and float64 references, the sum's written order, the rotation and the cache
append bit for bit with numpy's, a failed step leaving the cache as it was, the fused step against the numpy one
and against a prompt's forward, the rule, and the calls a layer saves (counted, never timed)."""

import numpy as np
import pytest

pytest.importorskip("numba")

from attnlab.cli.bench_harness import Decoder                            # noqa: E402
from attnlab.cli.bench_model import decode_calls                          # noqa: E402
from attnlab.kernels import _kernels                                      # noqa: E402
from attnlab.kernels import _step_fused as F                              # noqa: E402
from attnlab.layer.hookpoints import NO_HOOKS                             # noqa: E402
from attnlab.layer.positions import Learned, RoPE                         # noqa: E402
from attnlab.stack import blocks as blocks_module                         # noqa: E402
from attnlab.stack.layers import RMSNorm, rms_norm, silu                  # noqa: E402
from attnlab.stack.transformer import forward, new_caches                 # noqa: E402

from _decoders import attn, random_model                                  # noqa: E402

SMOLLM2 = dict(attention=attn(d_model=24, n_heads=3, n_kv_heads=1, d_head=8, n_ctx=32, positions=RoPE(100000.0)),
               d_mlp=16, activation="silu", mlp="gated", norm=RMSNorm, norm_eps=1e-5, tied_embeddings=True)
LEARNED = dict(SMOLLM2, attention=attn(d_model=24, n_heads=3, n_kv_heads=1, d_head=8, n_ctx=32,
                                       positions=Learned()))
f32 = np.float32


@pytest.fixture
def fused(monkeypatch):
    monkeypatch.delenv(_kernels.NO_NUMBA_ENV, raising=False)
    monkeypatch.setenv(_kernels.KERNEL_ENV, "fused")


def test_exp_is_within_two_ulp_of_float64():
    x = np.concatenate([np.linspace(-87, 88, 20001), [0.0, -1e-8, 1e-8, 1.0, -1.0]]).astype(f32)
    got = np.array([F.exp_f32(v) for v in x], f32)
    want = np.exp(x.astype(np.float64))
    ulp = np.spacing(want.astype(f32)).astype(np.float64)
    assert np.max(np.abs(got - want) / ulp) <= 2.0
    assert F.exp_f32(f32(0.0)) == 1.0                         # by hand: e^0 = 2^0 · (0 + 0 + 1)


def test_silu_mul_against_float64_and_at_the_ends():
    rng = np.random.default_rng(0)
    g = (rng.standard_normal((1, 300)) * 6).astype(f32)
    g[0, :6] = [-200.0, -88.5, -60.0, 0.0, 90.0, 200.0]        # e^(-g) overflows, is huge, 1, tiny, 0
    u = rng.standard_normal((1, 300)).astype(f32)
    out = np.empty_like(g)
    F.silu_mul_rows(g, u, out)
    g64 = g.astype(np.float64)
    want = g64 / (1 + np.exp(-g64)) * u
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-30)
    assert out[0, 0] == 0 and out[0, 5] == g[0, 5] * u[0, 5]  # silu(-200) = -0, silu(200) = 200
    np.testing.assert_allclose(out, silu(g) * u, rtol=1e-6, atol=1e-30)   # numpy's own silu, to its last bits
    both = np.concatenate([g, u], axis=1)                      # (1, 600) gate | up, as the fused step has them
    out2 = np.empty_like(g)
    F.swiglu_row(both, out2)
    np.testing.assert_array_equal(out2, out)                   # the same inner function: the same bits


def lane_order_sum_squares(x: np.ndarray) -> np.float32:
    """The 16-lane order written in sum_squares, step by step in float32 scalars."""
    lanes = [f32(0.0)] * 16
    n, j = len(x), 0
    while j + 16 <= n:
        lanes = [lanes[i] + x[j + i] * x[j + i] for i in range(16)]
        j += 16
    for t in range(j, n):
        lanes[0] = lanes[0] + x[t] * x[t]
    a, b = lanes[:8], lanes[8:]
    tree = lambda l: ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))   # noqa: E731
    return tree(a) + tree(b)


@pytest.mark.parametrize("d", [1, 5, 16, 24, 37, 576])
def test_the_sum_of_squares_is_in_its_written_order(d):
    x = np.random.default_rng(d).standard_normal(d).astype(f32)
    scale = np.empty((1, 1), f32)
    F.rms_scale_rows(x[None], f32(1 / d), f32(1e-5), scale)
    want = np.sqrt(lane_order_sum_squares(x) * f32(1 / d) + f32(1e-5))
    assert scale[0, 0] == want                                 # bit for bit
    assert scale[0, 0] == pytest.approx(np.sqrt(np.mean(x.astype(np.float64) ** 2) + 1e-5), rel=1e-6)


def test_rms_norm_on_one_row_is_the_hooked_path_and_float64():
    x = np.array([[3.0, 4.0]], f32)                            # by hand: rms of (3, 4) is √12.5
    np.testing.assert_allclose(rms_norm(x, np.ones(2, f32), 0.0), [[0.8485281, 1.1313709]], rtol=1e-6)
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((1, 576)).astype(f32), rng.standard_normal(576).astype(f32)
    out = np.empty_like(x)
    F.rms_norm_rows(x, w, f32(1 / 576), f32(1e-5), out)
    scale = np.empty((1, 1), f32)
    F.rms_scale_rows(x, f32(1 / 576), f32(1e-5), scale)
    np.testing.assert_array_equal(out, (x / scale) * w)        # the hooked path's numpy ops on the kernel's divisor
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(out, x64 / np.sqrt((x64 ** 2).mean() + 1e-5) * w, rtol=2e-6)


@pytest.mark.parametrize("rotate", [True, False])
def test_bias_rotation_and_append_are_numpys_bits(rotate):
    rng = np.random.default_rng(2)
    h, h_kv, d, pos = 6, 2, 8, 3
    qkv = rng.standard_normal((1, (h + 2 * h_kv) * d)).astype(f32)
    b = rng.standard_normal((h + 2 * h_kv) * d).astype(f32)
    rope = RoPE(1000.0)
    heads = (qkv + b).reshape(1, h + 2 * h_kv, d).swapaxes(0, 1)            # (h + 2·h_kv, 1, d) numpy's way
    qk = rope.rotate(heads[:h + h_kv], start=pos) if rotate else heads[:h + h_kv]
    cos, sin = rope.turns(d, pos) if rotate else (np.zeros((1, 1, 2), f32),) * 2
    q = np.empty((h, 1, d), f32)
    k_buf, v_buf = np.zeros((h_kv, 5, d), f32), np.zeros((h_kv, 5, d), f32)
    q_max, k_max, v_max, finite = F.qkv_rope_append(qkv, b, cos, sin, rotate, q, k_buf, v_buf, pos)
    assert finite
    np.testing.assert_array_equal(q, qk[:h])
    np.testing.assert_array_equal(k_buf[:, pos:pos + 1], qk[h:])
    np.testing.assert_array_equal(v_buf[:, pos:pos + 1], heads[h + h_kv:])
    assert not k_buf[:, :pos].any() and not k_buf[:, pos + 1:].any()        # only position pos written
    assert (q_max, k_max, v_max) == (np.abs(qk[:h]).max(), np.abs(qk[h:]).max(), np.abs(heads[h + h_kv:]).max())
    qkv[0, -1] = np.nan                                                     # a value that may not enter the cache
    k_buf[:], v_buf[:] = 0, 0
    assert F.qkv_rope_append(qkv, b, cos, sin, rotate, q, k_buf, v_buf, pos)[3] is False
    assert not k_buf.any() and not v_buf.any()                              # nothing written


@pytest.mark.parametrize("rotate, scaling", [(True, None), (False, None),
                                             (True, {"rope_type": "yarn", "factor": 4.0,
                                                     "original_max_position_embeddings": 8})])
def test_a_prompts_bias_and_rotation_are_numpys_bits(rotate, scaling):
    """qkv_rope_rows (a prefill's q, k, v) against numpy's ``qkv + b`` then ``rope`` on the head views, rows at
    positions 5 … 5 + n − 1 (a prompt after 5 cached tokens), with values where the last bits show; with YaRN's
    scaling too (its attention factor rides on both tables)."""
    rng = np.random.default_rng(4)
    n, h, h_kv, d, start = 11, 6, 2, 8, 5
    qkv = (rng.standard_normal((n, (h + 2 * h_kv) * d)) * 7).astype(f32)
    b = rng.standard_normal((h + 2 * h_kv) * d).astype(f32)
    rope = RoPE(1000.0, scaling=scaling)
    heads = (qkv + b).reshape(n, h + 2 * h_kv, d).swapaxes(0, 1)            # (h + 2·h_kv, n, d) numpy's way
    qk = rope.rotate(heads[:h + h_kv], start=start) if rotate else heads[:h + h_kv]
    cos, sin = rope.turns(d, start, n) if rotate else (np.zeros((1, 1, 2), f32),) * 2
    q, k, v = np.empty((h, n, d), f32), np.empty((h_kv, n, d), f32), np.empty((h_kv, n, d), f32)
    F.qkv_rope_rows(qkv, b, cos, sin, rotate, q, k, v)
    np.testing.assert_array_equal(q.view(np.int32), np.ascontiguousarray(qk[:h]).view(np.int32))
    np.testing.assert_array_equal(k.view(np.int32), np.ascontiguousarray(qk[h:]).view(np.int32))
    np.testing.assert_array_equal(v.view(np.int32), np.ascontiguousarray(heads[h + h_kv:]).view(np.int32))
    if rotate and scaling is None:                                          # by hand: pair (1, 0) at angle pos·θ_0
        one = np.zeros((2, (h + 2 * h_kv) * d), f32)
        one[:, 0] = 1
        q1 = np.empty((h, 2, d), f32)
        F.qkv_rope_rows(one, np.zeros_like(b), *rope.turns(d, 1, 2), True, q1, k[:, :2].copy(), v[:, :2].copy())
        np.testing.assert_allclose(q1[0, :, :2], [[np.cos(1), np.sin(1)], [np.cos(2), np.sin(2)]], rtol=1e-6)


@pytest.mark.parametrize("option", [SMOLLM2, LEARNED], ids=["rope", "learned"])
def test_a_prompts_fused_projection_changes_no_bit(option, fused):
    """A prompt's forward (q, k and v from qkv_rope_rows) against the same forward with hooks looking at q, k and
    v (numpy's bias and rope on the head views): the same logits and the same cache, bit for bit, for a first
    prompt and for a second one after it (RoPE from position 6 on)."""
    model = random_model(option, np.random.default_rng(7), dtype=f32)
    hooks = {f"blocks.{i}.attn.{p}": (lambda a, name: None) for i in range(model.config.n_layers)
             for p in ("hook_q", "hook_k", "hook_v")}
    caches = [new_caches(model, 12) for _ in range(2)]
    for ids in (np.arange(6) % 13, np.array([3, 1, 4, 1, 5])):
        a = forward(model, ids, caches=caches[0]).logits
        b = forward(model, ids, caches=caches[1], hooks=hooks).logits
        np.testing.assert_array_equal(a.view(np.int32), b.view(np.int32))
    for c0, c1 in zip(*caches):
        np.testing.assert_array_equal(c0.keys, c1.keys)
        np.testing.assert_array_equal(c0.values, c1.values)
    out = forward(model, np.arange(7) % 13).logits                          # no cache: the same bits again
    np.testing.assert_array_equal(out, forward(model, np.arange(7) % 13, hooks=hooks).logits)


def steps(model, n_steps=4):
    caches = new_caches(model, 6 + n_steps)
    forward(model, np.arange(6) % 13, caches=caches)
    return [forward(model, np.array([(5 * s + 1) % 13]), caches=caches).logits for s in range(n_steps)]


@pytest.mark.parametrize("option", [SMOLLM2, LEARNED], ids=["rope", "learned"])
def test_the_fused_step_runs_and_agrees_with_numpy_and_a_prompts_forward(option, monkeypatch):
    model = random_model(option, np.random.default_rng(3), dtype=f32)
    taken = []
    real = blocks_module.decode_step
    monkeypatch.setattr(blocks_module, "decode_step", lambda *a, **k: taken.append(real(*a, **k)) or taken[-1])
    monkeypatch.setenv(_kernels.KERNEL_ENV, "numpy")
    numpy_logits = steps(model)
    assert taken == []                                          # the numpy kernel: the block's own lines
    monkeypatch.setenv(_kernels.KERNEL_ENV, "fused")
    fused_logits = steps(model)
    assert len(taken) == 4 * 2 and all(t is not None for t in taken)   # every step, every layer: fused
    for a, b in zip(fused_logits, numpy_logits):                # two float32 roundings: within 1e-5 of the largest
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max())
    ids = np.concatenate([np.arange(6) % 13, [(5 * s + 1) % 13 for s in range(4)]])
    whole = forward(model, ids).logits                          # the prompt's forward, every position at once
    np.testing.assert_allclose(np.concatenate(fused_logits), whole[6:], rtol=0, atol=1e-5 * np.abs(whole).max())


def test_a_failed_fused_step_leaves_the_cache_as_it_was(fused):
    model = random_model(SMOLLM2, np.random.default_rng(4), dtype=f32)
    caches = new_caches(model, 8)
    forward(model, np.arange(5), caches=caches)
    block, cache = model.blocks[0], caches[0]
    before = (cache.k.copy(), cache.v.copy(), cache.length, cache.k_max, cache.v_max)
    x = np.full((1, 24), np.nan, f32)
    with pytest.raises(ValueError, match="must be finite to enter the cache"):
        block.forward(x, NO_HOOKS, is_causal=True, cache=cache)
    np.testing.assert_array_equal(cache.k, before[0])
    np.testing.assert_array_equal(cache.v, before[1])
    assert (cache.length, cache.k_max, cache.v_max) == before[2:]
    full = new_caches(model, 5)                                 # no room: the block's own error, cache unchanged
    forward(model, np.arange(5), caches=full)
    with pytest.raises(ValueError, match="cannot append 1 tokens"):
        forward(model, np.array([1]), caches=full)
    assert all(c.length == 5 for c in full)


def test_the_rule_and_the_environment(monkeypatch):
    monkeypatch.delenv(_kernels.KERNEL_ENV, raising=False)
    monkeypatch.delenv(_kernels.NO_NUMBA_ENV, raising=False)
    assert _kernels.step_kernel_choice() == ("fused", "rule: a one-token pass is a decode step")
    monkeypatch.setenv(_kernels.KERNEL_ENV, "numpy")
    assert _kernels.step_kernel_choice()[0] == "numpy" and _kernels.step_kernels() is None
    monkeypatch.setenv(_kernels.KERNEL_ENV, "fused")
    monkeypatch.setenv(_kernels.NO_NUMBA_ENV, "1")
    assert _kernels.step_kernel_choice() == ("numpy", f"{_kernels.NO_NUMBA_ENV} is set")


def test_the_fused_step_takes_fewer_numpy_calls_a_layer(monkeypatch):
    """cProfile's count of a SmolLM2-shaped step's numpy and numba calls (C functions), per layer: a count, not
    a time."""
    model = random_model(SMOLLM2, np.random.default_rng(5), n_layers=30, dtype=f32)
    monkeypatch.delenv(_kernels.NO_NUMBA_ENV, raising=False)
    monkeypatch.setenv(_kernels.KERNEL_ENV, "numpy")
    numpy_calls = decode_calls(Decoder(model, context=8))["per_layer"]
    monkeypatch.delenv(_kernels.KERNEL_ENV)                     # the rules: the fused step, numpy's attention
    fused_calls = decode_calls(Decoder(model, context=8))["per_layer"]
    assert fused_calls <= numpy_calls / 2, (fused_calls, numpy_calls)


@pytest.mark.parametrize("option", [SMOLLM2, LEARNED], ids=["rope", "learned"])
def test_hooks_that_look_at_every_point_change_no_bit_of_the_fused_step(option, fused):
    """The fused step (no hooks) against the block's own lines with a hook looking at every point of the pass
    (the norms' scales, q, k, v, the rotations, the MLP's gate, linear path and hidden layer, …) but the scores and
    the pattern, which take attention's path through the whole grid."""
    from attnlab.stack.transformer import hook_names

    model = random_model(option, np.random.default_rng(6), dtype=f32)
    seen = []
    hooks = {name: (lambda a, name: seen.append(name)) for name in hook_names(model)
             if not name.endswith(("hook_scores", "hook_pattern"))}
    caches = [new_caches(model, 8) for _ in range(2)]
    for c, h in zip(caches, (None, hooks)):
        forward(model, np.arange(5), caches=c, hooks=h)
    for s in range(3):
        ids = np.array([(4 * s + 3) % 13])
        a = forward(model, ids, caches=caches[0]).logits
        b = forward(model, ids, caches=caches[1], hooks=hooks).logits
        np.testing.assert_array_equal(a, b)
    assert "blocks.1.mlp.hook_post" in seen and "blocks.0.ln_2.hook_scale" in seen


def test_a_rows_norm_and_gated_mlp_bits_do_not_depend_on_the_rows_beside_it(fused):
    """A token alone (a decode step's one row) and the same token among others (a prompt, a batch) get the same
    bits from RMSNorm (hooked or not) and from silu(gate) · up: the kernels run on every float32 row."""
    from attnlab.stack.layers import GatedMLP

    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 7, 576)).astype(f32) * 3                    # (B, n, d_model)
    w = rng.standard_normal(576).astype(f32)
    together = rms_norm(x, w, 1e-5)                                         # (B, n, d_model)
    for b in range(2):
        for t in range(7):
            np.testing.assert_array_equal(rms_norm(x[b, t:t + 1], w, 1e-5), together[b, t:t + 1])
    seen = {}

    def look(name, a):
        seen[name] = a
        return a

    hooked = rms_norm(x, w, 1e-5, hook=look)
    np.testing.assert_array_equal(hooked, together)
    assert seen["hook_scale"].shape == (2, 7, 1)
    np.testing.assert_allclose(together, x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * w,
                               rtol=2e-6, atol=1e-6)
    both = rng.standard_normal((2, 7, 2 * 40)).astype(f32) * 4              # (B, n, 2·d_mlp) a gate|up product
    gate, up = both[..., :40], both[..., 40:]                               # (B, n, d_mlp) views
    mlp = GatedMLP(*(np.zeros(s, f32) for s in [(8, 40), (8, 40), (40, 8)]), activation="silu")
    hidden = mlp.gated(gate, up)                                            # (B, n, d_mlp)
    np.testing.assert_array_equal(mlp.gated(np.ascontiguousarray(gate[1, 3:4]), np.ascontiguousarray(up[1, 3:4])),
                                  hidden[1, 3:4])
    np.testing.assert_allclose(hidden, silu(gate.astype(np.float64)) * up, rtol=1e-6, atol=1e-6)


def test_a_zero_divisor_gives_numpys_nan_not_an_exception(fused, monkeypatch):
    """The kernels use numpy's error model: a zero row with eps = 0 (√0 = 0, then 0 / 0) is nan, as the numpy
    path gives it, where Python's model raised ZeroDivisionError from inside the kernel."""
    x, w = np.zeros((2, 4), f32), np.ones(4, f32)
    got = rms_norm(x, w, 0.0)
    monkeypatch.setenv(_kernels.NO_NUMBA_ENV, "1")
    with np.errstate(invalid="ignore"):
        want = rms_norm(x, w, 0.0)
    assert np.isnan(got).all() and np.isnan(want).all()
