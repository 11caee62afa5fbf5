"""attnlab bench: speed and memory of attnlab's attention paths beside PyTorch, in one process, each pair
timed alone (see :mod:`attnlab.cli.bench_harness`)."""

from __future__ import annotations

import contextlib
import sys

from ._app import add_command, add_json_flag, print_json, stderr_progress
from ._model import add_model_option
from ._progress import shows


def register(sub) -> None:
    p = add_command(sub, "bench", help="time attnlab's attention paths against PyTorch SDPA, each pair alone; "
                    "print the CPU, SIMD level, BLAS kernel and the path each call took", beyond="docs/bench.md",
                    shows="Shows how fast attnlab's attention paths run against PyTorch's, each pair timed alone, "
                          "with the CPU, SIMD level, BLAS kernel and the path each call took",
                    more="The guide's last paragraph of “The price of looking at everything” points here: the "
                         "tiled path is the grid that is never held whole.",
                    examples=("attnlab bench --quick", "attnlab bench --quick --sizes 512 --json"))
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats (n = 256, 1024, 2048)")
    p.add_argument("--cores", type=int, metavar="N", help="run attnlab and torch on the same N cores (the process "
                   "pinned to them, BLAS and torch on N threads; default: every core this process may use)")
    p.add_argument("--sizes", type=int, nargs="+", metavar="N", help="the forward rows' sequence lengths "
                   "(default 256 … 8192, or those of --quick)")
    p.add_argument("--scale", action="store_true", help="instead, run causal attention once at n = 65,536 "
                   "(12 heads) and report its time and memory")
    add_model_option(p, only=("smollm2",), quantized=False, help="instead, a real model: decode ms/token (float32 "
                     "against its bound, quantized), calls per step, a 512-token prefill, llama.cpp if importable")
    add_json_flag(p)
    p.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    from . import bench_harness as bench
    bench.check_cores(args.cores)                      # bad input: one line before the progress bar starts
    if args.model:
        from . import bench_model
        with progress_bar(7, quiet=args.json) as step:
            result = bench_model.run_model_bench(args.model, rounds=5 if args.quick else 11, cores=args.cores,
                                                 progress=step)
        print_json(result) if args.json else print("\n".join(bench_model.model_table(result)))
        return 0
    if args.scale:
        with progress_bar(1, quiet=args.json) as step, bench.on_cores(args.cores):
            step(f"causal attention at n = {bench.SCALE_N:,} (a minute or more)")
            result = bench.run_scale(bench.SCALE_N)
        print_json(result) if args.json else print_scale(result)
        return 0
    with progress_bar(bench.n_steps(quick=args.quick, sizes=args.sizes), quiet=args.json) as step:
        result = bench.run_bench(quick=args.quick, progress=step, cores=args.cores, sizes=args.sizes)
    if args.json:
        print_json(result)
    else:
        print_table(result)
        print_goals(result)
    return 0


@contextlib.contextmanager
def progress_bar(total: int, *, quiet: bool = False):
    """A rich progress bar on stderr for ``total`` steps: calling the yielded function with a step's name
    starts that step (and completes the one before); leaving the block completes the last. Nothing with
    ``quiet`` (``--json``) or when stderr is not a terminal."""
    if not shows(quiet):
        yield lambda name: None
        return
    try:
        import rich  # noqa: F401
    except ImportError:
        yield lambda name: print(f"  {name}", file=sys.stderr)
        return
    with stderr_progress(quiet=quiet) as bar:
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


def ratio_text(row: dict) -> str:
    """"0.93 (0.88-1.02)": the median per-round ratio and its min-max, or "-" without torch."""
    if row["ratio"] is None:
        return "-"
    return f"{row['ratio']:.2f} ({row['ratio_min']:.2f}-{row['ratio_max']:.2f})"


def blas_kernel(blas: list[dict]) -> str:
    from .bench_harness import blas_kernel
    return blas_kernel(blas)


#: what the table says without torch: its columns are then empty, and how to fill them
NO_TORCH = ("not installed, so the torch columns show '-'; to compare, add it to this environment: pip install "
            "'torch==2.13.0' (the version attnlab's test extra pins, as pip install -e '.[test]' does)")


