"""The fixed cost of a decode step (``attnlab.cli.bench_model.fixed_cost``: SmolLM2's 30 layers at tiny widths)
and its Python calls, this tree against another checkout of attnlab's ``src`` (e.g. ``git archive integrate src``).

    python benchmarks/fixed_cost_vs_branch.py OTHER_SRC [--rounds 11]

Each round runs a fresh process of each side (one thread, process time, the median of 15 × 10 steps inside),
the two sides alternating which goes first; prints the CPU, SIMD level and BLAS, each side's figures (with the
step's Python calls and cProfile's numpy/numba calls a layer) and the median of the per-round ratios (this tree /
the other).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[1] / "src"
CODE = """
import json
import numpy as np
from attnlab.cli.bench_harness import Decoder
from attnlab.cli.bench_model import decode_calls, fixed_cost
from attnlab.layer.config import AttentionConfig
from attnlab.layer.positions import RoPE
from attnlab.stack.layers import RMSNorm
from attnlab.stack.transformer import ModelConfig, Transformer
r = fixed_cost(rounds=15)
att = AttentionConfig(d_model=24, n_heads=3, n_kv_heads=1, d_head=8, n_ctx=64, positions=RoPE(100000.0))
cfg = ModelConfig(vocab_size=64, n_layers=30, attention=att, d_mlp=16, activation="silu", mlp="gated", norm=RMSNorm,
                  norm_eps=1e-5, tied_embeddings=True, family="llama")
native = decode_calls(Decoder(Transformer.init(cfg, rng=np.random.default_rng(0)), context=8))
print(json.dumps({'ms': r['ms'], 'calls': r['python_calls'], 'native_per_layer': native['per_layer']}))
"""   # fixed_cost's model (SmolLM2's structure at tiny widths) again, for cProfile's numpy/numba calls a layer


def machine() -> str:
    info = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    cpu = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split() for line in info.splitlines() if line.startswith("flags")), [])
    simd = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "below AVX2"
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    return f"CPU {cpu}; SIMD {simd}; BLAS {blas.get('name')} {blas.get('version')}; load {os.getloadavg()[0]:.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("other", help="another attnlab src folder (the 'before' side)")
    p.add_argument("--rounds", type=int, default=11)
    args = p.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    sides = {"before": args.other, "after": str(SRC)}
    got = {side: [] for side in sides}
    for r in range(args.rounds):
        for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
            out = subprocess.run([sys.executable, "-c", CODE], env=dict(env, PYTHONPATH=sides[side]),
                                 capture_output=True, text=True, check=True)
            got[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
    ratios = [a["ms"] / b["ms"] for a, b in zip(got["after"], got["before"])]
    print(machine())
    for side, rows in got.items():
        ms = [row["ms"] for row in rows]
        print(f"{side:7s} ms/step {np.median(ms):.3f} (rounds {min(ms):.3f}-{max(ms):.3f}), "
              f"Python calls {rows[0]['calls']}, numpy/numba calls a layer {rows[0]['native_per_layer']:.1f}")
    print(f"after / before: median of per-round ratios {np.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]")


if __name__ == "__main__":
    main()
