"""The float32 copy of a GGUF model in a cache folder (attnlab.models.weight_cache): the model mapped back is
the model read from the file, bit for bit and in the same layout, without dequantizing anything."""

import mmap
import os

import numpy as np
import pytest

from attnlab.kernels.matmul import fuse_columns
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


def test_quantized_and_folders_write_nothing(gguf_files, tmp_path, tiny_gpt2_folder):
    pytest.importorskip("numba")
    path = gguf_files.write_gguf(tmp_path / "m.gguf", qtype=gguf_files.Q.Q4_1)
    load_model(path, quantized=True, cache=tmp_path / "c")
    load_model(tiny_gpt2_folder, cache=tmp_path / "c")
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
