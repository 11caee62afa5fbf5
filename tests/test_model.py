"""The language model: whole-model gradient by finite differences, determinism, the toy-text bar, generation."""

import numpy as np
import pytest

from attnlab.kernels._checks import as_token_ids
from attnlab.layer.config import AttentionConfig
from attnlab.guide.toy import TOY_TEXT
from attnlab.lm.model import cross_entropy, lm_config, loss, loss_and_grad
from attnlab.lm.training import (AdamConfig, AdamState, adam_step, evaluate, sample_batch, split_heldout, train,
                                 training_steps)
from attnlab.text.ngrams import floors
from attnlab.layer.positions import ALiBi, Learned, RoPE, Sinusoidal
from attnlab.stack.transformer import ModelConfig, Transformer, forward, generate, param_names
from attnlab.text.tokens import Vocab

SCHEMES = [Learned(), Sinusoidal(), RoPE(), ALiBi()]


def tiny(scheme, rng, dtype=np.float64, std=0.5, **sizes):
    config = lm_config(5, d_model=8, n_heads=2, n_layers=2, n_ctx=6, positions=scheme, **sizes)
    return Transformer.init(config, rng=rng, std=std, dtype=dtype)


@pytest.mark.parametrize("scheme, sizes", [(s, {}) for s in SCHEMES] + [(RoPE(theta=30.0), {"n_kv_heads": 1}),
                                                                       (Learned(), {"d_head": 3})])
def test_whole_model_gradient_matches_finite_differences(rng, numeric_grad, scheme, sizes):
    model = tiny(scheme, rng, **sizes)
    model.b_U[:] = rng.normal(size=5)                         # nonzero biases everywhere
    for block in model.blocks:
        for b in (block.attn.b_Q, block.attn.b_K, block.attn.b_V, block.attn.b_O):
            b[:] = rng.normal(0, 0.3, size=b.shape)
    ids, targets = rng.integers(0, 5, (2, 5)), rng.integers(0, 5, (2, 5))
    value, grads = loss_and_grad(model, ids, targets)
    assert value == pytest.approx(loss(model, ids, targets), rel=1e-12)
    f = lambda: loss(model, ids, targets)                     # noqa: E731
    got, params = grads, model.params()
    assert list(got) == list(params) == param_names(model.config)
    for name, p in params.items():
        # b_K's true gradient is 0 (it shifts all of a query's scores alike); there central differences give
        # one ulp of the loss over 2h, about 2e-9
        atol = 5e-9 if name.endswith("b_K") else 1e-9
        np.testing.assert_allclose(got[name], numeric_grad(f, p), rtol=1e-5, atol=atol, err_msg=name)


def test_cross_entropy_is_minus_log_p_and_its_gradient_is_p_minus_onehot():
    logits = np.log(np.array([[0.2, 0.3, 0.5], [0.6, 0.3, 0.1]]))
    value, d = cross_entropy(logits, np.array([2, 1]))
    assert value == pytest.approx(-(np.log(0.5) + np.log(0.3)) / 2)
    np.testing.assert_allclose(d, np.array([[0.2, 0.3, -0.5], [0.6, -0.7, 0.1]]) / 2)


def test_adam_first_step_moves_each_weight_by_lr():
    p = {"w": np.array([1.0, -2.0, 3.0])}
    adam_step(p, {"w": np.array([0.5, -4.0, 0.25])}, AdamState.zeros(p), AdamConfig(lr=0.1))
    # after one step m̂ = g and v̂ = g², so the step is lr · g/|g| (up to eps)
    np.testing.assert_allclose(p["w"], [0.9, -1.9, 2.9], rtol=1e-6)


def test_training_is_deterministic_for_a_seed(rng):
    vocab = Vocab.from_text(TOY_TEXT)
    ids = vocab.encode(TOY_TEXT)
    config = lm_config(vocab.size, d_model=16, n_heads=2, n_layers=1, n_ctx=16)

    def run(seed):
        r = np.random.default_rng(seed)
        model = Transformer.init(config, rng=r)
        losses = train(model, ids, steps=5, batch_size=4, rng=r)
        return losses, model.params()

    (l1, p1), (l2, p2), (l3, _) = run(7), run(7), run(8)
    assert l1 == l2
    for name in p1:
        np.testing.assert_array_equal(p1[name], p2[name])
    assert l1 != l3


