"""What Dask costs (issue 14's goals): sequence-parallel attention and a sharded KV cache on a LocalCluster
of single-threaded worker processes, each against the single-process kernel in this process.

    PYTHONPATH=src python benchmarks/dask_overhead.py [--n 65536] [--rounds 3] [--decode-context 262144] [--json]

1. Overhead. At n = 65,536, 2 heads, d_head 64, float32, causal: ``sequence_parallel_attention`` on 2 workers
   against ``tiled_attention`` on every core, alternating call by call (which goes first flips each round),
   the median of the per-round ratios. Goal: <= 1.15.
2. Accuracy. The distributed float32 output against the single-process float32 one (all rows), and
   against a single-process float64 run on three row blocks (first, middle, last; a causal row block only
   needs the keys up to its last row): the max error relative to the largest |output|.
3. Memory. Each worker's peak resident memory over its resident memory after a small warm-up run
   (Python, numpy, numba and attnlab imported; nothing of the real run yet), against the
   issue's budget: its shards (q, k, v / W) + 2 × its share of the output + tile scratch (its key shard
   transposed, and three block_q × block_k tiles).
4. Decode. A ``ShardedKVCache`` of 12 heads filled up to 262,144 tokens; at each context on the way, one
   decode step ``attend`` against a single-process cached step (``attention`` on a ``KVCache``'s views),
   alternating; goal <= 1.3 at 262,144, and the crossover: the smallest context from which the ratio stays
   at or under 1.3 (and under 1.0).

Prints the CPU, SIMD and BLAS (threadpoolctl), and the load average before and after: this machine is
shared, and a load above the core count means other processes took turns on the cores.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from attnlab import KVCache, attention
from attnlab.kernels.tiled import tiled_attention
from attnlab.cli.bench_harness import blas_kernel, load_average, machine_info, paired
from attnlab.distributed import ShardedKVCache, local_cluster, sequence_parallel_attention, worker_stats
from attnlab.kernels.tiled import BLOCK_K, BLOCK_Q

D_HEAD = 64
OVERHEAD_GOAL, DECODE_GOAL = 1.15, 1.3


def qkv(heads: int, n: int, rng: np.random.Generator, dtype=np.float32):
    return tuple(rng.standard_normal((heads, n, D_HEAD), dtype=np.float32).astype(dtype, copy=False)
                 for _ in range(3))


def mib(x: float) -> float:
    return round(x / 2**20, 1)


# ----------------------------------------------------------------------------------------------------
# 1-3: sequence-parallel attention


def float64_error(out, q, k, v, *, block: int = 256) -> float:
    """Max |out − float64 reference| / max |reference| over the first, a middle and the last row block
    (causal: rows a:b need keys :b only, bottom-right aligned)."""
    n = q.shape[-2]
    worst, top = 0.0, 0.0
    for a in (0, n // 2, n - block):
        b = a + block
        ref = tiled_attention(*(x.astype(np.float64) for x in (q[:, a:b], k[:, :b], v[:, :b])), is_causal=True)
        worst = max(worst, float(np.abs(out[:, a:b] - ref).max()))
        top = max(top, float(np.abs(ref).max()))
    return worst / top


def memory_budget(n: int, heads: int, workers: int, itemsize: int = 4) -> int:
    """The issue's per-worker bound: its shards + 2 × its share of the output + tile scratch."""
    share = n // workers * heads * D_HEAD * itemsize           # one (h, n/W, d) array
    shards = 3 * share                                         # its q block(s), key and value shard
    scratch = share // heads + 3 * BLOCK_Q * BLOCK_K * itemsize   # one key head transposed + tiles
    return shards + 2 * share + scratch


