"""The float32 copy of a GGUF model in a cache folder (attnlab.models.weight_cache): the model mapped back is
the model read from the file, bit for bit and in the same layout, without dequantizing anything."""

import json
import mmap
import os

import numpy as np
import pytest

from attnlab.kernels.matmul import fuse_columns
from attnlab.kernels.quantized import QuantizedRows
from attnlab.models import weight_cache
from attnlab.models.families import load_model
from attnlab.stack.transformer import forward


def same_model(a, b):
    pa, pb = a.params(), b.params()
    assert pa.keys() == pb.keys()
    for k in pa:
        assert pa[k].dtype == pb[k].dtype and pa[k].strides == pb[k].strides, k
        np.testing.assert_array_equal(pa[k], pb[k], err_msg=k)


@pytest.mark.parametrize("tied", [True, False])
def test_the_mapped_copy_is_the_file_s_model_bit_for_bit(gguf_files, tmp_path, monkeypatch, tied):
    path = gguf_files.write_gguf(tmp_path / "m.gguf", qtype=gguf_files.Q.Q4_1, tied=tied)
    plain, tok = load_model(path)
    first, _ = load_model(path, cache=tmp_path / "cache")               # reads the file, writes the copy
    (entry,) = (tmp_path / "cache").iterdir()
    assert {p.name for p in entry.iterdir()} == {"weights.bin", "index.json"}

    def no_reading(*a, **k):
        raise AssertionError("the cached load dequantized a tensor")
    monkeypatch.setattr("attnlab.models.gguf.dequantize_tensor", no_reading)
    again, _ = load_model(path, cache=tmp_path / "cache")
    same_model(plain, first)
    same_model(plain, again)
    attn = again.blocks[0].attn
    assert isinstance(attn.W_QKV.base, mmap.mmap) and attn.W_Q.base is attn.W_QKV   # views of the file, fused
    ids = np.array([[1, 5, 9, 3, 7]])
    np.testing.assert_array_equal(forward(again, ids).logits, forward(plain, ids).logits)


def test_training_in_place_leaves_the_copy_as_it_was(gguf_files, tmp_path):
    path = gguf_files.write_gguf(tmp_path / "m.gguf")
    load_model(path, cache=tmp_path / "c")
    model, _ = load_model(path, cache=tmp_path / "c")
    before = model.blocks[0].attn.W_Q.copy()
    model.blocks[0].attn.W_Q[...] += 1.0                               # copy-on-write: the model changes
    np.testing.assert_array_equal(model.blocks[0].attn.W_QKV[:, :before.shape[1]], before + 1.0)
    fresh, _ = load_model(path, cache=tmp_path / "c")                 # the file does not
    np.testing.assert_array_equal(fresh.blocks[0].attn.W_Q, before)


def test_a_changed_file_makes_a_new_entry_and_drops_the_old(gguf_files, tmp_path):
    path = gguf_files.write_gguf(tmp_path / "m.gguf", rng_seed=0)
    load_model(path, cache=tmp_path / "c")
    (old,) = (tmp_path / "c").iterdir()
    gguf_files.write_gguf(path, rng_seed=1)
    os.utime(path, ns=(1, 1))                                          # another modification time
    model, _ = load_model(path, cache=tmp_path / "c")
    (new,) = (tmp_path / "c").iterdir()
    assert new != old
    same_model(model, load_model(path)[0])


def test_a_damaged_entry_is_ignored_and_replaced(gguf_files, tmp_path):
    path = gguf_files.write_gguf(tmp_path / "m.gguf")
    load_model(path, cache=tmp_path / "c")
    (entry,) = (tmp_path / "c").iterdir()
    with open(entry / "weights.bin", "r+b") as f:
        f.truncate(100)
    assert weight_cache.read_entry(entry) is None
    model, _ = load_model(path, cache=tmp_path / "c")
    same_model(model, load_model(path)[0])
    assert weight_cache.read_entry(entry) is not None                  # written whole again


