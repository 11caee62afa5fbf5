"""Speed check of issue 22 (the padded-batch mask, the ActivationCache): a pass that asks for no hooks against
main, in one process: a GPT-2-shaped forward (logits only) at three lengths, and greedy generation through the
KV caches (a decode step is where a per-pass cost shows most).

    mkdir -p /tmp/main_src && git archive main src | tar -x -C /tmp/main_src
    PYTHONPATH=src python benchmarks/research_vs_main.py --old /tmp/main_src [--rounds 21] [--json]

The old tree is imported as ``attnlab_old`` (see blocks_vs_main.py). Each case alternates new and old call by
call, the first of the pair flipping every round, and reports the median of the per-round ratios new / old:
below 1.03 is within 3%. Outputs are checked equal before timing. Prints the CPU, numpy's SIMD level and the
BLAS kernel (threadpoolctl).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from attnlab.models import load_network
from attnlab.stack.transformer import forward, generate

sys.path.insert(0, str(Path(__file__).parent))
from blocks_vs_main import import_old  # noqa: E402
from stack_vs_main import alternate, gpt2_folder, machine  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", type=Path, default=Path("/tmp/main_src"), help="a tree holding main's src/")
    p.add_argument("--rounds", type=int, default=21, help="alternating rounds per case (default 21)")
    p.add_argument("--layers", type=int, default=4, help="layers of the GPT-2-shaped model (default 4)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    old = import_old(args.old)
    rows, rng = [], np.random.default_rng(2)
    with tempfile.TemporaryDirectory() as tmp:
        folder = gpt2_folder(Path(tmp) / "gpt2", n_layers=args.layers)
        new_m, old_m = load_network(folder), old["models"].load_network(folder)
        old_forward, old_generate = old["stack.transformer"].forward, old["stack.transformer"].generate
        for n in (16, 64, 384):
            ids = rng.integers(1000, 2000, n)
            # equal to float32 rounding: numba's fused tile kernel (fastmath) can round differently when the
            # two trees' arrays sit at different alignments; with ATTNLAB_NO_NUMBA=1 they agree to the bit
            np.testing.assert_allclose(forward(new_m, ids).logits, old_forward(old_m, ids).logits, rtol=0, atol=1e-5)
            r = alternate(lambda: forward(new_m, ids), lambda: old_forward(old_m, ids), args.rounds)
            rows.append({"case": f"GPT-2 {args.layers} layers forward n {n}, no hooks", **r})
        prompt = rng.integers(1000, 2000, 16)
        assert np.array_equal(generate(new_m, prompt, 32), old_generate(old_m, prompt, 32))
        r = alternate(lambda: generate(new_m, prompt, 32), lambda: old_generate(old_m, prompt, 32), args.rounds)
        rows.append({"case": f"GPT-2 {args.layers} layers generate 32 after 16 (greedy)", **r})
    report = {"machine": machine(), "rows": rows}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    m = report["machine"]
    print(f"CPU {m['cpu']}, SIMD {m['simd']}, BLAS {m['blas']}, numpy {m['numpy']}")
    for r in rows:
        print(f"{r['case']:48s} new {r['new_ms']:8.2f} ms  old {r['old_ms']:8.2f} ms  "
              f"median ratio new/old {r['ratio']:.3f}  ({r['rounds']} rounds)")


if __name__ == "__main__":
    main()
