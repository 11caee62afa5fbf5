"""A GGUF model's weights on disk in the form the stack uses them, mapped back in a moment: ``attnlab`` commands
load SmolLM2 from it instead of dequantizing (float32) or repacking (``--quantized``) 272 tensors again.

Loading ``smollm2`` in float32 costs about 1.3 s of one core, none of it reading the file: unpacking the Q4_1
blocks into float32 (0.7 s), then laying the weights out as a decode step reads them (W_Q | W_K | W_V and
W_gate | W_in side by side, each streamed weight in its layout: :mod:`attnlab.kernels.matmul`; 0.6 s). The
first load writes the model's arrays, in exactly that final layout, to one file in a cache folder; later loads
map that file (copy-on-write: the model can still be trained in place; the file never changes) and build the
model around views of it, so nothing is dequantized, fused or copied (:func:`attnlab.kernels.matmul.fused_already`
sees the fused arrays for what they are). The numbers and their layout are the ones the first load made, so
every result is bit for bit the uncached model's.

``--quantized`` (``quantized=True``, or ``"q8-activations"``) keeps each weight's blocks, rearranged into the
planes the kernels read (:class:`attnlab.kernels.quantized.QuantizedMatrix`: values, float16 scales and minima,
rows in groups of four; 0.13–0.2 s to build from the file's blocks, numba's import aside). Its entry holds
those planes, the fused weights' (W_Q | W_K | W_V, W_gate | W_in) once, and each weight as its class, type,
sizes and a range of groups of its planes; mapped back, the fused planes are kept as they lie
(:func:`attnlab.kernels.quantized.consecutive_groups`). Every plane's shape and dtype is checked against its
type and sizes before a kernel may read it. Without numba (or with ``ATTNLAB_NO_NUMBA``) the quantized weights
are float32, as ``load_model`` warns, and nothing is kept.

Where: the folder the caller gives; the command line's is ``$ATTNLAB_CACHE``, else
``$XDG_CACHE_HOME/attnlab/weights``, else ``~/.cache/attnlab/weights`` (``ATTNLAB_CACHE=off`` turns it off). One
entry per GGUF file and mode, a folder ``<stem><mode>-<key>/`` (the mode "" for float32, ".quantized" or ".q8")
holding ``weights.bin`` (SmolLM2: 538 MB float32, 98 MB either quantized mode) and ``index.json`` (the config
and where each array lies). The key hashes the GGUF file's size, modification time and first MiB (its header),
this format's version, the mode and the layouts this machine's rules (or ``attnlab tune``) choose; a changed
file or layout makes a new entry and the writer removes the older entries of the same stem and mode. Clearing:
delete the folder (``rm -rf ~/.cache/attnlab/weights``); nothing else refers to it.

An entry is written to a temporary folder beside it and renamed into place, so a reader sees a whole entry or
none; an entry that cannot be read (truncated, its index not fitting its file or its weights) is ignored and the
model loads from the GGUF file and writes it again. The bytes themselves carry no checksum: hashing 538 MB
would cost more than the load it saves.
"""

from __future__ import annotations

import functools
import hashlib
import json
import mmap
import os
import shutil
from pathlib import Path

import numpy as np

from ..kernels.matmul import gemv_order
from ..kernels.q8_activations import Q8ActivationMatrix
from ..kernels.q8k_activations import Q8KActivationMatrix
from ..kernels.quantized import GROUP, QuantizedMatrix, QuantizedRows, is_quantized, quant_sizes
from ..stack.transformer import ModelConfig, Transformer

FORMAT = 3                 # bumped when the entry's layout changes: old entries are then never read (2: the q8
#                            mode's K-quants are Q8KActivationMatrix planes, no longer the exact mode's; 3: its
#                            Q5_0, Q5_1 and Q5_K too, no longer float32)
HEAD_BYTES = 1 << 20       # the bytes of the GGUF file hashed into the key: its header, and then some
ALIGN = 4096               # each array starts on a page