def test_toy_text_training_loss_goes_below_the_k1_floor():
    """The guide's bar: 0.884 is the best any predictor without context can do on this text."""
    k1 = floors(TOY_TEXT, 1)[1].floor
    assert round(k1, 3) == 0.884
    vocab = Vocab.from_text(TOY_TEXT)
    ids = vocab.encode(TOY_TEXT)
    rng = np.random.default_rng(0)
    model = Transformer.init(lm_config(vocab.size, d_model=32, n_heads=4, n_layers=2, n_ctx=32), rng=rng)
    first = evaluate(model, ids)
    train(model, ids, steps=150, batch_size=8, rng=rng, adam=AdamConfig(lr=1e-2))
    assert first > 2.5                                         # it starts near log(15) = 2.71 ...
    assert evaluate(model, ids) < k1                           # ... and ends below the k = 1 floor


def test_sample_batch_windows_are_inputs_and_next_tokens(rng):
    ids = np.arange(20)
    x, y = sample_batch(ids, 5, 3, rng)
    assert x.shape == y.shape == (3, 5)
    np.testing.assert_array_equal(y, x + 1)
    np.testing.assert_array_equal(np.diff(x, axis=1), 1)


def test_evaluate_scores_every_token_once(rng):
    model = tiny(Learned(), rng, std=0.3)
    ids = rng.integers(0, 5, 14)                               # windows of 6 + 1: two whole and a rest of 2
    logits = [forward(model, ids[s:e - 1]).logits for s, e in ((0, 7), (6, 13), (12, 14))]
    targets = [ids[s + 1:e] for s, e in ((0, 7), (6, 13), (12, 14))]
    log_p = [np.take_along_axis(lg - np.log(np.exp(lg).sum(-1, keepdims=True)), t[:, None], -1)
             for lg, t in zip(logits, targets)]
    assert evaluate(model, ids) == pytest.approx(-np.concatenate(log_p).mean(), rel=1e-10)


def test_generate_through_the_cache_equals_rereading_everything(rng):
    model = tiny(RoPE(), rng, std=0.5)
    prompt = np.array([1, 2, 3])
    got = generate(model, prompt, 3)
    seq = list(prompt)
    for _ in range(3):                                         # greedy, re-reading the whole sequence each time
        seq.append(int(np.argmax(forward(model, np.array(seq)).logits[-1])))
    np.testing.assert_array_equal(got, seq[3:])
    a = generate(model, prompt, 20, temperature=1.0, rng=np.random.default_rng(1))   # past n_ctx = 6: it slides
    b = generate(model, prompt, 20, temperature=1.0, rng=np.random.default_rng(1))
    np.testing.assert_array_equal(a, b)
    assert a.shape == (20,) and a.min() >= 0 and a.max() < 5


