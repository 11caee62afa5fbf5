"""Finer activation patching and path patching against a float64 hand computation of attnlab's own LM."""

import numpy as np
import pytest

from attnlab.interpret import patch, path_patch
from attnlab.layer.multihead import merge_heads, split_heads
from attnlab.lm.model import lm_config
from attnlab.stack.transformer import Transformer


@pytest.fixture
def lm(rng):
    m = Transformer.init(lm_config(13, d_model=16, n_heads=4, n_layers=3, n_ctx=12), rng=rng, std=0.4,
                         dtype=np.float64)
    for name, a in m.params().items():
        if name.split(".")[-1].startswith("b_"):
            a[:] = rng.normal(0, 0.2, a.shape)
    return m


def by_hand(model, ids, edit=lambda layer, name, x: x):
    """attnlab's LM written out; ``edit(layer, name, array)`` may replace q, k, v, pattern, z or attn_out."""
    n = len(ids)
    x = model.W_E[ids] + model.W_P[:n]                                   # (n, d_model)
    keep = np.tril(np.ones((n, n), bool))
    for i, b in enumerate(model.blocks):
        a = b.attn
        x = edit(i, "resid_pre", x)
        q, k, v = (edit(i, nm, split_heads(x @ W + bias, a.config.n_heads)) for nm, W, bias in
                   (("q", a.W_Q, a.b_Q), ("k", a.W_K, a.b_K), ("v", a.W_V, a.b_V)))   # (h, n, d_head)
        s = np.where(keep, q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1]), -np.inf)
        w = np.exp(s - s.max(-1, keepdims=True))
        z = edit(i, "z", edit(i, "pattern", w / w.sum(-1, keepdims=True)) @ v)   # (h, n, d_head)
        x = x + edit(i, "attn_out", merge_heads(z) @ a.W_O + a.b_O)
    return x @ model.W_U + model.b_U                                     # (n, vocab)


def record(model, ids):
    acts = {}
    by_hand(model, ids, lambda i, name, x: acts.setdefault((i, name), x))
    return acts


def diff(logits, answer=3, wrong=5):
    return logits[-1, answer] - logits[-1, wrong]


@pytest.fixture
def texts(rng):
    clean = rng.integers(0, 13, 9)
    corrupt = clean.copy()
    corrupt[[2, 5]] = (clean[[2, 5]] + 6) % 13
    return clean, corrupt


@pytest.mark.parametrize("what,name,index", [("heads_by_pos", "z", (1, 2, 5)), ("q", "q", (2, 3)), ("k", "k", (1, 0)),
                                             ("v", "v", (2, 1)), ("pattern", "pattern", (1, 2)),
                                             ("attn_out", "attn_out", (1, 5)), ("resid_pre", "resid_pre", (2, 7))])
def test_each_piece_equals_a_hand_patch(lm, texts, what, name, index):
    clean, corrupt = texts
    r = patch(lm, clean, corrupt, answer=3, wrong=5, what=what)
    acts = record(lm, clean)
    layer, rest = index[0], index[1:]

    def edit(i, nm, x):
        if i == layer and nm == name:
            x = x.copy()
            x[rest] = acts[(i, nm)][rest]
        return x
    assert r.clean == pytest.approx(diff(by_hand(lm, clean)), abs=1e-12)
    assert r.corrupt == pytest.approx(diff(by_hand(lm, corrupt)), abs=1e-12)
    assert r.values[index] == pytest.approx(diff(by_hand(lm, corrupt, edit)), abs=1e-12)
    assert r.restored[index] == pytest.approx((r.values[index] - r.corrupt) / (r.clean - r.corrupt))


def test_grids_have_their_axes(lm, texts):
    clean, corrupt = texts
    assert patch(lm, clean, corrupt, answer=3, wrong=5, what="heads_by_pos").values.shape == (3, 4, 9)
    g = patch(lm, clean, corrupt, answer=3, wrong=5, what="blocks.1.hook_resid_pre")
    assert g.axes == ("position",) and g.values.shape == (9,)
    np.testing.assert_allclose(g.values, patch(lm, clean, corrupt, answer=3, wrong=5).resid_diff[1], atol=1e-12)
    assert patch(lm, clean, corrupt, answer=3, wrong=5, what="blocks.2.attn.hook_v").axes == ("head",)
    with pytest.raises(ValueError, match="what must be one of"):
        patch(lm, clean, corrupt, answer=3, wrong=5, what="mlp")
    with pytest.raises(ValueError, match="this model has no mlp.hook|this model has no hook_mlp_out"):
        patch(lm, clean, corrupt, answer=3, wrong=5, what="mlp_out")


