"""What ``attnlab tune`` measures: each of the five kernel choices, on this machine, in one explicit step.

The library never runs these while it computes (its choices follow rules, or the profile these measurements
write: :mod:`attnlab.kernels.profile`). Each measurement alternates the two candidates, round by round, and
keeps the best time of each (the least disturbed by other work on the machine):

- numpy's ``exp`` against ``exp2`` on a tile of scores (:func:`time_exps`);
- the fused tile kernel against numpy's, for causal ("masked") and full calls at a ladder of sizes
  (:func:`time_tile_kernels`): the profile keeps, per kind, the smallest size from which the fused kernel won at
  every larger size measured;
- the fused decode step against numpy's, with grouped (9 on 3) and ungrouped (12 on 12) heads at a ladder of
  contexts (:func:`time_decode_kernels`);
- the layout of a streamed weight, "C" against "F", wide and tall (:func:`probe_ratio`);
- the quantized products on one thread against numba's threads
  (:func:`attnlab.kernels.quantized.time_threads`).
"""

from __future__ import annotations

import time

import numpy as np

from . import _kernels, decode, matmul, quantized, tiled
from ._checks import check_attention_args

TILE_SIZES = (128, 256, 512, 1024, 2048)     # n of the tile kernels' ladder (4 heads, d_head 64, float32)
QUICK_TILE_SIZES = (128, 512)
DECODE_CONTEXTS = (64, 256, 1024, 4096)      # n_k of the decode ladder (d_head 64, float32)
QUICK_DECODE_CONTEXTS = (64, 1024)
DECODE_HEADS = {"grouped": (9, 3), "ungrouped": (12, 12)}   # (h, h_kv): SmolLM2's grouping, GPT-2's heads
PROBE_COPIES = 4                             # the layout probe reads four weights in turn (64 MiB, past the L3)


def best_times(calls: dict, rounds: int, reps: int = 1) -> dict:
    """Seconds per call of each of ``calls`` ({name: f}): each called once first (loading, warming), then
    ``rounds`` rounds, alternating which goes first, of ``reps`` calls each; the best round of each."""
    for f in calls.values():
        f()
    best = {name: np.inf for name in calls}
    names = list(calls)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            for _ in range(reps):
                calls[name]()
            best[name] = min(best[name], (time.perf_counter() - t0) / reps)
    return best


def time_exps(rows: int = 256, cols: int = 512, rounds: int = 7) -> dict:
    """ns per element of numpy's float32 exp and exp2, in place on a (rows, cols) tile of scores in [-30, 0]
    (what the online softmax feeds them): the best of ``rounds`` alternated calls each."""
    rng = np.random.default_rng(0)
    src = rng.uniform(-30, 0, size=(rows, cols)).astype(np.float32)     # (rows, cols)
    buf = np.empty_like(src)                                           # (rows, cols)

    def run(fn):
        np.copyto(buf, src)
        fn(buf, out=buf)
    best = best_times({"exp": lambda: run(np.exp), "exp2": lambda: run(np.exp2)}, rounds, reps=3)
    return {name: 1e9 * t / src.size for name, t in best.items()}