MODES = {False: "", True: ".quantized", "q8-activations": ".q8"}   # load_model's quantized= -> the entry's suffix


def cache_key(path: Path, quantized: bool | str = False) -> str:
    """The entry's key for the GGUF file at ``path``: a hash of its size, modification time and first MiB,
    the format version, this machine's weight layouts and the mode (``quantized``; hex, 16 characters)."""
    st = path.stat()
    mode = f"{quantized}:" if quantized else ""          # (the float32 entry's key is the one it always was)
    h = hashlib.sha256(f"{FORMAT}:{st.st_size}:{st.st_mtime_ns}:{gemv_order(False)}{gemv_order(True)}:{mode}".encode())
    with open(path, "rb") as f:
        h.update(f.read(HEAD_BYTES))
    return h.hexdigest()[:16]


def entry_folder(folder: Path, path: Path, quantized: bool | str = False) -> Path:
    """``folder/<stem><mode>-<key>``: where the copy of the GGUF file ``path`` is kept (the mode "" for float32,
    ".quantized" or ".q8" for the planes of ``quantized=True`` or ``"q8-activations"``)."""
    return Path(folder) / f"{path.stem}{MODES[quantized]}-{cache_key(path, quantized)}"


def cached_network(path: Path, folder: Path, build, quantized: bool | str = False) -> Transformer:
    """The model of the GGUF file ``path`` (float32, or its quantized planes as ``quantized`` asks): mapped from
    its entry in ``folder`` when there is one, else ``build()`` (the loader), written to ``folder`` for next
    time (a folder that cannot be written is skipped: the model is returned all the same)."""
    entry = entry_folder(folder, Path(path), quantized)
    model = read_entry(entry)
    if model is not None:
        return model
    shutil.rmtree(entry, ignore_errors=True)  # a damaged entry (if any) gives way to a whole one
    model = build()
    try:
        write_entry(model, entry)
    except OSError:
        pass                                   # a read-only or full disk: no copy, the model as built
    return model


MATRIX_CLASSES = {c.__name__: c for c in (QuantizedMatrix, Q8ActivationMatrix, Q8KActivationMatrix)}   # what a
#                                                                        quantized weight may be
ROOT_DTYPES = {np.dtype(t).str for t in (np.float32, np.float16, np.uint8, np.int8)}   # the arrays an entry holds


def roots_and_views(model: Transformer):
    """``(roots, views)``: the arrays that own the model's numbers (each C- or F-contiguous), and each
    parameter as ``[root, transposed, start, stop]`` (a column range of the root, or of its transpose) or, for a
    quantized weight, a dict of its kind, type and sizes with each plane as ``[root, g0, g1]`` (a range of the
    root's groups); None when some parameter is neither (then nothing is cached)."""
    roots = []

    def add(root: np.ndarray) -> int:
        i = next((k for k, r in enumerate(roots) if r is root), None)
        if i is None:
            roots.append(root)
            i = len(roots) - 1
        return i
    views = {}
    for name, a in model.params().items():
        if is_quantized(a):
            view = quantized_view(a, add)
        elif isinstance(a, np.ndarray) and a.dtype == np.float32:
            view = array_view(a, add)
        else:
            view = None
        if view is None:
            return None
        views[name] = view
    return roots, views


def array_view(a: np.ndarray, add):
    """``[root, transposed, start, stop]`` of a float32 parameter (``add(root)`` gives the root's index), or None."""
    root = a if a.base is None else a.base
    view = column_range(root, a) if isinstance(root, np.ndarray) and contiguous(root) else None
    if view is None:                       # a view of another kind (a small weight's .T of its tensor):
        if not contiguous(a):              # kept as an array of its own, in its own layout
            return None
        root, view = a, (False, 0, a.shape[-1] if a.ndim else 0)
    return [add(root), *view]


