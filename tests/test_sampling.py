"""Sampling the next token: temperature, top-k and top-p from an explicit rng; greedy stays the default; the
one generate streams every id through on_token and continues given caches."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.stack.sampling import next_token_probabilities, sample_next
from attnlab.stack.transformer import ModelConfig, Transformer, generate, new_caches
from attnlab.layer.config import AttentionConfig
from attnlab.layer.positions import RoPE

LOGITS = np.log(np.array([0.05, 0.4, 0.1, 0.25, 0.2]))      # probabilities 0.05, 0.4, 0.1, 0.25, 0.2


def test_top_k_keeps_the_k_most_likely_renormalised():
    p = next_token_probabilities(LOGITS, 1.0, top_k=2)
    np.testing.assert_allclose(p, [0, 0.4 / 0.65, 0, 0.25 / 0.65, 0])


def test_top_p_keeps_the_fewest_that_reach_p():
    # sorted: 0.4, 0.25, 0.2, 0.1, 0.05; the mass before each: 0, 0.4, 0.65, 0.85, 0.95
    np.testing.assert_allclose(next_token_probabilities(LOGITS, 1.0, top_p=0.65), [0, 0.4 / 0.65, 0, 0.25 / 0.65, 0])
    np.testing.assert_allclose(next_token_probabilities(LOGITS, 1.0, top_p=0.66),
                               [0, 0.4 / 0.85, 0, 0.25 / 0.85, 0.2 / 0.85])
    np.testing.assert_allclose(next_token_probabilities(LOGITS, 1.0, top_p=0.01), [0, 1, 0, 0, 0])


def test_temperature_then_top_k_then_top_p():
    t = 0.5                                                   # p ∝ p₀²: 0.0025, 0.16, 0.01, 0.0625, 0.04
    q = np.array([0.0025, 0.16, 0.01, 0.0625, 0.04])
    q3 = np.where(np.isin(np.arange(5), [1, 3, 4]), q, 0) / (0.16 + 0.0625 + 0.04)
    np.testing.assert_allclose(next_token_probabilities(LOGITS, t, top_k=3), q3)
    p = next_token_probabilities(LOGITS, t, top_k=3, top_p=0.7)   # q3: 0.610, 0.238, 0.152 -> the first two
    np.testing.assert_allclose(p, [0, 0.16 / 0.2225, 0, 0.0625 / 0.2225, 0])


def test_draws_follow_the_cut_distribution_and_the_seed():
    draws = [sample_next(LOGITS, 1.0, np.random.default_rng(s), top_k=2) for s in range(2000)]
    assert set(draws) == {1, 3}
    assert abs(np.mean(np.array(draws) == 1) - 0.4 / 0.65) < 0.04
    a = [sample_next(LOGITS, 0.8, rng, top_p=0.9) for rng in [np.random.default_rng(7)] for _ in range(50)]
    b = [sample_next(LOGITS, 0.8, rng, top_p=0.9) for rng in [np.random.default_rng(7)] for _ in range(50)]
    assert a == b


def test_greedy_ignores_the_cuts_and_bad_values_are_named():
    assert sample_next(LOGITS) == 1 and sample_next(LOGITS, 0.0, top_k=3, top_p=0.1) == 1
    rng = np.random.default_rng(0)
    for kwargs, message in (({"top_k": 0}, "top_k must be"), ({"top_k": 6}, "top_k must be"),
                            ({"top_p": 0.0}, "top_p must be"), ({"top_p": 1.5}, "top_p must be"),
                            ({"top_k": True}, "top_k must be")):
        with pytest.raises(ValueError, match=message):
            sample_next(LOGITS, 1.0, rng, **kwargs)


def tiny_decoder() -> Transformer:
    a = AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2, d_head=4, n_ctx=64, positions=RoPE())
    return Transformer.init(ModelConfig(vocab_size=20, n_layers=2, attention=a, d_mlp=24), rng=np.random.default_rng(0),
                            std=0.5)


def test_on_token_streams_exactly_the_returned_ids():
    model, seen = tiny_decoder(), []
    out = generate(model, [1, 2, 3], 12, temperature=1.0, top_k=5, rng=np.random.default_rng(3), on_token=seen.append)
    assert seen == out.tolist() and len(set(seen)) > 2
    again = generate(model, [1, 2, 3], 12, temperature=1.0, top_k=5, rng=np.random.default_rng(3))
    assert again.tolist() == out.tolist()


def test_generate_continues_given_caches_as_one_run_would():
    model = tiny_decoder()
    whole = generate(model, [1, 2, 3, 4, 5], 6)
    caches = new_caches(model, 32)
    first = generate(model, [1, 2, 3], 1, caches=caches)      # caches now hold 1, 2, 3; first[-1] is pending
    rest = generate(model, [first[-1], 4, 5], 6, caches=caches)
    assert generate(model, [1, 2, 3], 1).tolist() == first.tolist()
    assert rest.tolist() == generate(model, [1, 2, 3, int(first[-1]), 4, 5], 6).tolist()
    assert caches[0].length == 3 + 3 + 5 and whole.size == 6
    with pytest.raises(ValueError, match="capacity 32"):
        generate(model, np.ones(30, np.int64), 2, caches=caches)
