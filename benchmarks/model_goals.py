"""The two goals of issue 11 that `attnlab bench` does not time: MiniLM's ``attend`` on 494 tokens against
transformers, and a training step of attnlab's attention LM against the same model in PyTorch.

    HF_HUB_OFFLINE=1 PYTHONPATH=src python benchmarks/model_goals.py [--rounds 15] [--cores N] [--json]

Timed as `attnlab bench` times (:func:`attnlab.cli.bench_harness.paired`): the pair alone, alternating, one ratio
attnlab / reference per round; the median and min-max of those ratios. Goals: MiniLM ``attend`` with the
weights returned <= 1.0x transformers; the LM step <= 1.2x torch.

- MiniLM: ``attnlab.models.attend`` (tokenize, forward with every head's weights, the AttentionMap) and the
  bare ``forward(..., return_weights=True)``, each against ``BertModel(ids, output_attentions=True,
  output_hidden_states=True)`` with eager attention (the only one that returns weights); both use every
  core (``--cores`` pins them, as ``attnlab bench --cores`` does). The outputs are checked to agree first.
- LM step: ``loss_and_grad`` + ``adam_step`` on the shape ``attnlab train`` and benchmarks/train_guide.py
  use (2 layers × 4 heads, d_model 64, RoPE, context 128, batch 16), against tests/_torch_reference.py's
  model with ``torch.optim.Adam``. attnlab runs BLAS on one thread, as ``attnlab train`` does; torch runs
  once on one thread and once on every core. The losses are checked to agree first.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from attnlab.cli import bench_harness as bench  # noqa: E402
from attnlab.kernels._threads import one_blas_thread  # noqa: E402
from attnlab.lm.model import lm_config, loss_and_grad  # noqa: E402
from attnlab.lm.training import AdamConfig, AdamState, adam_step, sample_batch  # noqa: E402
from attnlab.models import attend, load_model, minilm_path  # noqa: E402
from attnlab.layer.positions import POSITION_SCHEMES  # noqa: E402
from attnlab.stack.transformer import Transformer, forward  # noqa: E402

MINILM_TOKENS = 494
WORDS = "the cat sat on the mat while the dog watched from the door and the bird sang in the tree".split()


def text_of(tokenizer, n_tokens: int) -> str:
    """Words from WORDS, as many as make ``n_tokens`` tokens with [CLS] and [SEP] (each word is one token)."""
    words = [WORDS[i % len(WORDS)] for i in range(n_tokens - 2)]
    text = " ".join(words)
    assert len(tokenizer.encode(text)) == n_tokens
    return text


def minilm_rows(rounds: int, torch) -> list[dict]:
    import transformers

    network, tokenizer = pair = load_model("minilm")
    hf = transformers.BertModel.from_pretrained(str(minilm_path()), attn_implementation="eager").eval()
    text = text_of(tokenizer, MINILM_TOKENS)
    r = attend(text, pair)
    ids = torch.from_numpy(r.ids)[None]
    with torch.no_grad():
        o = hf(ids, output_attentions=True, output_hidden_states=True)
    agree = {"max_abs_weights": float(np.abs(r.attentions.weights - np.stack([a[0].numpy() for a in o.attentions])).max()),
             "max_abs_hidden": float(np.abs(r.hidden_states - np.stack([h[0].numpy() for h in o.hidden_states])).max())}

    def theirs():
        with torch.no_grad():
            hf(ids, output_attentions=True, output_hidden_states=True)

    rows = []
    for case, ours in ((f"MiniLM attend, {MINILM_TOKENS} tokens (tokenize, forward with weights, map)",
                        lambda: attend(text, pair)),
                       (f"MiniLM forward(return_weights=True), {MINILM_TOKENS} tokens",
                        lambda: forward(network, r.ids, return_weights=True))):
        rows.append({"case": case, "reference": f"transformers {transformers.__version__} BertModel, eager, "
                     f"{torch.get_num_threads()} threads", **asdict(bench.paired(ours, theirs, rounds)), **agree})
    return rows


def torch_reference():
    """tests/_torch_reference.py, loaded by path (a test helper, not part of the package)."""
    path = Path(__file__).resolve().parents[1] / "tests" / "_torch_reference.py"
    spec = importlib.util.spec_from_file_location("_torch_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def lm_rows(rounds: int, torch) -> list[dict]:
    ref = torch_reference()
    vocab, n_ctx, batch = 60, 128, 16
    model = Transformer.init(lm_config(vocab, n_ctx=n_ctx, positions=POSITION_SCHEMES["rope"]()),
                             rng=np.random.default_rng(0))
    text = np.random.default_rng(1).integers(0, vocab, 20_000)
    x, y = sample_batch(text, n_ctx, batch, np.random.default_rng(2))
    params, state, adam = model.params(), AdamState.zeros(model.params()), AdamConfig(lr=1e-5)
    t_params = ref.torch_params(model)
    opt = torch.optim.Adam(list(t_params.values()), lr=1e-5)      # small steps: both stay near the same weights
    loss, _ = loss_and_grad(model, x, y)
    agree = abs(loss - float(ref.torch_loss(model, t_params, x, y).detach()))

    def ours():
        with one_blas_thread():
            _, grads = loss_and_grad(model, x, y)
            adam_step(params, grads, state, adam)

    def theirs():
        opt.zero_grad()
        ref.torch_loss(model, t_params, x, y).backward()
        opt.step()

    rows, threads = [], torch.get_num_threads()
    for n_threads in sorted({1, threads}):
        torch.set_num_threads(n_threads)
        try:
            p = bench.paired(ours, theirs, rounds)
        finally:
            torch.set_num_threads(threads)
        rows.append({"case": f"LM training step (2 layers x 4 heads, d_model 64, RoPE, n_ctx {n_ctx}, batch {batch})",
                     "reference": f"torch {torch.__version__}, {n_threads} thread(s); attnlab BLAS on 1 thread",
                     **asdict(p), "loss_difference": agree})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--cores", type=int, help="pin both sides to N cores, as attnlab bench --cores")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    import torch

    with bench.on_cores(args.cores, torch):
        machine = bench.machine_info(torch)
        rows = minilm_rows(args.rounds, torch) + lm_rows(args.rounds, torch)
    report = {"machine": machine, "rows": rows, "load_average": bench.load_average()}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    m = machine
    print(f"CPU {m['cpu']}; SIMD {m['simd']}; {m['cores']} cores; BLAS {bench.blas_kernel(m['blas'])}; "
          f"torch {m['torch']['version']} ({m['torch']['cpu_capability']}); tile kernel {m['tile_kernel']}")
    for r in rows:
        extra = (f"max|Δ weights| {r['max_abs_weights']:.1e}, max|Δ hidden| {r['max_abs_hidden']:.1e}"
                 if "max_abs_weights" in r else f"|Δ loss| {r['loss_difference']:.1e}")
        print(f"{r['case']}\n  vs {r['reference']}: attnlab {r['a_ms']:.1f} ms, reference {r['b_ms']:.1f} ms, "
              f"ratio {r['ratio']:.2f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}), {r['rounds']} rounds; {extra}")
    print(f"load average after: {report['load_average']}")


if __name__ == "__main__":
    main()
