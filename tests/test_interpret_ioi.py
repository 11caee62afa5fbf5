"""The IOI recipe on a random Llama-shaped model with a word-level vocabulary: its prompts, and each figure
against the same quantity computed from one prompt run alone."""

import numpy as np
import pytest

from attnlab.interpret.ioi import NAMES, TEMPLATES, ioi_analysis, ioi_prompts
from attnlab.layer.config import AttentionConfig
from attnlab.layer.positions import RoPE
from attnlab.stack.hooks import run_with_cache
from attnlab.stack.layers import RMSNorm
from attnlab.stack.transformer import ModelConfig, Transformer
from attnlab.text.tokens import Vocab


@pytest.fixture(scope="module")
def setup():
    words = " ".join(t.format(A="", B="", S="") for t in TEMPLATES) + " " + " ".join(NAMES)
    tok = Vocab.from_text(words.replace(",", " , "), level="word")
    att = AttentionConfig(d_model=32, n_heads=4, n_kv_heads=2, n_ctx=32, positions=RoPE())
    cfg = ModelConfig(vocab_size=tok.size, n_layers=2, attention=att, d_mlp=48, mlp="gated", activation="silu",
                      norm=RMSNorm)
    return Transformer.init(cfg, rng=np.random.default_rng(0), std=0.3, dtype=np.float64), WordCommas(tok)


class WordCommas:
    """A word tokenizer that reads "store," as "store" and ",", so that a name is one token."""

    def __init__(self, vocab):
        self.vocab = vocab

    def encode(self, text):
        return self.vocab.encode(text.replace(",", " , "))


def test_prompts_pair_up(setup):
    _, tok = setup
    p = ioi_prompts(tok, 6, rng=np.random.default_rng(1))
    assert len(p.clean) == 6 and all(c.size == k.size for c, k in zip(p.clean, p.corrupt))
    for c, k, io, s, ip, sp in zip(p.clean, p.corrupt, p.io, p.s, p.io_pos, p.s_pos):
        assert c[ip] == io and c[sp] == s and c[-1] == k[-1] and (c != k).sum() == 1   # only S2 differs
        assert (c == s).sum() == 2 and (k == s).sum() == 1
    assert p.io_pos[0] < p.s_pos[0] and p.io_pos[1] > p.s_pos[1]                        # ABB, then BAB


def test_analysis_figures_match_each_prompt_alone(setup):
    model, tok = setup
    p = ioi_prompts(tok, 4, rng=np.random.default_rng(2))
    r = ioi_analysis(model, p, path_top=2)
    L = model.config.n_layers
    for b in range(4):
        out, cache = run_with_cache(model, p.clean[b])
        logits = out.logits[-1]
        assert r.clean_diff[b] == pytest.approx(logits[p.io[b]] - logits[p.s[b]], abs=1e-9)
    dla = np.mean([run_with_cache(model, c)[1].logit_attrs(
        run_with_cache(model, c)[1].stack_head_results(apply_ln=True, pos_slice=-1), int(io), int(s))
        for c, io, s in zip(p.clean, p.io, p.s)], axis=0).reshape(L, 4)
    np.testing.assert_allclose(r.dla, dla, rtol=0, atol=1e-9)
    att = np.mean([run_with_cache(model, c)[1]["pattern", 1][:, -1, ip] for c, ip in zip(p.clean, p.io_pos)], 0)
    np.testing.assert_allclose(r.attn_io[1], att, rtol=0, atol=1e-9)
    assert r.patching.restored.shape == (L, 4) and len(r.direct) == 2
    assert all(isinstance(h, tuple) for h in r.name_movers())