def test_folders_write_nothing(tmp_path, tiny_gpt2_folder):
    load_model(tiny_gpt2_folder, cache=tmp_path / "c")
    assert not (tmp_path / "c").exists()


def same_quantized(a, b):
    """The same weights of the same classes: quantized ones with equal planes, arrays equal in their layout."""
    pa, pb = a.params(), b.params()
    assert pa.keys() == pb.keys()
    for k in pa:
        assert type(pa[k]) is type(pb[k]), k
        if isinstance(pa[k], np.ndarray):
            assert pa[k].strides == pb[k].strides, k
            np.testing.assert_array_equal(pa[k], pb[k], err_msg=k)
            continue
        ma, mb = (w.T if isinstance(w, QuantizedRows) else w for w in (pa[k], pb[k]))
        assert (type(ma), ma.qtype, ma.shape) == (type(mb), mb.qtype, mb.shape), k
        for plane in ("qs", "d", "m"):
            x, y = getattr(ma, plane), getattr(mb, plane)
            assert (x is None) == (y is None), (k, plane)
            if x is not None:
                assert x.dtype == y.dtype, (k, plane)
                np.testing.assert_array_equal(x, y, err_msg=f"{k}.{plane}")


def owner(a: np.ndarray):
    """What holds an array's bytes: the last base that is not an array."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a.base


def quantized_file(gguf_files, tmp_path):
    pytest.importorskip("numba")
    Q = gguf_files.Q
    return gguf_files.write_gguf(tmp_path / "m.gguf", qtype=Q.Q4_1, types={"token_embd.weight": Q.Q8_0})


@pytest.mark.parametrize("mode", [True, "q8-activations"])
def test_the_quantized_planes_are_mapped_back_bit_for_bit(gguf_files, tmp_path, monkeypatch, mode):
    path = quantized_file(gguf_files, tmp_path)
    plain, _ = load_model(path, quantized=mode)
    first, _ = load_model(path, quantized=mode, cache=tmp_path / "c")     # repacks the blocks, writes the planes
    (entry,) = (tmp_path / "c").iterdir()
    assert entry.name.startswith(f"m{weight_cache.MODES[mode]}-")

    def no_reading(*a, **k):
        raise AssertionError("the cached load read a tensor of the file")
    monkeypatch.setattr("attnlab.models.gguf.GGUFTensors.read", no_reading)
    again, _ = load_model(path, quantized=mode, cache=tmp_path / "c")
    same_quantized(plain, first)
    same_quantized(plain, again)
    attn = again.blocks[0].attn
    assert isinstance(owner(attn.W_QKV.qs), mmap.mmap) and attn.W_Q.qs.base is attn.W_QKV.qs   # the file's, fused
    assert isinstance(again.W_E, QuantizedRows) and isinstance(owner(again.W_E.T.d), mmap.mmap)
    for n in (1, 5, 12):                                  # the fused kernel, and a prefill's dequantize + BLAS
        ids = np.arange(3, 3 + 7 * n, 7)[None, :] % 200   # (1, n)
        np.testing.assert_array_equal(forward(again, ids).logits, forward(plain, ids).logits)


def test_the_float32_and_quantized_entries_live_side_by_side(gguf_files, tmp_path):
    path = quantized_file(gguf_files, tmp_path)
    for mode in (False, True, "q8-activations", True):
        load_model(path, quantized=mode, cache=tmp_path / "c")
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "c").iterdir()) == ["m", "m.q8", "m.quantized"]


def edit_index(entry, change):
    index = json.loads((entry / "index.json").read_text())
    change(index)
    (entry / "index.json").write_text(json.dumps(index))


def fewer_groups(index):
    index["params"]["blocks.0.attn.W_K"]["planes"][0][2] -= 1          # a plane one group short of its rows


def a_wider_weight(index):
    index["params"]["blocks.1.mlp.W_out"]["d_in"] *= 2                 # sizes its planes do not hold


def another_class(index):
    index["params"]["W_E"]["class"] = "ndarray"


def a_float32_view_of_planes(index):
    index["params"]["blocks.0.ln_1.weight"] = index["params"]["W_E"]["planes"][0][:1] + [False, 0, 64]


@pytest.mark.parametrize("damage", ["truncated", fewer_groups, a_wider_weight, another_class, a_float32_view_of_planes])
def test_a_damaged_quantized_entry_is_never_trusted(gguf_files, tmp_path, damage):
    path = quantized_file(gguf_files, tmp_path)
    plain, _ = load_model(path, quantized=True)
    load_model(path, quantized=True, cache=tmp_path / "c")
    (entry,) = (tmp_path / "c").iterdir()
    if damage == "truncated":
        with open(entry / "weights.bin", "r+b") as f:
            f.truncate(4096)
    else:
        edit_index(entry, damage)
    assert weight_cache.read_entry(entry) is None
    model, _ = load_model(path, quantized=True, cache=tmp_path / "c")
    same_quantized(model, plain)
    assert weight_cache.read_entry(entry) is not None                  # written whole again


def test_without_numba_quantized_writes_nothing(gguf_files, tmp_path, monkeypatch):
    path = quantized_file(gguf_files, tmp_path)
    monkeypatch.setenv("ATTNLAB_NO_NUMBA", "1")
    with pytest.warns(RuntimeWarning):
        monkeypatch.setattr("attnlab.kernels.quantized._warned", [])
        load_model(path, quantized=True, cache=tmp_path / "c")          # float32 weights, as it warns: not kept
    assert not (tmp_path / "c").exists()


def test_an_unwritable_folder_still_loads(gguf_files, tmp_path):
    path = gguf_files.write_gguf(tmp_path / "m.gguf")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    model, _ = load_model(path, cache=blocker / "c")
    same_model(model, load_model(path)[0])


def test_fuse_columns_keeps_views_of_one_fused_array():
    whole = np.arange(24, dtype=np.float32).reshape(4, 6).copy()      # (4, 6) owning its numbers
    fused, parts = fuse_columns(whole[:, :2], whole[:, 2:3], whole[:, 3:])
    assert fused is whole
    apart = [np.ascontiguousarray(whole[:, :2]), np.ascontiguousarray(whole[:, 2:])]
    fused, parts = fuse_columns(*apart)
    assert fused is not whole
    np.testing.assert_array_equal(fused, whole)
    fused, _ = fuse_columns(whole[:, 2:3], whole[:, :2])               # out of order: a new array
    assert fused is not whole and fused.base is None


def test_the_command_line_s_folder(monkeypatch, tmp_path):
    from attnlab.cli._model import cache_folder
    monkeypatch.setenv("ATTNLAB_CACHE", "off")
    assert cache_folder() is None
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    assert cache_folder() == tmp_path
    monkeypatch.delenv("ATTNLAB_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_folder() == tmp_path / "x" / "attnlab" / "weights"


def test_the_command_line_keeps_both_modes_and_nothing_when_off(gguf_files, tmp_path, monkeypatch, cli):
    path = quantized_file(gguf_files, tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    run = lambda *q: cli.json("generate", "--model", path, "--prompt", "the cat", "--tokens", "3",   # noqa: E731
                              "--temperature", "0", *q)["ids"]
    monkeypatch.setenv("ATTNLAB_CACHE", "off")
    off = [run(), run("--quantized"), run("--quantized=q8")]
    assert not (tmp_path / "home").exists() and not (tmp_path / "xdg").exists()   # nothing written anywhere
    monkeypatch.delenv("ATTNLAB_CACHE")
    for _ in range(2):                                 # written, then read back: the same tokens each time
        assert [run(), run("--quantized"), run("--quantized=q8")] == off
    folder = tmp_path / "xdg" / "attnlab" / "weights"
    assert sorted(p.name.split("-")[0] for p in folder.iterdir()) == ["m", "m.q8", "m.quantized"]