def quantized_view(w, add):
    """A quantized weight (:class:`QuantizedMatrix`, or :class:`QuantizedRows` of one) as its class, type,
    sizes and planes, each ``[root, g0, g1]`` (None for a plane it has not); None when a plane is not a range of
    groups of a C-contiguous array."""
    rows = isinstance(w, QuantizedRows)
    m = w.T if rows else w
    if type(m).__name__ not in MATRIX_CLASSES or MATRIX_CLASSES[type(m).__name__] is not type(m):
        return None
    planes = []
    for p in (m.qs, m.d, m.m):
        if p is None:
            planes.append(None)
            continue
        root = p.base if isinstance(p.base, np.ndarray) and group_range(p.base, p) is not None else p
        if not root.flags.c_contiguous or root.dtype.str not in ROOT_DTYPES:
            return None
        planes.append([add(root), *group_range(root, p)])
    return {"class": type(m).__name__, "rows": rows, "qtype": m.qtype, "d_in": m.d_in, "d_out": m.d_out,
            "planes": planes}


def group_range(root: np.ndarray, p: np.ndarray):
    """``(g0, g1)`` with ``p`` the very view ``root[g0:g1]`` of a C-contiguous ``root``, or None."""
    if p is root:
        return 0, p.shape[0]
    if not root.flags.c_contiguous or p.dtype != root.dtype or p.shape[1:] != root.shape[1:] \
            or p.strides != root.strides or not root.ndim:
        return None
    ptr = p.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    step = root.strides[0]
    if step <= 0 or ptr % step or not 0 <= ptr // step <= root.shape[0] - p.shape[0]:
        return None
    return ptr // step, ptr // step + p.shape[0]


def contiguous(a: np.ndarray) -> bool:
    return a.flags.c_contiguous or a.flags.f_contiguous


def column_range(root: np.ndarray, a: np.ndarray):
    """``(transposed, start, stop)`` with ``a`` the very view ``(root.T if transposed else root)[..., start:stop]``,
    or None."""
    ptr = a.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    for transposed, whole in ((False, root), (True, root.T)):
        if whole.ndim != a.ndim or whole.shape[:-1] != a.shape[:-1] or whole.strides != a.strides:
            continue
        step = whole.strides[-1] if whole.ndim else 1
        if step and ptr % step == 0 and 0 <= ptr // step <= whole.shape[-1] - a.shape[-1]:
            start = ptr // step if whole.ndim else 0
            return transposed, start, start + (a.shape[-1] if whole.ndim else 0)
    return None


