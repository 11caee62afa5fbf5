"""Threads: BLAS pinning and the worker pool, in one place.

numpy releases the GIL inside matmul and ufuncs, so two threads run two tiles at once on two cores, as
long as BLAS itself runs one thread per worker (else the threads fight over the cores). threadpoolctl
pins BLAS; it is optional: without it the work runs on the calling thread and BLAS is left alone.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from ._checks import as_positive_int


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS tells it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# Where the OS does not say (not Linux), a core's L2 is taken as 512 KiB: the smallest of the x86 and ARM server
# cores in use (Zen 2/3 have 512 KiB, Zen 4 and Skylake-SP 1 MiB, Ice Lake 1.25 MiB).
L2_FALLBACK_BYTES = 512 * 2**10


@functools.cache
def l2_cache_bytes() -> int:
    """One core's L2 cache in bytes, as Linux reports it (/sys/devices/system/cpu/cpu0/cache), else
    L2_FALLBACK_BYTES."""
    import glob
    for folder in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            with open(f"{folder}/level") as f:
                level = f.read().strip()
            with open(f"{folder}/type") as f:
                kind = f.read().strip()
            with open(f"{folder}/size") as f:
                size = f.read().strip()
        except OSError:
            continue
        if level == "2" and kind in ("Unified", "Data"):
            units = {"K": 2**10, "M": 2**20, "G": 2**30}
            return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    return L2_FALLBACK_BYTES


@functools.cache
def blas_limiter():
    """threadpoolctl's controller (found once: looking up the loaded libraries takes milliseconds), or
    None when threadpoolctl is not installed."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        return None
    return ThreadpoolController()


def one_blas_thread():
    """A context in which BLAS runs on one thread, or a no-op without threadpoolctl.

    Small matrices (the guide's LM: d_model 64, windows of 64) split over threads spend more time waiting
    for the threads than multiplying: on a busy 2-core machine a training step was measured ten times
    slower with 2 BLAS threads than with 1 (benchmarks/train_guide.py prints the BLAS in use).
    """
    limiter = blas_limiter()
    return contextlib.nullcontext() if limiter is None else limiter.limit(limits=1, user_api="blas")


# A model pass gives BLAS one thread per this many rows (its tokens, every batch row's), at least one. On a loaded
# 2-core Xeon (load average 1-9, OpenBLAS 0.3.31 SkylakeX) a loop of SmolLM2 passes of 14 tokens took 4.5x the CPU
# time and 4.5-5x the wall time on 2 BLAS threads as on one, passes of 128 tokens 6.5x, of 256 tokens 4x: each
# of a pass's small products splits over both threads, and the thread that finishes first spins until the other,
# whose core another process holds, comes back (docs/speed.md). Larger passes keep BLAS's threads: a prefill of 512
# tokens or more on a quiet machine is where they pay.
ROWS_PER_BLAS_THREAD = 128


def blas_threads_rule(rows: int, cores: int) -> int:
    """The BLAS threads a model pass over ``rows`` rows may use on ``cores`` cores: one per ROWS_PER_BLAS_THREAD
    rows, at least 1, at most ``cores``. A rule on shapes and cores, never on a time measured here."""
    return max(1, min(cores, rows // ROWS_PER_BLAS_THREAD))


@functools.cache
def blas_controllers() -> tuple:
    """threadpoolctl's controller of each BLAS loaded (found once), () without threadpoolctl."""
    limiter = blas_limiter()
    return () if limiter is None else tuple(limiter.select(user_api="blas").lib_controllers)


@contextlib.contextmanager
def blas_threads_for(rows: int):
    """The scope of one model pass over ``rows`` rows: BLAS runs on at most :func:`blas_threads_rule`'s threads
    in it, as it ran before on leaving. It only lowers: a command that pinned BLAS to one thread keeps one, and a
    large pass keeps BLAS's own count. Costs ~2 µs when BLAS already has few enough threads, ~9 µs otherwise;
    a no-op without threadpoolctl. The thread count changes no bit: BLAS splits a product's rows and columns
    over its threads, never the sums (tests/test_blas_threads.py)."""
    most = blas_threads_rule(rows, usable_cores())
    lowered = []
    try:
        for lib in blas_controllers():
            before = lib.num_threads
            if before > most:
                lib.set_num_threads(most)
                lowered.append((lib, before))
        yield
    finally:
        for lib, before in lowered:
            lib.set_num_threads(before)


def blas_info() -> list[dict]:
    """The BLAS libraries loaded in this process (threadpoolctl), or [] without threadpoolctl."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    keep = ("user_api", "internal_api", "prefix", "version", "architecture", "num_threads", "threading_layer")
    return [{k: lib.get(k) for k in keep} for lib in threadpool_info()]


def run_items(items: list, work, new_scratch, workers=None) -> None:
    """Call ``work(item, scratch)`` for every item, over ``workers`` threads (default: the usable cores)
    with BLAS pinned to one thread each; each thread allocates its scratch once. Runs on the calling
    thread when one worker suffices or threadpoolctl is missing; one worker pins BLAS too (7 µs): the items'
    small products on BLAS's own threads ran 6x slower (12 heads × 256 tokens, causal: 18.6 against 3.1 ms
    on a loaded 2-core machine)."""
    workers = usable_cores() if workers is None else as_positive_int("workers", workers)
    workers = min(workers, len(items))
    limiter = blas_limiter()
    if workers == 1 or limiter is None:
        buf = new_scratch()
        with contextlib.nullcontext() if limiter is None else limiter.limit(limits=1, user_api="blas"):
            for item in items:
                work(item, buf)
        return
    todo, lock = iter(items), threading.Lock()

    def worker():
        buf = new_scratch()
        while True:
            with lock:
                item = next(todo, None)
            if item is None:
                return
            work(item, buf)

    with limiter.limit(limits=1, user_api="blas"):
        pool = worker_pool(workers)
        for f in [pool.submit(worker) for _ in range(workers)]:
            f.result()


@functools.cache
def worker_pool(workers: int) -> ThreadPoolExecutor:
    """One pool of ``workers`` threads per process, kept between calls: starting threads for each call cost
    ~0.25 ms, a quarter of a 256-token attention. (Work items never call run_items themselves, so a pool's
    threads never wait on their own pool.)"""
    return ThreadPoolExecutor(workers, thread_name_prefix="attnlab")
