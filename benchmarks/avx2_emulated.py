"""The goal table of issue 33 on an emulated AVX2-only machine (this one with its AVX-512 turned off in software).

Issue 33: "Each goal must hold on AVX2 and on AVX-512 machines, through rules or ``attnlab tune``, never through a
constant measured on one of them." Without an AVX2 machine at hand, this runs the goal table's rows in a
subprocess whose every library is told to use AVX2 and nothing above it:

- numpy: ``NPY_DISABLE_CPU_FEATURES`` names every AVX-512 target numpy dispatches to (``X86_V4``,
  ``AVX512_ICL``, ``AVX512_SPR`` on numpy 2.4), so its loops run their AVX2 (``X86_V3``) versions and attnlab's
  rules on numpy's features (``_kernels.exp_rule``, ``profile.simd_level``) see AVX2;
- OpenBLAS: ``OPENBLAS_CORETYPE=Haswell`` (in this subprocess only: tests and CI leave it alone); threadpoolctl
  then reports the Haswell kernel;
- numba: ``NUMBA_CPU_NAME=haswell`` with Haswell's features listed in ``NUMBA_CPU_FEATURES`` (the name alone
  still passes the host's features to LLVM, AVX-512 included), in a cache folder of its own
  (``NUMBA_CACHE_DIR``) so the AVX-512 cache is neither reused nor overwritten; attnlab's rule for the 8-bit
  kernels' instructions reads the features numba compiles for (``_kernels.numba_target_features``), so it takes
  the ``vpmaddwd`` branch. The script checks the q8 kernels' assembly (compiled fresh: no ``zmm``, no
  ``vpdpbusd``) and every kernel object in the emulation's cache (no ``zmm`` register anywhere);
- transformers' side: ``ATEN_CPU_CAPABILITY=avx2``, ``MKL_ENABLE_INSTRUCTIONS=AVX2`` and
  ``ONEDNN_MAX_CPU_ISA=AVX2`` (torch's kernels, its BLAS, oneDNN), so the prefill goal against transformers
  compares AVX2 with AVX2.

What it does not emulate: llama.cpp (its own process, :mod:`attnlab.cli.llama_process`) is the AVX-512 build
installed here (AVX-512 VNNI, AVX-VNNI; its kernels are chosen when it was compiled, not from the environment),
so every ratio to llama.cpp compares attnlab on AVX2 with llama.cpp on AVX-512: conservative (an AVX2 machine's
llama.cpp would run its ``vpmaddubsw`` path, slower than its ``vpdpbusd`` one). Nor the rest of an AVX2 machine:
its caches, memory bandwidth and clocks are this Xeon's.

Rows (one thread, process time, the sides alternating, medians of per-round ratios):
decode with 8-bit activations at contexts 512 and 2,048 against llama.cpp, exact quantized decode at 512 against
llama.cpp, float32 decode against its bound (numpy's streaming rate on one thread), a 512-token prefill against
transformers and llama.cpp. Then, for the reasons, the standalone product kernels' rates (a Q4_1 matrix in L2 and
one streamed from memory) emulated and native, in alternating subprocesses.

    PYTHONPATH=src python benchmarks/avx2_emulated.py --rounds 5          # emulated AVX2
    PYTHONPATH=src python benchmarks/avx2_emulated.py --rounds 5 --native # the same rows on this CPU as it is
    PYTHONPATH=src python benchmarks/avx2_emulated.py --kernels-only      # only the kernels' rates

The numbers depend on the machine and its load; the script prints the CPU, the SIMD level numpy reports under
the emulation, the BLAS kernel, numba's target and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

# numba's target: the CPU name and Haswell's features (what LLVM's "haswell" has; none of AVX-512)
HASWELL_FEATURES = ("+sse2,+sse3,+ssse3,+sse4.1,+sse4.2,+popcnt,+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+lzcnt,+movbe,"
                    "+pclmul,+cx16,+fxsr,+sahf,+xsave")
# the standalone rates: the 8-bit and exact Q4_1 products in L2 and from memory, a prefill's float32 product
RATE_CASES = (("q8", "l2"), ("q8", "memory"), ("exact", "l2"), ("exact", "memory"), ("numpy_sgemm", "l2"),
              ("torch_sgemm", "l2"))
INSTRUCTIONS = ("zmm", "ymm", "vpdpbusd", "vpmaddubsw", "vpmaddwd", "vphaddd", "vfmadd")
GOALS = (   # case, the figure's key in the rows, bound
    ("decode q8, context 512, vs llama.cpp", "decode_q8_512", 1.0),
    ("decode q8, context 2,048, vs llama.cpp (flash-attention on)", "decode_q8_2048_fa_on", 1.0),
    ("decode q8, context 2,048, vs llama.cpp (flash-attention off)", "decode_q8_2048_fa_off", 1.0),
    ("decode exact quantized, context 512, vs llama.cpp", "decode_exact_512", 1.2),
    ("decode float32 vs its bound", "decode_float32_bound", 1.3),
    ("prefill 512 (q8) vs transformers", "prefill_512_q8_transformers", 0.8),
    ("prefill 512 (float32) vs transformers", "prefill_512_float32_transformers", 0.8),
    ("prefill 512 (q8) vs llama.cpp", "prefill_512_q8_llama_cpp", 1.0),
)


def numpy_avx512_targets() -> list[str]:
    """The AVX-512 targets this numpy dispatches to (numpy 2.x: X86_V4, AVX512_ICL, AVX512_SPR; 1.x: AVX512F,
    AVX512_SKX, ...): what ``NPY_DISABLE_CPU_FEATURES`` must name."""
    try:
        from numpy._core import _multiarray_umath as umath
    except ImportError:                                              # numpy 1.x
        from numpy.core import _multiarray_umath as umath
    return [t for t in umath.__cpu_dispatch__ if t.startswith("AVX512") or t == "X86_V4"]


def default_cache_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "attnlab" / "numba-avx2-emulated"


def emulation_env(base: dict, cache_dir) -> dict:
    """``base`` with every library told to stop at AVX2 (the module's docstring), numba's cache in ``cache_dir``."""
    env = dict(base)
    env.pop("ATTNLAB_NO_NUMBA", None)
    env.update(NPY_DISABLE_CPU_FEATURES=" ".join(numpy_avx512_targets()), OPENBLAS_CORETYPE="Haswell",
               NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES=HASWELL_FEATURES, NUMBA_CACHE_DIR=str(cache_dir),
               ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2", ONEDNN_MAX_CPU_ISA="AVX2")
    return env


def native_env(base: dict) -> dict:
    """``base`` without any of the emulation's variables (this CPU as it is, numba's usual cache)."""
    names = ("NPY_DISABLE_CPU_FEATURES", "OPENBLAS_CORETYPE", "NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES",
             "NUMBA_CACHE_DIR", "ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "ATTNLAB_NO_NUMBA")
    return {k: v for k, v in base.items() if k not in names}


def run_worker(env: dict, *args, timeout: int = 3600) -> dict:
    """This script's ``--worker`` part in a subprocess with ``env``: its JSON answer."""
    run = subprocess.run([sys.executable, __file__, "--worker", *args], env=env, capture_output=True, text=True,
                         timeout=timeout)
    if run.returncode != 0:
        raise RuntimeError(f"the worker failed ({' '.join(args)}):\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------------------
# the worker's parts (in the subprocess)


def machine() -> dict:
    """CPU, numpy's SIMD level and dispatch, BLAS kernel, numba's target, torch's capability, llama.cpp's build."""
    import llvmlite.binding as llvm
    import numba
    import numpy as np

    from attnlab.cli import bench_harness as bench
    from attnlab.kernels import _kernels, _q8_fused, profile

    try:
        from numpy._core import _multiarray_umath as umath
    except ImportError:
        from numpy.core import _multiarray_umath as umath
    found = [t for t in umath.__cpu_dispatch__ if umath.__cpu_features__.get(t)]
    out = {"cpu": profile.cpu_model(), "numpy": np.__version__, "numpy_simd": profile.simd_level(),
           "numpy_dispatch_on": found, "numpy_dispatch_off": [t for t in umath.__cpu_dispatch__ if t not in found],
           "blas": bench.blas_kernel(bench.blas_info()),
           "numba_target": {"cpu": numba.config.CPU_NAME or llvm.get_host_cpu_name() + " (host)",
                            "features": numba.config.CPU_FEATURES or "the host's",
                            "cache": os.environ.get("NUMBA_CACHE_DIR", "numba's default (__pycache__)")},
           "q8_rule": {"vnni": _q8_fused.VNNI, "vnni_512": _q8_fused.VNNI_512},
           "exp_rule": _kernels.numpy_exp().name, "tune": profile.status().reason}
    try:
        import torch
        out["torch"] = f"{torch.__version__}, {torch.backends.cpu.get_cpu_capability()}"
    except ImportError:
        out["torch"] = None
    llama = subprocess.run([sys.executable, "-c", "import llama_cpp; print(llama_cpp.llama_print_system_info()"
                            ".decode())"], capture_output=True, text=True, timeout=300)
    info = llama.stdout.strip().splitlines()
    out["llama_cpp"] = info[-1] if llama.returncode == 0 and info else None
    return out


def count_instructions(asm: str) -> dict:
    return {name: len(re.findall(name, asm)) for name in INSTRUCTIONS}


def q8_kernel_asm() -> dict:
    """The q8 kernels' assembly (Q4_1 and Q8_0 products), compiled in this process: counts of the instructions
    that matter (run with a fresh NUMBA_CACHE_DIR, or a cached kernel has no assembly to show)."""
    import numpy as np
    from gguf.constants import GGMLQuantizationType as T
    from gguf.quants import quantize

    from attnlab.kernels import _q8_fused
    from attnlab.kernels.q8_activations import Q8ActivationMatrix

    rng = np.random.default_rng(1)
    for qtype in ("Q4_1", "Q8_0"):
        W = Q8ActivationMatrix(quantize((rng.standard_normal((64, 256)) * 0.05).astype(np.float32), T[qtype]),
                               qtype, 256)
        rng.standard_normal((1, 256)).astype(np.float32) @ W
    out = {}
    for kernel in (_q8_fused._nibbles_groups, _q8_fused._int8_groups):
        asm = "\n".join(kernel.inspect_asm().values())
        out[kernel.__name__] = count_instructions(asm)
    return out


def elf_objects(blob: bytes):
    """The ELF object files inside a numba cache file (its pickled libraries hold them as bytes)."""
    start = blob.find(b"\x7fELF")
    while start >= 0:
        shoff, = struct.unpack_from("<Q", blob, start + 0x28)
        shentsize, shnum = struct.unpack_from("<HH", blob, start + 0x3A)
        end = start + shoff + shentsize * shnum
        yield blob[start:end]
        start = blob.find(b"\x7fELF", end)


def cache_registers(cache_dir: str) -> dict:
    """Every kernel object in numba's cache folder ``cache_dir`` disassembled (objdump): how many objects, and
    the instructions that matter summed over them."""
    totals, objects = dict.fromkeys(INSTRUCTIONS, 0), 0
    with tempfile.TemporaryDirectory() as tmp:
        for path in Path(cache_dir).rglob("*.nbc"):
            for obj in elf_objects(path.read_bytes()):
                f = Path(tmp) / "k.o"
                f.write_bytes(obj)
                asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(f)], capture_output=True,
                                     text=True).stdout
                objects += 1
                for name, n in count_instructions(asm).items():
                    totals[name] += n
    return {"objects": objects, **totals}


