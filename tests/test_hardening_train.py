"""Checkpoints as one set (issue 26): a kill at any point of a save leaves one whole step; --resume checks that
the files agree on the step, saves the last step, and refuses a schedule it could not follow exactly."""

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("safetensors")

import attnlab._io  # noqa: E402
import attnlab.lm.training  # noqa: E402
from attnlab.cli import main  # noqa: E402
from attnlab.lm.checkpoint import checkpoint_step, load_checkpoint  # noqa: E402
from attnlab.lm.model import lm_config  # noqa: E402
from attnlab.lm.resume import load_training_run, save_training_run  # noqa: E402
from attnlab.lm.training import AdamState, training_steps  # noqa: E402
from attnlab.stack.transformer import Transformer  # noqa: E402
from attnlab.text.tokens import Vocab  # noqa: E402

TEXT = "the cat sat on the mat and the cat ate the rat " * 3
TINY = ["--context", "8", "--d-model", "16", "--layers", "1", "--heads", "2", "--batch", "4"]


def trained(steps: int):
    """A tiny model, its Adam state and generator after ``steps`` steps (the same run each time)."""
    vocab = Vocab.from_text(TEXT)
    rng = np.random.default_rng(3)
    model = Transformer.init(lm_config(vocab.size, d_model=8, n_heads=2, n_layers=1, n_ctx=8), rng=rng)
    state = AdamState.zeros(model.params())
    list(training_steps(model, vocab.encode(TEXT), steps=steps, batch_size=2, rng=rng, state=state))
    return model, vocab, state, rng


class Killed(BaseException):
    """The kill a test injects (a BaseException, like KeyboardInterrupt: nothing catches it by accident)."""


def kill_on_write(monkeypatch, name: str, *, after: bool):
    """Kill when the save writes ``name`` (config.json through Path.write_text, the .safetensors through
    safetensors' save_file): before anything is written, or after the file is written, half of it kept."""
    import pathlib

    import safetensors.numpy

    real_write_text, real_save = pathlib.Path.write_text, safetensors.numpy.save_file

    def hit(path) -> bool:
        return pathlib.Path(path).name == name

    def write_text(self, *args, **kwargs):
        if hit(self) and not after:
            raise Killed
        out = real_write_text(self, *args, **kwargs)
        if hit(self):
            raise Killed
        return out

    def save_file(tensors, filename, metadata=None):
        if hit(filename) and not after:
            raise Killed
        real_save(tensors, filename, metadata=metadata)
        if hit(filename):
            with open(filename, "r+b") as f:
                f.truncate(100)
            raise Killed

    monkeypatch.setattr(pathlib.Path, "write_text", write_text)
    monkeypatch.setattr(safetensors.numpy, "save_file", save_file)


def kill_at_exchange(monkeypatch, **_):
    def exchange(new, path):
        raise Killed
    monkeypatch.setattr(attnlab._io, "_exchange", exchange)


def kill_after_exchange(monkeypatch, **_):
    """The new set is in place; the kill comes while the old one is being removed."""
    real = shutil.rmtree

    def rmtree(path, ignore_errors=False):
        monkeypatch.setattr(shutil, "rmtree", real)
        raise Killed
    monkeypatch.setattr(shutil, "rmtree", rmtree)


SAVE_POINTS = [
    ("before config.json", lambda mp: kill_on_write(mp, "config.json", after=False), 2),
    ("after config.json", lambda mp: kill_on_write(mp, "config.json", after=True), 2),
    ("before model.safetensors", lambda mp: kill_on_write(mp, "model.safetensors", after=False), 2),
    ("half model.safetensors", lambda mp: kill_on_write(mp, "model.safetensors", after=True), 2),
    ("before training.safetensors", lambda mp: kill_on_write(mp, "training.safetensors", after=False), 2),
    ("half training.safetensors", lambda mp: kill_on_write(mp, "training.safetensors", after=True), 2),
    ("at the exchange", kill_at_exchange, 2),
    ("after the exchange", kill_after_exchange, 4),
]


