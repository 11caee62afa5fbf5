"""One forward for every use (issue 30, part 3): the training pass is `forward` itself, given a tape.

For every option of ModelConfig and AttentionConfig that changes the forward, the training pass's logits
equal `forward`'s bit for bit (on both tile kernels, and on the tiled path too), and loss_and_grad's gradients
match central differences in float64. Attribution patching on a Gemma-2-shaped model (embedding scale, logit
soft-cap) reports the metric `forward` gives, and its estimates are the derivatives of `forward` with the patch.
"""

import numpy as np
import pytest

from attnlab.interpret.attribution import attribute
from attnlab.interpret.interventions import logit_diff
from attnlab.layer.config import AttentionConfig
from attnlab.layer.tape import Tape
from attnlab.lm.model import IGNORE, loss, loss_and_grad, scored_logits
from attnlab.stack.backward import backward
from attnlab.stack.hooks import run_with_hooks
from attnlab.stack.transformer import ModelConfig, Transformer, forward, new_caches

from _decoders import OPTIONS, V, random_model

def tiny(option, rng, dtype=np.float64):
    """A model of the option, every array random (norm weights and biases too)."""
    return random_model(OPTIONS[option], rng, dtype=dtype)


def forward_logits(model, ids, types=None):
    """What inference gives: forward's logits, or an encoder without a head scored against W_E."""
    out = forward(model, ids, token_types=types)
    return out.logits if out.logits is not None else out.hidden_states[-1] @ model.W_E.T


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_the_training_pass_gives_forwards_logits_bit_for_bit(option, rng, tile_kernel):
    model = tiny(option, rng, np.float32)
    ids = rng.integers(0, V, (2, 7))
    types = rng.integers(0, 2, ids.shape) if model.config.n_types else None
    tape = Tape()
    taped = scored_logits(model, ids, token_types=types, tape=tape)      # (2, 7, V) what loss_and_grad scores
    assert taped.dtype == np.float32
    np.testing.assert_array_equal(taped, forward_logits(model, ids, types))
    assert "blocks.1.attn" in tape and "unembed" in tape


@pytest.mark.parametrize("option", ["plain", "gemma2", "gqa"])
def test_bit_for_bit_on_the_tiled_path_too(option, rng, tile_kernel):
    """200 tokens: attention takes the tiled kernel (no bias), whose training forward keeps one lse per query."""
    cfg = dict(OPTIONS[option])
    cfg["attention"] = AttentionConfig(**{**cfg["attention"].__dict__, "n_ctx": 256})
    cfg["layers"] = tuple(AttentionConfig(**{**a.__dict__, "n_ctx": 256}) for a in cfg.get("layers", ()))
    model = Transformer.init(ModelConfig(vocab_size=V, n_layers=2, **cfg), rng=rng, std=0.4, dtype=np.float32)
    ids = rng.integers(0, V, 200)
    tape = Tape()
    np.testing.assert_array_equal(forward(model, ids, tape=tape).logits, forward(model, ids).logits)
    assert type(tape["blocks.0.attn"].attn).__name__ == "TiledSaved"


@pytest.mark.parametrize("option", sorted(OPTIONS))
def test_loss_and_grad_matches_central_differences(option, rng, param_grads):
    model = tiny(option, rng)
    ids, targets = rng.integers(0, V, (2, 5)), rng.integers(0, V, (2, 5))
    if not model.config.is_causal:
        targets[rng.random(targets.shape) < 0.4] = IGNORE
        targets[0, 0] = 3
    types = rng.integers(0, 2, ids.shape) if model.config.n_types else None
    value, grads = loss_and_grad(model, ids, targets, token_types=types)
    f = lambda: loss(model, ids, targets, token_types=types)            # noqa: E731
    assert value == pytest.approx(f(), rel=1e-13)                       # bit for bit on one kernel: above
    entries = lambda p: [np.unravel_index(j, p.shape) for j in rng.choice(p.size, size=min(3, p.size),   # noqa: E731
                                                                           replace=False)]
    param_grads(grads, model.params(), f, entries, tag=(option,))