def sgemm_rate(kind: str, seconds: float = 0.6) -> float:
    """GFLOP/s of a prefill's float32 product on one thread, process time: (512 × 576) @ (576 × 1,536), SmolLM2's
    MLP up-projection over 512 tokens, by numpy's BLAS (``kind`` "numpy_sgemm") or torch's ("torch_sgemm")."""
    import time

    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((512, 576), dtype=np.float32)                     # (n, d_model)
    b = rng.standard_normal((576, 1536), dtype=np.float32)                    # (d_model, d_mlp)
    if kind == "torch_sgemm":
        import torch
        torch.set_num_threads(1)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        f = lambda: ta @ tb                                                    # noqa: E731
    else:
        from threadpoolctl import threadpool_limits
        threadpool_limits(1, user_api="blas")
        f = lambda: a @ b                                                      # noqa: E731
    f()
    calls, t0 = 0, time.process_time()
    while time.process_time() - t0 < seconds:
        f()
        calls += 1
    return calls * 2 * 512 * 576 * 1536 / (time.process_time() - t0) / 1e9


def kernel_rate(kind: str, where: str, seconds: float = 0.6) -> float:
    """G weights/s of one token's product on one thread, process time: ``kind`` "q8" (8-bit activations) or
    "exact" (the exact quantized kernel), on a Q4_1 (1,536 × 576) matrix that stays in L2 (``where`` "l2") or
    on 40 of 3,072 × 576 cycled, 44 MB streamed from memory ("memory")."""
    import time

    import numpy as np
    from gguf.constants import GGMLQuantizationType as T
    from gguf.quants import quantize

    from attnlab.kernels.q8_activations import Q8ActivationMatrix
    from attnlab.kernels.quantized import QuantizedMatrix

    cls = Q8ActivationMatrix if kind == "q8" else QuantizedMatrix
    rng = np.random.default_rng(0)
    d_out, count = (1536, 1) if where == "l2" else (3072, 40)
    raw = quantize((rng.standard_normal((d_out, 576)) * 0.05).astype(np.float32), T.Q4_1)   # (d_out, blocks·bytes)
    mats = [cls(raw.copy(), "Q4_1", 576) for _ in range(count)]
    x = rng.standard_normal((1, 576)).astype(np.float32)                                      # (1, 576)
    for W in mats:
        x @ W                                                                                 # loaded, warm
    calls, t0 = 0, time.process_time()
    while time.process_time() - t0 < seconds:
        for W in mats:
            x @ W
        calls += len(mats)
    return calls * d_out * 576 / (time.process_time() - t0) / 1e9