def test_a_metric_averaged_over_pairs_of_different_lengths(lm, rng):
    cleans = [rng.integers(0, 13, n) for n in (9, 6, 11)]
    corrupts = [np.where(np.arange(c.size) == 1, (c + 4) % 13, c) for c in cleans]
    answers, wrongs = np.array([3, 7, 1]), np.array([5, 2, 8])
    r = patch(lm, cleans, corrupts, answer=answers, wrong=wrongs, what="heads")
    alone = [patch(lm, c, k, answer=int(a), wrong=int(w), what="heads")
             for c, k, a, w in zip(cleans, corrupts, answers, wrongs)]
    assert r.clean == pytest.approx(np.mean([a.clean for a in alone]), abs=1e-12)
    np.testing.assert_allclose(r.values, np.mean([a.values for a in alone], 0), rtol=0, atol=1e-10)
    # any metric of the last tokens' logits (B, vocab): here the answer's log-probability
    logp = lambda z: z[np.arange(3), answers] - np.log(np.exp(z).sum(-1))   # noqa: E731
    m = patch(lm, cleans, corrupts, metric=logp, what="resid_pre")
    assert m.values.shape == (3, 11) and np.isfinite(m.values).all()
    with pytest.raises(ValueError, match="pair 1 has 6 clean and 5 corrupted tokens"):
        patch(lm, cleans, [corrupts[0], corrupts[1][:5], corrupts[2]], answer=3, wrong=5)
    with pytest.raises(ValueError, match="either metric or answer and wrong"):
        patch(lm, cleans, corrupts, answer=3, wrong=5, metric=logp)


def test_a_small_gap_warns(lm, texts):
    clean, corrupt = texts
    r = patch(lm, clean, corrupt, answer=3, wrong=5, what="resid_pre")
    gap = abs(r.clean - r.corrupt) / max(abs(r.clean), abs(r.corrupt))
    with pytest.warns(RuntimeWarning, match="below"):
        patch(lm, clean, corrupt, answer=3, wrong=5, what="resid_pre", warn_below=gap * 1.01)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        patch(lm, clean, corrupt, answer=3, wrong=5, what="resid_pre", warn_below=gap * 0.99)


def test_path_patching_by_hand(lm, texts):
    clean, corrupt = texts
    c_acts, k_acts = record(lm, clean), record(lm, corrupt)
    # the last layer's head into the final residual: nothing is downstream, so it is plain patching
    r = path_patch(lm, clean, corrupt, [(2, 1)], ["blocks.2.hook_resid_post"], answer=3, wrong=5)
    plain = patch(lm, clean, corrupt, answer=3, wrong=5, what="heads")
    assert r.patched == pytest.approx(plain.values[2, 1], abs=1e-12)
    # L0H2 through the queries of L2H0 and L2H3 only: every head frozen at corrupt but the sender, which is
    # clean; the receivers' q from that run; then the corrupted run with those two heads' q put back
    def frozen(i, name, x):
        if name == "z":
            z = k_acts[(i, "z")].copy()
            if i == 0:
                z[2] = c_acts[(0, "z")][2]
            return z
        return x
    q_sent = {}
    by_hand(lm, corrupt, lambda i, name, x: (q_sent.setdefault(i, x) if name == "q" else None, frozen(i, name, x))[1])

    def put(i, name, x):
        if i == 2 and name == "q":
            x = x.copy()
            x[[0, 3]] = q_sent[2][[0, 3]]
        return x
    r = path_patch(lm, clean, corrupt, [(0, 2)], [("blocks.2.attn.hook_q", [0, 3])], answer=3, wrong=5)
    assert r.patched == pytest.approx(diff(by_hand(lm, corrupt, put)), abs=1e-12)
    assert r.restored == pytest.approx((r.patched - r.corrupt) / (r.clean - r.corrupt))
    with pytest.raises(ValueError, match="a receiver cannot be"):
        path_patch(lm, clean, corrupt, [(0, 2)], ["blocks.1.attn.hook_z"], answer=3, wrong=5)
    with pytest.raises(ValueError, match="not a hook of the model"):
        path_patch(lm, clean, corrupt, [(0, 2)], ["blocks.9.attn.hook_q"], answer=3, wrong=5)
