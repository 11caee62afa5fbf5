"""Speed check of the block kinds and per-layer attention options (issue 24) against main, in one process: the
LM training step (attnlab's own model: forward, hand-written backward, Adam), a GPT-2-shaped forward with no
hooks, and GPT-2 generation through the KV caches.

    mkdir -p /tmp/main_src && git archive main src | tar -x -C /tmp/main_src
    PYTHONPATH=src python benchmarks/blocks_vs_main.py --old /tmp/main_src [--rounds 21] [--clock cpu] [--json]

The old tree's ``src/attnlab`` is copied to a temporary folder as the package ``attnlab_old`` (its imports are
relative), so both versions run side by side. Each case alternates new and old call by call (which one goes
first flips every round) and reports the median of the per-round ratios new / old: below 1.03 is within 3%.
The same seed gives both the same weights, and their outputs are checked to agree before timing. Prints the
CPU model, numpy's SIMD level and the BLAS kernel (threadpoolctl). On a machine shared with other jobs the
wall clock swings by ±20% round to round; ``--clock cpu`` times this process's CPU time instead (BLAS on one
thread, so the CPU time is the work done), which those jobs disturb far less.
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

from attnlab.kernels._threads import one_blas_thread
from attnlab.lm.model import lm_config, loss_and_grad
from attnlab.lm.training import AdamConfig, AdamState, adam_step, sample_batch
from attnlab.layer.positions import POSITION_SCHEMES
from attnlab.models import load_network
from attnlab.stack.transformer import Transformer, forward, generate

sys.path.insert(0, str(Path(__file__).parent))
from stack_vs_main import gpt2_folder, machine  # noqa: E402

CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}   # cpu: this process's CPU time, which the
#                                     other jobs of a shared machine disturb far less than the wall clock


def alternate(new, old, rounds: int, clock: str = "wall") -> dict:
    """Median of per-round time ratios new / old, calling them in turn (the first of the pair flips)."""
    tick = CLOCK[clock]
    new(), old()                                                   # warm-up (numba compiles, caches fill)
    ratios, t_new, t_old = [], [], []
    for r in range(rounds):
        pair = [(new, t_new), (old, t_old)]
        for f, times in (pair if r % 2 == 0 else pair[::-1]):
            t = tick()
            f()
            times.append(tick() - t)
        ratios.append(t_new[-1] / t_old[-1])
    return {"new_ms": 1e3 * statistics.median(t_new), "old_ms": 1e3 * statistics.median(t_old),
            "ratio": statistics.median(ratios), "rounds": rounds}


def import_old(tree: Path) -> dict:
    """The old tree's modules, imported as ``attnlab_old`` from a temporary copy."""
    src = tree / "src" / "attnlab"
    if not src.is_dir():
        raise SystemExit(f"{src} is not there; make it with: git archive main src | tar -x -C {tree}")
    tmp = Path(tempfile.mkdtemp(prefix="attnlab_old_"))
    shutil.copytree(src, tmp / "attnlab_old")
    sys.path.insert(0, str(tmp))
    names = ("lm.model", "lm.training", "stack.transformer", "models")
    return {n: importlib.import_module(f"attnlab_old.{n}") for n in names}