def write_entry(model: Transformer, entry: Path) -> bool:
    """Write the model's arrays (float32, or a quantized weight's planes) and config to ``entry`` (atomically: a
    temporary folder renamed); False when the model cannot be cached (a config that does not survive JSON,
    views of another kind)."""
    config = model.config.to_json()
    if not config_of(config, model.config.eos_ids) == model.config:
        return False
    found = roots_and_views(model)
    if found is None:
        return False
    roots, views = found
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.parent / f".{entry.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        table, offset = [], 0
        with open(tmp / "weights.bin", "wb") as f:
            for r in roots:
                order = "C" if r.flags.c_contiguous else "F"    # (a 1-D array is both: "C")
                f.write(b"\0" * (offset - f.tell()))
                f.write(r.tobytes(order=order))
                table.append({"offset": offset, "shape": list(r.shape), "order": order, "dtype": r.dtype.str})
                offset = -(-(offset + r.nbytes) // ALIGN) * ALIGN
        index = {"format": FORMAT, "config": config, "eos_ids": list(model.config.eos_ids), "roots": table,
                 "params": views, "bytes": (tmp / "weights.bin").stat().st_size}
        (tmp / "index.json").write_text(json.dumps(index), encoding="utf-8")
        os.rename(tmp, entry)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if entry.is_dir():                     # another process wrote the same entry first
            return True
        raise
    for old in entry.parent.glob(f"{entry.name.rsplit('-', 1)[0]}-*"):
        if old != entry and old.is_dir() and len(old.name) == len(entry.name):
            shutil.rmtree(old, ignore_errors=True)      # the same file's entries of an older key
    return True


def config_of(data: dict, eos_ids) -> ModelConfig:
    """The ModelConfig of an entry's JSON, with its eos ids (to_json leaves them out)."""
    import dataclasses
    return dataclasses.replace(ModelConfig.from_json(data), eos_ids=tuple(int(i) for i in eos_ids))


def read_entry(entry: Path) -> Transformer | None:
    """The model kept in ``entry``, its arrays views of the mapped file (copy-on-write); None when there is no
    whole, readable entry (a truncated file, an index that does not fit it or names a plane of the wrong shape)."""
    try:
        index = json.loads((entry / "index.json").read_text(encoding="utf-8"))
        with open(entry / "weights.bin", "rb") as f:
            if index.get("format") != FORMAT or os.fstat(f.fileno()).st_size != index["bytes"]:
                return None
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        roots = []
        for r in index["roots"]:
            shape, dtype = tuple(int(n) for n in r["shape"]), np.dtype(r.get("dtype", "<f4"))
            if dtype.str not in ROOT_DTYPES or r["offset"] < 0 or min(shape, default=0) < 0 \
                    or r["offset"] + dtype.itemsize * int(np.prod(shape)) > len(mapped):
                return None
            roots.append(np.ndarray(shape, dtype, buffer=mapped, offset=r["offset"], order=r["order"]))
        params = {}
        for name, spec in index["params"].items():
            params[name] = quantized_param(roots, spec) if isinstance(spec, dict) else array_param(roots, spec)
            if params[name] is None:
                return None
        return Transformer.from_params(config_of(index["config"], index["eos_ids"]), params)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def array_param(roots: list, spec: list) -> np.ndarray | None:
    i, transposed, start, stop = spec
    whole = roots[i].T if transposed else roots[i]
    if whole.dtype != np.float32:
        return None
    return whole[..., start:stop] if whole.ndim else whole


def quantized_param(roots: list, spec: dict):
    """The quantized weight ``spec`` describes, its planes views of ``roots``; None unless every plane has the
    shape and dtype its type and sizes give (a plane too small would be read past its end by the kernels)."""
    cls, qtype, d_in, d_out = MATRIX_CLASSES[spec["class"]], spec["qtype"], int(spec["d_in"]), int(spec["d_out"])
    like = one_group(cls, qtype, d_in)                     # the planes' shapes past the groups, their dtypes
    planes = []
    for p, ref in zip(spec["planes"], (like.qs, like.d, like.m)):
        if (p is None) != (ref is None):
            return None
        if p is None:
            planes.append(None)
            continue
        i, g0, g1 = (int(n) for n in p)
        plane = roots[i][g0:g1]
        if not 0 <= g0 <= g1 <= roots[i].shape[0] or plane.dtype != ref.dtype \
                or plane.shape != (-(-d_out // GROUP), *ref.shape[1:]):
            return None
        planes.append(plane)
    w = cls._of(qtype, d_in, d_out, *planes)
    return QuantizedRows(w) if spec["rows"] else w


@functools.lru_cache(maxsize=64)
def one_group(cls, qtype: str, d_in: int):
    """A weight of ``cls`` of one group of zero rows (type ``qtype``, width ``d_in``): its planes' shapes and
    dtypes past the first axis are every weight's of that type and width. A ValueError for a type or width
    the class does not take."""
    block, nbytes = quant_sizes(qtype)
    if d_in <= 0 or d_in % block:
        raise ValueError(f"d_in {d_in} is not a whole number of {qtype} blocks")
    return cls(np.zeros((GROUP, d_in // block * nbytes), np.uint8), qtype, d_in)