def print_table(r: dict) -> None:
    m = r["machine"]
    torch = m["torch"]
    pinned = f" (pinned by --cores; the machine has {m['machine_cores']})" if r.get("cores_asked") else ""
    print(f"CPU: {m['cpu']}; SIMD: {m['simd']}; attnlab and torch on the same {m['cores']} cores{pinned}")
    print(f"BLAS: {blas_kernel(m['blas'])}")
    torch_text = f"{torch['version']}, {torch['threads']} threads, {torch['cpu_capability']}" if torch else NO_TORCH
    numba = m["numba"] or "not installed"
    print(f"torch: {torch_text}; numba: {numba}{' (disabled by ATTNLAB_NO_NUMBA)' if m['numba_disabled'] else ''}")
    print(f"tile kernel from {m['fused_min_scores']:,} scores (causal): {m['tile_kernel']} "
          f"({m['tile_kernel_reason']}); numpy's exponential: {m['numpy_exp']['chosen']} ({m['numpy_exp']['reason']})")
    print(f"tune: {m['tune']}")
    print(f"float32, {r['shape']['n_heads']} heads, d_head {r['shape']['d_head']}; {r['method']}, "
          f"{r['shape']['rounds']} rounds")
    measured = " and ".join(f"{g:.0f}" for g in r["gemm_gflops_measured"])
    print(f"numpy float32 GEMM: {r['gemm_gflops']:.0f} GFLOP/s (the faster of {measured}, before and after "
          "the forward rows)")
    paths = sorted({row["path"] for key in ("forward", "batch", "decode", "backward") for row in r[key]})
    print("paths: " + "; ".join(f"[{i}] {p}" for i, p in enumerate(paths)))
    tag = lambda row: f"[{paths.index(row['path'])}]"          # noqa: E731
    print()
    print(f"{'n':>6} {'causal':>6} {'path':>4} {'attnlab ms':>10} {'GFLOP/s':>8} {'of GEMM':>8} {'torch ms':>9} "
          f"{'ratio (min-max)':>17} {'naive ms':>9} {'out MiB':>8} {'extra MiB':>9} {'naive MiB':>9}")
    for f in r["forward"]:
        print(f"{f['n']:>6} {'yes' if f['is_causal'] else 'no':>6} {tag(f):>4} {f['attnlab_ms']:>10.1f} "
              f"{f['gflops']:>8.0f} {f['of_gemm']:>8.0%} {fmt(f['torch_ms']):>9} {ratio_text(f):>17} "
              f"{fmt(f['naive_ms']):>9} {f['output_mib']:>8.1f} {f['extra_mib']:>9.1f} {fmt(f['naive_extra_mib']):>9}")
    print()
    print(f"{'batch':>6} {'n':>6} {'path':>4} {'attnlab ms':>10} {'torch ms':>9} {'ratio (min-max)':>17}")
    for b in r["batch"]:
        print(f"{b['batch']:>6} {b['n']:>6} {tag(b):>4} {b['attnlab_ms']:>10.2f} {fmt(b['torch_ms'], '.2f'):>9} "
              f"{ratio_text(b):>17}")
    print()
    print(f"{'decode: context':>16} {'path':>4} {'attnlab ms':>11} {'torch ms':>9} {'ratio (min-max)':>17}")
    for d in r["decode"]:
        print(f"{d['context']:>16} {tag(d):>4} {d['attnlab_ms']:>11.3f} {fmt(d['torch_ms'], '.3f'):>9} "
              f"{ratio_text(d):>17}")
    print()
    print(f"{'fwd+bwd: n':>11} {'path':>4} {'attnlab ms':>10} {'torch ms':>9} {'ratio (min-max)':>17} "
          f"{'naive ms':>9}")
    for b in r["backward"]:
        print(f"{b['n']:>11} {tag(b):>4} {b['attnlab_ms']:>10.1f} {fmt(b['torch_ms']):>9} {ratio_text(b):>17} "
              f"{fmt(b['naive_ms']):>9}")
    print_first_call(r.get("first_call"))


def print_first_call(f: dict | None) -> None:
    """A fresh process's first attention call against its second (resident memory), by default and with numba
    loaded first."""
    if not f:
        return
    print()
    print(f"first call in a fresh process (n = {f['n']}, causal, resident memory added and time of each step):")
    for name, run in f["runs"].items():
        steps = "; ".join(f"{step} +{s['rss_mib']:.1f} MiB {s['ms']:.0f} ms" for step, s in run.items()
                          if step != "kernel")
        print(f"  {name}: {steps} (kernel {run['kernel']})")


def print_goals(r: dict) -> None:
    """The issue's goals: each with the figures it covers, the worst one, and met / missed."""
    load = r.get("load_average")
    print()
    machine_cores = r["machine"].get("machine_cores") or r["machine"]["cores"]
    print(f"goals (SIMD {r['machine']['simd']}; load average after the run: "
          f"{' '.join(map(str, load)) if load else 'unknown'} on {machine_cores} cores)")
    probe = r.get("blas_contention")
    if probe:
        print(f"  BLAS contention probe (12 × 494² scores, as MiniLM's): {probe['blas_threads']} BLAS threads "
              f"{probe['all_threads_ms']:.1f} ms, one thread {probe['one_thread_ms']:.1f} ms (ratio {probe['ratio']:.2f}; "
              "far above 1: the cores are shared, and every path on BLAS's or torch's own threads slows with it)")
    if load and load[0] > machine_cores:
        print(f"  warning: the 1-minute load ({load[0]}) exceeded the machine's {machine_cores} cores: other "
              "processes shared them, which slows torch's threads (they wait on each other) more than attnlab's; "
              "run again on a quiet machine before trusting a verdict")
    for g in r["goals"]:
        verdict = {True: "met", False: "missed", None: "-"}[g["met"]]
        figures = ", ".join(f"{k} {fmt(v, '.0%' if g['goal'].endswith('%') else '.2f')}"
                            for k, v in g["figures"].items())
        print(f"  {g['case']}: goal {g['goal']}; {verdict}  [{figures}]")


def print_scale(r: dict) -> None:
    print(f"causal attention, n = {r['n']:,}, {r['n_heads']} heads, d_head {r['d_head']}, float32")
    print(f"time {r['seconds']:.1f} s ({r['gflops']:.0f} GFLOP/s); output {r['output_mib']:.0f} MiB; "
          f"peak RSS {r['peak_rss_mib']:.0f} MiB, {r['extra_peak_rss_mib']:.0f} MiB above the inputs "
          f"({r['inputs_mib']:.0f} MiB); the naive grids would need {r['naive_grid_gib']:.0f} GiB")
