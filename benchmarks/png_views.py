"""Time and size of the PNG views for a long input (medians of a few runs; the grids are downscaled).

    PYTHONPATH=src python benchmarks/png_views.py [--tokens 512] [--layers 12] [--heads 12] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from attnlab import AttentionConfig
from attnlab.viz import demo_map, save_head, save_layer, save_model_view


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    amap = demo_map([f"t{i}" for i in range(args.tokens)], rng=np.random.default_rng(0), n_layers=args.layers,
                    config=AttentionConfig(d_model=8 * args.heads, n_heads=args.heads))
    out = Path(tempfile.mkdtemp())
    views = {"head": lambda p: save_head(p, amap.head(0, 0), amap.tokens, keep=amap.keep),
             "layer": lambda p: save_layer(p, amap, 0),
             "model view": lambda p: save_model_view(p, amap)}
    import matplotlib.image as mpimg
    for name, draw in views.items():
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            draw(out / "x.png")
            times.append(time.perf_counter() - t0)
        h, w = mpimg.imread(out / "x.png").shape[:2]
        print(f"{name:10s} {args.layers}x{args.heads}x{args.tokens}: median {statistics.median(times):.2f} s, "
              f"{w}x{h} px, {(out / 'x.png').stat().st_size / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
