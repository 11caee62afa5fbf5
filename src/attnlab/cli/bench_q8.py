"""``attnlab bench --model smollm2``'s rows of issue 33 (8-bit activations, prefill): decode ms/token in the
``q8-activations`` mode against the exact quantized mode and against llama.cpp, and a 512- and 2,048-token
prefill (the last position's logits) float32, exact quantized and q8, against transformers and llama.cpp.

Times are process times (``time.process_time``: the CPU time of all the process's threads, which other work on
a loaded machine does not add to), rounds alternating between the contenders, medians of the per-round
ratios. llama.cpp runs in its own process (:class:`attnlab.cli.llama_process.LlamaProcess`), on the same file
and thread count, when ``llama_cpp`` (llama-cpp-python) is importable: ``pip install llama-cpp-python``.
"""

from __future__ import annotations

import time

import numpy as np

PREFILLS = (512, 2048)
DECODE_STEPS = 5                   # decode steps per round and contender
DECODE_CONTEXT = 512               # the prompt a decode step follows: the goal table's context (issue 33)


def cpu_seconds(f, repeat: int = 1) -> float:
    """Process seconds per call of ``f``, over ``repeat`` calls."""
    t0 = time.process_time()
    for _ in range(repeat):
        f()
    return (time.process_time() - t0) / repeat


def ratios(times: dict, a: str, b: str) -> dict:
    """The median and range of the per-round ratios times[a] / times[b]."""
    r = np.array(times[a]) / np.array(times[b])
    return {"ratio": float(np.median(r)), "ratio_min": float(r.min()), "ratio_max": float(r.max())}


def alternate(sides: dict, rounds: int) -> dict:
    """Each side (name -> a function returning its seconds for one round) once per round, in rotating order:
    the seconds of every round, by name."""
    names = list(sides)
    for name in names:
        sides[name]()                                                 # warm-up: compiled, loaded, cached
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(sides[name]())
    return times


def decode_rows(q8, exact, llama, rounds: int, decoder) -> dict:
    """Decode ms/token at a DECODE_CONTEXT-token context: q8 against exact, and each against llama.cpp (None without);
    ``decoder(model)`` has the ``step()`` of :class:`attnlab.cli.bench_harness.Decoder`."""
    d8, de = decoder(q8, DECODE_CONTEXT), decoder(exact, DECODE_CONTEXT)
    sides = {"q8": lambda: cpu_seconds(d8.step, DECODE_STEPS), "exact": lambda: cpu_seconds(de.step, DECODE_STEPS)}
    if llama is not None:
        sides["llama_cpp"] = lambda: llama.request(op="decode", context=DECODE_CONTEXT, steps=DECODE_STEPS, rounds=1)["seconds"][0]
    times = alternate(sides, rounds)
    out = {name: 1e3 * float(np.median(t)) for name, t in times.items()}
    out["q8_vs_exact"] = ratios(times, "q8", "exact")
    if llama is not None:
        out["q8_vs_llama_cpp"] = ratios(times, "q8", "llama_cpp")
        out["exact_vs_llama_cpp"] = ratios(times, "exact", "llama_cpp")
    return out


def prefill_rows(models: dict, hf, torch, llama, tokens: int, rounds: int) -> dict:
    """A ``tokens``-token prefill (logits of the last position) of each of ``models`` (name -> model), of
    transformers' model ``hf`` (None: skipped) and of llama.cpp (None: skipped): ms and the ratios to
    transformers and to llama.cpp."""
    from ..stack.transformer import forward

    ids = np.random.default_rng(0).integers(3, 49152, tokens)                     # (tokens,)
    sides = {name: (lambda m=m: cpu_seconds(lambda: forward(m, ids, logits_to_keep=1))) for name, m in models.items()}
    if hf is not None:
        t_ids = torch.tensor(ids)[None]                                           # (1, tokens)

        def theirs():
            with torch.no_grad():
                hf(t_ids, logits_to_keep=1)
        sides["transformers"] = lambda: cpu_seconds(theirs)
    if llama is not None:
        sides["llama_cpp"] = lambda: llama.request(op="prefill", tokens=tokens, rounds=1)["seconds"][0]
    times = alternate(sides, rounds)
    out = {"tokens": tokens, "ms": {name: 1e3 * float(np.median(t)) for name, t in times.items()}}
    for ref in ("transformers", "llama_cpp"):
        if ref in times:
            out[f"vs_{ref}"] = {name: ratios(times, name, ref) for name in models}
    return out


def q8_rows(path, models: dict, reference, threads: int, rounds: int, decoder, say=lambda _: None) -> dict:
    """The rows of issue 33 on SmolLM2's GGUF ``path``: ``models`` the float32, exact quantized and q8 models
    (``{"float32": …, "exact": …, "q8": …}``), ``reference`` transformers' model and torch (``(None, None)``),
    ``decoder`` :class:`attnlab.cli.bench_harness.Decoder` (passed in: bench_model imports this module)."""
    from .llama_process import LlamaProcess, llama_cpp_installed

    llama = LlamaProcess(path, threads=threads, n_ctx=max(*PREFILLS, DECODE_CONTEXT) + 16) if llama_cpp_installed() else None
    hf, torch = reference
    before = None if torch is None else torch.get_num_threads()
    try:
        if torch is not None:
            torch.set_num_threads(threads)
        say("decode: 8-bit activations, exact quantized, llama.cpp")
        out = {"llama_cpp": None if llama is None else llama.version, "threads": threads, "context": DECODE_CONTEXT,
               "decode": decode_rows(models["q8"], models["exact"], llama, rounds, decoder)}
        out["prefill"] = []
        for tokens in PREFILLS:
            say(f"prefill {tokens} tokens: float32, exact quantized, q8, transformers, llama.cpp")
            out["prefill"].append(prefill_rows(models, hf, torch, llama, tokens, max(3, rounds // 3)))
    finally:
        if llama is not None:
            llama.close()
        if before is not None:
            torch.set_num_threads(before)
    return out


def q8_table(r: dict) -> list[str]:
    """The rows as text lines."""
    d = r["decode"]
    lines = [f"decode q8 (context {r.get('context', DECODE_CONTEXT)}) {d['q8']:8.1f} ms/token   "
             f"exact quantized {d['exact']:.1f} ms   q8/exact "
             f"{d['q8_vs_exact']['ratio']:.2f}x [{d['q8_vs_exact']['ratio_min']:.2f}-{d['q8_vs_exact']['ratio_max']:.2f}]"
             f"   (process time, {r['threads']} thread(s))"]
    if r["llama_cpp"] is None:
        lines.append("llama.cpp (q8 rows): llama_cpp not importable (pip install llama-cpp-python)")
    else:
        for name in ("q8", "exact"):
            x = d[f"{name}_vs_llama_cpp"]
            lines.append(f"decode {name:5s} vs llama.cpp {r['llama_cpp']} ({d['llama_cpp']:.1f} ms/token): "
                         f"{x['ratio']:.2f}x [{x['ratio_min']:.2f}-{x['ratio_max']:.2f}]")
    for p in r["prefill"]:
        ms = p["ms"]
        text = ", ".join(f"{name} {v:.0f} ms" for name, v in ms.items())
        lines.append(f"prefill {p['tokens']:5d} tokens: {text}")
        for ref in ("transformers", "llama_cpp"):
            if f"vs_{ref}" in p:
                lines.append(f"    vs {ref}: " + ", ".join(
                    f"{name} {x['ratio']:.2f}x [{x['ratio_min']:.2f}-{x['ratio_max']:.2f}]"
                    for name, x in p[f"vs_{ref}"].items()))
    return lines