def rows(rounds: int) -> dict:
    """The goal table's rows on one thread (the module's docstring)."""
    import time

    import numpy as np

    from attnlab.cli import bench_harness as bench
    from attnlab.cli.bench_context import FilledDecoder
    from attnlab.cli.bench_model import STREAM_BYTES, smollm2_file_model, smollm2_gguf_path, transformers_model, weight_bytes
    from attnlab.cli.bench_q8 import decode_rows, prefill_rows
    from attnlab.cli.llama_process import LlamaProcess, llama_cpp_installed, llama_step

    path = smollm2_gguf_path()
    t_start = time.process_time()
    hf, torch = transformers_model(path)
    models = {"float32": smollm2_file_model(path, quantized=False), "exact": smollm2_file_model(path, quantized=True),
              "q8": smollm2_file_model(path, quantized="q8-activations")}
    out = {"rounds": rounds, "threads": 1}
    with bench.on_cores(1, torch):
        out["blas"] = bench.blas_kernel(bench.blas_info())                   # the rows' BLAS threads: one
        llama = LlamaProcess(path, threads=1, n_ctx=512 + 16) if llama_cpp_installed() else None
        try:
            out["decode_512"] = decode_rows(models["q8"], models["exact"], llama, rounds, bench.Decoder)
            out["prefill_512"] = prefill_rows(models, hf, torch, llama, 512, max(3, rounds // 2))
        finally:
            if llama is not None:
                llama.close()
        d8 = FilledDecoder(models["q8"], 2048, np.random.default_rng(2048))
        out["decode_q8_2048"] = {}
        for fa in (True, False):
            got = llama_step(path, 2048, flash_attn=fa)
            if got is None:
                break
            llama, step = got
            with llama:
                p = bench.paired(bench.cpu_seconds(d8.step), step, rounds, clock=bench.reported)
            out["decode_q8_2048"]["fa_on" if fa else "fa_off"] = {"q8_ms": p.a_ms, "llama_cpp_ms": p.b_ms,
                                                                  "ratio": p.ratio, "ratio_min": p.ratio_min,
                                                                  "ratio_max": p.ratio_max}
        del d8
        f32 = models["float32"]
        decoder = bench.Decoder(f32, 64)
        d = int(np.sqrt(STREAM_BYTES // 4))
        W = np.random.default_rng(0).standard_normal((d, d), dtype=np.float32)   # (d, d) the streaming probe
        x = np.ones((1, d), np.float32)                                           # (1, d)
        scale = weight_bytes(f32) / W.nbytes
        p = bench.paired(decoder.step, lambda: x @ W, rounds, clock=bench.cpu_call)
        out["decode_float32"] = {"ms": p.a_ms, "bound_ms": p.b_ms * scale, "ratio": p.ratio / scale,
                                 "ratio_min": p.ratio_min / scale, "ratio_max": p.ratio_max / scale,
                                 "stream_gb_s": W.nbytes / p.b_ms / 1e6, "weight_mb": weight_bytes(f32) / 1e6}
    out["process_s"] = time.process_time() - t_start
    out["load_average"] = bench.load_average()
    return out


def worker(argv) -> None:
    part = argv[0]
    if part == "rows":
        out = {"machine": machine(), "rows": rows(int(argv[1]))}
    elif part == "asm":
        out = q8_kernel_asm()
    elif part == "cache":
        out = cache_registers(argv[1])
    elif part == "rate":
        out = {"rate": sgemm_rate(argv[1]) if argv[1].endswith("sgemm") else kernel_rate(argv[1], argv[2])}
    else:
        raise SystemExit(f"unknown worker part {part!r}")
    print(json.dumps(out))


# ------------------------------------------------------------------------------------------------------------
# the parent


def goal_figures(r: dict) -> dict:
    """The rows' figures as GOALS names them (None where a side did not run)."""
    d, p, c = r["decode_512"], r["prefill_512"], r["decode_q8_2048"]
    pick = lambda x: None if x is None else x["ratio"]                                       # noqa: E731
    return {"decode_q8_512": pick(d.get("q8_vs_llama_cpp")), "decode_exact_512": pick(d.get("exact_vs_llama_cpp")),
            "decode_q8_2048_fa_on": pick(c.get("fa_on")), "decode_q8_2048_fa_off": pick(c.get("fa_off")),
            "decode_float32_bound": r["decode_float32"]["ratio"],
            "prefill_512_q8_transformers": pick(p.get("vs_transformers", {}).get("q8")),
            "prefill_512_float32_transformers": pick(p.get("vs_transformers", {}).get("float32")),
            "prefill_512_q8_llama_cpp": pick(p.get("vs_llama_cpp", {}).get("q8"))}


def span(x: dict) -> str:
    return f"{x['ratio']:.2f}x [{x['ratio_min']:.2f}-{x['ratio_max']:.2f}]"


def table(label: str, res: dict) -> list[str]:
    m, r = res["machine"], res["rows"]
    lines = [f"== {label}",
             f"CPU: {m['cpu']}; SIMD (numpy): {m['numpy_simd']} (dispatch on {m['numpy_dispatch_on']}, off "
             f"{m['numpy_dispatch_off']}); BLAS: {m['blas']}",
             f"numba target: {m['numba_target']['cpu']}, features {m['numba_target']['features']}; cache "
             f"{m['numba_target']['cache']}; q8 rule: vnni={m['q8_rule']['vnni']} vnni_512={m['q8_rule']['vnni_512']}; "
             f"numpy exp rule: {m['exp_rule']}; tune: {m['tune']}",
             f"torch: {m['torch']}; llama.cpp build: {m['llama_cpp']}",
             f"{r['rounds']} rounds on one thread (BLAS {r.get('blas', 'pinned to one thread')}), process time, "
             "alternating, medians of per-round ratios; load "
             f"average after: {r['load_average']}"]
    d = r["decode_512"]
    lines.append(f"decode ctx 512: q8 {d['q8']:.1f} ms, exact {d['exact']:.1f} ms, llama.cpp "
                 + (f"{d['llama_cpp']:.1f} ms; q8 {span(d['q8_vs_llama_cpp'])}, exact {span(d['exact_vs_llama_cpp'])}"
                    if "llama_cpp" in d else "not importable"))
    for fa, x in r["decode_q8_2048"].items():
        lines.append(f"decode ctx 2048 ({fa}): q8 {x['q8_ms']:.1f} ms, llama.cpp {x['llama_cpp_ms']:.1f} ms; {span(x)}")
    f = r["decode_float32"]
    lines.append(f"decode float32: {f['ms']:.1f} ms, bound {f['bound_ms']:.1f} ms ({f['weight_mb']:.0f} MB at "
                 f"{f['stream_gb_s']:.1f} GB/s, one thread); {span(f)}")
    p = r["prefill_512"]
    lines.append("prefill 512: " + ", ".join(f"{k} {v:.0f} ms" for k, v in p["ms"].items()))
    for ref in ("transformers", "llama_cpp"):
        if f"vs_{ref}" in p:
            lines.append(f"    vs {ref}: " + ", ".join(f"{k} {span(x)}" for k, x in p[f"vs_{ref}"].items()))
    figures = goal_figures(r)
    for case, key, bound in GOALS:
        v = figures[key]
        lines.append(f"  goal {case}: <= {bound}x: " + ("not run" if v is None else
                                                         f"{v:.2f}x {'holds' if v <= bound else 'MISSED'}"))
    return lines


def rates(rounds: int, cache_dir) -> dict:
    """The standalone kernels' G weights/s, emulated and native in alternating subprocesses: per case the medians
    and the median of the per-round ratios emulated / native."""
    import statistics

    envs = {"avx2": emulation_env(os.environ, cache_dir), "native": native_env(os.environ)}
    out = {}
    for kind, where in RATE_CASES:
        got = {"avx2": [], "native": []}
        for r in range(rounds):
            for name in (("avx2", "native") if r % 2 == 0 else ("native", "avx2")):
                got[name].append(run_worker(envs[name], "rate", kind, where)["rate"])
        ratio = [a / n for a, n in zip(got["avx2"], got["native"])]
        out[f"{kind}_{where}"] = {"avx2": statistics.median(got["avx2"]), "native": statistics.median(got["native"]),
                                  "unit": "GFLOP/s" if kind.endswith("sgemm") else "G weights/s",
                                  "ratio": statistics.median(ratio), "ratio_min": min(ratio), "ratio_max": max(ratio)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--native", action="store_true", help="the rows on this CPU as it is, not emulated")
    ap.add_argument("--kernels-only", action="store_true", help="only the kernels' rates, emulated against native")
    ap.add_argument("--cache-dir", default=str(default_cache_dir()), help="numba's cache for the emulation")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--show", metavar="FILE", help="print the tables of a run saved with --json, run nothing")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be a positive integer, got {args.rounds}")
    if args.show:
        result = json.loads(Path(args.show).read_text())
        print("\n".join(report(result, native=result.get("native", False))))
        return 0
    env = native_env(os.environ) if args.native else emulation_env(os.environ, args.cache_dir)
    result = {"native": args.native}
    if not args.native:
        with tempfile.TemporaryDirectory() as fresh:
            result["q8_asm"] = run_worker(emulation_env(os.environ, fresh), "asm")
    if not args.kernels_only:
        result["goal_rows"] = run_worker(env, "rows", str(args.rounds))
    if not args.native:
        result["kernel_rates"] = rates(args.rounds, args.cache_dir)
        result["cache"] = run_worker(env, "cache", args.cache_dir)          # every kernel the runs above compiled
    print(json.dumps(result, indent=1) if args.json else "\n".join(report(result, native=args.native)))
    return 0


def report(result: dict, *, native: bool) -> list[str]:
    """A run's tables as text lines."""
    lines = table("native (this CPU)" if native else "emulated AVX2", result["goal_rows"]) if "goal_rows" in result else []
    if "q8_asm" in result:
        lines.append("q8 kernels compiled for the emulation (fresh cache): " + "; ".join(
            f"{k}: " + ", ".join(f"{n} {c}" for n, c in v.items()) for k, v in result["q8_asm"].items()))
    if "cache" in result:
        c = result["cache"]
        lines.append(f"the emulation's numba cache ({c['objects']} kernel objects, objdump): "
                     + ", ".join(f"{n} {c[n]}" for n in INSTRUCTIONS))
    for case, x in result.get("kernel_rates", {}).items():
        lines.append(f"kernel {case}: {x['avx2']:.1f} {x.get('unit', 'G weights/s')} emulated AVX2, {x['native']:.1f} native; "
                     f"emulated/native {x['ratio']:.2f} [{x['ratio_min']:.2f}-{x['ratio_max']:.2f}]")
    return lines


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2:])
    else:
        sys.exit(main())
