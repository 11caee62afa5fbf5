"""attnlab's numpy Llama, Mistral and Qwen2 against transformers: largest differences, generation speed, and
the memory a float32 checkpoint costs to load.

Run:  HF_HUB_OFFLINE=1 PYTHONPATH=src python benchmarks/llama_vs_transformers.py [--rounds 7] [--new 200]
          [--threads N] [--skip differences speed memory]

1. Differences (issue 12's closing note): a random Llama (4 query heads, 2 KV heads, llama3 RoPE scaling),
   Mistral (1 KV head, sliding window 5) and Qwen2 (q/k/v biases, tied embeddings), each saved once in float32
   and once in bfloat16 in several shards; transformers' eager implementation loads the same files in
   float32. Largest |Δ| of attentions, hidden states and logits, and whether 40 greedy tokens agree.
2. Generation speed: a random Llama of 4 layers, width 256, 8 query heads, 2 KV heads, float32; 200 new
   tokens through attnlab's KV cache (:func:`attnlab.stack.transformer.generate`) and through transformers' ``generate``
   with its cache and its default attention (SDPA), alternating in the same process; the figure is the
   median of the per-round ratios attnlab / transformers (goal: ≤ 1.0).
3. Loading memory: a float32 checkpoint is loaded in a fresh process; its peak RSS above the process's
   RSS before loading, divided by the file's size (goal: ≤ 1.3). The file is memory-mapped, so only the
   tensors attnlab reorders or copies (W_Q, W_K) count; a forward pass then reads every page.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from threadpoolctl import threadpool_info  # noqa: E402

from attnlab.models import attend, load_network  # noqa: E402
from attnlab.stack.transformer import forward, generate  # noqa: E402

NO_SPECIAL = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
SMALL = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=512, initializer_range=0.1, **NO_SPECIAL)
MODELS = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        **SMALL, num_key_value_heads=2, rope_theta=500000.0, rms_norm_eps=1e-5,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 16})),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(
        **SMALL, num_key_value_heads=1, head_dim=8, sliding_window=5)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        **SMALL, num_key_value_heads=2, tie_word_embeddings=True, rope_theta=1000.0)),
}
SPEED = dict(vocab_size=2048, hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, max_position_embeddings=1024, **NO_SPECIAL)


def write_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["The cat sat on the mat, and the dog sat on the log."] * 4,
                            trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(folder / "tokenizer.json"))


def hf_load(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                             attn_implementation="eager").eval()


def stack(ts):
    return np.stack([t[0].detach().numpy() for t in ts])


def differences(root: Path) -> None:
    text = "The cat sat on the mat, and the dog sat on the log."
    for kind, make in MODELS.items():
        for dtype in ("float32", "bfloat16"):
            torch.manual_seed(0)
            folder = root / f"{kind}-{dtype}"
            model = make().eval()
            if dtype == "bfloat16":
                model.to(torch.bfloat16).save_pretrained(folder, max_shard_size="40KB")
            else:
                model.save_pretrained(folder)
            write_tokenizer(folder)
            shards = len(list(folder.glob("*.safetensors")))
            r = attend(text, folder)
            hf = hf_load(folder)
            ids = torch.from_numpy(r.ids)[None]
            with torch.no_grad():
                o = hf(ids, output_attentions=True, output_hidden_states=True)
                g = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False,
                                pad_token_id=0)[0, ids.shape[1]:].numpy()
            same = np.array_equal(generate(load_network(folder), r.ids, 40), g)
            print(f"{kind:8s} {dtype:9s} ({shards} file{'s' * (shards > 1)}) n={len(r.ids)}  "
                  f"max|Δ attentions| {np.abs(r.attentions.weights - stack(o.attentions)).max():.1e}  "
                  f"max|Δ hidden| {np.abs(r.hidden_states - stack(o.hidden_states)).max():.1e}  "
                  f"max|Δ logits| {np.abs(r.logits - o.logits[0].numpy()).max():.1e} "
                  f"(|logits| ≤ {np.abs(r.logits).max():.1f})  40 greedy tokens identical: {same}")


def speed(root: Path, rounds: int, n_new: int) -> None:
    torch.manual_seed(0)
    folder = root / "speed"
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**SPEED)).save_pretrained(folder)
    ours = load_network(folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()   # its default (SDPA)
    prompt = np.random.default_rng(0).integers(0, SPEED["vocab_size"], 16)
    ids = torch.from_numpy(prompt)[None]

    def run_hf():
        with torch.no_grad():
            return hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new, min_new_tokens=n_new,
                               do_sample=False, pad_token_id=0)[0, prompt.size:].numpy()

    same = np.array_equal(generate(ours, prompt, n_new), run_hf())           # also warms both up
    ratios, t_ours, t_hf = [], [], []
    for _ in range(rounds):                          # alternate, so both see the same machine load
        t = time.perf_counter()
        generate(ours, prompt, n_new)
        t_ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        run_hf()
        t_hf.append(time.perf_counter() - t)
        ratios.append(t_ours[-1] / t_hf[-1])
    print(f"generation: Llama 4 layers, width 256, 8 query / 2 KV heads, float32, prompt {prompt.size}, "
          f"{n_new} new tokens, {rounds} rounds; greedy tokens identical: {same}")
    mo, mh = statistics.median(t_ours), statistics.median(t_hf)
    print(f"  attnlab {mo * 1e3:.0f} ms ({mo / n_new * 1e3:.2f} ms/token)  "
          f"transformers {mh * 1e3:.0f} ms ({mh / n_new * 1e3:.2f} ms/token)  "
          f"median ratio {statistics.median(ratios):.2f} (per round {', '.join(f'{r:.2f}' for r in ratios)}; "
          "goal ≤ 1.0)")


MEMORY_CHILD = """
import json, sys
import numpy as np
from attnlab.models import load_network
from attnlab.stack.transformer import forward
def status(key):                  # VmRSS: resident now; VmHWM: the peak (reset by exec, unlike ru_maxrss)
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
before, peak_before = status("VmRSS"), status("VmHWM")
model = load_network(sys.argv[1])
peak_load, after_load = status("VmHWM"), status("VmRSS")
forward(model, np.arange(8))
print(json.dumps({"before": before, "peak_before": peak_before, "peak_load": peak_load, "after_load": after_load,
                  "after_forward": status("VmRSS")}))