@pytest.mark.parametrize("point,inject,survivor", SAVE_POINTS, ids=[p[0] for p in SAVE_POINTS])
def test_a_kill_at_every_save_point_leaves_one_whole_step(tmp_path, monkeypatch, point, inject, survivor):
    out = tmp_path / "ck"
    runs = {2: trained(2), 4: trained(4)}
    save_training_run(out, *runs[2])
    inject(monkeypatch)
    with pytest.raises(Killed):
        save_training_run(out, *runs[4])
    monkeypatch.undo()
    model, _, state, rng, _ = load_training_run(out)
    assert state.t == survivor and checkpoint_step(out) == survivor
    want_model, _, want_state, want_rng = runs[survivor]
    for name, a in want_model.params().items():
        np.testing.assert_array_equal(model.params()[name], a, err_msg=name)
        np.testing.assert_array_equal(state.m[name], want_state.m[name])
    assert rng.bit_generator.state == want_rng.bit_generator.state
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "training.safetensors"]
    if survivor == 2:                                    # nothing half-written left beside the checkpoint
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_files_of_different_steps_are_refused_on_resume(tmp_path, capsys):
    for steps in (4, 2):
        assert main(["train", "--steps", str(steps), *TINY, "--out", str(tmp_path / f"s{steps}"), "--json"]) == 0
    capsys.readouterr()
    # the pair a Ctrl-C left before saves were one set: the step-4 weights, the step-2 optimiser state
    shutil.copy(tmp_path / "s2" / "training.safetensors", tmp_path / "s4" / "training.safetensors")
    with pytest.raises(ValueError, match="is not one checkpoint: model.safetensors and config.json are at step 4, "
                                         "training.safetensors at step 2"):
        load_training_run(tmp_path / "s4")
    assert main(["train", "--steps", "4", *TINY, "--out", str(tmp_path / "s4"), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "not one checkpoint" in err and len(err.strip().splitlines()) == 1
    config = json.loads((tmp_path / "s2" / "config.json").read_text())
    config["step"] = 5                                   # config.json from one save, the weights from another
    (tmp_path / "s2" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="is the model at step 2, .*config.json says step 5"):
        load_checkpoint(tmp_path / "s2")


def test_a_resumed_run_saves_its_last_step(tmp_path, capsys):
    out = str(tmp_path / "ck")
    common = [*TINY, "--schedule", "constant", "--save-every", "5", "--out", out, "--json"]
    assert main(["train", "--steps", "5", *common]) == 0
    assert main(["train", "--steps", "12", *common, "--resume"]) == 0    # 12 is not a multiple of 5
    capsys.readouterr()
    assert checkpoint_step(out) == 12 and load_training_run(out)[2].t == 12


def interrupt_at(monkeypatch, step: int):
    real, calls = attnlab.lm.training.loss_and_grad, []

    def interrupted(*args):
        calls.append(1)
        if len(calls) == step:
            raise KeyboardInterrupt
        return real(*args)
    monkeypatch.setattr(attnlab.lm.training, "loss_and_grad", interrupted)


@pytest.mark.parametrize("schedule", ["cosine", "constant"])
def test_resume_ends_bit_for_bit_where_an_uninterrupted_run_ends(tmp_path, capsys, monkeypatch, schedule):
    common = [*TINY, "--schedule", schedule, "--save-every", "3", "--json"]
    assert main(["train", "--steps", "8", *common, "--out", str(tmp_path / "whole")]) == 0
    if schedule == "cosine":                             # interrupted after the step-6 save, resumed to the same 8
        interrupt_at(monkeypatch, 7)
        assert main(["train", "--steps", "8", *common, "--out", str(tmp_path / "resumed")]) == 130
        monkeypatch.undo()
    else:                                                # a finished 4-step run, extended to 8
        assert main(["train", "--steps", "4", *common, "--out", str(tmp_path / "resumed")]) == 0
    assert main(["train", "--steps", "8", *common, "--out", str(tmp_path / "resumed"), "--resume"]) == 0
    capsys.readouterr()
    whole, resumed = load_checkpoint(tmp_path / "whole")[0], load_checkpoint(tmp_path / "resumed")[0]
    for name, a in whole.params().items():
        np.testing.assert_array_equal(resumed.params()[name], a, err_msg=name)


def test_a_cosine_run_resumed_to_another_length_is_refused(tmp_path, capsys):
    out = str(tmp_path / "ck")
    assert main(["train", "--steps", "4", *TINY, "--out", out, "--json"]) == 0
    capsys.readouterr()
    assert main(["train", "--steps", "8", *TINY, "--out", out, "--resume"]) == 2
    err = capsys.readouterr().err
    assert "cosine schedule laid out over --steps 4; --steps 8 would change the rate of every step" in err
    assert main(["train", "--steps", "8", *TINY, "--out", out, "--resume", "--schedule", "constant"]) == 2
    assert "--schedule cosine then, constant now" in capsys.readouterr().err


def test_a_checkpoint_folder_with_other_files_is_not_swapped_away(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["train", "--steps", "2", *TINY, "--out", str(tmp_path)]) == 2
    assert "holds files that are not the checkpoint's (notes.txt)" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_without_an_atomic_exchange_the_folder_is_still_replaced_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(attnlab._io, "_renameat2_exchange", lambda a, b: False)   # the two renames elsewhere
    out = tmp_path / "ck"
    save_training_run(out, *trained(2))
    save_training_run(out, *trained(4))
    assert load_training_run(out)[2].t == 4 and sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


# --- fine-tuning (issue 31, cause 8): a bad --out before any training, never the source, stale saves removed -----

@pytest.fixture
def finetune(tmp_path, write_gpt2, monkeypatch):
    """``finetune(*argv)``: ``attnlab train --from GPT2 TEXT --steps 2 …`` -> (exit code, stderr, steps run)."""
    folder = write_gpt2(n_positions=40)
    text = tmp_path / "text.txt"
    text.write_text(" the cat sat on the mat" * 40)
    steps_run = []
    real = attnlab.lm.training.steps_on

    def counted(*args, **kwargs):
        for s in real(*args, **kwargs):
            steps_run.append(s)
            yield s
    monkeypatch.setattr(attnlab.lm.training, "steps_on", counted)

    def run(*argv, capsys):
        code = main(["train", "--from", str(folder), str(text), "--steps", "2", "--context", "16", *map(str, argv)])
        return code, capsys.readouterr().err, len(steps_run)
    run.folder = folder
    return run


def read_only_parent(tmp_path):
    """A folder this process cannot create entries in (root ignores modes: /sys then)."""
    import os

    if os.geteuid() == 0:
        return "/sys"
    parent = tmp_path / "ro"
    parent.mkdir(mode=0o500)
    return parent


@pytest.mark.parametrize("where", ["a file", "a folder with other files", "a read-only parent"])
def test_a_bad_fine_tuning_out_fails_before_training(tmp_path, finetune, capsys, where):
    if where == "a file":
        out = tmp_path / "out.txt"
        out.write_text("x")
    elif where == "a folder with other files":
        out = tmp_path / "mine"
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    else:
        out = f"{read_only_parent(tmp_path)}/attnlab-out"
    code, err, steps = finetune("--out", out, capsys=capsys)
    assert code == 2 and steps == 0, err
    assert err.startswith("attnlab: error:") and err.count("\n") == 1 and "Traceback" not in err, err
    assert str(out) in err


def test_fine_tuning_into_its_own_source_is_refused(finetune, capsys):
    before = {p.name: p.read_bytes() for p in finetune.folder.iterdir()}
    code, err, steps = finetune("--out", finetune.folder, capsys=capsys)
    assert code == 2 and steps == 0 and "is the --from folder" in err, err
    assert {p.name: p.read_bytes() for p in finetune.folder.iterdir()} == before


@pytest.mark.parametrize("batch", ["0", "-1"])
@pytest.mark.parametrize("source", ["from", "new"])
def test_a_batch_below_one_names_the_option(cli, finetune, capsys, batch, source):
    if source == "from":
        code, err, steps = finetune("--batch", batch, capsys=capsys)
        assert code == 2 and steps == 0
        assert "argument --batch: expected an integer >= 1" in err and err.count("\n") == 1, err
    else:
        cli.error(["train", "--steps", "2", "--batch", batch], "argument --batch: expected an integer >= 1")


def test_saves_killed_midway_are_cleaned_up_on_the_next_run(tmp_path, finetune, capsys):
    out = tmp_path / "chain"
    stale = [tmp_path / ".chain.abc123_x.part", tmp_path / f".chain.{2**22 + 12345}-abcdefgh.part"]
    for p in stale:                                          # an old-style name, and a dead process's
        p.mkdir()
        (p / "model.safetensors").write_bytes(b"half")
    live = tmp_path / f".chain.{__import__('os').getpid()}-livelive.part"   # a save running now: kept
    live.mkdir()
    other = tmp_path / ".chainx.abcdefgh.part"                # another checkpoint's: kept
    other.mkdir()
    code, err, steps = finetune("--out", out, capsys=capsys)
    assert code == 0 and steps == 2, err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".part")) == sorted([live.name, other.name])