def overhead(client, n: int, heads: int, rounds: int) -> dict:
    rng = np.random.default_rng(0)
    q, k, v = qkv(heads, n, rng)
    workers = len(client.scheduler_info(n_workers=-1)["workers"])
    sequence_parallel_attention(*qkv(heads, 1024, rng), client=client, is_causal=True)   # imports, numba
    before = worker_stats(client)              # resident after the imports: the baseline of the peaks
    box = {}

    def dist():
        box["dist"] = sequence_parallel_attention(q, k, v, client=client, is_causal=True)

    def single():
        box["single"] = tiled_attention(q, k, v, is_causal=True)

    p = paired(dist, single, rounds)
    after = worker_stats(client)
    out, ref = box["dist"], box["single"]
    budget = memory_budget(n, heads, workers)
    memory = {w: {"rss_before_mib": mib(before[w]["rss"]), "peak_mib": mib(s["peak_rss"]),
                  "peak_over_before_mib": mib(s["peak_rss"] - before[w]["rss"]),
                  "of_budget": round((s["peak_rss"] - before[w]["rss"]) / budget, 2)}
              for w, s in after.items() if w in before}
    return {"n": n, "heads": heads, "d_head": D_HEAD, "dtype": "float32", "causal": True, "workers": workers,
            "distributed_s": p.a_ms / 1e3, "single_s": p.b_ms / 1e3, "ratio": p.ratio, "ratio_min": p.ratio_min,
            "ratio_max": p.ratio_max, "rounds": p.rounds, "goal": OVERHEAD_GOAL,
            "max_rel_error_vs_single_f32": float(np.abs(out - ref).max() / np.abs(ref).max()),
            "max_rel_error_vs_f64": float64_error(out, q, k, v),
            "budget_mib": mib(budget), "worker_memory": memory,
            "bytes_sent_between_workers": sum(s["bytes_sent"] for s in after.values())
            - sum(s["bytes_sent"] for s in before.values())}


# ----------------------------------------------------------------------------------------------------
# 4: decode on a sharded cache


def decode(client, context: int, heads: int, shard_capacity: int, contexts: list[int], rounds: int) -> dict:
    rng = np.random.default_rng(1)
    k, v = (rng.standard_normal((heads, context, D_HEAD), dtype=np.float32) for _ in range(2))
    local = KVCache.empty(heads, context, D_HEAD)
    cache = ShardedKVCache(client, n_heads=heads, d_head=D_HEAD, shard_capacity=shard_capacity, timeout=120)
    rows, filled = [], 0
    for c in sorted(contexts):
        step = 16384
        for a in range(filled, c, step):
            b = min(a + step, c)
            cache.append(k[:, a:b], v[:, a:b])
            keys, values = local.append(k[:, a:b], v[:, a:b])   # (h, c, d_head) views
        filled = c
        q = rng.standard_normal((heads, 1, D_HEAD), dtype=np.float32)
        assert np.allclose(cache.attend(q), attention(q, keys, values, is_causal=True), rtol=1e-4, atol=1e-6)
        p = paired(lambda: cache.attend(q),
                   lambda: attention(q, keys, values, is_causal=True, check_finite=False), rounds)
        rows.append({"context": c, "shards": len(cache.shards), "distributed_ms": p.a_ms, "single_ms": p.b_ms,
                     "ratio": p.ratio, "ratio_min": p.ratio_min, "ratio_max": p.ratio_max, "rounds": p.rounds})
    held = {}
    for s in cache.shards:
        for w in s["workers"]:
            held[w] = held.get(w, 0) + (s["stop"] - s["start"]) * heads * D_HEAD * 4 * 2
    stats = worker_stats(client)
    memory = {w: {"cache_mib": mib(held.get(w, 0)), "peak_mib": mib(s["peak_rss"])} for w, s in stats.items()}
    return {"heads": heads, "d_head": D_HEAD, "shard_capacity": shard_capacity, "rows": rows,
            "goal": DECODE_GOAL, "crossover_goal": crossover(rows, DECODE_GOAL),
            "crossover_1": crossover(rows, 1.0), "worker_memory": memory}


def crossover(rows: list[dict], bound: float) -> int | None:
    """The smallest context from which every larger one measured has a ratio <= bound (None: never)."""
    best = None
    for r in sorted(rows, key=lambda r: -r["context"]):
        if r["ratio"] > bound:
            break
        best = r["context"]
    return best


