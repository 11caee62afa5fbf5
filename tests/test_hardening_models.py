"""Hostile model folders (issue 26): nothing is read outside the folder, every safetensors header is checked as
the format's spec says, and every bad file is one line naming the file and the field, exit code 2."""

import builtins
import io
import json
import os

import numpy as np
import pytest

from attnlab.cli import main
from attnlab.models import load_model, load_network, read_safetensors

safetensors = pytest.importorskip("safetensors")
from safetensors.numpy import save_file  # noqa: E402

LLAMA = {"model_type": "llama", "vocab_size": 50, "hidden_size": 16, "intermediate_size": 24,
         "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 32,
         "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False}


@pytest.fixture
def opened(monkeypatch):
    """Every path opened through open/io.open/os.open (numpy's memmap and pathlib go through them), resolved."""
    seen = []
    real_open, real_os_open = builtins.open, os.open

    def traced_open(file, *args, **kwargs):
        if isinstance(file, (str, os.PathLike)):
            seen.append(os.path.realpath(file))
        return real_open(file, *args, **kwargs)

    def traced_os_open(path, *args, **kwargs):
        seen.append(os.path.realpath(path))
        return real_os_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", traced_open)
    monkeypatch.setattr(io, "open", traced_open)
    monkeypatch.setattr(os, "open", traced_os_open)
    return seen


def cli_error(capsys, *argv) -> str:
    """The one line ``attnlab ARGV`` prints, having exited with 2 and no traceback."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def write_llama(folder, rng, random_llama_tensors, config=LLAMA, edit=None):
    folder.mkdir(parents=True, exist_ok=True)
    tensors = random_llama_tensors(config if "head_dim" not in config else LLAMA, rng, std=0.2)
    if edit:
        edit(tensors)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def shard_gpt2(folder, name_of):
    """Move a GPT-2 folder's one file into two shards listed by an index; ``name_of(i)`` names shard i."""
    from safetensors.numpy import load_file

    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    names = sorted(tensors)
    weight_map = {}
    for i, part in enumerate((names[::2], names[1::2])):
        target = name_of(i)
        path = target if os.path.isabs(target) else folder / target
        save_file({k: tensors[k] for k in part}, str(path))
        weight_map.update(dict.fromkeys(part, target))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


# --- 1. the folder is a boundary --------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["dotdot", "absolute"])
def test_a_shard_outside_the_folder_is_refused_before_anything_is_opened(tmp_path, write_gpt2, opened, capsys,
                                                                         where):
    folder = write_gpt2()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    name_of = {"dotdot": lambda i: f"../elsewhere/shard{i}.safetensors" if i else "shard0.safetensors",
               "absolute": lambda i: str(outside / f"shard{i}.safetensors") if i else "shard0.safetensors"}[where]
    shard_gpt2(folder, name_of)
    opened.clear()
    with pytest.raises(ValueError, match=r"the entry '.*shard1\.safetensors' listed in model\.safetensors\.index"
                                         r"\.json's weight_map resolves outside the model folder"):
        load_network(folder)
    assert not [p for p in opened if p.startswith(str(outside.resolve()))], opened
    assert not [p for p in opened if p.endswith(".safetensors")]          # refused before any shard is opened
    assert "resolves outside the model folder" in cli_error(capsys, "attend", "hi", "--model", str(folder))


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "vocab.json", "merges.txt"])
def test_a_symlink_out_of_the_folder_is_refused_and_never_opened(tmp_path, write_gpt2, opened, capsys, name):
    folder = write_gpt2()
    secret = tmp_path / "secret"
    secret.mkdir()
    (folder / name).rename(secret / name)                 # a valid file, just outside
    (folder / name).symlink_to(secret / name)
    opened.clear()
    with pytest.raises(ValueError, match=f"the entry '{name}' resolves outside the model folder"):
        load_model(folder)
    assert not [p for p in opened if p.startswith(str(secret.resolve()))], opened
    err = cli_error(capsys, "attend", "hi", "--model", str(folder))
    assert name in err and str(secret) not in err


def test_a_symlinked_index_and_tokenizer_json_outside_are_refused(tmp_path, rng, random_llama_tensors, opened):
    folder = write_llama(tmp_path / "llama", rng, random_llama_tensors)
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "tokenizer.json").write_text("{}")
    (folder / "tokenizer.json").symlink_to(secret / "tokenizer.json")
    opened.clear()
    with pytest.raises(ValueError, match="the entry 'tokenizer.json' resolves outside"):
        load_model(folder)
    (folder / "model.safetensors").rename(secret / "model-1.safetensors")
    (secret / "index.json").write_text(json.dumps({"weight_map": {"x": "model-1.safetensors"}}))
    (folder / "model.safetensors.index.json").symlink_to(secret / "index.json")
    opened.clear()
    with pytest.raises(ValueError, match="the entry 'model.safetensors.index.json' resolves outside"):
        load_network(folder)
    assert not [p for p in opened if p.startswith(str(secret.resolve()))], opened


