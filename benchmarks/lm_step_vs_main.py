"""One training step of the issue-5 model, this branch against a copy of another revision, alternating, medians.

    git archive main src/attnlab | tar -x -C /tmp/old && mv /tmp/old/src/attnlab /tmp/old/attnlab_old
    PYTHONPATH=src:/tmp/old python benchmarks/lm_step_vs_main.py [--rounds 40] [--batch 16] [--context 128]

Both copies train the same weights on the same batches (forward, backward, Adam), on one BLAS thread. The old
copy is imported as ``attnlab_old`` (its imports are relative). Prints the BLAS kernel and the time ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import attnlab_old.lm.model as old_model
import attnlab_old.lm.training as old_training
from attnlab.lm.model import AttentionLM, LMConfig, loss_and_grad
from attnlab._threads import one_blas_thread
from attnlab.lm.training import AdamConfig, AdamState, adam_step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--positions", default="learned")
    args = ap.parse_args()
    from threadpoolctl import threadpool_info

    config = LMConfig(vocab_size=80, n_ctx=args.context, positions=args.positions)
    new = AttentionLM.init(config, rng=np.random.default_rng(0))
    old = old_model.AttentionLM.from_params(old_model.LMConfig(**vars(config)),
                                            {k: a.copy() for k, a in new.params().items()})
    rng = np.random.default_rng(1)
    runs = {"new": (new, loss_and_grad, adam_step, AdamState.zeros(new.params()), AdamConfig(lr=1e-3)),
            "old": (old, old_model.loss_and_grad, old_training.adam_step,
                    old_training.AdamState.zeros(old.params()), old_training.AdamConfig(lr=1e-3))}
    times = {"new": [], "old": []}
    with one_blas_thread():
        blas = [(i["internal_api"], i.get("architecture"), i["num_threads"]) for i in threadpool_info()
                if i["user_api"] == "blas"]
        for r in range(args.rounds + 2):
            ids = rng.integers(0, 80, size=(args.batch, args.context + 1))
            for name in (("new", "old") if r % 2 else ("old", "new")):
                model, lg, step, state, adam = runs[name]
                t0 = time.perf_counter()
                _, grads = lg(model, ids[:, :-1], ids[:, 1:])
                step(model.params(), grads.params(), state, adam)
                if r >= 2:                                           # two warm-up rounds
                    times[name].append(time.perf_counter() - t0)
    drift = max(float(np.abs(new.params()[k] - old.params()[k]).max()) for k in new.params())
    m_new, m_old = statistics.median(times["new"]), statistics.median(times["old"])
    print(f"BLAS: {blas}")
    print(f"batch {args.batch}, n {args.context}, {args.rounds} rounds: old {1e3 * m_old:.1f} ms, "
          f"new {1e3 * m_new:.1f} ms, new/old {m_new / m_old:.3f}; max |weights new - old| after "
          f"{args.rounds + 2} steps {drift:.2e}")


if __name__ == "__main__":
    main()
