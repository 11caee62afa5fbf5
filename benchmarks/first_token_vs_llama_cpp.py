"""Time to first token, whole processes: ``attnlab generate --model smollm2 [--quantized[=q8]] --tokens 1 --prompt
Hello`` against llama.cpp on the same file (llama-cpp-python with its extra buffer types off, one thread,
``n_ctx`` 512, ``create_completion("Hello", max_tokens=1)``), skipped when ``llama_cpp`` cannot be imported.

    python benchmarks/first_token_vs_llama_cpp.py [--rounds 7] [--other-src DIR]

Process time (user + sys) of each child, the sides alternating round by round (after one warm-up run each:
``.pyc`` files written, numba's cache filled, the file in the page cache), the median of per-round ratios to
llama.cpp. ``PYTHONDONTWRITEBYTECODE`` is removed from the children's environment (with it set every attnlab
process compiles its modules again, about 0.3 s more). ``--other-src`` adds another attnlab ``src`` as a side.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[1] / "src"
LLAMA = ("from attnlab.cli.llama_process import llama_cpp_model\n"
         "from attnlab.cli.bench_model import smollm2_gguf_path\n"
         "llm = llama_cpp_model(smollm2_gguf_path(), n_threads=1, n_ctx=512)\n"
         "llm.create_completion('Hello', max_tokens=1)")
GENERATE = ["-m", "attnlab", "generate", "--model", "smollm2", "--tokens", "1", "--prompt", "Hello"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--other-src", help="another attnlab src folder, run --quantized as a side of its own")
    args = p.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    sides = {"float32": (GENERATE, SRC), "quantized": (GENERATE + ["--quantized"], SRC),
             "quantized q8": (GENERATE + ["--quantized=q8"], SRC)}
    if args.other_src:
        sides["quantized, other src"] = (GENERATE + ["--quantized"], args.other_src)
    try:
        import llama_cpp  # noqa: F401
        sides["llama.cpp"] = (["-c", LLAMA], SRC)
    except ImportError:
        print("llama_cpp cannot be imported: attnlab's sides only (pip install llama-cpp-python to add it)")

    def run(name):
        cmd, src = sides[name]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, *cmd], env=dict(env, PYTHONPATH=str(src)), capture_output=True, check=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime

    names = list(sides)
    for name in names:
        run(name)                                                          # warm-up
    got = {name: [] for name in names}
    for r in range(args.rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            got[name].append(run(name))
    sys.path.insert(0, str(SRC))
    from attnlab.cli.bench_harness import blas_kernel, machine_info

    m = machine_info()
    print(f"{m['cpu']}; SIMD {m['simd']}; BLAS {blas_kernel(m['blas'])} (the children: 1 thread); numba {m['numba']}; "
          f"load {os.getloadavg()[0]:.1f}; PYTHONDONTWRITEBYTECODE unset in the children; "
          f"weight cache {env.get('ATTNLAB_CACHE') or 'the default folder'}")
    for name in names:
        line = f"{name:22s} process s {np.median(got[name]):.2f}"
        if "llama.cpp" in got and name != "llama.cpp":
            r = [a / b for a, b in zip(got[name], got["llama.cpp"])]
            line += f"   / llama.cpp {np.median(r):.2f} [{min(r):.2f}-{max(r):.2f}]"
        print(line)


if __name__ == "__main__":
    main()