def test_a_hub_snapshot_with_symlinks_into_blobs_still_loads(tmp_path, write_gpt2, opened):
    plain = write_gpt2("plain")
    repo = tmp_path / "hub" / "models--someone--gpt2"
    snapshot, blobs = repo / "snapshots" / "0123abcd", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, f in enumerate(sorted(plain.iterdir())):
        (blobs / f"{i:040x}").write_bytes(f.read_bytes())
        (snapshot / f.name).symlink_to(f"../../blobs/{i:040x}")
    opened.clear()
    model, tok = load_model(snapshot)
    assert opened and all(p.startswith(str(blobs.resolve())) for p in opened), opened
    reference, _ = load_model(plain)
    assert np.array_equal(model.W_E, reference.W_E) and tok.encode(" cat").tolist() == [258]   # "Ġcat", merge 3
    (snapshot / "vocab.json").unlink()                    # …but a snapshot's link out of the cache is refused
    (snapshot / "vocab.json").symlink_to(plain / "vocab.json")
    with pytest.raises(ValueError, match="the entry 'vocab.json' resolves outside"):
        load_model(snapshot)


@pytest.mark.parametrize("shard", ["", "."])
def test_an_empty_or_dot_weight_map_entry_is_one_line(write_gpt2, capsys, shard):
    folder = write_gpt2()
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"wte.weight": shard}}))
    with pytest.raises(ValueError, match=f"the entry {shard!r} listed in .* must name a file"):
        load_network(folder)
    assert "model.safetensors.index.json" in cli_error(capsys, "attend", "hi", "--model", str(folder))


def test_a_non_safetensors_target_is_not_quoted_back(write_gpt2, capsys):
    folder = write_gpt2()
    (folder / "model.safetensors").write_bytes(b"root:x:0:0:root:/root:/bin/bash\n" * 4)
    err = cli_error(capsys, "attend", "hi", "--model", str(folder))
    n = int.from_bytes(b"root:x:0", "little")            # the header length those bytes would give
    assert "model.safetensors" in err and str(n) not in err and str(n + 8) not in err


def test_an_index_that_is_not_utf8_is_named(write_gpt2, capsys):
    folder = write_gpt2()
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_bytes(b'{"weight_map": {"\xff": "a"}}')
    err = cli_error(capsys, "attend", "hi", "--model", str(folder))
    assert "model.safetensors.index.json is not UTF-8" in err


# --- 2. the header, as the spec says: every rule against a file the safetensors package refuses too ------------

def raw_safetensors(path, header, data: bytes) -> None:
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(len(head).to_bytes(8, "little") + head + data)


F32 = lambda offsets, shape=(2,): {"dtype": "F32", "shape": list(shape), "data_offsets": offsets}   # noqa: E731

BAD_HEADERS = [
    ("negative offset", {"a": F32([-8, 0])}, 8, r"tensor 'a' has data_offsets \[-8, 0\]"),
    ("end before begin", {"a": F32([8, 0])}, 8, r"tensor 'a' has data_offsets \[8, 0\]"),
    ("two tensors, one range", {"a": F32([0, 8]), "b": F32([0, 8])}, 8, r"tensor '[ab]' .*overlaps"),
    ("a gap", {"a": F32([8, 16])}, 16, r"tensor 'a' .*leaves bytes 0\.\.8 unused"),
    ("data left over", {"a": F32([0, 8])}, 16, r"cover 8 bytes of data, the file holds 16"),
    ("past the end", {"a": F32([0, 8])}, 4, r"truncated: tensor 'a' ends at byte 8"),
    ("bytes and shape disagree", {"a": F32([0, 8], (3,))}, 8, r"tensor 'a' of shape \(3,\) .* needs 12 bytes"),
    ("unknown dtype", {"a": {"dtype": "F99", "shape": [2], "data_offsets": [0, 8]}}, 8, r"'a' has dtype 'F99'"),
    ("float offsets", {"a": F32([0, 8.0])}, 8, r"tensor 'a' has data_offsets \[0, 8\.0\]"),
    ("negative dimension", {"a": F32([0, 8], (-2,))}, 8, r"tensor 'a' has shape \[-2\]"),
    ("no offsets", {"a": {"dtype": "F32", "shape": [2]}}, 8, r"tensor 'a' has no dtype, shape and data_offsets"),
    ("a list, not an object", ["a"], 0, r"header does not list tensors"),
    ("metadata not strings", {"__metadata__": {"k": 1}, "a": F32([0, 8])}, 8, r"'__metadata__' must map strings"),
    ("nested 100,000 deep", b"[" * 100_000, 0, r"nested too deeply"),
    ("header not UTF-8", b'{"\xff": 1}', 0, r"header is not JSON"),
    ("header longer than the file", None, 0, r"header length beyond the file"),
]


