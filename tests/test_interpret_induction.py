"""The induction task's data by hand, its baselines, exact resume, and the shipped induction checkpoint."""

import numpy as np
import pytest

from attnlab.interpret.induction import (FIRST, OTHER, REPEAT, InductionConfig, InductionTask, copy_baseline,
                                         evaluate, induction_batch, load_run, off_range_batch, offset_baseline,
                                         save_run, start_run, target_kinds, train_steps)


def test_target_kinds_by_hand():
    seqs = np.array([[9, 1, 2, 3, 1, 2, 3, 1]])          # BOS, r = 1 2 3, tiled
    # targets: 1 2 3 (new), 1 (repeat of a token, but its current token 3 was never seen before) then induction
    assert target_kinds(seqs).tolist() == [[FIRST, FIRST, FIRST, OTHER, REPEAT, REPEAT, REPEAT]]
    pairs = np.array([[9, 1, 2, 1, 2, 5, 6, 5]])         # r = 1 2, then q = 5 6
    assert target_kinds(pairs).tolist() == [[FIRST, FIRST, OTHER, REPEAT, FIRST, FIRST, OTHER]]


def test_batches_are_bos_then_a_tiled_segment_of_distinct_tokens(rng):
    task = InductionTask(vocab_size=20, n_ctx=17, min_period=3, max_period=8)
    ids, targets, kind = induction_batch(task, 50, rng)
    assert ids.shape == targets.shape == kind.shape == (50, 17)
    assert (ids[:, 0] == task.bos).all() and (ids[:, 1:] < 20).all()
    np.testing.assert_array_equal(ids[:, 1:], targets[:, :-1])
    for row in np.concatenate([ids, targets[:, -1:]], axis=1):
        body = row[1:]
        s = next(p for p in range(3, 9) if (body[p:] == body[:-p]).all())     # the period
        assert len(set(body[:s].tolist())) == s                                # distinct within a segment
    periods = {int(np.argmax(k == OTHER)) for k in kind}
    assert periods == set(range(3, 9))                                         # every period drawn


def test_a_task_that_cannot_hold_two_copies_is_refused():
    with pytest.raises(ValueError, match="two copies"):
        InductionTask(n_ctx=10, min_period=4, max_period=8)
    with pytest.raises(ValueError, match="vocab_size must be at most"):
        InductionTask(vocab_size=40, n_ctx=80)


def test_baselines_by_hand():
    ids = np.array([[9, 1, 2, 3, 1, 2, 3]])
    targets = np.array([[1, 2, 3, 1, 2, 3, 1]])
    kind = np.array([[FIRST, FIRST, FIRST, OTHER, REPEAT, REPEAT, REPEAT]])
    # repeats at t = 4, 5, 6: the context after BOS holds {1, 2, 3}; minus the current token, 2 candidates each
    assert copy_baseline((ids, targets, kind)) == pytest.approx(np.log(2))
    # periods 3..3: exactly one token 2 back, the answer
    assert offset_baseline((ids, targets, kind), InductionTask(vocab_size=5, n_ctx=7, min_period=3,
                                                                max_period=3)) == pytest.approx(0.0)


SMALL = InductionConfig(task=InductionTask(vocab_size=12, n_ctx=13, min_period=3, max_period=6), d_model=16,
                        steps=6, batch_size=4, eval_every=2, eval_size=4)


def test_a_resumed_run_ends_bit_for_bit_where_an_uninterrupted_one_ends(tmp_path):
    whole = start_run(SMALL)
    list(train_steps(whole))
    half = start_run(SMALL)
    list(train_steps(half, until=3))
    save_run(half, tmp_path)
    resumed = load_run(SMALL, tmp_path)
    assert resumed.step == 3
    list(train_steps(resumed))
    for name, a in whole.model.params().items():
        np.testing.assert_array_equal(resumed.model.params()[name], a, err_msg=name)
    for store in ("m", "v"):
        for name, a in getattr(whole.adam, store).items():
            np.testing.assert_array_equal(getattr(resumed.adam, store)[name], a)
    assert [e.step for e in resumed.history] == [e.step for e in whole.history]
    assert resumed.final.repeat_loss == whole.final.repeat_loss
    from dataclasses import replace
    with pytest.raises(ValueError, match="other settings"):
        load_run(replace(SMALL, lr=0.5), tmp_path)


