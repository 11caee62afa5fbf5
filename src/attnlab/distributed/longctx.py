"""One long-context attention run on a cluster, measured and checked: what ``attnlab longctx`` reports.

The run draws random q, k, v (unit normal, float32, d_head 64) on the client, runs
:func:`sequence_parallel_attention` with the lse, then checks sampled rows exactly: their weights, rebuilt
from the distributed lse by :func:`attnlab.attention_weights_rows` in float64, must sum to 1, and their
weighted values must equal the distributed output. It measures the wall time, each worker's peak memory,
the bytes that crossed between processes, and the single-process tiled ``attention`` time at the same n.
"""

from __future__ import annotations

import time

import numpy as np

from ..kernels._checks import as_positive_float, as_positive_int, check_flag, check_rng
from ..kernels.attention import attention
from ..kernels.tiled import attention_weights_rows
from .cluster import require_distributed, worker_addresses, worker_stats
from .sequence import sequence_parallel_attention

D_HEAD = 64
TOLERANCE = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}


def sample_rows(n: int, count: int, rng: np.random.Generator) -> list[int]:
    """The first and last query, and ``count - 2`` more drawn at random: the edges of the causal mask and
    the shards' seams are where a wrong offset would show."""
    rows = {0, n - 1} | set(rng.integers(0, n, size=max(0, count - 2)).tolist())
    return sorted(rows)


def check_rows(q, k, v, out, lse, rows, *, is_causal: bool) -> dict:
    """Rows ``rows`` of the distributed ``out`` and ``lse`` against their exact weights (float64):
    ``weight_error`` = max |Σ_j a_ij − 1|, ``output_error`` = max |a v − out| / max |out| over the rows."""
    q64, k64, v64 = (x.astype(np.float64) for x in (q, k, v))
    a = attention_weights_rows(q64, k64, lse.astype(np.float64), rows, is_causal=is_causal)   # (h, r, n_k)
    weight_error = float(np.abs(a.sum(axis=-1) - 1).max())
    want = a @ v64                                                                            # (h, r, d_v)
    got = out[..., rows, :].astype(np.float64)                                                # (h, r, d_v)
    output_error = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-300))
    return {"weight_error": weight_error, "output_error": output_error}


def check_dtype(dtype) -> np.dtype:
    """``dtype`` as a numpy dtype with a tolerance in TOLERANCE (float32 or float64), else an error."""
    try:
        if dtype is None:                     # np.dtype(None) would be float64
            raise TypeError
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a numpy dtype, float32 or float64, got {type(dtype).__name__} "
                        f"{dtype!r}") from None
    if dt not in TOLERANCE:
        raise ValueError(f"dtype must be {' or '.join(d.name for d in TOLERANCE)}, got {dt.name}")
    return dt


def bytes_sent(stats: dict) -> int:
    """The bytes all workers have sent to other workers, from :func:`worker_stats` (a worker that did not
    answer, None, counts 0)."""
    return sum(s["bytes_sent"] for s in stats.values() if s is not None)


def fits_in_memory(n: int, heads: int, dtype) -> bool:
    """Whether a single-process tiled attention at this size (q, k, v, out, lse and the float64 copies
    the check makes are already counted by the caller) leaves room: needs 5 arrays of n·heads·64."""
    import psutil
    need = 5 * n * heads * D_HEAD * np.dtype(dtype).itemsize
    return need < 0.5 * psutil.virtual_memory().available


def run_longctx(client, n: int, *, heads: int = 1, is_causal: bool = False, rows: int = 4, single: bool = True,
                rng=None, timeout=None, progress=None, dtype=np.float32) -> dict:
    """Attention at n tokens on ``client``'s cluster, measured and checked; returns a dict (see module).

    Every argument is checked before the run starts: a TypeError or ValueError names the argument, what
    was expected and what arrived (``dtype`` float32 or float64, the dtypes with a tolerance).
    """
    if not isinstance(client, require_distributed().Client):
        raise TypeError(f"client must be a distributed.Client, got {type(client).__name__} {client!r}")
    n = as_positive_int("n", n)
    heads = as_positive_int("heads", heads)
    rows = as_positive_int("rows", rows)
    is_causal = check_flag("is_causal", is_causal)
    single = check_flag("single", single)
    rng = check_rng(rng if rng is not None else np.random.default_rng(0))
    timeout = None if timeout is None else as_positive_float("timeout", timeout)
    if progress is not None and not callable(progress):
        raise TypeError(f"progress must be a callable(done, total) or None, got {type(progress).__name__}")
    dtype = check_dtype(dtype)
    workers = worker_addresses(client)
    q, k, v = (rng.standard_normal((heads, n, D_HEAD), dtype=np.float32).astype(dtype, copy=False)
               for _ in range(3))
    before = worker_stats(client)
    tasks = [0]

    def on_progress(done, total):
        tasks[0] = total
        if progress is not None:
            progress(done, total)

    start = time.perf_counter()
    out, lse = sequence_parallel_attention(q, k, v, client=client, is_causal=is_causal, return_lse=True,
                                           timeout=timeout, progress=on_progress)
    wall = time.perf_counter() - start
    after = worker_stats(client)
    between = bytes_sent(after) - bytes_sent(before)
    to_workers = q.nbytes + k.nbytes + v.nbytes
    to_client = out.nbytes + lse.nbytes
    sampled = sample_rows(n, rows, rng)
    check = check_rows(q, k, v, out, lse, sampled, is_causal=is_causal)
    single_s = None
    if single and fits_in_memory(n, heads, dtype):
        start = time.perf_counter()
        attention(q, k, v, is_causal=is_causal, implementation="tiled")
        single_s = time.perf_counter() - start
    tol = TOLERANCE[dtype]
    return {
        "n": n, "heads": heads, "d_head": D_HEAD, "dtype": dtype.name, "causal": is_causal,
        "workers": len(workers), "tasks": tasks[0],
        "wall_s": wall, "single_process_s": single_s,
        "ratio": None if single_s is None else wall / single_s,
        "bytes_moved": to_workers + between + to_client,
        "bytes_to_workers": to_workers, "bytes_between_workers": between, "bytes_to_client": to_client,
        "worker_memory": {w: {"peak_rss": s["peak_rss"], "rss_before": (before.get(w) or {}).get("rss")}
                          for w, s in after.items() if s is not None},
        "rows_checked": sampled, "max_weight_error": check["weight_error"],
        "max_output_error": check["output_error"], "tolerance": tol,
        "exact": check["weight_error"] <= tol and check["output_error"] <= tol,
    }
