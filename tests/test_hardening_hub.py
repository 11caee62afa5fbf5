"""The hub-cache exception to a model folder's boundary (issue 31, cause 1): a snapshot's files may resolve into
its cache entry's ``blobs/`` only when that is a real folder beside ``snapshots``, and no symlink outside the
snapshot or ``blobs/`` is ever followed. An open trace (strace ``-y``) shows what the process really opened."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from attnlab.cli import main
from attnlab.models import load_model

pytest.importorskip("safetensors")
tokenizers = pytest.importorskip("tokenizers")

SECRET = "hunter2secret"
LLAMA = {"model_type": "llama", "vocab_size": 50, "hidden_size": 16, "intermediate_size": 24,
         "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 32,
         "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False}


def word_tokenizer_json(words) -> str:
    """A tokenizer.json of whole words (split at spaces), the first word id 0."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate([*words, "[UNK]"])}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok.to_str()


@pytest.fixture
def hub(tmp_path, rng, random_llama_tensors):
    """A hub cache entry ``hub/models--x--y`` whose snapshot links every file into its real ``blobs/``;
    and an ``outside`` folder holding a tokenizer.json whose only word is a secret."""
    from safetensors.numpy import save_file

    entry = tmp_path / "hub" / "models--x--y"
    snapshot, blobs = entry / "snapshots" / "0123abcd", entry / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    files = {"config.json": json.dumps(LLAMA).encode(),
             "tokenizer.json": word_tokenizer_json(["the", "cat", "sat"]).encode()}
    save_file(random_llama_tensors(LLAMA, rng, std=0.2), str(tmp_path / "weights"))
    files["model.safetensors"] = (tmp_path / "weights").read_bytes()
    for i, (name, data) in enumerate(files.items()):
        (blobs / f"{i:040x}").write_bytes(data)
        (snapshot / name).symlink_to(f"../../blobs/{i:040x}")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "tokenizer.json").write_text(word_tokenizer_json([SECRET, "the", "cat"]))
    return snapshot, blobs, outside


