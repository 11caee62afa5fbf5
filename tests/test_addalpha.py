"""Add-α count predictors: they reduce to the floors when α → 0 on the same text, and are proper distributions."""

import numpy as np
import pytest

from attnlab.lm.addalpha import add_alpha_loss, context_keys
from attnlab.text.ngrams import floors
from attnlab.guide.toy import TOY_TEXT
from attnlab.text.tokens import Vocab


def test_alpha_to_zero_on_the_same_text_is_the_floor():
    vocab = Vocab.from_text(TOY_TEXT)
    ids = vocab.encode(TOY_TEXT)
    for row in floors(TOY_TEXT, 3):
        assert add_alpha_loss(ids, ids, row.k, vocab_size=vocab.size, alpha=1e-12) == pytest.approx(row.floor,
                                                                                                    abs=1e-9)


def test_smoothing_costs_on_the_training_text_and_pays_off_it():
    vocab = Vocab.from_text(TOY_TEXT)
    ids = vocab.encode(TOY_TEXT)
    train, test = ids[:100], ids[100:]
    on_train = [add_alpha_loss(train, train, 2, vocab_size=vocab.size, alpha=a) for a in (1e-9, 0.1, 1.0)]
    assert on_train == sorted(on_train)                        # more smoothing, worse on what was counted
    assert np.isfinite(add_alpha_loss(train, test, 2, vocab_size=vocab.size, alpha=0.1))
    # a pair never seen in training: unsmoothed it costs −log(1e-9 / n(c)), smoothed far less
    unseen = np.array([vocab.symbols.index(ch) for ch in "the ct"])
    assert add_alpha_loss(train, unseen, 5, vocab_size=vocab.size, alpha=1e-9) > 20
    assert add_alpha_loss(train, unseen, 5, vocab_size=vocab.size, alpha=0.1) < 4


@pytest.mark.parametrize("k", [0, 1, 2])
def test_probabilities_sum_to_one_in_every_context(rng, k):
    train = rng.integers(0, 4, 60)
    for prefix in ([0, 1], [3, 3], [2, 0]):
        # one scored position: exp(−loss) of prefix + [x] is p(x | the last k of prefix)
        p = [np.exp(-add_alpha_loss(train, np.array(prefix[2 - max(k, 1):] + [x]), k, vocab_size=4, alpha=0.5))
             for x in range(4)]
        assert sum(p) == pytest.approx(1.0, rel=1e-12)
    # a context never seen in training gives the uniform 1/V
    assert add_alpha_loss(np.array([0, 1, 0, 1]), np.array([2, 2, 2]), 1, vocab_size=3) == pytest.approx(np.log(3))


def test_context_keys_and_bad_input():
    assert context_keys(np.array([1, 2, 0, 1]), 2, 3).tolist() == [5, 6]
    with pytest.raises(ValueError, match="eval_ids has 2 tokens; k = 2 needs more than 2"):
        add_alpha_loss(np.arange(5), np.arange(2), 2, vocab_size=5)
    with pytest.raises(TypeError, match="train_ids must be a 1-D integer array"):
        add_alpha_loss(np.zeros(5), np.arange(5), 1, vocab_size=5)
    with pytest.raises(ValueError, match="alpha must be a positive finite number"):
        add_alpha_loss(np.arange(5), np.arange(5), 1, vocab_size=5, alpha=0)
