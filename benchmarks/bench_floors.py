"""Speed of attnlab.guide.floors: a generated 10 MB UTF-8 text at k <= 8, characters and words.

    PYTHONPATH=src python benchmarks/bench_floors.py [--mb 10] [--max-k 8] [--repeats 3]

Two measurements:
1. floors on the whole text (median of --repeats runs), at char and word level.
2. Peak memory of one run (tracemalloc).
3. A ratio against the guide's own Counter loop (the reference), on a slice small enough for it,
   alternating the two and taking medians, after checking both give the same floors.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from attnlab.guide import floors  # noqa: E402


def generate_text(n_bytes: int, *, rng: np.random.Generator) -> str:
    """Zipf-distributed words from a 5,000-word vocabulary, some with accented and non-Latin letters."""
    letters = list("abcdefghijklmnopqrstuvwxyz") * 3 + list("éèüßçñøåœ") + list("αβγδλπσω") + list("日本語")
    lengths = rng.integers(1, 9, 5000)                                   # (5000,)
    vocab = np.array(["".join(rng.choice(letters, n)) for n in lengths])  # (5000,)
    rank = np.minimum(rng.zipf(1.2, n_bytes // 4), len(vocab)) - 1       # (n_words,)
    words = vocab[rank]
    text = " ".join(words.tolist())
    cut = text.encode("utf-8")[:n_bytes].decode("utf-8", errors="ignore")
    return cut


def floors_reference(text: str, max_k: int):
    """The guide's loop, verbatim apart from the range of k."""
    rows = []
    for k in range(max_k + 1):
        start = max(k, 1)
        seen = Counter((text[i - k:i], text[i]) for i in range(start, len(text)))
        context = Counter()
        for (c, ch), count in seen.items():
            context[c] += count
        floor = -sum(count * np.log(count / context[c]) for (c, ch), count in seen.items()) / sum(seen.values())
        rows.append((k, floor, len(context)))
    return rows


def timed(f):
    t = time.perf_counter()
    out = f()
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=10.0)
    ap.add_argument("--max-k", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ref-kb", type=int, default=100, help="size of the slice the reference runs on")
    args = ap.parse_args()

    from threadpoolctl import threadpool_info
    blas = [(i.get("internal_api"), i.get("architecture"), i.get("num_threads")) for i in threadpool_info()]
    print(f"numpy {np.__version__}; BLAS: {blas} (floors sorts and counts; it calls no BLAS)")

    text = generate_text(int(args.mb * 2**20), rng=np.random.default_rng(0))
    print(f"text: {len(text.encode('utf-8')):,} bytes UTF-8, {len(text):,} characters, "
          f"{len(set(text))} distinct characters, {len(text.split()):,} words")

    for level in ("char", "word"):
        times = []
        for _ in range(args.repeats):
            t, rows = timed(lambda: floors(text, args.max_k, level=level))
            times.append(t)
        print(f"floors {level:4} k=0..{args.max_k}: median {statistics.median(times):.2f} s "
              f"(runs {', '.join(f'{t:.2f}' for t in times)}); "
              f"k={rows[-1].k} floor {rows[-1].floor:.3f} over {rows[-1].n_contexts:,} contexts")

    import tracemalloc                                                   # numpy reports its buffers to it
    for level in ("char", "word"):
        tracemalloc.start()
        floors(text, args.max_k, level=level)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"floors {level:4} peak memory {peak / 2**20:.0f} MiB (tracemalloc)")

    small = text[: args.ref_kb * 1024]
    ours, ref = [], []
    for _ in range(args.repeats):                                        # alternate the two
        t, got = timed(lambda: floors(small, args.max_k))
        ours.append(t)
        t, want = timed(lambda: floors_reference(small, args.max_k))
        ref.append(t)
    assert [(r.k, r.n_contexts) for r in got] == [(k, n) for k, _, n in want]
    assert np.allclose([r.floor for r in got], [f for _, f, _ in want], atol=1e-10)
    print(f"on {len(small):,} characters, k=0..{args.max_k}: guide's Counter loop median "
          f"{statistics.median(ref):.3f} s, floors median {statistics.median(ours):.3f} s, "
          f"ratio {statistics.median(ref) / statistics.median(ours):.0f}x (same floors)")


if __name__ == "__main__":
    main()