def time_tile_kernels(sizes=TILE_SIZES, heads: int = 4, rounds: int = 5) -> list[dict]:
    """ms per call of the fused and the numpy tile kernels, causal and full, at each n of ``sizes`` (``heads``
    heads, d_head 64, float32, the workers a call uses by default): [{n, scores, masked, fused_ms, numpy_ms}]."""
    rng = np.random.default_rng(0)
    rows = []
    for n in sizes:
        q, k, v = (rng.standard_normal((heads, n, 64), dtype=np.float32) for _ in range(3))   # (h, n, 64)
        for masked in (True, False):
            c = check_attention_args(q, k, v, is_causal=masked)
            plan = tiled.make_plan(c)
            reps = max(1, 2**21 // (heads * n * n))
            best = best_times({kernel: (lambda kernel=kernel: tiled.tiled_forward(c, plan, kernel=kernel))
                               for kernel in ("fused", "numpy")}, rounds, reps)
            rows.append({"n": n, "scores": heads * n * n, "masked": masked, "fused_ms": 1e3 * best["fused"],
                         "numpy_ms": 1e3 * best["numpy"]})
    return rows


def fused_from(rows: list[dict], masked: bool) -> int | None:
    """The smallest scores from which the fused kernel won at every larger size measured (None: it lost at the
    largest)."""
    ladder = sorted((r for r in rows if r["masked"] == masked), key=lambda r: r["scores"])
    start = None
    for r in reversed(ladder):
        if r["fused_ms"] >= r["numpy_ms"]:
            break
        start = r["scores"]
    return start


def time_decode_kernels(contexts=DECODE_CONTEXTS, rounds: int = 5) -> list[dict]:
    """µs per call of the fused and the numpy decode steps, grouped and ungrouped heads, at each context:
    [{kind, n_k, fused_us, numpy_us}]."""
    rng = np.random.default_rng(0)
    rows = []
    for kind, (h, h_kv) in DECODE_HEADS.items():
        for n_k in contexts:
            q = rng.standard_normal((1, h, 1, 64), dtype=np.float32)                    # (1, h, 1, 64)
            k, v = (rng.standard_normal((1, h_kv, n_k, 64), dtype=np.float32) for _ in range(2))
            c = check_attention_args(q, k, v)
            reps = max(5, 2**20 // (h * n_k * 64))
            best = best_times({kernel: (lambda kernel=kernel: decode.decode_attention(c, kernel))
                               for kernel in ("fused", "numpy")}, rounds, reps)
            rows.append({"kind": kind, "n_k": n_k, "fused_us": 1e6 * best["fused"], "numpy_us": 1e6 * best["numpy"]})
    return rows


def decode_table(rows: list[dict]) -> dict:
    """The profile's decode table: {kind: {str(n_k): the faster kernel}}."""
    table: dict = {}
    for r in rows:
        table.setdefault(r["kind"], {})[str(r["n_k"])] = "fused" if r["fused_us"] < r["numpy_us"] else "numpy"
    return table


def probe_ratio(shape: tuple, rounds: int = 7) -> float:
    """The median over ``rounds`` of (time of the F layout) / (time of the C layout) of ``x @ W`` for one row
    x and (d_in, d_out) = ``shape`` float32 weights, on one BLAS thread: PROBE_COPIES buffers, each read in
    both layouts (the same bytes), alternating which goes first."""
    from ._threads import one_blas_thread

    d_in, d_out = shape
    bufs = [np.full(d_in * d_out, 1.0 / d_in, np.float32) for _ in range(PROBE_COPIES)]
    c_form = [b.reshape(d_in, d_out) for b in bufs]                 # (d_in, d_out) C-contiguous
    f_form = [b.reshape(d_out, d_in).T for b in bufs]               # (d_in, d_out) F-contiguous
    x = np.ones((1, d_in), np.float32)                              # (1, d_in)

    def seconds(ws) -> float:
        t = time.perf_counter()
        for w in ws:
            x @ w                                                   # (1, d_out)
        return time.perf_counter() - t

    with one_blas_thread():
        seconds(c_form), seconds(f_form)                            # warm-up: first touch
        ratios = []
        for r in range(rounds):
            if r % 2:
                f = seconds(f_form)
                c = seconds(c_form)
            else:
                c = seconds(c_form)
                f = seconds(f_form)
            ratios.append(f / c)
    return float(np.median(ratios))


def measure(*, quick: bool = False, progress=None) -> tuple[dict, dict]:
    """Measure the five choices here: ``(choices, measured)``, what :func:`attnlab.kernels.profile.write`
    keeps. ``quick``: fewer sizes (the tests'); ``progress(str)`` is called before each measurement."""
    say = progress or (lambda _: None)
    measured, choices = {}, {}
    say("numpy's exp and exp2")
    measured["exp_ns_per_element"] = ns = time_exps()
    choices["exp"] = min(ns, key=ns.get)
    fused = not _kernels.numba_disabled() and _kernels.load_fused() is not None
    if fused:
        say("the fused and numpy tile kernels")
        rows = time_tile_kernels(QUICK_TILE_SIZES if quick else TILE_SIZES)
        measured["tile_kernels"] = rows
        choices["fused_min_scores"] = {"masked": fused_from(rows, True), "full": fused_from(rows, False)}
        say("the fused and numpy decode steps")
        rows = time_decode_kernels(QUICK_DECODE_CONTEXTS if quick else DECODE_CONTEXTS)
        measured["decode_kernels"] = rows
        choices["decode"] = decode_table(rows)
    else:
        choices["fused_min_scores"] = {"masked": None, "full": None}       # numba missing or switched off
        choices["decode"] = {}
    say("the layout of streamed weights")
    rounds = 3 if quick else 7
    ratios = {"wide": probe_ratio(matmul.PROBE_SHAPE, rounds), "tall": probe_ratio(matmul.PROBE_SHAPE[::-1], rounds)}
    measured["gemv_f_over_c"] = ratios
    choices["gemv_order"] = {kind: "F" if r < matmul.PROBE_MARGIN else "C" for kind, r in ratios.items()}
    if quantized.has_kernel():
        say("the quantized products' threads")
        us = quantized.time_threads(3 if quick else 7)
        measured["quantized_threads_us"] = {str(n): t for n, t in us.items()}
        choices["quantized_threads"] = min(us, key=us.get)
    else:
        choices["quantized_threads"] = 1
    measured["numba_used"] = fused
    return choices, measured
