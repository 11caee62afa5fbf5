"""Issue 34, part 1: SmolLM2 passes with BLAS's threads by the rule (``blas_threads_rule``: one per 128 rows) and a
batch's products merged (``matmul.merges_rows``), against the same passes without either ("before": BLAS's own
threads, one BLAS call per batch row), in one process, alternating, on BLAS's default threads.

    PYTHONPATH=src python benchmarks/blas_threads.py [--tokens 14] [--batch 0] [--reps 5] [--rounds 4]
    PYTHONPATH=src python benchmarks/blas_threads.py --sweep [--rounds 3]

Forwards: ``--reps`` passes of ``--tokens`` tokens (the issue's prompt at 14, random ids otherwise; ``--batch B``
stacks B copies), ``logits_to_keep=1``, each side per round; process and wall time, the medians of per-round
ratios after / before. ``--sweep``: patch_sweep.py's measure on one BLAS thread, the per-head patching sweep
with and without merged products against 270 plain forwards, the order rotating each round, and whether the
two sweeps' grids agree bit for bit. The load average is printed: on a loaded machine the "before" side's
two BLAS threads wait on each other.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from attnlab.cli import bench_harness as bench
from attnlab.interpret import patch
from attnlab.kernels import _threads, matmul
from attnlab.models import load_model
from attnlab.stack.transformer import forward

CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When Mary and John went to the store, Mary gave a drink to"
RULE, MERGES = _threads.blas_threads_rule, matmul.merges_rows


def as_before(before: bool) -> None:
    """Both changes off (BLAS's own thread count, one call per batch row), or on."""
    _threads.blas_threads_rule = (lambda rows, cores: cores) if before else RULE
    matmul.merges_rows = (lambda *shape: False) if before else MERGES


def clocked(f) -> tuple[float, float]:
    c, w = time.process_time(), time.perf_counter()
    f()
    return time.process_time() - c, time.perf_counter() - w


def forwards(model, tok, args) -> None:
    ids = tok.encode(CLEAN) if args.tokens == 14 else np.random.default_rng(0).integers(0, model.config.vocab_size,
                                                                                          args.tokens)
    ids = np.broadcast_to(ids, (args.batch, ids.size)) if args.batch else ids    # (B, n) or (n,)

    def side(before):
        as_before(before)
        return clocked(lambda: [forward(model, ids, logits_to_keep=1) for _ in range(args.reps)])
    side(True), side(False)                                             # warm-ups
    res = {True: [], False: []}
    for r in range(args.rounds):
        for before in ((False, True) if r % 2 == 0 else (True, False)):
            res[before].append(side(before))
        print(f"round {r}: after {res[False][-1][0]:.2f} s CPU ({res[False][-1][1]:.2f} wall), before "
              f"{res[True][-1][0]:.2f} s CPU ({res[True][-1][1]:.2f} wall); load {os.getloadavg()[0]:.1f}", flush=True)
    for i, what in enumerate(("CPU", "wall")):
        ratios = [a[i] / b[i] for a, b in zip(res[False], res[True])]
        per = {k: statistics.median(t[i] for t in res[k]) / args.reps * 1e3 for k in res}
        print(f"{what}: after {per[False]:.1f} ms, before {per[True]:.1f} ms per pass of {ids.shape}; after / before "
              f"median {statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]")


def sweep(model, tok, args) -> None:
    clean, corrupt = tok.encode(CLEAN), tok.encode(CORRUPT)
    answer, wrong = int(tok.encode(" Mary")[0]), int(tok.encode(" John")[0])
    grids = {}

    def run(before):
        as_before(before)
        grids[before] = patch(model, clean, corrupt, answer=answer, wrong=wrong, what="heads").values
        as_before(False)

    def passes():
        for _ in range(270):
            forward(model, corrupt)
    limiter = bench.blas_limiter()
    with limiter.limit(limits=1, user_api="blas"):
        run(False), run(True), forward(model, corrupt)                 # warm-ups
        sides = [("after", lambda: run(False)), ("before", lambda: run(True)), ("passes", passes)]
        rounds = []
        for r in range(args.rounds):
            t = {name: clocked(f) for name, f in sides[r % 3:] + sides[:r % 3]}
            rounds.append(t)
            print(f"round {r}: " + ", ".join(f"{k} {v[0]:.1f} s CPU ({v[1]:.1f} wall)" for k, v in t.items())
                  + f"; load {os.getloadavg()[0]:.1f}", flush=True)
    for side in ("after", "before"):
        ratios = [t[side][0] / t["passes"][0] for t in rounds]
        print(f"sweep {side}: {statistics.median(ratios):.3f}x the CPU time of 270 plain forwards "
              f"[{min(ratios):.3f}-{max(ratios):.3f}]; {statistics.median(t[side][1] for t in rounds):.1f} s wall")
    print(f"grids equal bit for bit: {bool(np.array_equal(grids[False], grids[True]))}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=14)
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--sweep", action="store_true")
    args = ap.parse_args()
    model, tok = load_model("smollm2")
    info = bench.machine_info()
    print(f"{info['cpu']}, {info['simd']}, {bench.blas_kernel(bench.blas_info())}, {info['cores']} cores; "
          f"load {bench.load_average()}", flush=True)
    (sweep if args.sweep else forwards)(model, tok, args)
    print(f"load after: {bench.load_average()}")


if __name__ == "__main__":
    main()