def test_text_training_resumes_exactly(tmp_path):
    from attnlab.lm.checkpoint import load_checkpoint, save_checkpoint
    from attnlab.lm.model import lm_config
    from attnlab.lm.resume import load_training_state, save_training_state
    from attnlab.lm.training import AdamState, cosine_decay, training_steps
    from attnlab.stack.transformer import Transformer
    from attnlab.text.tokens import Vocab
    text = "the cat sat on the mat and the cat ate the rat " * 3
    vocab = Vocab.from_text(text)
    ids = vocab.encode(text)
    cfg = lm_config(vocab.size, d_model=8, n_heads=2, n_layers=1, n_ctx=8)

    def fresh():
        rng = np.random.default_rng(5)
        model = Transformer.init(cfg, rng=rng)
        return model, rng, AdamState.zeros(model.params())
    model, rng, state = fresh()
    list(training_steps(model, ids, steps=6, batch_size=3, rng=rng, schedule=cosine_decay(6), state=state))
    m2, rng2, st2 = fresh()
    list(training_steps(m2, ids, steps=3, batch_size=3, rng=rng2, schedule=cosine_decay(6), state=st2))
    save_checkpoint(m2, vocab, tmp_path)
    save_training_state(tmp_path, st2, rng2)
    m3, _ = load_checkpoint(tmp_path)
    st3, rng3, _ = load_training_state(tmp_path, m3.params())
    assert st3.t == 3
    list(training_steps(m3, ids, steps=6, batch_size=3, rng=rng3, schedule=cosine_decay(6), state=st3, start=3))
    for name, a in model.params().items():
        np.testing.assert_array_equal(m3.params()[name], a, err_msg=name)
    with pytest.raises(ValueError, match="resumes after step"):
        training_steps(m3, ids, steps=6, batch_size=3, rng=rng3, state=st3, start=2)


def test_the_training_state_must_fit_the_model(tmp_path, rng):
    from attnlab.lm.model import lm_config
    from attnlab.lm.resume import load_training_state, save_training_state
    from attnlab.lm.training import AdamState
    from attnlab.stack.transformer import Transformer
    model = Transformer.init(lm_config(5, d_model=8, n_heads=2, n_layers=1, n_ctx=4), rng=rng)
    with pytest.raises(FileNotFoundError, match="no training state"):
        load_training_state(tmp_path, model.params())
    save_training_state(tmp_path, AdamState.zeros(model.params()), rng)
    other = Transformer.init(lm_config(6, d_model=8, n_heads=2, n_layers=1, n_ctx=4), rng=rng)
    with pytest.raises(ValueError, match="W_E"):
        load_training_state(tmp_path, other.params())


def test_the_shipped_checkpoint_has_both_heads():
    """The checkpoint in the package (trained by `attnlab train --task induction`, see trained.py) on held-out
    sequences: repeats nearly free, a previous-token head in layer 0, an induction head in layer 1."""
    from attnlab.interpret.trained import INDUCTION_CONFIG, load_induction_model
    from attnlab.interpret.induction import eval_batch
    model = load_induction_model()
    e = evaluate(model, eval_batch(INDUCTION_CONFIG), 0)
    assert e.repeat_loss < 0.3 < np.log(32) - 0.2 < e.first_loss
    assert e.previous_token[0].max() >= 0.8
    assert e.induction[1].max() >= 0.8
    assert e.induction[0].max() < 0.5 and e.previous_token[1].max() < 0.5     # and not the other way round


def test_the_off_range_test_has_a_period_beyond_training():
    task = InductionTask()
    ids, targets, kind = off_range_batch(task, 3, np.random.default_rng(0))
    n = (task.n_ctx - 1) // 2
    assert n > task.max_period and ids.shape == (3, 2 * n)
    full = np.concatenate([ids, targets[:, -1:]], axis=1)                       # (3, 2N + 1)
    np.testing.assert_array_equal(full[:, 1:n + 1], full[:, n + 1:])
    assert (kind[:, :n] == FIRST).all() and (kind[:, n] == OTHER).all() and (kind[:, n + 1:] == REPEAT).all()


def test_the_shipped_model_does_induction_on_a_period_it_never_saw():
    from attnlab.interpret.induction import first_and_repeat_loss
    from attnlab.interpret.trained import load_induction_model
    _, repeat = first_and_repeat_loss(load_induction_model(), off_range_batch(InductionTask(), 32,
                                                                              np.random.default_rng(1)))
    assert repeat < 0.3
