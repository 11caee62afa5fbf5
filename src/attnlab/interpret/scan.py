"""A corpus scan: per-head statistics averaged over every line of a text file (Clark et al., 2019, "What does
BERT look at?").

For each line the model runs once; each head gets, averaged over the line's queries:

- ``entropy``: −Σ a log a, nats;
- ``distance``: Σ a·|i − j|, the mean attention distance in positions;
- ``cls``, ``sep``, ``punctuation``: the weight on [CLS], on [SEP], on punctuation tokens;
- the three detector scores of :mod:`attnlab.interpret.detect`.

The per-line numbers are added into a :class:`ScanSums` (one (n_layers, n_heads) array per statistic and
a count), and sums are merged: memory stays the same whatever the corpus's length. The corpus averages are
the sums divided by the count. A line longer than the model's positions, or of a single token, is skipped
and counted; the scan never stops for one line.

:func:`scan_corpus` runs chunks of lines on Dask workers (``attnlab[distributed]``), each worker loading the
model once, at most two chunks per worker in flight, merging partial sums as they come back; without a
client it runs them here.
"""

from __future__ import annotations

import functools
import string
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..viz.attnmap import AttentionMap
from ..viz.summary import summarize_heads
from .detect import KINDS, model_patterns, score_patterns

STATS = ("entropy", "distance", "cls", "sep", "punctuation", *KINDS)
PUNCTUATION = set(string.punctuation) | set("“”‘’—–…")


SKIP_KINDS = ("blank", "not_utf8", "binary")     # lines a corpus read skips, each counted by line number


def read_corpus(path) -> list[str]:
    """The lines of a UTF-8 file worth scanning, stripped (see :func:`read_corpus_lines`); a corpus with none
    is a ValueError, an unreadable file an OSError."""
    return read_corpus_lines(path)[0]


def read_corpus_lines(path) -> tuple[list[str], dict[str, list[int]]]:
    """``(lines, skipped)``: a file's lines (split at ``\\n``), stripped, and by kind the 1-based numbers of
    the lines skipped: ``blank`` (nothing but whitespace), ``not_utf8`` (a byte sequence UTF-8 does not
    allow), ``binary`` (a NUL or another control character than tab, as in a binary file). One bad line
    never stops the others.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "c.txt"
    >>> _ = p.write_bytes(b"one\\n\\n  \\nbad \\xff\\nnul\\x00\\ntwo\\r\\n")
    >>> read_corpus_lines(p)
    (['one', 'two'], {'blank': [2, 3], 'not_utf8': [4], 'binary': [5]})
    """
    lines, skipped = [], {kind: [] for kind in SKIP_KINDS}
    for number, raw in enumerate(Path(path).read_bytes().split(b"\n"), 1):
        kind, text = corpus_line(raw)
        if kind is None:
            lines.append(text)
        else:
            skipped[kind].append(number)
    if skipped["blank"] and skipped["blank"][-1] == number and not raw:
        skipped["blank"].pop()                        # the empty "line" after the file's final newline
    if not lines:
        raise ValueError(f"the corpus {path} has no non-blank line to scan")
    return lines, skipped


def corpus_line(raw: bytes) -> tuple[str | None, str]:
    """``(None, text)`` for a line to scan, else ``(kind, "")``, kind one of :data:`SKIP_KINDS`."""
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return "not_utf8", ""
    if not text:
        return "blank", ""
    if any(c < " " and c != "\t" or c == "\x7f" for c in text):
        return "binary", ""
    return None, text


@dataclass
class ScanSums:
    """Partial sums of a scan: per statistic an (n_layers, n_heads) sum over the lines counted."""
    sums: dict = field(default_factory=dict)
    lines: int = 0              # lines scanned
    tokens: int = 0
    too_long: int = 0           # lines skipped: more tokens than the model's positions
    too_short: int = 0          # lines skipped: one token, nothing to score

    def add(self, other: "ScanSums") -> "ScanSums":
        """Add ``other`` into these sums (in place) and return them."""
        for k, v in other.sums.items():
            self.sums[k] = self.sums[k] + v if k in self.sums else v.copy()
        self.lines += other.lines
        self.tokens += other.tokens
        self.too_long += other.too_long
        self.too_short += other.too_short
        return self

    def means(self) -> dict[str, np.ndarray]:
        """Each statistic's corpus average (n_layers, n_heads); a ValueError if no line was scanned."""
        if not self.lines:
            raise ValueError(f"no line could be scanned ({self.too_long} longer than the model's positions, "
                             f"{self.too_short} of one token)")
        return {k: self.sums[k] / self.lines for k in STATS}


def is_punctuation(label: str) -> bool:
    core = label.replace("Ġ", "").replace("##", "").strip()
    return bool(core) and all(ch in PUNCTUATION for ch in core)