def attend_error(capsys, snapshot) -> str:
    assert main(["attend", "the cat", "--model", str(snapshot)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert SECRET not in captured.out + captured.err
    return err


def test_a_genuine_hub_snapshot_loads(hub):
    snapshot, _, _ = hub
    model, tok = load_model(snapshot)
    assert tok.encode("the cat").tolist() == [0, 1] and model.config.d_model == 16


def test_blobs_as_a_symlink_out_of_the_cache_entry_is_refused(hub, capsys):
    snapshot, blobs, outside = hub
    shutil.rmtree(blobs)
    blobs.symlink_to(outside)                                 # blobs -> a folder the model's author chose
    (snapshot / "tokenizer.json").unlink()
    (snapshot / "tokenizer.json").symlink_to("../../blobs/tokenizer.json")
    with pytest.raises(ValueError, match="the entry 'config.json' resolves outside the model folder"):
        load_model(snapshot)
    assert "resolves outside the model folder" in attend_error(capsys, snapshot)


def test_blobs_as_a_symlink_to_the_root_never_reaches_etc_passwd(hub, capsys):
    snapshot, blobs, _ = hub
    for name in ("config.json", "model.safetensors"):      # config and weights stay readable: plain files …
        data = (snapshot / name).read_bytes()
        (snapshot / name).unlink()
        (snapshot / name).write_bytes(data)
    shutil.rmtree(blobs)
    blobs.symlink_to("/")                                     # … and blobs -> /
    (snapshot / "tokenizer.json").unlink()
    (snapshot / "tokenizer.json").symlink_to("../../blobs/etc/passwd")
    with pytest.raises(ValueError, match="the entry 'tokenizer.json' resolves outside the model folder"):
        load_model(snapshot)
    err = attend_error(capsys, snapshot)
    assert "tokenizer.json" in err and "passwd" not in err and "root:" not in err


def test_a_link_that_leaves_and_comes_back_into_blobs_is_refused(hub, tmp_path):
    snapshot, blobs, outside = hub
    hop = outside / "hop"
    hop.symlink_to(os.readlink(snapshot / "tokenizer.json").replace("../../blobs", str(blobs)))
    (snapshot / "tokenizer.json").unlink()
    (snapshot / "tokenizer.json").symlink_to(hop)             # ends in blobs/, but through a link outside
    with pytest.raises(ValueError, match="the entry 'tokenizer.json' resolves outside"):
        load_model(snapshot)


def test_a_blob_that_is_itself_a_link_out_is_refused(hub):
    snapshot, blobs, outside = hub
    blob = blobs / os.path.basename(os.readlink(snapshot / "tokenizer.json"))
    blob.unlink()
    blob.symlink_to(outside / "tokenizer.json")
    with pytest.raises(ValueError, match="the entry 'tokenizer.json' resolves outside"):
        load_model(snapshot)


def test_a_blobs_folder_of_another_cache_entry_is_refused(hub, tmp_path):
    snapshot, blobs, _ = hub
    other = tmp_path / "hub" / "models--a--b"
    shutil.copytree(blobs.parent, other, symlinks=True)
    (snapshot / "tokenizer.json").unlink()                    # ../../../models--a--b/blobs/…: not its own entry
    name = os.path.basename(os.readlink(other / "snapshots" / "0123abcd" / "tokenizer.json"))
    (snapshot / "tokenizer.json").symlink_to(f"../../../models--a--b/blobs/{name}")
    with pytest.raises(ValueError, match="the entry 'tokenizer.json' resolves outside"):
        load_model(snapshot)


# --- the open trace ---------------------------------------------------------------------------------------------

LOAD = "import sys\nfrom attnlab.models import load_model\ntry:\n    load_model(sys.argv[1])\nexcept ValueError as e:\n" \
       "    print(e)\n"


def opened_files(tmp_path, snapshot) -> tuple[list[str], str]:
    """Every file the process opened (strace -y: the path the descriptor really is, symlinks resolved), and
    what the load printed."""
    log = tmp_path / "trace.txt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    run = subprocess.run(["strace", "-f", "-qq", "-e", "trace=openat,open", "-y", "-o", str(log), sys.executable,
                          "-c", LOAD, str(snapshot)], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    opened = []
    for line in log.read_text().splitlines():
        m = re.search(r'open(?:at)?\(.*?"([^"]*)".*\)\s*=\s*(\d+)<([^>]*)>', line)
        if m:
            opened.append(m.group(3))
        elif "open" in line and "= -1" not in line and '"' in line:
            opened.append(re.search(r'"([^"]*)"', line).group(1))
    return opened, run.stdout


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
@pytest.mark.parametrize("layout", ["genuine", "blobs link", "blobs to root"])
def test_the_open_trace_shows_nothing_opened_outside_the_snapshot_or_a_genuine_blobs(hub, tmp_path, layout):
    snapshot, blobs, outside = hub
    if layout == "blobs link":
        shutil.rmtree(blobs)
        blobs.symlink_to(outside)
        (snapshot / "tokenizer.json").unlink()
        (snapshot / "tokenizer.json").symlink_to("../../blobs/tokenizer.json")
    elif layout == "blobs to root":
        shutil.rmtree(blobs)
        blobs.symlink_to("/")
        for name in ("config.json", "tokenizer.json", "model.safetensors"):
            (snapshot / name).unlink()
        (snapshot / "tokenizer.json").symlink_to("../../blobs/etc/passwd")
        (snapshot / "config.json").symlink_to("../../blobs/etc/passwd")
    probe = subprocess.run(["strace", "-qq", "-e", "trace=openat", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"strace cannot trace here: {probe.stderr.decode().strip()[:80]}")
    opened, printed = opened_files(tmp_path, snapshot)
    assert opened, "strace saw no file opened"
    mine = [p for p in opened if p.startswith(str(tmp_path.resolve())) or p == "/etc/passwd"]
    allowed = (str(snapshot.resolve()) + os.sep, str(blobs.resolve()) + os.sep)
    assert all(p.startswith(allowed) for p in mine), mine
    if layout == "genuine":
        assert printed == "" and any(p.startswith(allowed[1]) for p in mine)     # the model was read from blobs/
    else:
        assert "resolves outside the model folder" in printed and not mine
