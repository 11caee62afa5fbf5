"""A GGUF file's header (metadata and tensor table) read in one pass over the mapped file.

The ``gguf`` package's :class:`gguf.GGUFReader` builds a numpy view for every part of every metadata value:
on SmolLM2's file, whose vocabulary (49,152 tokens) and merges (48,900) are about 98,000 strings, that is
about 4.5 s of a 9 s load (measured with cProfile; docs/gguf.md). This reader walks the same layout with
``struct`` and gives each string as one ``str``: about 0.1 s. It keeps what attnlab uses of the reader's
result (the values as plain Python numbers, strings and lists, and each tensor's type, shape and bytes as a
view of the mapped file) and the reader's rules: the format (versions 2 and 3), the value types, the
alignment (``general.alignment``, a power of two, default 32), each tensor's byte count from
``gguf.constants.GGML_QUANT_SIZES``, and the array shape it hands out (numpy order; a block type as uint8 rows
of its bytes). The tests hold it to :class:`gguf.GGUFReader` on the same files.

It is also where a hostile file stops (docs/hardening.md): every read is checked against the file's end, every
array count and string length against the bytes left (and an array against :data:`MOST_ARRAY_ITEMS`) before
anything is built from it, and every tensor's span (:func:`check_spans`) against the data section, the end of
the file and every other tensor's, in Python's integers (no uint64 wrap). Each refusal is one ValueError
naming the file and the field.

The layout (little-endian)::

    magic "GGUF", version u32, n_tensors u64, n_kv u64
    n_kv ×      key (u64 length + UTF-8), value type u32, value
    n_tensors × name (string), n_dims u32, dims u64 × n_dims (fastest first), type u32, offset u64
    padding to the alignment, then the tensors' data (each at its offset from here)
"""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
PLAIN_TYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
               "I32": np.int32, "I64": np.int64}      # handed out as these; every other type as uint8 bytes
DEFAULT_ALIGNMENT = 32
MAGIC = b"GGUF"
MOST_ARRAY_ITEMS = 1 << 22      # more than any vocabulary or merge list (Llama 3: 280,147 merges): a string item
                                # costs ~60 bytes of Python objects, so a count is bounded before it is read
MOST_DIMS = 4                   # GGML_MAX_DIMS
MIN_KV_BYTES, MIN_TENSOR_BYTES = 8 + 1 + 4 + 1, 8 + 1 + 4 + 8 + 4 + 8   # the smallest entry of each table


class Damaged(ValueError):
    """The header runs past the end of the file or holds what the format does not allow."""


class Cursor:
    """Reads the header's values in order from the file's bytes (a buffer), every read checked against its end."""

    def __init__(self, buf, size: int, pos: int = 0):
        self.buf, self.size, self.pos = buf, size, pos

    def need(self, n: int, what: str) -> int:
        if n < 0 or self.pos + n > self.size:
            raise Damaged(f"{what} at byte {self.pos} needs {n} bytes, past the end of the file ({self.size} bytes)")
        start, self.pos = self.pos, self.pos + n
        return start

    def scalar(self, fmt: str, what: str):
        start = self.need(struct.calcsize(fmt), what)
        return struct.unpack_from(fmt, self.buf, start)[0]

    def string(self, what: str) -> str:
        n = self.scalar("<Q", f"the length of {what}")
        start = self.need(n, f"{what} (a string of {n} bytes)")
        return str(self.buf[start:start + n], "utf-8")

    def strings(self, count: int, what: str) -> list[str]:
        """``count`` strings in a row (a vocabulary's 49,000): :meth:`string` each, in one loop that builds no
        message unless a read fails (then :meth:`string` reads the failing one again and says what is wrong)."""
        buf, size, pos, out = self.buf, self.size, self.pos, []
        length = struct.Struct("<Q").unpack_from
        append = out.append
        try:
            for _ in range(count):
                end = pos + 8
                if end > size:
                    break
                n = length(buf, pos)[0]
                pos, end = end, end + n
                if end > size:
                    break
                append(str(buf[pos:end], "utf-8"))
                pos = end
            else:
                self.pos = pos
                return out
        except UnicodeDecodeError:
            pass
        return [self.string(what) for _ in range(count)]   # again from the start: the failing one says why

    def value(self, vtype: int, key: str):
        if vtype == STRING:
            return self.string(f"the string of {key!r}")
        if vtype in SCALARS:
            return self.scalar(SCALARS[vtype], f"the value of {key!r}")
        if vtype != ARRAY:
            raise Damaged(f"metadata {key!r} has value type {vtype}, which GGUF does not define")
        item, count = self.scalar("<I", f"the array type of {key!r}"), self.scalar("<Q", f"the length of {key!r}")
        least = 8 if item == STRING else struct.calcsize(SCALARS[item]) if item in SCALARS else 0
        if count > MOST_ARRAY_ITEMS or count * least > self.size - self.pos:
            raise Damaged(f"metadata {key!r} is an array of {count} items, more than the {self.size - self.pos} bytes "
                          f"left in the file (or {MOST_ARRAY_ITEMS:,}, the most attnlab reads) can hold")
        if item == STRING:
            return self.strings(count, f"a string of {key!r}")
        if item not in SCALARS:
            raise Damaged(f"metadata {key!r} is an array of value type {item}, which attnlab does not read")
        dtype = np.dtype(SCALARS[item])
        start = self.need(count * dtype.itemsize, f"the array {key!r}")
        return np.frombuffer(self.buf, dtype, count, start).tolist()


