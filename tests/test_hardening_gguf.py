"""A GGUF file is untrusted input (issue 31, cause 3): its header is walked before the gguf package reads it,
every count and length bounded by the bytes left, every tensor's bytes inside the data section and its own; a
vocabulary lists each token once. Then a fuzz test: files written by GGUFWriter, their headers corrupted at
random, each a one-line ValueError or a correct load, within a memory bound."""

import contextlib
import struct
import sys
import tracemalloc
import warnings

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from attnlab.cli import main  # noqa: E402
from attnlab.models import load_model  # noqa: E402

TENSOR = "blk.0.attn_q.weight"           # (64, 64) float32: 16,384 bytes


@pytest.fixture(scope="module")
def good(tmp_path_factory, gguf_files):
    """A tiny valid GGUF file's bytes, and where its data section begins."""
    path = gguf_files.write_gguf(tmp_path_factory.mktemp("gguf") / "good.gguf")
    return path.read_bytes(), gguf.GGUFReader(path).data_offset


def key_type_at(data: bytes, key: str) -> int:
    """Where the value type of metadata ``key`` sits (just past its name)."""
    name = key.encode()
    at = data.index(struct.pack("<Q", len(name)) + name)
    return at + 8 + len(name)


def tensor_info_at(data: bytes, name: str) -> tuple[int, int]:
    """Where tensor ``name``'s type and offset sit in its header entry: (type position, offset position)."""
    raw = name.encode()
    at = data.index(struct.pack("<Q", len(raw)) + raw) + 8 + len(raw)
    n_dims = struct.unpack_from("<I", data, at)[0]
    type_at = at + 4 + 8 * n_dims
    return type_at, type_at + 4


def offset_of(data: bytes, name: str) -> int:
    return struct.unpack_from("<Q", data, tensor_info_at(data, name)[1])[0]