@pytest.mark.parametrize("case,header,n_data,message", BAD_HEADERS, ids=[c[0] for c in BAD_HEADERS])
def test_a_header_the_safetensors_package_refuses_is_refused_naming_the_field(tmp_path, case, header, n_data,
                                                                             message):
    path = tmp_path / "bad.safetensors"
    if header is None:
        path.write_bytes((1 << 62).to_bytes(8, "little") + b"{}")
    else:
        raw_safetensors(path, header, bytes(range(n_data)))
    with pytest.raises(Exception):                        # the package itself refuses the file …
        with safetensors.safe_open(str(path), framework="np") as f:
            [f.get_tensor(k) for k in f.keys()]
    with pytest.raises(ValueError, match=message) as e:   # … and so does attnlab, naming the file
        read_safetensors(path)
    assert str(path) in str(e.value)


def test_a_valid_header_still_reads_as_the_package_reads_it(tmp_path, rng):
    path = tmp_path / "ok.safetensors"
    arrays = {"b": rng.normal(size=(3, 2)).astype(np.float32), "a": np.arange(4, dtype=np.float64),
              "empty": np.zeros((0, 5), np.float32)}
    save_file(arrays, str(path), metadata={"k": "v"})
    got = read_safetensors(path)
    assert sorted(got) == sorted(arrays) and all(np.array_equal(got[k], arrays[k]) for k in arrays)


def test_an_integer_weight_is_refused_not_cast(tmp_path, rng, random_llama_tensors, capsys):
    name = "model.layers.0.self_attn.q_proj.weight"
    folder = write_llama(tmp_path / "m", rng, random_llama_tensors,
                         edit=lambda t: t.update({name: np.ones(t[name].shape, np.int32)}))
    with safetensors.safe_open(str(folder / "model.safetensors"), framework="np") as f:
        assert f.get_tensor(name).dtype == np.int32      # a valid file: the refusal is attnlab's rule for weights
    with pytest.raises(ValueError, match=r"tensor 'layers\.0\.self_attn\.q_proj\.weight' is stored as int32"):
        load_network(folder)


# --- 3. one line, the file and the field named, sizes checked before any allocation -----------------------------

@pytest.mark.parametrize("text", ["", "{not json", "[1, 2]", '{"model": {"type": "NoSuchModel"}}', "\xff"])
def test_a_broken_tokenizer_json_is_one_line_naming_it(tmp_path, rng, random_llama_tensors, capsys, text):
    folder = write_llama(tmp_path / "m", rng, random_llama_tensors)
    (folder / "tokenizer.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(ValueError, match="tokenizer.json"):
        load_model(folder)
    assert "tokenizer.json" in cli_error(capsys, "attend", "hi", "--model", str(folder))


def test_head_dim_of_a_trillion_is_refused_before_any_allocation(tmp_path, rng, random_llama_tensors):
    folder = write_llama(tmp_path / "m", rng, random_llama_tensors, dict(LLAMA, head_dim=10**12))
    with pytest.raises(ValueError, match=r"q_proj\.weight' has shape \(16, 16\), expected \(2000000000000, 16\) "
                                         r"\(.*head_dim=1000000000000"):
        load_network(folder)


def test_rope_scaling_given_as_a_string_names_the_field(tmp_path, rng, random_llama_tensors, capsys):
    folder = write_llama(tmp_path / "m", rng, random_llama_tensors, dict(LLAMA, rope_scaling="linear"))
    with pytest.raises(ValueError, match="config.json field 'rope_scaling' must be an object or null, got 'linear'"):
        load_network(folder)                                  # the folder has no tokenizer.json: the CLI says so first


def test_a_nan_weight_is_named_not_reported_as_a_query(tmp_path, rng, random_llama_tensors):
    name = "model.layers.0.self_attn.k_proj.weight"

    def poison(t):
        t[name][1, 2] = np.nan
    folder = write_llama(tmp_path / "m", rng, random_llama_tensors, edit=poison)
    with pytest.raises(ValueError, match=r"tensor 'layers\.0\.self_attn\.k_proj\.weight' holds nan at flat "
                                         r"index 18; a weight must be finite"):
        load_network(folder)
