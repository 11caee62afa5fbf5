"""attnlab detect / ablate / patch / lens / scan / train --task induction from the command line: JSON that
matches the library, figures written, and one line with exit code 2 for each bad input of the issue."""

import json

import numpy as np
import pytest

from attnlab.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def bad(capsys, *argv, match):
    code, out, err = run(capsys, *argv)
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("attnlab: error:") and match in err, err
    return err


@pytest.fixture(scope="module")
def gpt2(tiny_gpt2_folder):
    return str(tiny_gpt2_folder)


def shipped():
    from attnlab.interpret.trained import induction_checkpoint
    return str(induction_checkpoint())


def test_detect_json_matches_the_library(capsys):
    from attnlab.interpret import detect_heads
    from attnlab.models import load_model
    code, out, _ = run(capsys, "detect", "abcdeabcde", "--model", shipped(), "--json", "--exclude-bos")
    assert code == 0
    data = json.loads(out)
    assert data["tokens"] == list("abcdeabcde") and set(data["scores"]) == {"previous_token", "duplicate_token",
                                                                            "induction"}
    model, tok = load_model(shipped())
    want = detect_heads(model, tok.encode("abcdeabcde"), exclude_bos=True)
    for k, v in want.items():
        np.testing.assert_allclose(data["scores"][k], v, rtol=0, atol=1e-12)


def test_detect_repeat_random_on_the_induction_model(capsys, tmp_path):
    code, out, _ = run(capsys, "detect", "--model", shipped(), "--repeat-random", "6", "--exclude-bos",
                       "--png", str(tmp_path / "d.png"), "--json")
    data = json.loads(out)
    assert data["tokens"][0] == "|" and data["tokens"][1:7] == data["tokens"][7:]
    assert max(data["scores"]["induction"][1]) > 0.7 and max(data["scores"]["previous_token"][0]) > 0.7
    assert (tmp_path / "d.png").stat().st_size > 1000
    code, out, _ = run(capsys, "interpret", "detect", "--model", shipped(), "--repeat-random", "5", "--kind",
                       "induction")
    assert code == 0 and "induction: L1H" in out


def test_detect_bad_input(capsys):
    bad(capsys, "detect", "abcabc", "--model", shipped(), "--kind", "copying", match="kind must be one of")
    bad(capsys, "detect", "a", "--model", shipped(), match="at least 2")
    bad(capsys, "detect", "--model", shipped(), "--repeat-random", "20", match="more than the model's 24 positions")
    bad(capsys, "detect", "abc", "--model", shipped(), "--repeat-random", "4", match="either TEXT or --repeat-random")


def test_ablate_patch_lens_json_match_the_library(capsys, gpt2, tmp_path):
    from attnlab.interpret import ablate, logit_lens, patch
    from attnlab.models import load_model
    model, tok = load_model(gpt2)
    code, out, _ = run(capsys, "ablate", "the cat sat", "--model", gpt2, "--mode", "mean", "--json",
                       "--png", str(tmp_path / "a.png"))
    assert code == 0
    np.testing.assert_allclose(json.loads(out)["delta"], ablate(model, tok.encode("the cat sat"), mode="mean").delta)
    code, out, _ = run(capsys, "patch", "--model", gpt2, "--clean", "the cat sat", "--corrupt", "the sat cat",
                       "--answer", " cat", "--wrong", " the", "--json", "--png", str(tmp_path / "p.png"))
    assert code == 0
    r = patch(model, tok.encode("the cat sat"), tok.encode("the sat cat"), answer=int(tok.encode(" cat")[0]),
              wrong=int(tok.encode(" the")[0]))
    d = json.loads(out)
    np.testing.assert_allclose(d["heads"], r.heads)
    np.testing.assert_allclose(d["resid"], r.resid)
    assert (tmp_path / "p.png").is_file() and (tmp_path / "p_resid.png").is_file()
    code, out, _ = run(capsys, "lens", "the cat sat", "--model", gpt2, "--top", "2", "--json")
    lens = logit_lens(model, tok.encode("the cat sat"), top=2)
    got = json.loads(out)["top"]
    assert [[[t["id"] for t in pos] for pos in stage] for stage in got] == lens.top_ids.tolist()
    code, out, _ = run(capsys, "lens", "the cat sat", "--model", gpt2)
    assert code == 0 and "block 1" in out


