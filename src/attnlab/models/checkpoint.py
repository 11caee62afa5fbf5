"""Reading checkpoints: safetensors files memory-mapped, never pickle.

A checkpoint folder holds ``config.json`` and ``model.safetensors``, or shards listed by
``model.safetensors.index.json`` (the Hugging Face layouts). Every problem is one
``ValueError``/``FileNotFoundError`` that names the file, the tensor or the limit.

A safetensors file is an 8-byte little-endian header length, a JSON header (each tensor's dtype, shape
and byte range), then the raw little-endian data. attnlab maps the file into memory (``np.memmap``) and
hands out views of it: a float32 tensor is never copied, so loading a model costs address space, not RAM,
and the pages are read when the forward pass first touches them. (safetensors' own numpy API copies every
tensor and has no bfloat16.) bfloat16 is the upper 16 bits of a float32 (same sign and 8-bit exponent,
7 of float32's 23 mantissa bits), so shifting each one left by 16 bits gives the float32 of exactly the
same value: bfloat16 tensors are converted so, exactly, into new float32 arrays.
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._io import folder_file
from ..kernels.quantized import is_quantized

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
SAFETENSORS = "model.safetensors"


def refuse_pickle(path: Path) -> None:
    """Raise for a pickled checkpoint: loading one can run arbitrary code."""
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise ValueError(
            f"{path.name} is a pickled checkpoint ({path.suffix}); attnlab never unpickles, because unpickling "
            "can run arbitrary code. Convert it to model.safetensors, e.g. with transformers' "
            "model.save_pretrained(folder) or safetensors.torch.save_file(state_dict, 'model.safetensors')")


# safetensors dtype names -> numpy (little-endian, as the format stores them); BF16 is read as uint16 bits
DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
          "I8": "i1", "U8": "u1", "BOOL": "?"}
MAX_HEADER = 100_000_000                            # bytes; the safetensors package's own limit


def bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values, given as their uint16 bit patterns, as float32: exact (bfloat16 is a float32's upper
    half, so the bits shift into place and the lower 16 mantissa bits are 0).

    >>> bfloat16_to_float32(np.array([0x3F80, 0xC000, 0x3EAB], np.uint16))    # 1, -2, 0.333984375
    array([ 1.        , -2.        ,  0.33398438], dtype=float32)
    """
    return (bits.astype(np.uint32) << 16).view(np.float32)


