"""RoPE's scalings as objects: YaRN (with its attention factor) and NTK-aware against transformers' rope init
functions (transformers.modeling_rope_utils) within 1e-6, the dict and object spellings alike, and the
rotation with an attention factor differentiated as its transpose."""

import numpy as np
import pytest

from attnlab.layer.positions import (ROPE_SCALINGS, NTKScaling, RoPE, YaRN, rope, rope_attention_factor,
                                     rope_frequencies, rope_scaling, scheme_from_json)

YARNS = [dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64),
         dict(rope_type="yarn", factor=32.0, original_max_position_embeddings=4096, beta_fast=32.0, beta_slow=1.0,
              truncate=False),                                       # gpt-oss's
         dict(rope_type="yarn", factor=40.0, original_max_position_embeddings=4096, mscale=1.0, mscale_all_dim=1.0),
         dict(rope_type="yarn", factor=40.0, original_max_position_embeddings=4096, mscale=0.707, mscale_all_dim=1.0),
         dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=2048, attention_factor=1.5),
         dict(rope_type="yarn", factor=2.0, original_max_position_embeddings=32, beta_fast=8.0, beta_slow=2.0)]


def _transformers_init(kind, params, d_head, theta, max_positions, seq_len=None):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = transformers.LlamaConfig(hidden_size=2 * d_head, num_attention_heads=2, head_dim=d_head,
                                   max_position_embeddings=max_positions, rope_parameters=dict(params, rope_theta=theta))
    with torch.no_grad():
        inv_freq, factor = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu", seq_len=seq_len)
    return inv_freq.double().numpy(), float(factor)


@pytest.mark.parametrize("params", YARNS)
@pytest.mark.parametrize("d_head,theta", [(32, 10000.0), (64, 150000.0), (16, 1e6)])
def test_yarn_against_transformers(params, d_head, theta):
    want, factor = _transformers_init("yarn", params, d_head, theta,
                                      int(params["original_max_position_embeddings"] * params["factor"]))
    for spelling in (params, rope_scaling(params), YaRN(**{k: v for k, v in params.items() if k != "rope_type"})):
        np.testing.assert_allclose(rope_frequencies(d_head, theta, spelling), want, rtol=1e-6, atol=0)
        assert rope_attention_factor(spelling) == pytest.approx(factor, rel=1e-12)


@pytest.mark.parametrize("seq_len", [None, 100, 256, 257, 1000, 5000])
@pytest.mark.parametrize("d_head", [8, 32, 128])
def test_ntk_against_transformers_dynamic_at_a_fixed_length(seq_len, d_head):
    want, factor = _transformers_init("dynamic", dict(rope_type="dynamic", factor=4.0), d_head, 10000.0, 256, seq_len)
    got = rope_frequencies(d_head, 10000.0, NTKScaling(factor=4.0, max_position_embeddings=256, seq_len=seq_len))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
    assert factor == 1.0 == rope_attention_factor(NTKScaling(4.0, 256, seq_len))
    if seq_len is None or seq_len <= 256:                       # within the trained context: plain RoPE
        np.testing.assert_array_equal(got, rope_frequencies(d_head, 10000.0))


def test_yarn_by_hand():
    """factor 4 over 64 trained positions, d 8, base 10,000: pair i turns 64·θ_i/2π times; pairs 0 (≈10 turns)
    sit inside the ramp's low end (floor 0 … ceil 2), so the ramp is (i − 0)/(2 − 0) = 0, ½, 1, 1."""
    y = YaRN(factor=4.0, original_max_position_embeddings=64, beta_fast=8, beta_slow=1)
    freq = 10000.0 ** (-np.arange(0, 8, 2) / 8)
    ramp = np.array([0.0, 0.5, 1.0, 1.0])
    low = 8 * np.log(64 / (8 * 2 * np.pi)) / (2 * np.log(10000.0))   # 0.018…: floor 0
    high = 8 * np.log(64 / (1 * 2 * np.pi)) / (2 * np.log(10000.0))  # 1.008…: ceil 2
    assert (np.floor(low), np.ceil(high)) == (0, 2)
    np.testing.assert_allclose(y.frequencies(8, 10000.0), freq * (1 - ramp) + freq / 4 * ramp, rtol=1e-15)
    assert y.attention_factor == pytest.approx(0.1 * np.log(4) + 1)


def test_the_scalings_are_objects_and_round_trip_through_json():
    assert set(ROPE_SCALINGS) == {"linear", "llama3", "factors", "yarn", "dynamic"}
    y = YaRN(factor=4.0, original_max_position_embeddings=64)
    by_object, by_dict = RoPE(1e4, scaling=y), RoPE(1e4, scaling=y.to_dict())
    assert by_object == by_dict and rope_scaling(by_object.scaling) == y
    assert scheme_from_json(by_object.to_json()) == by_object
    n = RoPE(1e4, scaling=NTKScaling(2.0, 128, 512))
    assert scheme_from_json(n.to_json()) == n
    with pytest.raises(ValueError, match="scaling rope_type must be one of"):
        RoPE(scaling={"rope_type": "longrope", "factor": 2.0})
    with pytest.raises(ValueError, match="scaling 'yarn' takes"):
        RoPE(scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8, "beta": 3})
    with pytest.raises(ValueError, match="yarn factor"):
        YaRN(factor=-1.0, original_max_position_embeddings=8)


def test_yarn_rotation_scales_by_its_factor_and_its_backward_is_the_transpose(rng):
    y = YaRN(factor=4.0, original_max_position_embeddings=16)
    x, g = rng.normal(size=(2, 3, 10, 8)), rng.normal(size=(2, 3, 10, 8))
    turned = rope(x, start=5, scaling=y)
    np.testing.assert_allclose(np.linalg.norm(turned, axis=-1), y.attention_factor * np.linalg.norm(x, axis=-1),
                               rtol=1e-12)
    # <R_m x, g> = <x, R_mᵀ g>: inverse=True is the backward, at given positions too
    back = rope(g, start=5, scaling=y, inverse=True)
    assert np.sum(turned * g) == pytest.approx(np.sum(x * back), rel=1e-12)
    pos = rng.integers(0, 30, size=(2, 1, 10))
    assert np.sum(rope(x, scaling=y, positions=pos) * g) == pytest.approx(
        np.sum(x * rope(g, scaling=y, positions=pos, inverse=True)), rel=1e-12)
    np.testing.assert_allclose(rope(x, start=3, scaling=y), rope(x, scaling=y, positions=np.arange(3, 13)), rtol=1e-12)