# ----------------------------------------------------------------------------------------------------


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the overhead pair (each runs both)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--decode-context", type=int, default=262144)
    ap.add_argument("--decode-heads", type=int, default=12)
    ap.add_argument("--shard-capacity", type=int, default=32768)
    ap.add_argument("--decode-rounds", type=int, default=15)
    ap.add_argument("--skip", choices=["overhead", "decode"], action="append", default=[])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    info = machine_info()
    result = {"machine": {"cpu": info["cpu"], "simd": info["simd"], "cores": info["cores"],
                          "blas": blas_kernel(info["blas"]), "tile_kernel": info["tile_kernel"]},
              "load_before": load_average()}
    contexts = [c for c in (1024, 4096, 16384, 65536, 131072) if c < args.decode_context] + [args.decode_context]
    for part in ("overhead", "decode"):
        if part in args.skip:
            continue
        cluster, client = local_cluster(args.workers)      # a fresh cluster: its peaks are this part's
        try:
            start = time.perf_counter()
            result[part] = overhead(client, args.n, args.heads, args.rounds) if part == "overhead" else \
                decode(client, args.decode_context, args.decode_heads, args.shard_capacity, contexts,
                       args.decode_rounds)
            result[part]["bench_s"] = round(time.perf_counter() - start, 1)
        finally:
            client.close()
            cluster.close()
    result["load_after"] = load_average()
    print(json.dumps(result, indent=1) if args.json else report(result))
    return 0


def report(r: dict) -> str:
    m = r["machine"]
    lines = [f"{m['cpu']}, {m['cores']} cores, {m['simd']}, BLAS {m['blas']}, tile kernel {m['tile_kernel']}",
             f"load average before {r['load_before']}, after {r['load_after']}"]
    if "overhead" in r:
        o = r["overhead"]
        met = "met" if o["ratio"] <= o["goal"] else "MISSED"
        lines += [f"sequence_parallel_attention n={o['n']:,} h={o['heads']} causal f32 on {o['workers']} workers: "
                  f"{o['distributed_s']:.2f} s vs tiled_attention {o['single_s']:.2f} s; ratio median "
                  f"{o['ratio']:.2f} (min {o['ratio_min']:.2f}, max {o['ratio_max']:.2f}, {o['rounds']} rounds); "
                  f"goal <= {o['goal']}: {met}",
                  f"  max rel error vs single-process float32 {o['max_rel_error_vs_single_f32']:.1e}, "
                  f"vs float64 {o['max_rel_error_vs_f64']:.1e}; bytes between workers "
                  f"{mib(o['bytes_sent_between_workers'])} MiB"]
        for w, s in o["worker_memory"].items():
            lines.append(f"  worker {w}: peak {s['peak_mib']} MiB, {s['peak_over_before_mib']} MiB over its "
                         f"{s['rss_before_mib']} MiB before = {s['of_budget']:.2f} x the budget {o['budget_mib']} MiB")
    if "decode" in r:
        d = r["decode"]
        lines.append(f"ShardedKVCache decode step, {d['heads']} heads, shards of {d['shard_capacity']:,} tokens:")
        for row in d["rows"]:
            lines.append(f"  context {row['context']:>9,} ({row['shards']} shards): {row['distributed_ms']:8.2f} ms vs "
                         f"single-process {row['single_ms']:8.2f} ms, ratio {row['ratio']:.2f} "
                         f"(min {row['ratio_min']:.2f}, max {row['ratio_max']:.2f})")
        last = d["rows"][-1]
        met = "met" if last["ratio"] <= d["goal"] else "MISSED"
        lines.append(f"  goal <= {d['goal']} at {last['context']:,}: {met}; ratio <= {d['goal']} from context "
                     f"{d['crossover_goal']}, <= 1.0 from {d['crossover_1']}")
        for w, s in d["worker_memory"].items():
            lines.append(f"  worker {w}: holds {s['cache_mib']} MiB of cache, peak {s['peak_mib']} MiB")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