def read_header(path: Path) -> tuple[int, dict]:
    """``(data_start, header)`` of a safetensors file: where the data begins, and the JSON header, checked as
    the format's spec (and the safetensors package) does: see :func:`check_header`. Nothing past the header
    is read, and nothing is allocated before the header's length is checked against the file's size."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path} is truncated or not a safetensors file: {size} bytes, no header")
        (n_header,) = struct.unpack("<Q", head)
        if 8 + n_header > size or n_header > MAX_HEADER:   # never print n_header: it is the file's first bytes
            raise ValueError(f"{path} is truncated or not a safetensors file: its first 8 bytes give a header "
                             f"length beyond the file's {size} bytes (or safetensors' {MAX_HEADER:,}-byte limit)")
        raw = f.read(n_header)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a safetensors file: its header is not JSON ({e})") from None
    except RecursionError:
        raise ValueError(f"{path} is not a safetensors file: its header is nested too deeply") from None
    check_header(path, header, size - 8 - n_header)
    return 8 + n_header, header


def check_header(path: Path, header, n_data: int) -> None:
    """A safetensors header, as its spec says (the checks of the safetensors package's ``Metadata::validate``):
    an object of tensor name -> ``{"dtype", "shape", "data_offsets": [begin, end]}`` (and an optional
    ``__metadata__`` of str -> str); offsets non-negative integers, relative to the data, ``end - begin`` the
    bytes of the shape and dtype; the tensors, sorted by offset, tile the data from 0 to its very end with no
    overlap and no gap. The error names the file, the tensor and the field."""
    if not isinstance(header, dict):
        raise ValueError(f"{path} is not a safetensors file: its header does not list tensors with data_offsets "
                         f"(it is a JSON {type(header).__name__}, not an object)")
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError(f"{path}: the header's '__metadata__' must map strings to strings")
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
            raise ValueError(f"{path} is not a safetensors file: its header does not list tensors with "
                             f"data_offsets (tensor {name!r} has no dtype, shape and data_offsets)")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has dtype {dtype!r}; attnlab reads {sorted(DTYPES)}")
        if not isinstance(shape, list) or not all(is_count(n) for n in shape):
            raise ValueError(f"{path}: tensor {name!r} has shape {shape!r}; a shape is a list of integers >= 0")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(is_count, offsets))
                and offsets[0] <= offsets[1]):
            raise ValueError(f"{path}: tensor {name!r} has data_offsets {offsets!r}; they must be two integers "
                             "0 <= begin <= end")
        need = np.dtype(DTYPES[dtype]).itemsize * math.prod(shape)
        if offsets[1] - offsets[0] != need:
            raise ValueError(f"{path}: tensor {name!r} of shape {tuple(shape)} and dtype {dtype} needs {need} bytes, "
                             f"its data_offsets {offsets} give it {offsets[1] - offsets[0]}")
        spans.append((offsets[0], offsets[1], name))
    at = 0                                                    # the data tiled so far: [0, at)
    for begin, end, name in sorted(spans):
        if end > n_data:
            raise ValueError(f"{path} is truncated: tensor {name!r} ends at byte {end} of the data, the file "
                             f"holds {n_data} bytes of data")
        if begin != at:
            what = "overlaps the tensor before it" if begin < at else f"leaves bytes {at}..{begin} unused"
            raise ValueError(f"{path}: tensor {name!r} has data_offsets [{begin}, {end}], which {what}; "
                             "safetensors tensors tile the data with no overlap and no gap")
        at = end
    if at != n_data:
        raise ValueError(f"{path}: the header's tensors cover {at} bytes of data, the file holds {n_data}; "
                         "the data must be exactly the tensors' bytes")


def is_count(n) -> bool:
    """An integer >= 0 (not a bool): a dimension or a byte offset."""
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def map_tensors(path: Path, data_start: int, header: dict) -> dict[str, np.ndarray]:
    """The tensors of a safetensors file whose header :func:`check_header` passed, as read-only views of its
    memory map (bfloat16 converted to float32 copies)."""
    size = path.stat().st_size
    mapped = np.memmap(path, dtype=np.uint8, mode="r") if size > data_start else np.zeros(0, np.uint8)
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        item = np.dtype(DTYPES[dtype])
        arr = np.ndarray(shape, item, buffer=mapped, offset=data_start + begin) if end > begin \
            else np.zeros(shape, item)                                      # a view: nothing copied
        out[name] = bfloat16_to_float32(arr) if dtype == "BF16" else arr
    return out


def read_safetensors(path) -> dict[str, np.ndarray]:
    """Every tensor of a ``.safetensors`` file as numpy arrays, by name: read-only views of the file mapped
    into memory (float16/32/64 and integers), bfloat16 converted exactly to float32.

    Parameters
    ----------
    path : path to a ``.safetensors`` file. ``.bin``/``.pt``/``.pth``/``.ckpt`` are refused, never unpickled.

    Raises
    ------
    FileNotFoundError
        No such file.
    ValueError
        A pickled checkpoint, a truncated file (naming the first tensor cut off), or not safetensors.
    """
    path = Path(path)
    refuse_pickle(path)
    if not path.is_file():
        raise FileNotFoundError(2, "No such checkpoint file", str(path))
    data_start, header = read_header(path)
    return map_tensors(path, data_start, header)


def read_json(path: Path, what: str):
    """The JSON in ``path`` (a model folder's config or index, already checked to lie inside the folder);
    an error naming the file when it is not UTF-8 or not JSON."""
    try:
        return json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.start}): {what} must be UTF-8 JSON") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    except RecursionError:
        raise ValueError(f"{path} is not valid JSON for {what}: nested too deeply") from None


def read_config(folder: Path) -> dict:
    """``config.json`` of a checkpoint folder, as a dict."""
    path = folder_file(folder, "config.json")
    if not path.is_file():
        raise FileNotFoundError(2, "No config.json in the model folder", str(path))
    config = read_json(path, "a model's config.json")
    if not isinstance(config, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(config).__name__}")
    return config


def checkpoint_files(folder: Path) -> list[Path]:
    """The folder's ``model.safetensors``, or the shards its ``model.safetensors.index.json`` lists.

    A folder with only pickles gets the pickle refusal.
    """
    path, index = folder_file(folder, SAFETENSORS), folder_file(folder, SAFETENSORS + ".index.json")
    if path.is_file():
        return [path]
    if index.is_file():
        data = read_json(index, "an index")
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index} must be a JSON object with a non-empty 'weight_map' of tensor -> shard file")
        for tensor, name in weight_map.items():
            if not isinstance(name, str):
                raise ValueError(f"{index}: 'weight_map' gives tensor {tensor!r} the shard {name!r}; a shard is "
                                 "a file name")
        names = sorted(set(weight_map.values()))
        shards = [folder_file(folder, name, listed_in=f"{index.name}'s weight_map") for name in names]
        for name, shard in zip(names, shards):       # every entry is checked before any shard is opened
            if not shard.is_file():
                listed = sorted(k for k, v in weight_map.items() if v == name)
                raise FileNotFoundError(2, f"Shard {name} is listed in {index.name} (for {len(listed)} "
                                        f"tensors, e.g. {listed[0]!r}) but missing", str(shard))
        return shards
    pickles = sorted(p for p in folder.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    if pickles:
        refuse_pickle(pickles[0])
    raise FileNotFoundError(2, "No model.safetensors in the model folder", str(path))


def read_checkpoint(folder: Path) -> "Tensors":
    """Every tensor of a folder's checkpoint (one file or its shards), ready to hand out by name."""
    paths = checkpoint_files(folder)
    arrays = {}
    for path in paths:
        arrays.update(read_safetensors(path))
    return Tensors(arrays, str(paths[0]) if len(paths) == 1 else f"{folder} ({len(paths)} shards)")


def config_int(config: dict, key: str, source: str, default=None) -> int:
    """An integer field of config.json, or an error naming the field."""
    v = config.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{source}: config.json field {key!r} must be a positive integer, got {v!r}")
    return v


def config_eos_ids(config: dict, source: str, vocab_size: int) -> tuple[int, ...]:
    """config.json's ``eos_token_id`` (an id, a list of ids, or null) as a tuple, or an error naming the field.

    An id outside the vocabulary (a small test config keeping GPT-2's 50256) is left out: the model can never
    produce it, so it could never stop a text.
    """
    v = config.get("eos_token_id")
    ids = [] if v is None else v if isinstance(v, list) else [v]
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
        raise ValueError(f"{source}: config.json field 'eos_token_id' must be a token id, a list of them or null, "
                         f"got {v!r}")
    return tuple(i for i in ids if i < vocab_size)


def config_float(config: dict, key: str, source: str, default: float) -> float:
    """A positive number field of config.json (layer-norm epsilons), or an error naming the field."""
    v = config.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < 1:
        raise ValueError(f"{source}: config.json field {key!r} must be a number between 0 and 1, got {v!r}")
    return float(v)


@dataclass(frozen=True, eq=False)
class Tensors:
    """A checkpoint's tensors by name, handed out with their shapes checked against the config."""
    arrays: dict             # name -> np.ndarray
    source: str              # the file, for messages
    why: str = ""            # the config fields the expected shapes come from, for messages
    header: str = "config.json"   # where the sizes were stated ("the GGUF metadata"), for messages

    def for_config(self, *, prefix: str, layers: str, n_layers: int, field: str, why: str) -> "Tensors":
        """The tensors with ``prefix`` removed where present, once their layer count (``layers``, a pattern
        with one group for the index) is checked against the config's ``field`` = ``n_layers``; ``why`` goes
        into every shape error."""
        t = self.strip_prefix(prefix)
        check_layer_count(t, layers, n_layers, field)
        return Tensors(t.arrays, t.source, why, self.header)

    def take(self, name: str, shape: tuple, why: str | None = None) -> np.ndarray:
        """The tensor ``name``, which must exist and have ``shape``; float32 or float64."""
        why = self.why if why is None else why
        try:
            arr = self.arrays[name]            # one look-up: a lazy mapping (a GGUF file's) unpacks it here
        except KeyError:
            near = sorted(k for k in self.arrays if k.split(".")[-1] == name.split(".")[-1])[:3]
            hint = f"; tensors with a similar name: {near}" if near else ""
            raise ValueError(f"{self.source}: missing tensor {name!r}{hint}") from None
        if arr.shape != tuple(shape):
            because = f" ({why})" if why else ""
            raise ValueError(f"{self.source}: tensor {name!r} has shape {arr.shape}, expected {tuple(shape)}"
                             f"{because}; {self.header} does not match the weights")
        if is_quantized(arr):                          # kept in its GGUF block type (attnlab.kernels.quantized)
            if not arr.finite():
                raise ValueError(f"{self.source}: tensor {name!r} has a scale that is NaN or inf; a weight must "
                                 "be finite")
            return arr
        if arr.dtype.kind != "f":
            raise ValueError(f"{self.source}: tensor {name!r} is stored as {arr.dtype} integers; a weight is "
                             "stored as floats (F16, BF16, F32 or F64)")
        if arr.dtype not in (np.float32, np.float64):
            arr = arr.astype(np.float32)   # float16/bfloat16 checkpoints compute in float32
        bad = first_not_finite(arr)
        if bad is not None:
            raise ValueError(f"{self.source}: tensor {name!r} holds {arr.reshape(-1)[bad]} at flat index {bad}; "
                             "a weight must be finite")
        return arr

    def linear(self, name: str, d_in: int, d_out: int, *, bias: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """torch's ``nn.Linear`` ``{name}.weight`` (d_out, d_in) as attnlab's (d_in, d_out) (a view), and its
        bias (d_out,), zeros where the layer has none."""
        w = self.take(f"{name}.weight", (d_out, d_in)).T                # (d_in, d_out)
        b = self.take(f"{name}.bias", (d_out,)) if bias else np.zeros(d_out, w.dtype)   # (d_out,)
        return w, b

    def count_layers(self, pattern: str) -> int:
        """How many layers the weights hold: 1 + the largest index matched by ``pattern`` (one group)."""
        found = [int(m.group(1)) for k in self.arrays if (m := re.match(pattern, k))]
        return max(found) + 1 if found else 0

    def strip_prefix(self, prefix: str) -> "Tensors":
        """The same tensors with ``prefix`` removed where present (``bert.``, ``transformer.``)."""
        if not prefix or not any(k.startswith(prefix) for k in self.arrays):
            return self                   # as they are: a lazy mapping (a GGUF file's) stays lazy, none held
        return Tensors({k.removeprefix(prefix): v for k, v in self.arrays.items()}, self.source, self.why,
                       self.header)


def first_not_finite(arr: np.ndarray, chunk: int = 1 << 20) -> int | None:
    """The flat index of the first NaN or ±inf in ``arr``, or None; read a chunk at a time, so a mapped
    tensor is checked without a temporary the size of the tensor."""
    flat = arr.reshape(-1)                                                 # (N,) a view
    for at in range(0, flat.size, chunk):
        ok = np.isfinite(flat[at:at + chunk])                              # (≤ chunk,)
        if not ok.all():
            return at + int(np.argmin(ok))
    return None


def check_layer_count(tensors: Tensors, pattern: str, n_layers: int, field: str) -> None:
    """The config's layer count must equal the number of layers the weights hold."""
    found = tensors.count_layers(pattern)
    if found != n_layers:
        raise ValueError(f"{tensors.source}: {tensors.header} says {field}={n_layers} but the weights hold "
                         f"{found} layers; {tensors.header} does not match the weights")
