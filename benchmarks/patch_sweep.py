"""Issue 34, part 1: a per-head activation-patching sweep over SmolLM2-135M (30 layers × 9 heads, the issue's
14-token IOI prompt) against 270 plain forward passes of the same prompt. Goal: the sweep <= 0.6× the passes.

    PYTHONPATH=src python benchmarks/patch_sweep.py [--rounds 3] [--no-before]

One process, one BLAS thread, CPU time (time.process_time): each round runs both sides, the order alternating
(sweep first in even rounds), and the figure is the median of the per-round ratios. The sweep is the whole
``patch(..., what="heads")`` call, its clean and corrupted runs included; the other side is 270 calls of
``forward`` on the corrupted prompt. Wall times of each side are printed too (the machine may be loaded:
the load average is printed before and after).

"Before" (unless ``--no-before``): once, the loop the sweep replaced, one hooked forward per head (each a
whole pass from the embedding), for its time and for the largest difference between its grid and the sweep's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time

import numpy as np

from attnlab.cli import bench_harness as bench
from attnlab.interpret import patch
from attnlab.interpret.patching import put_back
from attnlab.models import load_model
from attnlab.stack.hooks import run_with_cache, run_with_hooks
from attnlab.stack.transformer import forward

CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When Mary and John went to the store, Mary gave a drink to"


def clocked(f) -> tuple[float, float, object]:
    """(CPU seconds, wall seconds, result) of one call."""
    c, w = time.process_time(), time.perf_counter()
    r = f()
    return time.process_time() - c, time.perf_counter() - w, r


def per_head_loop(model, clean, corrupt, answer: int, wrong: int) -> np.ndarray:
    """Today's (before this change) per-head patching: one whole hooked forward per head. (L, H) values."""
    c = model.config
    L, H = c.n_layers, c.attention.n_heads
    names = [f"blocks.{i}.attn.hook_z" for i in range(L)]
    _, cache = run_with_cache(model, clean[None], names)
    out = np.empty((L, H))
    for i in range(L):
        for h in range(H):
            hook = put_back(cache[names[i]], (h, slice(None), slice(None)))
            z = run_with_hooks(model, corrupt[None], {names[i]: hook}).logits[0, -1].astype(np.float64)
            out[i, h] = z[answer] - z[wrong]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-before", action="store_true")
    args = ap.parse_args()
    model, tok = load_model("smollm2")
    clean, corrupt = tok.encode(CLEAN), tok.encode(CORRUPT)
    answer, wrong = int(tok.encode(" Mary")[0]), int(tok.encode(" John")[0])
    c = model.config
    n_runs = c.n_layers * c.attention.n_heads
    info = bench.machine_info()
    limiter = bench.blas_limiter()
    out = {"cpu": info["cpu"], "simd": info["simd"], "tokens": int(clean.size), "runs": n_runs,
           "load_before": bench.load_average()}

    def sweep():
        return patch(model, clean, corrupt, answer=answer, wrong=wrong, what="heads")

    def passes():
        for _ in range(n_runs):
            forward(model, corrupt)

    with limiter.limit(limits=1, user_api="blas") if limiter else contextlib.nullcontext():
        grid = sweep()
        forward(model, corrupt)                                          # warm-ups
        rounds = []
        for r in range(args.rounds):
            sides = [("sweep", sweep), ("passes", passes)]
            times = {name: clocked(f)[:2] for name, f in (sides if r % 2 == 0 else sides[::-1])}
            rounds.append(times)
            print(f"round {r}: sweep {times['sweep'][0]:.1f} s CPU ({times['sweep'][1]:.1f} s wall), "
                  f"{n_runs} passes {times['passes'][0]:.1f} s CPU ({times['passes'][1]:.1f} s wall), ratio "
                  f"{times['sweep'][0] / times['passes'][0]:.3f}", flush=True)
        ratios = [t["sweep"][0] / t["passes"][0] for t in rounds]
        out.update(ratio=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios),
                   sweep_cpu_s=statistics.median(t["sweep"][0] for t in rounds),
                   sweep_wall_s=statistics.median(t["sweep"][1] for t in rounds),
                   passes_cpu_s=statistics.median(t["passes"][0] for t in rounds),
                   passes_wall_s=statistics.median(t["passes"][1] for t in rounds))
        if not args.no_before:
            cpu, wall, loop = clocked(lambda: per_head_loop(model, clean, corrupt, answer, wrong))
            out.update(before_cpu_s=cpu, before_wall_s=wall,
                       max_abs_diff_vs_loop=float(np.abs(loop - grid.values).max()),
                       max_rel_diff_vs_loop=float((np.abs(loop - grid.values) / np.abs(loop).max()).max()))
    out["load_after"] = bench.load_average()
    print(f"{info['cpu']}, {info['simd']}, one BLAS thread; per-head sweep / {n_runs} plain forwards (CPU time, "
          f"median of {args.rounds} rounds): {out['ratio']:.3f} [{out['ratio_min']:.3f}-{out['ratio_max']:.3f}]")
    print(json.dumps(out, default=float))


if __name__ == "__main__":
    main()
