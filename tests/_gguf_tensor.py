"""One quantized tensor through a real GGUF file: the bytes written by ``gguf.GGUFWriter`` and read back by
``gguf.GGUFReader``, for the 8-bit-activation tests (tests/test_q8_*.py)."""

from __future__ import annotations

import gguf
import numpy as np
from gguf import GGMLQuantizationType


def written_raw(path, raw: np.ndarray, qtype: str) -> tuple[np.ndarray, int]:
    """``raw`` blocks of ``qtype`` (rows, bytes) written to ``path`` as tensor "w" and read back: (raw bytes, d_in)."""
    t = GGMLQuantizationType[qtype]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("w", raw, raw_dtype=t)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tensor = gguf.GGUFReader(str(path)).tensors[0]
    assert tensor.tensor_type == t
    return np.asarray(tensor.data), int(tensor.shape[0])


def written(tmp_path, w: np.ndarray, qtype: str) -> tuple[np.ndarray, int]:
    """``w`` (d_out, d_in) quantized to ``qtype`` by ``gguf.quants``, written and read back: (raw bytes, d_in)."""
    raw = gguf.quants.quantize(w, GGMLQuantizationType[qtype])
    return written_raw(tmp_path / f"w_{qtype}.gguf", raw, qtype)
