"""SmolLM2-135M's prefill (the last position's logits) in the ``q8-activations`` mode against float32 attnlab,
transformers and llama.cpp on the same Q4_1 GGUF (issue 33's goal: <= 0.8x transformers, <= 1.0x llama.cpp), on
one core: :func:`attnlab.cli.bench_q8.prefill_rows` (process time, rounds alternating, medians of per-round
ratios; llama.cpp in its own process, when ``llama_cpp`` is importable). ``--exact`` adds the exact quantized
mode.

    PYTHONPATH=src python benchmarks/smollm2_q8_prefill.py [--tokens 512 2048] [--rounds 3] [--exact]
"""

from __future__ import annotations

import argparse
import json

from attnlab.cli import bench_harness as bench
from attnlab.cli.bench_model import smollm2_file_model, smollm2_gguf_path, transformers_model
from attnlab.cli.bench_q8 import prefill_rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--exact", action="store_true")
    args = ap.parse_args()
    from attnlab.cli.llama_process import LlamaProcess, llama_cpp_installed

    path = smollm2_gguf_path()
    models = {"float32": smollm2_file_model(path, quantized=False)}
    if args.exact:
        models["exact"] = smollm2_file_model(path, quantized=True)
    models["q8"] = smollm2_file_model(path, quantized="q8-activations")
    hf, torch = transformers_model(path)
    llama = LlamaProcess(path, threads=1, n_ctx=max(args.tokens) + 16) if llama_cpp_installed() else None
    out = {"prefill": []}
    try:
        with bench.on_cores(1, torch):
            info = bench.machine_info()
            print(f"{info['cpu']}, SIMD {info['simd']}, BLAS {bench.blas_kernel(info['blas'])}, one core, process "
                  f"time, llama.cpp {None if llama is None else llama.version}, load average {bench.load_average()}")
            for n in args.tokens:
                out["prefill"].append(prefill_rows(models, hf, torch, llama, n, args.rounds))
                p = out["prefill"][-1]
                print(f"prefill {n}: " + ", ".join(f"{k} {v:.0f} ms" for k, v in p["ms"].items()))
                for ref in ("transformers", "llama_cpp"):
                    if f"vs_{ref}" in p:
                        print(f"    vs {ref}: " + ", ".join(
                            f"{k} {x['ratio']:.2f}x [{x['ratio_min']:.2f}-{x['ratio_max']:.2f}]"
                            for k, x in p[f"vs_{ref}"].items()))
    finally:
        if llama is not None:
            llama.close()
    out["load_average"] = bench.load_average()
    print(json.dumps(out, default=float))


if __name__ == "__main__":
    main()