"""


def memory(root: Path) -> None:
    """A float32 checkpoint of ~120 MB (8 layers, width 512, vocab 8192), written with numpy."""
    from safetensors.numpy import save_file

    folder = root / "memory"
    folder.mkdir()
    d, d_mlp, v, layers, h, h_kv = 512, 1408, 8192, 8, 8, 2
    config = {"model_type": "llama", "vocab_size": v, "hidden_size": d, "intermediate_size": d_mlp,
              "num_hidden_layers": layers, "num_attention_heads": h, "num_key_value_heads": h_kv,
              "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "hidden_act": "silu"}
    (folder / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(0)
    w = lambda *shape: rng.standard_normal(shape, np.float32) * 0.02   # noqa: E731
    t = {"model.embed_tokens.weight": w(v, d), "model.norm.weight": np.ones(d, np.float32), "lm_head.weight": w(v, d)}
    for i in range(layers):
        p, dh = f"model.layers.{i}.", d // h
        t.update({p + "self_attn.q_proj.weight": w(d, d), p + "self_attn.k_proj.weight": w(h_kv * dh, d),
                  p + "self_attn.v_proj.weight": w(h_kv * dh, d), p + "self_attn.o_proj.weight": w(d, d),
                  p + "mlp.gate_proj.weight": w(d_mlp, d), p + "mlp.up_proj.weight": w(d_mlp, d),
                  p + "mlp.down_proj.weight": w(d, d_mlp), p + "input_layernorm.weight": np.ones(d, np.float32),
                  p + "post_attention_layernorm.weight": np.ones(d, np.float32)})
    save_file(t, str(folder / "model.safetensors"))
    del t
    size = (folder / "model.safetensors").stat().st_size
    out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(folder)], capture_output=True, text=True,
                         check=True, env=os.environ)
    m = json.loads(out.stdout)
    mb = 1 << 20
    assert m["peak_before"] <= m["peak_load"]
    print(f"loading memory: file {size / mb:.1f} MiB; RSS before {m['before'] / mb:.1f} MiB, peak while loading "
          f"{m['peak_load'] / mb:.1f} MiB (+{(m['peak_load'] - m['before']) / mb:.1f} MiB = "
          f"{(m['peak_load'] - m['before']) / size:.2f}x the file; goal ≤ 1.3x), after loading "
          f"+{(m['after_load'] - m['before']) / mb:.1f} MiB, after a forward pass (every page read) "
          f"+{(m['after_forward'] - m['before']) / mb:.1f} MiB")


def machine() -> None:
    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
        simd = " ".join(k for k in ("SSE42", "AVX2", "FMA3", "AVX512F", "ASIMD") if features.get(k))
    except ImportError:
        simd = "?"
    print(f"CPU {cpu} ({os.cpu_count()} cores), numpy SIMD {simd}, load average {os.getloadavg()[0]:.1f}")
    print("BLAS:", [(i["internal_api"], i.get("architecture"), i["num_threads"]) for i in threadpool_info()])
    print(f"numpy {np.__version__}, torch {torch.__version__} threads {torch.get_num_threads()}, "
          f"transformers {transformers.__version__}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--new", type=int, default=200)
    p.add_argument("--skip", nargs="*", default=[], choices=["differences", "speed", "memory"])
    p.add_argument("--threads", type=int, help="threads for both numpy's BLAS and torch (default: their own)")
    args = p.parse_args()
    if args.threads:
        from threadpoolctl import threadpool_limits
        threadpool_limits(args.threads)
        torch.set_num_threads(args.threads)
    machine()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if "differences" not in args.skip:
            differences(root)
        if "speed" not in args.skip:
            speed(root, args.rounds, args.new)
        if "memory" not in args.skip:
            memory(root)
    print(f"load average after the run {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
