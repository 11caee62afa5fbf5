"""Where the time to first token goes: ``attnlab generate --model smollm2 --tokens 1 --prompt Hello``'s steps,
each in process time, in a fresh process per run (float32, ``--quantized``, ``--quantized=q8``).

    python benchmarks/first_token_phases.py [--rounds 5] [--modes float32,quantized,q8]

The child runs the command's own steps one by one (imports; argument parsing; the GGUF header; the tokenizer;
numba and the kernels' module; the weights, from the weight cache when it holds them; the first token, numba's
kernels loaded from its cache at their first call) and prints each step's process time, and whether numba set
up its compiler (attnlab.kernels._numba_load loads the kernels without it); the parent adds the whole
process's (user + sys, from ``getrusage``), so what the interpreter's start and exit cost is the whole less the
steps. The modes alternate round by round after one warm-up run each (``.pyc`` files written, the weight cache
and numba's cache filled). Medians over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[1] / "src"
MODES = {"float32": [], "quantized": ["--quantized"], "q8": ["--quantized=q8"]}

CHILD = r'''
import json, sys, time
clock = time.process_time
steps, last = {}, clock()
def step(name):
    global last
    now = clock(); steps[name] = now - last; last = now
import numpy as np
step("import numpy")
from attnlab.cli import build_parser, _model
from attnlab.cli.generate import encode_prompt
step("import attnlab and generate's module")
args = build_parser("generate").parse_args(["generate", "--model", "smollm2", "--tokens", "1", "--prompt", "Hello",
                                            "--temperature", "0", *sys.argv[1:]])
step("parse the command line")
source = _model.open_source(args)
step("GGUF header")
tokenizer = source.tokenizer()
prompt = encode_prompt(tokenizer, "Hello")
step("tokenizer")
if args.quantized:
    import numba
    from attnlab.kernels import _quant_fused
    step("import numba and the kernels")
model = source.network()
step("weights (from the cache)")
from attnlab.kernels._threads import one_blas_thread
from attnlab.stack.transformer import generate
with one_blas_thread():
    generate(model, prompt, 1, temperature=0.0, rng=np.random.default_rng(0))
step("first token")
if "numba" in sys.modules:                       # its set-up installs the builtin registry (numba's internals)
    from numba.core.imputils import builtin_registry
    from numba.core.registry import cpu_target
    steps["numba's compiler set up (1 = yes)"] = float(builtin_registry in cpu_target.target_context._registries)
print(json.dumps(steps))
import gc
gc.freeze()                      # as the program does before it exits (attnlab.cli.program)
'''


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--modes", default="float32,quantized,q8")
    args = p.parse_args()
    modes = args.modes.split(",")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1", PYTHONPATH=str(SRC))

    def run(mode):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run([sys.executable, "-c", CHILD, *MODES[mode]], env=env, capture_output=True, text=True,
                             check=True).stdout
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        steps = json.loads(out.splitlines()[-1])
        whole = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        steps["interpreter start and exit"] = whole - sum(v for k, v in steps.items() if "set up" not in k)
        steps["whole process"] = whole
        return steps

    for mode in modes:
        run(mode)                                                          # warm-up
    got = {mode: [] for mode in modes}
    for r in range(args.rounds):
        for mode in (modes if r % 2 == 0 else modes[::-1]):
            got[mode].append(run(mode))
    sys.path.insert(0, str(SRC))
    from attnlab.cli.bench_harness import blas_kernel, machine_info

    m = machine_info()
    print(f"{m['cpu']}; SIMD {m['simd']}; BLAS {blas_kernel(m['blas'])}; numba {m['numba']}; "
          f"load {os.getloadavg()[0]:.1f}; the children on 1 thread; {args.rounds} rounds; process time, medians (s)")
    names = list(dict.fromkeys(k for mode in modes for k in got[mode][0]))
    print(f"{'step':42s}" + "".join(f"{mode:>11s}" for mode in modes))
    for name in names:
        cells = [np.median([s[name] for s in got[mode]]) if name in got[mode][0] else None for mode in modes]
        print(f"{name:42s}" + "".join(f"{'':>11s}" if c is None else f"{c:11.3f}" for c in cells))


if __name__ == "__main__":
    main()