def lm_step_case(old: dict, *, positions: str, n_ctx: int, batch: int, rounds: int, clock: str = "wall") -> dict:
    """One training step (loss_and_grad + Adam) of the default LM shape."""
    vocab = 40
    text = np.random.default_rng(5).integers(0, vocab, 4000)
    om, ot, otr = old["lm.model"], old["lm.training"], old["stack.transformer"]
    new_m = Transformer.init(lm_config(vocab, n_ctx=n_ctx, positions=POSITION_SCHEMES[positions]()),
                             rng=np.random.default_rng(0))
    old_pos = importlib.import_module("attnlab_old.layer.positions").POSITION_SCHEMES[positions]()
    old_m = otr.Transformer.init(om.lm_config(vocab, n_ctx=n_ctx, positions=old_pos), rng=np.random.default_rng(0))
    x, y = sample_batch(text, n_ctx, batch, np.random.default_rng(1))
    loss_new, _ = loss_and_grad(new_m, x, y)
    loss_old, _ = om.loss_and_grad(old_m, x, y)
    assert loss_new == loss_old, (loss_new, loss_old)             # the same weights and batch, the same loss
    p_new, p_old = new_m.params(), old_m.params()
    s_new, s_old = AdamState.zeros(p_new), ot.AdamState.zeros(p_old)

    def new():
        _, grads = loss_and_grad(new_m, x, y)
        adam_step(p_new, grads, s_new, AdamConfig(lr=1e-4))

    def old_step():
        _, grads = om.loss_and_grad(old_m, x, y)
        ot.adam_step(p_old, grads, s_old, ot.AdamConfig(lr=1e-4))

    with one_blas_thread():
        return {"case": f"LM step, {positions}, n_ctx {n_ctx}, batch {batch}",
                **alternate(new, old_step, rounds, clock)}


def model_cases(old: dict, *, rounds: int, n_layers: int, clock: str = "wall") -> list[dict]:
    """A GPT-2-shaped forward (no hooks, logits only) and greedy generation, new against old."""
    out, rng = [], np.random.default_rng(2)
    with tempfile.TemporaryDirectory() as tmp:
        folder = gpt2_folder(Path(tmp) / "gpt2", n_layers=n_layers)
        new_m, old_m = load_network(folder), old["models"].load_network(folder)
        old_forward, old_generate = old["stack.transformer"].forward, old["stack.transformer"].generate
        for n in (16, 64, 384):
            ids = rng.integers(1000, 2000, n)
            got, want = forward(new_m, ids).logits, old_forward(old_m, ids).logits
            assert np.allclose(got, want, rtol=1e-5, atol=1e-5), np.abs(got - want).max()   # the copy's numba
            #                 kernels compile apart and may round a last bit differently
            r = alternate(lambda: forward(new_m, ids), lambda: old_forward(old_m, ids), rounds, clock)
            out.append({"case": f"GPT-2 {n_layers} layers forward n {n}", **r})
        prompt = rng.integers(1000, 2000, 16)
        assert np.array_equal(generate(new_m, prompt, 32), old_generate(old_m, prompt, 32))
        r = alternate(lambda: generate(new_m, prompt, 32), lambda: old_generate(old_m, prompt, 32), rounds, clock)
        out.append({"case": f"GPT-2 {n_layers} layers generate 32 after 16 (greedy)", **r})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", type=Path, default=Path("/tmp/main_src"), help="a tree holding main's src/")
    p.add_argument("--rounds", type=int, default=21, help="alternating rounds per case (default 21)")
    p.add_argument("--layers", type=int, default=4, help="layers of the GPT-2-shaped model (default 4)")
    p.add_argument("--clock", choices=sorted(CLOCK), default="wall",
                   help="wall time, or this process's CPU time (steadier on a shared machine; BLAS on one thread)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    old = import_old(args.old)
    rows = [lm_step_case(old, positions=pos, n_ctx=ctx, batch=16, rounds=args.rounds, clock=args.clock)
            for pos, ctx in (("learned", 32), ("rope", 32), ("alibi", 128))]
    if args.clock == "cpu":
        with one_blas_thread():                                    # CPU time counts every BLAS thread
            rows += model_cases(old, rounds=args.rounds, n_layers=args.layers, clock=args.clock)
    else:
        rows += model_cases(old, rounds=args.rounds, n_layers=args.layers)
    report = {"machine": machine(), "rows": rows}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    m = report["machine"]
    print(f"CPU {m['cpu']}, SIMD {m['simd']}, BLAS {m['blas']}, numpy {m['numpy']}, clock {args.clock}")
    for r in rows:
        print(f"{r['case']:48s} new {r['new_ms']:8.2f} ms  old {r['old_ms']:8.2f} ms  "
              f"median ratio new/old {r['ratio']:.3f}  ({r['rounds']} rounds)")


if __name__ == "__main__":
    main()
