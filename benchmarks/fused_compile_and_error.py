"""Two figures of the fused path (issue 11): its first-call compile time, and its largest error against a
float64 reference, beside the numpy path's.

    PYTHONPATH=src python benchmarks/fused_compile_and_error.py [--json]

Compile time: two fresh processes share an empty numba cache folder (NUMBA_CACHE_DIR). Each calls every
path that runs numba code (tiled forward, naive softmax, tiled backward; float32, then the tiled forward in
float16 and float64, which compile their own versions) twice; the first call's extra time over the second
is what compiling (first process) or loading from the disk cache (second process) costs. Importing numba
is timed apart.

Error: attention computed by attnlab (``attention`` and ``attention_grad``, the front door: the path and
kernel it picks are named) on float16/32/64 inputs, against plain numpy in float64 on the same inputs (the
inputs cast exactly, so the reference is the exact answer for them): every mask kind, a window, fully
masked rows, extreme scores. Each case runs on both kernels: "fused" (numba) and "numpy"
(ATTNLAB_NO_NUMBA=1). The figure is max |out - ref| / max |ref|.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from attnlab import attention, attention_grad
from attnlab.kernels._kernels import NO_NUMBA_ENV, numba_version
from attnlab.kernels.attention import attention_path
from attnlab.cli.bench_harness import blas_kernel, cpu_flags, cpu_model, simd_level
from attnlab.kernels._threads import blas_info

SRC = Path(__file__).resolve().parents[1] / "src"

FIRST_CALLS = r"""
import json, time
import numpy as np
t = time.perf_counter()
import numba
numba_import = time.perf_counter() - t
from attnlab import attention, attention_grad
rng = np.random.default_rng(0)
q, k, v, do = (rng.standard_normal((12, 1024, 64), dtype=np.float32) for _ in range(4))
calls = {
    "tiled forward, float32": lambda: attention(q, k, v, is_causal=True),
    "naive fused softmax, float32": lambda: attention(q[:, :100], k[:, :100], v[:, :100], is_causal=True),
    "tiled backward, float32": lambda: attention_grad(q, k, v, do, is_causal=True),
    "tiled forward, float16": lambda: attention(*(x.astype(np.float16) for x in (q, k, v)), is_causal=True),
    "tiled forward, float64": lambda: attention(*(x.astype(np.float64) for x in (q, k, v)), is_causal=True),
}
out = {"numba_import_s": numba_import}
for name, f in calls.items():
    t = time.perf_counter(); f(); first = time.perf_counter() - t
    t = time.perf_counter(); f(); second = time.perf_counter() - t
    out[name] = {"first_s": first, "second_s": second, "extra_s": first - second}
print(json.dumps(out))
"""


def first_call_costs() -> dict:
    """The first calls' extra time in a process that compiles (empty cache) and in one that loads."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "PYTHONPATH": str(SRC), "NUMBA_CACHE_DIR": cache}
        env.pop(NO_NUMBA_ENV, None)
        runs = [json.loads(subprocess.run([sys.executable, "-c", FIRST_CALLS], env=env, capture_output=True,
                                          text=True, check=True).stdout) for _ in range(2)]
    return {"compiling (empty cache)": runs[0], "loading (second process)": runs[1]}


# ----------------------------------------------------------------------------------------------------
# errors