def read_gguf_header(path: Path, mapped: np.memmap) -> tuple[dict, list[tuple], int]:
    """``(fields, tensors, data_start)`` of the GGUF file mapped in ``mapped`` (uint8, the whole file):
    the metadata as plain values, and per tensor ``(name, type name, shape, offset, n_bytes)`` with the shape in
    GGUF's order (fastest dim first) and the offset from ``data_start``. A ValueError naming the file when the
    header is damaged or cut short."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    buf = memoryview(mapped).cast("B")
    size = len(buf)
    if bytes(buf[:4]) != MAGIC:
        raise ValueError(f"{path} is not a GGUF file: it does not begin with the magic {MAGIC!r}")
    try:
        c = Cursor(buf, size, 4)
        version, n_tensors, n_kv = c.scalar("<I", "version"), c.scalar("<Q", "tensor_count"), c.scalar("<Q", "kv_count")
        if version not in (2, 3):
            raise Damaged(f"GGUF version {version}; attnlab reads versions 2 and 3")
        for field, count, least in (("tensor_count", n_tensors, MIN_TENSOR_BYTES), ("kv_count", n_kv, MIN_KV_BYTES)):
            if count * least > size - c.pos:
                raise Damaged(f"the header's {field} is {count}, more entries than a file of {size} bytes can hold")
        fields = {"GGUF.version": version, "GGUF.tensor_count": n_tensors, "GGUF.kv_count": n_kv}   # as the reader
        for _ in range(n_kv):
            key = c.string("a metadata key")
            fields[key] = c.value(c.scalar("<I", f"the type of {key!r}"), key)
        tensors, names = [], set()
        for _ in range(n_tensors):
            name = c.string("a tensor name")
            if name in names:
                raise Damaged(f"tensor {name!r} is listed twice")
            names.add(name)
            n_dims = c.scalar("<I", f"the rank of {name!r}")
            if n_dims > MOST_DIMS:
                raise Damaged(f"tensor {name!r} has {n_dims} dimensions; GGUF tensors have at most {MOST_DIMS}")
            shape = tuple(c.scalar("<Q", f"a dimension of {name!r}") for _ in range(n_dims))
            raw_type, offset = c.scalar("<I", f"the type of {name!r}"), c.scalar("<Q", f"the offset of {name!r}")
            try:
                qtype = GGMLQuantizationType(raw_type)
            except ValueError:
                raise Damaged(f"tensor {name!r} has type {raw_type}, which GGUF does not define") from None
            block, type_bytes = GGML_QUANT_SIZES[qtype]
            n_elements = math.prod(shape)
            if n_elements % block:
                raise Damaged(f"tensor {name!r} of shape {shape} does not fill whole {qtype.name} blocks of {block}")
            tensors.append((name, qtype, shape, offset, n_elements // block * type_bytes))
        alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 \
                or alignment & (alignment - 1):
            raise Damaged(f"'general.alignment' is {alignment!r}; it must be a power of two")
        data_start = -(-c.pos // alignment) * alignment
        check_spans(tensors, data_start, size)
    except (UnicodeDecodeError, struct.error, OverflowError, MemoryError) as e:
        raise ValueError(f"{path} is truncated or damaged: {type(e).__name__}: {e}") from None
    except Damaged as e:
        raise ValueError(f"{path} is truncated or damaged: {e}") from None
    return fields, tensors, data_start


def check_spans(tensors: list[tuple], start: int, size: int) -> None:
    """Every tensor's bytes lie inside the data section [start, size), and no two share a byte. The sums are
    Python's integers: an offset that would wrap a reader's uint64 arithmetic (2⁶⁴ − start + 64) begins past the
    end here, not inside the header."""
    spans = []
    for name, _, _, offset, n_bytes in tensors:
        begin, end = start + offset, start + offset + n_bytes
        if end > size:
            where = "past 2**64, an overflow" if begin >= 1 << 64 else f"at byte {end}"
            raise Damaged(f"tensor {name!r} ({n_bytes} bytes at offset {offset} of the data section, which begins "
                          f"at byte {start}) ends {where}; the file has {size} bytes")
        if n_bytes:
            spans.append((begin, end, name))
    spans.sort()
    for (_, end_a, a), (begin_b, end_b, b) in zip(spans, spans[1:]):
        if begin_b < end_a:
            raise Damaged(f"tensors {a!r} and {b!r} share bytes {begin_b}..{min(end_a, end_b)} (every tensor's bytes "
                          "must be its own)")


def tensor_view(mapped: np.memmap, qtype, shape: tuple, start: int, n_bytes: int) -> np.ndarray:
    """A tensor's bytes as the gguf reader hands them out: numpy order (slowest dim first), in its own dtype
    for a plain type, else uint8 rows of each row's blocks (the last dim in bytes)."""
    np_shape = tuple(reversed(shape))
    raw = mapped[start:start + n_bytes]                                  # (n_bytes,) uint8, a view of the file
    plain = PLAIN_TYPES.get(qtype.name)
    if plain is not None:
        return raw.view(plain).reshape(np_shape)
    from gguf.constants import GGML_QUANT_SIZES

    block, type_bytes = GGML_QUANT_SIZES[qtype]
    return raw.reshape(*np_shape[:-1], np_shape[-1] // block * type_bytes)   # (..., bytes per row)
