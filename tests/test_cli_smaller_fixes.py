"""Issue 34, part 6: lens and attend cut to the positions, layers and heads asked for; scan without [CLS]/[SEP]
rows for a model without those tokens; train's closing note and its stderr wording; bench without torch."""

import json

import pytest

from attnlab.cli import main
from attnlab.cli.attend import pick

FIRST_CALL = {"n": 1024, "first_over_second_mib": 5.0, "runs": {
    "default": {"first": {"rss_mib": 7.0, "ms": 90.0}, "second": {"rss_mib": 2.0, "ms": 60.0}, "kernel": "numpy"}}}


def test_pick_reads_lists_ranges_and_negative_indices():
    assert pick(None, "--layers", 4, "layer") == [0, 1, 2, 3]
    assert pick("-1", "--position", 5, "position") == [4]
    assert pick("0,3,1-2,3", "--layers", 5, "layer") == [0, 3, 1, 2]
    with pytest.raises(ValueError, match=r"--heads has 4; there are 4 heads, 0 … 3"):
        pick("4", "--heads", 4, "head")
    with pytest.raises(ValueError, match="--layers must be layer indices such as 3, -1"):
        pick("2-", "--layers", 4, "layer")


def test_lens_shows_only_the_positions_and_layers_asked(cli):
    every = cli.json("lens", "|abcab", "--model", "induction", "--top", "1")
    last = cli.json("lens", "|abcab", "--model", "induction", "--top", "1", "--position", "-1", "--layers", "-1")
    assert last["positions"] == [5] and last["stages"] == ["block 1"]
    assert last["top"] == [[every["top"][2][5]]]                        # stage 2 is block 1; position 5 the last
    text = cli.text("lens", "|abcab", "--model", "induction", "--top", "1", "--position", "-1")
    assert text.count("(position") == 1 and "(position 5)" in text
    assert sum(line.startswith("  ") for line in text.splitlines()) == 3  # the embedding and the 2 blocks
    cli.error(["lens", "|abcab", "--model", "induction", "--layers", "2"], "--layers has 2; there are 2 layers")


def test_attend_shows_the_rows_of_the_heads_and_positions_asked(cli):
    text = cli.text("attend", "The cat sat", "--layers", "0-1", "--heads", "1", "--position", "-1")   # MiniLM
    assert text.count("layer ") == 2 and "layer 0, head 1" in text and "layer 1, head 1" in text
    assert text.count("from ") == 2 and "from [SEP] (position 4)" in text
    d = cli.json("attend", "The cat sat", "--layers", "1", "--position", "-1")
    every = cli.json("attend", "The cat sat")
    assert d["layers"] == [1] and d["heads"] == list(range(12)) and d["positions"] == [4]
    assert d["attentions"] == [[[head[4]] for head in every["attentions"][1]]]   # (layer, head, query, key)
    assert len(every["attentions"]) == 6 and len(every["attentions"][0][0]) == 5    # all of it by default
    s = cli.json("attend", "The cat sat", "--summary", "--heads", "0", "--position", "-1")
    assert [(r["layer"], r["head"]) for r in s["summary"]] == [(i, 0) for i in range(6)]
    assert all(len(r["top_keys"]) == 1 and r["top_keys"][0]["query"] == "[SEP]" for r in s["summary"])
    cli.error(["attend", "The cat", "--layer", "1", "--layers", "0"], "--layer/--head (one head) or --layers/--heads")


def test_scan_leaves_out_the_special_tokens_a_model_does_not_have(cli, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("|abcabc\n|bcdbcd\n")
    text = cli.text("scan", str(corpus), "--workers", "0", "--model", "induction")
    assert "no [CLS] or [SEP] token in any line (induction has neither)" in text
    assert not any(line.strip().startswith(("cls:", "sep:")) for line in text.splitlines())
    assert "punctuation:" in text
    d = cli.json("scan", str(corpus), "--workers", "0", "--model", "induction")
    assert d["absent_tokens"] == ["cls", "sep"]


def test_train_note_compares_the_training_part_too():
    from attnlab.cli.train import heldout_note
    floors = {0: 2.3, 1: 0.9, 2: 0.32, 3: 0.30}
    fig = lambda m: {"train": {"model": m, "add_alpha": {1: 1.0}, "floors": floors},   # noqa: E731
                     "heldout": {"model": 1.4, "add_alpha": {1: 1.1}}}
    worse = heldout_note(fig(1.2), 100)
    assert "and on the training part too (1.200 against 1.000)" in worse and "undertrained, not overfitting" in worse
    far = heldout_note(fig(0.6), 100)
    assert "though on the training part it does better (0.600 against 1.000)" in far and "undertrained" in far
    near = heldout_note(fig(0.31), 100)
    assert "(overfitting)" in near and "undertrained" not in near
    assert "attention-guide.txt" in near and "docs/lm.md" in near


def test_train_without_a_terminal_does_not_speak_of_a_progress_bar(cli):
    text = cli.text("train", "--steps", "3")
    assert "progress bar" not in text and "The last step's loss" in text


def test_bench_without_torch_says_how_to_add_it(monkeypatch, capsys):
    from attnlab.cli import bench_harness as bench
    for name, value in (("QUICK_SIZES", (64,)), ("DECODE_CONTEXTS", (32,)), ("QUICK_BACKWARD_SIZES", (32,)),
                        ("BATCH", (2, 16)), ("SCALE_N", 128), ("gemm_gflops", lambda: 100.0),
                        ("blas_contention", lambda: None), ("first_call_row", lambda: FIRST_CALL),
                        ("load_torch", lambda: None)):
        monkeypatch.setattr(bench, name, value)
    assert main(["bench", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "torch: not installed, so the torch columns show '-'" in out and "pip install 'torch==2.13.0'" in out
    assert main(["bench", "--quick", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["machine"]["torch"] is None