def test_interventions_bad_input(capsys, gpt2):
    bad(capsys, "ablate", "the cat sat", "--model", "minilm", match="bidirectional")
    bad(capsys, "patch", "--model", gpt2, "--clean", "the cat sat", "--corrupt", "the sat", "--answer", " cat",
        "--wrong", " the", match="same number")
    bad(capsys, "patch", "--model", gpt2, "--clean", "the cat", "--corrupt", "the sat", "--answer", " cat hat",
        "--wrong", " the", match="--answer must be one token")


def test_scan_cli_in_one_process(capsys, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("abcabc\nab\n" + "abcdefghijabcdefghijabcdefghij\n" + "x\n", encoding="utf-8")
    code, out, _ = run(capsys, "scan", str(corpus), "--model", shipped(), "--workers", "0", "--json",
                       "--out", str(tmp_path / "figs"))
    d = json.loads(out)
    assert code == 0 and d["lines"] == 2 and d["skipped_too_long"] == 1 and d["skipped_one_token"] == 1
    assert {"entropy", "cls", "induction"} <= set(d["means"]) and len(d["figures"]) == 3


def test_scan_bad_input(capsys, tmp_path):
    bad(capsys, "scan", str(tmp_path / "missing.txt"), match="No such file")
    (tmp_path / "empty.txt").write_text("\n\n")
    bad(capsys, "scan", str(tmp_path / "empty.txt"), match="no non-blank line")


def test_train_induction_json_and_resume(capsys, tmp_path, monkeypatch):
    import attnlab.lm.training

    out = str(tmp_path / "run")
    real, calls = attnlab.lm.training.loss_and_grad, []

    def interrupted_at_step_5(*args):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(attnlab.lm.training, "loss_and_grad", interrupted_at_step_5)
    code, _, _ = run(capsys, "train", "--task", "induction", "--steps", "6", "--save-every", "4", "--d-model", "16",
                     "--out", out, "--json")
    assert code == 130                                   # Ctrl-C at step 5: the step-4 checkpoint is on disk
    monkeypatch.setattr(attnlab.lm.training, "loss_and_grad", real)
    bad(capsys, "train", "--task", "induction", "--steps", "8", "--d-model", "16", "--out", out, "--resume",
        match="cosine schedule laid out over --steps 6")
    code, text, _ = run(capsys, "train", "--task", "induction", "--steps", "6", "--d-model", "16", "--out", out,
                        "--resume", "--json")
    d = json.loads(text)
    assert code == 0 and d["steps"] == 6
    for key in ("first_loss", "repeat_loss", "previous_token_scores", "induction_scores", "phase_change_step"):
        assert key in d
    assert np.shape(d["induction_scores"]) == (2, 2) and len(d["figures"]) == 2
    bad(capsys, "train", "--task", "induction", "--steps", "6", "--d-model", "16", "--out", out, "--resume",
        match="already taken 6 steps")
    code, text, _ = run(capsys, "detect", "--model", out, "--repeat-random", "5", "--json")
    assert code == 0
    code, text, _ = run(capsys, "attend", "abcab", "--model", out, "--json")
    assert code == 0


def test_patching_the_induction_model_finds_its_circuit(capsys):
    """'|abcdefgabcde' predicts f; with the first e replaced ('|abcdzfgabcde') the current e has no earlier copy.
    Patching back the previous-token head restores it all, as does the clean residual at the first e (into
    layer 0) or at the f after it (into layer 1, where the induction head's key reads 'my previous token is e')."""
    code, out, _ = run(capsys, "patch", "--model", "induction", "--clean", "|abcdefgabcde", "--corrupt",
                       "|abcdzfgabcde", "--answer", "f", "--wrong", "g", "--json")
    d = json.loads(out)
    assert code == 0 and d["clean_logit_diff"] > 5 > 0 > d["corrupt_logit_diff"]
    heads, resid = np.array(d["heads"]), np.array(d["resid"])
    assert heads[0].max() > 0.9 and resid[0, 5] > 0.99 and resid[1, 6] > 0.9
    np.testing.assert_allclose(np.delete(resid[0], 5), 0.0, atol=1e-9)     # the texts agree everywhere else
