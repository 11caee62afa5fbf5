"""Speed check of the stack refactor (issue 10) against the old main, in one process: the LM training step
(attnlab's own model: forward, hand-written backward, Adam), `attnlab bench`'s tiled rows, and the model
forward passes the stack took over (MiniLM, a GPT-2-shaped checkpoint, GPT-2 generation through the KV caches).

    git worktree add /tmp/oldmain e071d16          # the main the stack started from
    PYTHONPATH=src python benchmarks/stack_vs_main.py [--old /tmp/oldmain] [--rounds 31] [--json]

The old tree's ``src/attnlab`` is copied to a temporary folder as the package ``attnlab_old`` (its imports are
relative), so both versions run side by side. Each case alternates new and old call by call (which one goes
first flips every round), and reports the median of the per-round ratios new / old: below 1.05 is within 5%.
The same seed gives both the same weights and batches, and the losses are checked to agree before timing.
Prints the CPU model, numpy's SIMD level and the BLAS kernel (threadpoolctl); the LM runs with BLAS on one
thread, as `attnlab train` does.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from attnlab.kernels._threads import blas_info, one_blas_thread
from attnlab.lm.model import lm_config, loss_and_grad
from attnlab.lm.training import AdamConfig, AdamState, adam_step, sample_batch
from attnlab.layer.positions import POSITION_SCHEMES
from attnlab.stack.transformer import Transformer
from attnlab.kernels.tiled import tiled_attention, tiled_attention_grad


def import_old(tree: Path):
    """The old tree's package, imported as ``attnlab_old`` from a temporary copy."""
    src = tree / "src" / "attnlab"
    if not src.is_dir():
        raise SystemExit(f"{src} is not there; make it with: git worktree add {tree} e071d16")
    tmp = Path(tempfile.mkdtemp(prefix="attnlab_old_"))
    shutil.copytree(src, tmp / "attnlab_old")
    sys.path.insert(0, str(tmp))
    return (importlib.import_module("attnlab_old.lm.model"), importlib.import_module("attnlab_old.lm.training"),
            importlib.import_module("attnlab_old.tiled"), importlib.import_module("attnlab_old.models"))


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown")
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:                                            # numpy 1.x
        from numpy.core._multiarray_umath import __cpu_features__ as features
    simd = next((f for f in ("AVX512_SKX", "AVX512F", "AVX2", "AVX", "SSE42", "NEON", "ASIMD") if features.get(f)),
                "baseline")
    blas = [(b["internal_api"], b["architecture"], b["num_threads"]) for b in blas_info() if b["user_api"] == "blas"]
    return {"cpu": cpu, "simd": simd, "blas": blas, "numpy": np.__version__}


def alternate(new, old, rounds: int) -> dict:
    """Median of per-round time ratios new / old, calling them in turn (the first of the pair flips)."""
    new(), old()                                                   # warm-up
    ratios, t_new, t_old = [], [], []
    for r in range(rounds):
        pair = [(new, t_new), (old, t_old)]
        for f, times in (pair if r % 2 == 0 else pair[::-1]):
            t = time.perf_counter()
            f()
            times.append(time.perf_counter() - t)
        ratios.append(t_new[-1] / t_old[-1])
    return {"new_ms": 1e3 * statistics.median(t_new), "old_ms": 1e3 * statistics.median(t_old),
            "ratio": statistics.median(ratios), "rounds": rounds}


def lm_step_case(old_model, old_training, *, positions: str, n_ctx: int, batch: int, rounds: int) -> dict:
    """One training step (loss_and_grad + Adam) of the default LM shape, new stack against old main."""
    vocab = 40
    text = np.random.default_rng(5).integers(0, vocab, 4000)
    new_m = Transformer.init(lm_config(vocab, n_ctx=n_ctx, positions=POSITION_SCHEMES[positions]()),
                             rng=np.random.default_rng(0))
    old_m = old_model.AttentionLM.init(old_model.LMConfig(vocab_size=vocab, n_ctx=n_ctx, positions=positions),
                                       rng=np.random.default_rng(0))
    x, y = sample_batch(text, n_ctx, batch, np.random.default_rng(1))
    loss_new, _ = loss_and_grad(new_m, x, y)
    loss_old, _ = old_model.loss_and_grad(old_m, x, y)
    assert loss_new == loss_old, (loss_new, loss_old)             # the same weights and batch, the same float32 loss
    p_new, p_old = new_m.params(), old_m.params()
    s_new, s_old = AdamState.zeros(p_new), old_training.AdamState.zeros(p_old)
    adam = AdamConfig(lr=1e-4)                                     # small steps: the weights stay alike
    old_adam = old_training.AdamConfig(lr=1e-4)

    def new():
        _, grads = loss_and_grad(new_m, x, y)
        adam_step(p_new, grads, s_new, adam)

    def old():
        _, grads = old_model.loss_and_grad(old_m, x, y)
        old_training.adam_step(p_old, grads.params(), s_old, old_adam)

    with one_blas_thread():
        out = alternate(new, old, rounds)
    return {"case": f"LM step, {positions}, n_ctx {n_ctx}, batch {batch}", **out}


