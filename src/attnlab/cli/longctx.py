"""attnlab longctx: attention at N tokens across Dask worker processes, checked and measured."""

from __future__ import annotations

import contextlib
import os

from ._app import add_command, add_json_flag, number_type, print_json, seed_arg, stderr_progress


# --n 1_000_000 and --n 1,000,000 as well as 1000000
positive_int = number_type(lambda text: int(text.replace("_", "").replace(",", "")), lambda v: v >= 1,
                           "expected a positive integer")
positive_float = number_type(float, lambda v: v > 0, "expected a positive number of seconds")


def register(sub) -> None:
    p = add_command(sub, "longctx", help="attention at N tokens across Dask worker processes (sequence-parallel), "
                    "checked row by row", beyond="docs/distributed.md", allow_abbrev=False,
                    shows="Shows attention at N tokens computed across Dask worker processes, sampled rows checked "
                          "exactly, with the time, memory and bytes moved",
                    examples=("attnlab longctx --n 8192 --causal --workers 2",
                              "attnlab longctx --n 65536 --heads 2 --causal --json"))
    p.add_argument("--n", type=positive_int, required=True, help="tokens (queries = keys = N)")
    p.add_argument("--heads", type=positive_int, default=1, help="heads, d_head 64 each (default 1)")
    p.add_argument("--workers", type=positive_int, default=None,
                   help="worker processes of the embedded LocalCluster (default: one per core)")
    p.add_argument("--scheduler", metavar="ADDR", default=None,
                   help="run on the Dask cluster at ADDR (tcp://host:8786) instead of an embedded one")
    p.add_argument("--causal", action="store_true", help="causal attention")
    p.add_argument("--rows", type=positive_int, default=4, help="query rows checked exactly (default 4)")
    p.add_argument("--no-single", action="store_true",
                   help="skip the single-process tiled attention run it is compared with")
    p.add_argument("--timeout", type=positive_float, default=None,
                   help="seconds to wait for the cluster (default: no limit; connecting waits at most 10)")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the random q, k, v (default 0)")
    add_json_flag(p)
    p.set_defaults(func=cmd_longctx)


def cmd_longctx(args) -> int:
    from ..distributed import connect, local_cluster
    from ..distributed.cluster import require_distributed
    from ..distributed.longctx import run_longctx
    try:
        require_distributed()                   # attnlab.distributed imports Dask only when it runs
    except ImportError as e:
        raise ValueError(str(e)) from None
    import numpy as np

    if args.scheduler is not None and args.workers is not None:
        raise ValueError("give --workers (an embedded cluster) or --scheduler (an existing one), not both")
    with contextlib.ExitStack() as stack:
        if args.scheduler is not None:
            client = connect(args.scheduler, timeout=min(args.timeout or 10.0, 10.0))
            where = f"the cluster at {args.scheduler}"
        else:
            n_workers = args.workers or len(os.sched_getaffinity(0))
            cluster, client = local_cluster(n_workers)
            stack.callback(cluster.close)
            where = f"a LocalCluster of {n_workers} single-threaded worker processes"
        stack.callback(client.close)
        with stderr_progress(quiet=args.json) as bar:
            task = bar.add_task("Dask tasks", total=None)
            result = run_longctx(client, args.n, heads=args.heads, is_causal=args.causal, rows=args.rows,
                                 single=not args.no_single, rng=np.random.default_rng(args.seed),
                                 timeout=args.timeout,
                                 progress=lambda done, total: bar.update(task, completed=done, total=total))
    result["cluster"] = where
    print_json(result) if args.json else print_result(result)
    return 0 if result["exact"] else 1


def mib(x) -> str:
    return f"{x / 2**20:,.1f} MiB"


def print_result(r: dict) -> None:
    print(f"attention at n = {r['n']:,} tokens, {r['heads']} head{'s' * (r['heads'] > 1)} of d_head "
          f"{r['d_head']}, {r['dtype']}{', causal' if r['causal'] else ''}, on {r['cluster']}")
    print(f"  sequence_parallel_attention: {r['wall_s']:.2f} s wall, {r['tasks']} tasks on {r['workers']} workers")
    if r["single_process_s"] is None:
        print("  single-process tiled attention: skipped")
    else:
        print(f"  single-process tiled attention: {r['single_process_s']:.2f} s (distributed / single "
              f"= {r['ratio']:.2f})")
    print(f"  bytes moved between processes: {mib(r['bytes_moved'])} (client to workers "
          f"{mib(r['bytes_to_workers'])}, between workers {mib(r['bytes_between_workers'])}, workers to client "
          f"{mib(r['bytes_to_client'])})")
    for w, m in r["worker_memory"].items():
        before = "" if m["rss_before"] is None else f" (resident before the run {mib(m['rss_before'])})"
        print(f"  worker {w}: peak resident memory {mib(m['peak_rss'])}{before}")
    verdict = "exact" if r["exact"] else f"NOT exact (tolerance {r['tolerance']:g})"
    print(f"  rows {r['rows_checked']} checked against attention_weights_rows from the lse: weights sum to 1 "
          f"within {r['max_weight_error']:.1e}, a·v matches the output within {r['max_output_error']:.1e} "
          f"(relative): {verdict}")