def test_bad_input(rng):
    with pytest.raises(TypeError, match=r"positions must be a position scheme object \(Learned\(\), "):
        lm_config(5, positions="absolute")
    with pytest.raises(ValueError, match=r"d_model \(10\) must be divisible by n_heads \(4\)"):
        lm_config(5, d_model=10, n_heads=4)
    with pytest.raises(ValueError, match="rope needs an even d_head"):
        lm_config(5, d_model=12, n_heads=4, positions=RoPE())
    with pytest.raises(ValueError, match="n_ctx must be a positive integer, got 0"):
        lm_config(5, n_ctx=0)
    with pytest.raises(TypeError, match="config must be a ModelConfig, got dict"):
        Transformer.init({"vocab_size": 5}, rng=rng)
    with pytest.raises(TypeError, match="beta1 must be a finite number, got str"):
        AdamConfig(beta1="0.9")
    model = tiny(Learned(), rng)
    with pytest.raises(TypeError, match="ids must hold integer token ids, got dtype float64"):
        forward(model, np.zeros(3))
    with pytest.raises(ValueError, match=r"ids must be in \[0, 5\) \(the model's vocab_size\), got 5 at index 1"):
        as_token_ids("ids", [1, 5], 5)
    with pytest.raises(ValueError, match=r"targets must be in \[0, 5\).*got -1 at index \(1, 0\)"):
        loss(model, np.zeros((2, 3), int), [[0, 1, 2], [-1, 0, 0]])
    with pytest.raises(ValueError, match=r"ids must hold at least one token id, got shape \(2, 0\)"):
        forward(model, np.zeros((2, 0), int))
    with pytest.raises(ValueError, match="the prompt has 7 tokens, more than the model's context n_ctx 6"):
        generate(model, np.arange(7) % 5, 2)
    with pytest.raises(ValueError, match="the text is empty"):
        Vocab.from_text("")
    with pytest.raises(ValueError, match="the training text has 5 tokens, fewer than the context 6 plus one"):
        training_steps(model, np.arange(5) % 5, steps=1, batch_size=1, rng=rng)
    with pytest.raises(ValueError, match=r"W_E has shape \(4, 8\), the config \(vocab_size 5, d_model 8, n_ctx 6, "
                                         r"learned positions\) asks for \(5, 8\)"):
        Transformer(config=model.config, W_E=model.W_E[:4], W_P=model.W_P, blocks=model.blocks, W_U=model.W_U,
                    b_U=model.b_U)
    with pytest.raises(ValueError, match=r"blocks\[0\].attn has config .*n_heads=4.*, the model's is"):
        other = Transformer.init(lm_config(5, d_model=8, n_heads=4, n_layers=2, n_ctx=6), rng=rng)
        Transformer(config=model.config, W_E=model.W_E, W_P=model.W_P, blocks=other.blocks, W_U=model.W_U,
                    b_U=model.b_U)
    gpt_like = Transformer.init(ModelConfig(vocab_size=5, n_layers=1, attention=AttentionConfig(d_model=8, n_heads=2),
                                            d_mlp=16), rng=rng)
    with pytest.raises(ValueError, match=r"grad_names has \['blocks.0.attn.hook_pattern'\], which the backward"):
        loss_and_grad(gpt_like, np.zeros((1, 3), int), np.zeros((1, 3), int), grad_names=["blocks.0.attn.hook_pattern"])
    with pytest.raises(ValueError, match=r"targets are all -100 \(not scored\)"):
        loss_and_grad(gpt_like, np.zeros((1, 3), int), np.full((1, 3), -100))
    with pytest.raises(ValueError, match="heldout fraction must be a number in"):
        split_heldout(np.arange(10), 1.0)
    with pytest.raises(ValueError, match="'z' is not in the vocabulary"):
        Vocab.from_text("abc").encode("abz")


@pytest.mark.parametrize("scheme, n_kv_heads", [(s, None) for s in SCHEMES] + [(RoPE(theta=500.0), 2)])
def test_loss_and_gradient_match_torch_autograd(rng, scheme, n_kv_heads, torch_reference):
    torch_loss, torch_params = torch_reference.torch_loss, torch_reference.torch_params

    config = lm_config(7, d_model=16, n_heads=4, n_kv_heads=n_kv_heads, n_layers=2, n_ctx=9, positions=scheme)
    model = Transformer.init(config, rng=rng, std=0.4, dtype=np.float64)
    ids, targets = rng.integers(0, 7, (3, 9)), rng.integers(0, 7, (3, 9))
    value, grads = loss_and_grad(model, ids, targets)
    params = torch_params(model)
    ref = torch_loss(model, params, ids, targets)
    ref.backward()
    assert value == pytest.approx(ref.item(), rel=1e-12)
    for name, g in grads.items():
        np.testing.assert_allclose(g, params[name].grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=name)


def test_loss_and_its_gradient_refuse_targets_of_another_shape(rng):
    model = tiny(Learned(), rng)
    ids = np.array([[0, 1, 2]])
    for f in (loss, loss_and_grad):
        with pytest.raises(ValueError, match=r"targets must have the shape of ids \(1, 3\), got \(1, 2\)"):
            f(model, ids, np.array([[1, 2]]))


def test_clipping_scales_the_gradients_to_the_global_norm():
    from attnlab.lm.training import grad_norm

    params = {"a": np.zeros(3), "b": np.zeros((1, 2))}
    grads = {"a": np.array([3.0, 0.0, 0.0]), "b": np.array([[0.0, 4.0]])}    # global norm 5
    assert grad_norm(grads, params) == 5.0
    clipped, plain = {k: v.copy() for k, v in params.items()}, {k: v.copy() for k, v in params.items()}
    adam_step(clipped, grads, AdamState.zeros(clipped), AdamConfig(lr=0.1, clip=1.0))
    adam_step(plain, {k: g / 5 for k, g in grads.items()}, AdamState.zeros(plain), AdamConfig(lr=0.1))
    for k in params:
        np.testing.assert_allclose(clipped[k], plain[k], rtol=1e-12)
    with pytest.raises(ValueError, match="clip must be a positive"):
        AdamConfig(clip=0.0)
