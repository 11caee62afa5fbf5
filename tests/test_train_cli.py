"""attnlab train and attnlab generate: the toy-text bar through --json, checkpoints, and one-line errors."""

import json

import numpy as np
import pytest

pytest.importorskip("rich")
pytest.importorskip("safetensors")

from attnlab.lm.checkpoint import load_checkpoint  # noqa: E402
from attnlab.cli import main  # noqa: E402


def test_train_on_the_toy_text_beats_the_k1_floor(cli):
    out = cli.json("train", "--steps", "150", "--heldout", "0", "--context", "16", "--d-model", "32",
                   "--lr", "0.01")
    assert out["train_tokens"] == 128 and out["heldout_loss"] is None
    assert round(out["floors"]["train"]["1"], 3) == 0.884      # the guide's table, for the same text
    assert out["train_loss"] < 0.884                            # context pays
    assert set(out["add_alpha"]["train"]) == {"1", "2"}


def test_train_table_sets_the_model_beside_floors_and_counts(capsys, tmp_path):
    assert main(["train", "--steps", "20", "--context", "16", "--d-model", "16", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for label in ("attention model", "add-α counts, k = 1", "add-α counts, k = 2", "floor, k = 0", "floor, k = 3",
                  "heldout", "optimistic bound"):
        assert label in out
    model, vocab = load_checkpoint(tmp_path)
    assert model.config.n_ctx == 16 and vocab.size == 15


def test_generate_samples_from_a_checkpoint(cli, capsys, tmp_path):
    assert main(["train", "--steps", "30", "--context", "16", "--d-model", "16", "--positions", "rope",
                 "--out", str(tmp_path), "--json"]) == 0
    capsys.readouterr()
    a = cli.json("generate", str(tmp_path), "--prompt", "the cat", "--tokens", "40", "--seed", "3")
    b = cli.json("generate", str(tmp_path), "--prompt", "the cat", "--tokens", "40", "--seed", "3")
    a.pop("timings"), b.pop("timings")                   # wall times, reported: everything else is the same
    assert a == b and len(a["generated"]) == 16 - 7 and a["text"] == "the cat" + a["generated"]   # the context's room
    assert a["capped"].startswith("--tokens 40 is past the model's context of 16 tokens")
    assert set(a["generated"]) <= set("the cat sat on mat and dog log saw then ran to")
    assert main(["generate", str(tmp_path), "--prompt", "the", "--tokens", "5", "--temperature", "0"]) == 0
    assert capsys.readouterr().out.startswith("the")


def test_ctrl_c_keeps_the_last_checkpoint_whole(capsys, tmp_path, monkeypatch):
    import attnlab.lm.training

    real, calls = attnlab.lm.training.loss_and_grad, []

    def interrupted_at_step_8(*args):
        calls.append(1)
        if len(calls) == 8:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(attnlab.lm.training, "loss_and_grad", interrupted_at_step_8)
    assert main(["train", "--steps", "50", "--context", "16", "--d-model", "16", "--save-every", "5",
                 "--out", str(tmp_path)]) == 130
    assert "interrupted" in capsys.readouterr().err
    model, _ = load_checkpoint(tmp_path)                        # the step-5 checkpoint, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors", "training.safetensors"]


def test_resume_needs_the_same_configuration(cli, capsys, tmp_path):
    assert main(["train", "--steps", "5", "--context", "16", "--d-model", "16", "--out", str(tmp_path), "--json",
                 "--schedule", "constant"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(["train", "--steps", "10", "--context", "16", "--d-model", "16", "--out", str(tmp_path), "--resume",
                 "--json", "--schedule", "constant"]) == 0        # --steps counts every step: 5 more
    assert json.loads(capsys.readouterr().out)["train_loss"] < first["train_loss"]
    cli.error(["train", "--steps", "15", "--context", "16", "--d-model", "16", "--layers", "3",
               "--out", str(tmp_path), "--resume", "--schedule", "constant"],
              "made with a different configuration: n_layers 2 in the checkpoint, 3 asked")


def test_bad_input_is_one_line_and_exit_2(cli, capsys, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    short = tmp_path / "short.txt"
    short.write_text("just a few words")
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"ab\xff\xfe")
    cli.error(["train", str(empty)], "the text is empty")
    cli.error(["train", str(short), "--context", "32"],
              "the training text has 14 tokens, fewer than the context 32 plus one")
    cli.error(["train", str(binary)], "is not UTF-8")
    cli.error(["train", str(tmp_path / "nope.txt")], "No such file")
    cli.error(["train", "--positions", "absolute"], "invalid choice: 'absolute'")
    cli.error(["train", "--heads", "3"], "d_model (64) must be divisible by n_heads (3)")
    cli.error(["train", "--steps", "0"], "steps must be a positive integer, got 0")
    cli.error(["generate", str(tmp_path), "--prompt", "x"], "no checkpoint here")
    cli.error(["train", "--out", str(empty / "sub")], "Not a directory")   # before any training
    assert main(["train", "--steps", "2", "--context", "8", "--d-model", "16", "--out", str(tmp_path / "ck"),
                 "--json"]) == 0
    capsys.readouterr()
    cli.error(["generate", str(tmp_path / "ck"), "--prompt", "the cat sat"],
              "the prompt has 11 tokens, more than the model's context n_ctx 8")
    cli.error(["generate", str(tmp_path / "ck"), "--prompt", "the fox"], "'f' is not in the vocabulary")
    cli.error(["generate", str(tmp_path / "ck"), "--prompt", "the", "--temperature", "-1"],
              "--temperature: must be a number >= 0")
    cli.error(["generate", str(tmp_path / "ck"), "--prompt", "the", "--seed", "-1"],
              "argument --seed: expected an integer >= 0, got '-1'")
    cli.error(["train", "--seed", "-1"], "argument --seed: expected an integer >= 0, got '-1'")


def test_word_level(cli, tmp_path):
    out = cli.json("train", "--level", "word", "--context", "8", "--d-model", "16", "--steps", "60",
                   "--lr", "0.01", "--heldout", "0", "--out", str(tmp_path))
    assert out["config"]["vocab_size"] == 12 and out["train_tokens"] == 33      # the guide's 12 words, 33 tokens
    assert out["train_loss"] < out["floors"]["train"]["0"]                       # it learned more than frequencies
    gen = cli.json("generate", str(tmp_path), "--prompt", "the cat", "--tokens", "5")
    words = gen["generated"].split(" ")
    assert len(words) == 5 and set(words) <= set("the cat sat on mat and dog log saw then ran to".split())
    assert gen["text"] == "the cat " + gen["generated"]


def test_attend_reads_a_folder_that_train_wrote(cli, capsys, tmp_path):
    """attnlab's own checkpoints are a model family: attend, --summary and --html read them like GPT-2's."""
    assert main(["train", "--steps", "10", "--context", "16", "--d-model", "16", "--heads", "4", "--kv-heads", "2",
                 "--positions", "rope", "--rope-theta", "500", "--out", str(tmp_path / "ck"), "--json"]) == 0
    capsys.readouterr()
    from attnlab.models import attend, load_model
    from attnlab.stack.transformer import forward

    r = attend("the cat sat", tmp_path / "ck")
    assert r.tokens == tuple("the cat sat") and r.attentions.weights.shape == (2, 4, 11, 11)
    np.testing.assert_array_equal(r.attentions.keep, np.tril(np.ones((11, 11), bool)))   # a decoder: causal
    model, vocab = load_checkpoint(tmp_path / "ck")
    # attend asks for the weights (the naive path); the same pass, bit for bit
    np.testing.assert_array_equal(r.logits, forward(model, vocab.encode("the cat sat"), return_weights=True).logits)
    assert load_model(tmp_path / "ck")[0].config == model.config
    assert main(["attend", "the cat sat", "--model", str(tmp_path / "ck"), "--head", "3"]) == 0
    assert "(attnlab): 11 tokens, 2 layers x 4 heads" in capsys.readouterr().out
    page = tmp_path / "view.html"
    assert main(["attend", "the cat sat", "--model", str(tmp_path / "ck"), "--summary", "--html", str(page)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("layer head  kv  entropy"))   # 2 KV heads
    assert lines[1].startswith("entropy: ") and len(lines[header + 1:]) == 2 * 4      # a legend, then a row per head
    assert "<canvas" in page.read_text(encoding="utf-8")
    cli.error(["attend", "the zoo", "--model", str(tmp_path / "ck")], "'z' is not in the vocabulary")


def test_rope_theta_and_kv_heads_reach_the_config(cli, tmp_path):
    out = cli.json("train", "--steps", "2", "--context", "8", "--d-model", "16", "--heads", "4",
                   "--kv-heads", "1", "--positions", "rope", "--rope-theta", "77")
    assert out["config"]["attention"]["positions"] == {"name": "rope", "theta": 77.0, "scaling": None}
    assert out["config"]["attention"]["n_kv_heads"] == 1
    cli.error(["train", "--positions", "alibi", "--rope-theta", "5"],
              "--rope-theta applies to --positions rope only, got --positions alibi")
    cli.error(["train", "--heads", "4", "--kv-heads", "3"],
              "n_heads (4) must be a multiple of n_kv_heads (3)")


@pytest.mark.slow
def test_train_gpt_blocks_writes_a_checkpoint_generate_reads(cli, tmp_path):
    """--block gpt: nanoGPT's blocks (pre-norm LayerNorm, a 4 × d_model MLP, a final norm) train and save."""
    out = cli.json("train", "--block", "gpt", "--steps", "150", "--heldout", "0", "--context", "16",
                   "--d-model", "32", "--lr", "0.01", "--out", str(tmp_path))
    c = out["config"]
    assert c["d_mlp"] == 128 and c["norm"] == "layer" and c["block"] == "pre_norm"
    assert out["train_loss"] < 0.884                            # beats the k = 1 floor, as attention alone does
    model, _ = load_checkpoint(tmp_path)
    assert model.n_params == out["params"] and model.ln_final is not None
    assert main(["generate", str(tmp_path), "--prompt", "the", "--tokens", "5", "--temperature", "0"]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("train_only", ["all", "attention"])
def test_fine_tune_a_gpt2_folder_writes_a_checkpoint_every_command_reads(cli, capsys, tmp_path, write_gpt2, train_only):
    from attnlab.models import load_model

    folder = write_gpt2(n_positions=40)
    text = tmp_path / "text.txt"
    text.write_text(" the cat sat on the mat" * 40)
    out = cli.json("train", "--from", str(folder), str(text), "--steps", "8", "--context", "24", "--lr",
                   "3e-3", "--train-only", train_only, "--out", str(tmp_path / "tuned"))
    assert out["heldout_after"] < out["heldout_before"]
    assert out["seconds_per_step"] > 0 and out["peak_numpy_bytes_per_step"] > 0
    before, _ = load_model(folder)
    after, tokenizer = load_model(tmp_path / "tuned")
    changed = {k for k, v in after.params().items() if not np.array_equal(v, before.params()[k])}
    if train_only == "attention":
        assert changed and all(".attn." in k for k in changed)
        assert out["trained_params"] < out["params"]
    else:
        assert "W_E" in changed and "ln_final.weight" in changed
    assert tokenizer.encode(" the cat").tolist() == load_model(folder)[1].encode(" the cat").tolist()
    assert main(["generate", str(tmp_path / "tuned"), "--prompt", " the", "--tokens", "4"]) == 0
    capsys.readouterr()
    cli.error(["train", "--from", str(folder)], "--from needs FILE")
