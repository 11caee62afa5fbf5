"""SmolLM2 decode with its weights kept quantized (Q4_1, the embedding Q8_0), against float32 and llama.cpp
(issue 21's goal: quantized <= 1.0x llama.cpp ms/token on the same file and threads).

    PYTHONPATH=src python benchmarks/quantized_decode.py [--rounds 21] [--cores 2] [--context 64]

One process, the contenders alternating (each round in a rotated order), medians of the per-round ratios:
attnlab quantized on the kernel's threads (kernel_threads(): measured once here), on 1 … cores numba threads
forced, attnlab float32, and llama.cpp on the same file and threads when ``llama_cpp`` (llama-cpp-python) is
importable (skipped cleanly when not; it is never built here, see docs/speed.md). Also printed: the time of
the quantized products within a step, the resident memory the quantized load adds (before the float32 load),
and the logits' error against float32.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from attnlab.cli import bench_harness as bench
from attnlab.cli.bench_model import Decoder, smollm2_file_model, smollm2_gguf_path
from attnlab.kernels import quantized


def rss_mb() -> float:
    """This process's resident memory now (MB), from /proc/self/statm."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 1e6


def rounds_of(contenders: dict, rounds: int) -> tuple[dict, dict]:
    """(name -> per-round seconds, name -> per-round CPU seconds of the process, every thread): one warm-up
    each, then ``rounds`` rounds calling every contender once, the order rotated each round. CPU time does
    not count the time a thread waited for a core, so on a shared machine it tells the work apart from the
    queue (a spinning thread's wait counts as work)."""
    names = list(contenders)
    for f in contenders.values():
        f()
    wall, cpu = {n: [] for n in names}, {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            c0 = time.process_time()
            wall[n].append(bench.time_call(contenders[n]))
            cpu[n].append(time.process_time() - c0)
    return {n: np.array(t) for n, t in wall.items()}, {n: np.array(t) for n, t in cpu.items()}


def forced(threads: int, step):
    """``step`` with the quantized products on ``threads`` numba threads (1: the calling thread)."""
    def run():
        choice = quantized.kernel_threads
        quantized.kernel_threads = lambda: {"threads": threads}
        try:
            return step()
        finally:
            quantized.kernel_threads = choice
    return run


def product_ms(step, repeat: int = 5) -> float:
    """Milliseconds per step spent inside the quantized products (``QuantizedMatrix.__rmatmul__``)."""
    cls, spent = quantized.QuantizedMatrix, [0.0]
    plain = cls.__rmatmul__

    def timed(self, x):
        t0 = time.perf_counter()
        out = plain(self, x)
        spent[0] += time.perf_counter() - t0
        return out
    cls.__rmatmul__ = timed
    try:
        for _ in range(repeat):
            step()
    finally:
        cls.__rmatmul__ = plain
    return 1e3 * spent[0] / repeat


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--cores", type=int, default=2, help="pin to this many cores; llama.cpp runs as many threads")
    ap.add_argument("--context", type=int, default=64)
    args = ap.parse_args()
    path = smollm2_gguf_path()
    quantized.fused_kernels()                         # numba imported first: its ~65 MB are not the model's
    before = rss_mb()
    q = smollm2_file_model(path, quantized=True)
    loaded = rss_mb()
    f32 = smollm2_file_model(path, quantized=False)
    with bench.on_cores(args.cores):
        info = bench.machine_info()
        print(f"{info['cpu']}, {info['simd']}, BLAS {bench.blas_kernel(info['blas'])}, numba {info['numba']}, "
              f"{args.cores} cores, load average {bench.load_average()}")
        print(f"quantized kernel threads: {quantized.kernel_threads()}")
        dq, df = Decoder(q, args.context), Decoder(f32, args.context)
        lq, lf = dq.step(), df.step()
        err = float(np.linalg.norm(lq - lf) / np.linalg.norm(lf))
        contenders = {"quantized": dq.step}
        for n in range(1, (args.cores or 2) + 1):
            contenders[f"quantized {n} thread{'s' * (n > 1)}"] = forced(n, dq.step)
        contenders["float32"] = df.step
        llama = None          # llama.cpp runs in its own process: benchmarks/q8_vs_llama_cpp.py, attnlab bench
        t, c = rounds_of(contenders, args.rounds)
        products = product_ms(dq.step)
    print(f"file {path.stat().st_size / 1e6:.0f} MB; the quantized load added {loaded - before:.0f} MB resident "
          f"({quantized.QuantizedMatrix.__name__} planes: "
          f"{sum(getattr(a, 'nbytes', 0) for a in q.params().values()) / 1e6:.0f} MB)")
    print(f"logits quantized against float32: {err:.1e} relative")
    print(f"{args.rounds} rounds, rotated order; ms/token medians; ratios are medians of per-round ratios")
    ref = "llama.cpp" if llama is not None else "float32"
    for name, s in t.items():
        r, rc = s / t[ref], c[name] / c[ref]
        print(f"  {name:22s} {1e3 * np.median(s):7.1f} ms/token   {np.median(r):5.2f}x {ref} "
              f"[{r.min():.2f}-{r.max():.2f}]   CPU {1e3 * np.median(c[name]):7.1f} ms, {np.median(rc):5.2f}x")
    print(f"  of a quantized step, {products:.1f} ms in the quantized products")
    if llama is None:
        print("llama.cpp: llama_cpp not importable (pip install llama-cpp-python builds it: see docs/speed.md)")


if __name__ == "__main__":
    main()
