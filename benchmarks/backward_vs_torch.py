"""A training step of a GPT-style model, attnlab's hand-written backward against torch autograd.

    PYTHONPATH=src python benchmarks/backward_vs_torch.py [--rounds 15] [--threads 1] [--json]

The model: GPT-2's blocks (pre-norm LayerNorm, gelu_new MLP 4 × d_model, tied unembedding), 4 layers,
d_model 128, 4 heads, context 128, batch 16: a random ``transformers.GPT2LMHeadModel`` (no dropout, sdpa
attention) written by ``save_pretrained`` and read by attnlab, so both sides hold the same float32 weights.

Measured, in one process, alternating the two sides, medians of per-round ratios (the machine is noisy):
- a whole step (loss, every gradient, Adam's update) against torch's (forward, ``backward()``,
  ``torch.optim.Adam``) on the same number of threads (BLAS and torch), and the losses' difference;
- the backward's cost over its forward: attnlab's ``forward(..., tape=)`` + cross-entropy against the rest of
  ``loss_and_grad``; torch's ``backward()`` over its forward, for reference;
- memory a step keeps for its backward: the bytes of attnlab's tape (every saved array's buffer once, the
  weights left out) and of the tensors torch's autograd saves (``saved_tensors_hooks``, each storage once,
  the parameters left out).
Printed with the CPU, its SIMD level and the BLAS kernel (threadpoolctl).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from attnlab.cli.bench_harness import blas_kernel, machine_info
from attnlab.layer.tape import Tape
from attnlab.lm.model import cross_entropy, loss_and_grad
from attnlab.lm.training import AdamConfig, AdamState, adam_step
from attnlab.models import load_network
from attnlab.stack.transformer import Transformer, forward

V, LAYERS, D, HEADS, CTX, BATCH = 96, 4, 128, 4, 128, 16


def gpt(folder: Path):
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=LAYERS, n_head=HEADS, n_embd=D, n_positions=CTX, vocab_size=V,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(folder)
    hf = transformers.GPT2LMHeadModel.from_pretrained(folder, attn_implementation="sdpa")
    ours = load_network(folder)                          # read-only views of the file: copied to train them
    return Transformer.from_params(ours.config, {k: np.array(v) for k, v in ours.params().items()}), hf.train()


def array_bytes(obj, skip: set, seen: set) -> int:
    """Bytes of every array buffer reachable from obj (dataclasses, dicts, tuples, lists), each buffer once,
    the arrays whose ids are in ``skip`` left out."""
    if isinstance(obj, np.ndarray):
        root = obj
        while isinstance(root.base, np.ndarray):
            root = root.base
        if id(root) in seen or id(root) in skip or id(obj) in skip:
            return 0
        seen.add(id(root))
        return root.nbytes
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(array_bytes(getattr(obj, f.name), skip, seen) for f in dataclasses.fields(obj))
    if isinstance(obj, dict):
        return sum(array_bytes(v, skip, seen) for v in obj.values())
    if isinstance(obj, (tuple, list)):
        return sum(array_bytes(v, skip, seen) for v in obj)
    return 0


def torch_saved_bytes(hf, ids, targets) -> int:
    import torch

    params = {p.untyped_storage().data_ptr() for p in hf.parameters()}
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        torch_loss(hf, ids, targets)
    return sum(seen.values())


def torch_loss(hf, ids, targets):
    import torch

    logits = hf(torch.from_numpy(ids)).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), torch.from_numpy(targets).reshape(-1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import torch
    from threadpoolctl import threadpool_info, threadpool_limits

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp, threadpool_limits(args.threads, user_api="blas"):
        model, hf = gpt(Path(tmp) / "gpt2")
        rng = np.random.default_rng(0)
        params, state, adam = model.params(), AdamState.zeros(model.params()), AdamConfig(lr=1e-4)
        opt = torch.optim.Adam(hf.parameters(), lr=1e-4)
        ids = rng.integers(0, V, (BATCH, CTX + 1))
        x, y = ids[:, :-1], ids[:, 1:]
        ours_loss, _ = loss_and_grad(model, x, y)
        theirs_loss = torch_loss(hf, x, y).item()
        weights = {id(a) for a in params.values()}
        tape = Tape()
        forward(model, x, tape=tape)
        kept = {"attnlab_tape_bytes": array_bytes(tape.saved, weights, set()),
                "torch_saved_bytes": torch_saved_bytes(hf, x, y)}
        step, fwd, bwd_ratio, t_fwd_ratio = [], [], [], []
        ms = {"attnlab_step": [], "torch_step": [], "attnlab_forward": [], "torch_forward": []}
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            tape = Tape()
            cross_entropy(forward(model, x, tape=tape).logits, y)
            t_f = time.perf_counter() - t0
            del tape
            t0 = time.perf_counter()
            _, grads = loss_and_grad(model, x, y)
            adam_step(params, grads, state, adam)
            t_ours = time.perf_counter() - t0
            t0 = time.perf_counter()
            loss = torch_loss(hf, x, y)
            t_tf = time.perf_counter() - t0
            opt.zero_grad()
            loss.backward()
            t_tb = time.perf_counter() - t0 - t_tf
            opt.step()
            t_theirs = time.perf_counter() - t0
            step.append(t_ours / t_theirs)
            bwd_ratio.append((t_ours - t_f) / t_f)          # the rest of the step (backward + Adam) over the forward
            t_fwd_ratio.append(t_tb / t_tf)
            fwd.append(t_f / t_tf)
            for k, v in (("attnlab_step", t_ours), ("torch_step", t_theirs), ("attnlab_forward", t_f),
                         ("torch_forward", t_tf)):
                ms[k].append(1e3 * v)
        info = machine_info(torch)
        report = {"shape": {"layers": LAYERS, "d_model": D, "heads": HEADS, "context": CTX, "batch": BATCH, "vocab": V},
                  "threads": args.threads, "rounds": args.rounds,
                  "loss": {"attnlab": ours_loss, "torch": theirs_loss, "abs_difference": abs(ours_loss - theirs_loss)},
                  "step_time_ratio_attnlab_over_torch": statistics.median(step),
                  "forward_time_ratio_attnlab_over_torch": statistics.median(fwd),
                  "attnlab_backward_and_adam_over_forward": statistics.median(bwd_ratio),
                  "torch_backward_over_forward": statistics.median(t_fwd_ratio),
                  "median_ms": {k: statistics.median(v) for k, v in ms.items()}, "memory": kept,
                  "cpu": info["cpu"], "simd": info["simd"], "torch_cpu_capability": info["torch"]["cpu_capability"],
                  "blas": blas_kernel(threadpool_info())}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    r = report
    print(f"{r['cpu']}, SIMD {r['simd']} (torch: {r['torch_cpu_capability']}), BLAS {r['blas']}, "
          f"{args.threads} thread(s) both sides, {args.rounds} alternating rounds")
    print(f"GPT-2 blocks {LAYERS} layers, d_model {D}, {HEADS} heads, context {CTX}, batch {BATCH}")
    print(f"loss: attnlab {r['loss']['attnlab']:.7f}, torch {r['loss']['torch']:.7f}, "
          f"difference {r['loss']['abs_difference']:.1e}")
    m = r["median_ms"]
    print(f"step: attnlab {m['attnlab_step']:.1f} ms, torch {m['torch_step']:.1f} ms; median per-round ratio "
          f"{r['step_time_ratio_attnlab_over_torch']:.2f} (goal <= 1.2)")
    print(f"forward: attnlab {m['attnlab_forward']:.1f} ms, torch {m['torch_forward']:.1f} ms; "
          f"attnlab backward + Adam over its forward {r['attnlab_backward_and_adam_over_forward']:.2f} (goal <= 2.5), "
          f"torch backward over forward {r['torch_backward_over_forward']:.2f}")
    print(f"kept for the backward: attnlab {kept['attnlab_tape_bytes'] / 2**20:.1f} MiB, "
          f"torch autograd {kept['torch_saved_bytes'] / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