def reference(q, k, v, keep, scale):
    """softmax(q kᵀ · scale, masked) v in float64, a row with nothing visible giving 0; and the weights."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s = np.where(keep, q @ np.swapaxes(k, -1, -2) * scale, -np.inf)       # (h, n, n)
    m = s.max(-1, keepdims=True)                                          # (h, n, 1)
    p = np.exp(s - np.where(np.isfinite(m), m, 0))                        # (h, n, n)
    l = p.sum(-1, keepdims=True)                                          # (h, n, 1)
    a = np.divide(p, l, out=np.zeros_like(p), where=l > 0)               # (h, n, n)
    return a @ v, a


def reference_grad(q, k, v, do, keep, scale):
    """(dq, dk, dv) of sum(out · do) in float64 (the softmax's backward written out)."""
    q, k, v, do = (x.astype(np.float64) for x in (q, k, v, do))
    _, a = reference(q, k, v, keep, scale)                                # (h, n, n)
    dv = np.swapaxes(a, -1, -2) @ do                                      # (h, n, d)
    da = do @ np.swapaxes(v, -1, -2)                                      # (h, n, n)
    ds = a * (da - (da * a).sum(-1, keepdims=True))                      # (h, n, n)
    return ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv


def keep_of(kind: str, n: int, rng) -> tuple[np.ndarray, dict]:
    """(n, n) bool, True = may attend, and the attention() arguments that say the same."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    if kind == "none":
        return np.ones((n, n), bool), {}
    if kind == "causal":
        return j <= i, {"is_causal": True}
    if kind == "window 64":
        return (j <= i) & (j > i - 64), {"is_causal": True, "window": 64}
    dense = rng.random((n, n)) < 0.5
    if kind == "dense mask, 1 row in 8 fully masked":
        dense[::8] = False
        return dense, {"mask": dense}
    raise ValueError(kind)


KINDS = ("none", "causal", "window 64", "dense mask, 1 row in 8 fully masked")


def rel(x, ref) -> float:
    return float(np.abs(x.astype(np.float64) - ref).max() / np.abs(ref).max())


def error_rows(n: int, heads: int = 12, d: int = 64) -> list[dict]:
    rng = np.random.default_rng(n)
    rows = []
    for spread in (1.0, 30.0):                          # 30: scores in the thousands, one key takes each row
        q, k, v, do = (rng.standard_normal((heads, n, d)) for _ in range(4))
        q = q * spread
        for kind in KINDS:
            keep, kw = keep_of(kind, n, rng)
            scale = 1 / np.sqrt(d)
            for dtype in (np.float16, np.float32, np.float64):
                if dtype == np.float16 and spread > 1:
                    continue                            # scores in the thousands: beyond what float16 is for
                x = [t.astype(dtype) for t in (q, k, v, do)]
                x64 = [t.astype(np.float64) for t in x]   # the inputs as this dtype holds them, exactly
                ref = reference(*x64[:3], keep, scale)[0]
                with_grad = spread == 1.0 and n >= 128 and dtype != np.float16
                g64 = reference_grad(*x64, keep, scale) if with_grad else None
                for kernel in ("fused", "numpy"):
                    os.environ[NO_NUMBA_ENV] = "0" if kernel == "fused" else "1"
                    path = attention_path(*x[:3], **kw)
                    row = {"n": n, "spread": spread, "kind": kind, "dtype": np.dtype(dtype).name, "kernel": kernel,
                           "path": path.name, "forward": rel(attention(*x[:3], **kw), ref)}
                    masked = ~keep.any(-1)
                    if masked.any():
                        row["masked_rows_zero"] = bool((attention(*x[:3], **kw)[:, masked] == 0).all())
                    if with_grad:
                        grads = attention_grad(*x, **kw)
                        row["backward"] = max(rel(g, r) for g, r in zip(grads, g64))
                    rows.append(row)
    os.environ.pop(NO_NUMBA_ENV, None)
    return rows


def worst(rows: list[dict]) -> dict:
    """The largest error per (kernel, dtype), forward and backward, over every case."""
    out = {}
    for r in rows:
        key = f"{r['kernel']} {r['dtype']}"
        w = out.setdefault(key, {"forward": 0.0, "backward": 0.0})
        w["forward"] = max(w["forward"], r["forward"])
        w["backward"] = max(w["backward"], r.get("backward", 0.0))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    simd = simd_level(cpu_flags())["level"]
    report = {"cpu": cpu_model(), "simd": simd, "blas": blas_kernel(blas_info()), "numba": numba_version(),
              "first_calls": first_call_costs(), "errors": error_rows(100) + error_rows(1024)}
    report["worst"] = worst(report["errors"])
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"CPU {report['cpu']}; SIMD {simd}; BLAS {report['blas']}; numba {report['numba']}")
    for where, calls in report["first_calls"].items():
        print(f"{where}: import numba {calls.pop('numba_import_s'):.2f} s")
        for name, c in calls.items():
            print(f"  {name:30s} first call {c['first_s']:6.2f} s, second {c['second_s']:6.3f} s, "
                  f"extra {c['extra_s']:6.2f} s")
    print("max |out - ref| / max |ref| against float64 (n = 100 naive, n = 1024 tiled; spreads 1 and 30):")
    for key, w in report["worst"].items():
        print(f"  {key:15s} forward {w['forward']:.1e}   backward {w['backward']:.1e}")
    zero = all(r.get("masked_rows_zero", True) for r in report["errors"])
    print(f"fully masked rows give exactly 0 on every path: {zero}")


if __name__ == "__main__":
    main()
