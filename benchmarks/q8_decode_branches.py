"""The q8-activations mode's decode step and prefill on SmolLM2 across source trees (branches' worktrees) and
llama.cpp: each tree in its own process (its src first on the path), llama.cpp in its own
(:class:`attnlab.cli.llama_process.LlamaProcess`), all on one thread; rounds alternate, process time, medians of
per-round ratios to the first tree. The prefill figures are the decoders' fills (one run each).

    PYTHONPATH=src python benchmarks/q8_decode_branches.py NAME=SRC [NAME=SRC ...] [--contexts 512 2048]
        [--rounds 9] [--steps 5] [--no-llama]
"""

import argparse
import json
import os
import subprocess
import sys

import numpy as np

WORKER = r"""
import json, sys, time
from attnlab.cli.bench_model import smollm2_gguf_path
from attnlab.cli.bench_harness import Decoder
from attnlab.models import load_model
model, _ = load_model(str(smollm2_gguf_path()), quantized="q8-activations")
decoders, fills = {}, {}
for ctx in map(int, sys.argv[1:]):
    t0 = time.process_time()
    decoders[ctx] = Decoder(model, ctx)
    fills[ctx] = time.process_time() - t0
    decoders[ctx].step()                                    # warm-up
print(json.dumps({"fills": fills}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    d = decoders[req["ctx"]]
    t0 = time.process_time()
    for _ in range(req["steps"]):
        d.step()
    print(json.dumps({"seconds": (time.process_time() - t0) / req["steps"]}), flush=True)
"""

ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}


def start(src: str, contexts) -> subprocess.Popen:
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": src}
    return subprocess.Popen([sys.executable, "-c", WORKER, *map(str, contexts)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)


def ask(proc, **req) -> dict:
    proc.stdin.write(json.dumps(req) + "\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs="+", help="NAME=SRC: a name and a source directory (its attnlab first)")
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--no-llama", action="store_true")
    a = ap.parse_args()
    from attnlab.cli.bench_harness import machine_info
    from attnlab.cli.bench import blas_kernel
    from attnlab.cli.bench_model import smollm2_gguf_path
    from attnlab.cli.llama_process import LlamaProcess, llama_cpp_installed
    m = machine_info()
    print(f"CPU: {m['cpu']}; SIMD: {m['simd']}; BLAS: {blas_kernel(m['blas'])}; load: {os.getloadavg()}")
    trees = dict(t.split("=", 1) for t in a.trees)
    procs = {}
    for name, src in trees.items():                       # one at a time: their fills do not overlap
        procs[name] = start(src, a.contexts)
        procs[name].fills = json.loads(procs[name].stdout.readline())["fills"]
        print(f"{name}: prefill (fill) s {procs[name].fills}", flush=True)
    llama = None
    if not a.no_llama and llama_cpp_installed():
        llama = LlamaProcess(smollm2_gguf_path(), threads=1, n_ctx=max(4096, max(a.contexts) + 64))
    for ctx in a.contexts:
        sides = {name: (lambda p=p: ask(p, ctx=ctx, steps=a.steps)["seconds"]) for name, p in procs.items()}
        if llama is not None:
            llama.request(op="fill", context=ctx)
            sides["llama.cpp"] = lambda: sum(llama.request(op="step")["seconds"][0] for _ in range(a.steps)) / a.steps
            sides["llama.cpp"]()
        names, times = list(sides), {n: [] for n in sides}
        for r in range(a.rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:
                times[n].append(sides[n]())
        first = names[0]
        for n in names:
            ratio = np.array(times[n]) / np.array(times[first])
            print(f"context {ctx}: {n:10s} {1e3 * np.median(times[n]):7.2f} ms/token   vs {first}: "
                  f"{np.median(ratio):.2f}x [{ratio.min():.2f}-{ratio.max():.2f}]", flush=True)
        if llama is not None:
            for n in names[:-1]:
                ratio = np.array(times[n]) / np.array(times["llama.cpp"])
                print(f"context {ctx}: {n:10s} vs llama.cpp {np.median(ratio):.2f}x "
                      f"[{ratio.min():.2f}-{ratio.max():.2f}]")
    for p in procs.values():
        p.stdin.close()
        p.wait()
    if llama is not None:
        llama.close()
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