def tiled_cases(old_tiled, *, sizes, rounds: int) -> list[dict]:
    """`attnlab bench`'s tiled rows: float32, 12 heads, d_head 64, forward causal and not, and the backward."""
    rng = np.random.default_rng(0)
    out = []
    for n in sizes:
        q, k, v = (rng.standard_normal((12, n, 64), dtype=np.float32) for _ in range(3))
        for causal in (False, True):
            r = alternate(lambda: tiled_attention(q, k, v, is_causal=causal),
                          lambda: old_tiled.tiled_attention(q, k, v, is_causal=causal), rounds)
            out.append({"case": f"tiled forward n {n}{' causal' if causal else ''}", **r})
    n = sizes[0]
    q, k, v, do = (rng.standard_normal((12, n, 64), dtype=np.float32) for _ in range(4))
    r = alternate(lambda: tiled_attention_grad(q, k, v, do, is_causal=True),
                  lambda: old_tiled.tiled_attention_grad(q, k, v, do, is_causal=True), rounds)
    out.append({"case": f"tiled backward n {n} causal", **r})
    return out


def gpt2_folder(folder: Path, *, n_layers: int = 4, d: int = 768, n_heads: int = 12, vocab: int = 2000,
                n_ctx: int = 1024) -> Path:
    """A GPT-2-shaped checkpoint of random weights, in Hugging Face's names (Conv1D [in, out])."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(3)
    w = lambda *shape: rng.normal(0, 0.02, shape).astype(np.float32)   # noqa: E731
    ones, zeros = (lambda n: np.ones(n, np.float32)), (lambda n: np.zeros(n, np.float32))   # noqa: E731
    t = {"wte.weight": w(vocab, d), "wpe.weight": w(n_ctx, d), "ln_f.weight": ones(d), "ln_f.bias": zeros(d)}
    for i in range(n_layers):
        p = f"h.{i}."
        t.update({p + "ln_1.weight": ones(d), p + "ln_1.bias": zeros(d), p + "ln_2.weight": ones(d),
                  p + "ln_2.bias": zeros(d), p + "attn.c_attn.weight": w(d, 3 * d), p + "attn.c_attn.bias": w(3 * d),
                  p + "attn.c_proj.weight": w(d, d), p + "attn.c_proj.bias": w(d), p + "mlp.c_fc.weight": w(d, 4 * d),
                  p + "mlp.c_fc.bias": w(4 * d), p + "mlp.c_proj.weight": w(4 * d, d), p + "mlp.c_proj.bias": w(d)})
    folder.mkdir(parents=True, exist_ok=True)
    save_file(t, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": n_layers, "n_embd": d,
                                                    "n_head": n_heads, "n_positions": n_ctx, "vocab_size": vocab,
                                                    "activation_function": "gelu_new"}))
    return folder


def model_cases(old_models, *, rounds: int) -> list[dict]:
    """The stack's forward against the old per-family forwards (MiniLM, GPT-2), and GPT-2 generation."""
    from attnlab.models import load_network
    from attnlab.stack.transformer import forward, generate

    out = []
    rng = np.random.default_rng(2)
    folders = [("MiniLM", "minilm")]
    with tempfile.TemporaryDirectory() as tmp:
        folders.append(("GPT-2 4 layers", gpt2_folder(Path(tmp) / "gpt2")))
        for label, folder in folders:
            new_m, old_m = load_network(folder), old_models.load_network(folder)
            for n in (64, 384):
                ids = rng.integers(1000, 2000, n)
                want = old_m(ids).hidden_states[-1]
                got = forward(new_m, ids).hidden_states[-1]
                assert np.allclose(got, want, atol=1e-4), np.abs(got - want).max()
                r = alternate(lambda: forward(new_m, ids), lambda: old_m(ids), rounds)
                out.append({"case": f"{label} forward n {n}", **r})
            if label.startswith("GPT-2"):
                prompt = rng.integers(1000, 2000, 16)
                assert np.array_equal(generate(new_m, prompt, 32), old_models.gpt2.generate(old_m, prompt, 32))
                r = alternate(lambda: generate(new_m, prompt, 32), lambda: old_models.gpt2.generate(old_m, prompt, 32),
                              rounds)
                out.append({"case": f"{label} generate 32 after 16 (greedy)", **r})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", type=Path, default=Path("/tmp/oldmain"), help="a checkout of the old main")
    p.add_argument("--rounds", type=int, default=31, help="alternating rounds per LM case (default 31)")
    p.add_argument("--tiled-rounds", type=int, default=9, help="alternating rounds per tiled case (default 9)")
    p.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048], help="tiled sizes (default 1024 2048)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    old_model, old_training, old_tiled, old_models = import_old(args.old)
    rows = [lm_step_case(old_model, old_training, positions=pos, n_ctx=ctx, batch=16, rounds=args.rounds)
            for pos, ctx in (("learned", 32), ("rope", 32), ("alibi", 128))]
    rows += tiled_cases(old_tiled, sizes=args.sizes, rounds=args.tiled_rounds)
    rows += model_cases(old_models, rounds=args.tiled_rounds)
    report = {"machine": machine(), "rows": rows}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    m = report["machine"]
    print(f"CPU {m['cpu']}, SIMD {m['simd']}, BLAS {m['blas']}, numpy {m['numpy']}")
    for r in rows:
        print(f"{r['case']:40s} new {r['new_ms']:8.2f} ms  old {r['old_ms']:8.2f} ms  "
              f"median ratio new/old {r['ratio']:.3f}  ({r['rounds']} rounds)")


if __name__ == "__main__":
    main()
