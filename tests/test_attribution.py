"""Attribution patching: each estimate is the directional derivative of the metric along (clean − corrupt),
checked by central differences through the forward's own hooks; the CLI sets it beside activation patching."""

import json

import numpy as np
import pytest

from attnlab.interpret import attribute, compare, patch, rank_correlation
from attnlab.interpret.interventions import logit_diff
from attnlab.layer.config import AttentionConfig
from attnlab.layer.positions import RoPE
from attnlab.stack.hooks import run_with_cache, run_with_hooks
from attnlab.stack.layers import RMSNorm
from attnlab.stack.transformer import ModelConfig, Transformer


@pytest.fixture
def llama_like(rng):
    config = ModelConfig(vocab_size=13, n_layers=2, attention=AttentionConfig(d_model=8, n_heads=4, n_kv_heads=2,
                         n_ctx=8, positions=RoPE()), d_mlp=16, activation="silu", mlp="gated", norm=RMSNorm)
    return Transformer.init(config, rng=rng, std=0.5, dtype=np.float64)


def test_each_estimate_is_the_derivative_along_clean_minus_corrupt(llama_like, rng):
    model = llama_like
    clean, corrupt = rng.integers(0, 13, 6), rng.integers(0, 13, 6)
    a = attribute(model, clean, corrupt, answer=3, wrong=7)
    names = ["blocks.1.attn.hook_z", "blocks.0.hook_resid_pre"]
    _, c_acts = run_with_cache(model, clean, names)
    _, k_acts = run_with_cache(model, corrupt, names)
    scale = a.clean - a.corrupt
    for name, index, got in (("blocks.1.attn.hook_z", 2, a.heads[1, 2]), ("blocks.0.hook_resid_pre", 4, a.resid[0, 4])):
        step = np.zeros_like(c_acts[name])
        step[index] = (c_acts[name] - k_acts[name])[index]

        def m(eps):
            out = run_with_hooks(model, corrupt, {name: lambda x, _: x + eps * step})
            return logit_diff(out.logits, 3, 7)
        assert got * scale == pytest.approx((m(1e-6) - m(-1e-6)) / 2e-6, rel=1e-6, abs=1e-9)
    # beside activation patching: the same two runs' logit differences
    r = patch(model, clean, corrupt, answer=3, wrong=7)
    agreement = compare(r, a, top=3)
    assert -1 <= agreement.heads_rho <= 1 and len(agreement.disagree) == 3
    assert r.clean == pytest.approx(a.clean) and r.corrupt == pytest.approx(a.corrupt)


def test_rank_correlation_by_hand():
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert rank_correlation([1.0, 2.0, 3.0], [10.0, 30.0, 20.0]) == pytest.approx(0.5)


def test_attribute_cli_beside_activation_patching(capsys, tiny_gpt2_folder):
    from attnlab.cli import main

    argv = ["attribute", "--model", str(tiny_gpt2_folder), "--clean", " cat sat the", "--corrupt", " sat cat the",
            "--answer", " cat", "--wrong", " sat"]
    assert main(argv + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert np.shape(out["heads"]) == (2, 4) and np.shape(out["resid"]) == np.shape(out["patching"]["resid"])
    assert -1 <= out["agreement"]["heads_rank_correlation"] <= 1
    assert main(argv) == 0
    assert "Spearman's rank correlation" in capsys.readouterr().out
    assert main(argv[:3] + ["--clean", " cat", "--corrupt", " cat sat", "--answer", " cat", "--wrong", " sat"]) == 2
    assert "must have the same number" in capsys.readouterr().err


def test_attribute_takes_a_batch_of_pairs(rng):
    """A (2, 8) batch: the metric is the mean logit difference over the rows, and the estimates are its
    derivatives along (clean − corrupt), every row patched at once."""
    from attnlab.stack.transformer import forward

    model = Transformer.init(ModelConfig(vocab_size=9, n_layers=2, attention=AttentionConfig(d_model=8, n_heads=2,
                                                                                             n_ctx=8)),
                             rng=rng, std=0.5, dtype=np.float64)
    clean, corrupt = rng.integers(0, 9, (2, 8)), rng.integers(0, 9, (2, 8))
    a = attribute(model, clean, corrupt, answer=np.array([3, 4]), wrong=5)
    assert a.heads.shape == (2, 2) and a.resid.shape == (2, 8)
    rows = [logit_diff(forward(model, corrupt[b]).logits, [3, 4][b], 5) for b in range(2)]
    assert a.corrupt == pytest.approx(np.mean(rows), rel=1e-12)
    metric = lambda logits: np.mean([logits[b, -1, [3, 4][b]] - logits[b, -1, 5] for b in range(2)])   # noqa: E731
    name = "blocks.1.attn.hook_z"
    clean_z = run_with_cache(model, clean, [name])[1][name]              # (2, h, n, d_head)

    def patched(t):
        def hook(z, _):
            z = z.copy()
            z[:, 1] += t * (clean_z[:, 1] - z[:, 1])                    # head 1 of every row
            return z
        return metric(run_with_hooks(model, corrupt, {name: hook}).logits)

    numeric = (patched(1e-5) - patched(-1e-5)) / 2e-5
    assert a.heads[1, 1] * (a.clean - a.corrupt) == pytest.approx(numeric, rel=1e-6)
    with pytest.raises(ValueError, match=r"answer must be a token id in \[0, 9\), or 2 of them"):
        attribute(model, clean, corrupt, answer=[3, 4, 5], wrong=5)
    with pytest.raises(ValueError, match=r"same shape, got shapes \(2, 8\) and \(2, 7\)"):
        attribute(model, clean, corrupt[:, 1:], answer=3, wrong=5)
