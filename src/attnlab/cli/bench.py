"""attnlab bench: speed and memory of the tiled and naive paths beside PyTorch, in one process."""

from __future__ import annotations

import contextlib
import sys

from ._app import add_json_flag, print_json, stderr_progress


def register(sub) -> None:
    p = sub.add_parser("bench", help="time the tiled and naive attention paths against PyTorch SDPA")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats (n = 256, 1024, 2048)")
    p.add_argument("--scale", action="store_true", help="instead, run causal attention once at n = 65,536 "
                   "(12 heads) and report its time and memory")
    add_json_flag(p)
    p.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    from .. import bench
    if args.scale:
        with progress_bar(1) as step:
            step(f"causal attention at n = {bench.SCALE_N:,} (a minute or more)")
            result = bench.run_scale(bench.SCALE_N)
        print_json(result) if args.json else print_scale(result)
        return 0
    with progress_bar(bench.n_steps(quick=args.quick)) as step:
        result = bench.run_bench(quick=args.quick, progress=step)
    print_json(result) if args.json else print_table(result)
    return 0


@contextlib.contextmanager
def progress_bar(total: int):
    """A rich progress bar on stderr for ``total`` steps: calling the yielded function with a step's name
    starts that step (and completes the one before); leaving the block completes the last."""
    try:
        import rich  # noqa: F401
    except ImportError:
        yield lambda name: print(f"  {name}", file=sys.stderr)
        return
    with stderr_progress() as bar:
        task = bar.add_task("bench", total=total)
        started = [False]

        def step(name: str) -> None:
            if started[0]:
                bar.advance(task)
            started[0] = True
            bar.update(task, description=name)

        yield step
        if started[0]:
            bar.advance(task)


def fmt(x, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def print_table(r: dict) -> None:
    blas = ", ".join(f"{b['internal_api']} {b['version']} ({b['architecture'] or b['prefix']}, "
                     f"{b['num_threads']} threads)" for b in r["blas"] if b["user_api"] == "blas") or "unknown"
    torch = r["torch"]
    print(f"float32, batch 1, {r['shape']['n_heads']} heads, d_head {r['shape']['d_head']}; medians of "
          "alternated runs")
    torch_text = f"{torch['version']}, {torch['threads']} threads" if torch else "not installed"
    print(f"BLAS: {blas}; torch: {torch_text}")
    measured = " and ".join(f"{g:.0f}" for g in r["gemm_gflops_measured"])
    print(f"numpy float32 GEMM: {r['gemm_gflops']:.0f} GFLOP/s (the faster of {measured}, before and after "
          "the forward rows)")
    print()
    print(f"{'n':>6} {'causal':>6} {'tiled ms':>9} {'GFLOP/s':>8} {'of GEMM':>8} {'naive ms':>9} "
          f"{'torch ms':>9} {'tiled/torch':>11} {'out MiB':>8} {'tiled MiB':>9} {'naive MiB':>9}")
    for f in r["forward"]:
        print(f"{f['n']:>6} {'yes' if f['is_causal'] else 'no':>6} {f['tiled_ms']:>9.1f} "
              f"{f['tiled_gflops']:>8.0f} {f['tiled_vs_gemm']:>8.0%} {fmt(f['naive_ms']):>9} "
              f"{fmt(f['torch_ms']):>9} {fmt(f['tiled_vs_torch'], '.2f'):>11} {f['output_mib']:>8.1f} "
              f"{f['tiled_extra_mib']:>9.1f} {fmt(f['naive_extra_mib']):>9}")
    print()
    print(f"{'decode: context':>16} {'attnlab ms':>11} {'torch ms':>9} {'ratio':>6}")
    for d in r["decode"]:
        print(f"{d['context']:>16} {d['attnlab_ms']:>11.3f} {fmt(d['torch_ms'], '.3f'):>9} "
              f"{fmt(d['ratio'], '.2f'):>6}")
    print()
    print(f"{'backward: n':>12} {'tiled ms':>9} {'naive ms':>9} {'torch fwd+bwd ms':>17} {'ratio':>6}")
    for b in r["backward"]:
        print(f"{b['n']:>12} {b['tiled_ms']:>9.1f} {fmt(b['naive_ms']):>9} {fmt(b['torch_ms']):>17} "
              f"{fmt(b['ratio'], '.2f'):>6}")


def print_scale(r: dict) -> None:
    print(f"causal attention, n = {r['n']:,}, {r['n_heads']} heads, d_head {r['d_head']}, float32")
    print(f"time {r['seconds']:.1f} s ({r['gflops']:.0f} GFLOP/s); output {r['output_mib']:.0f} MiB; "
          f"peak RSS {r['peak_rss_mib']:.0f} MiB, {r['extra_peak_rss_mib']:.0f} MiB above the inputs "
          f"({r['inputs_mib']:.0f} MiB); the naive grids would need {r['naive_grid_gib']:.0f} GiB")
