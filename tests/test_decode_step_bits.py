"""A decode step's fixed cost cut without changing a bit (issue 33, part 3).

`forward` chooses each attention path once per pass (`attnlab.kernels._step.one_step`) and skips the hook
calls when nothing listens. The reference here is the slow way, as the pass ran before: a hook that listens at
every block (so every point is called) and no step scope (so every layer asks `choose_path` again, reading the
environment each time). The logits of each decode step must be equal bit for bit, on every block kind and
option of test_one_forward, in float32 and float64, on both decode kernels.
"""

import contextlib

import numpy as np
import pytest

from attnlab.kernels import _kernels, _step, quantized
from attnlab.kernels import attention as attention_module
from attnlab.layer.positions import RoPE
from attnlab.stack import transformer as transformer_module
from attnlab.stack.layers import RMSNorm
from attnlab.stack.transformer import forward, new_caches

from _decoders import OPTIONS as ONE_FORWARD, V, attn, random_model

# the decoders of test_one_forward's options, and SmolLM2's structure (grouped heads, RoPE, RMSNorm, gated MLP)
OPTIONS = {name: o for name, o in ONE_FORWARD.items() if o.get("is_causal", True)} | {
    "smollm2": dict(attention=attn(d_model=24, n_heads=3, n_kv_heads=1, d_head=8, positions=RoPE(100000.0)),
                    d_mlp=16, activation="silu", mlp="gated", norm=RMSNorm, norm_eps=1e-5, tied_embeddings=True),
}
DECODERS = list(OPTIONS)
KERNELS = ["numpy", "fused"] if _kernels.numba_installed() else ["numpy"]


def model_of(option, dtype):
    return random_model(OPTIONS[option], np.random.default_rng(3), dtype=dtype)


def decode_logits(model, *, slow: bool, steps: int = 3) -> list:
    """Each decode step's logits after a 5-token prompt; ``slow``: hooks listening at every block's input and
    no step scope."""
    hooks = {f"blocks.{i}.hook_resid_pre": (lambda a, name: None) for i in range(model.config.n_layers)}
    caches = new_caches(model, 5 + steps)
    out = []
    forward(model, np.arange(5) % V, caches=caches, hooks=hooks if slow else None)
    for s in range(steps):
        out.append(forward(model, np.array([(2 + 3 * s) % V]), caches=caches, hooks=hooks if slow else None).logits)
    return out


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("option", DECODERS)
def test_decode_step_equals_the_slow_way_bit_for_bit(option, dtype, kernel, monkeypatch):
    monkeypatch.setenv(_kernels.KERNEL_ENV, kernel)
    model = model_of(option, dtype)
    fast = decode_logits(model, slow=False)
    monkeypatch.setattr(transformer_module, "one_step", contextlib.nullcontext)   # every layer chooses again
    slow = decode_logits(model, slow=True)
    for a, b in zip(fast, slow):
        assert a.dtype == b.dtype == dtype
        np.testing.assert_array_equal(a, b)


def counting_choices(monkeypatch) -> list:
    asked = []
    choose = attention_module.choose_path

    def counted(c, **kw):
        path = choose(c, **kw)
        asked.append(path)
        return path
    monkeypatch.setattr(attention_module, "choose_path", counted)
    return asked


def test_a_decode_step_chooses_its_path_once_not_per_layer(monkeypatch):
    model = model_of("gqa", np.float32)
    asked = counting_choices(monkeypatch)
    caches = new_caches(model, 8)
    forward(model, np.arange(5), caches=caches)
    assert len(asked) == 1 and asked[0].name == "naive"          # the prompt: 3 layers, one choice
    forward(model, np.array([1]), caches=caches)
    assert len(asked) == 2 and asked[1].name == "decode"         # the step: 3 layers, one choice


@pytest.mark.skipif(not _kernels.numba_installed(), reason="numba is not installed")
def test_the_environment_still_counts_between_steps(monkeypatch):
    """ATTNLAB_KERNEL and ATTNLAB_NO_NUMBA are read once per step, so a change between steps takes effect."""
    model = model_of("gqa", np.float32)
    asked = counting_choices(monkeypatch)
    caches = new_caches(model, 8)
    forward(model, np.arange(5), caches=caches)
    monkeypatch.setenv(_kernels.KERNEL_ENV, "fused")
    forward(model, np.array([1]), caches=caches)
    monkeypatch.setenv(_kernels.NO_NUMBA_ENV, "1")
    forward(model, np.array([2]), caches=caches)
    assert [p.kernel for p in asked[1:]] == ["fused", "numpy"]


def test_one_step_scopes_nest_and_end():
    assert _step.answers() is None
    with _step.one_step():
        outer = _step.answers()
        with _step.one_step():
            assert _step.answers() is outer             # the inner pass shares the outer's answers
        assert _step.answers() is outer
    assert _step.answers() is None


@pytest.mark.skipif(not _kernels.numba_installed(), reason="numba is not installed")
def test_the_quantized_kernel_is_chosen_once_per_step(monkeypatch):
    monkeypatch.delenv(_kernels.NO_NUMBA_ENV, raising=False)
    with _step.one_step():
        first = quantized.product_kernel()
        monkeypatch.setenv(_kernels.NO_NUMBA_ENV, "1")
        assert quantized.product_kernel() is first       # the step's answer, the environment read once
    assert first[0] is not None and first[1] >= 1
    assert quantized.product_kernel() == (None, None)    # the next step reads it again