def test_gradients_of_any_logits_metric_a_padded_batch_and_the_last_rows_only(rng):
    """backward(dlogits) for L = Σ logits · w: with a padded batch's mask (each row's own position rows of W_P),
    and with logits_to_keep (the other rows get no gradient from the logits)."""
    model = tiny("embed_scale", rng)
    ids = rng.integers(0, V, (2, 6))
    mask = np.array([[False, False, True, True, True, True], [True] * 6])
    for kw in (dict(attention_mask=mask), dict(logits_to_keep=2)):
        w = rng.normal(size=forward(model, ids, **kw).logits.shape)
        f = lambda: float((forward(model, ids, **kw).logits * w).sum())   # noqa: E731
        tape = Tape()
        forward(model, ids, tape=tape, **kw)
        grads, _ = backward(model, tape, w)
        for name in ("W_E", "W_P", "blocks.0.attn.W_Q", "blocks.1.ln_2.weight", "W_U"):
            p = model.params()[name]
            for i in [np.unravel_index(j, p.shape) for j in rng.choice(p.size, size=4, replace=False)]:
                old = p[i]
                p[i] = old + 1e-6
                up = f()
                p[i] = old - 1e-6
                down = f()
                p[i] = old
                assert grads[name][i] == pytest.approx((up - down) / 2e-6, rel=1e-5, abs=1e-8), (kw, name, i)


def test_a_tape_is_for_one_pass_without_caches(rng):
    model = tiny("plain", rng)
    ids = np.array([1, 2, 3])
    tape = Tape()
    forward(model, ids, tape=tape)
    with pytest.raises(ValueError, match="the tape already holds 'embed'"):
        forward(model, ids, tape=tape)
    with pytest.raises(ValueError, match="tape is for one pass without caches"):
        forward(model, ids, tape=Tape(), caches=new_caches(model, 4))
    with pytest.raises(TypeError, match="tape must be an attnlab.layer.tape.Tape"):
        forward(model, ids, tape={})
    with pytest.raises(ValueError, match=r"dlogits must have the logits' shape \(3, 13\), got \(3, 12\)"):
        backward(model, tape, np.zeros((3, 12)))


def gemma2_patching(rng):
    model = tiny("gemma2", rng)
    clean, corrupt = rng.integers(0, V, 7), rng.integers(0, V, 7)
    corrupt[:3] = clean[:3]
    return model, clean, corrupt


def test_attribute_on_a_gemma2_shaped_model_reports_what_forward_gives(rng, tile_kernel):
    model, clean, corrupt = gemma2_patching(rng)
    a = attribute(model, clean, corrupt, answer=3, wrong=5)
    assert a.corrupt == logit_diff(forward(model, corrupt).logits, 3, 5)
    assert a.clean == logit_diff(forward(model, clean).logits, 3, 5)


def test_attributions_are_the_derivatives_of_forward_with_the_patch(rng):
    """Each estimate × (clean − corrupt) is d/dt m(corrupt with a + t·(a_clean − a) put back) at t = 0, the
    patch applied through forward's own hooks: central differences in float64."""
    model, clean, corrupt = gemma2_patching(rng)
    a = attribute(model, clean, corrupt, answer=3, wrong=5)
    scale = a.clean - a.corrupt
    layer, head, pos = 1, 1, 4

    def patched(name, where, t):
        from attnlab.stack.hooks import run_with_cache
        clean_act = run_with_cache(model, clean, [name])[1][name]

        def hook(x, _):
            x = x.copy()
            x[where] += t * (clean_act[where] - x[where])
            return x
        return logit_diff(run_with_hooks(model, corrupt, {name: hook}).logits, 3, 5)

    for name, where, estimate in ((f"blocks.{layer}.attn.hook_z", (head,), a.heads[layer, head]),
                                  (f"blocks.{layer}.hook_resid_pre", (pos,), a.resid[layer, pos]),
                                  ("blocks.0.hook_resid_pre", (pos,), a.resid[0, pos])):
        numeric = (patched(name, where, 1e-5) - patched(name, where, -1e-5)) / 2e-5
        assert estimate * scale == pytest.approx(numeric, rel=1e-6, abs=1e-9), name
