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
from attnlab.layer.config import AttentionConfig
from attnlab.layer.positions import ALiBi, Learned, RoPE, Sinusoidal
from attnlab.stack import transformer as transformer_module
from attnlab.stack.blocks import ParallelBlock, PostNormBlock, SandwichBlock
from attnlab.stack.layers import LayerNorm, RMSNorm
from attnlab.stack.transformer import ModelConfig, Transformer, forward, new_caches

V = 13


def attn(**kw):
    return AttentionConfig(**{"d_model": 8, "n_heads": 2, "n_ctx": 12, **kw})


BASE = dict(d_mlp=12, activation="gelu_new", norm=LayerNorm)
# the decoders of test_one_forward's options, and SmolLM2's structure (grouped heads, RoPE, RMSNorm, gated MLP)
OPTIONS = {
    "plain": dict(BASE, attention=attn()),
    "embed_scale": dict(BASE, attention=attn(), embed_scale=4.0),
    "logit_softcap": dict(BASE, attention=attn(), logit_softcap=2.5),
    "softcap": dict(BASE, attention=attn(softcap=1.5)),
    "scale": dict(BASE, attention=attn(scale=0.7)),
    "window": dict(BASE, attention=attn(window=2)),
    "layers": dict(BASE, attention=attn(), layers=(attn(window=2, softcap=1.5), attn(scale=0.5), attn())),
    "post_norm": dict(BASE, attention=attn(), block=PostNormBlock),
    "parallel": dict(BASE, attention=attn(positions=RoPE()), block=ParallelBlock),
    "sandwich": dict(BASE, attention=attn(positions=RoPE()), block=SandwichBlock),
    "rotary_dim": dict(BASE, attention=attn(positions=RoPE(theta=50.0, rotary_dim=2))),
    "alibi": dict(BASE, attention=attn(positions=ALiBi())),
    "learned": dict(BASE, attention=attn(positions=Learned())),
    "sinusoidal": dict(BASE, attention=attn(positions=Sinusoidal())),
    "no_norms": dict(attention=attn(), d_mlp=12),
    "attention_only": dict(attention=attn()),
    "gqa": dict(BASE, attention=attn(n_heads=4, n_kv_heads=2, d_head=2, positions=RoPE())),
    "smollm2": dict(attention=attn(d_model=24, n_heads=3, n_kv_heads=1, d_head=8, positions=RoPE(100000.0)),
                    d_mlp=16, activation="silu", mlp="gated", norm=RMSNorm, norm_eps=1e-5, tied_embeddings=True),
}
DECODERS = list(OPTIONS)
KERNELS = ["numpy", "fused"] if _kernels.numba_installed() else ["numpy"]


def model_of(option, dtype):
    rng = np.random.default_rng(3)
    model = Transformer.init(ModelConfig(vocab_size=V, n_layers=3, **OPTIONS[option]), rng=rng, std=0.4, dtype=dtype)
    for name, p in model.params().items():
        if name.endswith(("weight", "bias")) or ".b_" in name or name == "b_U":
            p[...] = name.endswith("weight") + rng.normal(0, 0.3, p.shape)
    return model


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
