"""Does attention use context? Train the model on the guide itself and compare held-out losses.

    PYTHONPATH=src python benchmarks/train_guide.py [--steps 1500] [--positions rope] [--json]

(the same model as `attnlab train attention-guide.txt --positions rope --context 128 --steps 1500 --lr 0.01
--weight-decay 1.0`, which uses the same seed and therefore trains the same weights)

The guide (27 KB, character level) is split into a training head and a held-out tail (10 %). The model is
set beside count-based predictors with k = 1 and k = 2 characters of context, fitted on the same training
head with add-α smoothing: α = 0.1 (the CLI's) and, to favour the counts, the α that is best on the
held-out tail itself. The n-gram floors of both parts are shown too; the held-out one is an optimistic
bound (it knows the held-out counts).

Throughput: the training run's tokens per second, and a same-process comparison of one training step
(forward, backward, Adam) against the same model in PyTorch (tests/_torch_reference.py, torch.optim.Adam),
alternating the two, medians. Both run on one thread (BLAS and torch): this model's matrices are small.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from attnlab.lm.addalpha import add_alpha_loss
from attnlab.lm.compare import ALPHA, loss_beside_counts
from attnlab.kernels._threads import one_blas_thread
from attnlab.lm.model import lm_config, loss_and_grad
from attnlab.lm.training import (AdamConfig, AdamState, adam_step, cosine_decay, evaluate, sample_batch,
                                 split_heldout, training_steps)
from attnlab.text.ngrams import read_utf8
from attnlab.layer.positions import POSITION_SCHEMES
from attnlab.stack.transformer import Transformer
from attnlab.text.tokens import Vocab

GUIDE = Path("/work/shared/guide/attention-guide.txt")
ALPHAS = (0.003, 0.01, 0.03, 0.1, 0.3, 1.0)


def best_alpha(vocab: Vocab, train: np.ndarray, heldout: np.ndarray) -> dict:
    """For k = 1, 2, 3: the α in ALPHAS with the lowest held-out loss, and that loss (this favours the counts)."""
    out = {}
    for k in (1, 2, 3):
        on_heldout = {a: add_alpha_loss(train, heldout, k, vocab_size=vocab.size, alpha=a) for a in ALPHAS}
        best = min(on_heldout, key=on_heldout.get)
        out[k] = {"alpha": best, "heldout": on_heldout[best]}
    return out


def torch_reference():
    """tests/_torch_reference.py, loaded by path (a test helper, not part of the package)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "tests" / "_torch_reference.py"
    spec = importlib.util.spec_from_file_location("_torch_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def step_time_vs_torch(model: Transformer, train: np.ndarray, batch: int, rounds: int) -> dict:
    """Median seconds of one training step, numpy (ours) and torch, alternating; both on one thread."""
    import torch

    ref = torch_reference()
    torch_loss, torch_params = ref.torch_loss, ref.torch_params

    torch.set_num_threads(1)
    rng = np.random.default_rng(1)
    params, state = model.params(), AdamState.zeros(model.params())
    t_params = torch_params(model)
    opt = torch.optim.Adam(list(t_params.values()), lr=1e-3)
    ours, theirs = [], []
    for _ in range(rounds):
        x, y = sample_batch(train, model.config.n_ctx, batch, rng)
        t0 = time.perf_counter()
        _, grads = loss_and_grad(model, x, y)
        adam_step(params, grads, state, AdamConfig(lr=1e-3))
        ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        opt.zero_grad()
        torch_loss(model, t_params, x, y).backward()
        opt.step()
        theirs.append(time.perf_counter() - t0)
    m_ours, m_theirs = statistics.median(ours), statistics.median(theirs)
    tokens = batch * model.config.n_ctx
    return {"numpy_ms": 1e3 * m_ours, "torch_ms": 1e3 * m_theirs, "numpy_tokens_per_s": tokens / m_ours,
            "torch_tokens_per_s": tokens / m_theirs, "numpy_over_torch_time": m_ours / m_theirs, "rounds": rounds,
            "torch_version": torch.__version__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", default=str(GUIDE))
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--positions", default="rope", choices=list(POSITION_SCHEMES))
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--block", default="attention", choices=("attention", "gpt"),
                    help="gpt: pre-norm blocks with an MLP (nanoGPT's); its step against torch is in "
                         "benchmarks/backward_vs_torch.py")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--weight-decay", type=float, default=1.0)
    ap.add_argument("--schedule", default="cosine", choices=("constant", "cosine"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--torch-rounds", type=int, default=30, help="0 skips the comparison with torch")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from threadpoolctl import threadpool_info

    text = read_utf8(args.file)
    vocab = Vocab.from_text(text)
    train, heldout = split_heldout(vocab.encode(text), 0.1)
    report = {"file": args.file, "chars": len(text), "vocab": vocab.size, "train_tokens": int(train.size),
              "heldout_tokens": int(heldout.size), "add_alpha_best": best_alpha(vocab, train, heldout)}
    config = lm_config(vocab.size, d_model=args.d_model, n_heads=args.heads, n_layers=args.layers,
                       n_ctx=args.context, positions=POSITION_SCHEMES[args.positions](), block=args.block)
    rng = np.random.default_rng(args.seed)
    model = Transformer.init(config, rng=rng)
    curve, tokens = [], 0
    with one_blas_thread():
        report["blas"] = [{k: i.get(k) for k in ("internal_api", "version", "architecture", "num_threads")}
                          for i in threadpool_info()]
        t0 = time.perf_counter()
        for s in training_steps(model, train, steps=args.steps, batch_size=args.batch, rng=rng,
                                adam=AdamConfig(lr=args.lr, weight_decay=args.weight_decay),
                                schedule=cosine_decay(args.steps) if args.schedule == "cosine" else None):
            tokens += s.tokens
            if s.step % args.eval_every == 0 or s.step == args.steps:
                train_s = time.perf_counter() - t0
                curve.append({"step": s.step, "batch_loss": s.loss, "heldout": evaluate(model, heldout)})
                if not args.json:
                    print(f"step {s.step:5d}  batch loss {s.loss:.3f}  held-out {curve[-1]['heldout']:.3f}", flush=True)
                t0 = time.perf_counter() - train_s           # evaluation time is not training time
        seconds = time.perf_counter() - t0
        report["model"] = {"config": config.to_json(), "steps": args.steps, "batch": args.batch, "lr": args.lr,
                           "weight_decay": args.weight_decay, "schedule": args.schedule, "seed": args.seed, "params": model.n_params,
                           "curve": curve, "train_seconds": seconds, "tokens_per_s": tokens / seconds}
        report["comparison"] = loss_beside_counts(model, vocab, train, heldout, ks=(1, 2, 3))
        report["step_vs_torch"] = None
        if args.torch_rounds > 0 and args.block == "attention":   # the torch reference is attention-only
            try:
                report["step_vs_torch"] = step_time_vs_torch(model, train, args.batch, args.torch_rounds)
            except ImportError:
                pass                                          # no torch: no reference
    if args.json:
        print(json.dumps(report, indent=1))
        return
    m, c, best = report["model"], report["comparison"], report["add_alpha_best"]
    print(f"\n{args.file}: {len(text):,} characters, {vocab.size} symbols; train {train.size:,}, held-out {heldout.size:,}")
    print(f"BLAS while training: {report['blas']}")
    print(f"model: {args.layers} layers x {args.heads} heads, d_model {args.d_model}, context {args.context}, "
          f"{args.positions}, {m['params']:,} parameters, {args.steps} steps of {args.batch} windows")
    rows = [(f"{args.block} model", c["train"]["model"], c["heldout"]["model"])]
    for k in (1, 2, 3):
        rows.append((f"add-α counts, k = {k}, α = {ALPHA} (the CLI's)", c["train"]["add_alpha"][k],
                     c["heldout"]["add_alpha"][k]))
        rows.append((f"add-α counts, k = {k}, α = {best[k]['alpha']} (best on held-out)", None, best[k]["heldout"]))
    for k in range(4):
        rows.append((f"floor, k = {k} (held-out column: optimistic bound)", c["train"]["floors"][k],
                     c["heldout"]["floors"][k]))
    print(f"{'predictor':58s} {'train':>7s} {'held-out':>9s}")
    for label, tr, ho in rows:
        print(f"{label:58s} {'' if tr is None else f'{tr:.3f}':>7s} {ho:9.3f}")
    print(f"training throughput: {m['tokens_per_s']:,.0f} tokens/s ({m['train_seconds']:.1f} s)")
    t = report["step_vs_torch"]
    if t:
        print(f"one step (B={args.batch}, n={args.context}), medians of {t['rounds']} alternating rounds, 1 thread: "
              f"numpy {t['numpy_ms']:.1f} ms ({t['numpy_tokens_per_s']:,.0f} tokens/s), torch {t['torch_version']} "
              f"{t['torch_ms']:.1f} ms ({t['torch_tokens_per_s']:,.0f} tokens/s); numpy/torch time "
              f"{t['numpy_over_torch_time']:.2f}")


if __name__ == "__main__":
    main()