def line_stats(weights: np.ndarray, ids: np.ndarray, labels) -> dict[str, np.ndarray]:
    """The statistics of one line: ``weights`` (n_layers, n_heads, n, n) -> {stat: (n_layers, n_heads)}."""
    facts = summarize_heads(AttentionMap(tuple(labels), weights))
    on = lambda cols: weights[..., cols].sum(-1).mean(-1)                  # noqa: E731  (n_layers, n_heads)
    labels = list(labels)
    out = {"entropy": facts.entropy, "distance": facts.distance,
           "cls": on(np.array([t == "[CLS]" for t in labels])), "sep": on(np.array([t == "[SEP]" for t in labels])),
           "punctuation": on(np.array([is_punctuation(t) for t in labels]))}
    out.update(score_patterns(weights, ids))
    return out


def scan_lines(model, tokenizer, lines) -> ScanSums:
    """Scan ``lines`` with a loaded model: their :class:`ScanSums`."""
    c = model.config
    out = ScanSums()
    for text in lines:
        ids = tokenizer.encode(text)
        if ids.size > c.n_ctx:                         # past its positions (RoPE: the context it was trained on)
            out.too_long += 1
            continue
        if ids.size < 2:
            out.too_short += 1
            continue
        weights = model_patterns(model, ids).astype(np.float64)        # (n_layers, n_heads, n, n)
        one = line_stats(weights, ids, tokenizer.labels(ids))           # {stat: (n_layers, n_heads)}
        out.add(ScanSums(sums=one, lines=1, tokens=int(ids.size)))
    return out


@functools.lru_cache(maxsize=2)
def _loaded(model_name: str, quantized: bool = False):
    """The model and tokenizer, loaded once per process (each Dask worker keeps its own); ``quantized``: a
    GGUF file's weights kept in their types (``load_model(..., quantized=True)``)."""
    from ..models import load_model
    return load_model(model_name, quantized=quantized)


def scan_chunk(model_name: str, lines: list[str], quantized: bool = False) -> ScanSums:
    """One chunk, where it runs (a Dask worker or here)."""
    from ..kernels._threads import one_blas_thread
    model, tokenizer = _loaded(model_name, quantized)
    with one_blas_thread():
        return scan_lines(model, tokenizer, lines)


def chunks(lines: list[str], size: int) -> list[list[str]]:
    return [lines[i:i + size] for i in range(0, len(lines), size)]


# Dask's nannies start workers with MALLOC_TRIM_THRESHOLD_=65536: glibc then hands every freed block above
# 64 KiB back to the system, and each of numpy's temporaries (a layer's (n, d_mlp) activations, the erfc of
# the GELU) is page-faulted in afresh. Measured on this scan: a chunk took 2.5× as long in a worker as here.
# 128 MiB keeps the temporaries' pages while still returning a finished scan's memory. Dask's statistical
# profiler (a thread walking the task's stack every 10 ms) is switched off too: with it a chunk's wall time
# in a worker was 3.4 s, without it 2.0 s (the same chunk takes 0.7–1.0 s in this process; see the benchmark).
TRIM_THRESHOLD = 2 ** 27


def scan_cluster(n_workers: int):
    """A ``(LocalCluster, Client)`` of ``n_workers`` single-threaded worker processes for :func:`scan_corpus`,
    with glibc's trim threshold raised and Dask's profiler off (see :data:`TRIM_THRESHOLD`). The caller
    closes both."""
    import dask

    from ..distributed.cluster import local_cluster, require_distributed
    require_distributed()
    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": TRIM_THRESHOLD,
                          "distributed.worker.profile.enabled": False}):
        return local_cluster(n_workers)


def scan_corpus(model_name: str, lines: list[str], *, client=None, chunk_size: int = 16,
                on_progress=None, quantized: bool = False) -> ScanSums:
    """Scan every line; ``client`` (a ``distributed.Client``) runs chunks of ``chunk_size`` lines on its
    workers, None runs them in this process. ``on_progress(lines_done, lines_total)`` after each chunk.
    ``quantized``: each process loads a GGUF model with its weights kept in their types."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if not lines:
        raise ValueError("lines must hold at least one line to scan")
    parts, total, done = chunks(lines, chunk_size), len(lines), 0
    out = ScanSums()
    if client is None:
        _loaded(model_name, quantized)                        # a bad model fails before the first chunk
        for part in parts:
            out.add(scan_chunk(model_name, part, quantized))
            done += len(part)
            if on_progress:
                on_progress(done, total)
        return out
    from distributed import as_completed
    n_workers = max(1, len(client.scheduler_info()["workers"]))
    pending = iter(parts)
    running = as_completed([client.submit(scan_chunk, model_name, p, quantized, pure=False)
                            for p in (next(pending, None) for _ in range(2 * n_workers)) if p is not None],
                           with_results=True)
    for future, part_sums in running:
        out.add(part_sums)
        future.release()
        done += part_sums.lines + part_sums.too_long + part_sums.too_short
        if on_progress:
            on_progress(done, total)
        nxt = next(pending, None)
        if nxt is not None:
            running.add(client.submit(scan_chunk, model_name, nxt, pure=False))
    return out