def put(data: bytes, at: int, fmt: str, value) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def refused(tmp_path, capsys, data: bytes, *needles) -> str:
    """The file is one ValueError in the library and one line, exit 2, in the CLI, each naming ``needles``."""
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(ValueError) as e, warnings.catch_warnings():
        warnings.simplefilter("error")                            # a warning would be more lines on stderr
        load_model(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value), str(e.value)
    assert main(["generate", "--model", str(path), "--prompt", "the cat", "--tokens", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("attnlab: error: "), err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


@pytest.mark.parametrize("count", [2 ** 62, 2 ** 40, 10 ** 6])
def test_an_array_count_past_the_file_is_refused_before_the_reader_reads_it(tmp_path, capsys, good, count):
    data, _ = good
    at = key_type_at(data, "tokenizer.ggml.token_type")          # ARRAY, item type INT32, count
    data = put(put(data, at + 4, "<I", 0), at + 8, "<Q", count)  # a uint8 array of `count` items
    refused(tmp_path, capsys, data, "'tokenizer.ggml.token_type'", f"array of {count} items")


@pytest.mark.parametrize("length", [2 ** 62, 2 ** 40, 2 ** 64 - 1])
def test_a_string_length_past_the_file_is_refused(tmp_path, capsys, good, length):
    data, _ = good
    at = key_type_at(data, "tokenizer.chat_template")             # STRING, then its length
    refused(tmp_path, capsys, put(data, at + 4, "<Q", length), "'tokenizer.chat_template'", f"{length} bytes")


def test_a_tensor_offset_that_wraps_into_the_header_is_refused(tmp_path, capsys, good):
    data, start = good
    wraps = 2 ** 64 - start + 64                                  # gguf's uint64 sum: byte 64, in the header
    data = put(data, tensor_info_at(data, TENSOR)[1], "<Q", wraps)
    refused(tmp_path, capsys, data, repr(TENSOR), "overflow")


def test_an_offset_of_2_to_the_64_minus_1_is_one_line(tmp_path, capsys, good):
    data, _ = good
    refused(tmp_path, capsys, put(data, tensor_info_at(data, TENSOR)[1], "<Q", 2 ** 64 - 1), repr(TENSOR))


def test_two_tensors_sharing_bytes_are_refused(tmp_path, capsys, good):
    data, _ = good
    other = "blk.0.attn_output.weight"                            # the same size, (64, 64)
    data = put(data, tensor_info_at(data, other)[1], "<Q", offset_of(data, TENSOR))
    refused(tmp_path, capsys, data, "share bytes", repr(TENSOR), repr(other))


def test_a_last_tensor_past_the_end_is_named(tmp_path, capsys, good):
    data, _ = good
    last = max(gguf.GGUFReader(_write(tmp_path, data)).tensors, key=lambda t: t.data_offset).name
    refused(tmp_path, capsys, data[:-16], repr(last), "ends at byte")


def test_a_tensor_type_that_is_no_ggml_type_is_refused(tmp_path, capsys, good):
    data, _ = good
    refused(tmp_path, capsys, put(data, tensor_info_at(data, TENSOR)[0], "<I", 999), repr(TENSOR), "type 999")


def test_a_vocabulary_listing_a_token_twice_is_refused(tmp_path, capsys, good, gguf_files):
    data, _ = good
    tokens = gguf_files.TOKENS
    one, two = "Ġc", "Ġt"                                         # the same length in UTF-8
    entry = lambda t: struct.pack("<Q", len(t.encode())) + t.encode()   # noqa: E731
    at = data.index(entry(one))
    data = data[:at] + entry(two) + data[at + len(entry(one)):]
    refused(tmp_path, capsys, data, "'tokenizer.ggml.tokens' lists 'Ġt' twice",
            f"ids {tokens.index(two)} and {tokens.index(one)}")


def _write(tmp_path, data: bytes):
    path = tmp_path / "as_written.gguf"
    path.write_bytes(data)
    return path


# --- the fuzz test ----------------------------------------------------------------------------------------------

WIDTHS = {1: "<B", 4: "<I", 8: "<Q"}
EDGES = [0, 1, 2, 9, 12, 13, 255, 2 ** 31, 2 ** 32 - 1, 2 ** 40, 2 ** 62, 2 ** 63, 2 ** 64 - 1]
MEMORY = 64 * 2 ** 20          # what a load of this 1 MB file may allocate (the model itself: ~0.5 MB)


LIMIT = 2 ** 30                 # and the address space it may add, a hard stop before the machine's memory


@contextlib.contextmanager
def address_space_limit(extra: int):
    """At most ``extra`` more bytes of address space for this process (RLIMIT_AS's soft limit, put back after):
    an allocation past it is a MemoryError, not the machine's memory exhausted."""
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        now = int(f.read().split()[0]) * resource.getpagesize()
    limit = now + extra if hard == resource.RLIM_INFINITY else min(now + extra, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def header_fields(path) -> dict[str, list[tuple[int, int]]]:
    """(position, width) of every count, length, type, offset and number of a valid file's header, by role, as
    the gguf package's own reader finds them."""
    reader = gguf.GGUFReader(path)
    base = reader.data.ctypes.data
    out = {}

    def add(role, part):
        out.setdefault(role, []).append((part.ctypes.data - base, part.dtype.itemsize))

    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        add("key length", field.parts[0])
        add("value type", field.parts[2])
        rest = field.parts[3:]
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            add("item type", rest[0])
            add("item count", rest[1])
            rest = rest[2:]
        for part in rest:
            if part.dtype == np.uint64 and part.size == 1 and gguf.GGUFValueType.STRING in field.types:
                add("string length", part)
            elif part.size == 1 and part.dtype.itemsize in (4, 8):
                add("number", part)
    for t in reader.tensors:
        name_len, _, n_dims, dims, kind, offset = t.field.parts
        for role, part in (("tensor name length", name_len), ("n_dims", n_dims), ("tensor type", kind),
                           ("offset", offset)):
            add(role, part)
        out.setdefault("dim", []).extend((dims.ctypes.data - base + 8 * i, 8) for i in range(dims.size))
    return out


@st.composite
def corruptions(draw, fields: dict, header: int):
    """One to three edits of the header: a count, length, type, offset or number (or, one time in eight, any
    bytes) overwritten with an edge case or any value."""
    edits = []
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.integers(0, 7)):
            at, width = draw(st.sampled_from(fields[draw(st.sampled_from(sorted(fields)))]))
        else:
            width = draw(st.sampled_from(sorted(WIDTHS)))
            at = draw(st.integers(4, header - width))
        value = draw(st.sampled_from(EDGES) | st.integers(0, 2 ** 64 - 1)) % (1 << 8 * width)
        edits.append((at, width, value))
    return edits


@pytest.fixture(scope="module")
def fuzz_file(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz") / "fuzzed.gguf"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the address-space limit reads /proc/self/statm")
def test_corrupted_headers_give_one_line_or_a_correct_load(good, fuzz_file):
    data, start = good
    reference, _ = load_model(_write(fuzz_file.parent, data))
    fields = header_fields(_write(fuzz_file.parent, data))
    assert len(fields["string length"]) > 270 and len(fields["offset"]) == len(fields["tensor type"]) > 10

    @settings(max_examples=120, deadline=10_000, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(corruptions(fields, start))
    def case(edits):
        damaged = data
        for at, width, value in edits:
            damaged = put(damaged, at, WIDTHS[width], value)
        fuzz_file.write_bytes(damaged)
        tracemalloc.start()
        try:
            with address_space_limit(LIMIT):
                model, tok = load_model(fuzz_file)
        except ValueError as e:
            assert "\n" not in str(e), str(e)
            return
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert peak < MEMORY, (edits, peak)
        same = all(np.array_equal(a, reference.params()[k]) for k, a in model.params().items())
        assert same or model.config != reference.config or damaged[start:] != data[start:], edits

    case()
