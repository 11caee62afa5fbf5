"""attnlab's numpy BERT and GPT-2 against transformers: largest differences, and forward-pass speed.

Run:  HF_HUB_OFFLINE=1 PYTHONPATH=src python benchmarks/models_vs_transformers.py [--repeats 15]

Speed is a ratio against transformers measured in the same process, the two alternating, with medians.
Nothing downloads: MiniLM comes from its package, the GPT-2 is random and written to a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from threadpoolctl import threadpool_info  # noqa: E402

from attnlab.models import attend, load_model, load_network, minilm_path  # noqa: E402
from attnlab.stack.transformer import forward, generate  # noqa: E402

TEXTS = {
    "running example": "The cat sat on the mat",
    "guide paragraph": ("Attention closes the first gap. It rebuilds each token's vector as a weighted mix of the "
                        "vectors of the tokens around it, and it computes the weights from the tokens themselves."),
    "500 tokens": " ".join(["the cat saw the dog then the dog ran to the cat"] * 41),
}


def stack(ts):
    return np.stack([t[0].detach().numpy() for t in ts])


def minilm(repeats: int) -> None:
    ours = load_model("minilm")
    hf = transformers.BertModel.from_pretrained(str(minilm_path()), attn_implementation="eager").eval()
    for name, text in TEXTS.items():
        r = attend(text, ours)
        ids = torch.from_numpy(r.ids)[None]
        with torch.no_grad():
            o = hf(ids, output_attentions=True, output_hidden_states=True)
        da = np.abs(r.attentions.weights - stack(o.attentions)).max()
        dh = np.abs(r.hidden_states - stack(o.hidden_states)).max()
        t_ours, t_hf = [], []
        for _ in range(repeats):                        # alternate, so both see the same machine load
            t = time.perf_counter()
            forward(ours[0], r.ids)
            t_ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            with torch.no_grad():
                hf(ids, output_attentions=True, output_hidden_states=True)
            t_hf.append(time.perf_counter() - t)
        mo, mh = statistics.median(t_ours), statistics.median(t_hf)
        print(f"MiniLM {name:16s} n={len(r.ids):3d}  max|Δ attention| {da:.2e}  max|Δ hidden| {dh:.2e}  "
              f"numpy {mo * 1e3:7.1f} ms  transformers {mh * 1e3:7.1f} ms  ratio {mo / mh:.2f}")


def gpt2() -> None:
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=64, vocab_size=300,
                                      initializer_range=0.2, bos_token_id=0, eos_token_id=0)
        transformers.GPT2LMHeadModel(cfg).save_pretrained(folder)
        hf = transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager").eval()
        ours = load_network(folder)
    ids = np.random.default_rng(0).integers(0, 300, 40)
    out = forward(ours, ids, return_weights=True)
    with torch.no_grad():
        o = hf(torch.from_numpy(ids)[None], output_attentions=True, output_hidden_states=True)
        g = hf.generate(torch.from_numpy(ids[:5])[None], max_new_tokens=40, do_sample=False, pad_token_id=0,
                        eos_token_id=None)
    same = np.array_equal(generate(ours, ids[:5], 40), g[0, 5:].numpy())
    print(f"GPT-2 random 2x4x64 n=40  max|Δ attention| {np.abs(np.stack(out.attentions) - stack(o.attentions)).max():.2e}  "
          f"max|Δ hidden| {np.abs(np.stack(out.hidden_states) - stack(o.hidden_states)).max():.2e}  "
          f"max|Δ logits| {np.abs(out.logits - o.logits[0].numpy()).max():.2e} (|logits| up to "
          f"{np.abs(out.logits).max():.1f})  greedy 40 tokens identical: {same}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    print("BLAS:", [(i["internal_api"], i.get("architecture"), i["num_threads"]) for i in threadpool_info()])
    print(f"torch {torch.__version__} threads {torch.get_num_threads()}, transformers {transformers.__version__}")
    minilm(args.repeats)
    gpt2()


if __name__ == "__main__":
    main()
